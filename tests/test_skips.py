"""The suite's skip rules (tests/skips.py): which reasons each connector setting allows."""

from __future__ import annotations

from pathlib import Path

from skips import NOTHING_MISSING, is_allowed


def test_skip_rules_follow_the_connectors_each_setting_provides(tmp_path: Path) -> None:
    only_delta = "delta-spark jars not on the classpath"
    only_kafka = "spark-sql-kafka jars not on the classpath"
    both = "delta-spark and spark-sql-kafka jars not on the classpath"
    # A fresh clone, as the README's `./scripts/test` runs it: neither connector.
    for reason in (only_delta, only_kafka, both):
        assert is_allowed(reason, {}) and is_allowed(f"Skipped: {reason}", {"KAFKA_DELTA_JARS": ""})
    assert not is_allowed("no Kafka broker: gone", {})  # not a connector: refused
    assert not is_allowed(NOTHING_MISSING, {})
    # delta-spark's jars in a folder: the delta-spark tests must run.
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "delta-spark_2.13-4.4.0.jar").touch()
    with_jars = {"KAFKA_DELTA_JARS": str(jars)}
    assert is_allowed(only_kafka, with_jars)
    assert not is_allowed(only_delta, with_jars) and not is_allowed(both, with_jars)
    # Maven access: both connectors are fetched; only the "jars missing" check may skip.
    packages = {"KAFKA_DELTA_CONNECTORS": "packages"}
    assert is_allowed(NOTHING_MISSING, packages) and not is_allowed(only_kafka, packages)


def test_a_shallow_clone_may_skip_the_migration_from_a_commit_it_lacks() -> None:
    reason = "this clone lacks commit df09585a65b1 (a shallow clone): the migration is tested"
    assert is_allowed(reason, {})
    assert not is_allowed("this clone lacks nothing", {})
