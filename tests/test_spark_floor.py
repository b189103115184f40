"""scripts/spark_floor: Spark's own floor, the figures the pipeline's start-up and fixed cost per
batch are held against (docs/performance.md, "Spark's own floor")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(
    r"^floor: session_s=(?P<session>[\d.]+) first_batch_s=(?P<first>[\d.]+) "
    r"batch_s=(?P<batch>[\d.]+) batch_no_job_s=(?P<no_job>[\d.]+) "
    r"batch_python_write_s=(?P<python_write>[\d.]+)$"
)


def _floor(*args: str) -> subprocess.CompletedProcess[str]:
    # Its JVM maps the session's class archive (tests/suite_plugin.py), as a user's second run does.
    return subprocess.run(
        [str(ROOT / "scripts" / "spark_floor"), *args], capture_output=True, text=True, timeout=600
    )


def test_the_floor_prints_its_machine_checkable_line() -> None:
    run = _floor("--batches", "10")
    assert run.returncode == 0, run.stderr[-3000:]
    match = LINE.match(run.stdout.strip().splitlines()[-1])
    assert match, run.stdout
    figures = {name: float(value) for name, value in match.groupdict().items()}
    assert 0 < figures["session"] < figures["first"]
    assert figures["batch"] > 0 and figures["no_job"] > 0 and figures["python_write"] > 0


def test_too_few_batches_is_one_clear_error() -> None:
    run = _floor("--batches", "3")
    assert run.returncode == 2
    assert "--batches must be at least 10" in run.stderr
    assert "Traceback" not in run.stderr
