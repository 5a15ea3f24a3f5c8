"""The pieces of DataLoader's surface a DaliLoader carries: its attributes as DataLoader sets them
(DataLoaderAttributes), where it is as its position and its epoch cut tell (PositionView), the epochs a script
asks for (EpochRequests), `loader.dataset` of a location (DatasetView) and `loader.sampler` when none was given
(SamplerView)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from dali_pipes.dataloader_args import DataLoaderCall
from dali_pipes.run.batch_mix import BatchTransform
from dali_pipes.run.lifetime import recover

if TYPE_CHECKING:
    from dali_pipes.data.source import Source
    from dali_pipes.graph.augment_config import AugmentConfig
    from dali_pipes.run.contract import EpochCut
    from dali_pipes.run.position import Position
    from dali_pipes.run.rank import RankPipeline


class DataLoaderAttributes:
    """DataLoader's attributes, set as DataLoader sets them (timm, pytorch/examples and Lightning read them).
    There are no worker processes: num_workers and the rest are kept as given, and reported."""
    drop_last: bool
    collate_fn: Any
    batch_sampler: None
    num_workers: int
    pin_memory: bool
    timeout: float
    prefetch_factor: int | None
    persistent_workers: bool
    generator: Any
    worker_init_fn: None  # refused unless None (resolve_call)
    multiprocessing_context: Any
    dataset: Any   # the dataset given, or a DatasetView of a location
    sampler: Any   # the sampler given, or a SamplerView of the loader's epochs
    batch_transform: BatchTransform | None  # applied to each batch after DALI (run/batch_mix.py)
    contract: Any  # contract.Contract: the batch size's one home on the loader
    device: str    # where the loader's batches come out: "gpu" or "cpu"

    @property
    def batch_size(self) -> int:
        return self.contract.batch_size

    def pins(self) -> bool:
        """pin_memory, as DataLoader honours it: CPU batches pinned where a GPU will take them."""
        import torch
        return self.pin_memory and self.device == "cpu" and torch.cuda.is_available()

    def keep_dataloader_arguments(self, call: DataLoaderCall, num_workers: int, pin_memory: bool, timeout: float,
                                  prefetch_factor: int | None, persistent_workers: bool, generator: Any,
                                  multiprocessing_context: Any) -> None:
        from torch.utils.data import default_collate
        self.drop_last, self.batch_sampler = call.drop_last, None
        self.collate_fn = call.collate_fn if call.collate_fn is not None else default_collate
        self.batch_transform = call.batch_transform
        self.num_workers, self.pin_memory, self.timeout = num_workers, pin_memory, timeout
        self.prefetch_factor, self.persistent_workers, self.generator = prefetch_factor, persistent_workers, generator
        self.worker_init_fn, self.multiprocessing_context = None, multiprocessing_context

    def keep_dataset_and_sampler(self, call: DataLoaderCall, source: Any) -> None:
        """`dataset` and `sampler` as DataLoader has them: those given, else views of the source and of the
        loader's epochs."""
        self.dataset = call.dataset if call.dataset is not None else DatasetView(source)
        self.sampler = call.sampler if call.sampler is not None else SamplerView(self)


class PositionView:
    """What a loader shows of where it is: read from its position (run/position.py) and its epoch cut
    (run/contract.py), never moving either."""
    pipe: RankPipeline
    position: Position
    augment: AugmentConfig
    train: bool

    @property
    def source(self) -> Source:  # what this loader reads (bad samples excluded so far replaced in place)
        return self.pipe.source

    @property
    def epoch(self) -> int:  # epochs completed
        return self.position.epoch

    @property
    def num_samples(self) -> int:
        """Samples in the whole dataset (all ranks)."""
        return self.source.num_samples

    @property
    def image_size(self) -> int:
        """The side of the images of the epoch the next batch is in (train: the image_size schedule's)."""
        return self.augment.size_at(self.next_batch[0]) if self.train else self.augment.val_size  # as for_epoch

    def __len__(self) -> int:
        """Batches this rank yields this epoch, as DataLoader counts them for the same arguments."""
        return self._cut().batches

    def _cut(self) -> EpochCut:
        recover(self.pipe, self.position, lazily=True)  # after a Ctrl-C inside DALI (run/lifetime.py)
        return self.pipe.cut()

    @property
    def samples_per_epoch(self) -> int:  # real samples this rank yields per epoch (repeats and padding not counted)
        return self._cut().real_count

    @property
    def next_batch(self) -> tuple[int, int]:
        """(epoch, batch index) of the next batch this loader yields."""
        at = self.position
        return (at.epoch + 1, 0) if at.batch >= len(self) else (at.epoch, at.batch)


class EpochRequests:
    """The epochs a script asks for: loader.set_epoch(e), or set_epoch on the DistributedSampler it passed
    (seen as a change of the sampler's epoch). DALI reshuffles every epoch by itself; in train, an epoch
    ahead of the loader's own, asked before that epoch starts, moves the loader there (a script that
    resumes its model at epoch E calls it)."""

    def __init__(self, sampler: Any) -> None:
        self._sampler, self._seen = sampler, getattr(sampler, "epoch", None)
        self._requested: int | None = None

    def set(self, epoch: int) -> None:
        self._requested = int(epoch)

    def take(self) -> int | None:
        """The epoch asked for since the last take, or None."""
        requested, self._requested = self._requested, None
        if self._sampler is not None and getattr(self._sampler, "epoch", None) != self._seen:
            requested = self._seen = self._sampler.epoch
        return requested


class DatasetView:
    """`loader.dataset` of a loader built from a location: len() is the number of samples, with
    `classes`, `class_to_idx`, `samples` and `targets` where the source knows them."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.root = str(source.location)
        if source.classes is not None:
            self.classes = list(source.classes)
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        if source.labels is not None:
            self.samples = list(zip(source.files, source.labels))
            self.targets = list(source.labels)

    def __len__(self) -> int:
        return self.source.num_samples

    def __repr__(self) -> str:
        return f"DatasetView({self.root!r}, {len(self)} samples)"


class SamplerView:
    """`loader.sampler` when none was given: len() is this rank's samples per epoch, set_epoch(e)
    reaches the loader (timm's and Lightning's epoch probes call it)."""

    def __init__(self, loader: Any) -> None:
        # A weak reference: the loader owns this view, and a cycle back to it would leave a dropped loader
        # (and its DALI pipeline's threads and buffers) to the cycle collector instead of freeing it at once.
        self._loader = weakref.proxy(loader)

    def __len__(self) -> int:
        loader = self._loader
        cut = loader._cut()  # DataLoader's count, repeats included; what is yielded where the count is not
        return cut.count if loader.contract.dali_drop or loader.val_padding == "none" else cut.per_rank

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)
