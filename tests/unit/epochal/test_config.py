from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from epochal.config import CacheConfig, KafkaConfig, LocalBrokerConfig, SparkConfig, WorkerConfig
from epochal.errors import ConfigError


def test_kafka_secrets_are_redacted_in_repr_but_passed_to_clients() -> None:
    config = KafkaConfig("b:9092", {"sasl.password": "hunter2", "security.protocol": "SASL_SSL"})
    assert "hunter2" not in repr(config)
    assert "SASL_SSL" in repr(config)
    assert config.client_settings()["sasl.password"] == "hunter2"


def test_client_settings_overrides_win_over_pass_through_settings() -> None:
    config = KafkaConfig("b:9092", {"linger.ms": "50"})
    assert config.client_settings(**{"linger.ms": 5}) == {
        "bootstrap.servers": "b:9092",
        "linger.ms": 5,
    }


def test_configs_are_frozen_and_settings_cannot_be_mutated() -> None:
    source = {"acks": "all"}
    config = KafkaConfig("b:9092", source)
    source["acks"] = "0"
    assert config.settings["acks"] == "all"
    with pytest.raises(TypeError):
        config.settings["acks"] = "1"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.bootstrap_servers = "other:9092"  # type: ignore[misc]


def test_broker_controller_port_defaults_to_port_plus_one() -> None:
    assert LocalBrokerConfig(port=19092).effective_controller_port == 19093
    assert LocalBrokerConfig(port=19092, controller_port=20000).effective_controller_port == 20000


def test_cache_layout() -> None:
    cache = CacheConfig(Path("/c"))
    assert cache.jar_dir("spark") == Path("/c/jars/spark")
    assert cache.broker_dir(9092) == Path("/c/brokers/9092")


def test_spark_config_defaults_to_local_two_cores() -> None:
    assert SparkConfig(jar_dir=Path("/j")).master == "local[2]"


def test_kafka_config_pickles_for_child_processes() -> None:
    import pickle

    config = KafkaConfig("b:9092", {"sasl.password": "x"})
    assert pickle.loads(pickle.dumps(config)) == config


def test_a_worker_config_with_fewer_partitions_than_workers_is_refused() -> None:
    """The programmatic path says what ``epochal run`` says: a worker would own nothing."""
    with pytest.raises(ConfigError, match="2 workers need at least 2 partitions, not 1") as raised:
        WorkerConfig("bank", workers=2, partitions=1)
    assert raised.value.context == {"workers": 2, "partitions": 1}
    with pytest.raises(ConfigError, match="at least one worker"):
        WorkerConfig("bank", workers=0, partitions=4)
    assert WorkerConfig("bank", workers=2, partitions=2).partitions == 2
