"""What acts around one rank's batches: one small protocol, and the view of the rank a feature may use.

Online tuning (tuning.py), the sharding check (sharding.py), the clock (stats.py), the store-outage
handler (outage.py) and the image-size schedule (resolution.py) each act when an epoch begins, after each
batch and when an epoch ends, and some keep state for a resume. The rank's pipeline (rank.py) runs them in
order and knows none of them by type; a new feature is a new hook, not lines in the central class. Only the
hooks that act after a batch (their class overrides after_batch) are called there: a batch runs no code of a
hook that does nothing with it.

One hook may also decide what DALI reads each epoch (EpochOrder: a sampler's drawn order, sampled.py); the
rank's pipeline is handed it by that role, never by the hook's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from dali_pipes.data.source import Source
    from dali_pipes.run.contract import EpochCut
    from dali_pipes.run.delivery import DeliveryRecord
    from dali_pipes.run.elastic import Remainder
    from dali_pipes.run.pipeline import Feed, PipelineSpec
    from dali_pipes.run.position import Position
    from dali_pipes.run.recovery import BadSamplePolicy


@dataclass(frozen=True)
class BatchTiming:
    """One batch as the loop felt it, on time.perf_counter's clock: asked for at `asked`, in hand at `got`
    (a rebuild before it included); `images` what the loader yields of it (padding cut)."""
    asked: float
    got: float
    images: int


class RankView(Protocol):
    """What a hook may read of the rank's pipeline, and what it may ask of it."""
    spec: PipelineSpec          # the settings the next build uses (a schedule's sizes resolved per epoch)
    source: Source              # what it reads, bad samples excluded so far
    record: DeliveryRecord      # the samples delivered this epoch
    position: Position          # the loader's position (read only)
    remainder: Remainder | None  # an elastic resume's rest of an epoch, while it runs
    policy: BadSamplePolicy     # the bad samples excluded so far (policy.bad_samples)

    @property
    def built(self) -> PipelineSpec | None:
        """The spec of the pipeline running now (one image size)."""


    def rebuild(self, spec: PipelineSpec, *, now: bool = False) -> None:
        """Go on with `spec` from the last delivered batch, at once or before the next batch: the same
        samples in the same order, every random draw carried (DALI's checkpoint). A build before then (a
        restored state's) takes `spec` as it is."""


class BatchHook(Protocol):
    """A feature that acts around batches. Each method does nothing unless a hook says otherwise; a hook
    with a `name` keeps `state()` under that key of the loader state's "pipeline" part (resume.py), and
    `describe()` under that key of DaliLoader.stats(). (The bodies say `return None`: a body of a docstring
    alone would make the method abstract to a type checker, and every hook would have to write each one.)"""
    name: str = ""

    def begin_epoch(self, rank: RankView, batches: int) -> None:
        """An epoch of `batches` batches starts (at rank.position.batch: a resumed epoch midway)."""
        return None

    def after_batch(self, rank: RankView, timing: BatchTiming) -> None:
        """A batch was delivered."""
        return None

    @property
    def listening(self) -> bool:
        """Whether the hook still hears each batch (after_batch). One whose work is done (the tuner once it
        chose) says False, and the rank leaves it off the batch path from the next epoch's start."""
        return True

    def end_epoch(self, rank: RankView) -> None:
        """The epoch's batches are out (DALI's end of it read)."""
        return None

    def state(self) -> dict | None:
        """What a resume needs of this hook, or None."""
        return None

    def describe(self) -> dict | None:
        """What the hook tells of itself in the loader's stats() (under its name), or None."""
        return None

    def restore(self, rank: RankView, state: dict | None) -> None:
        """Take back what state() gave (None: the state had nothing of this hook)."""
        return None

    def merge(self, states: list[dict | None]) -> dict | None:
        """The one state an elastic resume restores from every old rank's state() of this hook (rank order):
        by default the first old rank's that has one (a tuner's choice is the same on every rank)."""
        return next((state for state in states if state), None)


def acts_after_batch(hook: BatchHook) -> bool:
    """Whether the hook does something after a batch: its class overrides BatchHook.after_batch, and it is still
    `listening`."""
    overrides = getattr(type(hook), "after_batch", BatchHook.after_batch) is not BatchHook.after_batch
    return overrides and hook.listening


class EpochOrder(BatchHook, Protocol):
    """A hook that decides what DALI reads each epoch in place of the source's reader (sampled.py: a sampler's
    indices drawn per epoch): the rank's pipeline reads its `feed`, cuts the epoch by it, the bad-sample search
    looks where it says (reach, window), and an elastic resume asks it whether it can be replayed."""

    @property
    def feed(self) -> Feed:
        """What DALI reads in place of the source's reader."""

    def cut(self, epoch: int) -> EpochCut:
        """This rank's epoch `epoch` as the order cuts it."""

    def reach(self, position: int, epoch: int) -> list[Sequence[int]]:
        """What DALI can have read after `position` delivered batches (recovery.ReadReach)."""

    def window(self) -> int:
        """How many samples DALI can have read ahead (recovery.ReadReach)."""

    def elastic_refusal(self) -> str | None:
        """Why an interrupted epoch cannot be resumed on another world size, or None when it can."""
