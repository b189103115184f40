"""The moves an operator (and the world) makes, each with what it changes in the model.

A move is drawn once, with its parameters, from the sequence's seed (so a sequence replays, and
shrinks, move by move); where it does not apply in the state it meets (no table yet, no live
run to stop...), it does nothing and says so. A move that runs the pipeline acts as an operator
on the outcome: a run fenced by another run or by the operator's own move is started again (the
sentence says so), a recreated topic is reset to its first record (the sentence says how); any
other failure, or a second failure after that, is a stuck state.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from kafka_delta_dev.faults import armed

from opslib.model import Model
from opslib.world import DEAD, Ended, World

# Driver-side crash points a run can stop at in this process (kafka_delta_dev.faults).
CRASH_POINTS = (
    "before_delta_commit",
    "after_dead_letters",
    "after_data_files",
    "after_delta_commit",
)


@dataclass(frozen=True)
class Move:
    name: str
    args: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})" if self.args else self.name


class Stuck(Exception):
    """A run failed in a way no operator move explains, or failed again after the fix."""


# -- helpers ----------------------------------------------------------------------------------


def run_to_end(world: World, model: Model) -> None:
    """Run until caught up, acting on each expected outcome as its sentence says."""
    for _ in range(4):
        result = world.run_once()
        if result.outcome is None:
            world.catch_ups.append(world.latest())
            return
        world.log(f"    run ended: {result.outcome}: {result.text[:300]}")
        if result.outcome == "TopicRecreatedError":
            follow_recreated_sentence(world, result.text)
        elif result.outcome not in ("FencingError", "InjectedCrash"):
            raise Stuck(result.text)
    raise Stuck("four runs in a row did not catch up")


def follow_recreated_sentence(world: World, sentence: str) -> None:
    """The run stopped on a topic deleted and created again; its sentence says to reset the
    topic's offsets to its first record."""
    for topic in world.subscribed:
        if topic in sentence:
            code, out = world.command(
                "offsets", "reset", "--config", world.config_file(), "--topic", topic,
                "--to-earliest", "--allow-rewind", "--no-run-check", "--execute",
            )  # fmt: skip
            if code != 0:
                raise Stuck(f"offsets reset of recreated topic {topic}: {out[-1000:]}")
            world.after_reset()


def wait_caught_up(world: World, model: Model, timeout: float = 120.0) -> None:
    """A live run has read everything the model wants of the subscribed topics."""
    import time

    deadline = time.monotonic() + timeout
    wanted = {
        slot: lo for slot, r, (lo, _hi) in model.slots() if r.topic in world.subscribed and lo >= 1
    }
    while True:
        counts = world.counts()
        if all(counts.get(slot, 0) >= lo for slot, lo in wanted.items()):
            world.catch_ups.append(world.latest())
            return
        if world.live is None or world.live.failure:
            # Ended (fenced by an operator's move): the operator starts it again.
            stop_live(world)
            run_to_end(world, model)
            return
        if time.monotonic() > deadline:
            raise Stuck(f"the continuous run did not catch up within {timeout:.0f} s")
        time.sleep(0.3)


def catch_up(world: World, model: Model) -> None:
    if world.live is not None:
        wait_caught_up(world, model)
    else:
        run_to_end(world, model)


def keep_records_coming(world: World, model: Model, rng: random.Random) -> None:
    """A live run notices an operator's move at its next batch: records keep arriving."""
    if world.live is not None:
        world.produce_good(model, world.subscribed[0], 5, rng)


def stop_live(world: World) -> None:
    """Stop the continuous run; one that ended on a recreated topic is followed as its sentence
    says (as run_to_end does)."""
    result = world.stop_continuous()
    if result.outcome == "TopicRecreatedError":
        follow_recreated_sentence(world, result.text)
    elif result.outcome not in (None, "FencingError", "InjectedCrash"):
        raise Stuck(result.text)


# -- the moves ----------------------------------------------------------------------------------


def produce(world: World, model: Model, rng: random.Random, topic: int, count: int) -> str:
    name = world.topics[topic % len(world.topics)]
    world.produce_good(model, name, count, rng)
    return f"{count} events to {name}"


def produce_txn(world: World, model: Model, rng: random.Random, topic: int, count: int) -> str:
    """Records in one committed transaction, its commit markers leaving offsets without
    records; before it, on Apache Kafka, as many in a transaction that is aborted, whose records
    must never land (Kafka filters them for read_committed readers; the stand-in Tansu hands
    them over, so on it the aborted half is left out). One move, not two, so that the
    sequences the seeds draw stay the ones they were searched for."""
    name = world.topics[topic % len(world.topics)]
    if world.kafka:
        world.produce_aborted(model, name, count, rng)
    world.produce_good(model, name, count, rng, transactional=True)
    aborted = f"{count} in an aborted one, then " if world.kafka else ""
    return f"{aborted}{count} events to {name} in one transaction"


def produce_bad(world: World, model: Model, rng: random.Random, topic: int, count: int) -> str:
    name = world.topics[topic % len(world.topics)]
    world.produce_bad(model, name, count)
    return f"{count} bad records to {name}"


def run(world: World, model: Model, rng: random.Random) -> str:
    stop_live(world)
    run_to_end(world, model)
    return "caught up"


def start(world: World, model: Model, rng: random.Random) -> str:
    if world.live is not None:
        return "already running"
    world.start_continuous()
    return "continuous run started"


def stop(world: World, model: Model, rng: random.Random) -> str:
    if world.live is None:
        return "no run to stop"
    stop_live(world)
    return "continuous run stopped"


def crash(world: World, model: Model, rng: random.Random, point: int, after: int) -> str:
    """A run that dies at a named point in a batch (the state a SIGKILL there leaves)."""
    stop_live(world)
    name = CRASH_POINTS[point % len(CRASH_POINTS)]
    # Records arrive first, so that the run has a batch to die in.
    world.produce_good(model, world.subscribed[0], 30 + after % 60, rng)
    with armed(name, after % 2):
        result = world.run_once()
    if result.outcome not in (None, "InjectedCrash", "FencingError", "TopicRecreatedError"):
        raise Stuck(result.text)
    if result.outcome == "TopicRecreatedError":
        follow_recreated_sentence(world, result.text)
    return f"crashed at {name} after {after % 2} passes" if result.outcome else "caught up first"


def reset(world: World, *argv: str) -> tuple[int, str]:
    """``offsets reset``, run again as its sentence says when a live run's commit landed
    between its plan and its commit ("the table changed while resetting ... run the reset
    again"); a reset that keeps losing that race is a stuck state."""
    for _ in range(4):
        code, out = world.command("offsets", "reset", "--config", world.config_file(), *argv)
        if code == 0 or "the table changed while resetting" not in out:
            return code, out
        world.log("    reset lost a race with the live run's commit: running it again")
    return code, out


def delete_checkpoint(world: World, model: Model, rng: random.Random) -> str:
    stop_live(world)
    world.delete_checkpoint()
    return "checkpoint deleted"


def skip(world: World, model: Model, rng: random.Random, count: int, live: int) -> str:
    """Records arrive, and the operator skips them: ``offsets reset --to-latest --allow-skip``,
    with the continuous run live or not."""
    if live % 2 and world.live is None:
        world.start_continuous()
    if world.live is None:
        catch_up(world, model)
    name = world.subscribed[count % len(world.subscribed)]
    world.produce_good(model, name, count, rng)
    code, out = reset(
        world, "--topic", name, "--to-latest", "--allow-skip", "--no-run-check", "--execute"
    )
    if code != 0:
        if "holds no commits" in out or "does not exist" in out:
            return f"no table to reset yet: {out.strip()[-200:]}"
        raise Stuck(f"offsets reset --to-latest: {out[-1500:]}")
    # Everything of the topic not in a table yet is skipped there: these records, and any the
    # pipeline had not read into it (a RESTORE undid them, a run was stopped before them).
    counts = world.counts()
    unread = [
        slot
        for slot, r, (lo, _hi) in model.slots()
        if r.topic == name and r.generation == world.generation[name] and counts.get(slot, 0) < lo
    ]
    model.skip(unread, live_run=world.live is not None)
    world.after_reset()
    return f"{count} records of {name} skipped ({'live run' if world.live else 'no run'})"


def rewind(world: World, model: Model, rng: random.Random, back: int, live: int) -> str:
    """The operator reads again from an earlier catch-up point:
    ``offsets reset --to-offsets ... --allow-rewind``, with the continuous run live or not."""
    catch_up(world, model)
    if len(world.catch_ups) < 2:
        return "no earlier catch-up point"
    point = world.catch_ups[-2 - back % (len(world.catch_ups) - 1)]
    now = world.latest()
    moves = {
        tp: o
        for tp, o in point.items()
        if tp[0] in world.subscribed and o < now.get(tp, o) and tp in now
    }
    if not moves:
        return "nothing to rewind"
    if live % 2 and world.live is None:
        world.start_continuous()
    elif not live % 2:
        stop_live(world)
    spec = ",".join(f"{t}:{p}={o}" for (t, p), o in sorted(moves.items()))
    code, out = reset(world, "--to-offsets", spec, "--allow-rewind", "--no-run-check", "--execute")
    if code != 0:
        raise Stuck(f"offsets reset --to-offsets: {out[-1500:]}")
    model.rewind(
        r
        for r in model.records.values()
        if (r.topic, r.partition) in moves
        and r.generation == world.generation[r.topic]
        and r.offset >= moves[(r.topic, r.partition)]
    )
    world.after_reset()
    keep_records_coming(world, model, rng)
    return f"rewound {spec} ({'live run' if world.live else 'no run'})"


def restore(world: World, model: Model, rng: random.Random, back: int, live: int) -> str:
    """Delta's RESTORE of one table to an earlier commit of the pipeline, by the sink's own
    engine, with the continuous run live or not. Only to versions after the newest reset or
    topic re-creation: a RESTORE undoing those moves the operator's own choices back, which the
    model does not follow (the pipeline does)."""
    if not live % 2:
        stop_live(world)
    table = world.tables[(back + live) % len(world.tables)]
    candidates = [v for v in world.pipeline_versions(table) if v > world.restore_floor[table]]
    if len(candidates) < 2:
        return f"no commit of {table} to restore to"
    version = candidates[-2 - back % (len(candidates) - 1)]
    world.restore(table, version)
    keep_records_coming(world, model, rng)
    where = f"{table} " if world.several else ""
    return f"{where}restored to version {version} ({'live run' if world.live else 'no run'})"


def clean_log(world: World, model: Model, rng: random.Random) -> str:
    world.clean_up_the_log()
    model.log_cleaned()
    return "log cleaned up"


def maintain(world: World, model: Model, rng: random.Random, full: int) -> str:
    if all(world.table_version(t) < 0 for t in world.tables):
        return "no table yet"
    argv = ["table", "maintain", "--config", world.config_file()]
    if full % 2:
        argv.append("--full")
    code, out = world.command(*argv)
    if code != 0:
        raise Stuck(f"table maintain: {out[-1500:]}")
    return "table maintain" + (" --full" if full % 2 else "")


def add_topic(world: World, model: Model, rng: random.Random, topic: int) -> str:
    name = world.topics[topic % len(world.topics)]
    if name in world.subscribed:
        return f"{name} already subscribed"
    stop_live(world)
    world.subscribed = [*world.subscribed, name]
    return f"{name} added"


def remove_topic(world: World, model: Model, rng: random.Random, topic: int) -> str:
    name = world.topics[topic % len(world.topics)]
    if name not in world.subscribed or len(world.subscribed) == 1:
        return f"{name} not removable"
    stop_live(world)
    world.subscribed = [t for t in world.subscribed if t != name]
    return f"{name} removed"


def recreate_topic(world: World, model: Model, rng: random.Random, topic: int, count: int) -> str:
    """A topic deleted and created again (after the pipeline read all of it), then written."""
    name = world.subscribed[topic % len(world.subscribed)]
    catch_up(world, model)
    stop_live(world)
    world.recreate(name)
    world.produce_good(model, name, count, rng)
    world.after_reset()
    return f"{name} deleted, created again and given {count} events"


def race(world: World, model: Model, rng: random.Random) -> str:
    """Two runs of the pipeline at once (a retried job beside a live one): on two checkpoints,
    where the Delta fence lets one commit on given offsets, or on one checkpoint (half the
    time), where the run lease lets only one start; then each checkpoint started again."""
    import threading

    stop_live(world)
    same = rng.random() < 0.5
    checkpoints = (world.checkpoint, world.checkpoint if same else world.other_checkpoint)
    allowed = {None, "FencingError", "TopicRecreatedError"}
    if same:
        allowed.add("CheckpointInUseError")
    results: list[Ended] = []

    def one(checkpoint: str) -> None:
        results.append(world.run_once(world.config(checkpoint=checkpoint)))

    threads = [threading.Thread(target=one, args=(c,)) for c in checkpoints]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for r in results:
        if r.outcome not in allowed:
            raise Stuck(r.text)
        if r.outcome == "CheckpointInUseError" and "Nothing was read or written" not in r.text:
            raise Stuck(f"a run refused by the lease did not say it left everything: {r.text}")
    for checkpoint in dict.fromkeys((world.other_checkpoint, world.checkpoint)):
        result = world.run_once(world.config(checkpoint=checkpoint))
        if result.outcome == "TopicRecreatedError":
            follow_recreated_sentence(world, result.text)
        elif result.outcome not in (None, "FencingError"):
            raise Stuck(result.text)
    run_to_end(world, model)
    where = "one checkpoint" if same else "two checkpoints"
    return f"raced on {where}: {sorted(str(r.outcome) for r in results)}"


def add_partitions(world: World, model: Model, rng: random.Random, topic: int) -> str:
    name = world.topics[topic % len(world.topics)]
    return f"{name} gained a partition" if world.add_partitions(name) else "refused by the broker"


def delete_table(world: World, model: Model, rng: random.Random, table: int) -> str:
    """One table of several deleted (by mistake, or to fill it again). On a checkpoint with
    committed batches the next run must refuse with its sentence (restore the table, or delete
    the checkpoint to re-read it from Kafka's earliest offsets, the other tables passing over what
    they hold), and the operator does the second; on a new checkpoint the run does that at
    once. Either way the table then holds what Kafka holds, once."""
    name = world.tables[table % len(world.tables)]
    if world.table_version(name) < 0:
        return f"no table {name} yet"
    stop_live(world)
    progress = world.checkpoint_has_progress()
    world.delete_table(name)
    current = [r for r in model.records.values() if r.generation == world.generation[r.topic]]
    model.reread(
        name,
        held=[r for r in current if r.topic in world.subscribed],
        maybe=[r for r in current if r.topic not in world.subscribed],
        dead=DEAD,
    )
    if not progress:
        run_to_end(world, model)
        return f"{name} deleted (a new checkpoint): read again"
    result = world.run_once()
    advice = "delete the checkpoint to re-read"
    if result.outcome != "CheckpointMismatchError" or advice not in result.text:
        raise Stuck(f"the run after table {name} was deleted: {result.outcome}: {result.text}")
    world.delete_checkpoint()
    run_to_end(world, model)
    return f"{name} deleted; the checkpoint deleted as the run said; {name} read again"


# name -> (function, weight, number of integer arguments)
MOVES: dict[str, tuple[Callable[..., str], int, int]] = {
    "produce": (produce, 8, 2),
    "produce_bad": (produce_bad, 3, 2),
    "produce_txn": (produce_txn, 1, 2),
    "run": (run, 6, 0),
    "start": (start, 3, 0),
    "stop": (stop, 2, 0),
    "crash": (crash, 4, 2),
    "delete_checkpoint": (delete_checkpoint, 2, 0),
    "skip": (skip, 2, 2),
    "rewind": (rewind, 2, 2),
    "restore": (restore, 3, 2),
    "clean_log": (clean_log, 2, 0),
    "maintain": (maintain, 2, 1),
    "add_topic": (add_topic, 1, 1),
    "remove_topic": (remove_topic, 1, 1),
    "recreate_topic": (recreate_topic, 1, 2),
    "race": (race, 1, 0),
    "add_partitions": (add_partitions, 1, 1),
}
# A world of several tables has one move more.
MOVES_OF_SEVERAL = {**MOVES, "delete_table": (delete_table, 2, 1)}


def moves_of(several: bool) -> dict[str, tuple[Callable[..., str], int, int]]:
    return MOVES_OF_SEVERAL if several else MOVES


def draw(rng: random.Random, count: int, several: bool = False) -> list[Move]:
    """A sequence of ``count`` moves, with their arguments, from ``rng``."""
    offered = moves_of(several)
    names = list(offered)
    weights = [offered[n][1] for n in names]
    moves = []
    for _ in range(count):
        name = rng.choices(names, weights)[0]
        args = tuple(rng.randrange(10, 120) for _ in range(offered[name][2]))
        moves.append(Move(name, args))
    return moves


MOVE_TEXT = re.compile(r"\s*([a-z_]+)(?:\(([\d,\s]*)\))?\s*")


def parse(text: str) -> list[Move]:
    """Moves as the harness prints them (``skip(117, 61) rewind(32, 12) run``), so that a
    shrunk sequence replays as it was printed; ValueError names the first part that is not a
    move with its number of arguments."""
    text, moves, at = text.strip(), [], 0
    while at < len(text):
        match = MOVE_TEXT.match(text, at)
        if not match or match.end() == at:
            raise ValueError(f"not a move at {text[at : at + 30]!r}")
        name, args = match.group(1), match.group(2)
        if name not in MOVES_OF_SEVERAL:
            raise ValueError(f"{name!r} is not a move (moves: {', '.join(MOVES_OF_SEVERAL)})")
        values = tuple(int(a) for a in (args or "").split(",") if a.strip())
        if len(values) != MOVES_OF_SEVERAL[name][2]:
            raise ValueError(
                f"{name} takes {MOVES_OF_SEVERAL[name][2]} arguments, not {len(values)}"
            )
        moves.append(Move(name, values))
        at = match.end()
    return moves


def apply(move: Move, world: World, model: Model, rng: random.Random) -> str:
    function = MOVES_OF_SEVERAL[move.name][0]
    return function(world, model, rng, *move.args)
