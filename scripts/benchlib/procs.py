"""Each measurement runs in its own process tree: ``bench.py _worker <spec.json>`` runs one
worker function (:data:`WORKERS`) and writes its result as JSON; the orchestrator starts it,
samples the tree's memory, and kills whatever of the tree outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .fresh_worker import work_fresh_idiom, work_fresh_pipeline
from .handwritten import work_stream
from .limits import work_consume, work_simple, work_simple_avro, work_write
from .memory import TreeSampler
from .spark_run import work_ceiling, work_pipeline, work_session

ENTRY = Path(__file__).resolve().parents[1] / "bench.py"

WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "consume": work_consume,
    "write": work_write,
    "simple": work_simple,
    "simple_avro": work_simple_avro,
    "pipeline": work_pipeline,
    "ceiling": work_ceiling,
    "session": work_session,
    "stream": work_stream,
    "fresh_pipeline": work_fresh_pipeline,
    "fresh_idiom": work_fresh_idiom,
}


class WorkerError(RuntimeError):
    pass


def worker_main(spec_path: str) -> int:
    """The worker process's side: run the spec's worker, write its result."""
    spec = json.loads(Path(spec_path).read_text())
    result = WORKERS[spec["kind"]](spec)
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


def run_worker(
    kind: str, spec: dict[str, Any], out: Path, name: str, env: dict[str, str], timeout_s: float
) -> tuple[dict[str, Any], float, TreeSampler]:
    """Run one worker process tree, sampling its memory; returns (result, start time, sampler).
    Its output goes to ``out/logs/<name>.log`` (start-up phases are parsed from there)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "kind": kind, "result": str(logs / f"{name}.result.json")}
    spec_path = logs / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    Path(spec["result"]).unlink(missing_ok=True)
    with open(logs / f"{name}.log", "wb") as log:
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, str(ENTRY), "_worker", str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=out,
            start_new_session=True,
        )
        sampler = TreeSampler(proc.pid)
        sampler.start()
        code: int | None = None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            sampler.stop()
            # A timeout or Ctrl-C: take down the whole worker tree (JVM, Python workers);
            # after a normal exit, whatever of that session outlived the worker.
            _kill_group(proc, signal.SIGKILL if code is None else signal.SIGTERM)
    if code != 0:
        tail = (logs / f"{name}.log").read_text(errors="replace").splitlines()[-25:]
        why = "timed out" if code is None else f"exited with {code}"
        raise WorkerError(f"{name} {why}; last lines of {logs / name}.log:\n" + "\n".join(tail))
    return json.loads(Path(spec["result"]).read_text()), started, sampler


def _kill_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the worker's own session (start_new_session=True made it the group leader)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
