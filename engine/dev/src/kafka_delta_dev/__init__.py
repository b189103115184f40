"""Development tools for a kafka_delta project, never part of its deployed wheel: the embedded
Kafka broker (:mod:`.broker`, Tansu), a development Schema Registry server
(:mod:`.schema_registry_server`), an S3 API on loopback (:mod:`.object_store`, moto's server),
the sample producer (:mod:`.produce`), crashes at the engine's named points (:mod:`.faults`)
and the pytest plugin whose fixtures start them for tests (:mod:`.pytest_plugin`). Every
server listens on 127.0.0.1 only and is stopped by its pid."""
