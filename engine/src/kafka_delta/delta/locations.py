"""Where a location lives: the one rule that tells a local path from a remote URI.

The checkpoint, the table, the side folder and the staging folder of Spark's writer are each
configured as a location, a local path or a URI. Every part of the engine that reads or writes
one asks here whether it is local (read as files, directly) or remote (through Spark, delta-rs
or pyarrow's file systems), so that all of them agree on ``file:``, a bare path and a Windows
drive letter.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse


def local_path(location: str) -> Path | None:
    """The local file system path of ``location``, or None when it is a remote URI."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and location[1:3] in (":\\", ":/")):
        return Path(location)
    return None
