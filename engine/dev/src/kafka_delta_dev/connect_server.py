"""A local Spark Connect server in a process of its own, on loopback: what Databricks serverless
jobs and standard access mode run Python through, here.

pyspark ships the server (``spark-connect_2.13``): a classic Spark session with the
``SparkConnectPlugin`` listens for gRPC clients. ``SparkSession.builder.remote("local[2]")``
would start one inside the calling process, which then holds a classic SparkContext too; this
module starts it in a child process instead, so the process under test holds only a Connect
client, as a Databricks job's Python does, and ``foreachBatch`` runs where Connect runs it: in a
Python process the server starts.

    server = ConnectServer(confs={...}).start()    # sc://127.0.0.1:<port>
    spark = SparkSession.builder.remote(server.url).getOrCreate()
    ...
    server.stop()                                  # by its pid

The child exits when its standard input closes, so a test session killed hard leaves no server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from kafka_delta_dev.children import free_port

READY_TIMEOUT_S = 120.0


class ConnectServer:
    """A Spark Connect server (``master``, ``confs``) on a free loopback port."""

    def __init__(
        self,
        master: str = "local[2]",
        confs: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.master = master
        self.confs = dict(confs or {})
        self.port = free_port()
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> ConnectServer:
        confs = {
            **self.confs,
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
        }
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")
        }
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, self.master, json.dumps(confs)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT if self.log_path else subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited with status {self._process.returncode}"
                    + (f" (its log: {self.log_path})" if self.log_path else "")
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the Spark Connect server did not listen within {READY_TIMEOUT_S} s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _serve(master: str, confs: dict[str, str]) -> None:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("kafka-delta-connect-server")
    for key, value in confs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sys.stdin.read()  # until the parent closes it, or dies
    spark.stop()


if __name__ == "__main__":
    _serve(sys.argv[1], json.loads(sys.argv[2]))
