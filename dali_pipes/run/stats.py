"""What a loader's epochs cost the training loop, per rank (`DaliLoader.stats()`).

Timed where the loop feels it: the seconds the loop spends inside next() (its wait for data), and
the seconds from one batch to the next (the loop's step, wait included). Also the loader's own
events on the same clock (time.perf_counter): pipeline rebuilds and tuning trials, for a trace.

`Spread` is how every repeated figure of the project is reported, median [min, max] and the spread
between them: the tuner's trials here, the benchmarks' rounds (dali_pipes_bench/protocol.py).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Iterable

from dali_pipes.run.hooks import BatchHook, BatchTiming, RankView

NOISY = 0.10  # a spread above this between repeats of one figure: too noisy to rank it against another


@dataclass(frozen=True)
class Spread:
    """Repeats of one figure (rounds of a benchmark, batches of a tuning trial): the median, the lowest,
    the highest, and the spread (highest - lowest) / median."""
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> "Spread":
        return cls(tuple(values))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    @property
    def low(self) -> float:
        return min(self.values, default=0.0)

    @property
    def high(self) -> float:
        return max(self.values, default=0.0)

    @property
    def spread(self) -> float:
        """(max - min) / median; 0 for fewer than two values."""
        return (self.high - self.low) / self.median if len(self.values) > 1 and self.median else 0.0

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY

    def row(self) -> dict:
        return {"median": self.median, "min": self.low, "max": self.high, "spread": self.spread}

    def text(self, scale: float = 1.0, digits: int = 0) -> str:
        """"1,234 [1,200, 1,260]": median [min, max], each times `scale`."""
        show = lambda v: f"{v * scale:,.{digits}f}"
        return f"{show(self.median)} [{show(self.low)}, {show(self.high)}]"


@dataclass
class EpochStats:
    epoch: int
    batches: int = 0
    images: int = 0
    wait_s: float = 0.0      # inside next(): the loop waited for this loader
    wall_s: float = 0.0      # first batch asked for -> last batch given (the loop's steps included)
    cpu_s: float = 0.0       # process CPU time over the same span (every thread: DALI's and the model's)
    events: list = field(default_factory=list)  # (name, start, end, args): rebuilds, tuning trials

    def summary(self) -> dict:
        """Per-epoch figures: wait fraction, the loader's time per batch inside next(), the step rate."""
        out = {k: v for k, v in asdict(self).items() if k != "events"}
        out.update(data_wait_fraction=self.wait_s / self.wall_s if self.wall_s else 0.0,
                   next_s_per_batch=self.wait_s / self.batches if self.batches else 0.0,
                   steps_per_s=self.batches / self.wall_s if self.wall_s else 0.0,
                   images_per_s=self.images / self.wall_s if self.wall_s else 0.0,
                   cpu_cores=self.cpu_s / self.wall_s if self.wall_s else 0.0)
        return out


class LoaderClock(BatchHook):
    """Times each next() of a loader and keeps one EpochStats per epoch (the last few). A hook, run first:
    `last` is the latest batch's (wait, wall, cpu), which the tuner judges (tuning.py)."""

    KEEP = 8  # epochs kept: stats() is read once an epoch; a long run must not grow

    def __init__(self, started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started  # the loader's construction began
        self.first_batch_s: float | None = None  # construction -> first batch in hand: building the pipeline,
        # DALI's pools and the decoders' preallocations, the first decodes
        self.epochs: list[EpochStats] = []
        self.last: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self._last: tuple[float, float] | None = None  # (perf_counter, process_time) of the last batch

    def begin_epoch(self, rank: RankView, batches: int) -> None:
        at = rank.position  # an abandoned epoch being finished keeps its figures
        if not self.epochs or self.epochs[-1].epoch != at.epoch or at.batch == 0:
            self.begin(at.epoch)

    def after_batch(self, rank: RankView, timing: BatchTiming) -> None:
        self.last = self.batch(timing.asked, timing.got, timing.images)
        if self.first_batch_s is None:
            self.first_batch_s = timing.got - self.started

    def begin(self, epoch: int) -> None:
        self.epochs = self.epochs[-(self.KEEP - 1):] + [EpochStats(epoch)]
        self._last = None

    @property
    def current(self) -> EpochStats:
        if not self.epochs:
            self.begin(0)
        return self.epochs[-1]

    def batch(self, asked: float, got: float, images: int) -> tuple[float, float, float]:
        """A batch asked for at `asked`, in hand at `got` (perf_counter): (wait, wall, cpu) of it, where
        wall and cpu run from the previous batch in hand (from `asked` for the epoch's first)."""
        cpu_now = time.process_time()
        since, cpu_since = self._last or (asked, cpu_now)
        wait, wall, cpu = got - asked, got - since, cpu_now - cpu_since
        epoch = self.current
        epoch.batches, epoch.images = epoch.batches + 1, epoch.images + images
        epoch.wait_s, epoch.wall_s, epoch.cpu_s = epoch.wait_s + wait, epoch.wall_s + wall, epoch.cpu_s + cpu
        self._last = (got, cpu_now)
        return wait, wall, cpu

    def event(self, name: str, start: float, end: float, **args) -> None:
        self.current.events.append((name, start, end, args))

    def stats(self, num_threads: int | None, prefetch_queue_depth: int) -> dict:
        """This epoch's figures so far (the last epoch's once it ended): data-wait fraction, seconds inside
        next() per batch, step rate, CPU; the pipeline's threads and depth now; its rebuilds and tuning trials
        as (name, start, end, args) on time.perf_counter's clock; the seconds from the loader's construction to its
        first batch (None before it)."""
        current = self.current
        return {**current.summary(), "num_threads": num_threads, "prefetch_queue_depth": prefetch_queue_depth,
                "events": list(current.events), "first_batch_s": self.first_batch_s}

    def summaries(self) -> list[dict]:
        return [e.summary() for e in self.epochs]
