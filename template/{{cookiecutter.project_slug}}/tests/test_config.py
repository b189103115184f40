"""This project's configs are valid as shipped: every conf/*.yaml loads, names the transform
that exists, and resolves its paths against the project root."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_delta import load_config, load_transform

from {{ cookiecutter.package_name }}.transform import transform

PROJECT = Path(__file__).resolve().parents[1]
# conf/databricks.yaml reads secrets and per-target values from the job's environment.
ENVIRON = {
    "SCHEMA_REGISTRY_URL": "https://schema-registry.invalid",
{%- for name, _ in kafka_secrets(cookiecutter.kafka_security) %}
    "{{ name }}": "not-a-secret",
{%- endfor %}
}


@pytest.mark.parametrize("name", sorted(p.name for p in (PROJECT / "conf").glob("*.yaml")))
def test_every_shipped_config_loads_and_names_this_projects_transform(name: str) -> None:
    cfg = load_config(PROJECT / "conf" / name, environ=ENVIRON)

    assert cfg.kafka.topics
    assert cfg.transform == "{{ cookiecutter.package_name }}.transform:transform"
    assert load_transform(cfg.transform) is transform


def test_the_local_config_keeps_every_path_inside_the_project() -> None:
    cfg = load_config(PROJECT / "conf" / "local.yaml")

    for path in (cfg.delta.table, cfg.checkpoint, cfg.dead_letter_table, cfg.progress.path):
        assert path is not None and Path(path).is_relative_to(PROJECT), path
    assert not Path(cfg.checkpoint).is_relative_to(Path(cfg.delta.table))
    if cfg.decoding.value.schema_file:
        assert Path(cfg.decoding.value.schema_file).is_file()
