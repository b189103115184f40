"""What the development servers (broker, Schema Registry, S3 API) share as child processes:
the loopback address they listen on, a free port there, and a tie to the parent's life."""

from __future__ import annotations

import signal
import socket
import sys

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when its parent dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
