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
  (``table maintain``, and the run's own compaction).

Neither sink imports the other: what they share lives here. Nothing here imports ``deltalake``
at module level (the cluster path imports none, I14): :mod:`.table_storage` takes delta-rs's
object store only where it opens a remote table's folder, for the embedded engine.
"""
