"""Decoding Kafka values (and keys) into typed columns before the transform sees them: JSON
against a schema file, Avro and Protobuf in Confluent's framing behind a Schema Registry.

:mod:`.spec` is what the driver hands the read tasks; :mod:`.resolve` builds it (the reader
schema, once per query); :mod:`.decoder` is the one decoder both engines run (the embedded
source in its read task, the cluster engine on a DataFrame through :mod:`.dataframe`), with the
format decoders (:mod:`.json_decoder`, :mod:`.avro_decoder`, :mod:`.protobuf_decoder`) and what
they share (:mod:`.columns`, Confluent's wire format in :mod:`.wire_format`, the Schema Registry
client in :mod:`.schema_registry`, each format's types in :mod:`.avro_types`,
:mod:`.protobuf_types`, :mod:`.json_types`, and schema versions in :mod:`.versions`);
:mod:`.envelope` unwraps Debezium change events and reads tombstones as deletes;
:mod:`.failures` reads its errors back out of Spark's exceptions.
"""
