"""Named points of a batch's life: the one seam through which fault injection reaches the engine.

The engine says where it is, ``reached("before_delta_commit")``, at the few points where its
durable state sits between two writes (the names: :data:`POINTS`). Nothing listens in a run,
and each call costs one comparison. The engine's dev tools listen there
(:mod:`kafka_delta_dev.faults`) to stop a run at exactly one point, as a crash would; the
engine imports nothing of them.

A process a fault-injection harness starts but does not run itself (spark-submit's driver, the
Python worker of a read task, an executor of a cluster) learns it from its environment: when
``KAFKA_DELTA_CRASH_AT`` is set, importing this module loads :mod:`kafka_delta_dev.faults`,
which listens in that process. Unset (every real run), nothing more is imported.

Points: ``mid_read`` (a read task has yielded records), ``before_delta_commit``,
``after_dead_letters`` (dead letters committed, main commit not yet), ``after_data_files``
(delta-rs sink: the batch's Parquet files are written, not yet committed), ``after_delta_commit``
(the batch is in Delta; Spark has not recorded it), ``between_tables`` (a pipeline of several
tables: the batch is committed to the tables before the next one only), ``before_commit_copy``
(delta-spark sink: the batch is in Delta, the copy of its commit record not yet written),
``after_add_columns`` (delta-rs sink: the columns a new writer schema brought are committed, the
batch is not), ``after_widen_columns`` (delta-rs sink: the table is rewritten with a promotion's
wider columns, the batch is not), ``in_commit_back`` (the hook is about to commit to the group).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

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

Listener = Callable[[str], None]

_listener: Listener | None = None


def reached(name: str) -> None:
    """The engine is at point ``name`` (one of :data:`POINTS`)."""
    if _listener is not None:
        _listener(name)


def listen(listener: Listener | None) -> Listener | None:
    """Call ``listener`` at every point this process reaches from now on (None: stop); the
    listener it replaces."""
    global _listener
    previous, _listener = _listener, listener
    return previous


# Last, with reached() and listen() defined: the injector imports them from this module.
if os.environ.get("KAFKA_DELTA_CRASH_AT"):
    try:
        importlib.import_module("kafka_delta_dev.faults")
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            "KAFKA_DELTA_CRASH_AT is set, but kafka_delta_dev (the engine's dev tools, which "
            "inject the crash) is not installed in this Python; unset it for a real run"
        ) from exc
