"""{{ cookiecutter.project_name }}: Kafka -> Delta Lake, exactly once, on PySpark. Your code is
``transform.py``; the engine that runs it is ``kafka_delta``, a dependency (pyproject.toml)."""

__version__ = "0.1.0"
