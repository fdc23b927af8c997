"""What ``epochal run`` checks before it starts anything, so that a wrong setting is one line at
start, naming the resource and what to do, not a traceback or a rollback loop later.

- the broker answers (:func:`check_broker`);
- every port the cluster will listen on on this host is free (:func:`check_ports`), in the words
  a later bind failure would use (:class:`~epochal.errors.BindError`);
- the warehouse takes a file (:func:`check_warehouse`).

The app itself is checked by loading it (:func:`epochal.actors.api.load_app`).
"""

from __future__ import annotations

import errno
import logging
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from epochal.config import KafkaConfig, Listener, SnapshotConfig
from epochal.errors import BindError, BrokerUnavailableError, ConfigError, LogError
from epochal.log.client import KafkaClients

__all__ = ["Binding", "check_broker", "check_ports", "check_warehouse"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Binding:
    """One address a process of the cluster will listen on."""

    address: str  # host:port
    listener: Listener
    owner: str  # "worker 1", "the sequencer"


def check_broker(kafka: KafkaConfig, timeout_s: float) -> None:
    """The broker answers a metadata request within ``timeout_s``, or one ConfigError line."""
    try:
        KafkaClients(kafka).wait_until_ready(timeout_s)
    except LogError as exc:
        cause = "does not answer" if isinstance(exc, BrokerUnavailableError) else f"fails: {exc}"
        raise ConfigError(
            f"no Kafka broker at {kafka.bootstrap_servers} (--bootstrap) {cause} within "
            f"{timeout_s:g} s: start one (`epochal kafka start`) or pass its address"
        ) from exc


def check_ports(bindings: Sequence[Binding]) -> None:
    """No two listeners of the cluster share a port, and each address can be listened on now;
    a host that is not this machine's is skipped (its own ``epochal run`` checks it)."""
    claimed: dict[str, list[Binding]] = {}
    for binding in bindings:
        port = binding.address.rpartition(":")[2]
        for first in claimed.setdefault(port, []):
            if _same_host(first.address, binding.address):
                raise ConfigError(
                    f"port {port} is asked for twice: {first.listener.purpose} of {first.owner} "
                    f"({first.listener.flag}) and {binding.listener.purpose} of "
                    f"{binding.owner} ({binding.listener.flag}); give one of them other ports"
                )
        claimed[port].append(binding)
    for binding in bindings:
        host, _, port = binding.address.rpartition(":")
        try:
            with socket.create_server((host, int(port))):
                pass
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                continue  # another host's address
            raise BindError.of(exc, binding.address, binding.listener, binding.owner) from exc


def _same_host(one: str, other: str) -> bool:
    """Two addresses on one machine's port space (a wildcard host takes every interface)."""
    hosts = {one.rpartition(":")[0], other.rpartition(":")[0]}
    return len(hosts) == 1 or bool(hosts & {"0.0.0.0", "", "::", "[::]"})


def check_warehouse(config: SnapshotConfig, app: str) -> None:
    """A file can be written and deleted under ``<warehouse>/<app>``, through the same
    filesystem the snapshots use."""
    from epochal.recovery.snapshots import Warehouse  # delta-rs: only when snapshots are on

    warehouse = Warehouse(config.warehouse, app, config.storage_options)
    filesystem, path = warehouse.files(warehouse.uri())
    probe = f"{path}/.epochal-probe-{uuid.uuid4().hex}"
    try:
        filesystem.create_dir(path, recursive=True)
        with filesystem.open_output_stream(probe) as out:
            out.write(b"ok")
        filesystem.delete_file(probe)
    except Exception as exc:  # any store's error: the point is to name it at start
        raise ConfigError(
            f"cannot write to the warehouse {warehouse.uri()} (--warehouse): {exc}; give a "
            "writable path or URI (and --storage-option credentials for an object store)"
        ) from exc
