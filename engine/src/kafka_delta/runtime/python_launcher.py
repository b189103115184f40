"""Spark's Python processes import pyspark compiled, not from Spark's source zip.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and ``py4j-<version>-src.zip`` first on the
PYTHONPATH of every Python process it starts: under spark-submit the driver, then the process
that looks Python data sources up, the one that creates the source, the one that plans the
stream's batches, and the daemon that forks the tasks' workers. Those zips hold sources only,
and Python never caches the bytecode of a module imported from a zip: each of these processes
compiles pyspark anew before it runs a line, 1.5 s of a core against 0.36 s for the same imports
from the installed package (measured on 2 cores). A local run starts them one after another
before its first batch.

Where ``SPARK_HOME`` is the pyspark package this interpreter imports (pip installs it so: the
zips are that package's own sources), the zips add nothing but that cost. :func:`interpreter`
writes a launcher, a shell script that runs the interpreter with exactly those entries removed
from PYTHONPATH, and returns its path for ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``. The
launcher checks ``SPARK_HOME`` again at every start: with any other Spark home (a Spark
distribution, Databricks) it changes nothing. py4j's zip goes only where py4j is installed too.

``scripts/run_local.sh``, ``build_spark``, the tests and the benchmark use it, for local masters
only: the launcher is a file in this machine's cache, which a cluster's executors cannot run
(``build_spark`` leaves the Python of a run submitted to a cluster as the submitter named it).
On Databricks no launcher applies (its pyspark is not a pip package with the zips inside).
Launchers are kept in ``${XDG_CACHE_HOME:-~/.cache}/spark-python``, one per interpreter and
pyspark; an unwritable cache costs the speed-up, never the run.

    python -m kafka_delta.runtime.python_launcher    # the launcher's path, or the interpreter's own
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

# Filled in by script(): @NAME@ placeholders, as the shell text is full of braces.
SCRIPT = """#!/bin/sh
# Written by @MODULE@: runs @PYTHON@ without Spark's source zips on PYTHONPATH when
# SPARK_HOME is the pyspark package that interpreter imports (its installed, compiled copy).
case "${SPARK_HOME:-}" in
  @HOMES@)
    kept=""
    first=1
    rest="${PYTHONPATH:-}:"
    while [ -n "$rest" ]; do
      entry="${rest%%:*}"
      rest="${rest#*:}"
      case "$entry" in
        "$SPARK_HOME/python/lib/pyspark.zip"@PY4J@) ;;
        *) if [ "$first" = 1 ]; then kept="$entry"; first=0; else kept="$kept:$entry"; fi ;;
      esac
    done
    if [ "$first" = 1 ]; then unset PYTHONPATH; else export PYTHONPATH="$kept"; fi
    ;;
esac
exec @PYTHON@ "$@"
"""


def folder(env: Mapping[str, str] = os.environ) -> Path:
    """Where launchers are written."""
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "spark-python"


def installed_package(name: str) -> Path | None:
    """The folder of package ``name`` as this interpreter imports it from its own path, zip
    files left out (under spark-submit, Spark's zips come first on ``sys.path``)."""
    path = [p for p in sys.path if not p.lower().endswith(".zip")]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def script(python: str) -> str | None:
    """The launcher of ``python`` (this interpreter's path), or None when pyspark is not
    installed as a package here (its Spark home is elsewhere: nothing to remove)."""
    pyspark = installed_package("pyspark")
    if pyspark is None or not (pyspark / "python" / "lib" / "pyspark.zip").is_file():
        return None
    homes = sorted({str(pyspark), os.path.realpath(pyspark)})
    py4j = '|"$SPARK_HOME"/python/lib/py4j-*-src.zip' if installed_package("py4j") else ""
    fills = {
        "@MODULE@": __name__,
        "@PYTHON@": shlex.quote(python),
        "@HOMES@": "|".join(shlex.quote(home) for home in homes),
        "@PY4J@": py4j,
    }
    text = SCRIPT
    for placeholder, value in fills.items():
        text = text.replace(placeholder, value)
    return text


def interpreter(python: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """The path Spark should start Python with: the launcher of ``python`` (default: this
    interpreter), written once; ``python`` itself when no launcher applies or none can be
    written."""
    python = python or sys.executable
    text = script(python)
    if text is None:
        return python
    where = folder(env)
    launcher = where / f"python-{hashlib.sha256(text.encode()).hexdigest()[:16]}.sh"
    try:
        if launcher.is_file() and os.access(launcher, os.X_OK):
            return str(launcher)
        where.mkdir(parents=True, exist_ok=True)
        partial = launcher.with_name(f"{launcher.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        partial.chmod(0o755)
        os.replace(partial, launcher)  # a concurrent run writes the same text: either wins
    except OSError as exc:
        print(f"python_launcher: {where}: {exc}; Spark's zip of pyspark stays", file=sys.stderr)
        return python
    return str(launcher)


def use_for_spark(env: dict[str, str] | None = None) -> None:
    """Point ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` at this interpreter's launcher,
    each unless it names another interpreter (a user's choice stays)."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    chosen: str | None = None
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if env.get(name) in (None, "", sys.executable):
            chosen = chosen or interpreter(sys.executable, env)
            env[name] = chosen


def main() -> int:
    print(interpreter())
    return 0


if __name__ == "__main__":
    sys.exit(main())
