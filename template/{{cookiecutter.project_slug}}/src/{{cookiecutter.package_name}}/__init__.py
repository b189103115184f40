"""Kafka -> Delta Lake streaming, exactly once, on PySpark."""

__version__ = "0.1.0"
