#!/usr/bin/env python3
"""Builds the engine's wheel (kafka-delta, the version pinned in pyproject.toml) into a folder:
what the bundle deploys beside this project's wheel (databricks.yml, artifacts) and what
scripts/submit.sh ships. pip finds it where engine.txt says.

    python scripts/engine_wheel.py dist/engine
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]


def engine_pin() -> str:
    """The project's one pin of the engine, ``kafka-delta==X.Y.Z``, from pyproject.toml (read as
    text: Python 3.10 has no tomllib)."""
    text = (PROJECT / "pyproject.toml").read_text(encoding="utf-8")
    pins = re.findall(r"""["']kafka-delta\s*==\s*([^"';,\s]+)["']""", text)
    if len(pins) != 1:
        raise SystemExit("error: pyproject.toml must pin kafka-delta==X.Y.Z once, in dependencies")
    return f"kafka-delta=={pins[0]}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-r", "engine.txt"]
    command += ["--wheel-dir", argv[0], engine_pin()]
    return subprocess.run(command, cwd=PROJECT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
