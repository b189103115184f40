"""``<script> offsets show | reset | verify``: the pipeline's offsets the way
``kafka-consumer-groups --describe`` shows a group's, moved safely, and proven whole.

    orders-stream offsets show [--json | --csv]
    orders-stream offsets reset TARGET [--topic T] [--execute] [--allow-rewind] [--allow-skip]
                               [--reason TEXT]
        TARGET: --to-earliest | --to-latest | --to-current | --shift-by N
              | --to-datetime 2025-01-01T00:00:00Z | --by-duration PT1H
              | --to-offsets orders:0=15,orders:1=20 | --from-file offsets.csv
    orders-stream offsets verify [--ids id]

``reset`` works like ``kafka-consumer-groups --reset-offsets``: it prints the plan and writes
nothing unless ``--execute``; a move backwards needs ``--allow-rewind`` and a move forward past
records not yet in the table ``--allow-skip``. ``show --csv`` writes the stored offsets as the
``TOPIC,PARTITION,OFFSET`` rows ``--from-file`` reads (and ``kafka-consumer-groups --export``
writes).

``show`` and ``verify`` read the table with delta-rs and Kafka with confluent-kafka; none of the
three starts Spark. Exit status: 0 done (verify: everything holds), 1 verify found a problem (or
reset could not update the group), 2 bad input or a state the command refuses (nothing written).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from kafka_delta.commands.arguments import add_config_options, build_config, selected_tables
from kafka_delta.commands.table_log import (
    CommandError,
    admin_for,
    format_rows,
    group_offsets_of,
    kafka_partitions,
    open_existing,
    open_table,
    row_count,
    stored_offsets,
)
from kafka_delta.config import ConfigError, PipelineConfig
from kafka_delta.kafka.admin import (
    GroupNotAuthorizedError,
    KafkaRefusedError,
    KafkaUnavailableError,
)
from kafka_delta.offsets.model import first_offset, format_ms, offsets_to_json
from kafka_delta.offsets.stored import OffsetsExpiredError

log = logging.getLogger(__name__)


def parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=prog,
        description="Show, reset or verify the offsets the pipeline stores in its Delta table.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, allow_abbrev=False, help=help_, description=help_)
        add_config_options(sub)
        sub.add_argument("--log-level", default="WARNING", help="default WARNING")
        return sub

    show = command("show", "one row per topic-partition: stored, group, earliest, latest, lag")
    form = show.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the same as JSON")
    form.add_argument(
        "--csv",
        action="store_true",
        help="print the stored offsets only, as TOPIC,PARTITION,OFFSET rows (what "
        "`reset --from-file` reads, as kafka-consumer-groups --export writes them)",
    )

    reset = command(
        "reset",
        "move the stored offsets as one audited Delta commit (no data), then the group's; "
        "prints the plan and writes nothing unless --execute",
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's earliest")
    to.add_argument("--to-latest", action="store_true", help="each partition's latest")
    to.add_argument(
        "--to-datetime",
        metavar="WHEN",
        help="first offset at or after WHEN: ISO 8601 (2025-01-31T08:00:00Z; no zone = UTC) "
        "or epoch milliseconds",
    )
    to.add_argument(
        "--to-offsets",
        metavar="SPEC",
        help="explicit offsets, TOPIC:PARTITION=OFFSET[,...] (e.g. orders:0=15,orders:1=20); "
        "other partitions keep theirs",
    )
    to.add_argument(
        "--to-current",
        action="store_true",
        help="the stored offsets as they are (re-aligns the group; records an audited commit)",
    )
    to.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="each stored offset plus N (negative: back by -N)",
    )
    to.add_argument(
        "--by-duration",
        metavar="DURATION",
        help="first offset at or after now minus DURATION, ISO 8601 (PT30M, PT1H, P1DT2H)",
    )
    to.add_argument(
        "--from-file",
        metavar="CSV",
        help="offsets from TOPIC,PARTITION,OFFSET rows (`offsets show --csv`, or "
        "kafka-consumer-groups --export); other partitions keep theirs",
    )
    reset.add_argument(
        "--topic",
        action="append",
        help="only this topic (repeatable; default: the config's topics)",
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would change, write nothing (the default without --execute)",
    )
    mode.add_argument(
        "--execute", action="store_true", help="commit the reset (without it: a preview)"
    )
    reset.add_argument(
        "--allow-rewind",
        action="store_true",
        help="allow moving partitions backwards (their records are read and written again)",
    )
    reset.add_argument(
        "--allow-skip",
        action="store_true",
        help="allow moving partitions forward past records not yet in the table (they are "
        "never read)",
    )
    reset.add_argument("--reason", default="", help="why, recorded in the commit")
    reset.add_argument(
        "--no-run-check",
        action="store_true",
        help="skip the check for a running pipeline (only where the run lease cannot be read; "
        "the Delta fence still refuses a conflicting commit)",
    )

    verify = command("verify", "prove the table's offsets and ranges are whole")
    verify.add_argument(
        "--ids", metavar="COLUMN", help="also check that COLUMN's values are distinct"
    )
    verify.add_argument(
        "--against-kafka",
        action="store_true",
        help="also read the committed ranges back from Kafka and prove each record is in the "
        "table or the dead-letter table exactly once",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "kafka-delta offsets") -> int:
    args = parser(prog).parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = build_config(args)
        views = selected_tables(config, args)
        if args.command == "show":
            if args.csv:
                print(show_csv(config, views), end="")
                return 0
            if not config.tables:
                document = show(config)
                print(json.dumps(document, indent=2) if args.json else render_show(document))
                return 0
            # Each table's stored offsets beside the group's (the least of the tables').
            documents = {str(v.table_name): show(v) for v in views}
            if args.json:
                print(
                    json.dumps({"pipeline_id": config.pipeline_id, "tables": documents}, indent=2)
                )
            else:
                print("\n\n".join(f"table {n}: {render_show(d)}" for n, d in documents.items()))
            return 0
        if args.command == "reset":
            from kafka_delta.commands.reset import run_reset

            # All tables move together (or the one --table names); the group then holds the
            # least of every table's offsets, as the run commits it back.
            group = (lambda _: group_offsets_of(config)) if config.tables else None
            status = 0
            for view in views:
                own = _reset_of_table(args, view) if config.tables else args
                if own is None:
                    print(f"table {view.table_name}: reads none of the topics named: unchanged")
                    continue
                if config.tables:
                    print(f"table {view.table_name}:")
                    gone = open_table(view.delta.table, view) is None
                    if gone and len(views) > 1:
                        # Deleted, or not written yet: it stores no offsets, so a reset of
                        # the pipeline leaves it as it is (a run decides where it starts).
                        print(f"no Delta table at {view.delta.table}: no offsets to reset")
                        continue
                status = max(status, run_reset(view, own, group=group))
            return status
        from kafka_delta.commands.verify import run_verify

        expected = group_offsets_of(config) if config.tables else None
        status = 0
        for view in views:
            status = max(
                status,
                run_verify(
                    view, ids=args.ids, against_kafka=args.against_kafka, group_expected=expected
                ),
            )
        if len(views) > 1:
            print(f"verify: {'OK' if status == 0 else 'FAILED'}: {len(views)} tables")
        return status
    except (
        ConfigError,
        CommandError,
        KafkaRefusedError,
        KafkaUnavailableError,
        OffsetsExpiredError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _reset_of_table(args: argparse.Namespace, view: PipelineConfig) -> argparse.Namespace | None:
    """The reset's arguments for one table of several: a target that names partitions
    (``--to-offsets``, ``--from-file``) or topics (``--topic``) restricted to the topics the
    table reads; None when it names none of them."""
    from kafka_delta.commands.reset import parse_offsets_spec, read_offsets_file

    topics = set(view.kafka.topics)
    own = argparse.Namespace(**vars(args))
    if args.to_offsets is not None or args.from_file is not None:
        offsets = (
            parse_offsets_spec(args.to_offsets)
            if args.to_offsets is not None
            else read_offsets_file(args.from_file)
        )
        mine = {t: parts for t, parts in offsets.items() if t in topics}
        if not mine:
            return None
        own.to_offsets = ",".join(
            f"{t}:{p}={o}" for t, parts in sorted(mine.items()) for p, o in sorted(parts.items())
        )
        own.from_file = None
    elif args.topic:
        own.topic = [t for t in args.topic if t in topics]
        if not own.topic:
            return None
    return own


# -- show -------------------------------------------------------------------------------------


def _time(epoch_ms: int | None) -> str | None:
    return format_ms(epoch_ms) if epoch_ms is not None else None


def show(config: PipelineConfig) -> dict[str, Any]:
    """Everything ``offsets show`` prints, as a JSON-ready document."""
    table = open_existing(config.delta.table, config)
    admin = admin_for(config)
    partitions, _ = kafka_partitions(admin, config.kafka.topics)
    stored, commit = stored_offsets(table, config, partitions)
    # Topics the table stores but the config no longer reads are shown too (when on Kafka).
    extra, missing = kafka_partitions(admin, set(stored.offsets) - set(partitions))
    partitions.update(extra)
    missing += [t for t in config.kafka.topics if t not in partitions]
    marks = admin.watermarks(partitions)
    # The group only mirrors the table's offsets for lag tools; one the client may not read is
    # shown as such, never as a group that committed nothing (which would read as lag).
    unreadable: str | None = None
    try:
        group = admin.committed(config.kafka.consumer_group, partitions)
    except GroupNotAuthorizedError as exc:
        group, unreadable = {}, str(exc)

    dead_table = config.dead_letter_table
    dead = open_table(dead_table, config) if dead_table else None
    names = sorted(
        {(t, p) for t, ps in partitions.items() for p in ps}
        | {(t, p) for t, ps in stored.offsets.items() for p in ps}
    )
    rows = []
    for t, p in names:
        at = stored.offsets.get(t, {}).get(p)
        earliest = marks.earliest.get(t, {}).get(p)
        latest = marks.latest.get(t, {}).get(p)
        # Never stored: the pipeline would start where its rule of first reads puts it.
        begin = (
            at
            if at is not None or earliest is None or latest is None
            else first_offset(
                t,
                p,
                stored=stored.offsets,
                starting=config.kafka.starting_offsets,
                earliest=earliest,
                latest=latest,
            )
        )
        rows.append(
            {
                "topic": t,
                "partition": p,
                "stored_offset": at,
                "delta_version": stored.delta_version if at is not None else None,
                "batch_id": stored.batch_id if at is not None else None,
                "app_id": stored.app_id if at is not None else None,
                "committed_at": _time(commit.timestamp_ms) if commit and at is not None else None,
                "group_offset": "unreadable" if unreadable else group.get(t, {}).get(p),
                "earliest": earliest,
                "latest": latest,
                "lag": max(0, latest - begin) if latest is not None and begin is not None else None,
            }
        )
    return {
        "pipeline_id": config.pipeline_id,
        "table": config.delta.table,
        "table_version": table.version(),
        "rows": row_count(table),
        "dead_letter_table": dead_table,
        "dead_letters": row_count(dead) if dead is not None else None,
        "consumer_group": config.kafka.consumer_group,
        "consumer_group_unreadable": unreadable,
        "stored": {
            "delta_version": stored.delta_version,
            "batch_id": stored.batch_id,
            "app_id": stored.app_id,
            "seq": stored.seq,
            "committed_at": _time(commit.timestamp_ms) if commit else None,
            "source": "commit"
            if commit
            else "rows (log cleaned up)"
            if stored.recomputed
            else "none (a RESTORE took the table back to before the pipeline's first commit)",
            "reset": dict(stored.reset) if stored.reset is not None else None,
            "offsets": offsets_to_json(stored.offsets),
            # Recomputed from the rows: where the offset txns name more (read again at start).
            "past_the_rows": offsets_to_json(stored.past_the_rows)
            if stored.past_the_rows
            else None,
        },
        "partitions": rows,
        "lag": sum(r["lag"] or 0 for r in rows),
        "topics_missing_on_kafka": sorted(missing),
    }


def show_csv(config: PipelineConfig, views: list[PipelineConfig] | None = None) -> str:
    """The stored offsets as ``TOPIC,PARTITION,OFFSET`` lines, no header: the file
    ``kafka-consumer-groups --reset-offsets --export`` writes and ``--from-file`` reads. Only
    partitions with a stored offset, as Kafka's export holds only committed ones. Of several
    tables: the one ``views`` names alone, else the group's (the least of the tables')."""
    if config.tables and (views is None or len(views) > 1):
        offsets = group_offsets_of(config)
    else:
        view = views[0] if views else config
        table = open_existing(view.delta.table, view)
        partitions, _ = kafka_partitions(admin_for(view), view.kafka.topics)
        offsets = stored_offsets(table, view, partitions)[0].offsets
    return "".join(
        f"{t},{p},{offset}\n"
        for t, parts in sorted(offsets.items())
        for p, offset in sorted(parts.items())
    )


_COLUMNS = [
    ("TOPIC", "topic"),
    ("PARTITION", "partition"),
    ("STORED", "stored_offset"),
    ("VERSION", "delta_version"),
    ("BATCH", "batch_id"),
    ("APP_ID", "app_id"),
    ("COMMITTED_AT", "committed_at"),
    ("GROUP", "group_offset"),
    ("EARLIEST", "earliest"),
    ("LATEST", "latest"),
    ("LAG", "lag"),
]


def render_show(doc: dict[str, Any]) -> str:
    from kafka_delta.offsets.model import describe_reset

    stored = doc["stored"]
    dead = (
        f"{doc['dead_letters']} dead letters in {doc['dead_letter_table']}"
        if doc["dead_letters"] is not None
        else "no dead-letter table"
        if doc["dead_letter_table"] is None
        else f"no dead letters yet ({doc['dead_letter_table']} does not exist)"
    )
    if stored["source"] == "commit":
        where = f"Delta version {stored['delta_version']}, committed {stored['committed_at']}"
        what = (
            f"a reset {describe_reset(stored['reset'])}"
            if stored["reset"]
            else f"batch {stored['batch_id']} of {stored['app_id']}"
        )
    else:
        # after log cleanup (the offsets recomputed from the rows), or none left after a RESTORE
        source = stored["source"]
        where, what = (f"the table's {source}" if source.startswith("rows") else source), "-"
    lines = [
        f"pipeline {doc['pipeline_id']}: table {doc['table']} (Delta version "
        f"{doc['table_version']}): {doc['rows']} rows; {dead}",
        f"stored offsets: {where}: {what} (commit {stored['seq']} of the pipeline)",
        f"consumer group: {doc['consumer_group']}"
        + (
            f" (unreadable: {doc['consumer_group_unreadable']})"
            if doc.get("consumer_group_unreadable")
            else ""
        ),
    ]
    if doc["topics_missing_on_kafka"]:
        lines.append(f"topics not on Kafka: {', '.join(doc['topics_missing_on_kafka'])}")
    lines.append("")
    lines += format_rows(
        [h for h, _ in _COLUMNS], [[r[k] for _, k in _COLUMNS] for r in doc["partitions"]]
    )
    lines.append(f"total lag: {doc['lag']}")
    return "\n".join(lines)
