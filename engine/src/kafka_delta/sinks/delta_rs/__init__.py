"""The delta-rs sink (:mod:`.sink`), the files its tasks write (:mod:`.file_writer`) and the
files Spark's own writer writes for it (:mod:`.jvm_writer`). The offsets read from a table with
delta-rs (tables of either sink) are the Delta layer's
(:mod:`kafka_delta.delta.rs_offset_store`)."""
