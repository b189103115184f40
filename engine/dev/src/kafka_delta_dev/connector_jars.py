"""The cluster engine's connector jars, from Maven Central through the machine's Maven, into a
cache outside any repository: what a PySpark user's ``spark-submit --packages`` fetches, got
ahead of time so that tests, local runs and the bench find them without a variable set.

    python -m kafka_delta_dev.connector_jars resolve   # mvn once per version; prints the folder
    python -m kafka_delta_dev.connector_jars folder    # the folder, or exit 1 and the reason

What is resolved: the coordinates :func:`kafka_delta.runtime.connectors.connector_packages` gives
for the installed pyspark and delta-spark (``io.delta:delta-spark_<spark>_2.13``, Spark's
``spark-sql-kafka-0-10_2.13``), with their runtime dependencies as Maven resolves them
(``delta-storage``, Delta's kernel, ``kafka-clients``, ``commons-pool2``, Spark's kafka token
provider, ...). A jar whose artifact pyspark already ships (Scala, Jackson, Hadoop's client,
Parquet, log4j...) is left out: Spark's own copy is the one its classes were built against, and
the one a classic session loads first anyway. The versions are declared once, by the pins of
pyspark and delta-spark.

The cache is ``$KAFKA_DELTA_JAR_CACHE``, else ``$XDG_CACHE_HOME/kafka-delta/jars``, else
``~/.cache/kafka-delta/jars``: one folder per coordinate set, written whole or not at all (a
``MANIFEST`` last), shared by this repository and the projects it generates. A resolution that
could not run (no ``mvn``) or failed (Maven could not reach its registry, an artifact it does not
serve) leaves a ``FAILED`` file beside the folder's place holding one sentence, which the tests
report as their skip reason. Maven's own settings decide where artifacts come from: nothing here
names a registry.

``KAFKA_DELTA_JARS=<folder>`` (read by the pytest plugin and the run scripts) still overrides the
cache with a folder of one's own.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "MANIFEST"
FAILED = "FAILED"
MVN_TIMEOUT_S = 900


def coordinates() -> list[str]:
    """The connectors' Maven coordinates for the installed pyspark and delta-spark."""
    from kafka_delta.runtime.connectors import connector_packages

    return connector_packages()


def cache_root(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("KAFKA_DELTA_JAR_CACHE"):
        return Path(env["KAFKA_DELTA_JAR_CACHE"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "kafka-delta" / "jars"


def folder_for(coords: list[str], root: Path | None = None) -> Path:
    """The cache folder of one coordinate set: readable, and unique to the set."""
    digest = hashlib.sha256("\n".join(coords).encode()).hexdigest()[:10]
    versions = "_".join(c.rsplit(":", 1)[-1] for c in coords)
    return (root or cache_root()) / f"{versions}-{digest}"


@dataclass(frozen=True)
class Resolution:
    """Where the jars are (``folder``), or why there are none (``reason``, one sentence)."""

    folder: Path | None
    reason: str | None = None

    @property
    def jars(self) -> list[str]:
        if self.folder is None:
            return []
        return sorted(str(p) for p in self.folder.glob("*.jar"))


def current(
    coords: list[str] | None = None, root: Path | None = None, path: str | None = None
) -> Resolution:
    """What the cache holds for ``coords`` (the installed versions' by default), without
    resolving anything; ``path``: the PATH Maven is looked for on (this process's)."""
    coords = coords if coords is not None else coordinates()
    folder = folder_for(coords, root)
    if (folder / MANIFEST).is_file():
        return Resolution(folder)
    failed = folder.with_name(folder.name + "." + FAILED)
    if failed.is_file():
        return Resolution(None, failed.read_text().strip())
    if shutil.which("mvn", path=path) is None:
        return Resolution(None, "Maven (mvn) is not on PATH to fetch them")
    return Resolution(
        None, "they were never fetched here: run scripts/bootstrap (it resolves them with mvn)"
    )


def resolve(
    coords: list[str] | None = None, root: Path | None = None, *, retry: bool = False
) -> Resolution:
    """The jars of ``coords`` in the cache, resolved with ``mvn`` when they are not there yet.
    A failure is recorded (see the module docstring) and not retried unless ``retry``; a later
    call with Maven fixed passes ``retry`` (scripts/bootstrap does on every run)."""
    coords = coords if coords is not None else coordinates()
    folder = folder_for(coords, root)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one resolver at a time (two test workers, two clones)
        found = current(coords, root)
        if found.folder is not None or (found.reason and not retry and _failed(folder).exists()):
            return found
        _failed(folder).unlink(missing_ok=True)
        try:
            _resolve_into(coords, folder)
        except ResolutionError as exc:
            _failed(folder).write_text(str(exc) + "\n")
            return Resolution(None, str(exc))
        return Resolution(folder)


def _failed(folder: Path) -> Path:
    return folder.with_name(folder.name + "." + FAILED)


class ResolutionError(RuntimeError):
    """Maven could not give the jars: the message is the one sentence the tests report."""


def _pom(coords: list[str]) -> str:
    deps = []
    for coordinate in coords:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">'
        "<modelVersion>4.0.0</modelVersion>"
        "<groupId>local.kafka-delta</groupId><artifactId>connector-jars</artifactId>"
        "<version>1</version><packaging>pom</packaging>"
        f"<dependencies>{''.join(deps)}</dependencies></project>\n"
    )


# dependency:list with absolute file names: "   group:artifact:jar:version:scope:/path/x.jar"
# (a classifier adds a field before the version).
_LISTED = re.compile(
    r"^\s*([^:\s]+):([^:\s]+):jar:(?:[^:\s]+:)?([^:\s]+):(compile|runtime):(.+\.jar)"
)


def _resolve_into(coords: list[str], folder: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ResolutionError("Maven (mvn) is not on PATH to fetch them")
    with tempfile.TemporaryDirectory(prefix="kafka-delta-jars-") as work:
        work_dir = Path(work)
        (work_dir / "pom.xml").write_text(_pom(coords))
        listing = work_dir / "list.txt"
        try:
            done = subprocess.run(
                [
                    mvn,
                    "-B",
                    "-q",
                    "-U",  # a failure Maven cached is asked again
                    "dependency:list",
                    "-DincludeScope=runtime",
                    "-DoutputAbsoluteArtifactFilename=true",
                    f"-DoutputFile={listing}",
                ],
                cwd=work_dir,
                capture_output=True,
                text=True,
                timeout=MVN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise ResolutionError(
                f"Maven did not resolve {', '.join(coords)} within {MVN_TIMEOUT_S} s"
            ) from None
        if done.returncode != 0 or not listing.is_file():
            why = _first_error(done.stdout + done.stderr)
            raise ResolutionError(f"Maven could not resolve {', '.join(coords)}: {why}")
        shipped = _spark_jar_names()
        chosen = []
        for line in listing.read_text().splitlines():
            match = _LISTED.match(line)
            if match is None:
                continue
            artifact, path = match.group(2), Path(match.group(5))
            if any(re.match(re.escape(artifact) + r"-\d", name) for name in shipped):
                continue  # Spark ships its own copy
            chosen.append(path)
        if not chosen:
            raise ResolutionError(f"Maven listed no jar for {', '.join(coords)}")
        staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        try:
            for path in chosen:
                shutil.copy2(path, staging / path.name)
            (staging / MANIFEST).write_text(
                "\n".join([*coords, "", *sorted(p.name for p in chosen)]) + "\n"
            )
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _first_error(output: str) -> str:
    """What went wrong, from Maven's first error line: the artifact it could not find, or the
    line itself without its log prefix, colour codes and repository addresses."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", output)
    for line in clean.splitlines():
        if line.startswith("[ERROR]") and line.strip() != "[ERROR]":
            text = re.sub(r"\s*\(?https?://[^\s)]*\)?", "", line.removeprefix("[ERROR]").strip())
            missing = re.search(
                r"([\w.-]+:[\w.-]+:jar:[\w.-]+) was not found|Could not find artifact ([\w.:-]+)",
                text,
            )
            if missing:
                return f"its repository does not serve {missing.group(1) or missing.group(2)}"
            return re.sub(r"^Failed to execute goal .*? on project [^:]+: ", "", text)[:300]
    return (clean.strip().splitlines() or ["no output"])[-1][:300]


def _spark_jar_names() -> list[str]:
    import pyspark

    return sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def local_folder(environ: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """The folder of connector jars this machine gives a local session: ``KAFKA_DELTA_JARS``
    when set, else this cache's folder for the installed versions; with None, why there is
    none (one clause, for a skip's reason)."""
    env = dict(os.environ) if environ is None else environ
    if env.get("KAFKA_DELTA_JARS"):
        return env["KAFKA_DELTA_JARS"], None
    found = current(root=cache_root(env), path=env.get("PATH"))
    return (str(found.folder), None) if found.folder is not None else (None, found.reason)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "folder"
    if command == "resolve":  # prints the folder (stdout) and what it holds (stderr)
        found = resolve(retry=True)
        if found.folder is None:
            print(f"connector jars: none ({found.reason})", file=sys.stderr)
            return 1
        print(f"connector jars: {len(found.jars)} in {found.folder}", file=sys.stderr)
        print(found.folder)
        return 0
    if command == "folder":
        found = current()
        if found.folder is None:
            print(f"no connector jars: {found.reason}", file=sys.stderr)
            return 1
        print(found.folder)
        return 0
    print("usage: python -m kafka_delta_dev.connector_jars [resolve|folder]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
