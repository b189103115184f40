"""An S3 API on loopback for development and tests: moto's server (``moto[server]``, a dev
dependency) in a child process on 127.0.0.1, stopped by its PID.

    with LocalS3() as s3:
        s3.create_bucket("lake")
        config delta.table: s3://lake/orders, delta.storage_options: s3.storage_options()

It speaks the S3 REST API that delta-rs's object store uses, conditional writes included
(``If-None-Match: *``, how delta-rs 1.6 commits a version exactly once on S3), so the pipeline,
its run lease and the ``offsets`` and ``table`` commands run against it as against AWS S3. It
checks no credentials (any key works) and keeps everything in memory: a stop forgets it all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from kafka_delta_dev.children import HOST, ChildServer, die_with_parent, free_port, wait_for_http

ACCESS_KEY = "local-access-key"
SECRET_KEY = "local-secret-key"
REGION = "us-east-1"


class ObjectStoreError(RuntimeError):
    """The local S3 API could not be started or asked."""


class LocalS3(ChildServer):
    """moto's S3 server on a free loopback port (``.endpoint``)."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def storage_options(self) -> dict[str, str]:
        """``delta.storage_options`` for a table in this store."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self) -> LocalS3:
        command = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        try:
            wait_for_http(
                f"{self.endpoint}/",
                self.process,
                ObjectStoreError,
                "moto's S3 server (moto[server], in the dev extra)",
                timeout_s=30.0,
                interval_s=0.1,
            )
        except ObjectStoreError:
            self.stop()
            raise
        return self

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (moto takes an unsigned request); its ``s3://`` URI."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.URLError as exc:
            raise ObjectStoreError(f"cannot create bucket {name!r}: {exc}") from None
        return f"s3://{name}"
