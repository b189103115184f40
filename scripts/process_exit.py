"""How the template repo's scripts leave: with their real exit status.

deltalake 1.6.6 sometimes aborts the interpreter's teardown ("terminate called without an
active exception", exit status 134) when a native thread pool is still alive at exit, typically
after table data was read through delta-rs, as the demo, the benchmark and the crash harness do.
A run that did its work would then report 134. So each script's ``if __name__ == "__main__":``
calls :func:`run_and_exit` with its ``main``: after the work is done it flushes logging and the
standard streams, stops a Spark session if one was created, and leaves with
``os._exit(status)``, so interpreter teardown never runs. ``main`` itself stays callable from
tests. (Generated projects carry the same helper as ``<pkg>/process_exit.py``.)
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable


def run_and_exit(main: Callable[[], int | None]) -> None:
    """Run ``main`` and leave the process with its status: the return value, the code of a
    ``SystemExit`` it raises, 1 for any other exception (traceback printed), 130 for Ctrl-C."""
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
    """Stop Spark if it runs here, flush logging and the standard streams, ``os._exit``."""
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
    """Stop the Spark session this process created, if any (a local gateway JVM exits when
    this process's end of its stdin closes)."""
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
