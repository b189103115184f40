"""Leaving a command with its real exit status.

deltalake 1.6.6 sometimes aborts the interpreter's teardown ("terminate called without an
active exception", exit status 134): a native thread pool is still alive when the process
exits, typically after table data was read through delta-rs. A command that did its work and
reported success would then exit 134, and a supervisor (spark-submit, a job scheduler, a test)
would take it for a failure, or retry it.

So every command the project ships ends through :func:`run_and_exit`: once the work is done it
flushes logging and standard streams, stops the Spark session if one was created, and leaves
with ``os._exit(status)``, so interpreter teardown never runs. ``main(argv) -> int`` functions
stay plain and callable from tests; only the entry points (console script, ``python -m``,
``spark-submit main.py``) call this module.

On Databricks (``DATABRICKS_RUNTIME_VERSION`` is set) the driver's Python process belongs to
the runtime and runs the wheel task's entry point inside it: there the session is the
runtime's and the process must live on, so a failure is raised as ``SystemExit(status)`` and
success simply returns.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable


def run_and_exit(main: Callable[[], int | None]) -> None:
    """Run ``main`` and leave the process with its status (see the module docstring): the
    return value, the code of a ``SystemExit`` it raises (``--help`` is 0, a usage error 2),
    1 for any other exception (its traceback printed) and 130 for Ctrl-C."""
    try:
        status = _code(main())
    except SystemExit as exc:
        status = _code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    exit_process(status)


def exit_process(status: int) -> None:
    """Flush, stop Spark, ``os._exit(status)``; on Databricks raise ``SystemExit`` instead when
    ``status`` is not 0 (and return when it is)."""
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        if status:
            raise SystemExit(status)
        return
    _stop_spark()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed stream or a reader that went away
            pass
    os._exit(status)


def _code(code: object) -> int:
    """Python's rules for ``sys.exit(code)``: None is 0, an int itself, anything else is
    printed to stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    print(code, file=sys.stderr)
    return 1


def _stop_spark() -> None:
    """Stop the Spark session this process created, if it created one (its JVM then goes too:
    a local gateway JVM exits when this process's end of its stdin closes)."""
    if "pyspark" not in sys.modules:
        return
    try:
        from pyspark import SparkContext

        if "pyspark.sql" in sys.modules:
            from pyspark.sql import SparkSession

            session = SparkSession.getActiveSession()
            if session is not None:
                session.stop()
        context = SparkContext._active_spark_context
        if context is not None:
            context.stop()
    except Exception as exc:  # leaving anyway: the status must not change because of this
        print(f"warning: stopping Spark failed: {exc}", file=sys.stderr)
