"""Where batches land, behind :class:`kafka_delta.engine.Sink`: one Delta commit per batch with
its rows, its txn and its offsets.

- :mod:`.delta_rs`: data files written by Spark's tasks, committed with delta-rs;
- :mod:`.delta_spark`: delta-spark's writer options and MERGE.

What both sinks apply and the pipeline drives is beside them: the dead-letter queue
(:mod:`kafka_delta.dead_letters`) and the upsert rule (:mod:`kafka_delta.upsert`).

The two sinks never import each other: what both use of the table (its folder, the side
folder, the promotion rule), the table handles and offset stores of each, and the log readers
the commands share with them are :mod:`kafka_delta.delta`'s. Only
:mod:`kafka_delta.engine_factory` imports anything of this package.
"""
