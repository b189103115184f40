"""The cluster engine's connector jars (delta-spark, Spark's kafka source and their runtime
dependencies), by the versions of the installed pyspark and delta-spark, resolved with the Ivy
that pyspark ships (:mod:`.maven`) into the user's cache: what a PySpark user's ``spark-submit
--packages`` fetches, got ahead of time so that tests, local runs and the bench find them without
a variable set, and without Maven.

    python -m kafka_delta_dev.connector_jars resolve   # Ivy once per version; prints the folder
    python -m kafka_delta_dev.connector_jars folder    # the folder, or exit 1 and the reason

What is resolved: the coordinates :func:`kafka_delta.runtime.connectors.connector_packages` gives
(``io.delta:delta-spark_<spark>_2.13``, Spark's ``spark-sql-kafka-0-10_2.13``), with their
runtime dependencies (``delta-storage``, Delta's kernel, ``kafka-clients``, ``commons-pool2``,
Spark's kafka token provider, ...). A jar whose artifact pyspark already ships (Scala, Jackson,
Hadoop's client, Parquet, log4j...) is left out: Spark's own copy is the one its classes were
built against, and the one a classic session loads first anyway.

``KAFKA_DELTA_JARS=<folder>`` (read by the pytest plugin and the run scripts) still overrides the
cache with a folder of one's own.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from kafka_delta_dev import maven
from kafka_delta_dev.maven import FAILED, MANIFEST, Resolution, cache_root

__all__ = [
    "FAILED",
    "MANIFEST",
    "Resolution",
    "cache_root",
    "coordinates",
    "current",
    "folder_for",
    "jar_set",
    "local_folder",
    "resolve",
]


def coordinates() -> list[str]:
    """The connectors' Maven coordinates for the installed pyspark and delta-spark."""
    from kafka_delta.runtime.connectors import connector_packages

    return connector_packages()


def jar_set(coords: list[str] | None = None) -> maven.JarSet:
    shipped = _spark_jar_names()

    def not_shipped(artifact: str) -> bool:
        return not any(re.match(re.escape(artifact) + r"-\d", name) for name in shipped)

    return maven.JarSet("", tuple(coords if coords is not None else coordinates()), not_shipped)


def folder_for(coords: list[str], root: Path | None = None) -> Path:
    """The cache folder of one coordinate set."""
    return maven.folder_for(maven.JarSet("", tuple(coords)), root)


def current(
    coords: list[str] | None = None,
    root: Path | None = None,
    environ: dict[str, str] | None = None,
) -> Resolution:
    """What the cache holds for ``coords`` (the installed versions' by default), without
    resolving anything; ``environ``: where Java is looked for (this process's environment)."""
    return maven.current(maven.JarSet("", tuple(coords or coordinates())), root, environ)


def resolve(
    coords: list[str] | None = None, root: Path | None = None, *, retry: bool = False
) -> Resolution:
    """The jars of ``coords`` in the cache, resolved with Ivy when they are not there yet."""
    return maven.resolve(jar_set(coords), root, retry=retry)


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
    found = current(root=cache_root(env), environ=env)
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
