"""Sequences of moves run against the model: each from its own seed, on its own topics and
table, checked after every move (nothing doubled), and at every point the pipeline has caught
up (nothing lost; ``offsets verify --against-kafka`` agrees with the model). A failing sequence
is shrunk, one move at a time, to the shortest that still fails."""

from __future__ import annotations

import random
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opslib.model import Model, Slot
from opslib.moves import Move, Stuck, apply, draw, run_to_end, stop_live
from opslib.world import World

# Every sequence starts from records on two topics, read once.
PROLOGUE = [Move("produce", (0, 60)), Move("produce", (1, 60)), Move("run")]
# Moves after which the pipeline has caught up with nothing live: the whole model is checked.
CAUGHT_UP = {"run", "race"}


@dataclass
class Result:
    moves: list[Move]
    done: int = 0
    lost: list[Slot] = field(default_factory=list)
    doubled: list[Slot] = field(default_factory=list)
    stuck: str | None = None
    verify_disagrees: str | None = None
    failed_at: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.doubled or self.stuck or self.verify_disagrees)

    def summary(self) -> str:
        if not self.failed:
            return "ok"
        parts = []
        if self.lost:
            parts.append(f"lost {len(self.lost)} (e.g. {self.lost[:3]})")
        if self.doubled:
            parts.append(f"doubled {len(self.doubled)} (e.g. {self.doubled[:3]})")
        if self.stuck:
            parts.append(f"stuck: {self.stuck[:500]}")
        if self.verify_disagrees:
            parts.append(f"verify disagrees: {self.verify_disagrees[:500]}")
        return f"after move {self.failed_at} ({self.moves[self.failed_at or 0]}): " + "; ".join(
            parts
        )


class Runner:
    def __init__(
        self,
        spark: Any,
        bootstrap: str,
        workdir: Path,
        sink: str,
        log: Callable,
        several: bool = False,
        kafka: bool = True,
    ) -> None:
        self.spark, self.bootstrap, self.workdir, self.sink, self.log = (
            spark,
            bootstrap,
            workdir,
            sink,
            log,
        )
        self.several = several  # a pipeline of several tables (world.ROUTES)
        self.kafka = kafka  # Apache Kafka, not the stand-in: aborted transactions are filtered

    def run(self, seed: int, moves: list[Move]) -> Result:
        """Run ``moves`` after the prologue on fresh topics and a fresh table."""
        name = f"s{seed}-{uuid.uuid4().hex[:6]}"
        world = World(
            self.spark,
            self.bootstrap,
            self.workdir,
            self.sink,
            name,
            self.log,
            self.several,
            self.kafka,
        )
        model = Model()
        rng = random.Random(seed)
        all_moves = [*PROLOGUE, *moves]
        result = Result(all_moves)
        try:
            for index, move in enumerate(all_moves):
                result.failed_at = index
                try:
                    note = apply(move, world, model, rng)
                except Stuck as exc:
                    result.stuck = str(exc)
                    return result
                result.notes.append(f"{move}: {note}")
                self.log(f"    {index:2d} {move}: {note}")
                self.check(world, model, result, exact=move.name in CAUGHT_UP)
                result.done = index + 1
                if result.failed:
                    return result
            result.failed_at = len(all_moves)
            self.finish(world, model, result)
            if result.failed:
                result.failed_at = len(all_moves) - 1
            return result
        except Exception:
            # The whole traceback in the work folder; its last lines (the error) in the result.
            (self.workdir / f"harness-failure-{name}.txt").write_text(traceback.format_exc())
            result.stuck = "the harness failed: " + traceback.format_exc()[-1500:]
            return result
        finally:
            try:
                stop_live(world)
            except Exception:
                pass
            world.close()

    def finish(self, world: World, model: Model, result: Result) -> None:
        """The end of a sequence: every topic subscribed again, caught up, checked whole."""
        try:
            stop_live(world)
            world.subscribed = list(world.topics)
            run_to_end(world, model)
        except Stuck as exc:
            result.stuck = f"at the end: {exc}"
            return
        self.check(world, model, result, exact=True)

    def check(self, world: World, model: Model, result: Result, exact: bool) -> None:
        counts = world.counts()
        lost, doubled = model.compare(counts, said_read_again=world.read_again.count > 0)
        result.doubled = doubled
        if not exact:
            return
        if world.live is not None:
            return
        # Records of a topic out of the subscription wait in Kafka: not lost (the end of the
        # sequence subscribes every topic again).
        result.lost = [s for s in lost if model.records[s[1]].topic in world.subscribed]
        lost = result.lost
        code, out = world.command(
            "offsets", "verify", "--against-kafka", "--config", world.config_file()
        )
        wanted = not lost and not doubled and model.exact(counts)
        if (code == 0) != wanted:
            verdict = "passes" if code == 0 else "fails"
            findings = [line for line in out.splitlines() if line.startswith(("FAIL", "error"))]
            (world.work / "verify.txt").write_text(out)
            result.verify_disagrees = (
                f"verify {verdict} where the model says the table is "
                f"{'exact' if wanted else 'not exact'}: {' | '.join(findings)[:1500]}"
            )

    def shrink(self, seed: int, moves: list[Move]) -> list[Move]:
        """The shortest sequence found, removing one move at a time, that still fails."""
        current = list(moves)
        changed = True
        while changed:
            changed = False
            for i in range(len(current)):
                candidate = current[:i] + current[i + 1 :]
                self.log(f"  shrinking: trying without move {i} ({current[i]})")
                if self.run(seed, candidate).failed:
                    current = candidate
                    changed = True
                    break
        return current


def sequence(seed: int, length: int, several: bool = False) -> list[Move]:
    return draw(random.Random(seed), length, several)
