"""A class-data archive of Spark's JVM classes (JDK AppCDS), so that local runs start sooner.

A Spark driver JVM loads over 12,000 classes before its first batch. The JDK can map them from an
archive instead of reading, verifying and linking them one by one at every start. Measured on 2
cores: Spark session 4.0 -> 2.6 s, stream set-up 2.8 -> 2.2 s. Recording costs once: a slower
first start, and ~10 s at its JVM's exit to write the archive.

1. When no archive exists, the run records one: its JVM gets
   ``-XX:ArchiveClassesAtExit=<dir>/spark-<key>.<pid>.recording`` and writes the classes it loaded
   there when it exits (~150 MB; a run killed with SIGKILL writes none, and the next records).
2. The next start promotes a complete recording to ``spark-<key>.jsa``. The JDK writes an
   archive's header last, so a recording whose header carries the dynamic-archive magic number is
   complete. An incomplete one whose JVM is gone is deleted.
3. Later starts map it: ``-XX:SharedArchiveFile=<dir>/spark-<key>.jsa``.

The key names the JDK (its home, its class image, its base archive) and the JVM's class path
(Spark's jars, the folders and variables the launcher adds). A new JDK or a new pyspark gets a new
archive. The JDK checks the archive itself at every start anyway: on any mismatch it prints one
warning and runs without it, and a damaged file is ignored.

Only local runs use it: ``scripts/run_local.sh`` and the benchmark record and map it, a plain
``python -m <package>`` run with a local master maps one that exists (:func:`mapping_options`;
pyspark starts its JVM, whose process id is not known in advance, so it records none), and a
start while another JVM records the archive does neither. A Databricks job never calls this
module. ``SPARK_CLASS_ARCHIVE=off`` turns it off; ``SPARK_CLASS_ARCHIVE=<dir>`` keeps the archives
in ``<dir>`` instead of ``${XDG_CACHE_HOME:-~/.cache}/spark-class-archive``. An archive not used
for 30 days is deleted.

    python -m kafka_delta.runtime.jvm_archive options --pid <pid of the JVM to start>
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from kafka_delta.runtime.processes import pid_exists

ENV = "SPARK_CLASS_ARCHIVE"
# First 4 bytes of a JDK dynamic archive (CDS_DYNAMIC_ARCHIVE_MAGIC), little-endian.
DYNAMIC_MAGIC = (0xF00BABA8).to_bytes(4, "little")
# While recording, the JDK warns about every class it cannot archive (old class-file versions,
# generated accessors): dozens of lines at exit that say nothing about the run.
RECORD_LOGGING = "-Xlog:cds=error,cds+dynamic=error"
UNUSED_DAYS = 30
# A JVM that cannot write its recording at exit exits with status 1 ("Unable to create shared
# archive file"), whatever its run did: record only where a ~150 MB file surely fits.
RECORD_FREE_BYTES = 1 << 30
# Variables whose folders or entries Spark's launcher puts on the JVM's class path.
CLASSPATH_VARIABLES = ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH")


def directory(env: Mapping[str, str] = os.environ) -> Path | None:
    """Where the archives are kept, or None when ``SPARK_CLASS_ARCHIVE=off``."""
    setting = env.get(ENV, "").strip()
    if setting.lower() in {"off", "0", "false", "no"}:
        return None
    if setting:
        return Path(setting).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "spark-class-archive"


def java_home(env: Mapping[str, str] = os.environ) -> Path | None:
    """The JDK that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    if env.get("JAVA_HOME"):
        java = Path(env["JAVA_HOME"]) / "bin" / "java"
    else:
        found = shutil.which("java", path=env.get("PATH"))
        if found is None:
            return None
        java = Path(found)
    java = java.resolve()
    return java.parents[1] if java.is_file() else None


def spark_home(env: Mapping[str, str] = os.environ) -> Path | None:
    """``$SPARK_HOME``, else the installed pyspark package (its ``jars/`` is Spark's)."""
    if env.get("SPARK_HOME"):
        return Path(env["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _classpath_folders(spark: Path, env: Mapping[str, str]) -> list[Path]:
    folders = [Path(env.get("SPARK_CONF_DIR") or spark / "conf")]
    folders += [Path(env[name]) for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR") if env.get(name)]
    for entry in env.get("SPARK_DIST_CLASSPATH", "").split(os.pathsep):
        if entry and not entry.endswith("*"):
            folders.append(Path(entry))
    return [folder for folder in folders if folder.is_dir()]


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}"


def key(env: Mapping[str, str] = os.environ) -> str | None:
    """What the archive depends on, hashed; None when no archive can be made here: no JDK, a JDK
    without its base archive (``-Xshare`` off), no ``jars/`` folder, or a non-empty folder on the
    class path (the JDK refuses to archive then, and fails the JVM's exit)."""
    jdk, spark = java_home(env), spark_home(env)
    if jdk is None or spark is None or not (spark / "jars").is_dir():
        return None
    base = [jdk / "lib" / "server" / name for name in ("classes.jsa", "classes_nocoops.jsa")]
    modules = jdk / "lib" / "modules"
    if not modules.is_file() or not any(path.is_file() for path in base):
        return None
    if any(any(folder.iterdir()) for folder in _classpath_folders(spark, env)):
        return None
    parts = [str(jdk), _stamp(modules)] + [_stamp(path) for path in base if path.is_file()]
    parts += [str(spark), *sorted(_stamp(jar) for jar in (spark / "jars").glob("*.jar"))]
    parts += [f"{name}={env.get(name, '')}" for name in CLASSPATH_VARIABLES]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _complete(recording: Path) -> bool:
    try:
        with recording.open("rb") as file:
            return file.read(4) == DYNAMIC_MAGIC
    except OSError:
        return False


def promote(folder: Path, archive_key: str) -> Path | None:
    """Turn a complete recording of this key into the archive; delete recordings whose JVM is
    gone without finishing. Returns the archive's path when there is one."""
    archive = folder / f"spark-{archive_key}.jsa"
    for recording in sorted(folder.glob(f"spark-{archive_key}.*.recording")):
        if _complete(recording):
            os.replace(recording, archive)
            continue
        owner = recording.name.split(".")[1]
        if not owner.isdigit() or not pid_exists(int(owner)):
            recording.unlink(missing_ok=True)
    return archive if archive.is_file() else None


def prune(folder: Path, now: float | None = None) -> list[Path]:
    """Delete archives not used for :data:`UNUSED_DAYS` days (a use touches its file)."""
    cutoff = (time.time() if now is None else now) - UNUSED_DAYS * 86400
    gone = []
    for archive in folder.glob("spark-*.jsa"):
        if archive.stat().st_mtime < cutoff:
            archive.unlink(missing_ok=True)
            gone.append(archive)
    return gone


def java_options(pid: int, env: Mapping[str, str] = os.environ) -> list[str]:
    """The JVM options of a local Spark driver whose process id will be ``pid``: map the archive,
    or record one at exit; nothing when archives are off or cannot be made here."""
    folder, archive_key = directory(env), key(env)
    if folder is None or archive_key is None:
        return []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        prune(folder)
        archive = promote(folder, archive_key)
        if archive is not None:
            os.utime(archive)
            return [f"-XX:SharedArchiveFile={archive}"]
        if any(folder.glob(f"spark-{archive_key}.*.recording")):
            return []  # another JVM, still running, records this archive: one is enough
        recording = folder / f"spark-{archive_key}.{pid}.recording"
        recording.touch()  # the folder takes files: the JVM replaces this one as it exits
        if shutil.disk_usage(folder).free < RECORD_FREE_BYTES:
            recording.unlink()
            return []
    except OSError as exc:  # an unwritable cache folder costs the speed-up, never the run
        print(f"jvm_archive: {folder}: {exc}; starting without a class archive", file=sys.stderr)
        return []
    return [f"-XX:ArchiveClassesAtExit={recording}", RECORD_LOGGING]


def mapping_options(env: Mapping[str, str] = os.environ) -> list[str]:
    """The JVM options that map the archive when one exists, else nothing: for a driver whose
    process id is not known before it starts (a plain ``python -m`` run, where pyspark starts
    the JVM), so it never records one; ``scripts/run_local.sh`` and the benchmark record."""
    folder, archive_key = directory(env), key(env)
    if folder is None or archive_key is None or not folder.is_dir():
        return []
    try:
        archive = promote(folder, archive_key)
        if archive is None:
            return []
        os.utime(archive)
    except OSError:
        return []
    return [f"-XX:SharedArchiveFile={archive}"]


def option_string(options: list[str]) -> str:
    """Options as one string for ``--driver-java-options`` or ``spark.driver.extraJavaOptions``,
    which Spark splits at spaces outside double quotes (a cache folder may have spaces)."""

    def quoted(option: str) -> str:
        if not any(c.isspace() or c in '"\\' for c in option):
            return option
        return '"' + option.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return " ".join(quoted(option) for option in options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=f"python -m {__package__}.jvm_archive",
        description=__doc__.split("\n\n")[0],
    )
    commands = parser.add_subparsers(dest="command", required=True)
    options = commands.add_parser(
        "options", allow_abbrev=False, help="print the JVM options of a local driver"
    )
    options.add_argument(
        "--pid",
        type=int,
        required=True,
        help="process id the JVM will have (a script that execs spark-submit: its own, $$)",
    )
    args = parser.parse_args(argv)
    try:
        options = java_options(args.pid)
    except Exception as exc:  # the archive only saves time: a run never fails for it
        print(f"jvm_archive: {exc!r}; starting without a class archive", file=sys.stderr)
        options = []
    if options and options[0].startswith("-XX:ArchiveClassesAtExit="):
        print(
            "jvm_archive: this run's JVM records a class archive of Spark's classes as it "
            f"exits (once: ~10 s more at exit, ~150 MB in {directory()}); later runs start "
            f"~2-3 s sooner. {ENV}=off skips it.",
            file=sys.stderr,
        )
    print(option_string(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
