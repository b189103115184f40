"""The offsets a pipeline stores in its Delta table, and the rules that guard them.

- :mod:`.model`: Kafka offsets, the record each commit carries (:class:`~.model.BatchCommit`),
  the appId scheme and where a partition is first read (:func:`~.model.first_offset`);
- :mod:`.stored`: the one reader of the offsets in effect in a table (RESTOREs, log cleanup);
- :mod:`.history`: what a RESTORE undid;
- :mod:`.fencing`: where a batch may commit (I6);
- :mod:`.topic_identity`: a topic deleted and created again is another topic;
- :mod:`.run_positions`: where a run stands, where each of its batches begins, what it rewinds.
"""
