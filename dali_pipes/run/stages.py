"""After DALI: a batch's path as a chain of small stages, each wrapping the one before (torchdata.nodes'
composition: a stage owns its state and knows nothing of the others' insides).

    the rank's pipeline (rank.py)      DALI's batches; the epoch's last one drains DALI's epoch (after the step)
    [the val cache (val_cache.py)]     a val loader with a budget: later val epochs given again without DALI
    EpochBatches                       batch `index` of the epoch as the contract cuts it; its delivery recorded
    [Transformed (batch_mix.py)]       a collate_fn run, or Mixup / CutMix, keyed by (rank, epoch, index)
    [Pinned]                           pin_memory: CPU batches pinned where a GPU will take them

The first two are batch sources (BatchSource: `next(wanted)`, told which batch of which epoch is wanted); from
the epoch cut on, each is a BatchStage (`next()`, the epoch's next batch, StopIteration at its end; `state()`
and `restore()`, what a resume needs of the stage: none keeps any today, the val cache starts empty and the
transform draws from its key alone). The loader builds the chain at each epoch's start (`batch_path`) and moves
its position once a batch is out; stages read the position, never move it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from dali_pipes.data.samples import PADDING_LABEL

if TYPE_CHECKING:
    from dali_pipes.run.batch_mix import BatchTransform
    from dali_pipes.run.contract import EpochCut
    from dali_pipes.run.position import Position


@dataclass(frozen=True)
class Wanted:
    """The batch the epoch cut asks its source for: batch `index` of the `batches` of loader epoch `epoch`, of
    which the loader yields `images` entries (the rest is padding the cut drops)."""
    epoch: int
    index: int
    batches: int
    images: int

    @property
    def last(self) -> bool:
        """The epoch's last batch: DALI's batches past it are read once the step is done (rank.py)."""
        return self.index == self.batches - 1


@dataclass(frozen=True, eq=False)
class SourceReading:
    """What a batch source reads now: `whole`, a whole epoch of this world (not an elastic resume's rest);
    `data`, the data it reads, a new object once bad samples were excluded (compared by identity); `excluded`,
    how many bad samples are excluded so far."""
    whole: bool
    data: object
    excluded: int


class BatchSource(Protocol):
    """What gives the epoch cut DALI's batches (dicts of "images", "labels", "ids"): the rank's pipeline, or
    the val cache in front of it."""

    def next(self, wanted: Wanted) -> dict | None:
        """The wanted batch; None where DALI ended the epoch first."""


class BatchStage(Protocol):
    """One step on a batch after DALI."""

    def next(self) -> Any:
        """The epoch's next batch; StopIteration at the epoch's end."""

    def state(self) -> dict | None:
        """What a resume needs of this stage, or None."""

    def restore(self, state: dict | None) -> None:
        """Take back what state() gave."""


class Stateless:
    """A stage that keeps nothing for a resume."""

    def state(self) -> dict | None:
        return None

    def restore(self, state: dict | None) -> None:
        return None


class EpochBatches(Stateless):
    """The epoch cut: batch `position.batch` of the epoch `cut` describes, from `source`, padding cut or
    labelled (val_padding="label"), laid out (channels_last: NHWC memory, NCHW shape); `delivered(ids, count)`
    hears the first `count` sample identities of each batch (the rank's delivery record). (images, labels)."""

    def __init__(self, source: BatchSource, cut: EpochCut, position: Position,
                 delivered: Callable[[Any, int], None], channels_last: bool) -> None:
        self.source, self.cut, self.position, self.delivered = source, cut, position, delivered
        self.channels_last = channels_last

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        at, cut = self.position, self.cut
        if at.batch >= cut.batches:
            raise StopIteration
        size, real = cut.size(at.batch), cut.real_in(at.batch)
        batch = self.source.next(Wanted(at.epoch, at.batch, cut.batches, size))
        if batch is None:
            raise StopIteration  # DALI ended the epoch first: never, as contract.py models it
        self.delivered(batch["ids"], real)  # what this batch delivers
        images, labels = batch["images"][:size], batch["labels"][:size]
        if cut.pad_label and real < size:
            labels = labels.clone()
            labels[real:] = PADDING_LABEL  # val_padding="label": masked by the loop
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory, NCHW shape: torch's channels_last
        return images, labels


class Transformed(Stateless):
    """The batch transform (batch_mix.py) on each batch, keyed by (rank, epoch, batch index): what it returns
    is the batch ((images, targets), or what a collate_fn run returns)."""

    def __init__(self, inner: BatchStage, transform: BatchTransform, rank: int, position: Position) -> None:
        self.inner, self.transform, self.rank, self.position = inner, transform, rank, position

    def next(self) -> Any:
        images, labels = self.inner.next()
        return self.transform(images, labels, (self.rank, self.position.epoch, self.position.batch))


class Pinned(Stateless):
    """Each batch with its tensors pinned (pin_memory)."""

    def __init__(self, inner: BatchStage) -> None:
        self.inner = inner

    def next(self) -> Any:
        return pinned(self.inner.next())


def batch_path(source: BatchSource, cut: EpochCut, position: Position, delivered: Callable[[Any, int], None], *,
               channels_last: bool, transform: BatchTransform | None, rank: int, pin: bool) -> BatchStage:
    """The chain of one epoch's stages after `source`, as the loader's settings ask for them."""
    stage: BatchStage = EpochBatches(source, cut, position, delivered, channels_last)
    if transform is not None:
        stage = Transformed(stage, transform, rank, position)
    return Pinned(stage) if pin else stage


def pinned(batch: Any) -> Any:
    """`batch` with its tensors pinned, through tuples, lists and dicts, as DataLoader's pin_memory pins them."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {key: pinned(value) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(pinned(value) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(pinned(value) for value in batch)
    return batch
