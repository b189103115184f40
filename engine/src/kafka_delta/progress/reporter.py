"""The report of a committed batch, off the batch's critical path.

Once a batch's Delta commit has landed, what is left of it is reporting: the count of records
it read (Spark delivers it through its listener bus, a moment after the job), the lag (a Kafka
request for the partitions' latest offsets), the hand-off to the commit-back hook, the progress
line and the listeners (metrics, the progress file). None of it decides anything the next
batch needs, and on a low-latency trigger every millisecond of it delayed the next batch, so a
classic run hands it to one thread that reports the batches in order while the next batch
runs; the run waits for it before it ends (:meth:`BatchReporter.close`), so its summary, the
group's offsets and the last progress line are complete when ``run()`` returns.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_DONE = object()


class BatchReporter:
    """Runs each submitted report in a thread of its own, in the order submitted; a report
    that fails is logged and never stops the ones after it.

    >>> reporter = BatchReporter()
    >>> reporter.submit(lambda: None)
    >>> reporter.close()
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="batch-reporter", daemon=True)
        self._thread.start()

    def submit(self, report: Callable[[], None]) -> None:
        self._queue.put(report)

    def flush(self) -> None:
        """Wait until every report submitted so far has run (the benchmark's timed pipeline
        reads each batch's progress line right after the batch: scripts/benchlib/spark_run.py)."""
        self._queue.join()

    def close(self) -> None:
        """Run what is submitted, then stop the thread."""
        self._queue.put(_DONE)
        self._thread.join()

    def _run(self) -> None:
        while True:
            report = self._queue.get()
            try:
                if report is _DONE:
                    return
                report()  # type: ignore[operator]
            except Exception:  # reporting must never fail a committed batch, or the next
                log.exception("reporting a committed batch failed")
            finally:
                self._queue.task_done()
