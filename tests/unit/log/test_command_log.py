from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochal.errors import LogError
from epochal.log.command_log import EpochAssembler, MemoryCommandLog, chunk_epoch
from epochal.schemas.commands import CommandTxn, EpochRecord, KeyRef


def _epoch(number: int, txns: int) -> EpochRecord:
    body = tuple(
        CommandTxn(i, "transfer", b"x" * (i % 50), (KeyRef("Account", i),)) for i in range(txns)
    )
    return EpochRecord(number, 1000 + number, 7, "code", body, {"t:0": number})


@given(st.lists(st.integers(0, 300), min_size=1, max_size=8), st.integers(16, 2000))
def test_epochs_round_trip_through_chunks_of_any_size(sizes: list[int], chunk_bytes: int) -> None:
    log = MemoryCommandLog(chunk_bytes=chunk_bytes)
    written = [_epoch(i, n) for i, n in enumerate(sizes)]
    positions = [log.append(record) for record in written]
    read = list(log.epochs())
    assert [e.record for e in read] == written
    assert [e.position for e in read] == positions
    resumed = list(log.epochs(start=positions[0] + 1))
    assert [e.record for e in resumed] == written[1:]


def test_an_epoch_without_its_final_chunk_is_never_yielded() -> None:
    chunks = chunk_epoch(_epoch(3, 200), chunk_bytes=100)
    assert len(chunks) > 2
    log = MemoryCommandLog(chunks=chunks[:-1])
    assert list(log.epochs()) == []


def test_a_chunk_out_of_order_is_an_error_naming_the_offset() -> None:
    chunks = chunk_epoch(_epoch(3, 200), chunk_bytes=100)
    assembler = EpochAssembler()
    assembler.add(0, chunks[0])
    with pytest.raises(LogError, match="offset=5"):
        assembler.add(5, chunks[2])


def test_a_tail_reader_skips_the_chunks_of_an_epoch_that_began_before_its_window() -> None:
    chunks = chunk_epoch(_epoch(3, 200), chunk_bytes=100) + chunk_epoch(_epoch(4, 5), 100)
    assembler = EpochAssembler(from_middle=True)
    logged = [assembler.add(i, c) for i, c in enumerate(chunks) if i >= 2]
    assert [e.record.epoch for e in logged if e is not None] == [4]
