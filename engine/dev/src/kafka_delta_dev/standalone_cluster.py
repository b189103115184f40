"""A real Spark standalone cluster on 127.0.0.1, from the installed pyspark's own jars: one
master and N workers, for runs and tests that must leave the single JVM of ``local[N]``
(executors in JVMs of their own, which can die while the driver goes on).

pyspark's pip package carries Spark's whole ``jars/`` folder and ``bin/spark-class``, so the
cluster needs nothing beyond ``pip install pyspark`` and Java: the master is
``org.apache.spark.deploy.master.Master``, each worker ``org.apache.spark.deploy.worker.Worker``,
each started by ``spark-class`` (which ``exec``s the JVM: the pid we hold is the JVM's) with
``--host 127.0.0.1`` and ``SPARK_LOCAL_IP=127.0.0.1``, so nothing listens beyond loopback. Every
worker has its own work folder under the cluster's folder, where it starts its executors: an
executor's working directory is ``<work>/<app id>/<executor id>``, which is how
:meth:`StandaloneCluster.executor_pids` finds the executors of one worker (to SIGKILL them
mid-task) without confusing them with another cluster's.

The daemons run with an environment cleared of ``PYTHONPATH`` and the ``PYSPARK_*`` variables of
whoever starts them, as daemons on other machines would: executors inherit their worker's
environment, so the Python they run and what it imports is only what the application ships
(``--py-files``, ``spark.archives``) and names (``spark.pyspark.python``).

    cluster = StandaloneCluster(tmp_path / "cluster", workers=2).start()
    cluster.master_url          # spark://127.0.0.1:<port>, for spark-submit --master
    cluster.executor_pids(0)    # the executor JVMs worker 0 runs now
    cluster.kill_worker(1); cluster.start_worker(1)
    cluster.stop()              # every daemon by its pid, then any executor left

    python -m kafka_delta_dev.standalone_cluster start --state .cluster.json [--workers 2]
    python -m kafka_delta_dev.standalone_cluster address --state .cluster.json
    python -m kafka_delta_dev.standalone_cluster stop --state .cluster.json

In a test session the daemons are tied to the test process (``die_with_parent``): a session
killed hard leaves no cluster behind; a worker SIGTERMed stops its executors itself, and an
executor whose worker dies exits on its own (Spark's ``WorkerWatcher``). ``start`` of the CLI
detaches them instead, for a cluster that outlives the command (``scripts/spark_cluster.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kafka_delta_dev.children import HOST, die_with_parent, free_port

READY_TIMEOUT_S = 120.0
# An executor's log lines (Spark's Executor class, at INFO: its default) of a task's start and end.
_RUNNING = re.compile(r"Executor: Running task \S+ in stage \S+ \(TID (\d+)\)")
_FINISHED = re.compile(r"Executor: Finished task \S+ in stage \S+ \(TID (\d+)\)")
# Variables of the starting process that must not reach the executors (see the docstring).
_NOT_INHERITED = (
    "PYTHONPATH",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
    "PYSPARK_GATEWAY_PORT",
    "PYSPARK_GATEWAY_SECRET",
    "SPARK_HOME",
    "SPARK_CONF_DIR",
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "MASTER",
    "SPARK_MASTER",
)


class ClusterError(RuntimeError):
    pass


def spark_home() -> Path:
    """The installed pyspark's folder: its ``jars/`` and ``bin/spark-class`` are Spark's own."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ClusterError("a standalone cluster needs pyspark installed (pip install pyspark)")
    home = Path(next(iter(spec.submodule_search_locations)))
    if not (home / "bin" / "spark-class").is_file():
        raise ClusterError(f"{home} has no bin/spark-class: not a pip-installed pyspark")
    return home


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our child, exited, not yet reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def stop_pid(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM ``pid``, SIGKILL it after ``timeout_s``; returns once it is gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            deadline = float("inf")
        time.sleep(0.05)
        try:  # reap it when it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, on free
    loopback ports, their work and logs under ``folder``."""

    def __init__(
        self,
        folder: Path,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        *,
        detached: bool = False,
    ) -> None:
        self.folder = Path(folder).resolve()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.detached = detached
        self.port = free_port()
        self.ui_port = free_port()
        self.master_pid: int | None = None
        self.worker_pids: list[int | None] = [None] * workers
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ui_port}"

    def work_dir(self, worker: int) -> Path:
        return self.folder / f"worker-{worker}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=HOST,
            SPARK_LOG_DIR=str(self.folder / "logs"),
            SPARK_NO_DAEMONIZE="1",
            # No REST submission server: nothing listens but the master's RPC port and UI.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )
        return env

    def _spawn(self, name: str, args: list[str]) -> int:
        logs = self.folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.folder,
                start_new_session=True,
                preexec_fn=None if self.detached else die_with_parent,
            )
        self._processes[process.pid] = process
        return process.pid

    def start(self) -> StandaloneCluster:
        """Start the master, then every worker; returns once the master lists them all
        alive (a listening port is not enough: a worker must have registered)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.master_pid = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
        )
        try:
            # A worker that finds no master retries its registration only after several
            # seconds: the master first, answering, then the workers.
            self.wait_for_workers(0)
            for worker in range(self.workers):
                self.start_worker(worker, wait=False)
            self.wait_for_workers(self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, worker: int, wait: bool = True) -> int:
        """Start worker ``worker`` (again, after :meth:`kill_worker`): the same work folder,
        a new pid; ``wait``: until the master lists every worker alive again."""
        work = self.work_dir(worker)
        work.mkdir(parents=True, exist_ok=True)
        pid = self._spawn(
            f"worker-{worker}",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                HOST,
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                "--webui-port",
                str(free_port()),
                self.master_url,
            ],
        )
        self.worker_pids[worker] = pid
        if wait:
            self.wait_for_workers(self.workers)
        return pid

    def state(self) -> dict[str, Any]:
        """The master's own view (its UI's JSON): ``workers``, ``activeapps``,
        ``completedapps``."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
            return dict(json.load(answer))

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def wait_for_workers(self, count: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.master_pid is None or not _pid_alive(self.master_pid):
                raise ClusterError(f"the master exited: see {self.folder / 'logs' / 'master.log'}")
            try:
                if self.alive_workers() >= count:
                    return
            except (OSError, ValueError) as exc:  # not listening yet, or an empty answer
                last = exc
            time.sleep(0.25)
        raise ClusterError(
            f"the master did not list {count} alive workers within {timeout_s:.0f}s "
            f"({last or 'workers missing'}): see {self.folder / 'logs'}"
        )

    def applications(self) -> list[dict[str, Any]]:
        """Every application the master has seen, running or finished."""
        state = self.state()
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def executor_pids(self, worker: int | None = None) -> list[int]:
        """The executor JVMs running now (of worker ``worker``, or of every worker): the
        processes whose working directory is an executor folder under a worker's work folder."""
        chosen = [worker] if worker is not None else range(self.workers)
        roots = [self.work_dir(w) for w in chosen]
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = Path(os.readlink(entry / "cwd"))
            except OSError:
                continue
            if not any(cwd.is_relative_to(root) and cwd != root for root in roots):
                continue
            if any("CoarseGrainedExecutorBackend" in part for part in _cmdline(int(entry.name))):
                found.append(int(entry.name))
        return sorted(found)

    def running_tasks(self, worker: int | None = None) -> dict[int, set[int]]:
        """The tasks each live executor (by pid) runs now, by task id: the ``Running task ...
        (TID n)`` lines of its log (its ``stderr`` in its working folder) that no ``Finished
        task ... (TID n)`` line has closed. A kill while this is non-empty is a kill mid-task."""
        running: dict[int, set[int]] = {}
        for pid in self.executor_pids(worker):
            try:
                log = (Path(os.readlink(f"/proc/{pid}/cwd")) / "stderr").read_text(errors="replace")
            except OSError:
                continue
            started = set(map(int, _RUNNING.findall(log)))
            running[pid] = started - set(map(int, _FINISHED.findall(log)))
        return running

    def kill_executors(self, worker: int | None = None) -> list[int]:
        """SIGKILL the executors running now (of ``worker``, or all): returns their pids."""
        pids = self.executor_pids(worker)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def kill_worker(self, worker: int) -> None:
        """SIGKILL worker ``worker``'s JVM (its executors then exit on their own, as they do
        when their machine's worker dies) and wait until it is gone."""
        pid = self.worker_pids[worker]
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap(pid)
        self.worker_pids[worker] = None

    def _reap(self, pid: int, timeout_s: float = 20.0) -> None:
        process = self._processes.pop(pid, None)
        if process is not None:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + timeout_s
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        """Workers first (each stops its executors), then the master, each by its pid; then
        any executor still running in a work folder of ours."""
        for worker, pid in enumerate(self.worker_pids):
            if pid is not None:
                stop_pid(pid)
                self._reap(pid)
                self.worker_pids[worker] = None
        if self.master_pid is not None:
            stop_pid(self.master_pid)
            self._reap(self.master_pid)
            self.master_pid = None
        deadline = time.monotonic() + 20
        while self.executor_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self.executor_pids():
            stop_pid(pid, timeout_s=5)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the command line: scripts/spark_cluster.sh ----------------------------------------------


def _read_state(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    return dict(json.loads(path.read_text()))


def _is_daemon(pid: int) -> bool:
    """Whether ``pid`` is still a Spark master or worker JVM (a pid is reused once it exits)."""
    return _pid_alive(pid) and any(
        part.startswith("org.apache.spark.deploy.") for part in _cmdline(pid)
    )


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description="Start or stop a Spark standalone cluster (a master and workers) on 127.0.0.1.",
    )
    parser.add_argument("action", choices=["start", "stop", "address"])
    parser.add_argument("--state", type=Path, default=Path(".cluster.json"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores of each worker")
    parser.add_argument("--memory", default="1g", help="memory of each worker (default 1g)")
    parser.add_argument(
        "--folder", type=Path, default=None, help="work folders and logs (default: data/cluster)"
    )
    args = parser.parse_args(argv)
    state = _read_state(args.state)
    running = state is not None and _is_daemon(int(state["master_pid"]))
    if args.action == "address":
        if not running:
            print(
                f"error: no standalone cluster runs from {args.state}: run "
                "scripts/spark_cluster.sh start, or pass --master",
                file=sys.stderr,
            )
            return 1
        assert state is not None
        print(state["master_url"])
        return 0
    if args.action == "start":
        if running:
            assert state is not None
            print(
                f"error: a cluster already runs at {state['master_url']} ({args.state}); "
                "stop it first",
                file=sys.stderr,
            )
            return 1
        folder = args.folder or Path("data") / "cluster"
        cluster = StandaloneCluster(
            folder, args.workers, args.cores, args.memory, detached=True
        ).start()
        args.state.write_text(
            json.dumps(
                {
                    "master_url": cluster.master_url,
                    "ui_url": cluster.ui_url,
                    "master_pid": cluster.master_pid,
                    "worker_pids": cluster.worker_pids,
                    "folder": str(cluster.folder),
                }
            )
        )
        print(cluster.master_url)
        print(f"master UI: {cluster.ui_url} (logs: {cluster.folder / 'logs'})", file=sys.stderr)
        return 0
    if state is None:
        print(f"no cluster state at {args.state}; nothing to stop", file=sys.stderr)
        return 0
    for pid in [*state.get("worker_pids", []), state["master_pid"]]:
        if pid is not None and _is_daemon(int(pid)):
            stop_pid(int(pid))
    args.state.unlink()
    return 0


def run() -> None:
    """Entry point of ``python -m``: leaves with the command's exit status."""
    from kafka_delta.runtime.process_exit import run_and_exit

    run_and_exit(_cli)


if __name__ == "__main__":
    run()
