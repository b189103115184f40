"""What the tables must hold, from what was produced and what the operator did: the harness's
independent model. It never asks the engine: it knows each record it produced (a good event by
its id, a bad record by its bytes), where Kafka put it, and how many times each must be in the
tables, as a range: a record the operator skipped while a run was live may or may not have
been read first (0 or 1), one the operator rewound over is read once more (+1).

Keys: ``("id", n)`` for a good event with id n (a row of the main table); ``("bad", bytes)`` for
a bad record (a row of the dead-letter table, by its value).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

Key = tuple[str, object]


@dataclass
class Record:
    key: Key
    topic: str
    generation: int  # the topic's generation: 0, then 1 after it was deleted and created again
    partition: int
    offset: int
    lo: int = 1
    hi: int = 1


@dataclass
class Model:
    records: dict[Key, Record] = field(default_factory=dict)
    next_id: int = 0
    next_bad: int = 0

    def add(self, record: Record) -> None:
        assert record.key not in self.records, record.key
        self.records[record.key] = record

    def in_partition(self, topic: str, generation: int, partition: int) -> list[Record]:
        return [
            r
            for r in self.records.values()
            if (r.topic, r.generation, r.partition) == (topic, generation, partition)
        ]

    def skip(self, records: Iterable[Record], live_run: bool) -> None:
        """The operator moved the offsets past ``records`` (not read yet): never read, or
        (a run was live and may have read them first) read once."""
        for r in records:
            r.lo, r.hi = 0, (1 if live_run else 0)

    def rewind(self, records: Iterable[Record]) -> None:
        """The operator moved the offsets back over ``records`` (all read): a good record is
        read and written once more; a bad one's dead letter is not sent again (dead letters are
        idempotent by position, whatever reads the position again)."""
        for r in records:
            if r.key[0] == "id":
                r.lo, r.hi = r.lo + 1, r.hi + 1

    def compare(self, counts: dict[Key, int]) -> tuple[list[Key], list[Key]]:
        """(lost, doubled): records found fewer times than the model's least, and records found
        more times than its most (or not produced at all)."""
        lost = [k for k, r in self.records.items() if counts.get(k, 0) < r.lo]
        doubled = [k for k, n in counts.items() if k not in self.records or n > self.records[k].hi]
        return lost, doubled

    def exactly_once(self) -> bool:
        """Whether the model wants every record in the tables at most once (no rewind made a
        second copy): then ``offsets verify`` must pass on a table the model accepts."""
        return all(r.hi <= 1 for r in self.records.values())
