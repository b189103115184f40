"""What the tables must hold, from what was produced and what the operator did: the harness's
independent model. It never asks the engine: it knows each record it produced (a good event by
its id, a bad record by its bytes), where Kafka put it, which tables it reaches, and how many
times it must be in each, as a range: a record the operator skipped while a run was live may or
may not have been read first (0 or 1), and once Delta log cleanup took the reset's commit it may
be read after all (the run says so); one the operator rewound over is read once more (+1); a
table deleted and read again from Kafka's earliest offsets holds what Kafka holds once.

Keys: ``("id", n)`` for a good event with id n (a row of the tables it is routed to);
``("bad", bytes)`` for a bad record (a row of the dead-letter table, by its value). A slot is
one record in one table: ``(table, key)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

Key = tuple[str, object]
Slot = tuple[str, Key]  # (table, key)


@dataclass
class Record:
    key: Key
    topic: str
    generation: int  # the topic's generation: 0, then 1 after it was deleted and created again
    partition: int
    offset: int
    # How many times it must be in each table it reaches: table -> [least, most].
    expect: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Model:
    records: dict[Key, Record] = field(default_factory=dict)
    next_id: int = 0
    next_bad: int = 0
    # Slots the operator skipped: once Delta log cleanup took the reset's commit, a run that
    # resumes where the rows end reads them again, and says so (offsets.stored.from_the_rows).
    skipped: set[Slot] = field(default_factory=set)
    # Of those, the ones log cleanup let be read once more than before: found in their table,
    # they were read again, which the run must have said (see compare).
    loosened: set[Slot] = field(default_factory=set)

    def add(self, record: Record) -> None:
        assert record.key not in self.records, record.key
        self.records[record.key] = record

    def in_partition(self, topic: str, generation: int, partition: int) -> list[Record]:
        return [
            r
            for r in self.records.values()
            if (r.topic, r.generation, r.partition) == (topic, generation, partition)
        ]

    def slots(self) -> Iterable[tuple[Slot, Record, list[int]]]:
        for r in self.records.values():
            for table, bounds in r.expect.items():
                yield (table, r.key), r, bounds

    def skip(self, slots: Iterable[Slot], live_run: bool) -> None:
        """The operator moved the offsets past these records (not in these tables yet): never
        read, or (a run was live and may have read them first) read once."""
        for table, key in slots:
            self.records[key].expect[table] = [0, 1 if live_run else 0]
            self.skipped.add((table, key))

    def log_cleaned(self) -> None:
        """Delta log cleanup took the commits of the resets that skipped: each skipped record
        may be read once after all (nothing left tells it from a RESTORE's undone one)."""
        for table, key in self.skipped:
            bounds = self.records[key].expect[table]
            if bounds[1] == 0:
                self.loosened.add((table, key))
            bounds[1] = max(bounds[1], 1)

    def rewind(self, records: Iterable[Record]) -> None:
        """The operator moved the offsets back over ``records`` (all read): a good record is
        read and written once more into each table it reaches; a bad one's dead letter is not
        sent again (dead letters are idempotent by position, whatever reads the position
        again)."""
        for r in records:
            if r.key[0] == "id":
                for table, bounds in r.expect.items():
                    bounds[0] += 1
                    bounds[1] += 1
                    self.skipped.discard((table, r.key))
                    self.loosened.discard((table, r.key))

    def reread(
        self, table: str, held: Iterable[Record], maybe: Iterable[Record], dead: str
    ) -> None:
        """``table`` was deleted and read again from Kafka's earliest offsets: it holds each
        record Kafka ``held`` once, whatever skips and rewinds came before, and the bad ones
        among them are in the dead-letter table ``dead`` (once: by position); the records of
        ``maybe`` (topics out of the subscription then) are there once or not at all; nothing
        else is."""
        held, maybe = list(held), list(maybe)
        self.skipped = {slot for slot in self.skipped if slot[0] != table}
        self.loosened = {slot for slot in self.loosened if slot[0] != table}
        for r in self.records.values():
            if table in r.expect:
                r.expect[table] = [0, 0]
        for r in maybe:
            if table in r.expect:
                r.expect[table] = [0, 1]
            elif r.key[0] == "bad":
                r.expect[dead] = [r.expect[dead][0], 1]
        for r in held:
            if table in r.expect:
                r.expect[table] = [1, 1]
            elif r.key[0] == "bad":
                r.expect[dead] = [1, 1]

    def compare(
        self, counts: dict[Slot, int], said_read_again: bool = True
    ) -> tuple[list[Slot], list[Slot]]:
        """(lost, doubled): slots found fewer times than the model's least, and slots found
        more times than its most (or of a record never produced, or not routed there).
        ``said_read_again``: whether a run warned that it read records again past the rows;
        without that warning a loosened slot may not be found at all (read again silently)."""
        lost = [slot for slot, _, (lo, _hi) in self.slots() if counts.get(slot, 0) < lo]

        def most(table: str, key: Key) -> int:
            if not said_read_again and (table, key) in self.loosened:
                return 0
            return self.records[key].expect.get(table, [0, 0])[1]

        doubled = [
            (table, key)
            for (table, key), n in counts.items()
            if key not in self.records or n > most(table, key)
        ]
        return lost, doubled

    def exact(self, counts: dict[Slot, int]) -> bool:
        """Whether ``offsets verify`` must pass on tables that hold ``counts`` and that
        :meth:`compare` accepts: each record at most once in each table. Where the model's
        range says at most once (no rewind over the record) or at least twice (a rewind over a
        record read), that is the model's own verdict, since ``counts`` lies in the range. A
        range may allow both: a record skipped while a run was live may have been read first
        (0 or 1), and rewound over it is read once more (1 or 2). Which one happened is a race
        the model does not see, so the tables tell it: one copy is an exact table, two are not
        (seed 60614 on two tables: skip with a live run that had read none of them, then a
        rewind over them, left each once; taking the range's upper bound as the verdict
        called that table not exact while verify rightly passed)."""
        return all(n <= 1 for n in counts.values())
