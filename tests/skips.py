"""Which skips this suite may report: a test that cannot run here is skipped with its reason, and
only for a reason this machine really has; any other skip is a test passing vacuously, and
fails the session (tests/suite_plugin.py).

The delta-spark and Spark-kafka tests need connector jars from Maven Central, which
``scripts/bootstrap`` fetches through the machine's Maven (kafka_delta_dev.connector_jars): they
may skip only where there are none, with ``connector_skip_reason()``, "<connector>[ and
<connector>] jars not on the classpath: <why>", naming exactly the missing ones among those the
test needs and why this machine has none (no mvn, Maven refused, a folder without them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from kafka_delta.runtime.connectors import connectors_missing_reason
from kafka_delta_dev.connector_jars import local_folder

DELTA, KAFKA = "delta-spark", "spark-sql-kafka"
# test_cluster_engine's check that a session without the jars stops at once skips where
# nothing is missing (KAFKA_DELTA_CONNECTORS=packages, or a folder holding both).
NOTHING_MISSING = "the connector jars are on the classpath: the engine can run"
# Reasons that say what a clone or a machine lacks, never a test that could run.
ENVIRONMENT = (
    # tests/test_cruft.py's migration from the commit before the engine moved out of projects
    re.compile(r"^this clone lacks commit [0-9a-f]{12} \(a shallow clone\)"),
    # engine/tests/test_spark_connect.py's Connect tests, in a process holding a classic session
    # (pyspark allows no Connect session beside it): the same run runs them in a pytest of
    # their own through Spark Connect (test_the_engine_contract_passes_through_spark_connect).
    re.compile(r"^runs in the suite through Spark Connect \(SPARK_REMOTE=local\[2\]\)"),
)


def missing_connectors(environ: Mapping[str, str]) -> set[str]:
    """The connectors the test session lacks under ``environ``, as kafka_delta_dev's plugin
    decides: KAFKA_DELTA_CONNECTORS=packages fetches both; else the jars of KAFKA_DELTA_JARS or
    of the cache Maven filled (delta-spark's; Spark's kafka source only where its jar is there
    too); without either, neither is there."""
    if environ.get("KAFKA_DELTA_CONNECTORS") == "packages":
        return set()
    folder, _ = local_folder(dict(environ))
    if not folder:
        return {DELTA, KAFKA}
    has_kafka = any(Path(folder).expanduser().glob("spark-sql-kafka*.jar"))
    return set() if has_kafka else {KAFKA}


def allowed_skips(environ: Mapping[str, str]) -> set[str]:
    """Every connector reason a test may skip with under ``environ``."""
    missing = missing_connectors(environ)
    if not missing:
        return {NOTHING_MISSING}
    folder, why = local_folder(dict(environ))
    why = why or f"KAFKA_DELTA_JARS={folder} holds no jar of them"
    needs = [[DELTA], [KAFKA], [DELTA, KAFKA]]
    return {
        connectors_missing_reason([c for c in need if c in missing], why)
        for need in needs
        if any(c in missing for c in need)
    }


def skip_reason(environ: Mapping[str, str], missing: list[str]) -> str:
    """The reason a test of this repository skips with for want of ``missing`` connectors."""
    folder, why = local_folder(dict(environ))
    return connectors_missing_reason(
        missing, why or f"KAFKA_DELTA_JARS={folder} holds no jar of them"
    )


# The tests of what only Apache Kafka's broker does (the plugin's ``apache_kafka`` fixture) skip
# where the development broker is the stand-in Tansu: Kafka's jars could not be fetched, or
# KAFKA_DELTA_BROKER=tansu asked for it. Anywhere else such a skip is vacuous.
STAND_IN = "needs Apache Kafka's broker, not its stand-in: "


def stand_in_allowed(environ: Mapping[str, str]) -> bool:
    from kafka_delta_dev.kafka_cluster import jar_set
    from kafka_delta_dev.maven import cache_root, current

    if environ.get("KAFKA_DELTA_BROKER", "").strip().lower() == "tansu":
        return True
    return current(jar_set(), cache_root(dict(environ))).folder is None


def is_allowed(reason: str, environ: Mapping[str, str]) -> bool:
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith(STAND_IN):
        return stand_in_allowed(environ)
    return reason in allowed_skips(environ) or any(p.match(reason) for p in ENVIRONMENT)
