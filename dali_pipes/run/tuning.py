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

The search's pieces live beside it: trials.py (the settings one trial runs, its window, how trials are judged)
and tuning_memory.py (the memory: a remembered choice is the next run's start).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from dali_pipes.graph.augment_config import DEFAULT_HW_LOAD
from dali_pipes.run.hooks import BatchHook, BatchTiming, RankView
from dali_pipes.run.machine import default_threads
from dali_pipes.run.pipeline import KNOBS
from dali_pipes.run.trials import (
    DEPTHS,
    HW_LOADS,
    SETTLE,
    STEP_JITTER_S,
    WARMUP_WINDOW,
    Settings,
    Trial,
    decide,
    steady,
)
from dali_pipes.run.tuning_memory import memory_key, recall, remember

if TYPE_CHECKING:
    from dali_pipes.run.pipeline import PipelineSpec
    from dali_pipes.run.stats import LoaderClock

__all__ = ["DEPTHS", "HW_LOADS", "OnlineTuning", "Settings", "Trial", "Tuner", "decide", "memory_key", "plan",
           "recall", "remember"]

MAX_TRIALS = 8
MAX_FRACTION = 0.10  # of the first epoch's batches
WARMUP_FRACTION = 0.05  # of the first epoch's batches: the longest wait for steady steps; trials start then anyway
OUTLIER_FACTOR = 4.0  # a step above this times the median step + STEP_JITTER_S is a transient: its window is redone
STEP_HISTORY = 16  # recent steps the median is taken over
CONFIRM_WAIT = 0.05  # a remembered choice whose loop waits more than this fraction is searched again
log = logging.getLogger("dali_pipes")


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


def plan(spec: PipelineSpec, kind: str, clock: LoaderClock, *, online: bool = True
         ) -> tuple[PipelineSpec, OnlineTuning | None]:
    """(the spec to start with: remembered or default values for the knobs left "auto" (spec.tuned), the tuning
    hook or None). `online=False` where a rebuild is not allowed (rank.py says where): the start values run.
    hw_decoder_load="auto" is searched on a GPU's mixed decoder only; elsewhere its start value (DEFAULT_HW_LOAD,
    TunedKnobs.requested) runs."""
    tune_threads, tune_depth = "num_threads" in spec.tuned, "prefetch_queue_depth" in spec.tuned
    tune_hw = "hw_decoder_load" in spec.tuned and spec.device == "gpu" and spec.decode_device == "gpu"
    if not (tune_threads or tune_depth or tune_hw):
        return spec, None
    cores, knobs = default_threads(), spec.knobs
    key = memory_key(spec, kind)
    entry = recall(key) or {}
    start = Settings(entry.get("num_threads", cores) if tune_threads else knobs.num_threads,
                     entry.get("prefetch_queue_depth", 2) if tune_depth else knobs.prefetch_queue_depth,
                     entry.get("hw_decoder_load", DEFAULT_HW_LOAD) if tune_hw else None)
    spec, rank, role = applied(start, spec), spec.shard.rank, loader_role(spec)
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


def applied(settings: Settings, spec: PipelineSpec, knobs: tuple[str, ...] = KNOBS) -> PipelineSpec:
    """`spec` with `settings`' values of `knobs` (hw_decoder_load only where searched: a decoder argument, so a
    new graph), its TunedKnobs replaced whole."""
    return spec.with_knobs(**{name: value for name, value in settings.values().items() if name in knobs})


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

    @property
    def listening(self) -> bool:  # its choice made, the tuner leaves the batch path (rank.begin_epoch)
        return not self.tuner.done

    def after_batch(self, rank: RankView, timing: BatchTiming) -> None:
        if not self.tuner.done:
            self._follow(rank, self.tuner.observe(*self.clock.last))

    def end_epoch(self, rank: RankView) -> None:
        if not self.tuner.done and self.tuner.begun:  # the search outlived the first epoch
            self._follow(rank, self.tuner.epoch_ended())

    def _follow(self, rank: RankView, settings: Settings | None) -> None:
        if settings is not None:
            rank.rebuild(applied(settings, rank.spec))
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
            rank.rebuild(applied(self.tuner.chosen, rank.spec, self.tuner.searched()))  # the restore builds
