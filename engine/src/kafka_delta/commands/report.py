"""``report``: draw the progress file (one JSON line per micro-batch) as a PNG: records read
per second, and lag, per batch. Needs no Spark and no broker.

    <command> report                      # conf/local.yaml's progress.path -> <same name>.png
    <command> report --progress data/progress/x.jsonl --output x.png --last-run
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from pathlib import Path

from kafka_delta.config import ConfigError, load_config
from kafka_delta.progress.batch import BatchProgress
from kafka_delta.progress.log_file import ProgressFileError, read_progress

# Above this many batches, tick labels would overlap: let matplotlib choose the ticks.
MAX_LABELLED_BATCHES = 40


def _parse_args(argv: list[str], prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=prog,
        description="Draw records/s and lag per micro-batch from the progress file as a PNG.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--env", default="local", help="read progress.path of conf/<ENV>.yaml")
    where.add_argument("--config", type=Path, help="read progress.path of this config file")
    where.add_argument("--progress", type=Path, help="the progress file itself (JSON lines)")
    parser.add_argument(
        "--output", type=Path, help="PNG to write (default: the progress file's name, .png)"
    )
    parser.add_argument(
        "--last-run", action="store_true", help="only the batches of the most recent run"
    )
    return parser.parse_args(argv)


def _progress_path(args: argparse.Namespace) -> Path:
    if args.progress is not None:
        return args.progress
    config_path = args.config or Path.cwd() / "conf" / f"{args.env}.yaml"
    config = load_config(config_path, environ=os.environ)
    if not config.progress.path:
        raise ConfigError(
            f"{config_path} sets no progress.path, so runs write no progress file to draw; "
            "set one (e.g. progress: {path: data/progress/pipeline.jsonl}) and run again"
        )
    return Path(config.progress.path)


def draw(batches: list[BatchProgress], output: Path) -> None:
    """Two panels sharing the batch axis: records read per second (replays in grey), and the
    records behind Kafka's latest offsets (and, when running until caught up, to the run's
    target). A dotted line marks where each run starts."""
    try:
        from matplotlib.figure import Figure  # Agg through savefig: no display, no pyplot state
    except ImportError:
        raise ProgressFileError(
            "report needs matplotlib: python -m pip install -e '.[report]' (dev includes it)"
        ) from None

    x = list(range(len(batches)))
    runs = [i for i, b in enumerate(batches) if i == 0 or b.run_id != batches[i - 1].run_id]
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    speed, lag = fig.subplots(2, 1, sharex=True)

    colours = ["0.6" if b.replayed else "tab:blue" for b in batches]
    speed.bar(x, [b.records_per_s for b in batches], color=colours, width=0.8)
    speed.set_ylabel("records read / s")
    speed.grid(axis="y", alpha=0.3)

    behind = [b.behind_latest for b in batches]
    lag.plot(
        [i for i, v in zip(x, behind, strict=True) if v is not None],
        [v for v in behind if v is not None],
        marker="o",
        linewidth=3,
        color="tab:red",
        label="behind latest (lag)",
    )
    if any(b.to_target is not None for b in batches):
        lag.plot(
            [i for i, b in zip(x, batches, strict=True) if b.to_target is not None],
            [b.to_target for b in batches if b.to_target is not None],
            marker="s",
            markersize=4,
            linestyle="--",
            linewidth=1.5,
            color="tab:orange",
            label="to this run's target",
        )
    lag.set_ylabel("records")
    lag.set_ylim(bottom=0)
    lag.grid(axis="y", alpha=0.3)
    lag.legend(loc="upper right")

    for start in runs:
        for ax in (speed, lag):
            ax.axvline(start - 0.5, color="0.3", linestyle=":", linewidth=1)
        when = datetime.fromtimestamp(batches[start].finished_at - batches[start].duration_s)
        speed.annotate(
            f"run {when:%H:%M:%S}",
            xy=(start - 0.45, 0.98),
            xycoords=("data", "axes fraction"),
            va="top",
            fontsize=8,
            color="0.3",
        )
    if len(batches) <= MAX_LABELLED_BATCHES:
        lag.set_xticks(x, [str(b.batch_id) for b in batches])
    lag.set_xlabel("micro-batch (Spark batch id; in the order written)")

    read = sum(b.records_read or 0 for b in batches)
    rows = sum(b.rows_written for b in batches)
    dead = sum(b.dead_letters for b in batches)
    fig.suptitle(
        f"{batches[0].pipeline_id}: {len(batches)} micro-batches in {len(runs)} run(s), "
        f"{read:,} records read, {rows:,} rows written, {dead:,} dead letters"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: a failed draw never leaves half a picture.
    partial = output.with_name(f".{output.name}.partial")
    try:
        fig.savefig(partial, format="png", dpi=100)
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)


def main(argv: list[str], prog: str = "kafka-delta report") -> int:
    args = _parse_args(argv, prog)
    try:
        path = _progress_path(args)
        batches = read_progress(path)
        if args.last_run and batches:
            batches = [b for b in batches if b.run_id == batches[-1].run_id]
        if not batches:
            raise ProgressFileError(f"{path} holds no micro-batches yet: run the pipeline first")
        output = args.output or path.with_suffix(".png")
        draw(batches, output)
    except (ConfigError, ProgressFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {len(batches)} micro-batches from {path}")
    print(output)
    return 0
