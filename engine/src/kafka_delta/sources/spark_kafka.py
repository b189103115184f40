"""Spark's built-in ``kafka`` source, configured from the pipeline config.

Needs the spark-sql-kafka connector (built into Databricks Runtime; elsewhere
``spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>``).
Its offsets land in the checkpoint's offset log in the same ``{"topic": {"partition": next
offset}}`` JSON as the embedded source's, so the pipeline reads each batch's end offsets the
same way for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession

from kafka_delta.config import KafkaConfig
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.offsets.model import (
    EARLIEST,
    LATEST,
    Offsets,
    StartingOffsets,
    StoredOffsets,
    first_offset,
    offsets_to_json,
    starting_offsets_option,
)
from kafka_delta.runtime.spark_session import default_parallelism, redact_kafka_options

if TYPE_CHECKING:
    from kafka_delta.decoding.spec import DecodeSpec


def starting_offsets(
    stored: Offsets, partitions: Mapping[str, list[int]], default: StartingOffsets
) -> dict[str, dict[str, int]]:
    """startingOffsets JSON for a new checkpoint, by the pipeline's one rule of where a
    partition first starts (:func:`..offsets.first_offset`) written in Spark's codes: the
    stored offset of every subscribed partition; one with none stored yet at its earliest
    offset (-2) once the pipeline has stored offsets (a topic or partition added, as Spark
    starts new partitions of a running query), or where ``default`` (``kafka.starting_offsets``)
    puts it on the pipeline's very first start.

    Spark requires every partition of the subscription in the JSON, and it only reads this
    option when the checkpoint is new; offsets of topics no longer subscribed are left out.
    """
    return offsets_to_json(
        {
            topic: {
                p: first_offset(
                    topic, p, stored=stored, starting=default, earliest=EARLIEST, latest=LATEST
                )
                for p in parts
            }
            for topic, parts in partitions.items()
        }
    )


# How long the Java client waits for one request, and for one call (the driver's metadata and
# offset lookups, a read task's position lookups): Kafka's defaults are 30 s and 60 s, and
# Spark's source tries each lookup 3 times (``fetchOffset.numRetries``), so a run noticed an
# outage 3 minutes after it began. A run rides an outage out from its checkpoint
# (kafka_delta.kafka.outage), so noticing it in about 30 s costs nothing: a request that times
# out fails the attempt, never a record (a position Kafka did not give is never guessed).
# Spark's retries stay as they are: they also ask again for a latest offset that went
# backwards (KAFKA-7703), and with fewer of them such an answer would reach Spark's data-loss
# check (failOnDataLoss). ``kafka.jvm_client`` overrides either timeout.
JVM_REQUEST_TIMEOUT_MS = 10_000
JVM_API_TIMEOUT_MS = 10_000


def jvm_timeouts(kafka: KafkaConfig) -> dict[str, str]:
    """The Java client's timeouts and the read task's poll timeout, as options of Spark's
    ``kafka`` format: short enough that an outage ends an attempt in seconds, and the poll
    as long as ``kafka.poll_timeout_seconds``, as the embedded source's read task waits.

    The client refuses a ``default.api.timeout.ms`` below ``request.timeout.ms``: one set in
    ``jvm_client`` lifts the other.
    """
    request = int(float(kafka.jvm_client.get("request.timeout.ms", JVM_REQUEST_TIMEOUT_MS)))
    return {
        "kafka.request.timeout.ms": str(request),
        "kafka.default.api.timeout.ms": str(max(JVM_API_TIMEOUT_MS, request)),
        "kafkaConsumer.pollTimeoutMs": str(int(kafka.poll_timeout_seconds * 1000)),
    }


def spark_kafka_options(
    kafka: KafkaConfig, starting: str | Mapping[str, Mapping[str, int]], min_partitions: int
) -> dict[str, str]:
    """Options of Spark's ``kafka`` format for ``kafka``, starting at ``starting``."""
    options = {
        # Only committed records, planned up to the last stable offset, as the embedded source
        # does: the Java client's default (read_uncommitted) reads aborted and open
        # transactions, so a producer that aborts and retries would land twice.
        "kafka.isolation.level": "read_committed",
        **jvm_timeouts(kafka),
        **kafka.jvm_client_options(),
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "subscribe": ",".join(kafka.topics),
        "startingOffsets": starting_offsets_option(starting),
        # I5: offsets Kafka no longer has fail the query instead of being skipped silently.
        "failOnDataLoss": str(kafka.fail_on_data_loss).lower(),
        # The same columns as the embedded source (and the dead-letter table) see.
        "includeHeaders": "true",
    }
    if kafka.fail_on_data_loss:
        options["minPartitions"] = str(min_partitions)
    # else one task per Kafka partition: with failOnDataLoss off, two tasks reading pieces of
    # one partition past records Kafka deleted failed the batch with "KafkaConsumer is not safe
    # for multi-threaded access" (Spark 4.2's kafka source resets its consumer on the offset
    # out of range; seen on Apache Kafka 4.1, 2 runs in 3 of test_real_kafka's case).
    if kafka.max_records_per_trigger:
        options["maxOffsetsPerTrigger"] = str(kafka.max_records_per_trigger)
    return options


class SparkKafkaSource:
    """Spark's built-in Kafka source; the consumer group is never used for reading (Spark
    assigns partitions itself and keeps offsets in the checkpoint)."""

    new_partitions_start_at_stored_offsets = False
    follows_subscription_changes = False
    # Spark's source plans in the JVM and reads no topic ids: the pipeline's batch function
    # asks Kafka for them every batch.
    checks_topic_ids = False

    def __init__(self, kafka: KafkaConfig, admin: KafkaAdmin | None = None) -> None:
        self.kafka = kafka
        self._admin = admin

    def starting(
        self, stored: StoredOffsets | None, resuming: bool = False
    ) -> str | dict[str, dict[str, int]]:
        """startingOffsets: Kafka is asked for the partitions only when Spark will read the
        answer (a new checkpoint resuming from stored offsets); a checkpoint that already
        holds a plan ignores the option, so its restarts need no librdkafka client at all."""
        if resuming or (stored is None and isinstance(self.kafka.starting_offsets, str)):
            return self.kafka.starting_offsets
        admin = self._admin or KafkaAdmin(self.kafka.client_config())
        partitions = admin.partitions(self.kafka.topics)
        held = stored.offsets if stored is not None else {}
        return starting_offsets(held, partitions, self.kafka.starting_offsets)

    def worker_modules(self, decode: DecodeSpec | None = None) -> tuple[str, ...]:
        """Spark's kafka source reads in the JVM; only decoding (an Arrow UDF) runs Python."""
        from kafka_delta.decoding.decoder import decoder_modules

        return decoder_modules(decode) if decode is not None else ()

    def stream(
        self,
        spark: SparkSession,
        stored: StoredOffsets | None,
        resuming: bool = False,
        decode: DecodeSpec | None = None,
        topic_ids: Mapping[str, str] | None = None,
    ) -> DataFrame:
        parallelism = default_parallelism(spark)
        redact_kafka_options(spark)  # kafka.<key> options hold kafka.jvm_client's secrets
        options = spark_kafka_options(self.kafka, self.starting(stored, resuming), parallelism)
        df = self.read_stream(spark, options)
        if decode is None:
            return df
        # The same decoder as the embedded source's read task, in the executors.
        from kafka_delta.decoding.dataframe import decode_frame

        return decode_frame(df, decode)

    def read_stream(self, spark: SparkSession, options: dict[str, str]) -> DataFrame:
        """Spark's ``kafka`` format with ``options``: the one step a stand-in of Spark's kafka
        source (kafka_delta_dev.spark_kafka_standin, for tests without the connector) replaces."""
        return spark.readStream.format("kafka").options(**options).load()
