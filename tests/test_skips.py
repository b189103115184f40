"""The suite's skip rules (tests/skips.py): which reasons each connector setting allows."""

from __future__ import annotations

import os
from pathlib import Path

from kafka_delta_dev import connector_jars, kafka_cluster, maven
from skips import NOTHING_MISSING, STAND_IN, is_allowed

ONLY_DELTA = "delta-spark jars not on the classpath"
ONLY_KAFKA = "spark-sql-kafka jars not on the classpath"
BOTH = "delta-spark and spark-sql-kafka jars not on the classpath"


def test_without_java_the_jar_tests_may_skip_saying_so(tmp_path: Path) -> None:
    # A machine without Java and nothing in the cache: neither connector, and the reason says
    # why (Ivy, which fetches them, runs on Java).
    bare = {"KAFKA_DELTA_JAR_CACHE": str(tmp_path / "cache"), "PATH": str(tmp_path)}
    why = "Java (java) is not on PATH and JAVA_HOME is unset to fetch them"
    for reason in (ONLY_DELTA, ONLY_KAFKA, BOTH):
        assert is_allowed(f"{reason}: {why}", bare) and is_allowed(
            f"Skipped: {reason}: {why}", bare
        )
        assert not is_allowed(f"{reason}: some other reason", bare)
    assert not is_allowed("no Kafka broker: gone", bare)  # not a connector: refused
    assert not is_allowed(NOTHING_MISSING, bare)


def test_a_failed_maven_resolution_is_the_reason_and_a_resolved_cache_allows_no_jar_skip(
    tmp_path: Path,
) -> None:
    env = {"KAFKA_DELTA_JAR_CACHE": str(tmp_path), "PATH": os.environ["PATH"]}
    folder = connector_jars.folder_for(connector_jars.coordinates(), tmp_path)
    failed = folder.with_name(folder.name + ".FAILED")
    failed.write_text("Ivy could not resolve x:y:1: its repository does not serve x#y;1\n")
    why = failed.read_text().strip()
    assert is_allowed(f"{BOTH}: {why}", env)
    # Resolved (a MANIFEST written last): both connectors are there and no jar test may skip.
    failed.unlink()
    folder.mkdir()
    (folder / "delta-spark_4.2_2.13-4.4.0.jar").touch()
    (folder / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()
    (folder / connector_jars.MANIFEST).write_text("x\n")
    assert not is_allowed(f"{ONLY_DELTA}: {why}", env)
    assert is_allowed(NOTHING_MISSING, env)


def test_a_folder_of_ones_own_overrides_the_cache(tmp_path: Path) -> None:
    # delta-spark's jars in a folder: the delta-spark tests must run; the kafka source's may skip.
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "delta-spark_2.13-4.4.0.jar").touch()
    with_jars = {"KAFKA_DELTA_JARS": str(jars), "KAFKA_DELTA_JAR_CACHE": str(tmp_path / "c")}
    why = f"KAFKA_DELTA_JARS={jars} holds no jar of them"
    assert is_allowed(f"{ONLY_KAFKA}: {why}", with_jars)
    assert not is_allowed(f"{ONLY_DELTA}: {why}", with_jars)
    assert not is_allowed(f"{BOTH}: {why}", with_jars)
    # Spark fetching them itself: both connectors; only the "jars missing" check may skip.
    packages = {"KAFKA_DELTA_CONNECTORS": "packages"}
    assert is_allowed(NOTHING_MISSING, packages) and not is_allowed(
        f"{ONLY_KAFKA}: {why}", packages
    )


def test_a_test_of_what_only_kafka_does_may_skip_only_where_the_broker_is_the_stand_in(
    tmp_path: Path,
) -> None:
    reason = f"{STAND_IN}Apache Kafka's jars are not at hand (they were never fetched here)"
    bare = {"KAFKA_DELTA_JAR_CACHE": str(tmp_path / "empty")}
    assert is_allowed(reason, bare)
    assert is_allowed(reason, {**os.environ, "KAFKA_DELTA_BROKER": "tansu"})
    # Kafka's jars in the cache: the broker is Kafka, and no such test may skip.
    folder = maven.folder_for(kafka_cluster.jar_set(), tmp_path / "cache")
    folder.mkdir(parents=True)
    (folder / maven.MANIFEST).write_text("x\n")
    assert not is_allowed(reason, {"KAFKA_DELTA_JAR_CACHE": str(tmp_path / "cache")})


def test_a_shallow_clone_may_skip_the_migration_from_a_commit_it_lacks() -> None:
    reason = "this clone lacks commit df09585a65b1 (a shallow clone): the migration is tested"
    assert is_allowed(reason, {})
    assert not is_allowed("this clone lacks nothing", {})
