"""The delta-spark sink (:mod:`.sink`), its offset store (:mod:`.offset_store`), the table as
Spark reaches it by name or path (:mod:`.table`), the commits that widen its columns
(:mod:`.widening`) and the copies of its commit records kept beside the checkpoint for log
cleanup (:mod:`.commit_copies`): Delta through Spark alone."""
