"""Each batch's figures (:mod:`.batch`) and who receives them (:mod:`.listeners`): the
JSON-lines progress file (:mod:`.log_file`) and Prometheus metrics (:mod:`.metrics`); a run's
progress (:mod:`.run_progress`: the commit back, the progress line, the run's summary,
:mod:`.summary`), reported off the batch's path (:mod:`.reporter`) or, under Spark Connect,
from the batch function's process (:mod:`.mailbox`)."""
