"""Where batches land, behind :class:`kafka_delta.engine.Sink`: one Delta commit per batch with
its rows, its txn and its offsets.

- :mod:`.delta_rs`: data files written by Spark's tasks, committed with delta-rs;
- :mod:`.delta_spark`: delta-spark's writer options and MERGE;
- :mod:`.dead_letters`: records the transform or the decoder rejected, in their own table;
- :mod:`.upsert`: each key's newest record of a batch, for MERGE.

The two sinks never import each other: what both use of the table (its folder, the side
folder, the promotion rule), the table handles and offset stores of each, and the log readers
the commands share with them are :mod:`kafka_delta.delta`'s. Only
:mod:`kafka_delta.engine_factory` imports a sink (:mod:`.delta_rs`, :mod:`.delta_spark`).
"""
