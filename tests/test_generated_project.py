"""A generated project's own suite passes, as its user runs it: chispa tests of the transform,
its configs, its Databricks bundle, and one end-to-end run through the development broker
killed in the middle and restarted (tests/test_smoke.py of the project). The engine's proofs run
once, in this repo (engine/tests), not in every project."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cookiecutter.main import cookiecutter

REPO = Path(__file__).resolve().parents[1]


def test_a_generated_projects_own_suite_passes_with_nothing_skipped(tmp_path: Path) -> None:
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
    # The project's package, as its editable install has it; the engine is this venv's.
    env["PYTHONPATH"] = str(project / "src")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEsp", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = result.stdout[max(result.stdout.find("= FAILURES ="), 0) :]
    assert result.returncode == 0, f"the generated project's tests failed:\n{report[:20000]}"
    summary = re.search(r"^(\d+) passed.*$", result.stdout, re.MULTILINE)
    assert summary, result.stdout[-3000:]
    assert "skipped" not in summary.group(0), result.stdout[-3000:]
    for file in ("test_transform.py", "test_config.py", "test_bundle.py", "test_smoke.py"):
        assert re.search(rf"^PASSED tests/{file}::", result.stdout, re.M), file
    print(summary.group(0))
