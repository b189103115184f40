"""The operations harness, CI-sized: every scenario of scripts/ops.py once per sink (topics
added, removed and re-added; partitions; a retried job; two checkpoints at once; transactional
producers; Delta log cleanup), each checked by an independent reader (I8)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAST_LINE = re.compile(
    r"^ops: scenarios=(\d+) sinks=(\d+) produced=(\d+) table_rows=(\d+) distinct_ids=(\d+) "
    r"missing=(\d+) duplicates=(\d+)$"
)


def test_operations_on_a_running_pipeline_leave_every_record_exactly_once(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "ops.py"), "--workdir", str(tmp_path / "ops")],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    last = result.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, last
    scenarios, sinks, produced, rows, distinct, missing, duplicates = map(int, match.groups())
    # Both sinks where delta-spark's jars are available (CI: shared/jars), else delta-rs alone.
    assert sinks == (2 if os.environ.get("KAFKA_DELTA_JARS") else 1), output[-3000:]
    assert scenarios >= 10
    assert produced > 0 and produced == rows == distinct
    assert missing == duplicates == 0
    for scenario in ("topics: re-added", "retries: retried job fenced", "log cleanup"):
        assert scenario in output, scenario
    print(last)
