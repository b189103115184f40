"""Crashes at the engine's named points, for fault-injection tests only (scripts/chaos,
scripts/ops, the I1 tests). It listens at the engine's one seam,
:mod:`kafka_delta.crash_points`; the engine never imports it.

When the environment variable ``KAFKA_DELTA_CRASH_AT`` names a point, the whole pipeline
(driver, JVM and Python workers) is killed with SIGKILL the moment execution reaches it, after
``KAFKA_DELTA_CRASH_AFTER`` earlier passes (default 0); the seam loads this module in every
process of such a run. The harness must start the pipeline in a session of its own
(``start_new_session=True``): the kill targets that session's leader group, and PySpark's
worker daemon, which moves itself to a group of its own, so it never reaches the harness.

In one process (scripts/ops, which keeps its runs and its Spark session in one process),
:func:`armed` makes a point on the driver raise :class:`InjectedCrash` instead: the batch stops
there and the query fails, leaving the durable state (Delta, Spark's checkpoint) a SIGKILL at
that point leaves.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kafka_delta.crash_points import POINTS, listen

# Read once at import.
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


def _crash_at(name: str) -> None:
    """Kill the whole pipeline here if the environment asks for it (or raise, armed)."""
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


listen(_crash_at)
