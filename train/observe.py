"""Why the GPU waits: per-rank data-wait figures gathered on rank 0 with one verdict line per epoch,
a Chrome / Perfetto trace (--trace FILE) and TensorBoard scalars (--tensorboard DIR).

Each rank times its own loop (the seconds spent waiting for the next batch, the epoch's seconds);
rank 0 gathers the figures once per epoch, prints

    epoch 3, train loader: not input-bound (steady-state wait 0.4%, slowest rank 3 at 0.9%)
    epoch 1, train loader: not input-bound, host-bound: next() costs 0.90 ms of host time per batch with a full ...
    epoch 3, train loader: input-bound: rank 5 waits 31% of its steady-state steps beyond 0.20 ms of host cost ...

Waits are judged in the steady state only: the first batch (start-up), batches that held a rebuild and
those inside a tuning trial are named apart (wait_parts); of the steady waits, a full queue's next() is the
per-batch host cost, and only the waits beyond it are the loader running short. A stage is named only when
its own rate, as dali-pipes profile measured it, is below the model's need.

and they go to metrics.jsonl as "ranks" (one dict per rank) and "verdict".
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field
from typing import IO, Any, Sequence, TypeVar

import torch.distributed as dist

from dali_pipes.errors import install_hint
from dali_pipes.run import tuning

T = TypeVar("T")

INPUT_BOUND = 0.05  # a rank that waits more than this fraction of its steady-state steps is input-bound
HOST_FLOOR = 0.10  # the per-batch host cost: this low quantile of the steady-state waits (a full queue's next())


def wait_parts(batches: Sequence[tuple[float, float]], events: Sequence = ()) -> dict:
    """An epoch's waits by kind, from each batch's (asked, got) on time.perf_counter's clock and the loader's
    events (stats()["events"]: rebuilds and tuning trials, (name, start, end, args)):
      start-up  the first batch's wait (the pipeline fills its queue; a schedule's rebuild),
      rebuild   a later batch whose wait held a rebuild; tuning: one inside a tuning trial (its trial
                settings may run short: the search's cost, not the loader's),
      steady    the rest, each batch with its step (from the batch before): the wait fraction judged;
    and, of the steady waits, the per-batch host cost (a low quantile: what next() costs with a full queue)
    and the part beyond it (the loader running short)."""
    parts = {"startup_s": batches[0][1] - batches[0][0] if batches else 0.0, "rebuild_s": 0.0, "rebuilds": 0,
             "tuning_s": 0.0}
    rebuilds = [(start, end) for name, start, end, *_ in events if name == "rebuild"]
    trials = [(start, end) for name, start, end, *_ in events if name == "tuning trial"]
    steady_waits, steady_wall = [], 0.0
    for (asked, got), (_, before) in zip(batches[1:], batches):
        if any(start < got and end > asked for start, end in rebuilds):
            parts["rebuild_s"] += got - asked
            parts["rebuilds"] += 1
        elif any(start <= got <= end for start, end in trials):
            parts["tuning_s"] += got - asked
        else:
            steady_waits.append(got - asked)
            steady_wall += got - before
    floor = sorted(steady_waits)[int(HOST_FLOOR * len(steady_waits))] if steady_waits else 0.0
    beyond = sum(max(0.0, w - floor) for w in steady_waits)
    return {**parts, "steady_batches": len(steady_waits),
            "steady_wait_fraction": sum(steady_waits) / steady_wall if steady_wall else 0.0,
            "host_s_per_batch": floor, "short_wait_fraction": beyond / steady_wall if steady_wall else 0.0}


@dataclass
class Waits:
    """The loop's waits for data over one epoch, on time.perf_counter's clock: each batch's (asked, got), and
    the total with the loop's last next() (the epoch's end: DALI's drain, once the sharding check)."""
    batches: list[tuple[float, float]] = field(default_factory=list)
    total: float = 0.0

    def add(self, asked: float, got: float) -> None:
        self.batches.append((asked, got))
        self.total += got - asked

    def end(self, asked: float, ended: float) -> None:
        self.total += ended - asked


def epoch_line(stats: dict) -> str:
    """The epoch's printed line: KEY=VALUE words that shlex.split reads back (a value with spaces, such as
    gpu_memory_unmeasured's reason, is quoted), floats to 4 significant digits; every rank's figures and the
    verdict are left out (the verdict is the next line; metrics.jsonl holds the whole record)."""
    return " ".join(f"{k}={shlex.quote(f'{v:.4g}' if isinstance(v, float) else str(v))}" for k, v in stats.items()
                    if k not in ("ranks", "verdict"))


def rank_figures(rank: int, waits: Waits, seconds: float, steps: int, images: int, stats: dict) -> dict:
    """This rank's epoch: wait fraction, seconds inside next() per batch, step rate, delivered and
    model rates (the model's: images per second of the epoch not spent waiting); from the loader's
    `stats` (DaliLoader.stats(); {} for a loader without), its threads and prefetch depth; from each
    batch's (asked, got), the waits by kind (wait_parts: start-up, rebuilds, tuning, steady state)."""
    wait = waits.total
    figures = {"rank": rank, "data_wait_fraction": wait / seconds if seconds else 0.0,
               "next_s_per_batch": wait / steps if steps else 0.0, "steps_per_s": steps / seconds if seconds else 0.0,
               "images_per_s": images / seconds if seconds else 0.0,
               "model_images_per_s": images / (seconds - wait) if seconds > wait else 0.0}
    figures.update({k: stats[k] for k in ("num_threads", "prefetch_queue_depth", "cpu_cores") if k in stats})
    return {**figures, **wait_parts(waits.batches, stats.get("events", ()))}


def gather(figures: T) -> list[T] | None:
    """Every rank's figures (any picklable value), on rank 0 (None elsewhere)."""
    if not dist.is_initialized():
        return [figures]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(figures, out, dst=0)
    return out


def verdict(epoch: int, ranks: list[dict], rates: dict | None, loader: str = "train") -> str:
    """One line on the `loader`'s epoch: input-bound only when the steady-state waits go beyond the per-batch
    host cost (start-up, rebuilds and tuning trials are named apart, never judged); the stage named only when
    `rates` (dali-pipes profile's, each stage alone) put one below the model's need."""
    head = f"epoch {epoch}, {loader} loader"
    worst = max(ranks, key=lambda r: r["short_wait_fraction"])
    slowest = max(ranks, key=lambda r: r["steady_wait_fraction"])
    if worst["short_wait_fraction"] > INPUT_BOUND:
        need = worst["model_images_per_s"]
        return (f"{head}: input-bound: rank {worst['rank']} waits {worst['short_wait_fraction']:.0%} of its "
                f"steady-state steps beyond {worst['host_s_per_batch'] * 1e3:.2f} ms of host cost per batch; the "
                f"loader gives {worst['images_per_s']:,.0f} images/s, the model takes {need:,.0f}; "
                f"{binding_text(rates, need)}{_apart(worst)}")
    if slowest["steady_wait_fraction"] > INPUT_BOUND:
        return (f"{head}: not input-bound, host-bound: next() costs {slowest['host_s_per_batch'] * 1e3:.2f} ms of "
                f"host time per batch with a full queue ({slowest['steady_wait_fraction']:.1%} of rank "
                f"{slowest['rank']}'s steady-state steps; the loader runs short "
                f"{slowest['short_wait_fraction']:.1%}){_apart(slowest)}")
    mean = sum(r["steady_wait_fraction"] for r in ranks) / len(ranks)
    return (f"{head}: not input-bound (steady-state wait {mean:.1%}, slowest rank {slowest['rank']} at "
            f"{slowest['steady_wait_fraction']:.1%}){_apart(slowest)}")


def _apart(figures: dict) -> str:
    """"(not counted: start-up 0.41 s, 2 rebuilds 0.30 s, tuning trials 1.20 s)", or ""."""
    parts = [f"start-up {figures.get('startup_s', 0.0):.2f} s"] if figures.get("startup_s") else []
    if figures.get("rebuilds"):
        parts.append(f"{figures['rebuilds']} rebuild{'s' * (figures['rebuilds'] > 1)} {figures['rebuild_s']:.2f} s")
    if figures.get("tuning_s"):
        parts.append(f"tuning trials {figures['tuning_s']:.2f} s")
    return f" (not counted: {', '.join(parts)})" if parts else ""


def binding_text(rates: dict | None, need: float) -> str:
    """The stage that binds: the earliest whose own rate (dali-pipes profile's, the stage alone) is below the
    model's `need`; none when every stage alone outruns it."""
    if not rates:
        return "run dali-pipes profile DATA to see whether a stage alone is below the model's need"
    below = [(stage, rate) for stage, rate in rates.items() if stage in PROFILED_STAGES and rate < need]
    if below:
        stage, rate = below[0]
        return f"{stage} binds: alone it gives {rate:,.0f} images/s, below the model's {need:,.0f} (dali-pipes profile)"
    alone = ", ".join(f"{stage} {rate:,.0f}" for stage, rate in rates.items() if stage in PROFILED_STAGES)
    return (f"no single stage binds: each alone gives more than the model's {need:,.0f} images/s ({alone}; dali-pipes "
            f"profile): the per-batch host cost, or CPU the model takes from the loader")


PROFILED_STAGES = ("read", "decode", "augment")  # in graph order; the iterator and copy are the whole path


def profiled_rates(loader) -> dict | None:
    """Each stage's own images/s as `dali-pipes profile` measured them for this machine and graph, if it ran
    (an entry of an older profile, without them, counts as none: its binding stage was not checked)."""
    pipe = getattr(loader, "pipe", None)
    if pipe is None:
        return None
    entry = tuning.recall(tuning.memory_key(pipe.spec, loader.source.kind)) or {}
    return entry.get("stage_images_per_s")


def record_labels(log: IO[str] | None, step: int, epoch: int, labels: Any, image_size: int) -> None:
    """--record-labels: one line per step of the labels it trained on (a CPU loader's, read before they move to
    the GPU, cost no device sync), so that a test can check which samples each step saw."""
    if log is not None:
        line = {"step": step, "epoch": epoch, "labels": labels.tolist(), "image_size": image_size}
        log.write(json.dumps(line) + "\n")
        log.flush()


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
    """Epoch metrics as TensorBoard scalars (rank 0; pip install '.[tensorboard]' from the checkout)."""

    def __init__(self, logdir: str | None, is_main: bool) -> None:
        self.writer = None
        if logdir and is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:
                raise SystemExit(f"--tensorboard needs the tensorboard package ({error}): "
                                 f"{install_hint('tensorboard')}") from None
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
