"""What a user writes: actor types (keyed, typed state) and transactions over them.

::

    app = App("bank")

    @app.actor(constraints={"balance >= 0": lambda a: a.balance >= 0}, key_sample=range(10_000))
    class Account(msgspec.Struct):
        balance: int = 0

    @app.transaction(topic="transfers", event=Transfer,
                     keys=lambda e: {Account: [e.source, e.target]})
    def transfer(ctx: Context, e: Transfer) -> None:
        ...

A transaction is bound to an input topic (*border*): ``topic="transfers"`` names epochal's own
``<app>.in.transfers``, ``external_topic="payments.v1"`` a topic the user already has, by its
full name, which epochal reads with the same guarantees but never creates, trims nor changes the
retention of. Or it is bound to an event type that other transactions ``emit`` (*interior*, no
topic), or invoked by clients (``client=True``). Its ``keys`` function
declares, from the event alone, every actor it may read or write (Calvin, TStream): the sequencer
logs them and the engine routes by them; touching another key aborts the transaction.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

import msgspec
import msgspec.inspect

from epochal.actors.code_hash import code_hash
from epochal.errors import ConfigError, EpochalError, SchemaError, describe_exception
from epochal.log.ordering import Routed
from epochal.log.topics import TopicNames
from epochal.schemas.actor_schemas import RESERVED_COLUMNS
from epochal.schemas.canonical import Codec, codec_for
from epochal.schemas.codec import Decoder, decode, encode
from epochal.schemas.commands import ActorKey, KeyRef
from epochal.schemas.egress import EgressFormat
from epochal.schemas.egress_codec import EgressCodec, egress_codec

__all__ = ["ActorType", "App", "Handler", "KeysFn", "load_app", "named"]

S = TypeVar("S", bound=msgspec.Struct)
E = TypeVar("E")

KeysFn = Callable[[Any], Mapping[type, Iterable[ActorKey]]]

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


@dataclass(frozen=True)
class ActorType:
    """A registered actor type: its state class, key type, constraints and key sample."""

    name: str
    state: type[msgspec.Struct]
    key_type: type
    constraints: Mapping[str, Callable[[Any], bool]]
    key_sample: tuple[ActorKey, ...]
    codec: Codec[Any] = field(init=False, repr=False, compare=False)
    """How the state is made canonical, and decoded (:mod:`epochal.schemas.canonical`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", codec_for(self.state))

    def violated(self, value: Any) -> str | None:
        """The name of the first constraint ``value`` breaks, or None."""
        for name, check in self.constraints.items():
            if not check(value):
                return name
        return None


@dataclass(frozen=True)
class Handler:
    """A registered transaction handler."""

    name: str
    fn: Callable[..., Any]
    event: type[Any]
    keys: KeysFn
    topic: str | None = None
    client: bool = False
    aborts_to: str | None = None
    external_topic: str | None = None
    """A topic epochal did not create, by its full name (``topic`` is then None)."""
    codec: Codec[Any] = field(init=False, repr=False, compare=False)
    """How the event is made canonical, and decoded."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", codec_for(self.event))

    @property
    def interior(self) -> bool:
        return self.topic is None and self.external_topic is None and not self.client


@dataclass
class App:
    """An epochal application: a name, its actor types and its transactions.

    ``egress_format`` (:class:`EgressFormat` or its value, ``"msgpack"`` or ``"json"``) is how
    the app writes its egress topics and dead letters: JSON lets a plain Kafka tool read them.
    """

    name: str
    actor_types: dict[str, ActorType] = field(default_factory=dict)
    handlers: dict[str, Handler] = field(default_factory=dict)
    _by_class: dict[type, ActorType] = field(default_factory=dict, repr=False)
    _by_fn: dict[Callable[..., Any], Handler] = field(default_factory=dict, repr=False)
    migrations: dict[str, Callable[[dict[str, Any]], Any]] = field(default_factory=dict)
    """Per actor type, the function that turns a value of an older schema into the state
    (see :meth:`migration`)."""
    _code_hash: tuple[tuple[object, ...], str] | None = field(default=None, repr=False)
    egress_format: EgressFormat | str = field(default=EgressFormat.MSGPACK, kw_only=True)
    """Made an :class:`EgressFormat` at construction; read :attr:`egress_codec` for its codec."""
    _egress_codec: EgressCodec | None = field(default=None, init=False, repr=False, compare=False)
    _topics: TopicNames | None = field(default=None, repr=False, compare=False)
    _routes: dict[str, tuple[dict[type, Handler], Decoder[Any]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Per input topic (full name): its handlers by event type and the type its records decode
    as, made on the first record of the topic (the sequencer routes every record)."""

    def __post_init__(self) -> None:
        from epochal.actors.serializable import READ_HANDLER, ReadKeys, read_handler_parts

        self.egress_format = EgressFormat.of(self.egress_format)

        read, keys = read_handler_parts(self)  # every app answers serializable reads
        self.handlers[READ_HANDLER] = Handler(READ_HANDLER, read, ReadKeys, keys, client=True)

    @property
    def topics(self) -> TopicNames:
        """The app's topic names (asked for per egress record: made once per name)."""
        topics = self._topics
        if topics is None or topics.app != self.name:
            topics = self._topics = TopicNames(self.name)
        return topics

    @property
    def egress_codec(self) -> EgressCodec:
        """How the app's egress records and dead letters are encoded and read (asked for per
        outcome: chosen once, again only if :attr:`egress_format` is changed)."""
        codec = self._egress_codec
        if codec is None or codec.format is not self.egress_format:
            codec = self._egress_codec = egress_codec(self.egress_format)
        return codec

    @property
    def actor_types_by_class(self) -> Mapping[type, ActorType]:
        return self._by_class

    def actor(
        self,
        *,
        key: type = str,
        constraints: Mapping[str, Callable[[Any], bool]] | None = None,
        key_sample: Iterable[ActorKey] = (),
        name: str | None = None,
    ) -> Callable[[type[S]], type[S]]:
        """Register a msgspec Struct (all fields with defaults) as an actor type.

        ``key_sample`` is an optional hint: keys like the app's, whose quantiles split a new
        app's key ranges; a running cluster learns its split points from its snapshots anyway
        (:mod:`epochal.actors.partitioning`).
        """

        def register(cls: type[S]) -> type[S]:
            if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
                raise ConfigError("an actor type must be a msgspec.Struct", actor_type=str(cls))
            try:
                cls()
            except TypeError as exc:
                raise ConfigError(
                    "every field of an actor type needs a default (a new actor starts from it)",
                    actor_type=cls.__name__,
                ) from exc
            if key not in (str, int):
                raise ConfigError("actor keys are str or int", actor_type=cls.__name__)
            reserved = RESERVED_COLUMNS & {f.encode_name for f in msgspec.structs.fields(cls)}
            if reserved:
                raise ConfigError(
                    f"fields named {sorted(reserved)} would clash with the snapshot tables' own "
                    "columns: rename them", actor_type=cls.__name__,
                )  # fmt: skip
            actor_type = ActorType(
                name or cls.__name__, cls, key, dict(constraints or {}), tuple(sorted(key_sample))
            )
            if actor_type.name in self.actor_types:
                raise ConfigError("actor type registered twice", actor_type=actor_type.name)
            self.actor_types[actor_type.name] = actor_type
            self._by_class[cls] = actor_type
            return cls

        return register

    def transaction(
        self,
        *,
        event: type[E],
        keys: KeysFn,
        topic: str | None = None,
        client: bool = False,
        aborts_to: str | None = None,
        name: str | None = None,
        external_topic: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(ctx, event)`` as a transaction; see the module docstring."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            handler = Handler(
                name or fn.__name__, fn, event, keys, topic, client, aborts_to, external_topic
            )
            if handler.name in self.handlers:
                raise ConfigError("transaction registered twice", handler=handler.name)
            self._check_external(handler)
            _check_decodable(event, f"the event type of {handler.name}")
            full = self.input_topic(handler)
            if full is not None:
                sharing = [h.event for h in self.handlers.values() if self.input_topic(h) == full]
                if sharing:
                    _check_decodable(Union[(*sharing, event)], f"the event types of topic {full!r}")
            if handler.interior and any(
                h.interior and h.event is event for h in self.handlers.values()
            ):
                raise ConfigError(
                    "one interior transaction per emitted event type", event=event.__name__
                )
            self.handlers[handler.name] = handler
            self._by_fn[fn] = handler
            self._routes.clear()
            return fn

        return register

    def migration(
        self, state: type[S]
    ) -> Callable[[Callable[[dict[str, Any]], S | None]], Callable[[dict[str, Any]], S | None]]:
        """Register ``fn(old) -> new state`` for the actor type ``state``: ``old`` is a value
        of the schema the latest snapshot recorded, as a dict by field name (msgpack's plain
        types), and ``fn`` returns the new state, or None to drop the actor.

        It runs when a start restores a snapshot whose schema of this type differs from the
        app's, once over each of its actors, and the first snapshot after holds the results: a
        rename, a removed field that holds data and a changed type are refused at start
        without one.

            @app.migration(Account)
            def account_v2(old: dict[str, Any]) -> Account:
                return Account(amount=old["balance"])
        """

        def register(
            fn: Callable[[dict[str, Any]], S | None],
        ) -> Callable[[dict[str, Any]], S | None]:
            actor_type = self.actor_type(state)
            if actor_type.name in self.migrations:
                raise ConfigError("one migration per actor type", actor_type=actor_type.name)
            self.migrations[actor_type.name] = fn
            return fn

        return register

    def migrated(self, actor_type: str, old: bytes) -> bytes | None:
        """The canonical bytes the migration of ``actor_type`` makes of ``old`` (None: the
        actor is dropped). A migration that fails, or returns something else than the state,
        is a :class:`SchemaError` naming it."""
        registered = self.actor_types[actor_type]
        fn = self.migrations[actor_type]
        try:
            new = fn(msgspec.msgpack.decode(old))
        except Exception as exc:
            raise SchemaError(
                f"the migration {fn.__name__} of {actor_type} failed: {describe_exception(exc)}",
                actor_type=actor_type,
            ) from exc
        if new is None:
            return None
        if not isinstance(new, registered.state):
            raise SchemaError(
                f"the migration {fn.__name__} of {actor_type} returned a "
                f"{type(new).__name__}, not a {registered.state.__name__} (or None)",
                actor_type=actor_type,
            )
        try:
            return registered.codec.canonical(new)[0]
        except SchemaError as exc:
            raise SchemaError(
                f"the migration {fn.__name__} of {actor_type} made an invalid state: "
                f"{exc.message}", actor_type=actor_type,
            ) from exc  # fmt: skip

    # --- lookups used by the engine -------------------------------------------------------

    def actor_type(self, cls: type) -> ActorType:
        try:
            return self._by_class[cls]
        except KeyError:
            raise ConfigError("not a registered actor type", actor_type=str(cls)) from None

    def handler_for_fn(self, fn: Callable[..., Any]) -> Handler:
        try:
            return self._by_fn[fn]
        except KeyError:
            raise ConfigError("not a registered transaction", handler=str(fn)) from None

    def interior_handler(self, event: object) -> Handler:
        for handler in self.handlers.values():
            if handler.interior and isinstance(event, handler.event):
                return handler
        raise ConfigError("no transaction handles this emitted event", event=type(event).__name__)

    def topic_handlers(self, topic: str) -> list[Handler]:
        """Handlers of one input topic, by its full name (``bank.in.transfers``, or an
        external topic's), or the short name of one of epochal's own (``transfers``)."""
        return [
            h for h in self.handlers.values() if self.input_topic(h) == topic or h.topic == topic
        ]

    def input_topic(self, handler: Handler) -> str | None:
        """The full name of the topic a border transaction reads (None for the others)."""
        if handler.external_topic is not None:
            return handler.external_topic
        return None if handler.topic is None else self.topics.input(handler.topic)

    def input_topics(self) -> list[str]:
        """Every topic the app's transactions read, by full name, sorted."""
        return sorted({t for h in self.handlers.values() if (t := self.input_topic(h))})

    def external_topics(self) -> list[str]:
        """The input topics epochal did not create (``external_topic=``), sorted."""
        return sorted({h.external_topic for h in self.handlers.values() if h.external_topic})

    def _check_external(self, handler: Handler) -> None:
        """``external_topic`` names a Kafka topic that is not epochal's, instead of ``topic``."""
        external = handler.external_topic
        if external is None:
            return
        if handler.topic is not None:
            raise ConfigError(
                "give a transaction topic= (epochal's <app>.in.<topic>) or "
                "external_topic= (a topic you have), not both",
                handler=handler.name,
            )
        if not _TOPIC_NAME.fullmatch(external) or external in (".", ".."):
            raise ConfigError(
                f"external_topic {external!r} is not a valid Kafka topic name", handler=handler.name
            )
        if external.startswith(f"{self.name}."):
            raise ConfigError(
                f"external_topic {external!r} is in the app's own namespace "
                f"({self.name}.*): name it with topic= instead",
                handler=handler.name,
            )

    def declared_keys(self, handler: Handler, event: object) -> tuple[KeyRef, ...]:
        """The handler's key set for one event, checked and sorted (a deterministic order)."""
        refs: list[KeyRef] = []
        by_class = self._by_class
        for cls, keys in handler.keys(event).items():
            actor_type = by_class.get(cls) or self.actor_type(cls)  # raises: not an actor type
            name, key_type = actor_type.name, actor_type.key_type
            for key in keys:
                if type(key) is not key_type:
                    raise SchemaError(
                        f"key {key!r} of {name} has type {type(key).__name__}; "
                        f"{name} keys are {key_type.__name__}",
                        handler=handler.name,
                    )
                refs.append(KeyRef(name, key))
        ordered = _sorted_set(refs)
        try:
            encode(ordered)  # in one call: the command log must hold every key
        except (OverflowError, UnicodeEncodeError):
            ref = next(r for r in ordered if not _loggable(r.key))
            raise SchemaError(
                f"key {ref.key!r} of {ref.actor_type} cannot be logged (an int must fit in "
                "64 bits, a str must be valid Unicode)",
                handler=handler.name,
            ) from None
        return ordered

    # --- the sequencer's Router ----------------------------------------------------------

    def route(self, topic: str, value: bytes) -> Routed:
        """The transaction an input record invokes; SchemaError (to the DLQ) if none."""
        route = self._routes.get(topic)
        if route is None:
            handlers = self.topic_handlers(topic)
            if not handlers:
                raise SchemaError("no transaction reads this topic", topic=topic)
            types = tuple(h.event for h in handlers)
            union: Any = types[0] if len(types) == 1 else Union[types]  # noqa: UP007
            route = self._routes[topic] = ({h.event: h for h in handlers}, Decoder(union))
        by_type, decoder = route
        try:
            event = decoder(value)
        except SchemaError as exc:
            if len(by_type) == 1:
                raise
            # several event types on one topic: a msgspec tagged union tells them apart
            names = ", ".join(t.__name__ for t in by_type)
            kind = "unknown event type" if "`$.type`" in exc.message else "invalid event"
            reason = f"{kind} (the topic takes {names}): {exc.message}"
            raise SchemaError(reason, topic=topic) from exc
        return self._routed(by_type[type(event)], event)

    def route_request(self, handler_name: str, event: bytes) -> Routed:
        """The client transaction a request invokes; SchemaError (to the DLQ) if none."""
        handler = self.handlers.get(handler_name)
        if handler is None or not handler.client:
            raise SchemaError("no client transaction of this name", handler=handler_name)
        return self._routed(handler, decode(event, handler.event))

    def _routed(self, handler: Handler, event: object) -> Routed:
        """The logged form of an event just decoded with its schema: its canonical bytes (what
        every worker decodes again) and the keys it declares."""
        try:
            data = handler.codec.encode_decoded(event)
        except SchemaError as exc:
            raise SchemaError(f"invalid event: {exc.message}", handler=handler.name) from exc
        try:
            keys = self.declared_keys(handler, event)
        except (SchemaError, KeyboardInterrupt):
            raise
        except BaseException as exc:  # the user's key function failed: a dead letter, not a crash
            raise SchemaError(
                f"key function failed: {describe_exception(exc)}", handler=handler.name
            ) from exc
        return Routed(handler.name, data, keys)

    def code_hash(self) -> str:
        """A hash of the app's code: see :mod:`epochal.actors.code_hash` for what it covers.
        Computed once for the actor types and handlers registered (it reads and parses
        source files): the code a process runs is the code it loaded."""
        objects: list[Any] = [a.state for a in self.actor_types.values()]
        objects += [h.fn for h in self.handlers.values()]
        objects += [h.event for h in self.handlers.values()]
        objects += list(self.migrations.values())
        registered = tuple(objects)
        if self._code_hash is None or self._code_hash[0] != registered:
            self._code_hash = (registered, code_hash(objects))
        return self._code_hash[1]


def _sorted_set(refs: list[KeyRef]) -> tuple[KeyRef, ...]:
    """``refs`` without repeats, sorted; two (a transfer's) without building a set."""
    if len(refs) == 2:
        first, second = refs
        if first == second:
            return (first,)
        return (first, second) if first < second else (second, first)
    return tuple(sorted(set(refs))) if len(refs) > 1 else tuple(refs)


def _loggable(key: ActorKey) -> bool:
    if isinstance(key, int):
        return -(2**63) <= key < 2**64
    try:
        key.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _check_decodable(record_type: Any, what: str) -> None:
    """Refuse, at registration, an event type (or a topic's union of them) msgspec cannot
    decode: two untagged Structs on one topic would fail on every record, not at start."""
    try:
        msgspec.msgpack.Decoder(record_type)
        msgspec.json.Decoder(record_type)
        if isinstance(msgspec.inspect.type_info(record_type), msgspec.inspect.CustomType):
            raise TypeError("a class msgspec does not know how to decode: use a msgspec.Struct")
    except TypeError as exc:
        types = getattr(record_type, "__args__", (record_type,))
        names = ", ".join(getattr(t, "__name__", str(t)) for t in types)
        raise ConfigError(
            f"msgspec cannot decode {what} ({names}): {exc}; several event types on one topic "
            "must be msgspec Structs with distinct tags (`class Deposit(msgspec.Struct, tag=True)`)"
        ) from exc


_IMPORT_MACHINERY = ("<frozen", importlib.__file__.rpartition("/")[0])


def load_app(spec: str, name: str | None = None) -> App:
    """The App at ``module:attribute`` (``examples.bank.app:app``); ``name`` renames its topics."""

    module_name, _, attribute = spec.partition(":")
    try:
        app = getattr(importlib.import_module(module_name), attribute or "app")
    except EpochalError:
        raise  # the app's own registration refused it, and says why
    except Exception as exc:  # the user's module failed to import: say where, in one line
        frames = [
            frame
            for frame in traceback.extract_tb(exc.__traceback__)
            if frame.filename != __file__ and not frame.filename.startswith(_IMPORT_MACHINERY)
        ]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None
        raise ConfigError(
            f"cannot load the app: {describe_exception(exc)}", app=spec, at=where
        ) from exc
    if not isinstance(app, App):
        raise ConfigError("not an epochal App", app=spec)
    return named(app, name) if name else app


def named(app: App, name: str) -> App:
    """``app`` under another name (its topics and tables), leaving the module's object alone:
    its users (a test, a second load in the same process) keep the name it was given."""
    return app if app.name == name else dataclasses.replace(app, name=name)
