"""An error raised inside Spark, told in one line: the Python exception that ended the run (its
type and message) and whose code raised it (the transform, the decoder, Kafka's read task, the
sink).

An exception raised in a Spark task (a transform's UDF, the embedded source's read task, the
decoder running there) reaches the driver wrapped: Spark's ``PythonException`` inside a
``StreamingQueryException``, whose first lines say only "An exception was thrown from the Python
worker:". The worker's traceback is in the text, as Python printed it (classic and Spark Connect
sessions alike, whose exception classes differ: ``pyspark.errors.exceptions.captured`` or
``.connect``), so the text is read, never the class: the last ``Traceback (most recent call
last):`` in it is that of the exception raised last (the worker's, which the driver's traceback
holds in its message; of a chained one, the one raised from its cause), its ``File`` lines are
the frames, and the first unindented line after them is ``Type: message``. An exception raised
on the driver carries its own frames.

Whose it is comes from the frames, innermost first: the first frame in the transform's package
(the config's ``transform:`` module) or in one of the engine's parts that run user data
(``kafka_delta.decoding``, ``kafka_delta.sources`` / ``kafka_delta.kafka``,
``kafka_delta.sinks`` and the tables they reach through :mod:`kafka_delta.delta`) names it.
The full trace stays in the log; this is its last line.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: ?(?P<message>.*))?$")

# The engine's parts that run on the records, by the folder of their modules: what a frame in
# each tells the user.
_ENGINE_PARTS = (
    ("kafka_delta/decoding/", "in the decoder"),
    ("kafka_delta/sources/", "reading Kafka"),  # the read task
    ("kafka_delta/kafka/", "talking to Kafka"),  # metadata, commit-back
    ("kafka_delta/sinks/", "in the sink"),
    # The tables as the sinks and their offset stores reach them: the Delta layer's modules
    # that moved out of sinks/, still told as the sink's.
    ("kafka_delta/delta/spark_table.py", "in the sink"),
    ("kafka_delta/delta/spark_commit.py", "in the sink"),
    ("kafka_delta/delta/spark_offset_store.py", "in the sink"),
    ("kafka_delta/delta/commit_copies.py", "in the sink"),
    ("kafka_delta/delta/rs_offset_store.py", "in the sink"),
)


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str


@dataclass(frozen=True)
class PythonError:
    """The Python exception that ended a run: its class name (without its module), the first
    line of its message, and its frames, outermost first."""

    type: str
    message: str
    frames: tuple[Frame, ...]


def python_error(exc: BaseException) -> PythonError | None:
    """The Python exception ``exc`` reports in its text (a Spark task's, see the module
    docstring), else ``exc`` itself when it is a Python exception raised on the driver; None
    for a failure of Spark's own (a JVM error with no Python traceback)."""
    parsed = _parse(str(exc))
    if parsed is not None:
        return parsed
    if _is_spark_wrapper(type(exc)):
        return None
    frames = tuple(
        Frame(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)
    )
    return PythonError(type(exc).__name__, _first_line(str(exc)), frames)


def _is_spark_wrapper(cls: type) -> bool:
    return cls.__module__.startswith(("pyspark.", "py4j."))


def _parse(text: str) -> PythonError | None:
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    frames: list[Frame] = []
    lines = text[at + len(_TRACEBACK) :].splitlines()
    for index, line in enumerate(lines):
        frame = _FRAME.match(line)
        if frame is not None:
            frames.append(Frame(frame["path"], int(frame["line"]), frame["function"].strip()))
            continue
        if not line.strip() or line[0].isspace():
            continue  # a frame's source line, its ^^^ marks, "[Previous line repeated ...]"
        raised = _RAISED.match(line.strip())
        if raised is None:
            return None
        message = (raised["message"] or "").strip()
        # py4j's "An error occurred while calling o42.save." puts the Java error on the next
        # line, after ": "; a message ending in ":" continues there too.
        rest = [x for x in lines[index + 1 :] if x.strip()]
        if rest and (rest[0].startswith(": ") or message.endswith(":")):
            message = f"{message} {rest[0].removeprefix(': ').strip()}".strip()
        return PythonError(raised["type"].rsplit(".", 1)[-1], message, tuple(frames))
    return None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def origin(error: PythonError, transform: str | None) -> tuple[str, str] | None:
    """(whose code raised ``error``, as "in the transform", and where: the innermost frame of
    it), by the frames' files; None when no frame is the transform's or the engine's (e.g. an
    error in Spark's own Python worker)."""
    module = transform.split(":", 1)[0] if transform else None
    # The transform's package (its helpers too); only its own module when that package is the
    # engine's (a transform the engine ships, such as kafka_delta.contract:passthrough).
    package = module.split(".", 1)[0] if module else None
    mine = module if package == "kafka_delta" else package
    for frame in reversed(error.frames):
        path = frame.path.replace("\\", "/")
        if mine is not None and _in_module(path, mine):
            return "in the transform", _where(frame, package)
        for folder, whose in _ENGINE_PARTS:
            if f"/{folder}" in path:
                return whose, _where(frame, "kafka_delta")
    return None


def _in_module(path: str, module: str) -> bool:
    """Whether the file ``path`` is module (or package) ``module`` or lies inside it."""
    name = "/" + module.replace(".", "/")
    return f"{name}/" in path or path.endswith(f"{name}.py")


def _where(frame: Frame, package: str | None = None) -> str:
    """A frame as a person finds it: the file from its package down (else its name), line and
    function."""
    parts = frame.path.replace("\\", "/").split("/")
    stem = [p.removesuffix(".py") for p in parts]
    start = max((i for i, p in enumerate(stem) if p == package), default=len(parts) - 1)
    return f"{'/'.join(parts[start:])} line {frame.line}, in {frame.function}"


def describe(exc: BaseException, transform: str | None) -> str | None:
    """One line naming the Python exception behind ``exc``, and whose code raised it:
    ``ValueError: boom, raised in the transform (boom.py line 8, in parse)``; None when ``exc``
    reports no Python exception."""
    error = python_error(exc)
    if error is None:
        return None
    said = f"{error.type}: {error.message}" if error.message else error.type
    found = origin(error, transform)
    if found is not None:
        whose, where = found
        return f"{said}, raised {whose} ({where})"
    if error.frames:
        return f"{said}, raised at {_where(error.frames[-1])}"
    return said
