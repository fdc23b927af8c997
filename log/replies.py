"""Client transactions over Kafka: requests to ``<app>.requests``, outcomes from ``<app>.replies``.

The client library (``epochal/client.py``) submits through a :class:`RequestChannel`: one
idempotent producer, and one ``read_committed`` consumer thread that matches each
:class:`ClientReply` to the requests waiting for it by request id (and remembers recent ones, for
a submit retried after its reply came).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

from confluent_kafka import TopicPartition

from epochal.config import KafkaConfig
from epochal.errors import QueryUnavailableError, SchemaError
from epochal.log.client import KafkaClients, arrived
from epochal.log.topics import TopicNames
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import ClientRequest
from epochal.schemas.egress import ClientReply

__all__ = ["RequestChannel"]


class RequestChannel:
    """Sends client requests and matches ``<app>.replies`` records to them (a thread).

    The consumer starts ``lookback_ms`` back, so that a request retried with its id finds the
    reply to the first one even from another process.
    """

    def __init__(self, topics: TopicNames, kafka: KafkaConfig, lookback_ms: int) -> None:
        self.topics = topics
        clients = KafkaClients(kafka)
        clients.create_topics([self.topics.replies], partitions=1)
        self.producer = clients.producer(**{"enable.idempotence": True, "linger.ms": 1})
        self.consumer = clients.consumer(**{"isolation.level": "read_committed",
                                            "auto.offset.reset": "earliest"})  # fmt: skip
        since = int(time.time() * 1000) - lookback_ms
        metadata = self.consumer.list_topics(self.topics.replies, timeout=10)
        partitions = list(metadata.topics[self.topics.replies].partitions)
        starts = self.consumer.offsets_for_times(
            [TopicPartition(self.topics.replies, p, since) for p in partitions], timeout=10
        )
        for start in starts:  # none since then: from the end as it is now, not when first read
            if start.offset < 0:
                start.offset = self.consumer.get_watermark_offsets(start, timeout=10)[1]
        self.consumer.assign(starts)
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, ClientReply] = OrderedDict()
        self._waiting: dict[str, list[Future[ClientReply]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epochal-replies", daemon=True)
        self._thread.start()

    def expect(self, request_id: str) -> Future[ClientReply]:
        future: Future[ClientReply] = Future()
        with self._lock:
            seen = self._seen.get(request_id)
            if seen is not None:
                future.set_result(seen)
            else:
                self._waiting.setdefault(request_id, []).append(future)
        return future

    def send(self, request: ClientRequest) -> None:
        self.producer.produce(self.topics.requests, encode(request),
                              key=request.request_id.encode())  # fmt: skip
        if self.producer.flush(10) > 0:
            raise QueryUnavailableError("the request could not be written to Kafka",
                                        topic=self.topics.requests)  # fmt: skip

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in arrived(self.consumer, 500, 0.1):
                if message.error() is not None or message.value() is None:
                    continue
                try:
                    reply = decode(message.value() or b"", ClientReply)
                except SchemaError:
                    continue
                with self._lock:
                    self._seen[reply.request_id] = reply
                    while len(self._seen) > 100_000:
                        self._seen.popitem(last=False)
                    for future in self._waiting.pop(reply.request_id, []):
                        if not future.done():
                            future.set_result(reply)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.consumer.close()
