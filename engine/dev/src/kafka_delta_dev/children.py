"""What the development servers (broker, Schema Registry, S3 API) share as child processes:
the loopback address they listen on, a free port there, and a tie to the parent's life."""

from __future__ import annotations

import abc
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any, TypeVar

Server = TypeVar("Server", bound="ChildServer")

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` different free ports: each socket is held until all are bound (one
    :func:`free_port` after another may hand the same port out twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when its parent dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def wait_for_http(
    url: str,
    process: subprocess.Popen[Any] | None,
    error: type[Exception],
    name: str,
    timeout_s: float,
    interval_s: float = 0.05,
) -> None:
    """Until ``url`` answers 200; ``error`` naming ``name`` when ``process`` exits first or the
    time is up (a listening socket is not enough: the server must answer)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise error(f"{name} exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError) as exc:
            last = exc
        time.sleep(interval_s)
    raise error(f"{name} at {url} did not answer within {timeout_s:.0f}s: {last}")


class ChildServer(abc.ABC):
    """A server in a child process of ours: ``start()`` (each server's own) sets ``process``;
    ``stop()`` ends it by its pid (politely first, unless ``polite_stop`` is False); ``with``
    starts and stops it."""

    process: subprocess.Popen[Any] | None = None
    # False for a server with nothing to save at exit: ``stop()`` kills it at once.
    polite_stop: bool = True

    @abc.abstractmethod
    def start(self: Server) -> Server:
        """Start the server's program and wait until it serves."""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None and not self.polite_stop:
            self.process.kill()
            self.process.wait()
        elif self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self: Server) -> Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
