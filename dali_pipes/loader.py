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

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any, Iterator, Protocol, runtime_checkable

import torch

from dali_pipes.config import LoaderConfig, SourceConfig
from dali_pipes.data.detection_dataset import is_detection_dataset
from dali_pipes.data.detection_location import CONVERT_FIX, DETECTION_TASK, location_task
from dali_pipes.data.samples import SampleKeys
from dali_pipes.data.source import Source, open_source, samples_source, with_num_classes
from dali_pipes.dataloader_args import LOCATION_TYPES, DataLoaderCall, read_as_pil, resolve_call
from dali_pipes.detection_loader import DetectionLoader, detection_location_loader
from dali_pipes.errors import DatasetError
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.graph.resolution import ImageSize
from dali_pipes.loader_surface import DataLoaderAttributes, EpochRequests, PositionView
from dali_pipes.options import take_renamed
from dali_pipes.run import resume
from dali_pipes.run.accelerate_end import EpochEnd, gathered_real, gradient_state, process_place
from dali_pipes.run.contract import Contract, EpochCut
from dali_pipes.run.dist import Shard
from dali_pipes.run.heap import release_free_memory_now_and_then
from dali_pipes.run.lifetime import OneIteration
from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs
from dali_pipes.run.position import Position
from dali_pipes.run.rank import FeedOptions, RankBatches, RankPipeline, rank_pipeline
from dali_pipes.run.recovery import BadSamplePolicy
from dali_pipes.run.sampled import SampledEpochs, SamplerRead
from dali_pipes.run.stages import batch_path
from dali_pipes.run.val_cache import ValCache
from dali_pipes.storage import remote

DEVICES = ("auto", "gpu", "cpu")
DETECTION_KEYWORDS = ("images", "data_augmentation")  # a detection location's own keywords
_LOADER, _SOURCE = LoaderConfig(), SourceConfig()  # the loader's defaults, written once (config.py)
REQUIRE_GPU_ENV = "DALI_PIPES_REQUIRE_GPU"
log = logging.getLogger("dali_pipes")


@runtime_checkable
class Loader(Protocol):
    """What the training loop needs of a loader; DaliLoader and the DataLoader baseline both are one."""
    @property  # load_state_dict takes every old rank's state on another world size
    def supports_elastic(self) -> bool: ...

    @property  # read-only, as DaliLoader's: a property, so that a loader may compute them
    def source(self) -> Source: ...
    @property
    def bad_samples(self) -> list: ...
    @property
    def image_size(self) -> int: ...  # the side of the images of the epoch the next batch is in
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


def detection_use(dataset: Any, kwargs: dict) -> bool:
    """Is this call DaliLoader(location, ...) over detection data: a COCO JSON, or shards whose manifest says
    "task": "detection"? With a detection keyword (images=, data_augmentation=) on other data: DatasetError."""
    if not isinstance(dataset, LOCATION_TYPES) or isinstance(dataset, list) and not dataset:
        return False
    store = remote.ClientOptions.of(kwargs.get("storage_attempts", _LOADER.storage_attempts),
                                    kwargs.get("storage_timeout", _LOADER.storage_timeout),
                                    deadline=kwargs.get("download_deadline", _LOADER.download_deadline))
    with remote.options_in_force(store):  # the loader's own retries and deadline, from its first call on
        where, task = location_task(dataset)
    asked = sorted(k for k in DETECTION_KEYWORDS if k in kwargs)
    if asked and task != DETECTION_TASK:
        found = f"its manifest {where} says task {task!r}" if task else f"no conversion manifest at {where}"
        raise DatasetError(str(dataset), f"{', '.join(asked)}= given, but this is no detection data ({found})",
                           CONVERT_FIX + "; or leave out the detection keywords for classification")
    return task == DETECTION_TASK


def store_options(attempts: int, timeout: float, deadline: float, kwargs: dict) -> remote.ClientOptions:
    """A loader's own retries, timeout and deadline; s3_attempts / s3_timeout (their names until 0.3) taken out of
    its other keywords for one more release, with a DeprecationWarning."""
    renamed = take_renamed(kwargs, LoaderConfig, stacklevel=3)
    return remote.ClientOptions.of(renamed.get("storage_attempts", attempts), renamed.get("storage_timeout", timeout),
                                   deadline=deadline)


def open_dataset(call, keys: SampleKeys | None, label_ext: str, index_cache_dir: str | None,
                 skip_bad: bool, storage_attempts: int | remote.ClientOptions, allow_duplicates: bool = False,
                 num_classes: int | None = None, storage_timeout: float | None = None) -> Source:
    """The Source of a DaliLoader call: a dataset object's sample list, a Source, or a location, its labels
    bounded by `num_classes` where given. Opening lists and reads objects under the loader's own retries
    (`storage_attempts`: a count with `storage_timeout`, or the ClientOptions), never another loader's."""
    options = storage_attempts if isinstance(storage_attempts, remote.ClientOptions) else \
        remote.ClientOptions.of(storage_attempts, storage_timeout)
    with remote.options_in_force(options):
        return _open_dataset(call, keys, label_ext, index_cache_dir, skip_bad, allow_duplicates, num_classes)


def _open_dataset(call, keys: SampleKeys | None, label_ext: str, index_cache_dir: str | None, skip_bad: bool,
                  allow_duplicates: bool, num_classes: int | None) -> Source:
    if call.location is None:
        return with_num_classes(samples_source(call.root, call.samples, call.classes, skip_bad), num_classes)
    if isinstance(call.location, Source):
        return with_num_classes(call.location, num_classes)
    return open_source(call.location, keys=keys, label_ext=label_ext, index_cache_dir=index_cache_dir,
                       skip_bad=skip_bad, allow_duplicates=allow_duplicates, num_classes=num_classes)


class BadSampleView:
    """What a loader shows of its bad-sample policy (run/recovery.py): public since 0.2.0."""
    pipe: RankPipeline

    @property
    def bad_policy(self) -> BadSamplePolicy:
        return self.pipe.policy

    @property
    def skip_bad(self) -> bool:  # bad samples are excluded, not raised
        return self.pipe.policy.skip

    @property
    def bad_samples(self) -> list:  # samples excluded so far (skip_bad=True)
        return self.pipe.policy.bad_samples


def _close_quietly(loader: DaliLoader) -> None:
    try:
        loader.close()
    except Exception:  # at garbage collection, or at shutdown (other modules' names None by then): no one to tell
        pass


class DaliLoader(DataLoaderAttributes, PositionView, BadSampleView):
    """(images, labels) batches for this rank, epoch after epoch; iterate it once per epoch."""

    pipe: RankPipeline  # set by __init__; absent when it failed before (close() looks first)

    def __new__(cls, dataset: Any = None, *args, **kwargs) -> Any:
        if is_detection_dataset(dataset):  # torchvision's CocoDetection: images and box targets (detection_loader.py)
            return DetectionLoader(dataset, *args, **{**kwargs, "device": resolve_device(kwargs.get(
                "device", _LOADER.device))})
        if detection_use(dataset, kwargs):  # a COCO JSON or detection shards by location: the same, read here
            return detection_location_loader(dataset, *args, **{**kwargs, "device": resolve_device(kwargs.get(
                "device", _LOADER.device))})
        return super().__new__(cls)

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
                 keys: SampleKeys | None = None, skip_bad: bool = _LOADER.skip_bad,
                 max_bad: int | float | None = _LOADER.max_bad, decode_device: str | None = _LOADER.decode_device,
                 label_ext: str = _SOURCE.label_ext, index_cache_dir: str | None = _SOURCE.index_cache_dir,
                 max_pixels: int | None = _LOADER.max_pixels, remote_feed: str = _LOADER.remote_feed,
                 cache_dir: str | None = _LOADER.cache_dir, cache_bytes: int = _LOADER.cache_bytes,
                 cache_prefetch: int = _LOADER.cache_prefetch, storage_attempts: int = _LOADER.storage_attempts,
                 storage_timeout: float = _LOADER.storage_timeout, download_deadline: float = _LOADER.download_deadline,
                 allow_duplicates: bool = _SOURCE.allow_duplicates, sharding_check: bool = _LOADER.sharding_check,
                 val_cache_bytes: int = _LOADER.val_cache_bytes, num_classes: int | None = None,
                 batch_transform: Any = None, **augment_args) -> None:
        started = time.perf_counter()  # stats()["first_batch_s"] counts from here: opening the data included
        store = store_options(storage_attempts, storage_timeout, download_deadline, augment_args)  # this loader's own
        refuse_both_augments(augment, augment_args)
        call = resolve_call(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, seed=seed,
                            batch_sampler=batch_sampler, collate_fn=collate_fn, drop_last=drop_last, train=train,
                            generator=generator, rank=rank, world_size=world_size, worker_init_fn=worker_init_fn,
                            is_location=isinstance(dataset, (Source, *LOCATION_TYPES)),
                            batch_transform=batch_transform)
        self.keep_dataloader_arguments(call, num_workers, pin_memory, timeout, prefetch_factor, persistent_workers,
                                       generator, multiprocessing_context)
        self.contract = Contract(call.train, call.batch_size, call.drop_last, val_padding, call.sampler_drop_last,
                                 call.dali_drop)
        self.train, self.seed, self.val_padding = call.train, call.seed, val_padding
        self.device = resolve_device(device)
        self.shard = Shard.from_env(call.rank, call.world_size, local_rank)
        source = open_dataset(call, keys, label_ext, index_cache_dir, skip_bad, store, allow_duplicates, num_classes)
        self.keep_dataset_and_sampler(call, source)
        self._epoch_requests, self._iterations = EpochRequests(call.sampler), OneIteration()  # set_epoch's; threads'
        self.augment = read_as_pil(augment_of(augment, call, image_size, augment_args), call)
        self.contract.check_one_batch(source.num_samples, self.shard.world_size, source.location)
        policy = BadSamplePolicy(skip=skip_bad, max_bad=max_bad, device=self.device, max_pixels=max_pixels)
        spec = spec_of(self, call, num_threads or num_workers or None,  # DataLoader's workers: DALI's threads
                       prefetch_queue_depth, decode_device, shuffle_buffer, max_pixels)
        self.position, self.val_cache = Position(), ValCache(val_cache_bytes, spec, self.augment)
        self.pipe = rank_pipeline(source, self.val_cache.spec, self.position, policy,  # the spec carries the contract
                                  feed=FeedOptions(remote_feed, cache_dir, cache_bytes, cache_prefetch, store),
                                  sharding_check=sharding_check, started=started,
                                  order=drawn_order(call, self, source))
        self._batch_source = self.val_cache.over(RankBatches(self.pipe))  # DALI's batches, or a val epoch given again
        build_or_close(self)

    @property
    def supports_elastic(self) -> bool:  # not where a sampler's draw depends on the world size (run/sampled.py)
        return self.pipe.order is None or self.pipe.order.elastic_refusal() is None

    def close(self) -> None:  # the pipeline (threads, memory) and the shard cache now, not at garbage collection
        if "pipe" in vars(self):  # absent when __init__ failed before building it
            self.pipe.close()

    def __del__(self, _close=_close_quietly) -> None:  # bound now: at shutdown the module's names may be None
        _close(self)

    def set_epoch(self, epoch: int) -> None:
        """DistributedSampler's (a DistributedSampler passed in reaches here too): see EpochRequests."""
        self._epoch_requests.set(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Lazy: Lightning probes with a throwaway iter(); acting here would finish a resumed epoch unread.
        if self.pipe.failure is not None:
            raise self.pipe.failure  # never continue silently after a pipeline error
        return self._epoch()

    def _epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with self._iterations.begin(self.pipe, self.position):  # refused in a second thread; after a Ctrl-C, afresh
            if self.position.batch and not self.position.resumed:
                for _ in self._batches():  # an epoch abandoned midway: DALI can only start at a boundary
                    pass
            self._follow_requested_epoch()
            self.position.resumed = False
            yield from self._batches()

    def _follow_requested_epoch(self) -> None:
        requested, at = self._epoch_requests.take(), self.position
        if self.train and requested is not None and requested > at.epoch and not at.batch and not at.resumed \
                and self.pipe.remainder is None:  # DALI's epochs only go forward, from a boundary
            at.epoch = requested
            self.pipe.build()  # a fresh pipeline: its slice rotation starts at this epoch

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.pipe.begin_epoch(len(self))  # the hooks' epoch: a sampler's draw, clock, tuning, image-size schedule, ...
        cut, at = self._cut(), self.position
        path = batch_path(self._batch_source, cut, at, self.pipe.record.add, rank=self.shard.rank,
                          channels_last=self.augment.channels_last, transform=self.batch_transform, pin=self.pins())
        end = accelerate_end(self, cut)  # Accelerate hears where the epoch ends (run/accelerate_end.py); else None
        with end or contextlib.nullcontext():
            while True:  # the epoch's batches through its stages (run/stages.py)
                try:
                    out = path.next()  # (images, labels), or what a collate_fn returned
                except StopIteration:
                    break
                at.batch += 1
                if end is not None:
                    end.batch(at.batch == cut.batches)
                yield out
        end_epoch(self)

    def stats(self) -> dict:
        """This epoch's figures so far, or the last epoch's once it ended (stats_of); the val cache's."""
        return {**stats_of(self.pipe), "val_cache": self.val_cache.describe()}

    def state_dict(self) -> dict:
        """Where this rank is (resume.py's layout: DALI's checkpoint, counters, bad samples, delivered
        samples). Take it between batches."""
        self.pipe.settle()  # after an epoch's last batch: DALI's epoch end first, so the state starts the next
        return resume.state_of(self.pipe, self.next_batch, self.position, facts_of(self), self.source.fingerprint)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue exactly where `state` was taken, images included. Given every old rank's state in rank
        order, also on another world size: the new ranks yield the rest of the interrupted epoch (elastic.py)."""
        resume.restore(self.pipe, self.position, facts_of(self), state)


def spec_of(loader: DaliLoader, call: DataLoaderCall, num_threads: int | str | None, prefetch_queue_depth: int | str,
            decode_device: str | None, shuffle_buffer: int, max_pixels: int | None) -> PipelineSpec:
    """The rank's pipeline settings, from the loader's resolved call, contract, shard and augmentation; the tuned
    knobs as asked ("auto" ones searched by tuning.py)."""
    knobs, tuned = TunedKnobs.requested(num_threads, prefetch_queue_depth, loader.augment.hw_decoder_load)
    return PipelineSpec(contract=loader.contract, device=loader.device,
                        decode_device=decode_device, shard=loader.shard, seed=loader.seed, augment=loader.augment,
                        knobs=knobs, tuned=tuned, shuffle_buffer=shuffle_buffer, shuffle=call.shuffle,
                        max_pixels=max_pixels)


def build_or_close(loader: DaliLoader) -> None:
    """Build the loader's first pipeline; where that fails, close what was started (the pipeline's threads, the
    shard cache's folder) now, not when the traceback goes."""
    try:
        loader.pipe.build()
    except BaseException:
        loader.close()
        raise


def refuse_both_augments(augment: AugmentConfig | None, augment_args: dict) -> None:
    """Before anything is opened: augment= and augmentation keywords are two answers to one question."""
    if augment is not None and augment_args:
        raise ValueError("pass either augment=AugmentConfig(...) or augmentation keywords, not both")


def augment_of(augment: AugmentConfig | None, call: DataLoaderCall, image_size: ImageSize | None,
               augment_args: dict) -> AugmentConfig:
    """The loader's augmentation: `augment`, or the dataset's transform read as keywords (call.augment_args) with
    image_size= and the augmentation keywords given to DaliLoader over them."""
    sizes = {"image_size": image_size} if image_size is not None else {}
    return augment or AugmentConfig(**{**call.augment_args, **sizes, **augment_args})


def end_epoch(loader: DaliLoader) -> None:
    """After an epoch's last batch: DALI's epoch drained, the hooks' epoch end (tuning's choice if still open, the
    sharding check), the position on, a resumed epoch's rest done, the bad samples counted, heap pages given back."""
    pipe, at = loader.pipe, loader.position
    pipe.settle()
    remainder_done = pipe.end_epoch()
    at.next_epoch()
    if remainder_done:  # a resumed epoch's rest is done: this world's own pipeline now
        pipe.build()
    if pipe.policy.skip:  # the count is always shown, so a dataset that rots is noticed
        log.warning("rank %d, %s loader: %d bad samples excluded after epoch %d", loader.shard.rank,
                    "train" if loader.train else "val", len(loader.bad_samples), at.epoch - 1)
    release_free_memory_now_and_then()  # else fragmented heap pages pile up (run/heap.py)


def accelerate_end(loader: DaliLoader, cut: EpochCut) -> EpochEnd | None:
    """This epoch as Accelerate's GradientState hears it, where Accelerate runs: its `remainder` from every
    process's real entries in its last batch, where the processes' slices are known (each process reads slice
    `rank`, or val under Accelerate slice world - 1 - rank: running_framework.accelerate_shard); else 0."""
    state, pipe, shard = gradient_state(), loader.pipe, loader.shard
    if state is None:
        return None  # no Accelerate: nothing to tell, and nothing runs per batch
    if not cut.batches or pipe.order is not None or pipe.remainder is not None:
        return EpochEnd(state, 0)
    (me, processes), world = process_place(), shard.world_size
    slices = {me: range(world), world - 1 - me: range(world - 1, -1, -1)}.get(shard.rank)
    if slices is None or processes != world:
        return EpochEnd(state, 0)
    reader, last = pipe.reader(), cut.batches - 1
    cuts = [loader.contract.epoch_cut(dataclasses.replace(reader, rank=k), pipe.pipeline_epoch, None, len(pipe.run),
                                      loader.num_samples) for k in slices]
    return EpochEnd(state, gathered_real([c.real_in(last) for c in cuts], cut.size(last)))


def drawn_order(call: DataLoaderCall, loader: DaliLoader, source: Source) -> SampledEpochs | None:
    """The epochs of a sampler the loader reads by drawing its indices (run/sampled.py), or None: DALI's reader
    stands in. With persistent workers DataLoader draws its base seed at the first epoch only; the draw does too."""
    if not call.drawn:
        return None
    persistent = loader.persistent_workers and loader.num_workers > 0
    read = SamplerRead(call.sampler, loader.generator, persistent, loader.shard)
    return SampledEpochs(read, source, loader.contract, loader.position)


def stats_of(pipe: RankPipeline) -> dict:
    """A rank's figures (stats.LoaderClock.stats: waits, rates, CPU, threads, rebuilds and trials), its shard
    cache's (s3:// data: "shard_cache", remote_feed.py), and what the hooks tell of themselves ("tuned":
    online tuning's start, trials and choice; tuning.py)."""
    knobs = pipe.spec.knobs
    return {**pipe.clock.stats(knobs.num_threads, knobs.prefetch_queue_depth), "shard_cache": pipe.feed.stats(),
            **{hook.name: hook.describe() for hook in pipe.hooks if hook.name}}


def facts_of(loader: DaliLoader) -> resume.LoaderFacts:
    """What the loader's state records of it and must match on resume (resume.py)."""
    identity = resume.LoaderIdentity(rank=loader.shard.rank, world_size=loader.shard.world_size,
                                     batch_size=loader.batch_size, train=loader.train,
                                     num_samples=loader.num_samples, seed=loader.seed)
    contract = loader.contract
    return resume.LoaderFacts(identity, dataclasses.asdict(contract), resume.image_sizes(loader.augment, loader.train),
                              loader.train and (contract.dali_drop or contract.drop_last))
