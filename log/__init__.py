"""Kafka, and only Kafka: clients and error mapping, topic names, the local dev broker.

The only package of epochal that imports ``confluent_kafka``; everything it raises is ours.
"""

from epochal.log.client import KafkaClients, translate_kafka_error
from epochal.log.local_broker import BrokerStatus, LocalBroker
from epochal.log.topics import TopicNames

__all__ = ["BrokerStatus", "KafkaClients", "LocalBroker", "TopicNames", "translate_kafka_error"]
