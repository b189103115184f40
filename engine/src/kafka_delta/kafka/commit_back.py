"""Post-commit hook: copy each batch's end offsets to the Kafka consumer group, for monitoring.

This mirrors Flink's ``notifyCheckpointComplete``: the offsets were already made durable in
the Delta commit; the group commit only lets standard lag tools (kafka-consumer-groups, Burrow,
cloud consoles) see real lag. Recovery never reads them. So the hook is asynchronous (a
background thread), newest-wins (a pending commit is replaced by a newer one), bounded (waits
at most ``timeout_s`` when flushing), and never fails or stalls the stream: failures are
counted and logged. A group the client may not write (an ACL it lacks) is said once, with the
ACL to grant, and only counted after that: every batch would be refused alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

import kafka_delta.crash_points as crash_points
from kafka_delta.kafka.clients import consumer_settings
from kafka_delta.kafka.refusals import group_not_authorized, not_authorized
from kafka_delta.offsets.model import Offsets, offsets_to_json

log = logging.getLogger(__name__)

# How long a commit waits for an answer once its group's coordinator look-up was refused: a
# commit that went through after an ACL was granted answers within it.
_REFUSED_WAIT_S = 1.0


@dataclass(frozen=True)
class CommitBackStats:
    succeeded: int
    failed: int
    superseded: int
    last_committed_batch: int | None
    last_error: str | None
    # Background time per successful group commit (request to broker answer), in ms.
    mean_commit_ms: float
    max_commit_ms: float
    # The sentence of the ACL the client lacks while Kafka refuses its commits, else None.
    refusal: str | None = None


class OffsetCommitter:
    """Commits ``{topic: {partition: next offset}}`` to ``group`` from a background thread.

    >>> committer = OffsetCommitter({"bootstrap.servers": "127.0.0.1:9092"}, "orders")
    >>> committer.submit(7, {"orders": {0: 120}})  # doctest: +SKIP
    >>> committer.close()  # waits up to timeout_s for the newest offsets
    """

    def __init__(
        self, client_config: Mapping[str, str], group: str, timeout_s: float = 10.0
    ) -> None:
        conf = dict(client_config)
        conf.update(
            {
                "group.id": group,
                "enable.auto.commit": "false",
                # Bound every request so a dead broker cannot hold the thread for long.
                "socket.timeout.ms": str(int(timeout_s * 1000)),
                "session.timeout.ms": conf.get("session.timeout.ms", "6000"),
            }
        )
        self._conf = conf
        self.group = group
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._pending: tuple[int, Offsets] | None = None
        self._busy = False
        self._closed = False
        self._succeeded = 0
        self._failed = 0
        self._superseded = 0
        self._last_batch: int | None = None
        self._last_error: str | None = None
        self._commit_ms_total = 0.0
        self._commit_ms_max = 0.0
        self._consumer: Consumer | None = None
        self._attempt = 0
        self._outstanding: list[int] = []
        self._result: str | None = None
        # Kafka's error code of the last attempt's failure, and the refusal last said (an ACL
        # the client lacks), which is not said again while it lasts.
        self._code: int | None = None
        self._refusal_said: str | None = None
        # The group coordinator's look-up was refused (no Describe on the group) since the
        # last commit that went through.
        self._group_refused = False
        self._thread = threading.Thread(target=self._run, name="offset-commit-back", daemon=True)
        self._thread.start()

    def submit(self, batch_id: int, offsets: Offsets) -> None:
        """Queue the offsets of a committed batch; returns at once."""
        if not offsets:
            return
        with self._cond:
            if self._closed:
                raise RuntimeError("OffsetCommitter is closed")
            if self._pending is not None:
                self._superseded += 1
            self._pending = (batch_id, offsets)
            self._cond.notify_all()

    def stats(self) -> CommitBackStats:
        with self._cond:
            return CommitBackStats(
                self._succeeded,
                self._failed,
                self._superseded,
                self._last_batch,
                self._last_error,
                mean_commit_ms=self._commit_ms_total / self._succeeded if self._succeeded else 0.0,
                max_commit_ms=self._commit_ms_max,
                refusal=self._refusal_said,
            )

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the newest submitted offsets are committed (or failed); False on timeout."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._cond:
            while self._pending is not None or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self) -> CommitBackStats:
        """Flush (bounded), stop the thread and return the final counters."""
        flushed = self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=self.timeout_s)
        if not flushed:
            log.warning(
                "commit-back: gave up after %.1fs; the group may lag the table until the next run",
                self.timeout_s,
            )
        return self.stats()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    break
                batch_id, offsets = self._pending
                self._pending = None
                self._busy = True
            started = time.perf_counter()
            error = self._commit(offsets)
            took_ms = (time.perf_counter() - started) * 1000
            with self._cond:
                self._busy = False
                if error is None:
                    self._succeeded += 1
                    self._last_batch = batch_id
                    self._commit_ms_total += took_ms
                    self._commit_ms_max = max(self._commit_ms_max, took_ms)
                else:
                    self._failed += 1
                    self._last_error = error
                self._cond.notify_all()
            refusal = self._refusal(offsets) if error is not None else None
            if refusal is not None:
                if refusal != self._refusal_said:
                    log.warning(
                        "commit-back to group %r is refused: %s. The table is exact and "
                        "unaffected (the group is for lag tools only); lag tools show the "
                        "group's old offsets until the ACL is granted. Each refused commit is "
                        "counted in commit_back_failed, and not said again",
                        self.group,
                        refusal,
                    )
                    self._refusal_said = refusal
                else:
                    log.debug("commit-back of batch %d refused again: %s", batch_id, error)
            elif error is not None:
                log.warning(
                    "commit-back of batch %d to group %r failed (the table is unaffected; "
                    "lag tools will show stale offsets): %s",
                    batch_id,
                    self.group,
                    error,
                )
            elif self._refusal_said is not None:
                log.info("commit-back to group %r is accepted again", self.group)
                self._refusal_said = None
        if self._consumer is not None:
            self._consumer.close()

    def _refusal(self, offsets: Offsets) -> str | None:
        """The sentence of the last attempt's failure when Kafka refused it for an ACL the
        client lacks (Read on the group; Read on a topic, which OffsetCommit also asks)."""
        servers = self._conf.get("bootstrap.servers", "?")
        if self._code == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return group_not_authorized(servers, self._conf, self.group)
        if self._code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            topics = ", ".join(sorted(offsets))
            why = "TOPIC_AUTHORIZATION_FAILED"
            return not_authorized(
                servers, self._conf, "commit offsets of", "topic", topics, ["Read"], why
            )
        return None

    def _event(self, message: object) -> None:
        """An event ``poll`` returned: the group coordinator's look-up refused for the group's
        ACL (the consumer's error event; it has no message to consume)."""
        error = message.error() if message is not None else None  # type: ignore[attr-defined]
        if error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            self._group_refused = True

    def _on_commit(self, err: object, partitions: list[TopicPartition]) -> None:
        # Runs inside consumer.poll() on this thread. Callbacks arrive in request order, so the
        # oldest outstanding attempt is the one answered; a timed-out attempt's late answer is
        # dropped (it was already counted as failed).
        attempt = self._outstanding.pop(0) if self._outstanding else None
        if attempt is None or attempt != self._attempt:
            return
        failed = [tp for tp in partitions or [] if tp.error is not None]
        if err is not None:
            self._result = str(err)
            self._code = _code_of(err)
        elif failed:
            self._result = "; ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in failed)
            self._code = _code_of(failed[0].error)
        else:
            self._result = ""

    def _commit(self, offsets: Offsets) -> str | None:
        """Commit and wait for the broker's answer, at most ``timeout_s``; the error or None."""
        crash_points.reached("in_commit_back")
        try:
            if self._consumer is None:
                settings = consumer_settings(self._conf)
                self._consumer = Consumer({**settings, "on_commit": self._on_commit})
            self._attempt += 1
            self._outstanding.append(self._attempt)
            self._result = None
            self._code = None
            partitions = [
                TopicPartition(topic, partition, offset)
                for topic, parts in offsets.items()
                for partition, offset in parts.items()
            ]
            self._consumer.commit(offsets=partitions, asynchronous=True)
            started = time.monotonic()
            deadline = started + self.timeout_s
            while self._result is None and time.monotonic() < deadline:
                self._event(self._consumer.poll(0.05))
                if self._group_refused and time.monotonic() - started > _REFUSED_WAIT_S:
                    break  # refused so far: no answer is coming (an ACL granted since would
                    # have answered by now; the next batch tries again)
            if self._code in (None, KafkaError._WAIT_COORD) and self._group_refused:
                # A principal without Describe on the group never learns its coordinator: the
                # commit fails locally ("Waiting for coordinator") or gets no answer, and only
                # the look-up's error event says why.
                self._code = KafkaError.GROUP_AUTHORIZATION_FAILED
            if self._result is None:
                return f"no answer from the group coordinator within {self.timeout_s:.1f}s"
            if self._result:
                return self._result
            log.debug("commit-back: group %r at %s", self.group, offsets_to_json(offsets))
            self._group_refused = False
            return None
        except KafkaException as exc:
            self._code = _code_of(exc.args[0] if exc.args else None)
            return str(exc.args[0])
        except Exception as exc:  # never let monitoring kill the thread
            return f"{type(exc).__name__}: {exc}"


def _code_of(error: object) -> int | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None
