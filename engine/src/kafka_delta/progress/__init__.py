"""Each batch's figures (:mod:`.batch`) and who receives them (:mod:`.listeners`): the
JSON-lines progress file (:mod:`.log_file`) and Prometheus metrics (:mod:`.metrics`)."""
