"""``offsets reset``: move the pipeline's stored offsets, as one audited Delta commit of the
pipeline with no data, then copy them to the consumer group.

Like ``kafka-consumer-groups --reset-offsets``, it prints the plan and writes nothing unless
``--execute``. Both lossy directions need their own flag, even then: ``--allow-rewind`` to move
a partition backwards (records read and written again), ``--allow-skip`` to move it forward past
records the table does not hold yet (records never read). Explicit offsets (``--to-offsets``,
``--from-file``, ``--shift-by``, ``--to-current``) must lie in Kafka's ``[earliest, latest]``.

The commit has the shape of a batch commit (:class:`..offsets.BatchCommit`): ``userMetadata``
with the new offsets (the partitions not reset carried forward) plus a ``reset`` record (who,
when, why, to what, from which offsets, which partitions move backwards), and the txn actions
a delta-rs batch writes: its own ``(appId, 0)``, the fence ``(<pipeline>:fence, stored seq + 1)``
and one offset txn per partition. It is committed with no retry on the snapshot the offsets
were read from, so a pipeline commit landing meanwhile makes the reset fail (nothing written),
and a pipeline batch planned before the reset fails fencing instead of overwriting it.

A checkpoint that planned batches before the reset would resume from its own positions: the
pipeline's next start sets it aside and resumes from the reset (:mod:`..recovery`), as this
command says.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import getpass
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from kafka_delta.commands.table_log import (
    CommandError,
    SparkCommandTable,
    admin_for,
    format_rows,
    kafka_partitions,
    newest_commit,
    open_existing,
    stored_offsets,
)
from kafka_delta.config import PipelineConfig
from kafka_delta.delta.locations import local_path
from kafka_delta.kafka.admin import KafkaAdmin, Watermarks
from kafka_delta.kafka.commit_back import OffsetCommitter
from kafka_delta.offsets.model import (
    BatchCommit,
    Offsets,
    StoredOffsets,
    app_id,
    first_offset,
    format_ms,
    offsets_to_json,
    parse_user_metadata,
    same_topic_id,
)
from kafka_delta.offsets.stored import OffsetsExpiredError
from kafka_delta.recovery.checkpoint import CheckpointLog
from kafka_delta.recovery.lease import LeaseUnavailableError, active_leases_of

log = logging.getLogger(__name__)


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
    # Where the pipeline would read next without the reset (the stored offset, else where
    # kafka.starting_offsets starts a partition), and Kafka's earliest offset.
    resume: int
    earliest: int

    @property
    def rewind(self) -> bool:
        return self.stored is not None and self.new < self.stored

    @property
    def skipped(self) -> int:
        """Records the move leaves unread: from where the pipeline would read next (or Kafka's
        earliest, when retention already deleted those below) up to the new offset."""
        return max(0, self.new - max(self.resume, self.earliest))

    def describe(self) -> str:
        return f"{self.topic}:{self.partition} {_show(self.stored)} -> {self.new}"


def _show(offset: int | None) -> str:
    return "-" if offset is None else str(offset)


@dataclass(frozen=True)
class Plan:
    to: str
    stored: StoredOffsets
    moves: list[Move]
    # Kafka's id of each topic the reset moves, as of the reset.
    topic_ids: dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> Offsets:
        return _offsets((m.topic, m.partition, m.new) for m in self.moves)

    @property
    def recreated(self) -> list[str]:
        """The topics the reset moves that Kafka now knows by another id than the stored one
        (deleted and created again): the reset's offsets are positions in the new topic."""
        stored = self.stored.topic_ids or {}
        return sorted(
            t for t, i in self.topic_ids.items() if t in stored and not same_topic_id(stored[t], i)
        )

    @property
    def changes(self) -> list[Move]:
        return [m for m in self.moves if m.new != m.stored]

    @property
    def rewinds(self) -> list[Move]:
        return [m for m in self.moves if m.rewind]

    @property
    def skips(self) -> list[Move]:
        return [m for m in self.moves if m.skipped]

    def needs(self, args: argparse.Namespace) -> list[tuple[str, str]]:
        """(flag, what it allows) for each lossy direction the plan takes without its flag."""
        needed = []
        if self.rewinds and not args.allow_rewind:
            names = ", ".join(m.describe() for m in self.rewinds)
            needed.append(
                (
                    "--allow-rewind",
                    f"moves partitions backwards ({names}): their records would be read and "
                    "written again",
                )
            )
        if self.skips and not args.allow_skip:
            names = ", ".join(f"{m.describe()}: {m.skipped} records" for m in self.skips)
            needed.append(
                (
                    "--allow-skip",
                    f"moves partitions forward past records not yet in the table ({names}): "
                    "they would never be read",
                )
            )
        return needed


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


_DURATION = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> int:
    """``--by-duration``: an ISO 8601 duration (``PT30M``, ``PT1H``, ``P1DT2H``, ``P2W``), as
    kafka-consumer-groups takes it, in milliseconds. Months and years have no fixed length."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groupdict().values()):
        raise CommandError(
            f"--by-duration {text!r} is not an ISO 8601 duration such as PT30M, PT1H or P1DT2H "
            "(weeks, days, hours, minutes, seconds; no months or years)"
        )
    parts = {k: float(v) if v else 0.0 for k, v in match.groupdict().items()}
    seconds = (
        parts["w"] * 604800 + parts["d"] * 86400 + parts["h"] * 3600 + parts["m"] * 60 + parts["s"]
    )
    return int(seconds * 1000)


def parse_offsets_spec(text: str) -> Offsets:
    """``orders:0=15,orders:1=20`` -> ``{"orders": {0: 15, 1: 20}}``."""
    result: Offsets = {}
    for item in (part.strip() for part in text.split(",")):
        where, eq, offset = item.partition("=")
        topic, colon, partition = where.rpartition(":")
        negative = _negative(partition=partition, offset=offset.strip())
        if eq and colon and topic and negative:
            raise CommandError(
                f"--to-offsets: {item!r} has a negative {negative}: partitions and offsets are "
                "0 or more (e.g. orders:0=15)"
            )
        if not (eq and colon and topic and partition.isdigit() and offset.strip().isdigit()):
            raise CommandError(
                f"--to-offsets: {item!r} is not TOPIC:PARTITION=OFFSET (e.g. orders:0=15)"
            )
        if int(partition) in result.get(topic, {}):
            raise CommandError(f"--to-offsets names {topic}:{partition} twice")
        result.setdefault(topic, {})[int(partition)] = int(offset)
    return result


def _negative(**numbers: str) -> str | None:
    """The name of the first of ``numbers`` written as a negative integer, else None: an offset
    of -5 is said to be negative, not to be malformed."""
    for name, text in numbers.items():
        if text.startswith("-") and text[1:].isdigit():
            return name
    return None


def read_offsets_file(path: str) -> Offsets:
    """``--from-file``: ``TOPIC,PARTITION,OFFSET`` rows (what ``offsets show --csv`` prints and
    kafka-consumer-groups --export writes); a ``topic,partition,offset`` header is allowed."""
    try:
        with open(path, newline="") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise CommandError(f"--from-file: cannot read {path}: {exc.strerror or exc}") from None
    result: Offsets = {}
    for number, row in enumerate(rows, start=1):
        cells = [cell.strip() for cell in row]
        header = number == 1 and [c.lower() for c in cells][1:] == ["partition", "offset"]
        if header or not any(cells):
            continue
        negative = len(cells) == 3 and _negative(partition=cells[1], offset=cells[2])
        if cells[0] and negative:
            raise CommandError(
                f"--from-file {path}, line {number}: {','.join(row)!r} has a negative "
                f"{negative}: partitions and offsets are 0 or more (e.g. orders,0,15)"
            )
        if len(cells) != 3 or not (cells[0] and cells[1].isdigit() and cells[2].isdigit()):
            raise CommandError(
                f"--from-file {path}, line {number}: {','.join(row)!r} is not "
                "TOPIC,PARTITION,OFFSET (e.g. orders,0,15)"
            )
        topic, partition = cells[0], int(cells[1])
        if partition in result.get(topic, {}):
            raise CommandError(f"--from-file {path} names {topic}:{partition} twice")
        result.setdefault(topic, {})[partition] = int(cells[2])
    if not result:
        raise CommandError(f"--from-file {path} holds no TOPIC,PARTITION,OFFSET rows")
    return result


def _explicit(args: argparse.Namespace) -> tuple[str, Offsets] | None:
    """(option, offsets) of a target that names each partition, else None."""
    option = "--to-offsets" if args.to_offsets is not None else "--from-file"
    if (args.to_offsets is not None or args.from_file is not None) and args.topic:
        raise CommandError(f"--topic does not apply to {option}: it names each partition itself")
    if args.to_offsets is not None:
        return "--to-offsets", parse_offsets_spec(args.to_offsets)
    if args.from_file is not None:
        return "--from-file", read_offsets_file(args.from_file)
    return None


def _topics(
    config: PipelineConfig,
    args: argparse.Namespace,
    stored_topics: set[str],
    explicit: tuple[str, Offsets] | None,
) -> list[str]:
    known = set(config.kafka.topics) | stored_topics
    wanted = (
        sorted(explicit[1]) if explicit is not None else args.topic or list(config.kafka.topics)
    )
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise CommandError(
            f"unknown topic {', '.join(unknown)}: pipeline {config.pipeline_id!r} reads "
            f"{', '.join(sorted(known))}"
        )
    return sorted(set(wanted))


def _check_in_range(
    target: Offsets,
    partitions: dict[str, list[int]],
    marks: Watermarks,
    why: Callable[[str, int, int], str] = lambda t, p, offset: f"offset {offset} of {t}:{p}",
) -> None:
    """Explicit offsets must name partitions that exist and lie in ``[earliest, latest]``:
    below, the records are gone; above, none exist yet (one sentence; nothing written)."""
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
                    f"{why(t, p, offset)} is outside what Kafka holds, [{lo}, {hi}] "
                    "(earliest, latest): --to-earliest or --to-latest move there"
                )


def _selected(stored: StoredOffsets, partitions: dict[str, list[int]], what: str) -> Offsets:
    """The stored offsets of ``partitions``; a relative target needs one for each."""
    found: Offsets = {}
    for t, parts in partitions.items():
        for p in parts:
            offset = stored.offsets.get(t, {}).get(p)
            if offset is None:
                raise CommandError(
                    f"{what}: {t}:{p} has no stored offset to start from (the pipeline has not "
                    "read it yet): name it with --to-offsets, or leave it out with --topic"
                )
            found.setdefault(t, {})[p] = offset
    return found


def _stored(
    table: Any, config: PipelineConfig, args: argparse.Namespace, admin: KafkaAdmin
) -> StoredOffsets:
    """The stored offsets, read by the pipeline's own reader (a RESTORE, log cleanup). Where
    nothing left after log cleanup can prove them
    (:func:`kafka_delta.offsets.stored.from_the_rows`), a target that does not start from them
    (explicit offsets, a time, earliest, latest) still moves the pipeline: it is the way out
    that error names."""
    try:
        stored, _ = stored_offsets(table, config, kafka_partitions(admin, config.kafka.topics)[0])
    except OffsetsExpiredError as exc:
        if exc.seq is None or args.to_current or args.shift_by is not None:
            raise CommandError(str(exc)) from None
        return StoredOffsets({}, None, None, None, seq=exc.seq, expired=True)
    return stored


def plan_reset(
    config: PipelineConfig, args: argparse.Namespace, table: Any, admin: KafkaAdmin
) -> Plan:
    """What the reset would do; raises :class:`CommandError` on any bad input."""
    stored = _stored(table, config, args, admin)
    explicit = _explicit(args)
    topics = _topics(config, args, set(stored.offsets), explicit)
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
    elif args.to_datetime is not None or args.by_duration is not None:
        from kafka_delta.commands.kafka_time import offsets_for_time

        if args.to_datetime is not None:
            when = parse_when(args.to_datetime)
            to = f"datetime {format_ms(when)} ({when} ms)"
        else:
            when = int(time.time() * 1000) - parse_duration(args.by_duration)
            to = f"duration {args.by_duration}: datetime {format_ms(when)} ({when} ms)"
        target = offsets_for_time(config, admin, partitions, marks, when)
    elif args.to_current:
        to, target = "current", _selected(stored, partitions, "--to-current")
        _check_in_range(
            target,
            partitions,
            marks,
            lambda t, p, offset: f"the stored offset {offset} of {t}:{p}",
        )
    elif args.shift_by is not None:
        n = args.shift_by
        to = f"shift by {n:+d}"
        current = _selected(stored, partitions, "--shift-by")
        target = {t: {p: o + n for p, o in parts.items()} for t, parts in current.items()}
        _check_in_range(
            target,
            partitions,
            marks,
            lambda t, p, offset: f"{t}:{p} shifted by {n:+d} to {offset}",
        )
    else:
        assert explicit is not None
        to = "offsets" if explicit[0] == "--to-offsets" else f"file {args.from_file}"
        target = explicit[1]
        _check_in_range(target, partitions, marks)

    def resume(t: str, p: int) -> int:
        return first_offset(
            t,
            p,
            stored=stored.offsets,
            starting=config.kafka.starting_offsets,
            earliest=marks.earliest[t][p],
            latest=marks.latest[t][p],
        )

    moves = [
        Move(t, p, stored.offsets.get(t, {}).get(p), offset, resume(t, p), marks.earliest[t][p])
        for t, parts in sorted(target.items())
        for p, offset in sorted(parts.items())
    ]
    # The reset's offsets are positions in each topic as it is now: its commit records the
    # topics' current ids (a topic deleted and created again then no longer stops the run).
    return Plan(to, stored, moves, admin.topic_ids(sorted(target)))


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no login name (some containers)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _tables_named(stored: StoredOffsets | None, pipeline_id: str) -> tuple[str, ...]:
    record = parse_user_metadata(stored.user_metadata, pipeline_id) if stored else None
    return record.tables if record is not None else ()


def commit_reset(
    table: Any, config: PipelineConfig, plan: Plan, reason: str, who: str | None = None
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
            "skip": [[m.topic, m.partition, m.skipped] for m in plan.skips],
            **({"recreated": plan.recreated} if plan.recreated else {}),
        },
        topic_ids=plan.topic_ids or None,
        # The pipeline's tables as the commit it replaces named them (kafka_delta.routing).
        tables=_tables_named(plan.stored, config.pipeline_id),
    ).on_top_of(plan.stored)
    if isinstance(table, SparkCommandTable):
        _commit_with_spark(table, commit, config)
        return commit
    from deltalake import CommitProperties, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError

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


def _commit_with_spark(
    table: SparkCommandTable, commit: BatchCommit, config: PipelineConfig
) -> None:
    """The reset on a delta-spark table, through delta-spark's own writer (its commitInfo names
    delta-spark: ``engineInfo`` ``Apache-Spark/... Delta-Lake/...``): an empty append carrying
    the fence txn (``txnAppId``/``txnVersion``) and the record (``userMetadata``), as the sink's
    appends do. delta-spark commits it although it adds no file (the txn action is an action:
    ``WriteIntoDelta`` puts it beside the file actions, and only a commit with no action at all
    is skipped). It takes the pipeline's next fence seq, so it and a pipeline batch on the same
    stored offsets cannot both land: the loser is rejected (``ConcurrentTransactionException``)
    or skipped by delta-spark (its seq is no longer above the stored one), which the read-back
    tells; either way the reset says so and writes nothing more. Once read back as the
    pipeline's newest commit, it is copied beside the checkpoint as the sink copies each batch's
    commit (:mod:`kafka_delta.delta.commit_copies`): after log cleanup the copy is
    what still names the offsets the reset skipped to."""
    from kafka_delta.delta.commit_copies import CommitCopies
    from kafka_delta.delta.spark_commit import append_options, lost_race
    from kafka_delta.delta.spark_table import TableAccessError

    frame = table.table.frame().limit(0)
    writer = frame.write.format("delta").mode("append").options(**append_options(commit))
    try:
        table.table.save(writer)
    except TableAccessError as exc:
        raise CommandError(str(exc)) from None
    except Exception as exc:
        if not lost_race(exc):
            raise
        raise CommandError(
            f"the table changed while resetting (another commit landed first: "
            f"{str(exc).splitlines()[0]}); nothing was written. Check `offsets show` and run "
            "the reset again."
        ) from None
    newest = newest_commit(table, commit.pipeline_id)
    if newest is None or (newest.record.app_id, newest.record.seq) != (commit.app_id, commit.seq):
        raise CommandError(
            f"the table changed while resetting (a commit of the pipeline took commit "
            f"{commit.seq} first); nothing was written. Check `offsets show` and run the reset "
            "again."
        )
    copies = CommitCopies(
        config.delta.table, config.checkpoint, config.pipeline_id, config.delta.storage_options
    )
    try:
        copies.write(commit.seq, commit.user_metadata(), newest.version)
    except Exception as exc:  # a hint: the next start writes it from the log while it is there
        log.warning("cannot keep the copy of the reset's commit %d: %s", commit.seq, exc)


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
        note = (
            "rewind: read again" if m.rewind else f"skips {m.skipped} unread" if m.skipped else ""
        )
        rows.append([m.topic, m.partition, m.stored, m.new, change, note])
    lines += format_rows(["TOPIC", "PARTITION", "STORED", "NEW", "CHANGE", ""], rows)
    return "\n".join(lines)


def _checkpoint_advice(config: PipelineConfig) -> str:
    if (
        local_path(config.checkpoint) is not None
        and not CheckpointLog(None, config.checkpoint).has_plan()
    ):
        return "the checkpoint holds no batches: the next run starts at the new offsets."
    return (
        f"the next run sets checkpoint {config.checkpoint} aside (kept, renamed "
        f"{config.checkpoint}.set-aside-<time>) if it planned batches before the reset, and "
        "starts at the new offsets."
    )


def _refuse_if_running(config: PipelineConfig, args: argparse.Namespace) -> str | None:
    """An error naming the active run(s), or None."""
    try:
        active = active_leases_of(config)
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


def run_reset(
    config: PipelineConfig,
    args: argparse.Namespace,
    group: Callable[[Offsets], Offsets] | None = None,
) -> int:
    """Preview (the default, and ``--dry-run``): print the plan, write nothing, exit 0.
    ``--execute``: commit it, refusing (exit 2, nothing written) a running pipeline or a lossy
    direction without its flag. ``group``: what the consumer group is to hold once the table
    stores the given offsets (a pipeline of several tables: the least of the tables'); by
    default the table's offsets."""
    table = open_existing(config.delta.table, config)
    running = _refuse_if_running(config, args)
    if running is not None and args.execute:
        raise CommandError(f"{running} Nothing was written.")
    plan = plan_reset(config, args, table, admin_for(config))
    needs = plan.needs(args)
    if args.execute and needs:
        flags = " ".join(flag for flag, _ in needs)
        raise CommandError(
            f"the reset {' and '.join(why for _, why in needs)}. Nothing was written. Pass "
            f"{flags} to do it anyway."
        )
    print(_render(config, plan))
    if not args.execute:
        if running is not None:
            print(f"note: {running}")
        for flag, why in needs:
            print(f"needs {flag}: the reset {why}")
        flags = " ".join(["--execute", *(flag for flag, _ in needs)])
        print(f"preview: nothing written; to do it, run the same command with {flags}")
        return 0
    # --to-current commits even when nothing moves: an audited record that the offsets were
    # checked and kept (and the group re-aligned with them).
    if plan.changes or plan.to == "current":
        commit = commit_reset(table, config, plan, args.reason)
        version = table.version()  # the handle reads the table's newest version
        print(f"committed as Delta version {version} (commit {commit.seq} of the pipeline)")
        offsets = commit.end_offsets
    else:
        print("the table already stores these offsets: nothing committed")
        offsets = plan.stored.offsets
    committer = OffsetCommitter(
        config.kafka.client_config(),
        config.kafka.consumer_group,
        timeout_s=config.commit_back.timeout_seconds,
    )
    committer.submit(-1, group(offsets) if group is not None else offsets)
    stats = committer.close()
    if stats.succeeded == 0 and stats.refusal is not None:
        print(
            f"error: the table is reset, but consumer group {config.kafka.consumer_group} was "
            f"not updated: {stats.refusal}. The table is exact without it (the group is for lag "
            "tools only); the next run aligns the group once the ACL is granted."
        )
        return 1
    if stats.succeeded == 0:
        print(
            f"error: the table is reset, but consumer group {config.kafka.consumer_group} was not "
            f"updated ({stats.last_error or 'no answer'}): run the same reset again to retry "
            "(the table will not change), or let the next pipeline run align the group."
        )
        return 1
    print(f"consumer group {config.kafka.consumer_group} now at the same offsets")
    if plan.changes:
        print(_checkpoint_advice(config))
    return 0
