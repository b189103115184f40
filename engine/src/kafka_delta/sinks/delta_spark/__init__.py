"""The delta-spark sink (:mod:`.sink`) and the commits that widen its columns
(:mod:`.widening`): Delta through Spark alone. The table as Spark reaches it, its offset store
and the commit copies beside the checkpoint are the Delta layer's
(:mod:`kafka_delta.delta.spark_table`, :mod:`kafka_delta.delta.spark_offset_store`,
:mod:`kafka_delta.delta.commit_copies`)."""
