"""The class-data archive of Spark's JVM classes: its key, its life cycle, and a real JVM that
records one at exit and then maps it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kafka_delta.runtime import jvm_archive
from kafka_delta.runtime.jvm_archive import DYNAMIC_MAGIC
from kafka_delta_dev.pytest_plugin import NEEDS_JAVA, NO_JAVA


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in jvm_archive.CLASSPATH_VARIABLES}
    env.pop("SPARK_HOME", None)
    env[jvm_archive.ENV] = str(tmp_path / "archives")
    env.update(extra)
    return env


def _fake_spark(tmp_path: Path) -> Path:
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"one")
    return home


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_the_key_names_the_jdk_and_the_jars_and_is_none_where_the_jdk_cannot_archive(
    tmp_path: Path,
) -> None:
    home = _fake_spark(tmp_path)
    env = _env(tmp_path, SPARK_HOME=str(home))
    first = jvm_archive.key(env)
    assert first is not None and first == jvm_archive.key(env)

    (home / "jars" / "spark-core.jar").write_bytes(b"a new build")
    assert jvm_archive.key(env) not in {None, first}
    assert jvm_archive.key({**env, "SPARK_DIST_CLASSPATH": "/opt/extra/*"}) != jvm_archive.key(env)

    # A non-empty folder on the JVM's class path: the JDK would fail the JVM's exit.
    (home / "conf").mkdir()
    assert jvm_archive.key(env) is not None  # empty: harmless
    (home / "conf" / "spark-defaults.conf").write_text("spark.master local[2]\n")
    assert jvm_archive.key(env) is None
    assert jvm_archive.java_options(os.getpid(), env) == []

    # No jars folder, or no JDK at all.
    assert jvm_archive.key({**env, "SPARK_HOME": str(tmp_path / "nowhere")}) is None
    assert jvm_archive.key({**env, "JAVA_HOME": str(tmp_path / "no-jdk")}) is None


def test_off_asks_for_nothing_and_the_default_folder_is_the_user_cache(tmp_path: Path) -> None:
    assert jvm_archive.java_options(os.getpid(), {jvm_archive.ENV: "off"}) == []
    assert jvm_archive.directory({"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "spark-class-archive"
    )


def test_a_recording_becomes_the_archive_once_complete_and_is_dropped_if_its_jvm_died(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "archives"
    folder.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    recording = folder / f"spark-k1.{os.getpid()}.recording"  # this process: still recording
    recording.write_bytes(b"\0" * 64)
    abandoned = folder / f"spark-k1.{dead.pid}.recording"  # its JVM is gone without a header
    abandoned.write_bytes(b"\0" * 64)
    other_key = folder / f"spark-k2.{dead.pid}.recording"
    other_key.write_bytes(b"\0" * 64)

    assert jvm_archive.promote(folder, "k1") is None
    assert recording.exists() and not abandoned.exists() and other_key.exists()

    recording.write_bytes(DYNAMIC_MAGIC + b"\0" * 60)  # the JDK wrote the header: complete
    assert jvm_archive.promote(folder, "k1") == folder / "spark-k1.jsa"
    assert not recording.exists()
    assert (folder / "spark-k1.jsa").read_bytes()[:4] == DYNAMIC_MAGIC


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_options_record_first_then_map_the_archive_and_unused_archives_are_pruned(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path)
    archive_key = jvm_archive.key(env)
    assert archive_key is not None
    folder = tmp_path / "archives"
    options = jvm_archive.java_options(4242, env)
    assert options == [
        f"-XX:ArchiveClassesAtExit={folder}/spark-{archive_key}.4242.recording",
        jvm_archive.RECORD_LOGGING,
    ]
    (folder / f"spark-{archive_key}.4242.recording").write_bytes(DYNAMIC_MAGIC)
    stale = folder / "spark-0123456789abcdef.jsa"
    stale.write_bytes(DYNAMIC_MAGIC)
    month_ago = time.time() - 31 * 86400
    os.utime(stale, (month_ago, month_ago))

    assert jvm_archive.java_options(4243, env) == [
        f"-XX:SharedArchiveFile={folder}/spark-{archive_key}.jsa"
    ]
    assert not stale.exists()


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_a_start_while_another_jvm_records_neither_records_nor_maps_and_python_runs_only_map(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path)
    archive_key = jvm_archive.key(env)
    assert archive_key is not None
    folder = tmp_path / "archives"
    folder.mkdir()
    # A plain `python -m` run never records (pyspark starts its JVM: its pid is not known).
    assert jvm_archive.mapping_options(env) == []
    assert not list(folder.iterdir())

    recording = jvm_archive.java_options(os.getpid(), env)  # this process: still running
    assert recording[0].startswith("-XX:ArchiveClassesAtExit=")
    # Two concurrent starts (two workers, two runs) record one archive, not two of ~150 MB.
    assert jvm_archive.java_options(4243, env) == []
    assert jvm_archive.mapping_options(env) == []
    assert len(list(folder.glob("*.recording"))) == 1

    (folder / f"spark-{archive_key}.{os.getpid()}.recording").write_bytes(DYNAMIC_MAGIC)
    archive = f"-XX:SharedArchiveFile={folder}/spark-{archive_key}.jsa"
    assert jvm_archive.mapping_options(env) == [archive]
    assert jvm_archive.java_options(4243, env) == [archive]
    assert jvm_archive.mapping_options({**env, jvm_archive.ENV: "off"}) == []


def test_an_unwritable_folder_costs_the_archive_not_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = _env(tmp_path, **{jvm_archive.ENV: str(blocker / "archives")})
    if jvm_archive.key(env) is None:
        pytest.skip("no archive can be made here (no JDK, or no base CDS archive)")
    assert jvm_archive.java_options(os.getpid(), env) == []


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_no_recording_where_the_archive_might_not_fit_a_failed_write_would_fail_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A JVM that cannot write its recording at exit exits with status 1 whatever its run did.
    env = _env(tmp_path)
    if jvm_archive.key(env) is None:
        pytest.skip("no archive can be made here (no base CDS archive, or a folder on the path)")
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        jvm_archive.shutil,
        "disk_usage",
        lambda path: usage._replace(free=jvm_archive.RECORD_FREE_BYTES - 1),
    )
    assert jvm_archive.java_options(os.getpid(), env) == []
    assert list((tmp_path / "archives").iterdir()) == []


def test_options_are_one_string_spark_splits_back_into_the_same_options() -> None:
    options = ["-XX:SharedArchiveFile=/home/a user/.cache/x.jsa", "-Xlog:cds=error"]
    assert jvm_archive.option_string(options) == (
        '"-XX:SharedArchiveFile=/home/a user/.cache/x.jsa" -Xlog:cds=error'
    )


SESSION = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", sys.argv[1])
        .getOrCreate()
    )
    assert spark.range(10).count() == 10
    spark.stop()
    """
)


@pytest.mark.skipif(NO_JAVA, reason=NEEDS_JAVA)
def test_a_spark_jvm_records_the_archive_at_exit_and_the_next_one_loads_classes_from_it(
    spark_class_archive: Path, tmp_path: Path
) -> None:
    """The archive every test's JVM maps: a real Spark JVM recorded it as it exited (once per
    test environment, tests/suite_plugin.py, through java_options and promote), and a JVM that
    maps it loads Spark's classes from it."""
    env = dict(os.environ)
    archive_key = jvm_archive.key(env)
    if archive_key is None:
        pytest.skip("no archive can be made here (no base CDS archive, or a folder on the path)")
    # The other worker may be recording it right now: the JVM writes it as it exits.
    deadline = time.monotonic() + 180
    while (archive := jvm_archive.promote(spark_class_archive, archive_key)) is None:
        assert time.monotonic() < deadline, sorted(p.name for p in spark_class_archive.iterdir())
        time.sleep(0.5)
    with archive.open("rb") as file:
        assert file.read(4) == DYNAMIC_MAGIC  # complete: the JDK writes the header last

    mapping = jvm_archive.java_options(os.getpid(), env)
    assert mapping == [f"-XX:SharedArchiveFile={archive}"]
    loads = tmp_path / "class-load.log"
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            SESSION,
            jvm_archive.option_string([*mapping, f"-Xlog:class+load=info:file={loads}"]),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    from_archive = [line for line in loads.read_text().splitlines() if "(top)" in line]
    # "source: shared objects file (top)": mapped from the archive the recording run wrote.
    assert len(from_archive) > 3000, len(from_archive)
    assert any("org.apache.spark.SparkContext " in line for line in from_archive)
