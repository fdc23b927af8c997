"""Test an app in this process with a real cluster's semantics: no Kafka, no Spark, no workers.

:class:`AppTest` is made of the pieces a cluster runs, not a model of them: what you ``send``
goes through the sequencer's pure core (:func:`epochal.log.ordering.order`: routing, validation,
dead letters, client requests, request ids), each epoch runs on the engine
(:class:`~epochal.actors.engine.LocalEngine`: atomic multi-key transactions in timestamp order,
constraints, ``ctx.call``, interior transactions, ``ctx.now``/``ctx.random``), and what comes out
is what the egress writers would release (:class:`epochal.actors.egress.EgressEncoder`)::

    t = AppTest(app, partitions=4)
    t.send("transfers", Deposit("acct-0001", 100))
    t.send("transfers", b'{"type": "Deposit"}')  # raw bytes: a dead letter
    t.run()
    assert t.get(Account, "acct-0001") == Account(100)

``import epochal`` does not import this module; it loads neither Spark, Delta nor Arrow. The
pytest plugin (:mod:`epochal.testing_plugin`) gives it as the ``epochal_app`` fixture; the user
guide is ``docs/testing.md``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, TypeVar, overload

import msgspec

from epochal.actors.api import App
from epochal.actors.egress import EgressEncoder
from epochal.actors.engine import EpochResult, LocalEngine
from epochal.actors.framing import LENGTH, framed
from epochal.actors.outcome import Emitted, TxnOutcome
from epochal.actors.plan import emitted_by, ensure_same_code
from epochal.client import Outcome
from epochal.config import SequencerConfig
from epochal.log.ordering import EpochStamp, RequestWindow, order, position_key
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import (
    ActorKey,
    ClientRequest,
    DeadLetter,
    EpochRecord,
    InputPosition,
    InputRecord,
    KeyRef,
)
from epochal.schemas.egress import ClientReply, EgressRecord

__all__ = [
    "Abort",
    "AppTest",
    "CommandLogWriter",
    "Emit",
    "Results",
    "SavedLog",
    "SavedStart",
    "read_command_log",
]

S = TypeVar("S", bound=msgspec.Struct)
T = TypeVar("T")

START_MS = 1_700_000_000_000
"""The default ``now`` of the first epoch (2023-11-14): fixed, so a test's output is too."""
MAX_EPOCHS = 1_000
"""Epochs one :meth:`AppTest.run` may take to settle interior transactions."""


@dataclass(frozen=True)
class Abort:
    """An aborted transaction: its handler, why, its timestamp and the input it came from."""

    handler: str
    reason: str
    epoch: int
    seq: int
    source: InputPosition | None
    request_id: str


@dataclass(frozen=True)
class Emit:
    """An event a committed transaction emitted (``ctx.emit``), decoded: the interior
    transaction ``handler`` ran on it in the next epoch. ``epoch``/``seq``/``index`` are the
    emitting transaction's timestamp and the emit's place in it."""

    handler: str
    event: Any
    epoch: int
    seq: int
    index: int


class Results:
    """What some epochs produced, as a cluster would have written it.

    :meth:`AppTest.run` returns those of one run; an :class:`AppTest` is itself the results of
    every run so far.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self.command_log: list[EpochRecord] = []
        """The epochs run, as the sequencer would have logged them."""
        self.results: list[EpochResult] = []
        """The engine's result of each epoch of :attr:`command_log`."""
        self.dead_letters: list[DeadLetter] = []
        """What the sequencer sent to ``<app>.dlq``, each with its reason and coordinates, as
        a reader of the topic decodes it (encoded in the app's egress format and back)."""
        self.written: list[tuple[str, bytes]] = []
        """Every record released to an egress topic (``<app>.out.*``, ``<app>.replies``), with
        its topic, in the order the epochs reported them."""

    def _add(
        self, record: EpochRecord, result: EpochResult, dead: Sequence[DeadLetter] = ()
    ) -> None:
        self.command_log.append(record)
        self.results.append(result)
        codec = self.app.egress_codec
        self.dead_letters += [codec.read_dead_letter(codec.dead_letter(d)) for d in dead]
        records = EgressEncoder(self.app).records
        for outcome in result.outcomes:
            self.written.extend(records(outcome))

    def _extend(self, other: Results) -> None:
        self.command_log += other.command_log
        self.results += other.results
        self.dead_letters += other.dead_letters
        self.written += other.written

    @property
    def outcomes(self) -> list[TxnOutcome]:
        """Every transaction's outcome, interior ones included, in timestamp order."""
        return [o for r in self.results for o in r.outcomes]

    @property
    def aborts(self) -> list[Abort]:
        """Every aborted transaction, whether its handler reports aborts (``aborts_to``) or not."""
        return [
            Abort(o.handler, o.reason, o.epoch, o.seq, o.source, o.request_id)
            for o in self.outcomes
            if not o.committed
        ]

    @property
    def emitted(self) -> list[Emit]:
        """The events committed transactions emitted, in the order their transactions ran."""
        handlers = self.app.handlers
        return [
            Emit(e.handler, handlers[e.handler].codec.decode(e.event), e.epoch, e.seq, e.index)
            for e in emitted_by(self.outcomes)
        ]

    @property
    def replies(self) -> dict[str, Outcome]:
        """The reply to each client request by request id, as ``Client.submit`` returns it (a
        request that was a dead letter, or a retry of a used id, gets none)."""
        topic = self.app.topics.replies
        replies = (decode(v, ClientReply) for t, v in self.written if t == topic)
        return {reply.request_id: Outcome.of(reply) for reply in replies}

    @property
    def digest(self) -> str:
        """The state digest after the last epoch ("" before any)."""
        return self.results[-1].digest if self.results else ""

    def egress_records(self, name: str) -> list[EgressRecord]:
        """The records on egress topic ``name`` (``receipts`` or ``bank.out.receipts``): the
        outputs of committed transactions, and the abort reports of handlers whose
        ``aborts_to`` it is (``committed`` False, with the ``reason``). In an app whose egress
        format is JSON, a record's ``value`` is the JSON of what the handler wrote."""
        topic = name if name.startswith(f"{self.app.name}.out.") else self.app.topics.egress(name)
        read = self.app.egress_codec.read_record
        return [read(v) for t, v in self.written if t == topic]

    @overload
    def egress(self, name: str) -> list[Any]: ...

    @overload
    def egress(self, name: str, as_type: type[T]) -> list[T]: ...

    def egress(self, name: str, as_type: Any = None) -> list[Any]:
        """What committed transactions wrote to egress topic ``name`` (``ctx.egress``), decoded
        as ``as_type`` if given, else as plain values (dicts, lists, ...) of the app's egress
        format: in JSON, bytes are base64 strings unless ``as_type`` says they are bytes."""
        kind = Any if as_type is None else as_type
        read = self.app.egress_codec.read_value
        return [read(r.value, kind) for r in self.egress_records(name) if r.committed]


class AppTest(Results):
    """An app on one in-process engine of ``partitions`` partitions, fed by the sequencer's
    own ordering; ``send``/``request``/``advance`` then ``run``, and read the results.

    Time is the test's: each epoch is stamped with :attr:`now_ms` (``ctx.now()``), which then
    moves on by ``epoch_ms`` (the sequencer's default, 20), and by what you :meth:`advance`.
    Each epoch's random seed (``ctx.random()``) comes from ``seed`` and the epoch number, so a
    test gives the same output on every run.
    """

    def __init__(
        self,
        app: App,
        partitions: int = 1,
        *,
        start_ms: int = START_MS,
        epoch_ms: int | None = None,
        seed: int = 0,
        max_epochs: int = MAX_EPOCHS,
    ) -> None:
        super().__init__(app)
        self.partitions = partitions
        self.engine = LocalEngine(app, partitions)
        self.now_ms = start_ms
        """The time the next epoch is stamped with."""
        self.config = SequencerConfig(app.name)
        """The sequencer's defaults: its request-id window, dead-letter size, epoch length."""
        self.epoch_ms = self.config.epoch_ms if epoch_ms is None else epoch_ms
        self.seed = seed
        self.max_epochs = max_epochs
        self.epoch = 0
        """The number of the next epoch."""
        self._code_hash = app.code_hash()
        self._inputs: list[InputRecord] = []
        self._requests: list[InputRecord] = []
        self._positions: dict[str, int] = {}  # the last epoch's next_offsets
        self._next: dict[str, int] = {}  # the next offset of each partition fed
        self._window = RequestWindow(self.config.request_id_window_ms)
        self._request_count = 0
        self._start = SavedStart()  # a replay's: the snapshot its command log follows

    # --- input ---------------------------------------------------------------------------

    def send(
        self, topic: str, value: object, *, partition: int = 0, key: bytes | None = None
    ) -> InputPosition:
        """Put a record on input topic ``topic`` (``transfers`` or ``bank.in.transfers``, or an
        ``external_topic`` by its name) for the next :meth:`run`: an event is msgpack-encoded as
        a producer would; ``bytes`` go as they are, so JSON, msgpack and garbage reach the
        sequencer's validation. Returns where the record is (dead letters and egress records
        name it so)."""
        own = topic.startswith(f"{self.app.name}.in.")
        full = topic if own or topic in self.app.input_topics() else self.app.topics.input(topic)
        data = value if isinstance(value, bytes) else encode(value)
        offset = self._take_offset(full, partition)
        self._inputs.append(InputRecord(full, partition, offset, data, key, self.now_ms))
        return InputPosition(full, partition, offset)

    def request(
        self, handler: Callable[..., Any] | str, event: object, *, request_id: str | None = None
    ) -> str:
        """Submit a client transaction for the next :meth:`run`, as ``Client.submit`` would;
        returns its request id, the key of its reply in :attr:`replies`. A request id used
        before (within the sequencer's window) is dropped, as a client's retry is."""
        name = handler if isinstance(handler, str) else self.app.handler_for_fn(handler).name
        if request_id is None:
            self._request_count += 1
            request_id = f"test-{self._request_count}"
        value = encode(ClientRequest(request_id, name, encode(event)))
        topic = self.app.topics.requests
        offset = self._take_offset(topic, 0)
        self._requests.append(InputRecord(topic, 0, offset, value, None, self.now_ms))
        return request_id

    def advance(self, ms: int) -> AppTest:
        """Move the clock on: the next epoch's ``ctx.now()`` is ``ms`` later."""
        if ms < 0:
            raise ValueError("time only moves forward")
        self.now_ms += ms
        return self

    def _take_offset(self, topic: str, partition: int) -> int:
        position = position_key(topic, partition)
        offset = self._next.get(position, self._positions.get(position, 0))
        self._next[position] = offset + 1
        return offset

    # --- epochs --------------------------------------------------------------------------

    def run(self) -> Results:
        """Run one epoch of what was sent, then one more (a tick, as worker 0 asks for) while
        interior transactions wait. Returns what this run produced; raises RuntimeError if
        the app still emits after ``max_epochs`` epochs. In an async test: :meth:`run_async`."""
        return asyncio.run(self.run_async())

    async def run_async(self) -> Results:
        """:meth:`run`, awaited on the running event loop (an async test's)."""
        run = Results(self.app)
        try:
            if self._inputs or self._requests:
                inputs, requests = self._inputs, self._requests
                self._inputs, self._requests = [], []
                await self._epoch(run, inputs, requests)
            while self.engine.carried:
                if len(run.command_log) >= self.max_epochs:
                    raise RuntimeError(_never_settles(run, self.max_epochs))
                tick = encode(ClientRequest.tick(self.epoch - 1))
                topic = self.app.topics.requests
                offset = self._take_offset(topic, 0)
                tick_record = InputRecord(topic, 0, offset, tick, None, self.now_ms)
                await self._epoch(run, [], [tick_record])
        finally:  # the epochs that ran are the test's, even if the run failed
            self._extend(run)
        return run

    async def _epoch(
        self, run: Results, inputs: list[InputRecord], requests: list[InputRecord]
    ) -> None:
        seed = random.Random(f"epochal.testing:{self.seed}:{self.epoch}").getrandbits(63)
        stamp = EpochStamp(self.epoch, self.now_ms, seed, self._code_hash)
        sequenced = order(
            self.app, stamp, inputs, requests, sequenced_requests=self._window,
            positions=self._positions, dead_letter_bytes=self.config.dead_letter_max_bytes,
            egress_format=self.app.egress_codec.format,
        )  # fmt: skip
        record = sequenced.record
        self._window.remember(sequenced.requests_seen, record.now_ms)
        self._window.prune(record.now_ms)
        result = await self.engine.run_epoch(record)
        run._add(record, result, sequenced.dead)
        self._logged(record)

    def _logged(self, record: EpochRecord) -> None:
        """The sequencer's state after ``record``: its positions, the next epoch and time."""
        self._positions = dict(record.next_offsets)
        for position, offset in record.next_offsets.items():
            self._next[position] = max(self._next.get(position, 0), offset)
        self.epoch = record.epoch + 1
        self.now_ms = max(self.now_ms, record.now_ms) + self.epoch_ms

    # --- replay ---------------------------------------------------------------------------

    @classmethod
    def replay(
        cls,
        app: App,
        records: Iterable[EpochRecord],
        partitions: int = 1,
        *,
        allow_code_change: bool = False,
        start: SavedStart | None = None,
        **options: Any,
    ) -> AppTest:
        """An AppTest that ran ``records``, a command log from its first epoch or from the
        snapshot ``start`` (captured from a cluster with ``epochal replay APP --save-log
        FILE``): the state, outcomes and egress the cluster had, from which a test can go on
        sending. A log written by other code is refused unless ``allow_code_change``, as
        ``epochal replay`` refuses it."""
        test = cls(app, partitions, **options)
        test._start = start or SavedStart()
        test._start.load(test.engine)
        test.epoch = test._start.epoch + 1
        run = Results(app)

        async def replay() -> None:
            for record in records:
                ensure_same_code(record, test._code_hash, allow_code_change)
                run._add(record, await test.engine.run_epoch(record))
                test._logged(record)
                ids = {t.request_id: -1 for t in record.txns if t.request_id}
                test._window.remember(ids, record.now_ms)

        asyncio.run(replay())
        test._extend(run)
        return test

    @classmethod
    def from_command_log(
        cls, app: App, path: str | Path, partitions: int = 1, **options: Any
    ) -> AppTest:
        """:meth:`replay` of a file ``epochal replay APP --save-log FILE`` wrote."""
        saved = read_command_log(path)
        return cls.replay(app, saved.epochs, partitions, start=saved.start, **options)

    # --- state ------------------------------------------------------------------------------

    def get(self, cls: type[S], key: ActorKey) -> S | None:
        """The actor ``cls[key]`` after the last run, or None if it does not exist."""
        actor_type = self.app.actor_type(cls)
        data = self.engine.store.values.get(KeyRef(actor_type.name, key))
        return None if data is None else decode_canonical(data, cls)

    def state(self, cls: type[S]) -> dict[ActorKey, S]:
        """Every actor of type ``cls`` by key, in key order."""
        name = self.app.actor_type(cls).name
        found = {ref.key: data for ref, data in self.engine.store.values.items()
                 if ref.actor_type == name}  # fmt: skip
        return {key: decode_canonical(found[key], cls) for key in sorted(found, key=_key_order)}

    # --- determinism ------------------------------------------------------------------------

    def check_determinism(self, partitions: Iterable[int] = (1, 4)) -> None:
        """Replay the command log run so far on a fresh engine of each partition count and
        compare every outcome and every epoch's digest with this run: AssertionError naming the
        first transaction (or epoch) that differs. A handler that reads the wall clock, an
        unseeded random generator or state outside its actors fails it."""
        for count in partitions:
            engine = LocalEngine(self.app, count)
            self._start.load(engine)
            replayed = asyncio.run(engine.run(self.command_log))
            where = f"the run on {self.partitions} partition(s) and a replay on {count}"
            for want, got in zip(self.results, replayed, strict=True):
                _compare(want, got, where)


def _compare(want: EpochResult, got: EpochResult, where: str) -> None:
    """AssertionError at the first outcome (then digest) of one epoch that differs."""
    for a, b in zip(want.outcomes, got.outcomes, strict=False):
        if a != b:
            field = next(f for f in TxnOutcome.__struct_fields__
                         if getattr(a, f) != getattr(b, f))  # fmt: skip
            raise AssertionError(
                f"not deterministic: epoch {a.epoch} seq {a.seq} (handler {a.handler!r}) "
                f"differs between {where}: {field} {_short(getattr(a, field))} != "
                f"{_short(getattr(b, field))}"
            )
    if len(want.outcomes) != len(got.outcomes) or want.digest != got.digest:
        raise AssertionError(
            f"not deterministic: epoch {want.epoch} differs between {where}: "
            f"{len(want.outcomes)} vs {len(got.outcomes)} transactions, "
            f"digest {want.digest} != {got.digest}"
        )


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_order(key: ActorKey) -> tuple[bool, ActorKey]:
    return (isinstance(key, str), key)


def _never_settles(run: Results, epochs: int) -> str:
    """Which handlers kept emitting, from the last epoch of a run that did not settle."""
    last = run.results[-1]
    by_seq = {o.seq: o.handler for o in last.outcomes}
    pairs = sorted({(by_seq.get(e.seq, "?"), e.handler) for e in emitted_by(last.outcomes)})
    chains = ", ".join(f"{parent!r} emits for {child!r}" for parent, child in pairs)
    return (
        f"interior transactions still wait after {epochs} epochs of one run(): {chains}; "
        "a handler that emits every time it runs never settles (raise max_epochs if it does, "
        "later)"
    )


# --- command-log files -----------------------------------------------------------------------


class SavedStart(msgspec.Struct, frozen=True):
    """Where a saved command log starts: after the snapshot of ``epoch`` (every actor as
    canonical bytes, by type, and the interior transactions due next), or at the log's first
    epoch (``epoch`` -1). A cluster's log is trimmed back to its oldest snapshot kept, so a
    saved log of a running app starts at its latest snapshot."""

    epoch: int = -1
    actors: dict[str, list[tuple[ActorKey, bytes]]] = msgspec.field(default_factory=dict)
    carried: list[Emitted] = msgspec.field(default_factory=list)

    @classmethod
    def of(cls, engine: LocalEngine) -> SavedStart:
        """The state ``engine`` has now (all partitions), as a start."""
        actors: dict[str, list[tuple[ActorKey, bytes]]] = {}
        for ref, value in engine.store.values.items():
            actors.setdefault(ref.actor_type, []).append((ref.key, value))
        return cls(engine.executed, actors, list(engine.carried))

    def load(self, engine: LocalEngine) -> None:
        """Put this start's state into a fresh ``engine``."""
        if self.epoch >= 0:
            engine.load(self.actors, self.epoch, self.carried)


class SavedLog(NamedTuple):
    """A file :class:`CommandLogWriter` wrote: where it starts, and the epochs after it."""

    start: SavedStart
    epochs: list[EpochRecord]


class CommandLogWriter:
    """Writes a :class:`SavedStart` and then epochs to a file, each a length-prefixed msgpack
    frame (what ``epochal replay APP --save-log FILE`` writes; :func:`read_command_log` reads
    it)."""

    def __init__(self, path: str | Path, start: SavedStart | None = None) -> None:
        self._file = Path(path).open("wb")  # noqa: SIM115 - closed by close() or the with block
        self._file.write(framed(encode(start or SavedStart())))

    def write(self, record: EpochRecord) -> None:
        self._file.write(framed(encode(record)))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CommandLogWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_command_log(path: str | Path) -> SavedLog:
    """What :class:`CommandLogWriter` wrote to a file; ValueError if it is cut short."""
    frames = _frames(Path(path).read_bytes(), str(path))
    first = next(frames, None)
    if first is None:
        raise ValueError(f"{path} is empty: not a saved command log")
    start = decode(first, SavedStart)
    return SavedLog(start, [decode(frame, EpochRecord) for frame in frames])


def _frames(data: bytes, name: str) -> Iterator[bytes]:
    start = 0
    while start < len(data):
        if len(data) - start < LENGTH.size:
            raise ValueError(f"{name} ends inside a frame header at byte {start}")
        (length,) = LENGTH.unpack_from(data, start)
        start += LENGTH.size
        if len(data) - start < length:
            raise ValueError(f"{name} ends inside an epoch at byte {start}")
        yield data[start : start + length]
        start += length
