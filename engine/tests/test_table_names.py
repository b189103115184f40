"""Tables by name: one rule tells a catalog name from a path (kafka_delta.table_names), a name is
never taken for a relative path, and the embedded engine (delta-rs, paths only) refuses a name
with one sentence and exit code 2 before any work."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from kafka_delta.cli import main
from kafka_delta.commands.arguments import add_config_options, build_config
from kafka_delta.config import ConfigError, load_config
from kafka_delta.table_names import (
    is_table_name,
    location_problem,
    name_parts,
    quoted,
    with_suffix,
)
from support import PROJECT


def _write(tmp_path: Path, data: dict) -> Path:
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    path = conf / "test.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _base(sink: str = "delta_rs") -> dict:
    data = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text())
    data["engine"] = {"source": "embedded", "sink": sink}
    return data


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("main.sales.orders", True),
        ("default.kd_orders", True),
        ("`main`.`my-schema`.`orders v2`", True),
        ("sales.`odd``name`", True),
        ("data/tables/orders", False),
        ("./orders.v2", False),
        ("/abs/orders", False),
        ("~/orders", False),
        ("s3://bucket/orders", False),
        ("dbfs:/Volumes/main/default/v/orders", False),
        ("file:/tmp/orders", False),
        ("a.b.c.d", False),
        ("orders", False),
    ],
)
def test_a_value_is_a_name_only_as_two_or_three_identifiers_without_slash_or_scheme(
    value: str, name: bool
) -> None:
    assert is_table_name(value) is name


def test_a_bare_word_or_a_dotted_odd_value_is_refused_with_one_sentence_naming_both_spellings():
    problem = location_problem("orders")
    assert problem is not None
    assert "./orders" in problem and "default.orders" in problem
    assert location_problem("a.b.c.d") is not None
    assert location_problem("a-b.c") is not None
    assert location_problem("data/orders") is None
    assert location_problem("main.sales.orders") is None


def test_names_are_quoted_per_part_and_a_sibling_name_suffixes_the_table_part() -> None:
    assert name_parts("main.`my-s`.t") == ["main", "my-s", "t"]
    assert quoted("main.`my-s`.t") == "`main`.`my-s`.`t`"
    assert quoted("s.`a``b`") == "`s`.`a``b`"
    assert with_suffix("main.sales.orders", "_dead_letters") == "main.sales.orders_dead_letters"
    assert with_suffix("main.`my-s`.`o x`", "_dl") == "main.`my-s`.`o x_dl`"
    assert with_suffix("/data/orders/", "_dead_letters") == "/data/orders_dead_letters"


def test_a_name_in_the_config_stays_a_name_for_the_cluster_sink_and_writes_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's report: ``delta.table: default.kd_orders`` became a folder of that name."""
    data = _base("delta_spark")
    data["delta"]["table"] = "default.kd_orders"
    data["dead_letters"] = {"enabled": True, "table": "main.ops.`kd-dead`"}
    cfg = load_config(_write(tmp_path, data))
    assert cfg.delta.table == "default.kd_orders"
    assert cfg.dead_letter_table == "main.ops.`kd-dead`"
    data["dead_letters"] = {"enabled": True}
    cfg = load_config(_write(tmp_path, data))
    assert cfg.dead_letter_table == "default.kd_orders_dead_letters"
    # tables: entries follow the same rule.
    data.pop("delta")
    data["tables"] = {
        "bronze": {"path": "main.sales.bronze"},
        "raw": {"path": "data/raw"},
    }
    cfg = load_config(_write(tmp_path, data))
    views = {v.table_name: v.delta.table for v in cfg.table_configs()}
    assert views["bronze"] == "main.sales.bronze"
    assert views["raw"] == str((tmp_path / "data" / "raw").resolve())
    # The command line's --table override keeps a name as it is.
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_config_options(parser)
    data = _base("delta_spark")
    path = _write(tmp_path, data)
    args = parser.parse_args(
        ["--config", str(path), "--table", "main.sales.orders", "--bootstrap-servers", "x:1"]
    )
    assert build_config(args).delta.table == "main.sales.orders"
    assert not any(p.name.endswith("orders") for p in tmp_path.rglob("*"))


def test_the_start_up_checks_take_a_name_for_a_table_not_for_a_folder_of_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks before Spark starts look at local folders only: a file that happens to bear
    the table's name in the working folder is no reason to refuse a catalog table."""
    from kafka_delta.runtime.preflight import check_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "default.kd_orders").write_text("not a table")
    data = _base("delta_spark")
    data["delta"]["table"] = "default.kd_orders"
    cfg = load_config(_write(tmp_path, data))

    check_paths(cfg)  # raised "default.kd_orders is a file, not a folder" before


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("delta", "main.sales.orders"),
        ("dead_letters", "sales.dead"),
        ("tables", "main.sales.bronze"),
    ],
)
def test_the_embedded_engine_refuses_a_table_name_with_one_sentence_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, value: str
) -> None:
    data = _base("delta_rs")
    if where == "delta":
        data["delta"]["table"] = value
    elif where == "dead_letters":
        data["dead_letters"] = {"enabled": True, "table": value}
    else:
        data.pop("delta")
        data["tables"] = {"bronze": {"path": value}}
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError, match="writes tables by path only"):
        load_config(path)
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert value in err and "engine.sink: delta_spark" in err
    assert "Traceback" not in err
    assert not (tmp_path / "data").exists()


def test_a_bare_word_is_refused_for_every_table_key(tmp_path: Path) -> None:
    for mutate in (
        lambda d: d["delta"].update(table="orders"),
        lambda d: d.update(dead_letters={"enabled": True, "table": "dead"}),
    ):
        data = _base("delta_spark")
        mutate(data)
        with pytest.raises(ConfigError, match="neither a path nor a table name"):
            load_config(_write(tmp_path, data))


_CATALOG_RUN = """
import sys
from pyspark.sql import SparkSession
from kafka_delta.runtime.connectors import catalog_session_confs

builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for key, value in catalog_session_confs(sys.argv[1]).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
if sys.argv[2] == "write":
    spark.sql("CREATE SCHEMA IF NOT EXISTS kd_sales")
    spark.sql("CREATE TABLE kd_sales.orders (id INT) USING parquet")
    spark.sql("INSERT INTO kd_sales.orders VALUES (1), (2)")
else:
    print(sorted(r.id for r in spark.table("kd_sales.orders").collect()))
spark.stop()
"""


@pytest.mark.spark
def test_the_local_session_catalog_keeps_tables_by_name_across_runs(tmp_path: Path) -> None:
    """The metastore the local delta-spark sessions use (runtime.connectors.catalog_session_confs:
    Hive over Derby, both shipped in pyspark): a table made by name in one process is there, by
    name, in the next; everything stays in the given folder. Shown here with a Parquet table
    (Delta's catalog over it needs the jars); scripts/run_local.sh passes the same confs."""
    import subprocess
    import sys

    from kafka_delta_dev.pytest_plugin import NEEDS_JAVA, NO_JAVA

    if NO_JAVA:
        pytest.skip(NEEDS_JAVA)
    data = tmp_path / "data"
    script = tmp_path / "catalog_run.py"
    script.write_text(_CATALOG_RUN)
    for step in ("write", "read"):
        done = subprocess.run(
            [sys.executable, str(script), str(data), step],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[1, 2]"
    assert (data / "metastore_db").is_dir() and (data / "warehouse" / "kd_sales.db").is_dir()
    for script_name in ("run_local.sh", "run_cluster_local.sh"):
        assert "session-confs" in (PROJECT / "scripts" / script_name).read_text()
