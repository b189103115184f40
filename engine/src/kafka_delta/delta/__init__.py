"""The Delta table as both sinks, and the recovery beside them, stand on it: what is the
table's, or Delta's, rather than one sink's.

- :mod:`.locations`: a location is local (files) or remote (a URI), one rule for all;
- :mod:`.table_storage`: the table's folder as a file system, reached as delta-rs reaches it;
- :mod:`.side_folder`: where a pipeline keeps what is not Delta's (run leases, commit copies),
  reached through pyarrow alone;
- :mod:`.schema`: the type rules (the numbers by rank, in Arrow's types and Spark's; a type's
  loose identity; a batch's wider numbers against the table's narrower columns), the ones both
  sinks and the decoders' schema versions apply;
- :mod:`.maintenance`: compaction, vacuum and checkpoints on the engine that writes the table
  (``table maintain``, and the run's own compaction);
- :mod:`.spark_table`: the table through Spark alone, by catalog name or by path
  (:class:`~.spark_table.SparkTable`), and the one sentence for a table Spark cannot reach;
- :mod:`.spark_commit`: a pipeline's commit as delta-spark carries it (the fence txn and the
  record as writer options or session confs) and the refusals of a commit that lost a race;
- :mod:`.spark_offset_store`: the stored offsets read from the table's history through Spark
  (no txn reader, and why none is needed), and the delta-spark sink's offset store;
- :mod:`.commit_copies`: the delta-spark sink's copies of its commit records in the side
  folder, for log cleanup;
- :mod:`.rs_offset_store`: the table opened with delta-rs and the stored offsets read from it
  (tables of either sink), and the delta-rs sink's offset store.

The sinks (:mod:`kafka_delta.sinks`), the commands and recovery reach tables through these
modules; nothing here imports a sink. Neither sink imports the other: what they share lives
here. Nothing here imports ``deltalake`` at module level but :mod:`.rs_offset_store`, which the
cluster path never imports (I14; ``engine/tests/test_spark_only.py``): :mod:`.table_storage`
takes delta-rs's object store only where it opens a remote table's folder, for the embedded
engine.
"""
