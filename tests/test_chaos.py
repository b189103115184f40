"""The crash harness, CI-sized: SIGKILLs at random moments and at the engine's named crash
points, a deleted checkpoint, a broker paused past a metadata request's 30 s (one
configuration), then an independent check that every record landed once (I1, I3, I9). The full
run (`scripts/chaos --kills 50 --resets 5 --pauses 5`) is the same code with more cycles."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from skips import DELTA, missing_connectors, skip_reason

REPO = Path(__file__).resolve().parents[1]
LAST_LINE = re.compile(
    r"^chaos: kills=(\d+) checkpoint_resets=(\d+) produced=(\d+) table_rows=(\d+) "
    r"distinct_ids=(\d+) missing=(\d+) duplicates=(\d+)$"
)


@pytest.mark.parametrize(
    ("sink", "value_format", "table_on", "fan_out", "faults"),
    [
        # A broker pause (35 s), which the run rides out (kafka.unavailable_timeout_seconds),
        # and a run of a transform that raises in a task, which stops and commits nothing.
        pytest.param("delta_rs", "json", "disk", False, 1, id="delta_rs-json-disk-outages"),
        pytest.param("delta_spark", "json", "disk", False, 0, id="delta_spark-json-disk"),
        # Avro with a schema change and a table in a bucket, in one run: each is its own
        # mechanism (decoding and add_columns; the object store's commits and side files).
        pytest.param("delta_rs", "avro", "s3", False, 0, id="delta_rs-avro-s3"),
        # Two tables by record routing, the first kill between their commits of a batch.
        pytest.param("delta_rs", "json", "disk", True, 0, id="delta_rs-json-disk-fan_out"),
    ],
)
def test_repeated_sigkills_and_a_lost_checkpoint_leave_every_record_exactly_once(
    tmp_path: Path, sink: str, value_format: str, table_on: str, fan_out: bool, faults: int
) -> None:
    """With ``avro``, Confluent-framed records behind the local registry whose schema gains a
    field in the middle of the kills: the table gains the column, and no record is lost or
    doubled across the restarts the change causes. With ``s3``, the table lives in a bucket of
    a local S3 API (moto's server on loopback)."""
    if sink == "delta_spark" and DELTA in missing_connectors(os.environ):
        pytest.skip(skip_reason(os.environ, [DELTA]))
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chaos.py"),
            "--kills",
            "5",
            "--resets",
            "1",
            "--per-round",
            "600",
            "--max-kill-delay",
            "20",
            "--seed",
            "20261122",
            "--workdir",
            str(tmp_path / "chaos"),
            "--sink",
            sink,
            "--format",
            value_format,
            "--table-on",
            table_on,
            *(["--fan-out"] if fan_out else []),
            *(["--pauses", str(faults), "--faulty-transforms", str(faults)] if faults else []),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    last = result.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, last
    kills, resets, produced, rows, distinct, missing, duplicates = map(int, match.groups())
    assert kills >= 5 and resets >= 1
    assert produced > 0 and produced == rows == distinct
    assert missing == duplicates == 0
    # The named point between the Delta commit and Spark's commit was really hit.
    assert "killed by crash point after_delta_commit;" in output
    if value_format == "avro":
        assert "producers move to schema version 2" in output
        (columns,) = re.findall(r"\] table columns: (.*)$", output, re.MULTILINE)
        assert "channel" in columns.split(", "), columns
    if table_on == "s3":
        assert "table=s3://chaos/orders" in output
    if fan_out:
        assert "killed by crash point between_tables;" in output
    if faults:
        ridden = re.findall(
            r"broker paused \d+s from [\d.]+s, ridden out \((\d+) retries\)", output
        )
        assert len(ridden) == faults, output[-8000:]
        assert all(int(n) >= 1 for n in ridden), ridden  # the pause outlasted a request
        stopped = "a transform raising in a task stopped the run (exit 1), nothing committed"
        assert output.count(stopped) == faults, output[-8000:]
    print(last)
