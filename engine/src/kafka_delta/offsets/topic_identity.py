"""A topic deleted and created again under the same name is another topic (I5, I8).

Kafka gives every topic an id; the pipeline records the ids of its topics in each commit
(:attr:`.offsets.BatchCommit.topic_ids`). Stored offsets are positions in the topic they were
read from: applied to a recreated topic that already holds that many records, they would
silently skip its first records (Kafka's own data-loss check only sees offsets past the end).

So, where the table's commit recorded an id and Kafka now reports another:

- ``kafka.fail_on_data_loss: true`` (the default): the run stops before anything is read, in
  one sentence that says how to read the new topic;
- ``false``: the recreated topic's stored offsets are forgotten and it is read from its
  earliest offset; the commit records the partitions it moves backwards as ``rewound``.

After Delta log cleanup removed every commit that names the ids, they are read from what
survives it: a txn action per topic whose version is a digest of the id (delta-rs sink,
:func:`.model.topic_id_digest`) or the copy of the newest commit record (delta-spark sink).
Commits written before ids were recorded, and brokers that do not describe topic ids, carry no
id: nothing is compared then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from kafka_delta.offsets.model import StoredOffsets, same_topic_id


class TopicRecreatedError(RuntimeError):
    """A topic's Kafka id is not the one the table's stored offsets were read from."""


def recreated_while_running(topics: Sequence[str]) -> TopicRecreatedError:
    """The error of a run that saw ``topics`` deleted and created again while it read them
    (the embedded source's planning, or the batch function of a source that reads no ids)."""
    return TopicRecreatedError(
        f"topic(s) {', '.join(topics)} were deleted and created again while this run read "
        "them. Nothing of this batch was written; start the pipeline again (with "
        "kafka.fail_on_data_loss: false it reads the new topic from its first record)."
    )


def recreated_topics(
    stored: StoredOffsets | None, current: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """``{topic: (stored id, current id)}`` of the stored topics Kafka now knows by another id."""
    if stored is None or not stored.topic_ids:
        return {}
    return {
        topic: (old, current[topic])
        for topic, old in stored.topic_ids.items()
        if topic in current and not same_topic_id(old, current[topic]) and topic in stored.offsets
    }


def recreated_error(recreated: Mapping[str, tuple[str, str]]) -> TopicRecreatedError:
    """What a run with ``kafka.fail_on_data_loss: true`` stops with, and ``offsets verify``
    fails with, when the ``recreated`` topics (:func:`recreated_topics`) hold stored offsets."""
    names = ", ".join(f"{t} (id {old} then {new})" for t, (old, new) in sorted(recreated.items()))
    return TopicRecreatedError(
        f"topic(s) {names} were deleted and created again since the table stored their "
        "offsets: the stored offsets belong to the old topic, and the old topic's records "
        "after them are gone. Nothing was read or written. To read the new topic from its "
        "first record, set kafka.fail_on_data_loss: false (or reset its offsets with "
        "`offsets reset --topic <topic> --to-earliest --allow-rewind --execute`) and start "
        "again."
    )


def forget_recreated(
    stored: StoredOffsets,
    recreated: Mapping[str, tuple[str, str]],
    fail_on_data_loss: bool,
    earliest: Mapping[str, Mapping[int, int]],
) -> StoredOffsets:
    """``stored`` with the ``recreated`` topics at their ``earliest`` offsets (read from their
    first record), or :class:`TopicRecreatedError` when ``fail_on_data_loss`` forbids that."""
    if not recreated:
        return stored
    if fail_on_data_loss:
        raise recreated_error(recreated)
    offsets = {
        t: dict(earliest.get(t, {})) if t in recreated else parts
        for t, parts in stored.offsets.items()
    }
    return replace(stored, offsets=offsets)
