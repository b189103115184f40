"""Where batches land, behind :class:`kafka_delta.engine.Sink`: one Delta commit per batch with
its rows, its txn and its offsets.

- :mod:`.delta_rs`: data files written by Spark's tasks, committed with delta-rs;
- :mod:`.delta_spark`: delta-spark's writer options and MERGE;
- :mod:`.dead_letters`: records the transform or the decoder rejected, in their own table;
- :mod:`.upsert`: each key's newest record of a batch, for MERGE.

The two sinks never import each other: what both use of the table (its folder, the side
folder, the promotion rule) is :mod:`kafka_delta.delta`'s.
"""
