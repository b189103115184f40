"""The walk of one commit through the engine: which of the engine's files a batch's commit
enters, in order, on a real run (docs/layout.md; issue 47's measure of the Delta layer).

A stop is one entry into an engine file from another (calls within a file, and calls into
deltalake, pyarrow or pyspark, are not stops). A commit that bounces between the sink, its
writer and the schema rules pays for it in stops; the layer keeps each concept in one file."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kafka_delta
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.produce import produce_events
from support import assert_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.broker]

ENGINE = Path(kafka_delta.__file__).parent

# The delta-rs sink's commit walked 36 stops in 12 files before the Delta layer (issue 47).
MOST_STOPS = 20


def _walked(fn: Callable[..., Any], walks: list[list[str]]) -> Callable[..., Any]:
    """``fn``, recording each call's walk: the engine files it enters, in order, one entry per
    move from one file to another."""

    def walk(*args: Any, **kwargs: Any) -> Any:
        files: list[str] = []

        def profile(frame: Any, event: str, _arg: Any) -> None:
            if event != "call":
                return
            path = Path(frame.f_code.co_filename)
            if ENGINE not in path.parents:
                return
            name = str(path.relative_to(ENGINE))
            if not files or files[-1] != name:
                files.append(name)

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(previous)
            walks.append(files)

    return walk


def test_a_delta_rs_commit_walks_at_most_twenty_stops(
    spark, kafka_bootstrap, new_topics, make_config
) -> None:
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 200)
    cfg = make_config(topics)
    pipeline = Pipeline(spark, cfg)
    sink = pipeline.engine.sink
    walks: dict[str, list[list[str]]] = {"materialize": [], "commit_batch": []}
    for step, recorded in walks.items():
        setattr(sink, step, _walked(getattr(sink, step), recorded))

    summary = pipeline.run()

    assert summary.rows_written == 200
    assert_exactly_once(cfg, 200)
    # The batch's one commit: its rows written (materialize), then the commit that records them.
    (materialize,) = walks["materialize"]
    (commit,) = walks["commit_batch"]
    walk = materialize + commit
    shown = "\n".join(f"{step}: {len(w)} stops: {' > '.join(w)}" for step, (w,) in walks.items())
    assert materialize[0] == commit[0] == "sinks/delta_rs/sink.py", shown
    assert len(walk) <= MOST_STOPS, shown
    # No bouncing between the sink and its writer (9 entries into file_writer.py before).
    for step in (materialize, commit):
        assert step.count("sinks/delta_rs/file_writer.py") <= 2, shown
    print(shown)
