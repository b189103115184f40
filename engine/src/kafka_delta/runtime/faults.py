"""Named crash points, for fault-injection tests only (scripts/chaos, scripts/ops, the I1 tests).

When the environment variable ``KAFKA_DELTA_CRASH_AT`` names a point, the whole pipeline
(driver, JVM and Python workers) is killed with SIGKILL the moment execution reaches it, after
``KAFKA_DELTA_CRASH_AFTER`` earlier passes (default 0). Unset, every point is a no-op costing
one comparison. The harness must start the pipeline in a session of its own
(``start_new_session=True``): the kill targets that session's leader group, and PySpark's
worker daemon, which moves itself to a group of its own, so it never reaches the harness.

In one process (scripts/ops, which keeps its runs and its Spark session in one process),
:func:`armed` makes a point on the driver raise :class:`InjectedCrash` instead: the batch stops
there and the query fails, leaving the durable state (Delta, Spark's checkpoint) a SIGKILL at
that point leaves.

Points: ``mid_read`` (a read task has yielded records), ``before_delta_commit``,
``after_dead_letters`` (dead letters committed, main commit not yet), ``after_data_files``
(delta-rs sink: the batch's Parquet files are written, not yet committed), ``after_delta_commit``
(the batch is in Delta; Spark has not recorded it), ``between_tables`` (a pipeline of several
tables: the batch is committed to the tables before the next one only), ``before_commit_copy``
(delta-spark sink: the batch is in Delta, the copy of its commit record not yet written),
``after_add_columns``
(delta-rs sink: the columns a new writer schema brought are committed, the batch is not),
``after_widen_columns`` (delta-rs sink: the table is rewritten with a promotion's wider
columns, the batch is not),
``in_commit_back`` (the hook is about to commit to the group).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

POINTS = frozenset(
    {
        "mid_read",
        "before_delta_commit",
        "after_dead_letters",
        "after_data_files",
        "after_add_columns",
        "after_widen_columns",
        "after_delta_commit",
        "between_tables",
        "before_commit_copy",
        "in_commit_back",
    }
)

# Read once at import: library code otherwise never looks at the environment.
_TARGET = os.environ.get("KAFKA_DELTA_CRASH_AT") or None
_SKIP = int(os.environ.get("KAFKA_DELTA_CRASH_AFTER", "0") or 0)
_passes = 0

if _TARGET is not None and _TARGET not in POINTS:
    raise ValueError(f"KAFKA_DELTA_CRASH_AT={_TARGET!r} is not one of {sorted(POINTS)}")


@dataclass
class _Armed:
    point: str
    after: int
    passes: int = 0


# In-process arming (armed()), or None.
_armed: _Armed | None = None


class InjectedCrash(RuntimeError):
    """A batch stopped at an armed crash point (:func:`armed`)."""


@contextmanager
def armed(name: str, after: int = 0) -> Iterator[None]:
    """Within the block, the driver raises :class:`InjectedCrash` when it reaches ``name`` for
    the ``after + 1``-th time."""
    global _armed
    if name not in POINTS:
        raise ValueError(f"{name!r} is not one of {sorted(POINTS)}")
    _armed = _Armed(name, after)
    try:
        yield
    finally:
        _armed = None


def crash_point(name: str) -> None:
    """Kill the whole pipeline here if the test environment asks for it (or raise, armed)."""
    global _passes
    if _armed is not None and _armed.point == name:
        _armed.passes += 1
        if _armed.passes > _armed.after:
            raise InjectedCrash(f"crash point {name}")
    if _TARGET != name:
        return
    _passes += 1
    if _passes > _SKIP:
        # The driver's group first (from a worker, killing our own group first would end us
        # before the driver), then our own, which is the same group in the driver.
        for group in (os.getsid(0), os.getpgid(0)):
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
