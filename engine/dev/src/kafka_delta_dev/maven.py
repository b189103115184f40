"""Jars by Maven coordinates, resolved with the Ivy that pyspark ships (what ``spark-submit
--packages`` resolves with), into a cache outside any repository: the cluster engine's connector
jars (:mod:`.connector_jars`) and Apache Kafka's broker (:mod:`.kafka_cluster`). A fresh machine
needs Python and Java only: no ``mvn``, no download script, no jar in git.

The cache is ``$KAFKA_DELTA_JAR_CACHE``, else ``$XDG_CACHE_HOME/kafka-delta/jars``, else
``~/.cache/kafka-delta/jars``: one folder per jar set (``<label>-<versions>-<digest>``), written
whole or not at all (a ``MANIFEST`` last), shared by this repository and the projects it
generates; Ivy's own cache of what it downloaded sits beside them (``ivy/``). A resolution that
failed (no network, an artifact the repository does not serve) leaves a ``FAILED`` file beside
the folder's place holding one sentence, which the tests and the broker report; it is tried
again only when asked (``retry``: ``scripts/bootstrap`` does, on every run).

Ivy's own default settings decide where artifacts come from (the public Maven repository, as
for ``--packages``); ``KAFKA_DELTA_IVY_SETTINGS=<file>`` gives an Ivy settings file of one's own
instead (a mirror, a repository behind a proxy), as ``spark.jars.ivySettings`` does for Spark.
Nothing here names a registry. Unlike Spark's resolver, Maven's local repository (``~/.m2``)
is not consulted: a folder there holding a POM without its jar (what ``mvn dependency:list``
leaves) makes Spark's resolution fail with "download failed".
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import quoteattr

MANIFEST = "MANIFEST"
FAILED = "FAILED"
IVY_TIMEOUT_S = 900
# Ivy's retrieve pattern: the artifact's name and the rest apart, so that a jar is known by
# its artifact (not guessed from a file name) when the set's filter decides what to keep.
_SEPARATOR = "@@"
_PATTERN = f"[artifact]{_SEPARATOR}[revision](-[classifier]).[ext]"


@dataclass(frozen=True)
class JarSet:
    """A set of jars to resolve: Maven coordinates (``group:artifact:version``) with their
    runtime dependencies; ``keep(artifact)`` says which resolved artifacts the folder holds."""

    label: str
    coordinates: tuple[str, ...]
    keep: Callable[[str], bool] = field(default=lambda artifact: True, compare=False)


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


class ResolutionError(RuntimeError):
    """Ivy could not give the jars: the message is the one sentence the tests report."""


def cache_root(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("KAFKA_DELTA_JAR_CACHE"):
        return Path(env["KAFKA_DELTA_JAR_CACHE"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "kafka-delta" / "jars"


def folder_for(jar_set: JarSet, root: Path | None = None) -> Path:
    """The cache folder of one jar set: readable, and unique to its coordinates."""
    coords = list(jar_set.coordinates)
    digest = hashlib.sha256("\n".join(coords).encode()).hexdigest()[:10]
    versions = "_".join(c.rsplit(":", 1)[-1] for c in coords)
    prefix = f"{jar_set.label}-" if jar_set.label else ""
    return (root or cache_root()) / f"{prefix}{versions}-{digest}"


def current(
    jar_set: JarSet, root: Path | None = None, environ: dict[str, str] | None = None
) -> Resolution:
    """What the cache holds for ``jar_set``, without resolving anything."""
    folder = folder_for(jar_set, root)
    if (folder / MANIFEST).is_file():
        return Resolution(folder)
    failed = _failed(folder)
    if failed.is_file():
        return Resolution(None, failed.read_text().strip())
    if _java(environ) is None:
        return Resolution(None, "Java (java) is not on PATH and JAVA_HOME is unset to fetch them")
    return Resolution(None, "they were never fetched here: run scripts/bootstrap")


def resolve(jar_set: JarSet, root: Path | None = None, *, retry: bool = False) -> Resolution:
    """The jars of ``jar_set`` in the cache, resolved with Ivy when they are not there yet. A
    failure is recorded (see the module docstring) and not tried again unless ``retry``."""
    folder = folder_for(jar_set, root)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one resolver at a time (two test workers, two clones)
        found = current(jar_set, root)
        if found.folder is not None or (not retry and _failed(folder).exists()):
            return found
        _failed(folder).unlink(missing_ok=True)
        try:
            _resolve_into(jar_set, folder)
        except ResolutionError as exc:
            _failed(folder).write_text(str(exc) + "\n")
            return Resolution(None, str(exc))
        return Resolution(folder)


def failed_before(jar_set: JarSet, root: Path | None = None) -> bool:
    """Whether a resolution of ``jar_set`` failed before (and was not tried again since)."""
    return _failed(folder_for(jar_set, root)).is_file()


def _failed(folder: Path) -> Path:
    return folder.with_name(folder.name + "." + FAILED)


def _java(environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    if env.get("JAVA_HOME"):
        candidate = Path(env["JAVA_HOME"]) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("java", path=env.get("PATH"))


def java_binary() -> str:
    """The ``java`` a JVM of ours runs with: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    java = _java()
    if java is None:
        raise ResolutionError("Java (java) is not on PATH and JAVA_HOME is unset")
    return java


def ivy_jar() -> Path:
    """The Ivy jar pyspark ships (``pyspark/jars/ivy-*.jar``)."""
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not found:
        raise ResolutionError("the installed pyspark ships no Ivy jar (pyspark/jars/ivy-*.jar)")
    return found[-1]


def _ivy_module(coords: tuple[str, ...]) -> str:
    deps = []
    for coordinate in coords:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"<dependency org={quoteattr(group)} name={quoteattr(artifact)} "
            f'rev={quoteattr(version)} conf="default->default"/>'
        )
    return (
        '<ivy-module version="2.0"><info organisation="local.kafka-delta" module="jars"/>'
        f"<dependencies>{''.join(deps)}</dependencies></ivy-module>\n"
    )


def _resolve_into(jar_set: JarSet, folder: Path) -> None:
    coords = jar_set.coordinates
    what = ", ".join(coords)
    java = _java()
    if java is None:
        raise ResolutionError("Java (java) is not on PATH and JAVA_HOME is unset to fetch them")
    command = [java, "-cp", str(ivy_jar()), "org.apache.ivy.Main"]
    settings = os.environ.get("KAFKA_DELTA_IVY_SETTINGS")
    if settings:
        command += ["-settings", settings]
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        (staging / "ivy.xml").write_text(_ivy_module(coords))
        retrieved = staging / "retrieved"
        command += [
            "-ivy",
            str(staging / "ivy.xml"),
            "-confs",
            "default",
            "-cache",
            str(folder.parent / "ivy"),
            "-retrieve",
            f"{retrieved}/{_PATTERN}",
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=IVY_TIMEOUT_S, cwd=staging
            )
        except subprocess.TimeoutExpired:
            raise ResolutionError(f"Ivy did not resolve {what} within {IVY_TIMEOUT_S} s") from None
        jars = sorted(retrieved.glob("*.jar")) if retrieved.is_dir() else []
        if done.returncode != 0 or not jars:
            why = _first_error(done.stdout + done.stderr)
            raise ResolutionError(f"Ivy could not resolve {what}: {why}")
        kept = staging / "kept"
        kept.mkdir()
        names = []
        for jar in jars:
            artifact, _, rest = jar.name.partition(_SEPARATOR)
            if jar_set.keep(artifact):
                name = f"{artifact}-{rest}"
                shutil.copy2(jar, kept / name)
                names.append(name)
        if not names:
            raise ResolutionError(f"Ivy listed no jar to keep for {what}")
        (kept / MANIFEST).write_text("\n".join([*coords, "", *sorted(names)]) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        kept.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _first_error(output: str) -> str:
    """What went wrong, in one clause: the modules Ivy could not find, else its first error
    line, without repository addresses."""
    unresolved = re.findall(r"::\s+([\w.-]+#[\w.-]+;[\w.-]+): not found", output)
    if unresolved:
        return f"its repository does not serve {', '.join(dict.fromkeys(unresolved))}"
    failed = re.findall(r"::\s+([\w.-]+#[\w.-]+;[\w.-]+!\S+)", output)
    if failed:
        return f"the download of {failed[0]} failed (is the network up?)"
    for line in output.splitlines():
        text = line.strip()
        if text.startswith(("Exception", "java.", "Error", "::  ERROR", "ERROR", "Caused by")):
            return re.sub(r"\s*\(?https?://[^\s)]*\)?", "", text)[:300]
    return (output.strip().splitlines() or ["no output"])[-1][:300]
