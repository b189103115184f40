"""The progress file and the `report` command, without Spark or a broker; the listeners main
builds from the config. (A real run's progress lines and metrics: test_metrics.py.)"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kafka_delta.cli import main
from kafka_delta.commands import report
from kafka_delta.config import load_config
from kafka_delta.progress.batch import BatchProgress, StepClock, run_rate, steps_text
from kafka_delta.progress.listeners import build_listeners, close_listeners
from kafka_delta.progress.log_file import JsonLinesProgress, read_progress
from support import PACKAGE, PROJECT, project_env

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def batch(batch_id: int, run_id: str = "run-1", **changes: object) -> BatchProgress:
    fields: dict[str, object] = {
        "pipeline_id": "orders",
        "run_id": run_id,
        "batch_id": batch_id,
        "finished_at": 1_767_225_600.0 + batch_id,
        "duration_s": 0.5,
        "records_read": 1000,
        "rows_written": 990,
        "dead_letters": 10,
        "replayed": False,
        "delta_version": batch_id,
        "end_offsets": {"orders": {0: 500 * (batch_id + 1), 1: 500 * (batch_id + 1)}},
        "lag": {"orders": {0: 100 * (3 - batch_id), 1: 0}},
        "lag_error": None,
        "to_target": 2000 - 1000 * batch_id,
        "run_records_read": 1000 * (batch_id + 1),
        "commit_back_ok": batch_id,
        "commit_back_failed": 0,
        "hook_ms": 0.05,
    }
    fields.update(changes)
    return BatchProgress(**fields)  # type: ignore[arg-type]


def write_lines(path: Path, batches: list[BatchProgress]) -> None:
    writer = JsonLinesProgress(path)
    try:
        for each in batches:
            writer.on_batch(each)
    finally:
        writer.close()


def test_a_batchs_steps_are_timed_in_order_and_read_back_from_its_progress_line(
    tmp_path: Path,
) -> None:
    # The engine times each step of a batch (plan, check, materialize, commit, and of the
    # commit the sink's read-back) around calls it makes anyway: no Spark job, two clock reads.
    clock = StepClock()
    with clock.step("commit"):
        pass
    clock.add("read_back", 0.00004)
    clock.add("check", 0.12)
    clock.add("check", 0.03)
    assert list(clock.figures()) == ["check", "commit", "read_back"]
    assert clock.figures()["check"] == 0.15 and clock.figures()["read_back"] == 0.0
    assert steps_text(clock.figures()).startswith(" steps_ms=check:150,commit:")
    assert steps_text(None) == ""

    path = tmp_path / "progress.jsonl"
    timed = batch(0, steps={"check": 0.12, "commit": 1.4, "read_back": 0.1})
    write_lines(path, [timed])
    assert read_progress(path) == [timed]
    # A line written before batches were timed by step reads back with no steps.
    line = json.loads(path.read_text())
    del line["steps"]
    path.write_text(json.dumps(line) + "\n")
    assert read_progress(path)[0].steps is None


def test_progress_lines_read_back_as_the_records_written(tmp_path: Path) -> None:
    path = tmp_path / "p" / "progress.jsonl"
    batches = [batch(0), batch(1), batch(2, replayed=True, rows_written=0, lag=None)]
    write_lines(path, batches)
    write_lines(path, [batch(0, run_id="run-2")])  # a second run appends

    read = read_progress(path)

    assert read == [*batches, batch(0, run_id="run-2")]
    line = json.loads(path.read_text().splitlines()[0])
    assert line["behind_latest"] == 300 and line["records_per_s"] == 2000.0
    assert read[1].target_done == pytest.approx(2000 / 3000)


def test_a_runs_steady_rate_leaves_out_its_first_batch_and_its_start_up() -> None:
    # scripts/demo prints it: batch 0 carried the JVM's start and warm-up; the steady rate is
    # the later batches' records over the time from the first commit to the last.
    batches = [
        batch(0, finished_at=100.0, records_read=9000),
        batch(1, finished_at=101.5, records_read=1000),
        batch(2, finished_at=104.0, records_read=None, rows_written=3000),  # count unknown
    ]
    rate = run_rate(batches)
    assert rate is not None
    assert (rate.batches, rate.steady_records, rate.steady_s) == (3, 4000, 4.0)
    assert rate.steady_records_per_s == pytest.approx(1000.0)
    alone = run_rate(batches[:1])
    assert alone is not None and alone.steady_records_per_s is None  # nothing steady
    assert run_rate([]) is None


def test_report_draws_a_png_of_every_run_or_the_last(tmp_path: Path, capsys) -> None:
    path = tmp_path / "progress.jsonl"
    write_lines(path, [batch(i) for i in range(3)] + [batch(i, run_id="run-2") for i in range(2)])

    assert report.main(["--progress", str(path)]) == 0
    png = path.with_suffix(".png")
    assert png.read_bytes()[:8] == PNG_MAGIC
    out = capsys.readouterr().out.splitlines()
    assert out == [f"report: 5 micro-batches from {path}", str(png)]

    last = tmp_path / "last.png"
    assert report.main(["--progress", str(path), "--output", str(last), "--last-run"]) == 0
    assert "report: 2 micro-batches" in capsys.readouterr().out
    assert last.read_bytes()[:8] == PNG_MAGIC


def test_report_skips_a_last_line_cut_short_by_a_killed_run(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    write_lines(path, [batch(0), batch(1)])
    with path.open("a") as f:
        f.write('{"pipeline_id": "orders", "run_')  # the process died mid-line

    assert [b.batch_id for b in read_progress(path)] == [0, 1]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no progress file at"),
        ("", "holds no micro-batches yet"),
        ('{"not": "progress"}\n{"either": 1}\n', "progress.jsonl:1 is not a progress line"),
        ("plain text\n", "progress.jsonl:1 is not a progress line"),
    ],
)
def test_report_on_a_bad_progress_file_fails_with_one_error_and_writes_nothing(
    tmp_path: Path, capsys, content: str | None, message: str
) -> None:
    path = tmp_path / "progress.jsonl"
    if content is not None:
        path.write_text(content)
    output = tmp_path / "out.png"

    assert report.main(["--progress", str(path), "--output", str(output)]) == 2

    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    left = [path.name] if content is not None else []
    assert sorted(p.name for p in tmp_path.iterdir()) == left


def test_report_reads_the_progress_path_of_the_config(tmp_path: Path, capsys) -> None:
    data = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text())
    data["progress"] = {"path": "data/progress/p.jsonl"}
    conf = tmp_path / "conf" / "test.yaml"
    conf.parent.mkdir()
    conf.write_text(yaml.safe_dump(data))
    write_lines(tmp_path / "data" / "progress" / "p.jsonl", [batch(0)])

    assert report.main(["--config", str(conf)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == str(tmp_path / "data/progress/p.png")

    data["progress"] = {"path": None}
    conf.write_text(yaml.safe_dump(data))
    assert report.main(["--config", str(conf)]) == 2
    assert "sets no progress.path" in capsys.readouterr().err


def test_report_is_a_subcommand_of_the_projects_command(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    write_lines(path, [batch(0), batch(1)])
    output = tmp_path / "picture.png"

    run = subprocess.run(
        [sys.executable, "-m", PACKAGE, "report", "--progress", str(path), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT,
        env=project_env(),
    )

    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == str(output)
    assert output.read_bytes()[:8] == PNG_MAGIC


def _config(tmp_path: Path, **sections: object) -> Path:
    data = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text())
    data.update(sections)
    conf = tmp_path / "conf" / "test.yaml"
    conf.parent.mkdir(exist_ok=True)
    conf.write_text(yaml.safe_dump(data))
    return conf


def test_metrics_off_never_imports_prometheus_client(tmp_path: Path) -> None:
    conf = _config(tmp_path, metrics={"exporter": "none"})
    program = (
        "import sys\n"
        "from kafka_delta.config import load_config\n"
        "from kafka_delta.progress.listeners import build_listeners\n"
        "from kafka_delta.pipeline import Pipeline\n"
        f"listeners = build_listeners(load_config({str(conf)!r}))\n"
        "print([type(x).__name__ for x in listeners], 'prometheus_client' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=PROJECT
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['JsonLinesProgress'] False"


def test_main_builds_the_listeners_the_config_names(tmp_path: Path) -> None:
    conf = _config(
        tmp_path,
        metrics={"exporter": "textfile", "textfile": "data/metrics/m.prom"},
        progress={"path": "data/progress/p.jsonl"},
    )
    listeners = build_listeners(load_config(conf))
    try:
        assert [type(x).__name__ for x in listeners] == ["PrometheusMetrics", "JsonLinesProgress"]
        # The textfile exists from the start, with every counter at 0.
        text = (tmp_path / "data" / "metrics" / "m.prom").read_text()
        assert 'kafka_delta_batches_total{pipeline="' in text
        assert (tmp_path / "data" / "progress" / "p.jsonl").exists()
    finally:
        close_listeners(listeners)


def test_a_metrics_port_in_use_stops_the_run_before_any_work(tmp_path: Path, capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = _config(
            tmp_path,
            metrics={"exporter": "http", "port": port},
            progress={"path": "data/progress/p.jsonl"},
        )

        assert main(["--config", str(conf)]) == 2

    err = capsys.readouterr().err
    assert f"cannot serve metrics on 127.0.0.1:{port}" in err and err.count("error:") == 1
    assert not (tmp_path / "data").exists()  # nothing written: no progress file either
