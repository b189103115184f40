"""{{ cookiecutter.project_name }}: Kafka -> Delta Lake, exactly once, on PySpark. Your code is
``transform.py``; the engine is the ``kafka_delta`` package beside this one."""

__version__ = "0.1.0"
