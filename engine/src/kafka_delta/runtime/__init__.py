"""How a run lives: its query, started again after the failures a run rides out
(:mod:`.run_loop`), its own compaction (:mod:`.compaction`), its Spark session
(:mod:`.spark_session`, :mod:`.connectors`, :mod:`.python_launcher`, :mod:`.python_workers`,
:mod:`.jvm_archive`), the checks before it starts (:mod:`.preflight`), its process
(:mod:`.graceful_stop`, :mod:`.process_exit`, :mod:`.processes`), the line a failure ends with
(:mod:`.task_errors`) and the local services it may find (:mod:`.local_services`)."""
