"""Settings that fit the machine: DALI's CPU threads and prefetch depth, and on a GPU the share of images
the hardware JPEG decoder takes, chosen while the first epoch runs (`num_threads="auto"`,
`prefetch_queue_depth="auto"`, `hw_decoder_load="auto"`), and remembered for the next run.

Why the loader may change them mid-epoch: threads and depth change no sample. DALI draws every random
number per sample (not per thread) and a checkpoint carries the reader's position and every
generator, so a pipeline rebuilt at the checkpoint of the last delivered batch with other threads or
another depth goes on with exactly the batches the old one would have given (tests/test_tuning.py
checks images and labels against the chosen values fixed, also across a resume and an elastic one).
On a mixed decoder the per-thread memory paddings follow the thread count (graph.decoder_paddings):
memory, not pixels. `hw_decoder_load` is a decoder argument, so a new graph (an AugmentConfig field),
rebuilt the same way: the same samples, crops and flips, but each image is made by the other decoder
(hardware or CUDA), so its pixels may differ by the decoders' rounding. It is searched only when asked
for ("auto"; a number stays fixed, 0.65 by default) and only on a GPU's mixed decoder; tests/test_tuning.py
measures the rounding on a GPU (`-m gpu`: the same batches at 0 and 0.99).

The objective is the consumer's, as tf.data's AUTOTUNE: the time the training loop waits inside
next(). Like with like: trials start once the loop's own step time (wall - wait) is steady, so the first
CUDA/cuDNN steps fall in no trial (at most WARMUP_FRACTION of the first epoch is waited; then trials
start anyway), every trial measures the same number of batches of the same epoch, and a window that
holds a transient step (OUTLIER_FACTOR times the median step: a checkpoint, a late warm-up) is measured
again, so a transient never counts against one setting only. A difference in wait counts only beyond
its spread (NOISE_SIGMAS standard errors of the difference of the means, from the per-batch waits;
at least WAIT_TOLERANCE of a batch); otherwise the cheaper setting wins, the one that leaves CPU cores
and memory to the model (fewer threads, more hardware decoding, a shallower queue), and the log says
"within noise". Bounded: at most MAX_TRIALS trials and MAX_FRACTION of the first epoch's batches; each
trial's figures and the decision are logged (logger "dali_pipes") and shown in DaliLoader.stats()["tuned"].

The memory, a JSON file under the cache root ($DALI_PIPES_CACHE/tuning.json, default
~/.cache/dali_pipes/tuning.json), is keyed by machine (CPU model, usable cores, GPU, DALI version),
graph (mode, device, augmentation but hw_decoder_load, format; not the batch size) and ranks per node. A
remembered choice of every knob searched is the next run's start, and is only confirmed (one trial) unless
the loop then waits. It is a file a person may edit: an entry is used only if the tuner could have chosen
it here (entry_problem: threads in 1..usable CPUs, a depth of DEPTHS, a load in [0, 1]); anything else (a
file that is not a memory, a bad entry) is treated as absent, with one warning naming the file. Writers
hold a lock beside it (tuning.json.lock).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import filelock

from dali_pipes.graph.augment import AUTO_LOAD, DEFAULT_HW_LOAD, resolve_decode_device
from dali_pipes.run.hooks import BatchHook, BatchTiming, RankView
from dali_pipes.run.machine import default_threads, usable_cpus
from dali_pipes.run.stats import Spread
from dali_pipes.storage.files import atomic_write

if TYPE_CHECKING:
    from dali_pipes.run.pipeline import PipelineSpec
    from dali_pipes.run.stats import LoaderClock

AUTO = AUTO_LOAD  # "auto": tuned online, whichever knob (graph.augment spells it for hw_decoder_load)
MAX_TRIALS = 8
MAX_FRACTION = 0.10  # of the first epoch's batches
DEPTHS = (2, 3, 4)
HW_LOADS = (0.0, 0.65, 0.99)  # hw_decoder_load tried on a mixed decoder: CUDA only, DALI's default, nearly all hardware
SETTLE = 1  # batches after each (re)build not measured: the new pipeline fills its queue
WARMUP_WINDOW = 4  # the last steps that must agree before the first trial (the first CUDA/cuDNN steps do not)
WARMUP_FRACTION = 0.05  # of the first epoch's batches: the longest wait for steady steps; trials start then anyway
STEADY_SPREAD = 0.25  # steps agree when their range is within this fraction of their median + STEP_JITTER_S
OUTLIER_FACTOR = 4.0  # a step above this times the median step + STEP_JITTER_S is a transient: its window is redone
STEP_JITTER_S = 0.02  # a step's scheduling jitter on a busy host: never a transient
STEP_HISTORY = 16  # recent steps the median is taken over
NOISE_SIGMAS = 3.0  # a difference in mean wait counts beyond this many standard errors of it
WAIT_TOLERANCE = 0.02  # of a batch's wall time: a difference in wait below this (+ 0.5 ms) never counts
CONFIRM_WAIT = 0.05  # a remembered choice whose loop waits more than this fraction is searched again
KNOBS = ("num_threads", "prefetch_queue_depth", "hw_decoder_load")  # what the tuner may search
LOCK_TIMEOUT_S = 10.0  # a writer holds the memory's lock for one read and one write: milliseconds
log = logging.getLogger("dali_pipes")


def fixed_knobs(threads: int | str | None, depth: int | str) -> tuple[int | None, int]:
    """(num_threads, prefetch_queue_depth) a pipeline starts with, AUTO where the tuner searches: threads
    None (machine.default_threads), depth 2 (the search starts there). Another string is a ValueError."""
    for name, value in (("num_threads", threads), ("prefetch_queue_depth", depth)):
        if isinstance(value, str) and value != AUTO:
            raise ValueError(f"{name} must be a count or {AUTO!r}, got {value!r}")
    return None if isinstance(threads, str) else threads, 2 if isinstance(depth, str) else depth


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

    def apply(self, spec: PipelineSpec, knobs: tuple[str, ...] = KNOBS) -> PipelineSpec:
        """`spec` with these settings' `knobs`; hw_decoder_load (where set) is an AugmentConfig field: a new graph."""
        spec = dataclasses.replace(
            spec, num_threads=self.num_threads if "num_threads" in knobs else spec.num_threads,
            prefetch_queue_depth=self.prefetch_queue_depth if "prefetch_queue_depth" in knobs else
            spec.prefetch_queue_depth)
        if "hw_decoder_load" in knobs and self.hw_decoder_load is not None:
            spec = with_load(spec, self.hw_decoder_load)
        return spec


def with_load(spec: PipelineSpec, load: float) -> PipelineSpec:
    return dataclasses.replace(spec, augment=dataclasses.replace(spec.augment, hw_decoder_load=load))


# ---------------------------------------------------------------------------------------------
# The memory
# ---------------------------------------------------------------------------------------------

def machine() -> dict:
    """What makes one machine's best settings differ from another's."""
    import nvidia.dali
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu, "usable_cpus": usable_cpus(), "gpu": gpu_model(), "dali": nvidia.dali.__version__}


def gpu_model() -> str:
    """The GPU's model, without initialising CUDA in this process (that would pin torch's current device
    to 0 before the training script chose one): the driver's /proc entry, else torch once initialised."""
    import glob

    import torch
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                return next((line.split(":", 1)[1].strip() for line in f if line.startswith("Model")), "")
        except OSError:
            continue
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_device_name()
    return "cuda" if torch.cuda.is_available() else ""


def graph_key(spec: PipelineSpec, kind: str) -> dict:
    """The pipeline's graph as far as the threads it needs go (not the rank, seed, batch size or
    hw_decoder_load: a profile at batch 64 seeds a run at 256)."""
    augment = dataclasses.asdict(spec.augment)
    augment.pop("hw_decoder_load", None)  # a decoder knob that profile recommends: the same graph for the threads
    # DALI's own reads (None, or said explicitly, as DaliLoader resolves them for a location) keep the key they had
    # before these fields existed: remembered settings and `dali-pipes profile`'s (None) stay found
    if augment.get("exif_orientation", True) in (None, True):
        augment.pop("exif_orientation", None)
    if augment.get("png16") in (None, "scale"):
        augment.pop("png16", None)
    return {"train": spec.train, "device": spec.device, "decode_device": spec.decode_device, "format": kind,
            "augment": augment}


def memory_key(spec: PipelineSpec, kind: str) -> str:
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    text = json.dumps({"machine": machine(), "graph": graph_key(spec, kind), "ranks_per_node": ranks_per_node},
                      sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def memory_path() -> str:
    from dali_pipes.storage.files import cache_root
    return os.path.join(cache_root(), "tuning.json")


def recall(key: str) -> dict | None:
    """The remembered entry for `key`, or None: no memory, or one that is not valid here (entry_problem),
    which is treated as absent, with one warning naming the file."""
    path = memory_path()
    entry = read_entries(path).get(key)
    problem = None if entry is None else entry_problem(entry)
    if problem:
        warn_once(path, f"entry {key}: {problem}")
        return None
    return entry


def remember(key: str, entry: dict) -> None:
    """Add or update one entry. The read-modify-write holds a lock beside the file (filelock's flock), so
    concurrent writers lose no entry; the write is an atomic rename, so no reader sees a torn file. An
    old entry for `key` that is not valid is replaced, never merged."""
    path = memory_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with filelock.FileLock(path + ".lock", timeout=LOCK_TIMEOUT_S):  # its Timeout is a TimeoutError
            entries = read_entries(path)
            found = entries.get(key)
            old = found if isinstance(found, dict) and entry_problem(found) is None else {}
            merged = {**old, **entry, "date": datetime.datetime.now().isoformat(timespec="seconds")}
            problem = entry_problem(merged)
            if problem:  # the tuner and profile choose within the checked ranges: a bug, never a start
                log.warning("tuning: not remembering %s in %s: %s", merged, path, problem)
                return
            with atomic_write(path, "w") as f:
                json.dump({"version": 1, "entries": {**entries, key: merged}}, f, indent=1)
    except TimeoutError as error:  # a writer stuck with the lock must not stop training either
        log.warning("tuning: could not remember the choice in %s (%s); the next run tunes again", path, error)
    except OSError as error:  # a read-only home must not stop training: the next run tunes again
        log.warning("tuning: could not remember the choice in %s (%s); set DALI_PIPES_CACHE to a writable "
                    "folder", path, error)


def read_entries(path: str) -> dict:
    """The memory's entries by key (not checked one by one: an entry may belong to another machine);
    {} when there is no memory, or when the file is not one (warned once, naming it)."""
    try:
        with open(path) as f:
            memory = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        warn_once(path, f"unreadable ({error})")
        return {}
    entries = memory.get("entries", {}) if isinstance(memory, dict) else memory
    if not isinstance(entries, dict):
        what = '"entries"' if isinstance(memory, dict) else "the file"
        warn_once(path, f'not a tuning memory: {what} is a {type(entries).__name__}, not an object '
                        f'(expected {{"version": 1, "entries": {{...}}}})')
        return {}
    return entries


def entry_problem(entry) -> str | None:
    """What makes a remembered entry unusable on this machine, or None. The knobs must be what the tuner
    could have chosen here: threads an int in 1..usable CPUs, a depth it searches (DEPTHS)."""
    if not isinstance(entry, dict):
        return f"not an object but {type(entry).__name__} {entry!r}"
    cores = usable_cpus()
    checks = {"num_threads": (lambda v: _is_int(v) and 1 <= v <= cores, f"an int in 1..{cores} (usable CPUs)"),
              "prefetch_queue_depth": (lambda v: _is_int(v) and v in DEPTHS, f"one of the depths searched {DEPTHS}"),
              "hw_decoder_load": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
              **{name: (lambda v: isinstance(v, str), "a string") for name in ("source", "date", "binding_stage")},
              "stage_images_per_s": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_number(r)
                                                                            for k, r in v.items()),
                                     "an object of stage names and images/s")}
    for name, (ok, expected) in checks.items():
        if name in entry and not ok(entry[name]):
            return f"{name} {entry[name]!r} is not {expected}"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no thread count


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_warned: set[tuple[str, str]] = set()


def warn_once(path: str, problem: str) -> None:
    """One warning per file and problem in a process (every rank's plan and every write read the file)."""
    if (path, problem) not in _warned:
        _warned.add((path, problem))
        log.warning("tuning: %s: %s; treated as absent (tuned again and rewritten; remove the file to start "
                    "afresh)", path, problem)


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------

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


@dataclass
class Tuner:
    """One rank's search. `observe` hears every batch of the first epoch and answers the settings to
    rebuild with, or None.

    It waits for steady steps first (the first CUDA/cuDNN steps are not: at most WARMUP_FRACTION of the epoch),
    then runs trials of the same number of measured batches each, one after the other in the same epoch; a
    window that holds a transient step (OUTLIER_FACTOR times the median) is thrown away and measured again, so
    a transient never counts against one setting only. Knobs one after the other, each from the best so far:
    hw_decoder_load on a GPU's mixed decoder (from the start towards the hardware decoder, back towards CUDA
    only if that waits more), threads (from the start down, halving, while the wait does not grow beyond
    noise; up to every core when the start waits), then the prefetch depth. `decide` judges."""
    start: Settings
    tune_threads: bool
    tune_depth: bool
    cores: int
    tune_hw: bool = False
    remembered: bool = False
    trials: list[Trial] = field(default_factory=list)
    done: bool = False
    chosen: Settings | None = None
    decision: str = ""    # the choice and why, once made
    begun: bool = False   # the first epoch's size is known (begin)
    window: int = 0       # measured batches per trial
    max_trials: int = 0
    budget: int = 0       # batches the trials may take, settling and discarded windows included
    used: int = 0
    warmup_cap: int = 0   # batches to wait at most for steady steps
    warmup: int = 0       # batches waited so far
    steady: bool = False  # the warm-up ended on steady steps (not on its cap)
    steps: list[float] = field(default_factory=list)  # the loop's own recent step times (wall - wait)
    axis: int = 0         # the knob being searched (_next: hw_decoder_load, threads, depth)
    rank: int = 0
    loader: str = "train"  # which loader the log lines are about: "train" or "val"
    on_trial: Callable[[Trial], None] | None = None  # hears each trial once it is measured

    @property
    def current(self) -> Settings:
        return self.trials[-1].settings if self.trials else self.start

    def begin(self, batches: int) -> None:
        """The first epoch has `batches` batches: size the trials to MAX_FRACTION of them, the warm-up to
        WARMUP_FRACTION."""
        self.begun = True
        self.budget = int(MAX_FRACTION * batches)
        self.window = max(2, min(8, self.budget // MAX_TRIALS - SETTLE))
        self.max_trials = min(MAX_TRIALS, self.budget // (self.window + SETTLE))
        self.warmup_cap = max(WARMUP_WINDOW, int(WARMUP_FRACTION * batches))
        if self.max_trials < (1 if self.remembered else 2):
            self._finish(self.start, f"the first epoch's {batches} batches are too few to try settings in "
                                     f"{MAX_FRACTION:.0%} of them")

    def observe(self, wait: float, wall: float, cpu: float) -> Settings | None:
        """One batch; the settings of the next trial (or of the choice) when they differ from the current."""
        if self.done or not self.begun:
            return None
        step = max(0.0, wall - wait)  # the loop's own time: the model's step, whatever the loader's settings
        median = statistics.median(self.steps) if self.steps else 0.0
        transient = len(self.steps) >= WARMUP_WINDOW and step > OUTLIER_FACTOR * median + STEP_JITTER_S
        self.steps = (self.steps + [step])[-STEP_HISTORY:]  # a transient too: a lasting change moves the median
        if not self.trials:
            self._warm_up()
            return None
        trial = self.trials[-1]
        trial.seen, self.used = trial.seen + 1, self.used + 1
        if transient:
            log.info("tuning rank %d, %s loader: trial %d: a step of %.0f ms (median %.0f ms): its window is "
                     "measured again", self.rank, self.loader, len(self.trials), step * 1e3, median * 1e3)
            trial.discard(skip=trial.settings.prefetch_queue_depth)
        elif trial.skip:
            trial.skip -= 1
        else:
            trial.add(wait, wall, cpu)
        if trial.measured >= self.window:
            return self._trial_done(trial)
        if self.used >= self.budget:
            return self._conclude(f"the budget of {self.budget} batches ran out (transient steps); ")
        return None

    def epoch_ended(self) -> Settings | None:
        """The first epoch ended before the search did: settle on the best trial measured."""
        if self.done or not self.begun:
            return None
        return self._conclude("the epoch ended first; ")

    def _warm_up(self) -> None:
        """Trials start once the steps are steady, or once the warm-up's cap is reached."""
        self.warmup += 1
        self.steady = steady(self.steps)
        if self.steady or self.warmup >= self.warmup_cap:
            log.info("tuning rank %d, %s loader: trials start after %d batches (%s)", self.rank, self.loader,
                     self.warmup, "steady steps" if self.steady else "steps not steady by the warm-up's cap; "
                     "transient steps are still measured again")
            self.trials.append(Trial(self.start, skip=0))  # its pipeline has run: nothing to settle

    def _trial_done(self, trial: Trial) -> Settings | None:
        log.info("tuning rank %d, %s loader: trial %d: %s", self.rank, self.loader, len(self.trials), trial.describe())
        if self.on_trial is not None:
            self.on_trial(trial)
        room = len(self.trials) < self.max_trials and self.used + SETTLE + self.window <= self.budget
        following = self._next() if room else None
        if following is None:
            return self._conclude()
        self.trials.append(Trial(following))
        return following

    def _complete(self) -> list[Trial]:
        return [t for t in self.trials if t.measured >= self.window]  # like with like: full windows only

    def _conclude(self, why: str = "") -> Settings | None:
        """Choose among the complete trials (none: the start stays); the settings to rebuild with, if any."""
        complete = self._complete()
        if not complete:
            self._finish(self.start, why + "no trial was measured in full: the start settings stay")
        elif len(complete) == 1:
            wait, wall, _ = complete[0].per_batch()
            what = "the remembered settings, confirmed" if self.remembered else "the only trial measured"
            self._finish(complete[0].settings, f"{why}{what}: the loop waits {wait * 1e3:.1f} ms of "
                                               f"{wall * 1e3:.1f} ms per batch")
        else:
            best, reason = decide(complete)
            self._finish(best.settings, why + reason)
        return self.chosen if self.chosen != self.current else None

    def _next(self) -> Settings | None:
        """The next setting to try: along the knob being searched, from the best so far; None when done."""
        best = decide(self._complete())[0]
        if self.remembered and len(self.trials) == 1:
            wait, wall, _ = best.per_batch()
            if wait <= CONFIRM_WAIT * wall:
                return None  # confirmed
        tried = {t.settings for t in self.trials}
        axes = [axis for axis, searched in ((self._hw_candidates, self.tune_hw),
                                            (self._thread_candidates, self.tune_threads),
                                            (self._depth_candidates, self.tune_depth)) if searched]
        while self.axis < len(axes):
            untried = [s for s in axes[self.axis](best) if s not in tried]
            if untried:
                return untried[0]
            self.axis += 1  # this knob is settled: never searched again around the others' later values
        return None

    def _hw_candidates(self, best: Trial) -> list[Settings]:
        """Towards the hardware decoder first (less CPU), towards CUDA decoding only if that waited more."""
        load = best.settings.hw_decoder_load or 0.0
        above = [x for x in HW_LOADS if x > load][:1]
        below = [x for x in HW_LOADS if x < load][-1:]
        return [dataclasses.replace(best.settings, hw_decoder_load=x) for x in above + below]

    def _thread_candidates(self, best: Trial) -> list[Settings]:
        threads = best.settings.num_threads
        wait, wall, _ = best.per_batch()
        out = []
        if wait > CONFIRM_WAIT * wall and threads < self.cores:  # the loop waits: more threads may help
            out.append(self.cores)
        if threads // 2 >= 1:
            out.append(threads // 2)  # fewer threads, until the wait grows beyond noise
        return [dataclasses.replace(best.settings, num_threads=n) for n in out]

    def _depth_candidates(self, best: Trial) -> list[Settings]:
        depth = best.settings.prefetch_queue_depth
        return [dataclasses.replace(best.settings, prefetch_queue_depth=d) for d in DEPTHS if d > depth][:1]

    def _finish(self, settings: Settings, why: str) -> None:
        self.done, self.chosen, self.decision = True, settings, f"chose {settings}: {why}"
        log.info("tuning rank %d, %s loader: %s", self.rank, self.loader, self.decision)

    def searched(self) -> tuple[str, ...]:
        """The knobs this tuner searches (the others are the user's, or not searched on this decoder)."""
        return tuple(k for k, on in zip(KNOBS, (self.tune_threads, self.tune_depth, self.tune_hw)) if on)

    def tuned_values(self) -> dict:
        """The chosen values of the knobs this tuner searched, for the memory (a value the user fixed is not
        remembered)."""
        return {k: v for k, v in (self.chosen.values() if self.chosen else {}).items() if k in self.searched()}

    def state(self) -> dict | None:
        """For the loader's state: the choice once made (a resumed run does not search again)."""
        return self.chosen.values() if self.done and self.chosen else None


def plan(spec: PipelineSpec, kind: str, clock: LoaderClock, *, tune_threads: bool, tune_depth: bool,
         online: bool = True) -> tuple[PipelineSpec, OnlineTuning | None]:
    """(the spec to start with: remembered or default values for the knobs left "auto", the tuning hook or
    None). `online=False` where a rebuild is not allowed (rank.py says where): the start values run.
    hw_decoder_load="auto" is searched on a GPU's mixed decoder only; elsewhere it reads as DEFAULT_HW_LOAD."""
    tune_hw = spec.augment.hw_decoder_load == AUTO and spec.device == "gpu" and (
        resolve_decode_device(spec.device, spec.decode_device) == "gpu")
    if spec.augment.hw_decoder_load == AUTO and not tune_hw:  # a CPU decode: no hardware decoder to share with
        spec = with_load(spec, DEFAULT_HW_LOAD)
    if not (tune_threads or tune_depth or tune_hw):
        return spec, None
    cores = default_threads()
    key = memory_key(spec, kind)
    entry = recall(key) or {}
    start = Settings(entry.get("num_threads", cores) if tune_threads else spec.num_threads or cores,
                     entry.get("prefetch_queue_depth", 2) if tune_depth else spec.prefetch_queue_depth,
                     entry.get("hw_decoder_load", DEFAULT_HW_LOAD) if tune_hw else None)
    spec, rank, role = start.apply(spec), spec.shard.rank, loader_role(spec)
    if not online:
        log.info("tuning rank %d, %s loader: not tuned online here (s3:// through the shard cache); running %s%s",
                 rank, role, start, " as remembered" if entry else "; dali-pipes profile or --num-threads set it")
        return spec, None
    tuner = Tuner(start, tune_threads, tune_depth, cores, tune_hw=tune_hw, rank=rank, loader=role)
    tuner.remembered = bool(entry) and all(k in entry for k in tuner.searched())  # else a search from the part
    if entry:
        log.info("tuning rank %d, %s loader: starting from the remembered %s (%s, %s)", rank, role, start,
                 entry.get("source"), entry.get("date"))
    return spec, OnlineTuning(tuner, clock, key if spec.shard.local_rank == 0 else None)


def loader_role(spec: PipelineSpec) -> str:
    """"train" or "val": which loader a log line is about (a training job runs both, each tuning its own)."""
    return "train" if spec.train else "val"


class OnlineTuning(BatchHook):
    """The tuner as a hook on the rank's batches: it judges each batch of the first epoch by the clock's
    figures, has the rank rebuild with each trial's settings (from the last delivered batch: the batches
    go on unchanged, but for decoder rounding when hw_decoder_load changes), and remembers the choice (local
    rank 0 only). Its state is the choice once made."""
    name = "tuned"

    def __init__(self, tuner: Tuner, clock: LoaderClock, key: str | None) -> None:
        self.tuner, self.clock, self.key = tuner, clock, key
        # Its trials on the loader's clock (a trace shows them): the clock, never the rank (no reference cycle)
        tuner.on_trial = lambda t: clock.event("tuning trial", t.started, time.perf_counter(),
                                               settings=str(t.settings), result=t.describe())

    def begin_epoch(self, rank: RankView, batches: int) -> None:
        if not self.tuner.done and not self.tuner.begun:
            self.tuner.begin(batches)

    def after_batch(self, rank: RankView, timing: BatchTiming) -> None:
        if not self.tuner.done:
            self._follow(rank, self.tuner.observe(*self.clock.last))

    def end_epoch(self, rank: RankView) -> None:
        if not self.tuner.done and self.tuner.begun:  # the search outlived the first epoch
            self._follow(rank, self.tuner.epoch_ended())

    def _follow(self, rank: RankView, settings: Settings | None) -> None:
        if settings is not None:
            rank.rebuild(settings.apply(rank.spec))
        if self.tuner.done and self.key is not None:
            remember(self.key, {**self.tuner.tuned_values(), "source": "online"})
            self.key = None

    def state(self) -> dict | None:
        return self.tuner.state()

    def describe(self) -> dict:
        """The search as the loader's stats() shows it: where it started (remembered or not), the warm-up, each
        trial's settings and figures (ms per batch), and the choice with why, once made."""
        tuner = self.tuner
        return {"start": tuner.start.values(), "remembered": tuner.remembered, "done": tuner.done,
                "warmup": {"batches": tuner.warmup, "steady": tuner.steady},
                "trials": [{**t.settings.values(), **t.figures()} for t in tuner.trials],
                "chosen": tuner.chosen.values() if tuner.chosen else None, "decision": tuner.decision}

    def restore(self, rank: RankView, state: dict | None) -> None:
        """A state's choice: no search here (values the user fixed stay fixed; a pending trial is dropped)."""
        if state:
            self.tuner.done, self.tuner.chosen = True, Settings(**state)
            rank.rebuild(self.tuner.chosen.apply(rank.spec, self.tuner.searched()))  # the restore builds
