"""Runs the generated project's own test suite, as a user would after `cookiecutter`.

That suite holds the engine's proofs: chispa tests of the transform, config validation, the
delta-rs sink and offset store on real tables, the commit-back hook and end-to-end runs of the
pipeline on a local Spark session against the embedded Tansu broker.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from cookiecutter.main import cookiecutter

REPO = Path(__file__).resolve().parents[1]
# The generated suite skips a test only for connector jars its Spark session lacks (the
# generated docs/design.md section 6: no Maven on the build machines), and always with
# connectors_missing_reason(): "<connector>[ and <connector>] jars not on the classpath", naming
# exactly the missing ones among the connectors the test needs.
DELTA, KAFKA = "delta-spark", "spark-sql-kafka"
# tests/test_cluster_engine.py's check that a session without the jars stops at once skips
# where nothing is missing (KAFKA_DELTA_CONNECTORS=packages, or a folder holding both).
NOTHING_MISSING = "the connector jars are on the classpath: the engine can run"


def missing_connectors(environ: Mapping[str, str]) -> set[str]:
    """The connectors the generated suite's session lacks under ``environ``, as its conftest
    decides: KAFKA_DELTA_CONNECTORS=packages fetches both; KAFKA_DELTA_JARS=<folder> puts that
    folder's jars on spark.jars (delta-spark's; Spark's kafka source only where its jar is
    there too); without either, a fresh clone (no ../shared/jars) has neither."""
    if environ.get("KAFKA_DELTA_CONNECTORS") == "packages":
        return set()
    folder = environ.get("KAFKA_DELTA_JARS")
    if not folder:
        return {DELTA, KAFKA}
    has_kafka = any(Path(folder).expanduser().glob("spark-sql-kafka*.jar"))
    return set() if has_kafka else {KAFKA}


def allowed_skips(environ: Mapping[str, str]) -> set[str]:
    """Every reason the generated suite may legitimately skip with under ``environ``: a test
    needing delta-spark, Spark's kafka source or both reports the missing ones among them.
    Anything else is a test passing vacuously on a machine that has what it needs."""
    missing = missing_connectors(environ)
    if not missing:
        return {NOTHING_MISSING}
    needs = [[DELTA], [KAFKA], [DELTA, KAFKA]]
    return {
        f"{' and '.join(c for c in need if c in missing)} jars not on the classpath"
        for need in needs
        if any(c in missing for c in need)
    }


def rejected_skips(stdout: str, environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The skips in a ``pytest -rs`` report ("SKIPPED [count] file:line: reason") whose reason
    is not allowed under ``environ``."""
    skips = re.findall(r"^SKIPPED \[(\d+)\] (\S+): (.*)$", stdout, re.MULTILINE)
    allowed = allowed_skips(environ)
    return [s for s in skips if s[2] not in allowed]


def test_generated_project_suite_passes_skipping_only_what_needs_connector_jars(
    tmp_path: Path,
) -> None:
    project = Path(
        cookiecutter(
            str(REPO / "template"),
            no_input=True,
            config_file=str(REPO / "conf" / "embedded-local.yaml"),
            output_dir=str(tmp_path),
        )
    )
    env = {
        k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "KAFKA_BOOTSTRAP_SERVERS"}
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEsp", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    tail = "\n".join(result.stdout.splitlines()[-40:])
    # stdout holds pytest's report (failures, then the summary); stderr only client noise.
    report = result.stdout[max(result.stdout.find("= FAILURES ="), 0) :]
    assert result.returncode == 0, f"generated project's tests failed:\n{report[:20000]}"
    summary = re.search(r"^(\d+) passed.*$", result.stdout, re.MULTILINE)
    assert summary, tail
    assert int(summary.group(1)) >= 60, tail
    assert not rejected_skips(result.stdout, os.environ), rejected_skips(result.stdout, os.environ)
    skips = re.findall(r"^SKIPPED \[(\d+)\] (\S+): (.*)$", result.stdout, re.MULTILINE)
    if DELTA not in missing_connectors(os.environ):
        # delta-spark really ran: its sink's contract tests are among the passed ones.
        # 4 sink tests + 4 embedded+delta_spark engine tests + 5 operations tests.
        ran = re.findall(
            r"^PASSED \S*test_(?:engine_contract|operations)\.py::\S*delta_spark",
            result.stdout,
            re.M,
        )
        assert len(ran) >= 13, tail
        print(f"delta-spark contract tests passed: {len(ran)}")
    skipped = sum(int(count) for count, _, _ in skips)
    reported = re.search(r"(\d+) skipped", summary.group(0))
    assert skipped == (int(reported.group(1)) if reported else 0), tail
    print(summary.group(0))


def test_skip_rules_follow_the_connectors_each_setting_provides(tmp_path: Path) -> None:
    def report(*reasons: str) -> str:
        return "".join(f"SKIPPED [1] tests/t.py:1: {r}\n" for r in reasons)

    only_delta = "delta-spark jars not on the classpath"
    only_kafka = "spark-sql-kafka jars not on the classpath"
    both = "delta-spark and spark-sql-kafka jars not on the classpath"
    # A fresh clone, as the README's `./scripts/test` runs it: neither connector.
    fresh = report(only_delta, only_kafka, both)
    assert rejected_skips(fresh, {}) == []
    assert rejected_skips(fresh, {"KAFKA_DELTA_JARS": ""}) == []
    assert rejected_skips(report("no Kafka broker: gone"), {})  # not a connector: refused
    # delta-spark's jars in a folder: the delta-spark tests must run.
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "delta-spark_2.13-4.4.0.jar").touch()
    with_jars = {"KAFKA_DELTA_JARS": str(jars)}
    assert rejected_skips(report(only_kafka), with_jars) == []
    assert [s[2] for s in rejected_skips(fresh, with_jars)] == [only_delta, both]
    # Maven access: both connectors are fetched; only the "jars missing" check may skip.
    packages = {"KAFKA_DELTA_CONNECTORS": "packages"}
    assert rejected_skips(report(NOTHING_MISSING), packages) == []
    assert len(rejected_skips(report(only_kafka, NOTHING_MISSING), packages)) == 1
    assert rejected_skips(report(NOTHING_MISSING), {}) != []
