"""The development servers' ports: never the kernel's to hand out.

A port from the ephemeral range can be given, while a test keeps it dead or a broker is down,
to any ``bind(0)`` on the machine, such as the socket a Spark Python worker connects back to;
a Kafka client still knocking on the old address then reaches it and Spark fails the query
with "Python worker failed to connect back" (``Authentication failed``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kafka_delta_dev import children


def _ephemeral_range() -> tuple[int, int]:
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not path.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range: not Linux")
    low, high = (int(part) for part in path.read_text().split())
    return low, high


def test_free_ports_lie_below_the_kernels_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low, _ = _ephemeral_range()
    ports = children.free_ports(40) + [children.free_port() for _ in range(40)]
    assert all(port < low for port in ports), sorted(ports)
    assert len(set(ports)) == len(ports)
    for port in ports:  # free when handed out: a server can bind it
        with socket.socket() as sock:
            sock.bind((children.HOST, port))


def test_a_port_the_kernel_hands_out_is_never_one_of_ours() -> None:
    _ephemeral_range()
    ours = set(children.free_ports(20))
    kernel: list[socket.socket] = []
    try:
        for _ in range(200):
            sock = socket.socket()
            sock.bind((children.HOST, 0))
            kernel.append(sock)
        assert not ours & {sock.getsockname()[1] for sock in kernel}
    finally:
        for sock in kernel:
            sock.close()


def test_each_pytest_xdist_worker_picks_from_a_slice_of_its_own(monkeypatch) -> None:
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(set(children.port_band()))
    assert all(slices)
    assert not slices[0] & slices[1] and not slices[1] & slices[2] and not slices[0] & slices[2]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert set(children.free_ports(5)) <= slices[1]


def test_a_band_handed_out_whole_gives_back_the_ports_handed_out_longest_ago(monkeypatch) -> None:
    # A long test session hands out more ports than its slice holds: it never runs out.
    band = range(21_000, 21_008)
    monkeypatch.setattr(children, "port_band", lambda: band)
    monkeypatch.setattr(children, "_handed_out", {})
    free = [port for port in band if _bindable(port)]
    if len(free) < 4:
        pytest.skip(f"fewer than 4 of the ports {band.start}-{band.stop - 1} are free here")
    first = children.free_ports(len(free))
    assert sorted(first) == free
    again = children.free_ports(2)
    assert again == first[:2]  # the oldest first


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((children.HOST, port))
        except OSError:
            return False
        return True
