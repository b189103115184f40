"""The decoder on Spark's side: the schema Spark sees, and the decoding of a DataFrame of Kafka
columns through ``mapInArrow`` (the cluster engine's source; the embedded source decodes in its
own read task instead, with the same :class:`~.decoder.Decoder`)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from kafka_delta.decoding.decoder import decoder_for, output_schema
from kafka_delta.decoding.spec import DecodeSpec


def spark_schema(spec: DecodeSpec) -> StructType:
    """The DataFrame schema the transform receives for ``spec``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(output_schema(spec))


class _DecodeTask:
    """Picklable ``mapInArrow`` function: one decoder per Python worker (cached by spec)."""

    def __init__(self, spec_json: str) -> None:
        self.spec_json = spec_json

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = decoder_for(self.spec_json)
        for batch in batches:
            yield decoder.decode(batch)


def decode_frame(df: DataFrame, spec: DecodeSpec) -> DataFrame:
    """``df`` (Spark's kafka source columns) decoded by ``spec`` in the executors."""
    return df.mapInArrow(_DecodeTask(spec.to_json()), spark_schema(spec))
