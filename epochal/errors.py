"""The one error tree of epochal.

Users catch these, never a library's exception type: ``log/`` translates confluent-kafka errors,
``recovery/`` and ``analytics/`` translate Spark and Delta ones, always ``raise ... from exc``.

::

    EpochalError
    ├── ConfigError                 bad or missing configuration, tools or files (java, jars, ports)
    │   └── BindError               a port to listen on is taken or not ours
    ├── LogError                    Kafka
    │   ├── BrokerUnavailableError  the broker does not answer
    │   └── LocalBrokerError        the local dev broker cannot be started or stopped
    ├── TransactionAborted          a handler raised or broke a constraint (an outcome, no crash)
    ├── RecoveryError
    │   ├── SnapshotMissingError
    │   └── LogTruncatedError
    ├── SchemaError                 a record does not decode or does not match its schema
    └── QueryError                  a query was wrong (unknown actor type, key type, operator)
        ├── SnapshotNotRetainedError  a snapshot read at an ssid expired or never taken
        ├── QueryUnavailableError   no query server answered (retried until the timeout)
        └── QueryTimeoutError       no answer within the call's timeout

Every error carries its context (topic, partition, offset, epoch, actor key, ...) as keyword
arguments and prints it after the message, so a log line says where things went wrong.
:func:`describe_exception` is the one way to turn any exception (a user's, possibly odd) into
a reason string.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epochal.config import Listener

__all__ = [
    "BindError",
    "BrokerUnavailableError",
    "ConfigError",
    "EpochalError",
    "LocalBrokerError",
    "LogError",
    "LogTruncatedError",
    "QueryError",
    "QueryTimeoutError",
    "QueryUnavailableError",
    "RecoveryError",
    "SchemaError",
    "SnapshotMissingError",
    "SnapshotNotRetainedError",
    "TransactionAborted",
    "describe_exception",
]


class EpochalError(Exception):
    """Root of every error epochal raises.

    >>> str(EpochalError("record is not msgpack", topic="bank.in.transfers", offset=7))
    'record is not msgpack (topic=bank.in.transfers, offset=7)'
    """

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context: dict[str, Any] = {k: v for k, v in context.items() if v is not None}

    def __str__(self) -> str:
        if not self.context:
            return self.message
        where = ", ".join(f"{k}={v}" for k, v in self.context.items())
        return f"{self.message} ({where})"


class ConfigError(EpochalError):
    """Configuration, a required tool (java, mvn) or a required file (jars) is wrong or missing."""


class BindError(ConfigError):
    """A server could not listen on its port: which port, for what, and what to do.

    >>> from epochal.config import Listener
    >>> taken = OSError(errno.EADDRINUSE, "Address in use")
    >>> print(BindError.of(taken, "127.0.0.1:7700", Listener.QUERIES, "worker 0"))
    port 7700 on 127.0.0.1 (live queries of worker 0) is taken by another process: stop it, or
    choose another port with --query-port
    """

    @classmethod
    def of(cls, exc: OSError, address: str, listener: Listener, owner: str) -> BindError:
        host, _, port = address.rpartition(":")
        if exc.errno == errno.EADDRINUSE:
            advice = "is taken by another process: stop it, or choose another port with"
        else:
            advice = f"cannot be listened on ({exc.strerror or exc}): check"
        what = f"{listener.purpose} of {owner}"
        return cls(f"port {port} on {host} ({what}) {advice} {listener.flag}")


class LogError(EpochalError):
    """Something went wrong talking to Kafka."""


class BrokerUnavailableError(LogError):
    """The Kafka broker did not answer in time."""


class LocalBrokerError(LogError):
    """The local development broker could not be started, reached or stopped."""


class TransactionAborted(EpochalError):
    """A transaction was aborted by its handler or by a violated constraint; it had no effect."""


class RecoveryError(EpochalError):
    """Recovery could not restore a consistent state."""


class SnapshotMissingError(RecoveryError):
    """No complete snapshot exists where one was required."""


class LogTruncatedError(RecoveryError):
    """The command log or an input topic no longer holds the records recovery needs."""


class SchemaError(EpochalError):
    """A record does not decode, or does not match its declared schema."""


class QueryError(EpochalError):
    """A query could not be answered."""


class SnapshotNotRetainedError(QueryError):
    """A read at a snapshot the manifest does not hold (expired, or never taken); the context
    names the ssid asked for and the retained range (``oldest``, ``newest``)."""


class QueryUnavailableError(QueryError):
    """No query server of the cluster answered (down, or the address is wrong)."""


class QueryTimeoutError(QueryError):
    """A query or a client transaction got no answer within its timeout."""


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` (or ``Type``) for any exception, even one whose ``str()`` raises: user
    code's exceptions become abort reasons and dead-letter reasons, and must never fail there."""
    try:
        message = str(exc)
    except BaseException:  # an exception whose __str__ raises still has a type
        message = "<unprintable message>"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
