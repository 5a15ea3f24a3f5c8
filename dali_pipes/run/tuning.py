"""Settings that fit the machine: DALI's CPU threads and prefetch depth chosen while the first epoch
runs (`num_threads="auto"`, `prefetch_queue_depth="auto"`), and remembered for the next run.

Why the loader may change them mid-epoch: neither knob changes a sample. DALI draws every random
number per sample (not per thread) and a checkpoint carries the reader's position and every
generator, so a pipeline rebuilt at the checkpoint of the last delivered batch with other threads or
another depth goes on with exactly the batches the old one would have given (tests/test_tuning.py
checks images and labels against the chosen values fixed, also across a resume and an elastic one).
What is *not* tuned online: `hw_decoder_load` changes which decoder (hardware or CUDA) makes each
image of a GPU graph, so its pixels may differ by rounding; it is measured offline only, by
`dali-pipes profile`. On a mixed decoder the per-thread memory paddings follow the thread count
(graph.decoder_paddings): memory, not pixels.

The objective is the consumer's, as tf.data's AUTOTUNE: first the time the training loop waits
inside next(), then the CPU time the process spends per batch (when the loop never waits, fewer
threads leave cores to the model). Bounded: at most MAX_TRIALS trials and MAX_FRACTION of the
first epoch's batches; each trial and the choice are logged (logger "dali_pipes").

The memory, a JSON file under the cache root ($DALI_PIPES_CACHE/tuning.json, default
~/.cache/dali_pipes/tuning.json), is keyed by machine (CPU model, usable cores, GPU, DALI version),
graph (mode, device, augmentation, batch size, format) and ranks per node. A remembered choice is
the next run's start, and is only confirmed (one trial) unless the loop then waits. It is a file a
person may edit: an entry is used only if the tuner could have chosen it here (entry_problem: threads
in 1..usable CPUs, a depth of DEPTHS); anything else (a file that is not a memory, a bad entry) is
treated as absent, with one warning naming the file. Writers hold a lock beside it (tuning.json.lock).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from dali_pipes.run.hooks import BatchHook, BatchTiming, RankView
from dali_pipes.run.machine import default_threads, usable_cpus
from dali_pipes.run.stats import Spread
from dali_pipes.storage.files import atomic_write, locked

if TYPE_CHECKING:
    from dali_pipes.run.pipeline import PipelineSpec
    from dali_pipes.run.stats import LoaderClock

AUTO = "auto"
MAX_TRIALS = 8
MAX_FRACTION = 0.10  # of the first epoch's batches
DEPTHS = (2, 3, 4)
SETTLE = 1  # batches after each (re)build not measured: the new pipeline fills its queue
WAIT_TOLERANCE = 0.02  # of a batch's wall time: waits closer than this are equal (then the lower CPU wins)
CONFIRM_WAIT = 0.05  # a remembered choice whose loop waits more than this fraction is searched again
LOCK_TIMEOUT_S = 10.0  # a writer holds the memory's lock for one read and one write: milliseconds
log = logging.getLogger("dali_pipes")


@dataclass(frozen=True)
class Settings:
    num_threads: int
    prefetch_queue_depth: int

    def __str__(self) -> str:
        return f"num_threads={self.num_threads} prefetch_queue_depth={self.prefetch_queue_depth}"


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
    """Add or update one entry. The read-modify-write holds a lock beside the file (files.locked), so
    concurrent writers lose no entry; the write is an atomic rename, so no reader sees a torn file. An
    old entry for `key` that is not valid is replaced, never merged."""
    path = memory_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with locked(path + ".lock", LOCK_TIMEOUT_S):
            entries = read_entries(path)
            old = entries.get(key) if entry_problem(entries.get(key)) is None else {}
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
    settings: Settings
    seen: int = 0       # batches since its build (the first SETTLE not measured)
    measured: int = 0
    wait: float = 0.0   # seconds inside next(), summed over measured batches
    wall: float = 0.0   # seconds from one batch to the next
    cpu: float = 0.0    # process CPU seconds over the same spans
    started: float = field(default_factory=time.perf_counter)
    walls: list[float] = field(default_factory=list)  # each measured batch's, for the log line's spread

    def per_batch(self) -> tuple[float, float, float]:
        n = max(1, self.measured)
        return self.wait / n, self.wall / n, self.cpu / n

    def describe(self) -> str:
        wait, wall, cpu = self.per_batch()
        return (f"{self.settings}: waits {wait * 1e3:.1f} ms of {wall * 1e3:.1f} ms per batch (median [min, max] "
                f"{Spread.of(self.walls).text(1e3, 1)} ms), {cpu / max(wall, 1e-9):.2f} cores busy")


@dataclass
class Tuner:
    """One rank's search. `observe` hears every batch of the first epoch and answers the settings to
    rebuild with, or None. Threads first (from the start down, halving, while the wait does not grow;
    up to every core when the start waits), then the prefetch depth."""
    start: Settings
    tune_threads: bool
    tune_depth: bool
    cores: int
    remembered: bool = False
    trials: list[Trial] = field(default_factory=list)
    done: bool = False
    chosen: Settings | None = None
    window: int = 0       # measured batches per trial
    max_trials: int = 0
    rank: int = 0
    loader: str = "train"  # which loader the log lines are about: "train" or "val"
    on_trial: Callable[[Trial], None] | None = None  # hears each trial once it is measured

    @property
    def current(self) -> Settings:
        return self.trials[-1].settings if self.trials else self.start

    def begin(self, batches: int) -> None:
        """The first epoch has `batches` batches: size the trials to MAX_FRACTION of them."""
        budget = int(MAX_FRACTION * batches)
        self.window = max(2, min(8, budget // MAX_TRIALS - SETTLE))
        self.max_trials = min(MAX_TRIALS, budget // (self.window + SETTLE))
        if self.max_trials < (1 if self.remembered else 2):
            self._finish(self.start, f"the first epoch's {batches} batches are too few to try settings in "
                                     f"{MAX_FRACTION:.0%} of them")
            return
        self.trials.append(Trial(self.start))

    def observe(self, wait: float, wall: float, cpu: float) -> Settings | None:
        """One batch of the current trial; the settings of the next trial when this one is done."""
        if self.done or not self.trials:
            return None
        trial = self.trials[-1]
        trial.seen += 1
        if trial.seen <= SETTLE:
            return None
        trial.measured += 1
        trial.wait, trial.wall, trial.cpu = trial.wait + wait, trial.wall + wall, trial.cpu + cpu
        trial.walls.append(wall)
        if trial.measured < self.window:
            return None
        log.info("tuning rank %d, %s loader: trial %d: %s", self.rank, self.loader, len(self.trials), trial.describe())
        if self.on_trial is not None:
            self.on_trial(trial)
        following = self._next() if len(self.trials) < self.max_trials else None
        if following is None:
            best = self._best()
            self._finish(best.settings, f"best of {len(self.trials)} trials: {best.describe()}")
            return best.settings if best.settings != trial.settings else None
        self.trials.append(Trial(following))
        return following

    def epoch_ended(self) -> Settings | None:
        """The first epoch ended before the search did: settle on the best trial measured."""
        if self.done:
            return None
        measured = [t for t in self.trials if t.measured]
        best = self._best(measured) if measured else Trial(self.current)
        self._finish(best.settings, "the epoch ended first")
        return best.settings if best.settings != self.current else None

    def _tolerance(self, trials: list[Trial]) -> float:
        return WAIT_TOLERANCE * min(t.per_batch()[1] for t in trials) + 5e-4

    def _best(self, trials: list[Trial] | None = None) -> Trial:
        trials = [t for t in (trials or self.trials) if t.measured]
        least_wait = min(t.per_batch()[0] for t in trials)
        equal = [t for t in trials if t.per_batch()[0] <= least_wait + self._tolerance(trials)]
        return min(equal, key=lambda t: (t.per_batch()[2], t.settings.num_threads, t.settings.prefetch_queue_depth))

    def _next(self) -> Settings | None:
        tried = {t.settings for t in self.trials}
        last, best = self.trials[-1], self._best()
        if self.remembered and len(self.trials) == 1:
            wait, wall, _ = last.per_batch()
            if wait <= CONFIRM_WAIT * wall:
                return None  # confirmed
        candidates = self._thread_candidates(best, last) + self._depth_candidates(best)
        return next((s for s in candidates if s not in tried), None)

    def _thread_candidates(self, best: Trial, last: Trial) -> list[Settings]:
        if not self.tune_threads:
            return []
        worse = last is not best and last.per_batch()[0] > best.per_batch()[0] + self._tolerance(self.trials)
        threads, depth = best.settings.num_threads, best.settings.prefetch_queue_depth
        wait, wall, _ = best.per_batch()
        out = []
        if wait > CONFIRM_WAIT * wall and threads < self.cores:  # the loop waits: more threads may help
            out.append(Settings(self.cores, depth))
        lower = threads // 2
        if lower >= 1 and not (worse and last.settings.num_threads < threads):
            out.append(Settings(lower, depth))  # fewer threads until the wait grows
        return out

    def _depth_candidates(self, best: Trial) -> list[Settings]:
        if not self.tune_depth:
            return []
        threads, depth = best.settings.num_threads, best.settings.prefetch_queue_depth
        return [Settings(threads, d) for d in DEPTHS if d > depth][:1]

    def _finish(self, settings: Settings, why: str) -> None:
        self.done, self.chosen = True, settings
        log.info("tuning rank %d, %s loader: chose %s (%s)", self.rank, self.loader, settings, why)

    def tuned_values(self) -> dict:
        """The chosen values of the knobs this tuner searched (a value the user fixed is not remembered)."""
        searched = {"num_threads": self.tune_threads, "prefetch_queue_depth": self.tune_depth}
        return {k: v for k, v in dataclasses.asdict(self.chosen).items() if searched[k]}

    def state(self) -> dict | None:
        """For the loader's state: the choice once made (a resumed run does not search again)."""
        return dataclasses.asdict(self.chosen) if self.done and self.chosen else None


def plan(spec: PipelineSpec, kind: str, clock: LoaderClock, *, tune_threads: bool, tune_depth: bool,
         online: bool = True) -> tuple[PipelineSpec, OnlineTuning | None]:
    """(the spec to start with: remembered or default values for the knobs left "auto", the tuning hook or
    None). `online=False` where a rebuild is not allowed (rank.py says where): the start values run."""
    if not (tune_threads or tune_depth):
        return spec, None
    cores = default_threads()
    key = memory_key(spec, kind)
    entry = recall(key) or {}
    start = Settings(entry.get("num_threads", cores) if tune_threads else spec.num_threads or cores,
                     entry.get("prefetch_queue_depth", 2) if tune_depth else spec.prefetch_queue_depth)
    spec, rank, role = dataclasses.replace(spec, **dataclasses.asdict(start)), spec.shard.rank, loader_role(spec)
    if not online:
        log.info("tuning rank %d, %s loader: not tuned online here (s3:// through the shard cache); running %s%s",
                 rank, role, start, " as remembered" if entry else "; dali-pipes profile or --num-threads set it")
        return spec, None
    tuner = Tuner(start, tune_threads, tune_depth, cores, remembered=bool(entry), rank=rank, loader=role)
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
    go on unchanged), and remembers the choice (local rank 0 only). Its state is the choice once made."""
    name = "tuned"

    def __init__(self, tuner: Tuner, clock: LoaderClock, key: str | None) -> None:
        self.tuner, self.clock, self.key = tuner, clock, key
        # Its trials on the loader's clock (a trace shows them): the clock, never the rank (no reference cycle)
        tuner.on_trial = lambda t: clock.event("tuning trial", t.started, time.perf_counter(),
                                               settings=str(t.settings), result=t.describe())

    def begin_epoch(self, rank: RankView, batches: int) -> None:
        if not self.tuner.done and not self.tuner.trials:
            self.tuner.begin(batches)

    def after_batch(self, rank: RankView, timing: BatchTiming) -> None:
        if not self.tuner.done:
            self._follow(rank, self.tuner.observe(*self.clock.last))

    def end_epoch(self, rank: RankView) -> None:
        if not self.tuner.done and self.tuner.trials:  # the search outlived the first epoch
            self._follow(rank, self.tuner.epoch_ended())

    def _follow(self, rank: RankView, settings: Settings | None) -> None:
        if settings is not None:
            rank.rebuild(dataclasses.replace(rank.spec, **dataclasses.asdict(settings)))
        if self.tuner.done and self.key is not None:
            remember(self.key, {**self.tuner.tuned_values(), "source": "online"})
            self.key = None

    def state(self) -> dict | None:
        return self.tuner.state()

    def describe(self) -> dict:
        """The search as the loader's stats() shows it: where it started (remembered or not), each trial's
        settings and figures, and the choice once made."""
        tuner = self.tuner
        return {"start": dataclasses.asdict(tuner.start), "remembered": tuner.remembered, "done": tuner.done,
                "trials": [{**dataclasses.asdict(t.settings), "seen": t.seen, "measured": t.measured}
                           for t in tuner.trials],
                "chosen": dataclasses.asdict(tuner.chosen) if tuner.chosen else None}

    def restore(self, rank: RankView, state: dict | None) -> None:
        """A state's choice: no search here (values the user fixed stay fixed; a pending trial is dropped)."""
        if state:
            self.tuner.done, self.tuner.chosen = True, Settings(**state)
            rank.rebuild(dataclasses.replace(rank.spec, **self.tuner.tuned_values()))  # the restore builds
