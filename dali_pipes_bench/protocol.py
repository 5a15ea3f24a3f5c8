"""The measurement protocol of every comparison in this project: `dali-pipes profile`, the doctor's
throughput run and the `dali-pipes bench` commands that rank cases.

  * A case is a name and a step: one unit of work (a batch, or a whole epoch) that returns the images
    it delivered. `batch_case` and `epoch_case` make one of a loader.
  * Cases are alternated A B C A B C over `rounds` rounds (at least 3), after a warm-up of each, so that
    a machine that slows down mid-run slows every case alike.
  * A case's windows together last at least `min_seconds` and cover at least `min_epochs` whole epochs
    (30 s and 3 by default): each window lasts its share, whole units only.
  * Each window ends with a synchronisation hook (torch.cuda.synchronize where CUDA is in use), so that
    work queued on a GPU is inside the window that queued it.
  * Per case: images/s median [min, max] over the rounds, and the CPU cores busy (CPU seconds of the
    process tree per wall second). A case whose rounds spread by more than `max_spread` (10%) is printed
    as such ("not ranked: spread 23%"), and then no case is ranked.
  * `cold`: before each window and each epoch inside one, the case's data files are dropped from the page
    cache (posix_fadvise DONTNEED, Linux), outside the timed span: storage is measured too.

Timing uses injectable clocks (`clock`, `cpu_clock`), so tests check the protocol with a simulated one.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from dali_pipes.run.stats import NOISY, Spread

MIN_ROUNDS = 3


@dataclass(frozen=True)
class ProtocolConfig:
    """How long and how often each case is timed (add_protocol_arguments: a flag for each but min_units, warmup)."""
    min_seconds: float = 30.0  # per case, all its windows together
    min_epochs: float = 3.0    # whole epochs per case, all its windows together
    min_units: int = 1         # units (batches, epochs) per window at least
    rounds: int = MIN_ROUNDS   # alternating rounds; fewer than MIN_ROUNDS are never ranked
    warmup: int = 1            # units run untimed before a case's first window (a pipeline fills its queue)
    max_spread: float = NOISY  # (max - min) / median between a case's rounds above this: not ranked
    cold: bool = False         # drop each case's files from the page cache before each window and epoch

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.min_units < 1 or self.min_seconds < 0 or self.min_epochs < 0 or self.warmup < 0:
            raise ValueError(f"need rounds >= 1, min_units >= 1 and min_seconds, min_epochs, warmup >= 0; got {self}")


@dataclass
class Case:
    """One thing to time. `step()` runs one unit (a batch, or a whole epoch) and returns the images it
    delivered; `units_per_epoch` of them make an epoch. `files`: the data it reads (for `cold`).
    `prepare()` runs before the case's warm-up and before each of its windows, `release()` after each (both
    untimed): a case that builds its pipeline per window, so that only one is alive at a time. `close()`
    runs once all rounds are done."""
    name: str
    step: Callable[[], int]
    units_per_epoch: int = 1
    files: Sequence[str] = ()
    close: Callable[[], None] | None = None
    prepare: Callable[[], None] | None = None
    release: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.units_per_epoch < 1:
            raise ValueError(f"case {self.name!r}: units_per_epoch must be at least 1, got {self.units_per_epoch} "
                             f"(a dataset smaller than one batch?)")


@dataclass(frozen=True)
class Window:
    """One timed window of one case: images delivered, wall and CPU seconds (drops of the cache excluded),
    and the change of each of the runner's extra `counters` over it."""
    images: int
    units: int
    seconds: float
    cpu_seconds: float
    counted: dict[str, float] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_cores(self) -> float:
        return self.cpu_seconds / self.seconds if self.seconds > 0 else 0.0


@dataclass
class CaseResult:
    """A case's windows, one per round: images/s and CPU cores busy as median [min, max]."""
    name: str
    windows: list[Window] = field(default_factory=list)

    @property
    def rate(self) -> Spread:
        return Spread.of(w.images_per_s for w in self.windows)

    @property
    def cores(self) -> Spread:
        return Spread.of(w.cpu_cores for w in self.windows)

    @property
    def median(self) -> float:
        return self.rate.median

    def per_unit(self, counter: str) -> Spread:
        """An extra counter's change per unit (per epoch of an epoch case), over the rounds."""
        return Spread.of(w.counted[counter] / max(w.units, 1) for w in self.windows)

    def text(self) -> str:
        """"1,234 [1,200, 1,260] images/s, 1.95 cores busy, spread 4.9%"."""
        return (f"{self.rate.text()} images/s, {self.cores.median:.2f} cores busy, spread {self.rate.spread:.1%}")

    def row(self) -> dict:
        """JSON-ready figures: median, min, max, spread, CPU cores, and every window."""
        rate = self.rate
        return {"case": self.name, "images_per_s": rate.median, "min": rate.low, "max": rate.high,
                "spread": rate.spread, "cpu_cores": self.cores.median, "rounds": len(self.windows),
                "windows": [{"images": w.images, "units": w.units, "seconds": w.seconds, "images_per_s": w.images_per_s,
                             "cpu_cores": w.cpu_cores, **w.counted} for w in self.windows]}


@dataclass
class Comparison:
    """Every case's result, in the order given, and the protocol they were timed under."""
    results: list[CaseResult]
    config: ProtocolConfig

    def __getitem__(self, name: str) -> CaseResult:
        return next(r for r in self.results if r.name == name)

    def unranked_because(self) -> str | None:
        """Why no case is ranked (too few rounds, a spread above max_spread), or None."""
        rounds = min((len(r.windows) for r in self.results), default=0)
        if rounds < MIN_ROUNDS:
            return f"not ranked: {rounds} round{'s' * (rounds != 1)} (at least {MIN_ROUNDS} are needed)"
        noisy = [r for r in self.results if r.rate.spread > self.config.max_spread]
        if noisy:
            worst = max(noisy, key=lambda r: r.rate.spread)
            return (f"not ranked: spread {worst.rate.spread:.0%} between rounds ({worst.name}; above "
                    f"{self.config.max_spread:.0%}): run longer (--min-seconds) or on a quieter machine")
        return None

    def ranked(self) -> list[CaseResult] | None:
        """The cases fastest first, or None when they may not be ranked (unranked_because)."""
        if self.unranked_because() is not None:
            return None
        return sorted(self.results, key=lambda r: -r.median)

    def ratio(self, name: str, reference: str) -> float:
        """Median images/s of `name` over that of `reference`."""
        return self[name].median / max(self[reference].median, 1e-12)

    def ranking_text(self) -> str:
        """"ranking: A > B (1.12x slower) > C (1.40x slower)", or why there is none."""
        ranked = self.ranked()
        if ranked is None:
            return str(self.unranked_because())
        best = ranked[0]
        return "ranking: " + " > ".join([best.name] + [f"{r.name} ({best.median / max(r.median, 1e-12):.2f}x slower)"
                                                        for r in ranked[1:]])

    def lines(self) -> list[str]:
        width = max((len(r.name) for r in self.results), default=0)
        return [f"{r.name:<{width}}  {r.text()}" for r in self.results] + [self.ranking_text()]


# ---------------------------------------------------------------------------------------------
# Running cases
# ---------------------------------------------------------------------------------------------

def synchronize() -> None:
    """Wait for the GPU work queued so far, where this process uses CUDA; nothing on CPU."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def process_cpu_seconds() -> float:
    """CPU seconds of this process and its descendants (DataLoader workers included)."""
    from dali_pipes.run.usage import cpu_seconds
    return cpu_seconds()


@dataclass
class Runner:
    """Times cases under `config`; the clocks and the synchronisation hook are injectable (tests)."""
    config: ProtocolConfig = field(default_factory=ProtocolConfig)
    clock: Callable[[], float] = time.perf_counter
    cpu_clock: Callable[[], float] = process_cpu_seconds
    sync: Callable[[], None] = synchronize
    drop: Callable[[Sequence[str]], int] | None = None  # the page-cache drop (cold); default drop_page_cache
    progress: Callable[[str], None] | None = None       # hears "case, round" before each window
    counters: dict[str, Callable[[], float]] = field(default_factory=dict)  # more figures read around each window

    def compare(self, cases: Sequence[Case]) -> Comparison:
        """Warm every case up, then `rounds` rounds of one window per case, in the order given."""
        if self.config.cold:
            check_cold([f for case in cases for f in case.files])
        results = [CaseResult(case.name) for case in cases]
        for case in cases:
            self._around(case, self.warm_up)
        for round_ in range(self.config.rounds):
            for case, result in zip(cases, results):
                if self.progress is not None:
                    self.progress(f"{case.name}, round {round_ + 1}/{self.config.rounds}")
                result.windows.append(self._around(case, self.window))
        return Comparison(results, self.config)

    def warm_up(self, case: Case) -> None:
        for _ in range(self.config.warmup):
            case.step()

    @staticmethod
    def _around(case: Case, run: Callable[[Case], Any]) -> Any:
        if case.prepare is not None:
            case.prepare()
        try:
            return run(case)
        finally:
            if case.release is not None:
                case.release()

    def window_size(self, case: Case) -> tuple[float, int]:
        """(seconds, units) a window of `case` lasts at least: its share of min_seconds and min_epochs."""
        rounds = self.config.rounds
        units = max(self.config.min_units, math.ceil(self.config.min_epochs * case.units_per_epoch / rounds - 1e-9))
        return self.config.min_seconds / rounds, units

    def window(self, case: Case) -> Window:
        """Whole units of `case` until the window has lasted its share; the cache drops are not timed."""
        seconds, units = self.window_size(case)
        paused = paused_cpu = 0.0
        if self.config.cold:
            self._drop(case)
        counted = {name: read() for name, read in self.counters.items()}
        start, cpu_start = self.clock(), self.cpu_clock()
        images = done = 0
        while True:
            images += case.step()
            done += 1
            if done >= units and self.clock() - start - paused >= seconds:
                break
            if self.config.cold and done % case.units_per_epoch == 0:  # an epoch starts: cold again
                t, c = self.clock(), self.cpu_clock()
                self._drop(case)
                paused, paused_cpu = paused + self.clock() - t, paused_cpu + self.cpu_clock() - c
        self.sync()  # the GPU work this window queued is done before its time is read
        seconds, cpu = self.clock() - start - paused, self.cpu_clock() - cpu_start - paused_cpu
        changes = {name: read() - counted[name] for name, read in self.counters.items()}
        return Window(images, done, seconds, cpu, changes)

    def _drop(self, case: Case) -> None:
        (self.drop or drop_page_cache)(case.files)


def compare(cases: Sequence[Case], config: ProtocolConfig = ProtocolConfig(), **runner: Any) -> Comparison:
    """Time `cases` under `config` (Runner's keywords: clocks, sync, progress) and close each case after."""
    try:
        return Runner(config, **runner).compare(cases)
    finally:
        for case in cases:
            if case.close is not None:
                case.close()


def forever(loader: Iterable) -> Iterator:
    """Batches across epoch boundaries, without abandoning an epoch midway."""
    while True:
        yielded = False
        for batch in loader:
            yielded = True
            yield batch
        if not yielded:
            raise RuntimeError("the loader yielded no batch in a whole epoch")


def images_of(batch: Any) -> int:
    """Images in an (images, labels) batch, or in a DALIGenericIterator's [{"images": ...}]."""
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], dict):
        return int(batch[0]["images"].shape[0])
    return int(batch[0].shape[0])


def batch_case(name: str, loader: Iterable, batches_per_epoch: int, *, each: Callable[[Any], Any] | None = None,
               files: Sequence[str] = (), close: Callable[[], None] | None = None) -> Case:
    """A case whose unit is one batch of `loader`, epoch after epoch; `each(batch)` runs on every batch
    (a copy to the GPU, as a training step would take it)."""
    batches = forever(loader)

    def step() -> int:
        batch = next(batches)
        if each is not None:
            each(batch)
        return images_of(batch)

    return Case(name, step, max(1, batches_per_epoch), files, close)


def epoch_case(name: str, loader: Iterable, *, each: Callable[[Any], Any] | None = None, files: Sequence[str] = (),
               close: Callable[[], None] | None = None) -> Case:
    """A case whose unit is one whole epoch of `loader`: from the first next() to the end of the `for`
    loop, so that what a loader does between epochs counts."""

    def step() -> int:
        images = 0
        for batch in loader:
            if each is not None:
                each(batch)
            images += images_of(batch)
        return images

    return Case(name, step, 1, files, close)


# ---------------------------------------------------------------------------------------------
# Reading cold: the page cache dropped
# ---------------------------------------------------------------------------------------------

def check_cold(files: Sequence[str]) -> None:
    """Refuse `cold` where it cannot work: no posix_fadvise (not Linux), remote or missing files."""
    if not hasattr(os, "posix_fadvise"):
        raise ValueError(f"--cold: this system ({sys.platform}) has no posix_fadvise to drop files from the page "
                         f"cache; it works on Linux. Run without --cold (the files are then read warm)")
    remote = [f for f in files if "://" in f]
    if remote:
        raise ValueError(f"--cold: {remote[0]} is not a local file ({len(remote)} of {len(files)}); the page cache "
                         f"is local. Run without --cold, or copy the data to a local disk")
    if not files:
        raise ValueError("--cold: the cases name no data files to drop from the page cache")


def drop_page_cache(files: Sequence[str]) -> int:
    """Ask the kernel to drop `files` from the page cache (posix_fadvise DONTNEED); returns how many
    were asked. Dirty pages are not dropped, so the data must have been written (synced) before; without
    root the kernel may keep pages mapped by another process: a best effort, as DONTNEED is."""
    if not hasattr(os, "posix_fadvise"):
        check_cold(files)
    done = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        finally:
            os.close(fd)
    return done


def source_files(source: Any) -> list[str]:
    """The local files a Source reads: its images or shards, and their indexes."""
    return [*source.files, *(source.index_files or [])]


# ---------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------

def add_protocol_arguments(parser: Any, defaults: ProtocolConfig = ProtocolConfig(),
                           epochs_aliases: Sequence[str] = ()) -> None:
    """--min-seconds, --min-epochs (and `epochs_aliases`), --rounds, --max-spread, --cold: ProtocolConfig's."""
    group = parser.add_argument_group("the measurement protocol (dali_pipes_bench/protocol.py)")
    group.add_argument("--min-seconds", type=float, default=defaults.min_seconds,
                       help="seconds each case is timed, all rounds together (default: %(default)s)")
    group.add_argument("--min-epochs", *epochs_aliases, dest="min_epochs", type=float, default=defaults.min_epochs,
                       help="whole epochs each case covers, all rounds together (default: %(default)s)")
    group.add_argument("--rounds", type=int, default=defaults.rounds,
                       help=f"alternating rounds over every case; fewer than {MIN_ROUNDS} are not ranked "
                            f"(default: %(default)s)")
    group.add_argument("--max-spread", type=float, default=defaults.max_spread,
                       help="a case whose rounds differ by more than this fraction of its median is not ranked "
                            "(default: %(default)s)")
    group.add_argument("--cold", action="store_true", help="drop the data files from the page cache "
                       "(posix_fadvise DONTNEED, Linux) before each window and epoch: storage is measured too")


def protocol_from_args(args: Any, **overrides: Any) -> ProtocolConfig:
    values = {"min_seconds": args.min_seconds, "min_epochs": args.min_epochs, "rounds": args.rounds,
              "max_spread": args.max_spread, "cold": args.cold}
    return ProtocolConfig(**{**values, **overrides})
