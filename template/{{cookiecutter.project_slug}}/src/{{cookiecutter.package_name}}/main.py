"""The entry point of {{ cookiecutter.project_name }}: hands over to the engine, which reads
``conf/<env>.yaml`` (the transform it names included) and runs the pipeline or a command.

    spark-submit src/{{ cookiecutter.package_name }}/main.py --env local
    {{ cookiecutter.project_slug }} offsets show          # the console script, also on Databricks
"""

from kafka_delta import run


def main() -> None:
    run(prog="{{ cookiecutter.project_slug }}")


if __name__ == "__main__":
    main()
