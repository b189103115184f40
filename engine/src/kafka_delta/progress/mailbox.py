"""Each batch's report, from the batch function's process to the process that started the run,
under Spark Connect.

Why it exists: on a classic session ``foreachBatch`` calls the batch function in the driver's
own Python process, which then commits the group's offsets, logs the progress line and calls the
listeners. Under Spark Connect (Databricks serverless, standard access, a ``sc://`` server) the
function is pickled and called in a Python process the *server* starts: what it counts stays
there. So that process posts one small JSON file per committed batch, and the run's own process
takes them while it waits for the query (every 0.5 s) and does what it does on a classic session
(:meth:`kafka_delta.progress.run_progress.RunProgress._deliver`): the commit-back hook (I4), the
run's figures, the progress line, the listeners. Nothing here is read for recovery: the table is
the truth.

Where: under the checkpoint location, ``<checkpoint>/_kafka_delta/batches/<run id>/``, the one
place both processes reach by definition (Spark writes it; a Unity Catalog volume on Databricks,
which the driver's Python reaches as files). Spark ignores folders of the checkpoint it does not
know. A file is written under a temporary name and renamed, taken, then deleted.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from kafka_delta.offsets.model import Offsets
from kafka_delta.progress.batch import BatchProgress

log = logging.getLogger(__name__)

FOLDER = "_kafka_delta/batches"


@dataclass(frozen=True)
class BatchReport:
    """A committed batch as the batch function reports it: its figures, and the offsets the
    consumer group is to hold (the least of the tables' that read a partition)."""

    progress: BatchProgress
    group: Offsets

    def to_json(self) -> str:
        return json.dumps(
            {"progress": self.progress.to_json(), "group": self.group}, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> BatchReport:
        data = json.loads(text)
        group = {
            t: {int(p): int(o) for p, o in parts.items()} for t, parts in data["group"].items()
        }
        return cls(BatchProgress.from_json(data["progress"]), group)


class BatchMailbox:
    """The reports of one run (``run_id``) of the pipeline whose checkpoint is ``location``."""

    def __init__(self, location: str, run_id: str) -> None:
        self.location = location.rstrip("/")
        self.run_id = run_id
        self._fs: pafs.FileSystem | None = None
        self._folder = ""

    def __getstate__(self) -> dict[str, object]:
        return {"location": self.location, "run_id": self.run_id}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["location"], state["run_id"])  # type: ignore[misc]

    def _open(self) -> tuple[pafs.FileSystem, str]:
        if self._fs is None:
            from kafka_delta.delta.side_folder import open_side

            # The checkpoint's location opened as the engine's other files by it are.
            self._fs, root = open_side(self.location)
            self._folder = f"{root.rstrip('/')}/{FOLDER}/{self.run_id}"
        return self._fs, self._folder

    def clear(self) -> None:
        """Remove what an earlier start of this run left (a query started again)."""
        fs, folder = self._open()
        try:
            fs.delete_dir(folder)
        except (FileNotFoundError, OSError):
            pass

    def post(self, report: BatchReport) -> None:
        fs, folder = self._open()
        fs.create_dir(folder, recursive=True)
        name = f"{folder}/{report.progress.batch_id:020d}.json"
        temporary = f"{folder}/.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(temporary) as out:
            out.write(report.to_json().encode("utf-8"))
        fs.move(temporary, name)

    def take(self) -> Iterator[BatchReport]:
        """The reports posted since the last take, oldest first; each deleted once read."""
        fs, folder = self._open()
        try:
            infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        except OSError as exc:
            log.warning("cannot list the batches' reports in %s: %s", folder, exc)
            return
        for info in sorted(
            (i for i in infos if i.base_name.endswith(".json")), key=lambda i: i.base_name
        ):
            try:
                with fs.open_input_stream(info.path) as stream:
                    report = BatchReport.from_json(stream.read().decode("utf-8"))
                fs.delete_file(info.path)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("skipping the batch report %s: %s", info.path, exc)
                continue
            yield report
