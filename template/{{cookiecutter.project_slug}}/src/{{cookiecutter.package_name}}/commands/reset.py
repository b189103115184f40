"""``offsets reset``: move the pipeline's stored offsets, as one audited Delta commit of the
pipeline with no data, then copy them to the consumer group.

The commit has the shape of a batch commit (:class:`..offsets.BatchCommit`): ``userMetadata``
with the new offsets (the partitions not reset carried forward) plus a ``reset`` record (who,
when, why, to what, from which offsets, which partitions move backwards), and the txn actions
a delta-rs batch writes: its own ``(appId, 0)``, the fence ``(<pipeline>:fence, stored seq + 1)``
and one offset txn per partition. It is committed with no retry on the snapshot the offsets
were read from, so a pipeline commit landing meanwhile makes the reset fail (nothing written),
and a pipeline batch planned before the reset fails fencing instead of overwriting it.

A checkpoint that planned batches before the reset would resume from its own positions: the
pipeline refuses to resume it (:meth:`..checkpoint.CheckpointLog.refuse_if_older_than`), and
this command says how to move it aside.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from ..checkpoint import CheckpointLog, local_path
from ..commit_back import OffsetCommitter
from ..config import PipelineConfig
from ..kafka_admin import KafkaAdmin
from ..offsets import BatchCommit, Offsets, StoredOffsets, app_id, format_ms, offsets_to_json
from ..run_lease import LeaseUnavailableError, active_leases
from .table_log import (
    CommandError,
    admin_for,
    format_rows,
    kafka_partitions,
    newest_commit,
    open_existing,
    stored_offsets,
)


def _offsets(items: Iterable[tuple[str, int, int | None]]) -> Offsets:
    result: Offsets = {}
    for topic, partition, offset in items:
        if offset is not None:
            result.setdefault(topic, {})[partition] = offset
    return result


@dataclass(frozen=True)
class Move:
    topic: str
    partition: int
    stored: int | None
    new: int

    @property
    def rewind(self) -> bool:
        return self.stored is not None and self.new < self.stored


@dataclass(frozen=True)
class Plan:
    to: str
    stored: StoredOffsets
    moves: list[Move]

    @property
    def target(self) -> Offsets:
        return _offsets((m.topic, m.partition, m.new) for m in self.moves)

    @property
    def changes(self) -> list[Move]:
        return [m for m in self.moves if m.new != m.stored]

    @property
    def rewinds(self) -> list[Move]:
        return [m for m in self.moves if m.rewind]


def parse_when(text: str, now_ms: int | None = None) -> int:
    """``--to-datetime``: ISO 8601 (no zone = UTC) or epoch ms; never in the future."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    if text.strip().isdigit():
        when = int(text)
    else:
        try:
            moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise CommandError(
                f"--to-datetime {text!r} is neither an ISO 8601 time (2025-01-31T08:00:00Z) "
                "nor epoch milliseconds"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        when = int(moment.timestamp() * 1000)
    if when > now_ms:
        raise CommandError(f"--to-datetime {text!r} is in the future: no offset is that recent")
    return when


def parse_offsets_spec(text: str) -> Offsets:
    """``orders:0=15,orders:1=20`` -> ``{"orders": {0: 15, 1: 20}}``."""
    result: Offsets = {}
    for item in (part.strip() for part in text.split(",")):
        where, eq, offset = item.partition("=")
        topic, colon, partition = where.rpartition(":")
        if not (eq and colon and topic and partition.isdigit() and offset.strip().isdigit()):
            raise CommandError(
                f"--to-offsets: {item!r} is not TOPIC:PARTITION=OFFSET (e.g. orders:0=15)"
            )
        if int(partition) in result.get(topic, {}):
            raise CommandError(f"--to-offsets names {topic}:{partition} twice")
        result.setdefault(topic, {})[int(partition)] = int(offset)
    return result


def _topics(config: PipelineConfig, args: argparse.Namespace, stored_topics: set[str]) -> list[str]:
    known = set(config.kafka.topics) | stored_topics
    if args.to_offsets is not None and args.topic:
        raise CommandError("--topic does not apply to --to-offsets: name each partition in it")
    wanted = (
        sorted(parse_offsets_spec(args.to_offsets))
        if args.to_offsets is not None
        else args.topic or list(config.kafka.topics)
    )
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise CommandError(
            f"unknown topic {', '.join(unknown)}: pipeline {config.pipeline_id!r} reads "
            f"{', '.join(sorted(known))}"
        )
    return sorted(set(wanted))


def plan_reset(
    config: PipelineConfig, args: argparse.Namespace, table: DeltaTable, admin: KafkaAdmin
) -> Plan:
    """What the reset would do; raises :class:`CommandError` on any bad input."""
    commit = newest_commit(table, config.pipeline_id)
    if commit is not None:
        stored = commit.stored()
    else:  # log cleaned up: the offsets live on in txn actions (or the table has none)
        stored, _ = stored_offsets(table, config, kafka_partitions(admin, config.kafka.topics)[0])
    topics = _topics(config, args, set(stored.offsets))
    partitions, missing = kafka_partitions(admin, topics)
    if missing:
        raise CommandError(
            f"topic {', '.join(missing)} does not exist on {admin.bootstrap_servers}"
        )
    marks = admin.watermarks(partitions)
    if args.to_earliest:
        to, target = "earliest", marks.earliest
    elif args.to_latest:
        to, target = "latest", marks.latest
    elif args.to_datetime is not None:
        from .kafka_time import offsets_for_time

        when = parse_when(args.to_datetime)
        to = f"datetime {format_ms(when)} ({when} ms)"
        target = offsets_for_time(config, admin, partitions, marks, when)
    else:
        to, target = "offsets", parse_offsets_spec(args.to_offsets)
        for t, parts in target.items():
            for p, offset in parts.items():
                if p not in partitions[t]:
                    raise CommandError(
                        f"partition {p} of topic {t} is out of range: it has partitions "
                        f"{partitions[t][0]}..{partitions[t][-1]}"
                    )
                lo, hi = marks.earliest[t][p], marks.latest[t][p]
                if not lo <= offset <= hi:
                    raise CommandError(
                        f"offset {offset} of {t}:{p} is outside what Kafka holds, "
                        f"[{lo}, {hi}] (earliest, latest)"
                    )
    moves = [
        Move(t, p, stored.offsets.get(t, {}).get(p), offset)
        for t, parts in sorted(target.items())
        for p, offset in sorted(parts.items())
    ]
    return Plan(to, stored, moves)


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no login name (some containers)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def commit_reset(
    table: DeltaTable, config: PipelineConfig, plan: Plan, reason: str, who: str | None = None
) -> BatchCommit:
    """The reset as ONE Delta commit with no data on ``table``'s snapshot (no retry): fails
    with :class:`CommandError` when anything committed since the offsets were read."""
    changed = plan.changes
    commit = BatchCommit(
        pipeline_id=config.pipeline_id,
        app_id=app_id(config.pipeline_id, f"reset-{uuid.uuid4().hex[:12]}"),
        batch_id=0,
        end_offsets={t: dict(ps) for t, ps in plan.target.items()},
        reset={
            "by": who or _who(),
            "at_ms": int(time.time() * 1000),
            "to": plan.to,
            "reason": reason,
            "from": offsets_to_json(_offsets((m.topic, m.partition, m.stored) for m in changed)),
            "rewind": [[m.topic, m.partition] for m in plan.rewinds],
        },
    ).on_top_of(plan.stored)
    properties = CommitProperties(
        app_transactions=[Transaction(a, v) for a, v in commit.transactions()],
        custom_metadata={"userMetadata": commit.user_metadata()},
        max_commit_retries=0,
    )
    empty = pa.schema(table.schema().to_arrow()).empty_table()
    try:
        write_deltalake(
            table,
            empty,
            mode="append",
            storage_options=config.delta.storage_options or None,
            commit_properties=properties,
        )
    except CommitFailedError as exc:
        raise CommandError(
            f"the table changed while resetting (another commit landed first: {exc}); nothing "
            "was written. Check `offsets show` and run the reset again."
        ) from None
    return commit


def _render(config: PipelineConfig, plan: Plan) -> str:
    lines = [
        f"reset of pipeline {config.pipeline_id} on {config.delta.table} to {plan.to} "
        f"(stored at {plan.stored.describe()}):",
    ]
    rows = []
    for m in plan.moves:
        change = (
            "0" if m.new == m.stored else "new" if m.stored is None else f"{m.new - m.stored:+d}"
        )
        note = "rewind: read again" if m.rewind else "skipped" if m.new != m.stored else ""
        rows.append([m.topic, m.partition, m.stored, m.new, change, note])
    lines += format_rows(["TOPIC", "PARTITION", "STORED", "NEW", "CHANGE", ""], rows)
    return "\n".join(lines)


def _checkpoint_advice(config: PipelineConfig, version: int) -> str:
    moved = f"{config.checkpoint}.before-reset-{version}"
    if local_path(config.checkpoint) is not None:
        if not CheckpointLog(None, config.checkpoint).has_plan():
            return "the checkpoint holds no batches: the next run starts at the new offsets."
        return (
            f"before the next run, move the checkpoint aside: mv {config.checkpoint} {moved}\n"
            "(the pipeline refuses to resume a checkpoint older than a reset; a new one starts "
            "at the new offsets)"
        )
    return (
        f"before the next run, move the checkpoint {config.checkpoint} aside (to {moved}); the "
        "pipeline refuses to resume a checkpoint older than a reset."
    )


def _refuse_if_running(config: PipelineConfig, args: argparse.Namespace) -> str | None:
    """An error naming the active run(s), or None."""
    try:
        active = active_leases(config.delta.table, config.pipeline_id)
    except LeaseUnavailableError as exc:
        if args.no_run_check:
            return None
        raise CommandError(
            f"cannot tell whether the pipeline is running: {exc}. Stop it, then pass "
            "--no-run-check (the Delta fence still refuses a reset that races a commit)."
        ) from None
    if not active or args.no_run_check:  # the operator vouches the runs are gone
        return None
    runs = "; ".join(lease.describe() for lease in active)
    return (
        f"pipeline {config.pipeline_id!r} is running ({runs}): stop it first "
        "(SIGTERM or Ctrl-C stops it after its current batch), then reset."
    )


def run_reset(config: PipelineConfig, args: argparse.Namespace) -> int:
    table = open_existing(config.delta.table, config)
    running = _refuse_if_running(config, args)
    if running is not None and not args.dry_run:
        raise CommandError(f"{running} Nothing was written.")
    plan = plan_reset(config, args, table, admin_for(config))
    if plan.rewinds and not args.allow_rewind:
        names = ", ".join(f"{m.topic}:{m.partition} {m.stored} -> {m.new}" for m in plan.rewinds)
        raise CommandError(
            f"the reset moves partitions backwards ({names}): their records would be read and "
            "written again. Nothing was written. Pass --allow-rewind to do it anyway; the "
            "checkpoint must then be moved aside (the command says how)."
        )
    print(_render(config, plan))
    if args.dry_run:
        if running is not None:
            print(f"note: {running}")
        print("dry run: nothing written")
        return 0
    if plan.changes:
        commit = commit_reset(table, config, plan, args.reason)
        version = table.version()  # write_deltalake moved the handle to the new version
        print(f"committed as Delta version {version} (commit {commit.seq} of the pipeline)")
        offsets = commit.end_offsets
    else:
        print("the table already stores these offsets: nothing committed")
        version = plan.stored.delta_version or 0
        offsets = plan.stored.offsets
    committer = OffsetCommitter(
        config.kafka.client_config(),
        config.kafka.consumer_group,
        timeout_s=config.commit_back.timeout_seconds,
    )
    committer.submit(-1, offsets)
    stats = committer.close()
    if stats.succeeded == 0:
        print(
            f"error: the table is reset, but consumer group {config.kafka.consumer_group} was not "
            f"updated ({stats.last_error or 'no answer'}): run the same reset again to retry "
            "(the table will not change), or let the next pipeline run align the group."
        )
        return 1
    print(f"consumer group {config.kafka.consumer_group} now at the same offsets")
    if plan.changes:
        print(_checkpoint_advice(config, version))
    return 0
