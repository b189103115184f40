"""The delta-spark sink (:mod:`.sink`), its offset store (:mod:`.offset_store`) and the copies of
its commit records kept beside the table for log cleanup (:mod:`.commit_copies`)."""
