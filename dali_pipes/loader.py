"""DaliLoader: one rank's DALI pipeline, shaped like torch.utils.data.DataLoader.

Called as DataLoader is (the class name is the only change in a script):

    loader = DaliLoader(ImageFolder(root, transform), batch_size=256, shuffle=True, num_workers=8,
                        pin_memory=True)                      # or sampler=DistributedSampler(dataset)

or the dali_pipes way, from any dataset location (folder, file list, TFRecord / WebDataset shards, s3://):

    loader = DaliLoader("/data/train", batch_size=256, train=True)
    for epoch in range(epochs):
        loader.set_epoch(epoch)                                       # as DistributedSampler's
        for images, labels in loader:                                 # (N,3,H,W) float, (N,) int64
            ...

Epoch contract (contract.py), DataLoader + DistributedSampler's unless asked otherwise:
  * val: each rank yields ceil(N / world_size) samples (a few repeats make them equal, as
    DistributedSampler's do), the last batch short; val_padding="label" gives full batches with
    padding labelled -1, "none" each sample exactly once (batch counts may then differ by one);
  * train called the DataLoader way: drop_last=False yields each rank's real samples, the last
    batch short; called the dali_pipes way (drop_last unset), len(loader) = (N // world_size) //
    batch_size full batches per rank, each sample at most once per epoch, the tail dropped;
  * the batch count is the same on every rank, so DDP never waits on a rank with fewer batches.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterator, Protocol, runtime_checkable

import torch

from dali_pipes import object_store, resume
from dali_pipes.config import LoaderConfig, SourceConfig
from dali_pipes.contract import Contract, EpochCut, Position
from dali_pipes.dataloader_args import (LOCATION_TYPES, DatasetView, EpochRequests, SamplerView,
                                        dataloader_attributes, read_as_pil, resolve_call)
from dali_pipes.dist import Shard
from dali_pipes.graph import AugmentConfig, resolve_decode_device
from dali_pipes.pipeline import RankPipeline, cuda_device_id
from dali_pipes.procfs import release_free_memory_now_and_then
from dali_pipes.recovery import BadSamplePolicy
from dali_pipes.resolution import ImageSize
from dali_pipes.samples import PADDING_LABEL, TFRecordKeys
from dali_pipes.source import Source, open_source, samples_source, with_num_classes

DEVICES = ("auto", "gpu", "cpu")
_LOADER, _SOURCE = LoaderConfig(), SourceConfig()  # the loader's defaults, written once (config.py)
REQUIRE_GPU_ENV = "DALI_PIPES_REQUIRE_GPU"
log = logging.getLogger("dali_pipes")


@runtime_checkable
class Loader(Protocol):
    """What the training loop needs of a loader; DaliLoader and the DataLoader baseline both are one."""
    source: Source
    bad_samples: list
    supports_elastic: bool  # load_state_dict takes every old rank's state on another world size
    image_size: int  # the side of the images of the epoch the next batch is in

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...
    def __len__(self) -> int: ...
    @property
    def next_batch(self) -> tuple[int, int]: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state) -> None: ...
    def close(self) -> None: ...


def resolve_device(device: str) -> str:
    """"gpu" or "cpu". With DALI_PIPES_REQUIRE_GPU=1, "auto" never falls back to the CPU: a CPU-only
    torch on a GPU machine is then an error, not a silent slow run."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    cuda = torch.cuda.is_available()
    if device == "auto" and not cuda and os.environ.get(REQUIRE_GPU_ENV) == "1":
        raise RuntimeError(f"{REQUIRE_GPU_ENV}=1 but torch sees no CUDA device (torch {torch.__version__}, built "
                           f"for CUDA {torch.version.cuda}); install a CUDA build of torch")
    if device == "auto":
        return "gpu" if cuda else "cpu"
    if device == "gpu" and not cuda:
        raise RuntimeError("device='gpu' but torch sees no CUDA device; use device='cpu' or 'auto'")
    return device


def open_dataset(call, keys: TFRecordKeys | None, label_ext: str, index_cache_dir: str | None,
                 skip_bad: bool, s3_attempts: int, s3_timeout: float, allow_duplicates: bool = False,
                 num_classes: int | None = None) -> Source:
    """The Source of a DaliLoader call: a dataset object's sample list, a Source, or a location, its labels
    bounded by `num_classes` where given. The process's S3 retries are set first (object_store.configure):
    opening lists and reads objects."""
    object_store.configure(attempts=s3_attempts, timeout=s3_timeout)
    if call.location is None:
        return with_num_classes(samples_source(call.root, call.samples, call.classes, skip_bad), num_classes)
    if isinstance(call.location, Source):
        return with_num_classes(call.location, num_classes)
    return open_source(call.location, keys=keys, label_ext=label_ext, index_cache_dir=index_cache_dir,
                       skip_bad=skip_bad, allow_duplicates=allow_duplicates, num_classes=num_classes)


class DaliLoader:
    """(images, labels) batches for this rank, epoch after epoch; iterate it once per epoch."""

    supports_elastic = True
    pipe: RankPipeline | None = None

    def __init__(self, dataset: Source | str | os.PathLike | list | Any, batch_size: int | None = 1,
                 shuffle: bool | None = None, sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Any = None, pin_memory: bool = False, drop_last: bool | None = None, timeout: float = 0,
                 worker_init_fn: Any = None, multiprocessing_context: Any = None, generator: Any = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True, train: bool | None = None, val_padding: str = "repeat",
                 device: str = _LOADER.device, rank: int | None = None, world_size: int | None = None,
                 local_rank: int | None = None, image_size: ImageSize | None = None, seed: int | None = None,
                 num_threads: int | str | None = _LOADER.num_threads, shuffle_buffer: int = _LOADER.shuffle_buffer,
                 prefetch_queue_depth: int | str = _LOADER.prefetch_queue_depth, augment: AugmentConfig | None = None,
                 keys: TFRecordKeys | None = None, skip_bad: bool = _LOADER.skip_bad,
                 max_bad: int | float | None = _LOADER.max_bad, decode_device: str | None = _LOADER.decode_device,
                 label_ext: str = _SOURCE.label_ext, index_cache_dir: str | None = _SOURCE.index_cache_dir,
                 allow_duplicates: bool = _SOURCE.allow_duplicates,
                 max_pixels: int | None = _LOADER.max_pixels, remote_feed: str = _LOADER.remote_feed,
                 cache_dir: str | None = _LOADER.cache_dir, cache_bytes: int = _LOADER.cache_bytes,
                 cache_prefetch: int = _LOADER.cache_prefetch, s3_attempts: int = _LOADER.s3_attempts,
                 s3_timeout: float = _LOADER.s3_timeout, sharding_check: bool = _LOADER.sharding_check,
                 num_classes: int | None = None, **augment_args) -> None:
        if augment is not None and augment_args:
            raise ValueError("pass either augment=AugmentConfig(...) or augmentation keywords, not both")
        call = resolve_call(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, seed=seed,
                            batch_sampler=batch_sampler, collate_fn=collate_fn, drop_last=drop_last, train=train,
                            generator=generator, rank=rank, world_size=world_size, worker_init_fn=worker_init_fn,
                            is_location=isinstance(dataset, (Source, *LOCATION_TYPES)))
        self.__dict__.update(dataloader_attributes(call, batch_size, num_workers, pin_memory, timeout, prefetch_factor,
                                                   persistent_workers, generator, worker_init_fn, multiprocessing_context))
        self.contract = Contract(call.train, batch_size, call.drop_last, val_padding, call.sampler_drop_last,
                                 call.dali_drop)
        self.train, self.seed, self.val_padding, self.device = call.train, call.seed, val_padding, resolve_device(device)
        resolve_decode_device(self.device, decode_device)  # refuse device="cpu" with decode_device="gpu" now
        self._pin = pin_memory and self.device == "cpu" and torch.cuda.is_available()
        self.shard = Shard.from_env(call.rank, call.world_size, local_rank)
        source = open_dataset(call, keys, label_ext, index_cache_dir, skip_bad, s3_attempts, s3_timeout,
                              allow_duplicates, num_classes)  # num_classes: the model's outputs bound the labels
        self.dataset = call.dataset if call.dataset is not None else DatasetView(source)
        self.sampler = call.sampler if call.sampler is not None else SamplerView(self)
        self._epoch_requests = EpochRequests(call.sampler)  # set_epoch's, followed at the next epoch's start
        sizes = {"image_size": image_size} if image_size is not None else {}
        self.augment = read_as_pil(augment or AugmentConfig(**{**call.augment_args, **sizes, **augment_args}), call)
        self.contract.check_one_batch(source.num_samples, self.shard.world_size, source.location)
        policy = BadSamplePolicy(skip=skip_bad, max_bad=max_bad, device=self.device, max_pixels=max_pixels,
                                 device_id=cuda_device_id(self.shard) if self.device == "gpu" else None)
        args = dict(train=self.train, shuffle=call.shuffle, batch_size=batch_size, device=self.device,
                    shard=self.shard, seed=self.seed, augment=self.augment,
                    num_threads=num_threads or num_workers or None, max_pixels=max_pixels,
                    shuffle_buffer=shuffle_buffer, prefetch_queue_depth=prefetch_queue_depth,
                    decode_device=decode_device)
        self.position = Position()
        self.pipe = RankPipeline.create(source, args, self.position, policy, contract=self.contract,
                                        remote_feed=remote_feed, cache_dir=cache_dir, cache_bytes=cache_bytes,
                                        cache_prefetch=cache_prefetch, sharding_check=sharding_check)
        try:
            self.pipe.build()
        except BaseException:
            self.close()  # its pipeline and shard cache (threads, folder) now, not when the traceback goes
            raise

    source = property(lambda self: self.pipe.source, doc="what this loader reads (bad samples excluded so far "
                                                         "replaced in place)")
    bad_policy = property(lambda self: self.pipe.policy, doc="the bad-sample policy (recovery.py)")
    skip_bad = property(lambda self: self.pipe.policy.skip, doc="bad samples are excluded, not raised")
    bad_samples = property(lambda self: self.pipe.policy.bad_samples, doc="samples excluded so far (skip_bad=True)")

    def close(self) -> None:
        """Free the pipeline (its threads and memory) and the shard cache now, not at garbage collection."""
        if self.pipe is not None:
            self.pipe.close()

    def __del__(self) -> None:
        _close_quietly(self)

    epoch = property(lambda self: self.position.epoch, doc="epochs completed")
    num_samples = property(lambda self: self.source.num_samples, doc="samples in the whole dataset (all ranks)")

    @property
    def image_size(self) -> int:
        """The side of the images of the epoch the next batch is in (train: the image_size schedule's)."""
        return self.augment.for_epoch(self.next_batch[0], self.train).image_size

    def __len__(self) -> int:
        """Batches this rank yields this epoch, as DataLoader counts them for the same arguments."""
        return self._cut().batches

    def _cut(self) -> EpochCut:
        return self.contract.epoch_cut(self.pipe.reader(), self.position, self.pipe.record.remainder,
                                       len(self.pipe.run), self.num_samples)

    @property
    def samples_per_epoch(self) -> int:
        """Real samples this rank yields per epoch (repeats and padding not counted)."""
        return self._cut().real_count

    @property
    def next_batch(self) -> tuple[int, int]:
        """(epoch, batch index) of the next batch this loader yields."""
        at = self.position
        return (at.epoch + 1, 0) if at.batch >= len(self) else (at.epoch, at.batch)

    def set_epoch(self, epoch: int) -> None:
        """DistributedSampler's (a DistributedSampler passed in reaches here too): see EpochRequests."""
        self._epoch_requests.set(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Lazy: Lightning probes with a throwaway iter(); acting here would finish a resumed epoch unread.
        if self.pipe.failure is not None:
            raise self.pipe.failure  # never continue silently after a pipeline error
        return self._epoch()

    def _epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.pipe.failure is not None:
            raise self.pipe.failure
        if self.position.batch and not self.position.resumed:
            for _ in self._batches():  # an epoch abandoned midway: DALI can only start at a boundary
                pass
        self._follow_requested_epoch()
        self.pipe.follow_schedule()  # this epoch's image size (resolution.py)
        self.position.resumed = False
        yield from self._batches()

    def _follow_requested_epoch(self) -> None:
        requested, at = self._epoch_requests.take(), self.position
        if self.train and requested is not None and requested > at.epoch and not at.batch and not at.resumed \
                and self.pipe.record.remainder is None:  # DALI's epochs only go forward, from a boundary
            at.epoch = requested
            self.pipe.build()  # a fresh pipeline: its shard rotation starts at this epoch

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        cut, at = self._cut(), self.position
        self.pipe.begin_epoch(cut.batches)
        while at.batch < cut.batches:
            batch = self.pipe.next(cut.size(at.batch))
            if batch is None:
                break  # DALI ended the epoch first: never, as contract.py models it
            images, labels = self._shape(batch, cut)
            at.batch += 1
            if at.batch == cut.batches:
                self.pipe.end_epoch_later()  # DALI's batches past the contract's, after the step (settle)
            yield images, labels
        self.pipe.settle()
        self.pipe.finish_epoch()  # tuning's choice if still open; the sharding check after the first epoch
        at.next_epoch()
        if self.pipe.record.end_epoch():  # a resumed epoch's rest is done: this world's own pipeline now
            self.pipe.build()
        if self.pipe.policy.skip:  # the count is always shown, so a dataset that rots is noticed
            log.warning("rank %d: %d bad samples excluded after epoch %d", self.shard.rank, len(self.bad_samples),
                        at.epoch - 1)
        release_free_memory_now_and_then()  # else fragmented heap pages pile up (procfs.py)

    def _shape(self, batch: dict, cut: EpochCut) -> tuple[torch.Tensor, torch.Tensor]:
        """This batch as the contract cuts it; records what it delivers."""
        size, real = cut.size(self.position.batch), cut.real_in(self.position.batch)
        images, labels = batch["images"][:size], batch["labels"][:size]
        if cut.pad_label and real < size:
            labels = labels.clone()
            labels[real:] = PADDING_LABEL  # val_padding="label": masked by the loop
        self.pipe.record.add(batch["ids"], real)
        if self.augment.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory, NCHW shape: torch's channels_last
        return (images.pin_memory(), labels.pin_memory()) if self._pin else (images, labels)

    def stats(self) -> dict:
        """This epoch's figures so far, or the last epoch's once it ended (RankPipeline.stats)."""
        return self.pipe.stats()

    def state_dict(self) -> dict:
        """Where this rank is (resume.py's layout: DALI's checkpoint, counters, bad samples, delivered
        samples). Take it between batches."""
        return resume.state_of(self)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue exactly where `state` was taken, images included. Given every old rank's state in rank
        order, also on another world size: the new ranks yield the rest of the interrupted epoch (elastic.py)."""
        resume.restore(self, state)


def _close_quietly(loader: DaliLoader) -> None:
    try:
        loader.close()
    except Exception:  # at garbage collection: nothing to report to
        pass
