"""The run's own compaction (``maintenance.compact_every_seconds``): a thread beside the stream
compacts the run's tables, so a table committed every second keeps few files.

At one commit a second (``trigger.interval_seconds: 0``) every batch adds a file per task, and a
table gets thousands of small files an hour: every reader, and every later compaction, pays for
them. ``table maintain`` compacts on an operator's schedule; this compacts on the run's, in the
run's own process, with the same engine calls (:mod:`kafka_delta.delta.maintenance`):

- each round compacts every table the run writes, then each dead-letter table that exists,
  one after the other; the next round is due ``compact_every_seconds`` after one ends;
- it never touches the batch's path: a compaction commits ``remove``/``add`` actions with
  ``dataChange=false``, which neither sink's appends conflict with (the same reasoning as
  ``table maintain`` beside a run, :mod:`kafka_delta.commands.table`); a compaction that loses
  a commit race is retried on the new snapshot;
- a round that fails is logged with the table and the reason, and the stream goes on: the
  files stay as they were, correct, and the next round tries again;
- the run ends after the round in progress, if any: a compaction is one Delta commit or
  nothing, and waiting for it keeps the run from leaving its files uncommitted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from kafka_delta.delta.maintenance import Maintainer, first_line, with_retries

log = logging.getLogger(__name__)


class RunCompaction:
    """Compacts ``tables`` (each location with the maintenance of its engine and storage: the
    run's tables, then its dead-letter tables) every ``every_s`` seconds in a thread of its
    own, until :meth:`close`. A table not there yet (a dead-letter table before the first dead
    letter) is passed over."""

    def __init__(self, every_s: float, tables: Sequence[tuple[str, Maintainer]]) -> None:
        if every_s <= 0:
            raise ValueError("the run's compaction needs an interval above 0 seconds")
        self.every_s = every_s
        self.rounds = 0
        self.files_removed = 0
        self.files_added = 0
        self._tables = list(tables)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-compaction", daemon=True)

    @property
    def locations(self) -> list[str]:
        """The tables each round compacts, in order."""
        return [uri for uri, _ in self._tables]

    def start(self) -> RunCompaction:
        log.info(
            "compacting the run's tables every %g s beside the stream "
            "(maintenance.compact_every_seconds, %s)",
            self.every_s,
            ", ".join(sorted({m.name for _, m in self._tables})),
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Start no new round; wait for the one in progress (one commit, or none)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.compact_once()

    def compact_once(self) -> None:
        """One round over every table there is; a table that fails is logged and skipped."""
        started = time.monotonic()
        for uri, maintainer in self._tables:
            if self._stop.is_set():
                return
            try:
                if not maintainer.exists(uri):
                    continue
                removed, _, added = with_retries(
                    f"the run's compaction of {uri}",
                    lambda _, m=maintainer, u=uri: m.compact(u),
                )
            except Exception as exc:  # the stream goes on; the next round tries again
                log.warning(
                    "the run's compaction of %s failed; the table is as it was, the stream goes "
                    "on, and the next round is in %g s: %s",
                    uri,
                    self.every_s,
                    first_line(exc),
                )
                continue
            self.files_removed += removed
            self.files_added += added
            if removed:
                log.info("compacted %s: %d files rewritten into %d", uri, removed, added)
        self.rounds += 1
        log.debug("compaction round %d took %.2f s", self.rounds, time.monotonic() - started)
