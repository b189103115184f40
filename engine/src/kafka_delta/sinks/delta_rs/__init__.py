"""The delta-rs sink (:mod:`.sink`), the files its tasks write (:mod:`.file_writer`) and the
offsets read from a table with delta-rs (:mod:`.offset_store`, for tables of either sink)."""
