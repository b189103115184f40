"""A Kafka outage as a run rides it out (``kafka.unavailable_timeout_seconds``).

Every Kafka call of a run fails the same way when the brokers stop answering: the driver's
metadata requests (:mod:`.admin`), the embedded source's planning (in Spark's planner process)
and its read tasks (``read_range``) raise :class:`~.admin.KafkaUnavailableError`, which reaches
the driver by itself or inside the text of Spark's ``StreamingQueryException``. Nothing of the
batch in flight is committed then: the Delta commit comes after its records were read, and
the commit-back hook only ever copies what a commit holds.

Spark's kafka source (the cluster engine) reads with the Java Kafka client, which raises no
``KafkaUnavailableError``: when the brokers stop answering, its calls end in Kafka's
``org.apache.kafka.common.errors.TimeoutException`` (the driver's offset lookups, "Timed out
waiting for a node assignment. Call: listNodes"; a read task's "Timeout of 10000ms expired
before the position for partition t-0 could be determined"), or Spark's own
``java.util.concurrent.TimeoutException: Cannot fetch record for offset ...`` (a read task's
poll that got nothing), which reach the driver in the text of the ``StreamingQueryException``
or Py4J error that ends the query. :func:`kafka_down` takes them for the same outage. Spark's
verdict that records are gone (``KAFKA_DATA_LOSS``, ``failOnDataLoss``) never is one, whatever
it carries: waiting would not bring them back, and I5 wants it said.

So the retry lives in one place, the run: the query that failed starts again from its
checkpoint after 1, 2, 4 ... 30 s, and Spark runs the planned batch again, exactly once (the
Delta commit is idempotent). Not in the read task: Spark retries a task only
``spark.task.maxFailures`` times (once in local mode), and a task cannot wait for the broker
longer than the whole query may. The run stops with one sentence naming the brokers once the
outage lasted ``kafka.unavailable_timeout_seconds``, counted from its first failure.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kafka_delta.decoding.failures import reported
from kafka_delta.kafka.admin import KafkaUnavailableError

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

FIRST_WAIT_S, LONGEST_WAIT_S = 1.0, 30.0


# The Java Kafka client's failures when no broker answers in time, as Spark's kafka source
# hands them on: Kafka's TimeoutException (any call: metadata, offsets, positions, fetches;
# the client retries transport errors until its timeout ends in this one), and the read task's
# poll that got nothing (Spark's KafkaDataConsumer.fetch). The message ends at the line's end,
# or where Spark appends the SQL state to it.
_JVM_OUTAGE = re.compile(
    r"(org\.apache\.kafka\.common\.errors\.TimeoutException: [^\n]*?"
    r"|java\.util\.concurrent\.TimeoutException: Cannot fetch record for offset [^\n]*?)"
    r"(?: SQLSTATE: \w+)?\s*(?:\n|$)"
)
# Spark's kafka source saying records are gone (its error class, and the option its message
# names): a decision of failOnDataLoss, never an outage.
_DATA_LOSS = ("KAFKA_DATA_LOSS", "failOnDataLoss")


# Spark's kafka source's verdict, in the text of the failure it ends a query with (a read task's
# KafkaIllegalStateException, or the driver's KAFKA_DATA_LOSS error class), and the reason line
# after it, which names the offsets it could not read.
_SPARK_LOST = "Some data may have been lost because they are not available in Kafka any more"
_SPARK_REASON = re.compile(r"\nReason: ([^\n]+)")


def records_lost(text: str) -> str | None:
    """The one sentence for records Spark's kafka source found gone from Kafka (retention,
    DeleteRecords) with ``kafka.fail_on_data_loss`` on, as the embedded source says it
    (:class:`~kafka_delta.sources.kafka_datasource.DataLossError`); None when ``text`` reports
    no such thing.

    >>> print(records_lost(
    ...     "KafkaIllegalStateException: Some data may have been lost because they are not "
    ...     "available in Kafka any more;\neither ...\nReason: Could not read records in offset "
    ...     "[75, 100) for topic partition t-0\nwith consumer group g"))  # doctest: +ELLIPSIS
    Kafka ... not read (Spark's kafka source: Could not read records in offset [75, 100) ...
    """
    at = text.find(_SPARK_LOST)
    if at < 0:
        return None
    found = _SPARK_REASON.search(text, at)
    reason = f" (Spark's kafka source: {found.group(1).strip()})" if found else ""
    return (
        f"Kafka no longer has records the pipeline has not read{reason}. Nothing was written. "
        "To skip them, set kafka.fail_on_data_loss: false and restart."
    )


def kafka_down(exc: BaseException) -> str | None:
    """Why Kafka is unavailable when ``exc`` says so, else None: the sentence of a
    ``KafkaUnavailableError`` that ``exc`` is or reports, or the Java Kafka client's timeout
    that Spark's kafka source failed with (in the text of a ``StreamingQueryException`` or a
    Py4J error), unless Spark says records were lost.

    >>> print(kafka_down(RuntimeError(
    ...     "[STREAM_FAILED] Query [id = 1] terminated with exception: org.apache.kafka."
    ...     "common.errors.TimeoutException: Call: listNodes SQLSTATE: XXKST\\n=== ...")))
    Spark's kafka source: org.apache.kafka.common.errors.TimeoutException: Call: listNodes
    """
    sentence = reported(exc, KafkaUnavailableError.__name__)
    if sentence is not None:
        return sentence
    return jvm_client_timeout(str(exc))


def jvm_client_timeout(text: str) -> str | None:
    """The first timeout of the Java Kafka client that ``text`` (a failure's text) reports, as
    one line; None when there is none, or when Spark reports lost records in it."""
    if any(marker in text for marker in _DATA_LOSS):
        return None
    found = _JVM_OUTAGE.search(text)
    return None if found is None else f"Spark's kafka source: {found.group(1).strip()}"


def got_through_a_trigger(query: StreamingQuery | None) -> bool | None:
    """Whether ``query`` (one start of the stream, now ended) got through a trigger, which ends
    an outage as a batch does: Spark reports the progress of every trigger that ran a batch,
    and of an idle one every ``spark.sql.streaming.noDataProgressEventInterval`` (the first at
    once), so a quiet topic's query reports some. A query started into an outage reports none:
    its first trigger waits on Kafka. False for a start that failed before the query ran; None
    when Spark cannot say (then the run goes by the time the query ran)."""
    if query is None:
        return False
    try:
        return bool(query.recentProgress)
    except Exception:  # a Connect server that no longer knows the query
        return None


class KafkaOutage:
    """One outage: from the first failure the run saw until a batch goes through again.

    >>> clock = iter([0.0, 3.0, 40.0]).__next__
    >>> outage = KafkaOutage("k:9092", 30, clock)
    >>> outage.next_wait(), outage.next_wait(), outage.next_wait()
    (1.0, 2.0, None)
    """

    def __init__(
        self,
        bootstrap_servers: str,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.timeout_s = timeout_s
        self._clock = clock
        self.started: float | None = None
        self.attempts = 0
        self._wait = FIRST_WAIT_S

    def waited(self) -> float:
        return 0.0 if self.started is None else self._clock() - self.started

    def next_wait(self) -> float | None:
        """Seconds to wait before the next attempt; None once the outage lasted its time."""
        now = self._clock()
        if self.started is None:
            self.started = now
        left = self.timeout_s - (now - self.started)
        if left <= 0:
            return None
        wait = min(self._wait, left)
        self._wait = min(LONGEST_WAIT_S, self._wait * 2)
        self.attempts += 1
        return wait

    def retrying(self, reason: str, wait: float) -> None:
        """The one log line of an attempt."""
        log.warning(
            "Kafka is unavailable (%s): nothing is committed meanwhile; attempt %d in %.0f s "
            "(%.0f s of kafka.unavailable_timeout_seconds %g waited)",
            reason,
            self.attempts + 1,
            wait,
            self.waited(),
            self.timeout_s,
        )

    def gave_up(self, reason: str) -> KafkaUnavailableError:
        """The run's last sentence."""
        return KafkaUnavailableError(
            f"Kafka at {self.bootstrap_servers} did not answer for {self.waited():.0f} s "
            f"after the first failure, {self.attempts} retries (kafka.unavailable_timeout_seconds "
            f"is {self.timeout_s:g}; last: {reason}): nothing of the unfinished batch was "
            "written; start the run again once Kafka is back, and it resumes where the table ends"
        )
