"""A clean stop: SIGTERM or Ctrl-C finishes the micro-batch in progress (its Delta commit, then
the commit-back), stops the query between batches, and the run exits 0.

Why it takes more than ``query.stop()`` in a signal handler. ``StreamingQuery.stop()`` cancels
the running Spark jobs and interrupts the stream execution thread: a batch caught mid-way fails
(``SPARK_JOB_CANCELLED``) inside foreachBatch, and Spark 4.2 then overflows its stack matching
that failure's huge message against a regex (a ~1,100-line ``StackOverflowError``). Called while
the batch function runs but has no job left, it still interrupts Spark's own bookkeeping after
it: the batch is not recorded in the checkpoint's commit log and the next run replays it. So
:class:`StopGate` calls ``stop()`` only once no batch is in the batch function and the last batch
it finished is recorded by Spark (reported in ``lastProgress``, which Spark updates right after
writing its commit log). The stream thread is then waiting for its next trigger or planning the
next batch, and interrupting either is clean: a planned batch runs on the next start (Spark's
offset-log entries are written to a temporary file and renamed, so an interrupted one is whole or
absent; the warning Hadoop logs when it is interrupted is filtered in conf/log4j2.properties).
A batch that enters the batch function first is the batch in progress: it runs to its end, and
the stop follows it.

Signals reach more than the driver. Ctrl-C goes to the terminal's whole foreground process
group, ``docker stop``/systemd/Kubernetes send SIGTERM to the process they started (systemd's
default ``KillMode=control-group`` to every process of the unit), and under ``spark-submit`` the
process started is Spark's JVM, with the Python driver as its child. A JVM that gets SIGTERM or
SIGINT runs its shutdown hooks, which stop the SparkContext under the running batch (exit 143,
"Python worker exited unexpectedly"). :class:`StopSignals` therefore also replaces the JVM's
handlers with one that forwards the signal to the driver. The JVM's other Python children
keep running on their own: pyspark's worker daemon puts itself and its workers in a process
group of their own, and the embedded source's planner ignores the signals (see
``embedded/source.py``). The JVM and its children stop when the driver exits.

A second signal stops at once (exit 128 + signal number). That is safe: the batch in progress
is either committed to Delta or not; Spark's checkpoint does not record it as done, so the next
run replays it, and its Delta txn ``(appId, batchId)`` makes the replay write nothing twice
(invariants I1 and I2).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, ClassVar

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


STOP_IN_PROGRESS = "the query is stopping; this batch runs on the next start"


class StopInProgress(RuntimeError):
    """A batch began after the query was told to stop; it writes nothing and replays later."""


class StopGate:
    """Decides, between the main thread and the batch function, when the query is stopped.

    The batch function calls :meth:`enter` first and :meth:`leave` last; the main thread
    calls :meth:`stop_when_safe` while it waits for the query, often once a stop is requested.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requested = threading.Event()
        self._in_batch = False
        self._finished: int | None = None
        self._stopping = False

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def request(self) -> None:
        """Ask for a stop after the current micro-batch (safe from a signal handler)."""
        self._requested.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` between two queries; True as soon as a stop is requested."""
        return self._requested.wait(seconds)

    def enter(self) -> None:
        with self._lock:
            if self._stopping:
                # Spark finished planning this batch in the millisecond between the decision
                # to stop and stop() taking effect. Raising before any work leaves it unwritten
                # and unrecorded: the next run plans it again (see Pipeline.run).
                raise StopInProgress(STOP_IN_PROGRESS)
            self._in_batch = True

    def leave(self, batch_id: int, *, succeeded: bool) -> None:
        with self._lock:
            self._in_batch = False
            if succeeded:
                self._finished = batch_id

    def stop_when_safe(self, query: Any) -> bool:
        """Stop the query if no batch is in the batch function and Spark has recorded the last
        one that finished; True once the query is stopping."""
        with self._lock:
            if self._stopping:
                return True
            if self._in_batch:
                return False
            if self._finished is not None:
                progress = query.lastProgress
                if progress is None or progress["batchId"] < self._finished:
                    return False  # Spark is still writing its commit log
            self._stopping = True
        if self._finished is None:
            log.info("no micro-batch committed by this run; stopping the query")
        else:
            log.info("stopping the query after batch %d", self._finished)
        try:
            query.stop()
        except Exception as exc:  # the run's own failure, if any, surfaces in awaitTermination
            log.warning("stopping the query failed: %s", exc)
        return True

    @staticmethod
    def stopped_by_gate(exc: BaseException) -> bool:
        """True when the query's failure is only :class:`StopInProgress` (a batch refused)."""
        return STOP_IN_PROGRESS in str(exc)


class StopSignals:
    """SIGTERM/SIGINT handlers of the driver, and of Spark's JVM (see the module docstring).

    The first signal calls ``on_stop``. A signal delivered to both the driver and the JVM (a
    process-group signal, Ctrl-C) counts once; a second one from the same place exits at once.
    """

    def __init__(self, on_stop: Callable[[], None]) -> None:
        self._on_stop = on_stop
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}
        self._jvm_forwarder: Any = None
        self._previous: dict[int, Any] = {}
        self._previous_jvm: list[tuple[Any, Any, Any]] = []

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.restore()

    def install(self) -> None:
        """Handle SIGTERM and SIGINT in this (the main) thread; call again after the
        SparkContext is created, which installs a SIGINT handler of its own that cancels
        every running job. Only the main thread may set handlers; elsewhere (a host process
        that calls ``main()`` from a thread of its own) the host's handling stays."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            previous = signal.signal(signum, self._driver_handler)
            if previous is not self._driver_handler:
                self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """Put back the handlers found (tests call ``main()`` inside their own process)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        for jvm, jsignal, previous in self._previous_jvm:
            try:
                jvm.sun.misc.Signal.handle(jsignal, previous)
            except Exception:  # the JVM is gone already
                pass
        self._previous_jvm.clear()

    def forward_from_jvm(self, spark: Any) -> bool:
        """Make Spark's JVM forward SIGTERM and SIGINT here instead of shutting down. False
        where there is no JVM to reach (Spark Connect) or it is the Databricks runtime's."""
        if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
            return False  # the runtime owns its JVM and stops jobs its own way
        try:
            from pyspark.java_gateway import ensure_callback_server_started

            context = spark.sparkContext
            gateway = context._gateway
            jvm = context._jvm
        except Exception:  # Spark Connect: no SparkContext, no JVM in this process
            return False
        # The JVM calls the handler on a thread of its own, which reaches Python through
        # py4j's callback server (the one foreachBatch uses).
        ensure_callback_server_started(gateway)
        self._jvm_forwarder = _JvmSignalForwarder(self._jvm_handler)
        for signum in STOP_SIGNALS:
            name = signal.Signals(signum).name.removeprefix("SIG")
            try:
                jsignal = jvm.sun.misc.Signal(name)
                previous = jvm.sun.misc.Signal.handle(jsignal, self._jvm_forwarder)
                self._previous_jvm.append((jvm, jsignal, previous))
            except Exception as exc:  # e.g. a JVM started with -Xrs
                log.debug("cannot forward SIG%s from the JVM: %s", name, exc)
        return True

    def _driver_handler(self, signum: int, _frame: object) -> None:
        self._received(signum, "driver")

    def _jvm_handler(self, signum: int) -> None:
        self._received(signum, "jvm")

    def _received(self, signum: int, where: str) -> None:
        with self._lock:
            self._seen[where] = self._seen.get(where, 0) + 1
            first = sum(self._seen.values()) == 1
            again = self._seen[where] > 1
        name = signal.Signals(signum).name
        if again:
            log.warning(
                "%s again: stopping now. The batch in progress is not recorded as done in the "
                "checkpoint, so the next run replays it; its Delta txn makes the replay write "
                "nothing twice",
                name,
            )
            _exit_now(128 + signum)
        if first:
            log.info(
                "%s: stopping after the current micro-batch (send it again to stop at once)", name
            )
            self._on_stop()


class _JvmSignalForwarder:
    """A ``sun.misc.SignalHandler`` implemented in Python (py4j callback)."""

    def __init__(self, callback: Callable[[int], None]) -> None:
        self._callback = callback

    def handle(self, sig: Any) -> None:
        self._callback(int(sig.getNumber()))

    class Java:
        implements: ClassVar[list[str]] = ["sun.misc.SignalHandler"]


def _exit_now(status: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # No interpreter teardown and no Spark shutdown: stopping now is the point. The JVM
    # follows: under spark-submit it exits with the driver's status; as the driver's child
    # it exits when the driver's end of its stdin closes.
    os._exit(status)


# The module Spark's JVM runs (python -m) to host a streaming reader for the whole query.
_PLANNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


def in_spark_planner() -> bool:
    """This process is the one Spark's JVM starts to plan a Python source's micro-batches."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == _PLANNER_MODULE


def ignore_stop_signals_in_spark_helper() -> None:
    """In a Python process Spark's JVM starts for the driver (the streaming source's
    planner): ignore SIGTERM and SIGINT, which a process-group signal delivers there too. The
    driver decides when to stop; the JVM ends this process when the query stops.

    When it does, it closes the planner's socket: pyspark's runner, blocked reading its next
    call, gets EOFError, and flushing its reply then raises BrokenPipeError, which
    reaches the interpreter's top level and prints a traceback, or half of one when the JVM
    kills the process mid-print. That is this process's normal end, so it ends quietly; any
    other failure still prints in full."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    sys.excepthook = quiet_when_spark_closes_the_socket(sys.excepthook)


_SOCKET_CLOSED = (EOFError, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def quiet_when_spark_closes_the_socket(hook: Callable[..., Any]) -> Callable[..., Any]:
    """sys.excepthook that says nothing when the uncaught failure, and every failure it
    happened while handling, is the JVM's end of the socket going away; else hook."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        chain: BaseException | None = value
        while chain is not None:
            if not isinstance(chain, _SOCKET_CLOSED):
                hook(kind, value, tb)
                return
            chain = chain.__cause__ or chain.__context__
        # The JVM closed the socket: the query stopped and this planner is done.

    return excepthook
