"""What the development servers (broker, Schema Registry, S3 API) share as child processes:
the loopback address they listen on, a free port there, and a tie to the parent's life."""

from __future__ import annotations

import abc
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

Server = TypeVar("Server", bound="ChildServer")

HOST = "127.0.0.1"


# The band below the kernel's ephemeral range (Linux's default when /proc cannot say; macOS's
# 49152-65535 lies above it too). A port the kernel hands out for an outgoing connection or a
# ``bind(0)`` (Spark's Python workers connect back to one) is never in it, so a server stopped
# here, or an address the tests keep dead, is not taken over meanwhile: the clients that go
# on knocking on it (a killed broker's, an unreachable address's) reach nobody else's socket.
_BAND_LOW = 10_000
_LINUX_EPHEMERAL_LOW = 32_768
# One slice of the band per pytest-xdist worker, so two workers never pick the same port.
_SLICES = 16
# The ports this process handed out, newest last: not handed out again while newer ones are
# free (a long test session hands out more than a slice holds, so the oldest come back).
_handed_out: dict[int, None] = {}


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LINUX_EPHEMERAL_LOW
    return low if low > _BAND_LOW + _SLICES * 100 else _LINUX_EPHEMERAL_LOW


def port_band() -> range:
    """The ports :func:`free_ports` picks from in this process: a slice of the band below the
    ephemeral range, the slice of its pytest-xdist worker (``gwN``) when it is one."""
    high = _ephemeral_low()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return range(_BAND_LOW, high)
    width = (high - _BAND_LOW) // _SLICES
    start = _BAND_LOW + (int(worker[2:]) % _SLICES) * width
    return range(start, start + width)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` different ports on :data:`HOST` that are free now, outside the kernel's
    ephemeral range (see :func:`port_band`), none handed out before by this process while the
    band has others (then the ones handed out longest ago). Each socket is held until all are
    bound."""
    band = port_band()
    fresh = [port for port in band if port not in _handed_out]
    random.shuffle(fresh)
    # Then the ones handed out longest ago, oldest first.
    candidates = fresh + [port for port in _handed_out if port in band]
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            sock = socket.socket()
            try:
                sock.bind((HOST, port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        if len(sockets) < count:
            raise RuntimeError(
                f"fewer than {count} free ports left in {band.start}-{band.stop - 1}"
            )
        ports = [int(sock.getsockname()[1]) for sock in sockets]
        for port in ports:
            _handed_out.pop(port, None)
            _handed_out[port] = None
        return ports
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
