"""Where records come from, behind :class:`kafka_delta.engine.Source`:

- :mod:`.embedded` (the default): a Spark 4 Python data source on confluent-kafka
  (:mod:`.kafka_datasource`), no JVM connector jars;
- :mod:`.spark_kafka`: Spark's built-in ``kafka`` source (Databricks, or spark-submit with the
  connector).
"""
