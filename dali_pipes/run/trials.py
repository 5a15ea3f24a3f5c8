"""The tuner's trials: the settings one trial runs (Settings), its measured window (Trial), and how two
trials are judged (decide): like with like, a difference in wait counts only beyond its spread (NOISE_SIGMAS
standard errors of the difference of the means, from the per-batch waits; at least WAIT_TOLERANCE of a batch),
otherwise the cheaper setting wins, the one that leaves CPU cores and memory to the model (fewer threads, more
hardware decoding, a shallower queue). The search that runs them is tuning.Tuner.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field

from dali_pipes.run.stats import Spread

DEPTHS = (2, 3, 4)
HW_LOADS = (0.0, 0.65, 0.99)  # hw_decoder_load tried on a mixed decoder: CUDA only, DALI's default, nearly all hardware
SETTLE = 1  # batches after each (re)build not measured: the new pipeline fills its queue
WARMUP_WINDOW = 4  # the last steps that must agree before the first trial (the first CUDA/cuDNN steps do not)
STEADY_SPREAD = 0.25  # steps agree when their range is within this fraction of their median + STEP_JITTER_S
STEP_JITTER_S = 0.02  # a step's scheduling jitter on a busy host: never a transient
NOISE_SIGMAS = 3.0  # a difference in mean wait counts beyond this many standard errors of it
WAIT_TOLERANCE = 0.02  # of a batch's wall time: a difference in wait below this (+ 0.5 ms) never counts


@dataclass(frozen=True)
class Settings:
    num_threads: int
    prefetch_queue_depth: int
    hw_decoder_load: float | None = None  # None: not searched (a CPU or hybrid decode, or a value the user fixed)

    def __str__(self) -> str:
        load = "" if self.hw_decoder_load is None else f" hw_decoder_load={self.hw_decoder_load:g}"
        return f"num_threads={self.num_threads} prefetch_queue_depth={self.prefetch_queue_depth}{load}"

    def values(self) -> dict:
        """The knobs as keywords; hw_decoder_load only where searched."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def cost(self) -> tuple:
        """Cheaper first: fewer threads, more decoding on the hardware decoder (fewer CPU cycles), a shallower
        queue (less memory). What leaves the model its CPU cores, when the waits do not decide."""
        return self.num_threads, -(self.hw_decoder_load or 0.0), self.prefetch_queue_depth



@dataclass
class Trial:
    """One setting's window: `skip` batches pass unmeasured (after a build: the new pipeline fills its queue;
    after a discarded window: the batches DALI prepared during the long step come without a wait), then the
    per-batch figures of the next ones, until the tuner's window is full."""
    settings: Settings
    skip: int = SETTLE
    seen: int = 0         # batches since its build, skipped and discarded ones included
    discarded: int = 0    # windows thrown away because they held a transient step
    waits: list[float] = field(default_factory=list)  # per measured batch: seconds inside next()
    walls: list[float] = field(default_factory=list)  # seconds from the previous batch in hand to this one
    cpus: list[float] = field(default_factory=list)   # process CPU seconds over the same span
    started: float = field(default_factory=time.perf_counter)

    @property
    def measured(self) -> int:
        return len(self.waits)

    def add(self, wait: float, wall: float, cpu: float) -> None:
        self.waits.append(wait)
        self.walls.append(wall)
        self.cpus.append(cpu)

    def discard(self, skip: int) -> None:
        """A transient step (tuning.OUTLIER_FACTOR) fell in the window: measure the whole window again."""
        self.waits, self.walls, self.cpus = [], [], []
        self.discarded, self.skip = self.discarded + 1, skip

    def per_batch(self) -> tuple[float, float, float]:
        """Mean (wait, wall, cpu) seconds per measured batch."""
        n = max(1, self.measured)
        return sum(self.waits) / n, sum(self.walls) / n, sum(self.cpus) / n

    def wait_error(self) -> float:
        """The standard error of the mean wait, from the per-batch waits (0 below two batches)."""
        return statistics.stdev(self.waits) / math.sqrt(self.measured) if self.measured > 1 else 0.0

    def figures(self) -> dict:
        wait, wall, cpu = self.per_batch()
        return {"seen": self.seen, "measured": self.measured, "discarded": self.discarded,
                "wait_ms": wait * 1e3, "wait_error_ms": self.wait_error() * 1e3, "wall_ms": wall * 1e3,
                "cpu_cores": cpu / max(wall, 1e-9)}

    def describe(self) -> str:
        wait, wall, cpu = self.per_batch()
        discarded = f", {self.discarded} window(s) discarded for a transient step" if self.discarded else ""
        return (f"{self.settings}: waits {wait * 1e3:.1f} ms (standard error {self.wait_error() * 1e3:.1f} ms) of "
                f"{wall * 1e3:.1f} ms per batch (median [min, max] {Spread.of(self.walls).text(1e3, 1)} ms) over "
                f"{self.measured} batches, {cpu / max(wall, 1e-9):.2f} cores busy{discarded}")


def wait_deviation(trials: list[Trial]) -> float:
    """The per-batch waits' standard deviation within trials, pooled over `trials` (a trial of a few batches
    alone may look steady by chance; the pool has their degrees of freedom together)."""
    squares = sum(sum((w - t.per_batch()[0]) ** 2 for w in t.waits) for t in trials)
    freedom = sum(t.measured - 1 for t in trials if t.measured > 1)
    return math.sqrt(squares / freedom) if freedom else 0.0


def spread(a: Trial, b: Trial, deviation: float) -> float:
    """What a difference between the mean waits of `a` and `b` must exceed to count: NOISE_SIGMAS standard
    errors of the difference (`deviation`: the per-batch waits' pooled standard deviation), and at least
    WAIT_TOLERANCE of a batch's wall time + 0.5 ms (a smaller gain is not worth the cores)."""
    noise = NOISE_SIGMAS * deviation * math.sqrt(1 / max(1, a.measured) + 1 / max(1, b.measured))
    return max(noise, WAIT_TOLERANCE * min(a.per_batch()[1], b.per_batch()[1]) + 5e-4)


def decide(trials: list[Trial]) -> tuple[Trial, str]:
    """(the trial to keep, why). The one that waits least, unless a cheaper one (Settings.cost: fewer threads,
    more hardware decoding, a shallower queue) waits no more than the spread above it: a difference within
    noise never decides, the setting that leaves CPU cores and memory to the model does."""
    deviation = wait_deviation(trials)

    def wait(t: Trial) -> float:
        return t.per_batch()[0]

    def beyond(t: Trial, than: Trial) -> float:
        return spread(t, than, deviation)

    least = min(trials, key=wait)
    equal = [t for t in trials if wait(t) - wait(least) <= beyond(t, least)]
    chosen = min(equal, key=lambda t: t.settings.cost())
    if chosen is not least:
        return chosen, (f"within noise, the cheaper: it waits {(wait(chosen) - wait(least)) * 1e3:.1f} ms more per "
                        f"batch than {least.settings}, within the spread of {beyond(chosen, least) * 1e3:.1f} ms")
    beaten = [t for t in trials if t not in equal]
    if not beaten:  # every other trial within noise of it, and costlier
        return chosen, (f"it waits least ({wait(chosen) * 1e3:.1f} ms per batch) and is the cheapest; the other "
                        f"{len(equal) - 1} trial(s) wait the same within noise")
    nearest = min(beaten, key=wait)
    return chosen, (f"{(wait(nearest) - wait(chosen)) * 1e3:.1f} ms less wait per batch than {nearest.settings}, "
                    f"beyond the spread of {beyond(nearest, chosen) * 1e3:.1f} ms")


def steady(steps: list[float]) -> bool:
    """The last WARMUP_WINDOW steps agree: their range within STEADY_SPREAD of their median + STEP_JITTER_S."""
    recent = steps[-WARMUP_WINDOW:]
    return len(recent) == WARMUP_WINDOW and max(recent) - min(recent) <= (
        STEADY_SPREAD * statistics.median(recent) + STEP_JITTER_S)
