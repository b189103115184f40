"""ACLs as production enforces them (KRaft's StandardAuthorizer on the secured broker of
secure_support.py), on both engines where the engine reads Kafka itself: a principal that may
not read a topic, or not even describe it, stops with one sentence naming the topic and the ACL
it lacks, nothing written (before any work when kafka.client's principal lacks it; from the read
itself when the ACL goes while a run reads, or when only kafka.jvm_client's principal lacks it);
a principal that may read the topic but not the consumer group lands every record exactly once,
says once that the commit-back is refused and why, and ``offsets show`` calls the group
unreadable, never lag. None of the engine's calls needs an ACL on the cluster: no principal here
has one.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest
from deltalake import DeltaTable

from conftest import engine_config, skip_without_connectors
from kafka_delta.cli import EXIT_REFUSED, main
from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import GroupNotAuthorizedError, KafkaAdmin, KafkaRefusedError
from kafka_delta.pipeline import Pipeline
from secure_support import (
    SecureKafka,
    Shape,
    scram,
    topic_and_config,
)
from support import assert_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _as(kafka: SecureKafka, user: str, jvm_user: str | None = None) -> Shape:
    """The SCRAM shape logged in as ``user``; the Java client as ``jvm_user`` (default: the
    same)."""
    shape = scram(kafka, user)
    if jvm_user is None:
        return shape
    jaas = (
        shape.jvm_client["sasl.jaas.config"]
        .replace("KAFKA_USERNAME", "KAFKA_JVM_USERNAME")
        .replace("KAFKA_PASSWORD", "KAFKA_JVM_PASSWORD")
    )
    return replace(
        shape,
        jvm_client={**shape.jvm_client, "sasl.jaas.config": jaas},
        environ={
            **shape.environ,
            "KAFKA_JVM_USERNAME": jvm_user,
            "KAFKA_JVM_PASSWORD": kafka.passwords[jvm_user],
        },
    )


def _nothing_written(cfg: PipelineConfig) -> None:
    """No commit in the table (delta-spark may have made its folder), or none with a row."""
    table = Path(cfg.delta.table)
    if list((table / "_delta_log").glob("*.json")):
        assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 0


# -- a topic the principal may not read ------------------------------------------------------------

BEFORE_ANY_WORK = {
    # Describe, not Read: Kafka reports the operations it authorizes on the topic.
    "dave": (
        "Kafka at {address} does not let User:dave read topic '{topic}' (Kafka authorizes it "
        "for DESCRIBE on the topic): grant User:dave Read on topic '{topic}' (kafka-acls --add "
        "--allow-principal User:dave --operation Read --topic {topic})"
    ),
    # No ACL at all, on the topic or the cluster: Kafka does not even show it the topic.
    "carol": (
        "Kafka at {address} does not let User:carol describe topic '{topic}' "
        "(TOPIC_AUTHORIZATION_FAILED, also Kafka's answer for a topic that does not exist to a "
        "principal without Describe on it): grant User:carol Describe and Read on topic "
        "'{topic}' (kafka-acls --add --allow-principal User:carol --operation Describe "
        "--operation Read --topic {topic})"
    ),
}


@pytest.mark.parametrize("user", sorted(BEFORE_ANY_WORK))
def test_a_principal_that_may_not_read_the_topic_stops_before_any_work_naming_the_acl(
    secure_kafka, engine, user, tmp_path, monkeypatch, capsys
) -> None:
    """carol used to be told the topic "does not exist" (Kafka leaves out of a listing the
    topics a principal may not describe), dave's run to fail in a read task with librdkafka's
    "Broker: Topic authorization failed" inside Spark's trace."""
    shape = _as(secure_kafka, user)
    path, cfg = topic_and_config(secure_kafka, shape, tmp_path, engine, records=10)
    for name, value in shape.environ.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()

    started = time.monotonic()
    status = main(["--config", str(path)])
    took = time.monotonic() - started

    out, err = capsys.readouterr()
    expected = BEFORE_ANY_WORK[user].format(
        address=cfg.kafka.bootstrap_servers, topic=cfg.kafka.topics[0]
    )
    assert status == EXIT_REFUSED
    assert (out + err).splitlines() == [f"error: {expected}; nothing was read or written"]
    assert took < 30
    assert not Path(cfg.delta.table).exists() and not Path(cfg.checkpoint).exists()


def test_a_read_the_topics_acl_refuses_stops_the_embedded_run_with_the_acl_it_lacks(
    spark, secure_kafka, tmp_path
) -> None:
    """The ACL went while the run reads (the start-up checked it before): the read task's fetch
    is refused, and the run stops with the sentence rather than librdkafka's words inside
    Spark's trace."""
    shape = _as(secure_kafka, "dave")
    _, cfg = topic_and_config(secure_kafka, shape, tmp_path, engine_config("embedded"), records=10)

    with pytest.raises(KafkaRefusedError) as refused:
        Pipeline(spark, cfg).run()

    topic = cfg.kafka.topics[0]
    assert str(refused.value) == (
        f"Kafka at {cfg.kafka.bootstrap_servers} does not let User:dave read topic '{topic}' "
        f"(TOPIC_AUTHORIZATION_FAILED): grant User:dave Read on topic '{topic}' (kafka-acls "
        f"--add --allow-principal User:dave --operation Read --topic {topic})"
    )
    _nothing_written(cfg)


JVM_DENIED = {
    # The executors' fetches are refused: Spark names the topic.
    "dave": (
        "Kafka at {address} does not let User:dave read topic '{topic}' "
        "(TopicAuthorizationException: Not authorized to access topics: [{topic}]): grant "
        "User:dave Describe and Read on topic '{topic}' (kafka-acls --add --allow-principal "
        "User:dave --operation Describe --operation Read --topic {topic})"
    ),
    # The driver's offset lookup is refused: the Java client names no topic.
    "carol": (
        "Kafka at {address} does not let User:carol read topic '{topic}' "
        "(TopicAuthorizationException: Topic authorization failed.): grant User:carol Describe "
        "and Read on topic '{topic}' (kafka-acls --add --allow-principal User:carol --operation "
        "Describe --operation Read --topic {topic})"
    ),
}


@pytest.mark.parametrize("jvm_user", sorted(JVM_DENIED))
def test_a_java_client_principal_without_the_topics_acls_is_one_sentence_nothing_written(
    spark, secure_kafka, jvm_user, tmp_path
) -> None:
    """kafka.client's principal may read (the start-up passes); Spark's kafka source logs in as
    another that may not: its TopicAuthorizationException, inside Spark's text, is the
    sentence."""
    engine = engine_config("cluster")
    skip_without_connectors(spark, engine)
    shape = _as(secure_kafka, "alice", jvm_user=jvm_user)
    _, cfg = topic_and_config(secure_kafka, shape, tmp_path, engine, records=10)

    started = time.monotonic()
    with pytest.raises(KafkaRefusedError) as refused:
        Pipeline(spark, cfg).run()
    took = time.monotonic() - started

    assert str(refused.value) == JVM_DENIED[jvm_user].format(
        address=cfg.kafka.bootstrap_servers, topic=cfg.kafka.topics[0]
    )
    assert took < 30, took
    _nothing_written(cfg)


# -- a group the principal may not read ------------------------------------------------------------


def test_without_the_groups_acl_every_record_lands_once_and_the_refusal_is_said_once(
    spark, secure_kafka, engine, tmp_path, monkeypatch, capsys, caplog
) -> None:
    """bob may read the topic, not the group. The group is for lag tools only
    (kafka/commit_back.py): the data lands exactly once, the run says once (not every batch)
    that the commit-back is refused and why, and offsets show calls the group unreadable. It
    used to fail the embedded run (the read task's consumer took its group's refused
    coordinator look-up for a failed read) and log a warning every batch."""
    shape = _as(secure_kafka, "bob")
    path, cfg = topic_and_config(
        secure_kafka,
        shape,
        tmp_path,
        engine,
        records=160,
        kafka_keys={"max_records_per_trigger": 40},
    )

    with caplog.at_level(logging.INFO, logger="kafka_delta"):
        summary = Pipeline(spark, cfg).run()

    assert_exactly_once(cfg, 160)
    assert summary.batches == 4
    stats = summary.commit_back
    # Newest wins: a batch's offsets still waiting when the next batch's come are superseded.
    assert stats is not None and stats.succeeded == 0
    assert stats.failed + stats.superseded == summary.batches and stats.failed >= 2, stats
    group, topic = cfg.kafka.consumer_group, cfg.kafka.topics[0]
    refusal = (
        f"Kafka at {cfg.kafka.bootstrap_servers} does not let User:bob read group '{group}' "
        f"(GROUP_AUTHORIZATION_FAILED): grant User:bob Read on group '{group}' (kafka-acls "
        f"--add --allow-principal User:bob --operation Read --group {group})"
    )
    said = [r.getMessage() for r in caplog.records if "commit-back" in r.getMessage()]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if "commit-back" in r.getMessage() and r.levelno >= logging.WARNING
    ]
    assert warnings == [
        f"commit-back to group '{group}' is refused: {refusal}. The table is exact and "
        "unaffected (the group is for lag tools only); lag tools show the group's old offsets "
        "until the ACL is granted. Each refused commit is counted in commit_back_failed, and "
        "not said again"
    ], said
    with pytest.raises(GroupNotAuthorizedError):
        KafkaAdmin(cfg.kafka.client_config()).committed(group, {topic: [0, 1]})

    for name, value in shape.environ.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert main(["offsets", "show", "--json", "--config", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["consumer_group_unreadable"] == refusal
    assert {row["group_offset"] for row in shown["partitions"]} == {"unreadable"}
    assert shown["lag"] == 0
    assert main(["offsets", "show", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"consumer group: {group} (unreadable: {refusal})" in text
    assert main(["offsets", "verify", "--config", str(path), "--against-kafka"]) == 0
    out = capsys.readouterr().out
    assert f"skip  group: consumer group {group} is unreadable: {refusal}" in out, out
    assert "verify: OK" in out
