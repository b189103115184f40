"""Operations harness: random sequences of what operators (and the world) do to a pipeline,
checked against a model of what Kafka holds (I8, I9, I11, I12).

    scripts/ops --random 40 --seed 1 --sink delta_rs
    scripts/ops --random 40 --seed 1 --tables 2
    scripts/ops --seed 60614 --tables 2 --replay 'skip(117, 61) rewind(32, 12)'
    scripts/ops --random 40 --seed 1 --sink delta_spark   # delta-spark's jars: Maven's cache

Each sequence starts from two topics of records read once, then makes ``--moves`` moves drawn
from its seed (opslib/moves.py): records produced (good and bad), a run to the end, a continuous
run started and stopped, a run stopped dead at a named point in a batch, the checkpoint deleted,
``offsets reset`` forward (skip) and back (rewind) with and without a live run, Delta's RESTORE
(live or not), Delta log cleanup, ``table maintain`` (``--full`` too), topics added, removed and
created again, partitions added, two runs racing on two checkpoints or on one. With
``--tables 2`` the pipeline writes two tables (``tables:``: every event into one, the events
with an even id routed into the other, one dead-letter table shared): a RESTORE acts on one of
them, log cleanup on both, and one move more deletes one table. Where a run stops with one of
the engine's expected sentences, the harness does what the sentence says (start again; reset a
recreated topic's offsets; delete the checkpoint to read a deleted table again).

After every move nothing may be in the tables more often than the model allows; whenever the
pipeline has caught up, nothing may be missing, and ``offsets verify --against-kafka`` must pass
exactly when the tables hold each record at most once. A failing sequence prints its seed and
the shortest sequence of moves that still fails; ``--seed S --replay 'MOVES'`` runs those moves
again as printed (the seed drives what the moves draw inside: events, a race's checkpoint), and
``--replay`` given several times runs each in turn on one broker and one Spark session.
Everything runs in this process, on one Spark session and one broker: a move costs seconds. (A
crash here is a run stopped by an exception at a crash point, which leaves the durable state a
SIGKILL there leaves; real SIGKILLs are scripts/chaos's.)

Last line (exit 0 only when all four counts are 0):

    ops-random: sink=<sink> tables=<T> sequences=<N> moves=<M> lost=<L> doubled=<D> \
stuck=<S> verify_disagreements=<V>
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_delta_dev.connector_jars import local_folder
from opslib.moves import moves_of, parse
from opslib.runner import Runner, sequence


def log(message: str) -> None:
    print(f"[ops {time.strftime('%H:%M:%S')}] {message}", flush=True)


def connector_confs(sink: str, jars: str | None) -> dict[str, str] | None:
    """The Spark confs delta-spark's jars need (None: none to be had here), as the test suite
    finds them: KAFKA_DELTA_CONNECTORS=packages fetches them, else the folder ``jars``, else
    the jars scripts/bootstrap fetched through Maven (kafka_delta_dev.connector_jars): without
    that last one, tests/test_ops.py ran the delta-spark sink's sequences only where
    KAFKA_DELTA_JARS was set, and failed where the suite found the jars by itself."""
    from kafka_delta_dev.connector_jars import local_folder
    from kafka_delta_dev.local_spark import connector_confs as found

    if sink != "delta_spark":
        return {}
    packages = os.environ.get("KAFKA_DELTA_CONNECTORS") == "packages"
    return found(jars or (None if packages else local_folder()[0]), packages) or None


def spark_session(confs: dict[str, str]):
    from kafka_delta.runtime.python_launcher import use_for_spark
    from kafka_delta_dev.local_spark import local_session

    use_for_spark()
    spark = local_session("ops", confs)
    # The runs' expected ends (fenced, stopped at a crash point) are Spark ERROR lines with
    # stack traces: the harness reports each outcome itself (engine.log has the engine's lines).
    spark.sparkContext.setLogLevel("FATAL")
    return spark


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="Random sequences of operator moves against a model of what Kafka holds."
    )
    parser.add_argument("--random", type=int, default=40, metavar="N", help="sequences (40)")
    parser.add_argument("--seed", type=int, default=1, help="the first sequence's seed (1)")
    parser.add_argument(
        "--seeds",
        type=lambda text: [int(s) for s in text.split(",") if s.strip()],
        help="these seeds only, comma-separated (replaces --random and --seed)",
    )
    parser.add_argument("--moves", type=int, default=8, help="moves per sequence (8)")
    parser.add_argument("--sink", choices=["delta_rs", "delta_spark"], default="delta_rs")
    parser.add_argument("--workdir", type=Path, default=Path(".ops"))
    parser.add_argument("--bootstrap-servers", help="a broker of yours (default: the embedded one)")
    parser.add_argument(
        "--delta-jars",
        default=local_folder()[0],
        help="folder of delta-spark jars, for --sink delta_spark (default $KAFKA_DELTA_JARS, "
        "else the jars scripts/bootstrap fetched through Maven)",
    )
    parser.add_argument(
        "--tables",
        type=int,
        choices=[1, 2],
        default=1,
        help="the pipeline's tables: 1, or 2 (tables: one of every event, one routed the "
        "events with an even id, sharing a dead-letter table; one move more: a table deleted)",
    )
    parser.add_argument(
        "--replay",
        metavar="MOVES",
        action="append",
        help="run these moves (as a failure prints them, e.g. 'skip(117, 61) rewind(32, 12)') "
        "after the prologue, on --seed's (or each of --seeds') randomness, instead of drawn ones; "
        "given more than once, each in turn (one broker and Spark session for all)",
    )
    parser.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")
    args = parser.parse_args(argv)
    try:
        replays = [parse(text) for text in args.replay or ()]
    except ValueError as exc:
        print(f"error: --replay: {exc}", file=sys.stderr)
        return 2
    confs = connector_confs(args.sink, args.delta_jars)
    if confs is None:
        print(
            "error: --sink delta_spark needs delta-spark's jars: scripts/bootstrap (mvn fetches "
            "them), --delta-jars FOLDER, KAFKA_DELTA_JARS=FOLDER or "
            "KAFKA_DELTA_CONNECTORS=packages",
            file=sys.stderr,
        )
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    # The engine's own lines go to a file: this output is the harness's.
    logging.basicConfig(
        filename=args.workdir / "engine.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from kafka_delta_dev.broker import dev_broker, start_broker

    broker = None
    bootstrap = args.bootstrap_servers
    if bootstrap is None:
        broker = start_broker(
            dev_broker(log_path=args.workdir / "broker.log", folder=args.workdir / "kafka")
        )
        bootstrap = broker.bootstrap_servers
    several = args.tables > 1
    log(
        f"broker {bootstrap}; sink {args.sink}; tables {args.tables}; "
        f"moves: {', '.join(moves_of(several))}"
    )
    spark = spark_session(confs)
    # A broker of one's own (--bootstrap-servers) is taken for a real Kafka.
    kafka = broker is None or broker.kind == "kafka"
    runner = Runner(spark, bootstrap, args.workdir, args.sink, log, several, kafka)
    seeds = args.seeds or ([args.seed] if replays else [args.seed + n for n in range(args.random)])
    # (seed, moves) of every sequence: each replay on each seed, else each seed's drawn moves.
    runs = [
        (seed, moves)
        for seed in seeds
        for moves in (replays or [sequence(seed, args.moves, several)])
    ]
    totals = {"moves": 0, "lost": 0, "doubled": 0, "stuck": 0, "verify_disagreements": 0}
    try:
        for n, (seed, moves) in enumerate(runs):
            log(f"sequence {n + 1}/{len(runs)} (seed {seed}): {' '.join(map(str, moves))}")
            result = runner.run(seed, moves)
            totals["moves"] += result.done
            totals["lost"] += len(result.lost)
            totals["doubled"] += len(result.doubled)
            totals["stuck"] += 1 if result.stuck else 0
            totals["verify_disagreements"] += 1 if result.verify_disagrees else 0
            log(f"  seed {seed}: {result.summary()}")
            if result.failed and not args.no_shrink:
                shortest = runner.shrink(seed, moves)
                log(f"  seed {seed} still fails with: {' '.join(map(str, shortest))}")
    finally:
        spark.stop()
        if broker is not None:
            broker.stop()
    print(
        f"ops-random: sink={args.sink} tables={args.tables} sequences={len(runs)} "
        f"moves={totals['moves']} "
        f"lost={totals['lost']} doubled={totals['doubled']} stuck={totals['stuck']} "
        f"verify_disagreements={totals['verify_disagreements']}",
        flush=True,
    )
    failed = totals["lost"] + totals["doubled"] + totals["stuck"] + totals["verify_disagreements"]
    return 1 if failed else 0


if __name__ == "__main__":
    from kafka_delta.runtime.process_exit import run_and_exit  # the real exit status, see there

    run_and_exit(lambda: main(sys.argv[1:]))
