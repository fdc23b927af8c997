from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from epochal.actors.windows import CountWindow, TimeWindow


@given(st.lists(st.integers()), st.integers(1, 10), st.integers(1, 5))
def test_count_window_keeps_the_last_size_items_and_slides_every_slide_items(
    items: list[int], size: int, slide: int
) -> None:
    window: CountWindow[int] = CountWindow(size, slide)
    fired = [window.add(item) for item in items]
    assert window.items == items[-size:] if items else window.items == []
    assert fired == [(i + 1) % slide == 0 for i in range(len(items))]


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 30), st.integers(1, 10))
def test_time_window_keeps_what_is_newer_than_size(steps: list[int], size: int, slide: int) -> None:
    window: TimeWindow[int] = TimeWindow(size, slide)
    now, seen = 0, []
    for i, step in enumerate(steps):
        now += step
        fired = window.add(now, i)
        seen.append((now, i))
        assert window.items == [item for t, item in seen if t > now - size]
        previous = seen[-2][0] if len(seen) > 1 else None
        assert fired == (previous is None or now // slide > previous // slide)


def test_windows_live_in_actor_state_and_round_trip() -> None:
    window: CountWindow[str] = CountWindow(3)
    for vote in "abcd":
        window.add(vote)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(window), type=CountWindow[str])
    assert decoded == window and decoded.items == ["b", "c", "d"]
