"""The cluster engine: Spark's built-in ``kafka`` source and delta-spark (JVM connectors)."""
