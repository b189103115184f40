"""Opens the embedded engine's stream: the config mapped onto the Python Kafka data source."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession

from kafka_delta.config import KafkaConfig
from kafka_delta.offsets.model import StoredOffsets, offsets_to_json, starting_offsets_option
from kafka_delta.runtime.spark_session import default_parallelism, redact_kafka_options
from kafka_delta.sources.kafka_datasource import SOURCE_NAME, KafkaDataSource

if TYPE_CHECKING:
    from kafka_delta.decoding.spec import DecodeSpec


def embedded_source_options(
    kafka: KafkaConfig,
    stored: StoredOffsets | None,
    read_tasks: int,
    decode: DecodeSpec | None = None,
    topic_ids: Mapping[str, str] | None = None,
    idle_poll_s: float | None = None,
) -> dict[str, str]:
    """Options of the ``kafka_embedded`` data source (:mod:`.kafka_datasource`) for ``kafka``;
    ``topic_ids``: Kafka's ids of the topics as the pipeline found them at start, which the
    source's planning holds every batch's metadata against; ``idle_poll_s``: the low-latency
    trigger's look for new records while none are waiting (``trigger.idle_poll_seconds``)."""
    extra = {k: v for k, v in kafka.client_config().items() if k != "bootstrap.servers"}
    options = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "subscribe": ",".join(kafka.topics),
        "startingOffsets": starting_offsets_option(kafka.starting_offsets),
        "failOnDataLoss": str(kafka.fail_on_data_loss).lower(),
        "pollTimeoutMs": str(int(kafka.poll_timeout_seconds * 1000)),
        "readTasks": str(read_tasks),
        "kafkaConfig": json.dumps(extra),
    }
    if kafka.max_records_per_trigger:
        options["maxRecordsPerTrigger"] = str(kafka.max_records_per_trigger)
    if decode is not None:
        options["decodeSpec"] = decode.to_json()
    if stored is not None:
        options["storedOffsets"] = json.dumps(offsets_to_json(stored.offsets))
    if topic_ids:
        options["topicIds"] = json.dumps(dict(sorted(topic_ids.items())))
    if idle_poll_s is not None:
        options["idlePollMs"] = str(max(1, round(idle_poll_s * 1000)))
    return options


class EmbeddedSource:
    """Python data source on confluent-kafka: needs no JVM connector jars."""

    new_partitions_start_at_stored_offsets = True
    follows_subscription_changes = True
    # Its planning reads the topics' ids with the partitions, in one metadata request per
    # batch, and stops the query on a topic recreated since (kafka_datasource).
    checks_topic_ids = True

    def __init__(self, kafka: KafkaConfig, idle_poll_s: float | None = None) -> None:
        self.kafka = kafka
        self.idle_poll_s = idle_poll_s

    def worker_modules(self, decode: DecodeSpec | None = None) -> tuple[str, ...]:
        """The read task's: the data source, confluent-kafka and the decoders."""
        from kafka_delta.decoding.decoder import decoder_modules

        read = ("confluent_kafka", KafkaDataSource.__module__)
        return read + (decoder_modules(decode) if decode is not None else ())

    def stream(
        self,
        spark: SparkSession,
        stored: StoredOffsets | None,
        resuming: bool = False,
        decode: DecodeSpec | None = None,
        topic_ids: Mapping[str, str] | None = None,
    ) -> DataFrame:
        # ``resuming`` changes nothing here: the stored offsets also start partitions new to
        # an existing checkpoint.
        spark.dataSource.register(KafkaDataSource)
        redact_kafka_options(spark)  # kafkaConfig holds kafka.client's secrets
        options = embedded_source_options(
            self.kafka, stored, default_parallelism(spark), decode, topic_ids, self.idle_poll_s
        )
        return spark.readStream.format(SOURCE_NAME).options(**options).load()
