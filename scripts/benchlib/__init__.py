"""The parts of scripts/bench.py, one concern each (read in this order):

- :mod:`.cli`: the options;
- :mod:`.runner`: the orchestrator (project, broker, topics, one worker process per measurement);
- :mod:`.procs`: starting a worker process and, inside it, dispatching to its worker;
- :mod:`.kafka_io`, :mod:`.limits`: rows 1-3 (raw consume, raw Delta write, simple ingest);
- :mod:`.spark_run`: the generated pipeline (rows 4-6, the sweep, the memory runs);
- :mod:`.rows`: a row and the rates derived from its batches;
- :mod:`.sweep`: sweep sizes and the least-squares fit of batch cost;
- :mod:`.memory`: RSS from /proc (process tree; one process's VmRSS/VmHWM);
- :mod:`.startup`: start-up phases from the workers' log lines;
- :mod:`.report`: table, CSV, chart and the last line.
"""
