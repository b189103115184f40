"""Every batch's progress as one JSON line in a file (``progress.path``), for ``report``.

The file is appended to across runs (each line carries its run's id), one line per batch,
flushed as it is written: a run that is killed keeps the lines of its committed batches.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from kafka_delta.progress.batch import BatchProgress

if TYPE_CHECKING:
    from kafka_delta.kafka.commit_back import CommitBackStats

log = logging.getLogger(__name__)


class ProgressFileError(ValueError):
    """The progress file cannot be read or holds something other than progress lines."""


class JsonLinesProgress:
    """A :class:`~.progress.ProgressListener` appending each batch to ``path``.

    >>> writer = JsonLinesProgress(Path("data/progress/orders.jsonl"))  # doctest: +SKIP
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # Opened at start-up, so a path that cannot be written stops the run before any work.
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = path.open("a", encoding="utf-8")

    def on_batch(self, progress: BatchProgress) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(progress.to_json(), separators=(",", ":")) + "\n")
        self._file.flush()

    def on_run_end(self, commit_back: CommitBackStats | None) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_progress(path: Path) -> list[BatchProgress]:
    """The batches recorded in ``path``, in the order they were written. A line cut short by a
    killed run (the last one) is skipped; anything else that is not a progress line is an
    error naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProgressFileError(
            f"no progress file at {path}: run the pipeline first (progress.path in the config "
            "says where it writes one line per micro-batch)"
        ) from None
    except OSError as exc:
        raise ProgressFileError(f"cannot read progress file {path}: {exc.strerror}") from None
    lines = text.splitlines()
    batches: list[BatchProgress] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            batches.append(BatchProgress.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if number == len(lines) and not text.endswith("\n"):
                log.warning("%s:%d: skipping a line cut short (%s)", path, number, exc)
                continue
            raise ProgressFileError(
                f"{path}:{number} is not a progress line of this pipeline ({exc})"
            ) from None
    return batches
