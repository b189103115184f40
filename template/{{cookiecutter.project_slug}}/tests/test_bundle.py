"""The Databricks bundle parses, and its job runs this project's wheel: the distribution and the
console script pyproject.toml names. (What the template promises of the bundle and the wheels,
the template's own tests prove.)"""

from pathlib import Path

import yaml
from databricks.bundles.jobs import Job

BUNDLE = Path(__file__).resolve().parents[1] / "databricks.yml"


def test_the_bundle_parses_and_runs_this_projects_wheel() -> None:
    bundle = yaml.safe_load(BUNDLE.read_text(encoding="utf-8"))
    job = Job.from_dict(bundle["resources"]["jobs"]["{{ cookiecutter.package_name }}"])

    task = job.tasks[0].python_wheel_task
    assert task.package_name == "{{ cookiecutter.project_slug | replace('-', '_') }}"
    assert task.entry_point == "{{ cookiecutter.project_slug }}"
