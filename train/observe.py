"""Why the GPU waits: per-rank data-wait figures gathered on rank 0 with one verdict line per epoch,
a Chrome / Perfetto trace (--trace FILE) and TensorBoard scalars (--tensorboard DIR).

Each rank times its own loop (the seconds spent waiting for the next batch, the epoch's seconds);
rank 0 gathers the figures once per epoch, prints

    epoch 3: not input-bound (wait 0.4%, slowest rank 3 at 0.9%)
    epoch 3: input-bound: rank 5 waits 31% of its steps; the loader gives 1,850 images/s, the model takes 2,400; ...

and they go to metrics.jsonl as "ranks" (one dict per rank) and "verdict".
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TypeVar

import torch.distributed as dist

from dali_pipes.run import tuning

T = TypeVar("T")

INPUT_BOUND = 0.05  # a rank that waits more than this fraction of its epoch is input-bound


def rank_figures(rank: int, wait: float, seconds: float, steps: int, images: int, stats: dict) -> dict:
    """This rank's epoch: wait fraction, seconds inside next() per batch, step rate, delivered and
    model rates (the model's: images per second of the epoch not spent waiting); from the loader's
    `stats` (DaliLoader.stats(); {} for a loader without), its threads and prefetch depth."""
    figures = {"rank": rank, "data_wait_fraction": wait / seconds if seconds else 0.0,
               "next_s_per_batch": wait / steps if steps else 0.0, "steps_per_s": steps / seconds if seconds else 0.0,
               "images_per_s": images / seconds if seconds else 0.0,
               "model_images_per_s": images / (seconds - wait) if seconds > wait else 0.0}
    figures.update({k: stats[k] for k in ("num_threads", "prefetch_queue_depth", "cpu_cores") if k in stats})
    return figures


def gather(figures: T) -> list[T] | None:
    """Every rank's figures (any picklable value), on rank 0 (None elsewhere)."""
    if not dist.is_initialized():
        return [figures]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(figures, out, dst=0)
    return out


def verdict(epoch: int, ranks: list[dict], binding: str | None) -> str:
    worst = max(ranks, key=lambda r: r["data_wait_fraction"])
    mean = sum(r["data_wait_fraction"] for r in ranks) / len(ranks)
    if worst["data_wait_fraction"] <= INPUT_BOUND:
        return (f"epoch {epoch}: not input-bound (wait {mean:.1%}, slowest rank {worst['rank']} at "
                f"{worst['data_wait_fraction']:.1%})")
    stage = (f"the binding stage is {binding} (from dali-pipes profile)" if binding else
             "run dali-pipes profile DATA to find the binding stage")
    return (f"epoch {epoch}: input-bound: rank {worst['rank']} waits {worst['data_wait_fraction']:.0%} of its "
            f"steps; the loader gives {worst['images_per_s']:,.0f} images/s, the model takes "
            f"{worst['model_images_per_s']:,.0f}; {stage}")


def binding_stage(loader) -> str | None:
    """The stage `dali-pipes profile` found binding for this machine and graph, if it ran."""
    pipe = getattr(loader, "pipe", None)
    if pipe is None:
        return None
    entry = tuning.recall(tuning.memory_key(pipe.spec, loader.source.kind)) or {}
    return entry.get("binding_stage")


class Trace:
    """Chrome trace events (JSON array format, which Perfetto and chrome://tracing read without its
    closing bracket, so the file grows an epoch at a time): one track per rank."""

    def __init__(self, path: str | None, rank: int) -> None:
        self.path, self.rank = path, rank
        self.events: list[dict[str, Any]] = []
        self._offset = time.time() - time.perf_counter()  # perf_counter -> wall clock, comparable across ranks
        if path and rank == 0:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write("[\n")

    def span(self, name: str, start: float, end: float, **args) -> None:
        if self.path:
            self.events.append({"name": name, "ph": "X", "ts": (start + self._offset) * 1e6,
                                "dur": (end - start) * 1e6, "pid": 0, "tid": self.rank, "args": args})

    def flush(self, loader_events=()) -> None:
        """Rank 0 appends every rank's events of the epoch (the loader's rebuilds and tuning trials too)."""
        if not self.path:
            return
        for name, start, end, args in loader_events:
            self.span(name, start, end, **args)
        mine = self.events + [{"name": "thread_name", "ph": "M", "pid": 0, "tid": self.rank,
                               "args": {"name": f"rank {self.rank}"}}]
        self.events = []
        every = gather(mine)
        if every is not None:
            with open(self.path, "a") as f:
                f.writelines(json.dumps(e) + ",\n" for events in every for e in events)


class TensorBoard:
    """Epoch metrics as TensorBoard scalars (rank 0; pip install 'dali_pipes[tensorboard]')."""

    def __init__(self, logdir: str | None, is_main: bool) -> None:
        self.writer = None
        if logdir and is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:
                raise SystemExit(f"--tensorboard needs the tensorboard package ({error}): pip install "
                                 f"'dali_pipes[tensorboard]'") from None
            self.writer = SummaryWriter(logdir)

    def epoch(self, stats: dict) -> None:
        if self.writer is None:
            return
        epoch = stats["epoch"]
        for key, value in stats.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
                self.writer.add_scalar(key, value, epoch)
        for figures in stats.get("ranks", []):
            self.writer.add_scalar(f"data_wait_fraction/rank{figures['rank']}", figures["data_wait_fraction"], epoch)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
