"""Spark's Python processes import the installed, compiled pyspark, not Spark's source zip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_delta.runtime import python_launcher
from kafka_delta.runtime.python_launcher import installed_package

PYSPARK = installed_package("pyspark")
pytestmark = pytest.mark.skipif(
    PYSPARK is None or not (PYSPARK / "python" / "lib" / "pyspark.zip").is_file(),
    reason="pyspark is not installed as a package with its source zip: no launcher applies",
)
PROBE = (
    "import json, os, pyspark, py4j; "
    "print(json.dumps([os.environ.get('PYTHONPATH'), pyspark.__file__, py4j.__file__]))"
)


def _probe(launcher: str, spark_home: Path, pythonpath: str) -> list[str]:
    env = {**os.environ, "SPARK_HOME": str(spark_home), "PYTHONPATH": pythonpath}
    out = subprocess.run(
        [launcher, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def test_the_launcher_runs_this_interpreter_without_the_zips_of_the_installed_pyspark(
    tmp_path: Path,
) -> None:
    launcher = python_launcher.interpreter(sys.executable, {"XDG_CACHE_HOME": str(tmp_path)})
    assert launcher != sys.executable and Path(launcher).parent == tmp_path / "spark-python"
    assert PYSPARK is not None
    zips = [str(PYSPARK / "python" / "lib" / "pyspark.zip")]
    zips += [str(z) for z in sorted((PYSPARK / "python" / "lib").glob("py4j-*-src.zip"))]
    # Spark's order: its zips, its core jar, then the user's entries (an empty one included).
    pythonpath, pyspark, py4j = _probe(
        launcher, PYSPARK, ":".join([*zips, "/opt/app/src", "", "/opt/lib"])
    )
    assert pythonpath == "/opt/app/src::/opt/lib"
    assert Path(pyspark).parent == PYSPARK and ".zip" not in py4j
    # Written once: the same interpreter and pyspark get the same file.
    again = python_launcher.interpreter(sys.executable, {"XDG_CACHE_HOME": str(tmp_path)})
    assert again == launcher


def test_with_another_spark_home_the_launcher_changes_nothing(tmp_path: Path) -> None:
    launcher = python_launcher.interpreter(sys.executable, {"XDG_CACHE_HOME": str(tmp_path)})
    assert PYSPARK is not None
    other = tmp_path / "spark-distribution"
    pythonpath = f"{other}/python/lib/pyspark.zip:{PYSPARK}/python/lib/pyspark.zip:/opt/app/src"
    assert _probe(launcher, other, pythonpath)[0] == pythonpath
    # Spark's zip named first: that interpreter imports it from the zip, as Spark meant.
    assert ".zip" in _probe(launcher, other, f"{PYSPARK}/python/lib/pyspark.zip")[1]


def test_an_interpreter_the_user_chose_is_kept(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), "PYSPARK_PYTHON": "/usr/local/bin/python3.11"}
    python_launcher.use_for_spark(env)
    assert env["PYSPARK_PYTHON"] == "/usr/local/bin/python3.11"
    assert Path(env["PYSPARK_DRIVER_PYTHON"]).parent == tmp_path / "spark-python"


def test_an_unwritable_cache_runs_spark_on_the_interpreter_itself(tmp_path: Path) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    assert python_launcher.interpreter(sys.executable, {"XDG_CACHE_HOME": str(blocked)}) == (
        sys.executable
    )


def test_the_sessions_planner_and_workers_import_the_compiled_pyspark(spark) -> None:
    """A Python data source's schema runs in the planner process that creates the source, its
    reader in a task's worker forked from Spark's daemon: both report where pyspark came from."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class Where(DataSource):
        @classmethod
        def name(cls) -> str:
            return "where_pyspark"

        def schema(self) -> str:
            import pyspark

            return "zip string" if ".zip" in pyspark.__file__ else "compiled string"

        def reader(self, schema):
            return WhereReader()

    class WhereReader(DataSourceReader):
        def read(self, partition):
            import pyspark

            yield (pyspark.__file__,)

    spark.dataSource.register(Where)
    frame = spark.read.format("where_pyspark").load()
    assert frame.columns == ["compiled"], "the planner process imported pyspark from the zip"
    worker_file = frame.collect()[0][0]
    assert ".zip" not in worker_file and Path(worker_file).parent == PYSPARK
