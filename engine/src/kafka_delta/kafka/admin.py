"""Small, batched metadata queries against Kafka: partitions, watermarks, group offsets, lag."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, OffsetSpec

from kafka_delta.kafka.clients import admin_settings, consumer_settings
from kafka_delta.kafka.refusals import (
    KafkaRefusedError,
    Refusals,
    group_not_authorized,
    settings_refused,
    topic_not_authorized,
)
from kafka_delta.offsets.model import Offsets

__all__ = [
    "NO_TOPIC_ID",
    "GroupNotAuthorizedError",
    "KafkaAdmin",
    "KafkaRefusedError",
    "KafkaUnavailableError",
    "TopicMissingError",
    "Topics",
    "Watermarks",
    "lag",
    "total_lag",
]


class TopicMissingError(ValueError):
    """A topic asked for is not on the cluster (never created, or deleted)."""

    def __init__(self, topic: str, message: str) -> None:
        super().__init__(message)
        self.topic = topic


class KafkaUnavailableError(RuntimeError):
    """The brokers did not answer in time: a metadata request, or a read task's fetches. A run
    waits such an outage out (``kafka.unavailable_timeout_seconds``,
    :mod:`kafka_delta.runtime.run_loop`) and finds it by this class's name in the text Spark
    hands back, so keep the name."""


class GroupNotAuthorizedError(KafkaRefusedError):
    """Kafka does not let the client read the consumer group: the group only mirrors the
    table's offsets for lag tools, so what reads it says "unreadable" rather than stopping."""


T = TypeVar("T")
# How often a request waiting for the brokers looks for a refusal among the client's error
# events: a refused login fails no request by itself before the request's own timeout.
_REFUSAL_LOOK_S = 0.25


@dataclass(frozen=True)
class Watermarks:
    earliest: Offsets
    latest: Offsets


# The id a broker reports for a topic when it reports none (Kafka before 2.8, some brokers).
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


@dataclass(frozen=True)
class Topics:
    """What one metadata request says of some topics: their partition ids, and Kafka's id of
    each topic whose id the broker reports (a topic deleted and created again under the same
    name gets a new one)."""

    partitions: dict[str, list[int]]
    ids: dict[str, str]


class KafkaAdmin:
    """Thin wrapper over confluent-kafka's AdminClient with errors that name the servers."""

    def __init__(self, client_config: Mapping[str, str], timeout_s: float = 30.0) -> None:
        self._conf = dict(client_config)
        self._timeout = timeout_s
        # Consumer-only settings of kafka.client (isolation.level, fetch.*) would make the
        # admin client, a producer handle, print a CONFWARN line on every run. Its error events
        # tell a refusal (a login, a TLS handshake) from brokers that do not answer.
        self._refusals = Refusals(self._conf)
        try:
            self._admin = AdminClient(admin_settings(self._conf) | {"error_cb": self._refusals})
        except KafkaException as exc:  # a CA or key file librdkafka cannot use
            raise KafkaRefusedError(settings_refused(self._conf, _reason(exc))) from None
        self._isolation = (
            IsolationLevel.READ_COMMITTED
            if self._conf.get("isolation.level", "read_committed") == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )

    def _failed(self, exc: KafkaException, unavailable: str) -> Exception:
        """What a failed request raises: :class:`KafkaRefusedError` when the brokers refused
        this client meanwhile (its error events, served now), else ``unavailable``'s
        :class:`KafkaUnavailableError`."""
        self._admin.poll(0)
        refused = self._refusals.sentence()
        if refused is not None:
            return KafkaRefusedError(refused)
        return KafkaUnavailableError(unavailable)

    def _refused(self) -> None:
        """Raise :class:`KafkaRefusedError` when the brokers refused this client since the
        request began (its error events, served now)."""
        self._admin.poll(0)
        if self._refusals.seen():
            refused = self._refusals.sentence()
            if refused is not None:
                raise KafkaRefusedError(refused)

    def _settle(self, futures: Iterable[concurrent.futures.Future[Any]]) -> None:
        """Wait for ``futures`` (their own request timeout ends them), looking for a refusal
        every :data:`_REFUSAL_LOOK_S`: a refused login or handshake is said within a second,
        not after the request's whole timeout."""
        pending = set(futures)
        while pending:
            _, pending = concurrent.futures.wait(pending, timeout=_REFUSAL_LOOK_S)
            if pending:
                self._refused()

    def _asked_again(
        self, request: Callable[[float], dict[Any, concurrent.futures.Future[Any]]]
    ) -> dict[Any, concurrent.futures.Future[Any]]:
        """``request(timeout)``'s futures, settled, the request sent again until
        :attr:`_timeout` while it fails for its broker's sake (the connection lost, or no
        answer within a slice of the time): the broker it went to may be the one just killed
        or still cached as the controller, and a second request goes to one that is up. A
        broker of three down left each DescribeTopics waiting out its 30 s for the controller
        it had cached, the run writing nothing for over 4 minutes (until librdkafka's periodic
        metadata refresh)."""
        deadline = time.monotonic() + self._timeout
        while True:
            left = deadline - time.monotonic()
            futures = request(max(1.0, min(_ATTEMPT_S, left)))
            self._settle(futures.values())
            failed = [
                f.exception()
                for f in futures.values()
                if isinstance(f.exception(), KafkaException)
                and _code(f.exception()) in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT)
            ]
            if not failed or time.monotonic() + 0.2 >= deadline:
                return futures
            self._refused()
            # A fresh metadata answer names a controller that is up: librdkafka otherwise keeps
            # the one it cached until its periodic refresh (topic.metadata.refresh.interval.ms,
            # 5 minutes), and sends every controller request to a broker that is down.
            try:
                self._admin.list_topics(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            except KafkaException:
                pass  # the next attempt says what is wrong
            time.sleep(0.2)

    def _metadata(self, call: Callable[[float], T]) -> T:
        """``call(timeout)``, a synchronous metadata request, in slices of a second until
        :attr:`_timeout`, looking for a refusal between them (see :meth:`_settle`)."""
        deadline = time.monotonic() + self._timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return call(max(0.01, min(1.0, left)))
            except KafkaException as exc:
                if _code(exc) not in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
                    raise
                self._refused()
                if time.monotonic() >= deadline:
                    raise

    def _serve_logs(self) -> None:
        # An admin client's log lines wait in its queue until polled; served here, they go
        # through the once-per-message logger instead of piling up. A refusal counts for the
        # request it failed, never for a later one.
        self._admin.poll(0)
        self._refusals.clear()

    @property
    def bootstrap_servers(self) -> str:
        return self._conf["bootstrap.servers"]

    def partitions(self, topics: Iterable[str]) -> dict[str, list[int]]:
        """Partition ids of each topic; a missing topic is an error, never auto-created."""
        topics = list(topics)
        try:
            metadata = self._metadata(lambda timeout: self._admin.list_topics(timeout=timeout))
        except KafkaException as exc:
            raise self._failed(
                exc,
                f"cannot reach Kafka at {self.bootstrap_servers} within {self._timeout:g} s "
                f"({_reason(exc)})",
            ) from None
        finally:
            self._serve_logs()
        result: dict[str, list[int]] = {}
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                # Kafka leaves out of a listing the topics the principal may not describe:
                # asked by name (a DescribeTopics request, which creates nothing), it says
                # which it is.
                self.describe([topic])
                raise ValueError(
                    f"topic {topic!r} does not exist on {self.bootstrap_servers} "
                    "(create it first; the pipeline never auto-creates topics)"
                )
            result[topic] = sorted(meta.partitions)
        return result

    def describe(self, topics: Iterable[str]) -> Topics:
        """Partition ids and topic ids of ``topics`` in ONE metadata request (what
        :meth:`partitions` and :meth:`topic_ids` ask in two). A missing topic is an error,
        never auto-created; an id the broker does not report is left out of ``ids``."""
        partitions: dict[str, list[int]] = {}
        ids: dict[str, str] = {}
        for name, description in self._descriptions(topics).items():
            if description is None or not description.partitions:
                raise TopicMissingError(
                    name,
                    f"topic {name!r} does not exist on {self.bootstrap_servers} "
                    "(create it first; the pipeline never auto-creates topics)",
                )
            partitions[name] = sorted(p.id for p in description.partitions)
            topic_id = description.topic_id
            if topic_id is not None and str(topic_id) != NO_TOPIC_ID:
                ids[name] = str(topic_id)
        return Topics(partitions, ids)

    def _descriptions(self, topics: Iterable[str], operations: bool = False) -> dict[str, Any]:
        """Each topic's description (DescribeTopics, asked again while it fails for its
        broker's sake), None for a topic Kafka does not know; ``operations``: with the
        operations Kafka authorizes the principal for. A topic the client may not describe is
        :class:`KafkaRefusedError`; no answer is :class:`KafkaUnavailableError`, never an empty
        one (a recreated topic would pass unseen, I12)."""
        names = sorted(set(topics))
        if not names:
            return {}
        result: dict[str, Any] = {}
        try:
            futures = self._asked_again(
                lambda timeout: self._admin.describe_topics(
                    TopicCollection(names),
                    request_timeout=timeout,
                    include_authorized_operations=operations,
                )
            )
            for name, future in futures.items():
                try:
                    result[name] = future.result()
                except KafkaException as exc:
                    self._not_authorized(exc, name)
                    if _code(exc) != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise
                    result[name] = None
        except KafkaException as exc:
            raise self._failed(
                exc,
                f"cannot describe topics on {self.bootstrap_servers} within {self._timeout:g} s "
                f"({_reason(exc)})",
            ) from None
        finally:
            self._serve_logs()
        return result

    def _not_authorized(self, exc: KafkaException, topic: str, describe: bool = True) -> None:
        """Raise the sentence of a topic request Kafka refused for an ACL; else nothing."""
        if _code(exc) == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise KafkaRefusedError(
                topic_not_authorized(self.bootstrap_servers, self._conf, topic, describe=describe)
            ) from None

    def readable(self, topics: Iterable[str]) -> None:
        """Raise :class:`KafkaRefusedError` naming the ACL the client lacks when Kafka says it
        may not read (or not even describe) one of ``topics``: the operations Kafka reports the
        principal authorized for on each topic (a broker that reports none is taken at its
        word only when it reports some). Run before any work, so that a principal without Read
        stops with the ACL to grant, not with a read task's failure."""
        for name, description in self._descriptions(topics, operations=True).items():
            if description is None:
                continue  # the partition listing names it
            operations = description.authorized_operations
            if operations is not None and AclOperation.READ not in operations:
                allowed = ", ".join(sorted(op.name for op in operations)) or "nothing"
                raise KafkaRefusedError(
                    topic_not_authorized(
                        self.bootstrap_servers,
                        self._conf,
                        name,
                        why=f"Kafka authorizes it for {allowed} on the topic",
                    )
                )

    def _list_offsets(
        self,
        partitions: Mapping[str, list[int]],
        *specs: OffsetSpec,
        negative_is_an_answer: bool = False,
    ) -> list[Offsets]:
        """The offsets of each spec, its requests sent together (one round trip's wait).

        librdkafka sends a ListOffsets request to each partition's leader as its metadata
        cache knows them, and hands back what a stale cache earns without asking the cluster
        again: "Local: Unknown partition" for a partition added to a topic since (a long-lived
        client, the run's, would never learn it before its periodic refresh, 5 minutes by
        default), "Not leader for partition" after a leader moved (a broker restarted, a
        preferred-leader election), "Leader high watermark is not caught up" from a leader just
        elected, "Leader not available" or "Unknown topic or partition" for a topic just
        created. Kafka's own clients refresh their metadata and ask again; so does
        this one, a few times over about 2.5 s. Anything else, or the same after that, fails as
        before."""
        try:
            wait = 0.1
            for attempt in range(_STALE_METADATA_ATTEMPTS):
                try:
                    return self._list_offsets_once(partitions, specs, negative_is_an_answer)
                except KafkaException as exc:
                    last_attempt = attempt == _STALE_METADATA_ATTEMPTS - 1
                    if _code(exc) not in _STALE_METADATA or last_attempt:
                        raise
                for topic in partitions:
                    self._admin.list_topics(topic=topic, timeout=self._timeout)
                time.sleep(wait)
                wait = min(1.0, wait * 2)
            raise AssertionError("unreachable")
        except KafkaException as exc:
            raise self._failed(
                exc, f"cannot list offsets on {self.bootstrap_servers}: {_reason(exc)}"
            ) from None
        finally:
            self._serve_logs()

    def _list_offsets_once(
        self,
        partitions: Mapping[str, list[int]],
        specs: tuple[OffsetSpec, ...],
        negative_is_an_answer: bool,
    ) -> list[Offsets]:
        """One round of ListOffsets requests; ``negative_is_an_answer``: a timestamp lookup,
        whose -1 says no record is that recent."""
        request = [
            KafkaTopicPartition(topic, p) for topic, parts in partitions.items() for p in parts
        ]
        if not request:
            return [{} for _ in specs]
        results: list[Offsets] = []
        pending = [
            self._admin.list_offsets(
                dict.fromkeys(request, spec),
                isolation_level=self._isolation,
                request_timeout=self._timeout,
            )
            for spec in specs
        ]
        self._settle(f for futures in pending for f in futures.values())
        for futures in pending:
            result: Offsets = {topic: {} for topic in partitions}
            for tp, future in futures.items():
                try:
                    offset = future.result().offset
                except KafkaException as exc:
                    self._not_authorized(exc, tp.topic, describe=False)
                    raise
                if offset < 0 and not negative_is_an_answer:
                    # No offset, and no error: librdkafka's answer (-1001) for a partition
                    # whose leader is gone and not yet replaced (a broker killed). Taken for a
                    # position it reads as a topic truncated or recreated, so it is an error
                    # the caller's retries and the run's outage handling see as such.
                    raise KafkaException(
                        KafkaError(
                            KafkaError.LEADER_NOT_AVAILABLE,
                            f"no offset of {tp.topic}[{tp.partition}] (its leader is not "
                            "available)",
                        )
                    )
                result[tp.topic][tp.partition] = offset
            results.append(result)
        return results

    def watermarks(self, partitions: Mapping[str, list[int]]) -> Watermarks:
        """Earliest available and latest (high watermark, or last stable offset under
        read_committed) offsets of each partition: two ListOffsets requests, sent together."""
        earliest, latest = self._list_offsets(
            partitions, OffsetSpec.earliest(), OffsetSpec.latest()
        )
        return Watermarks(earliest=earliest, latest=latest)

    def earliest(self, partitions: Mapping[str, list[int]]) -> Offsets:
        return self._list_offsets(partitions, OffsetSpec.earliest())[0]

    def latest(self, partitions: Mapping[str, list[int]]) -> Offsets:
        return self._list_offsets(partitions, OffsetSpec.latest())[0]

    def for_timestamp(self, partitions: Mapping[str, list[int]], timestamp_ms: int) -> Offsets:
        """Kafka's answer to "first offset whose timestamp is >= timestamp_ms" per partition;
        -1 where no record is that recent."""
        spec = OffsetSpec.for_timestamp(timestamp_ms)
        return self._list_offsets(partitions, spec, negative_is_an_answer=True)[0]

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """Kafka's topic id of each topic that exists (a topic deleted and created again under
        the same name gets a new one); topics the broker cannot describe are left out."""
        return {
            name: str(d.topic_id)
            for name, d in self._descriptions(topics).items()
            if d is not None and d.topic_id is not None and str(d.topic_id) != NO_TOPIC_ID
        }

    def committed(self, group: str, partitions: Mapping[str, list[int]]) -> Offsets:
        """The group's committed offsets for these partitions (absent when never committed);
        :class:`GroupNotAuthorizedError` when Kafka does not let the client read the group.

        The group's coordinator is asked first whether it can answer (DescribeGroups, which
        also tells a group the client may not read at once, where a consumer would wait out
        its timeout looking for the coordinator). The offsets are then asked through a
        consumer of the group that joins nothing (``Consumer.committed``), not the admin API's
        ListConsumerGroupOffsets: librdkafka 2.16 answers an OffsetFetch error that moves the
        group's coordinator (COORDINATOR_LOAD_IN_PROGRESS from a broker that just started,
        NOT_COORDINATOR after a move) by asking the client's consumer group to find its
        coordinator again, and an admin client has none: the process died with SIGSEGV in
        ``rd_kafka_cgrp_op`` (confluentinc/librdkafka#5040; seen on a fresh Apache Kafka
        broker, 2 runs in 12). A consumer has its group, looks the coordinator up again and
        retries until the timeout."""
        request = [
            KafkaTopicPartition(topic, p) for topic, parts in partitions.items() for p in parts
        ]
        if not request:
            return {}
        consumer = Consumer(
            consumer_settings(self._conf)
            | {"group.id": group, "enable.auto.commit": False, "error_cb": self._refusals}
        )
        deadline = time.monotonic() + self._timeout
        wait = 0.1
        try:
            self._coordinator_ready(group, deadline)
            while True:
                try:
                    answered = consumer.committed(
                        request, timeout=max(1.0, deadline - time.monotonic())
                    )
                    break
                except KafkaException as exc:
                    # The coordinator still loading, or just moved: librdkafka hands some of
                    # these back rather than asking again (Kafka's own clients retry them).
                    if _code(exc) not in _COORDINATOR_BUSY or time.monotonic() + wait > deadline:
                        raise
                time.sleep(wait)
                wait = min(1.0, wait * 2)
        except KafkaException as exc:
            if _code(exc) == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise GroupNotAuthorizedError(
                    group_not_authorized(self.bootstrap_servers, self._conf, group)
                ) from None
            consumer.poll(0)  # its error events, for a refusal
            raise self._failed(
                exc,
                f"cannot read offsets of group {group!r} on {self.bootstrap_servers}: "
                f"{_reason(exc)}",
            ) from None
        finally:
            consumer.close()
            self._serve_logs()
        result: Offsets = {}
        for tp in answered:
            if tp.error is not None:
                if tp.error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    raise GroupNotAuthorizedError(
                        group_not_authorized(self.bootstrap_servers, self._conf, group)
                    )
                raise KafkaUnavailableError(
                    f"cannot read offsets of group {group!r} on {self.bootstrap_servers}: "
                    f"{tp.topic}[{tp.partition}]: {tp.error.str()}"
                )
            if tp.offset >= 0:
                result.setdefault(tp.topic, {})[tp.partition] = tp.offset
        return result

    def _coordinator_ready(self, group: str, deadline: float) -> None:
        """Return once the group's coordinator answers a DescribeGroups request, asking again
        while it loads or moves until ``deadline``; :class:`GroupNotAuthorizedError` when Kafka
        does not let the client describe the group. (An admin client's DescribeGroups needs no
        consumer group of its own, unlike its OffsetFetch: see :meth:`committed`.)"""
        wait = 0.1
        while True:
            futures = self._admin.describe_consumer_groups([group], request_timeout=self._timeout)
            self._settle(futures.values())
            try:
                futures[group].result()
                return
            except KafkaException as exc:
                if _code(exc) == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    raise GroupNotAuthorizedError(
                        group_not_authorized(self.bootstrap_servers, self._conf, group)
                    ) from None
                if _code(exc) not in _COORDINATOR_BUSY or time.monotonic() + wait > deadline:
                    raise
            time.sleep(wait)
            wait = min(1.0, wait * 2)


# What a request to a partition's leader earns from a metadata cache that is behind the cluster
# (see KafkaAdmin._list_offsets), and how often it is asked again after a metadata refresh.
_STALE_METADATA = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        # A leader elected a moment ago whose high watermark has not caught up yet.
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)
_STALE_METADATA_ATTEMPTS = 5


# The longest one attempt of a request :meth:`KafkaAdmin._asked_again` sends again may wait.
_ATTEMPT_S = 8.0


# A group coordinator that cannot answer yet: loading its log after a (re)start, not yet
# elected, or moved.
_COORDINATOR_BUSY = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }
)


def _code(exc: KafkaException) -> int | None:
    error = exc.args[0] if exc.args else None
    return getattr(error, "code", lambda: None)()


def _reason(exc: KafkaException) -> str:
    """librdkafka's own sentence for a failure (``Failed to get metadata: Local: Broker
    transport failure``), not the ``KafkaError{code=...}`` repr."""
    error = exc.args[0] if exc.args else exc
    text = error.str() if hasattr(error, "str") else str(error)
    return str(text)


def lag(latest: Offsets, position: Offsets) -> dict[str, dict[int, int]]:
    """Per-partition records between a position (stored or committed) and the latest offset;
    a partition with no position counts in full from offset 0."""
    return {
        topic: {p: max(0, hi - position.get(topic, {}).get(p, 0)) for p, hi in parts.items()}
        for topic, parts in latest.items()
    }


def total_lag(latest: Offsets, position: Offsets) -> int:
    return sum(v for parts in lag(latest, position).values() for v in parts.values())
