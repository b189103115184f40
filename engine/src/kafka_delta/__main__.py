"""``python -m kafka_delta``: the command line (:mod:`.cli`)."""

from kafka_delta.cli import run

run()
