"""The run lease: when a pid in a lease can be checked here, and how an operator gets past a
lease wrongly judged active. Real lease files, real processes, and `offsets reset` on a real
table over the real broker."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from kafka_delta.cli import main
from kafka_delta.commands.reset import _refuse_if_running
from kafka_delta.config import PipelineConfig
from kafka_delta.offsets.model import BatchCommit
from kafka_delta.recovery import lease as lease_module
from kafka_delta.recovery.lease import (
    STALE_AFTER_SECONDS,
    CheckpointInUseError,
    HostIdentity,
    Lease,
    RunLease,
    active_leases,
    is_active,
    read_leases,
)
from kafka_delta.sinks.delta_rs.sink import DeltaRsSink
from kafka_delta_dev.produce import produce_events

HERE = HostIdentity("box", "boot-1", "pid:[4026531836]")


def _gone_pid() -> int:
    """The pid of a process that has exited (on this host, in this PID namespace)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def _lease(pid: int, heartbeat_ms: int, **where: str | None) -> Lease:
    written = {"host": HERE.host, "boot_id": HERE.boot_id, "pid_namespace": HERE.pid_namespace}
    written.update(where)
    return Lease(
        run_id="r",
        pipeline_id="p",
        pid=pid,
        pid_start=None,
        checkpoint="/c",
        query_id=None,
        started_ms=heartbeat_ms,
        heartbeat_ms=heartbeat_ms,
        **written,  # type: ignore[arg-type]
    )


def test_a_lease_from_another_host_is_active_while_its_heartbeat_is_fresh() -> None:
    now = int(time.time() * 1000)
    lease = _lease(1, now, host="elsewhere")
    assert is_active(lease, now_ms=now + 1000, here=HERE)
    assert not is_active(lease, now_ms=now + int(STALE_AFTER_SECONDS * 1000) + 1, here=HERE)


def test_on_its_own_host_boot_and_pid_namespace_the_process_decides_not_the_heartbeat() -> None:
    now = int(time.time() * 1000)
    assert is_active(_lease(os.getpid(), 0), here=HERE)  # heartbeat ancient, process alive
    assert not is_active(_lease(_gone_pid(), now), now_ms=now, here=HERE)  # fresh, but gone


@pytest.mark.parametrize(
    "elsewhere",
    [
        # A container with host networking: the host's hostname, its own PID namespace.
        {"pid_namespace": "pid:[4026532179]"},
        # The same machine before a reboot: the pid names nothing any more, or another process.
        {"boot_id": "boot-0"},
        # Written where /proc does not tell (or by a version without these fields).
        {"boot_id": None, "pid_namespace": None},
    ],
    ids=["other-pid-namespace", "other-boot", "ids-unknown"],
)
def test_a_pid_from_another_boot_or_pid_namespace_is_not_checked_here_the_heartbeat_decides(
    elsewhere: dict[str, str | None],
) -> None:
    now = int(time.time() * 1000)
    # The run is alive in its own namespace; its pid means nothing here (no such process):
    # judged by the pid, a reset would go ahead under a live run.
    running = _lease(_gone_pid(), now, **elsewhere)
    assert is_active(running, now_ms=now + 1000, here=HERE)
    # Its heartbeat stops: stale after STALE_AFTER_SECONDS, as from another host.
    assert not is_active(running, now_ms=now + int(STALE_AFTER_SECONDS * 1000) + 1, here=HERE)


def test_without_proc_here_every_lease_is_judged_by_its_heartbeat() -> None:
    now = int(time.time() * 1000)
    blind = HostIdentity(HERE.host, None, None)
    lease = _lease(os.getpid(), now, boot_id=None, pid_namespace=None)
    assert is_active(lease, now_ms=now, here=blind)
    assert not is_active(lease, now_ms=now + int(STALE_AFTER_SECONDS * 1000) + 1, here=blind)


def test_a_run_records_hostname_boot_id_and_pid_namespace_and_is_active_from_this_host(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, "127.0.0.1:1", "t")
    with RunLease.hold(cfg):
        (lease,) = read_leases(cfg.delta.table, cfg.pipeline_id)
        assert lease.host == socket.gethostname()
        if Path("/proc/self/ns/pid").exists():  # Linux; elsewhere both are None
            assert lease.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            assert lease.pid_namespace == os.readlink("/proc/self/ns/pid")
        else:
            assert (lease.boot_id, lease.pid_namespace) == (None, None)
        assert lease.path is not None and Path(lease.path).is_file()
        assert "path" not in json.loads(Path(lease.path).read_text())
        assert is_active(lease)  # its pid where it can be checked, else its fresh heartbeat
    # A lease file of an older version (no ids) still reads; its heartbeat decides.
    old = tmp_path / "old.json"
    record = {k: v for k, v in json.loads(lease.to_json()).items() if k in _OLD_FIELDS}
    old.write_text(json.dumps(record))
    older = Lease.from_json(old.read_text(), path=str(old))
    assert (older.boot_id, older.pid_namespace) == (None, None)
    assert not HostIdentity.here().wrote(older)


_OLD_FIELDS = {
    "run_id",
    "pipeline_id",
    "host",
    "pid",
    "pid_start",
    "checkpoint",
    "query_id",
    "started_ms",
    "heartbeat_ms",
}


def _config(tmp_path: Path, bootstrap: str, topic: str) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "pipeline_id": "lease-pipeline",
            "kafka": {"bootstrap_servers": bootstrap, "topics": [topic], "consumer_group": "g"},
            "delta": {"table": str(tmp_path / "table")},
            "checkpoint": str(tmp_path / "checkpoint"),
        }
    )


def _plant_lease_of_a_run_in_a_container(cfg: PipelineConfig) -> Path:
    """The lease a run in a host-networking container left when it was killed a moment ago:
    this hostname and boot, another PID namespace, a fresh heartbeat. Judged active (rightly:
    from here nothing tells it is gone) until its heartbeat is STALE_AFTER_SECONDS old."""
    with RunLease.hold(cfg) as held:
        assert held is not None
        lease = replace(held.lease, pid=_gone_pid(), pid_namespace="pid:[1]", run_id="container")
    folder = Path(cfg.delta.table) / "_kafka_delta" / cfg.pipeline_id / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "container.json"
    path.write_text(lease.to_json())
    return path


@pytest.mark.broker
def test_reset_names_the_lease_file_to_delete_and_no_run_check_overrides_an_active_lease(
    kafka_bootstrap, new_topics, tmp_path: Path, capsys
) -> None:
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 20)
    cfg = _config(tmp_path, kafka_bootstrap, topic)
    end = {topic: {0: 20}}
    DeltaRsSink(cfg.delta.table, cfg.pipeline_id).commit_batch(
        pa.table({"id": pa.array(range(20), pa.int64())}),
        BatchCommit(cfg.pipeline_id, f"{cfg.pipeline_id}.q", 0, end).starting_at({}),
        start={},
    )
    path = _plant_lease_of_a_run_in_a_container(cfg)
    (active,) = active_leases(cfg.delta.table, cfg.pipeline_id)
    assert active.path == str(path)

    refused = _refuse_if_running(cfg, argparse.Namespace(no_run_check=False))
    assert refused is not None and "is running" in refused
    assert f"delete its lease file {path}" in refused and "--no-run-check" in refused
    # The operator knows that run is gone: --no-run-check goes past the lease.
    assert _refuse_if_running(cfg, argparse.Namespace(no_run_check=True)) is None

    conf = tmp_path / "conf" / "test.yaml"
    conf.parent.mkdir()
    conf.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    reset = ["offsets", "reset", "--config", str(conf), "--to-earliest", "--allow-rewind"]
    capsys.readouterr()
    assert main([*reset, "--dry-run"]) == 0
    assert f"delete its lease file {path}" in capsys.readouterr().out
    assert main([*reset, "--dry-run", "--no-run-check"]) == 0
    assert "is running" not in capsys.readouterr().out
    # Deleting the file, as the message says, ends the refusal too.
    path.unlink()
    assert _refuse_if_running(cfg, argparse.Namespace(no_run_check=False)) is None


# -- one checkpoint, one run --------------------------------------------------------------------


def _rival(cfg: PipelineConfig, started_ms: int) -> RunLease:
    lease = RunLease(cfg)
    lease.lease = replace(lease.lease, started_ms=started_ms)
    return lease


def test_two_runs_starting_at_once_on_one_checkpoint_agree_that_the_older_lease_goes_on(
    tmp_path: Path,
) -> None:
    cfg = PipelineConfig.model_validate(
        {
            "pipeline_id": "p",
            "checkpoint": str(tmp_path / "checkpoint"),
            "kafka": {
                "bootstrap_servers": "127.0.0.1:9",
                "topics": ["t"],
                "consumer_group": "g",
            },
            "delta": {"table": str(tmp_path / "table")},
        }
    )
    first, second = _rival(cfg, 1000), _rival(cfg, 2000)
    # Both leases are written before either looks at the other's.
    first._write()
    second._write()
    first.first_on_checkpoint()
    with pytest.raises(CheckpointInUseError, match="is in use by another run") as refused:
        second.first_on_checkpoint()
    assert first.lease.run_id in str(refused.value)  # the lease file to delete
    # Another checkpoint of the same pipeline is not held back.
    other = RunLease(cfg.with_overrides(checkpoint=str(tmp_path / "other")))
    other._write()
    other.first_on_checkpoint()
    for lease in (first, second, other):
        lease.release()


def test_a_run_slow_to_write_its_lease_after_another_went_on_is_refused(tmp_path: Path) -> None:
    """Found by the operations harness (two runs racing on one checkpoint, threads of one
    process): the slower run made its lease first but wrote it after the faster one had read the
    leases and gone on. Its key was the older, so it went on too: two runs on one checkpoint.
    The key is now taken once the lease is visible."""
    cfg = _config(tmp_path, "127.0.0.1:9", "t")
    slow = RunLease(cfg)  # made first...
    time.sleep(0.01)
    fast = RunLease(cfg).acquire()
    fast.first_on_checkpoint()  # ...but the other read the leases before it wrote: goes on
    slow.acquire()
    try:
        with pytest.raises(CheckpointInUseError, match="is in use by another run"):
            slow.first_on_checkpoint()
    finally:
        slow.release()
        fast.release()


def test_a_run_slow_to_write_its_lease_in_the_same_millisecond_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case above when both runs take their key within one tick of the clock the key is
    read from (milliseconds): seen once in a full suite on a fresh clone. Equal times fell to
    the run ids, random, so the slow run went on half the time. The clock here ticks never, and
    the slow run's id sorts first: it must still be refused."""
    monkeypatch.setattr(lease_module, "_now_ms", lambda: 1_700_000_000_000)
    cfg = _config(tmp_path, "127.0.0.1:9", "t")
    slow = RunLease(cfg)
    slow.lease = replace(slow.lease, run_id="a-slow")
    fast = RunLease(cfg)
    fast.lease = replace(fast.lease, run_id="z-fast")
    fast.acquire().first_on_checkpoint()  # read the leases before the slow run wrote: goes on
    slow.acquire()
    try:
        with pytest.raises(CheckpointInUseError, match="is in use by another run"):
            slow.first_on_checkpoint()
    finally:
        slow.release()
        fast.release()


_CHECKPOINT_HOLDER = """
import sys, time, yaml
sys.path.insert(0, {src!r})
from kafka_delta.config import PipelineConfig
from kafka_delta.recovery.lease import RunLease
cfg = PipelineConfig.model_validate(yaml.safe_load(open({conf!r})))
with RunLease.hold(cfg):
    print("held", flush=True)
    time.sleep(300)
"""


@pytest.mark.spark
@pytest.mark.broker
def test_a_second_live_run_on_one_checkpoint_is_refused_before_it_reads_or_renames_anything(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path, capsys
) -> None:
    """A run whose checkpoint another live process holds exits 2 in one sentence, before its
    recovery could set the checkpoint aside under the other run."""
    from kafka_delta.pipeline import Pipeline
    from support import PROJECT

    topics = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, topics, 20)
    cfg = make_config(topics)
    Pipeline(spark, cfg).run()
    produce_events(kafka_bootstrap, topics, 10, first_id=20)
    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    code = _CHECKPOINT_HOLDER.format(src=str(PROJECT / "src"), conf=str(conf))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        version = DeltaTable(cfg.delta.table).version()
        checkpoint = sorted(p.name for p in Path(cfg.checkpoint).rglob("*"))
        capsys.readouterr()
        assert main(["--config", str(conf)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: checkpoint {cfg.checkpoint} is in use by another run")
        assert f"pid {holder.pid}" in err and "Nothing was read or written" in err
        assert DeltaTable(cfg.delta.table).version() == version
        assert sorted(p.name for p in Path(cfg.checkpoint).rglob("*")) == checkpoint
        assert not list(Path(cfg.checkpoint).parent.glob("*.set-aside-*"))
    finally:
        holder.kill()
        holder.wait(30)
    Pipeline(spark, cfg).run()  # the holder is gone: its lease no longer counts
    ids = DeltaTable(cfg.delta.table).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == list(range(30))
