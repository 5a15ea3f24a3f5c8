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

import dataclasses
import os
import sys
from typing import Any, Iterator, Protocol, runtime_checkable

import torch
from torch.utils.data import default_collate

from dali_pipes import elastic
from dali_pipes._dali import iterator_pipelines, shutdown_pipeline
from dali_pipes.contract import Contract, EpochCut
from dali_pipes.dataloader_args import LOCATION_TYPES, DatasetView, SamplerView, resolve_call
from dali_pipes.dist import Shard
from dali_pipes.errors import DatasetError
from dali_pipes.graph import AugmentConfig, resolve_decode_device
from dali_pipes.pipeline import build_pipeline, cuda_device_id
from dali_pipes.procfs import release_free_memory
from dali_pipes.reader import READER_NAME, ReaderModel
from dali_pipes.remote_feed import RemoteFeed
from dali_pipes.recovery import BadSample, BadSamplePolicy
from dali_pipes.samples import PADDING_LABEL, TFRecordKeys
from dali_pipes.source import Source, open_source, samples_source

DEVICES = ("auto", "gpu", "cpu")


@runtime_checkable
class Loader(Protocol):
    """What the training loop needs of a loader; DaliLoader and the DataLoader baseline both are one."""
    source: Source
    bad_samples: list
    supports_elastic: bool  # load_state_dict takes every old rank's state on another world size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...
    def __len__(self) -> int: ...
    @property
    def next_batch(self) -> tuple[int, int]: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state) -> None: ...
    def close(self) -> None: ...

REQUIRE_GPU_ENV = "DALI_PIPES_REQUIRE_GPU"
_STATE_VERSION = 2


def _shutdown_quietly(pipe) -> None:
    try:
        shutdown_pipeline(pipe)
    except Exception:  # a pipeline that failed to build may hold nothing to free
        pass


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


class DaliLoader:
    """(images, labels) batches for this rank, epoch after epoch; iterate it once per epoch."""

    supports_elastic = True

    _record: elastic.DeliveryRecord | None = None  # samples delivered this epoch (elastic resume)
    _dali_epoch0 = 0  # the loader epoch that is the current pipeline's first (DALI rotates shards from it)

    def __init__(self, dataset: Source | str | os.PathLike | list | Any, batch_size: int | None = 1,
                 shuffle: bool | None = None, sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Any = None, pin_memory: bool = False, drop_last: bool | None = None, timeout: float = 0,
                 worker_init_fn: Any = None, multiprocessing_context: Any = None, generator: Any = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True, train: bool | None = None, val_padding: str = "repeat",
                 device: str = "auto", rank: int | None = None, world_size: int | None = None,
                 local_rank: int | None = None, image_size: int | None = None, seed: int | None = None,
                 num_threads: int | None = None, shuffle_buffer: int = 4096, prefetch_queue_depth: int = 2,
                 augment: AugmentConfig | None = None, keys: TFRecordKeys | None = None, skip_bad: bool = False,
                 max_bad: int | float | None = None, decode_device: str | None = None, label_ext: str = "cls",
                 index_cache_dir: str | None = None, max_pixels: int | None = 100_000_000,
                 remote_feed: str = "cache", cache_dir: str | None = None, cache_bytes: int = 8 << 30,
                 cache_prefetch: int = 4, **augment_args) -> None:
        if augment is not None and augment_args:
            raise ValueError("pass either augment=AugmentConfig(...) or augmentation keywords, not both")
        call = resolve_call(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                            batch_sampler=batch_sampler, collate_fn=collate_fn, drop_last=drop_last, train=train,
                            seed=seed, generator=generator, rank=rank, world_size=world_size,
                            is_location=isinstance(dataset, (Source, *LOCATION_TYPES)))
        self.contract = Contract(call.train, batch_size, call.drop_last, val_padding, call.sampler_drop_last,
                                 call.dali_drop)
        # DataLoader's attributes, as it sets them (timm, pytorch/examples and Lightning read them)
        self.batch_size, self.drop_last, self.num_workers = batch_size, call.drop_last, num_workers
        self.pin_memory, self.collate_fn, self.batch_sampler, self.timeout = pin_memory, default_collate, None, timeout
        self.prefetch_factor, self.persistent_workers, self.generator = prefetch_factor, persistent_workers, generator
        self.worker_init_fn, self.multiprocessing_context = worker_init_fn, multiprocessing_context
        self.train, self.seed, self.val_padding = call.train, call.seed, val_padding
        self.device = resolve_device(device)
        resolve_decode_device(self.device, decode_device)  # refuse device="cpu" with decode_device="gpu" now
        self._pin = pin_memory and self.device == "cpu" and torch.cuda.is_available()
        self.shard = Shard.from_env(call.rank, call.world_size, local_rank)
        if call.location is not None:
            self.source = call.location if isinstance(call.location, Source) else open_source(
                call.location, keys=keys, label_ext=label_ext, index_cache_dir=index_cache_dir, skip_bad=skip_bad)
        else:
            self.source = samples_source(call.root, call.samples, call.classes, skip_bad)
        self.dataset = call.dataset if call.dataset is not None else DatasetView(self.source)
        self._user_sampler = call.sampler
        self._sampler_epoch = getattr(call.sampler, "epoch", None)  # its set_epoch, seen at the next epoch
        self._requested_epoch: int | None = None
        self.sampler = call.sampler if call.sampler is not None else SamplerView(self)
        sizes = {"image_size": image_size} if image_size is not None else {}
        self.augment = augment or AugmentConfig(**{**call.augment_args, **sizes, **augment_args})
        if num_threads is None and num_workers > 0:
            num_threads = num_workers  # DataLoader's worker count seeds DALI's CPU threads
        self._pipeline_args = dict(train=self.train, batch_size=batch_size, device=self.device, shard=self.shard,
                                   augment=self.augment, num_threads=num_threads, seed=self.seed,
                                   shuffle_buffer=shuffle_buffer, prefetch_queue_depth=prefetch_queue_depth,
                                   max_pixels=max_pixels, decode_device=decode_device)
        self._check_one_batch()
        self.bad_policy = BadSamplePolicy(skip=skip_bad, max_bad=max_bad, device=self.device,
                                          device_id=cuda_device_id(self.shard) if self.device == "gpu" else None,
                                          max_pixels=max_pixels)
        self.source = self.bad_policy.take_damaged(self.source)  # found while opening (skip_bad)
        # DALI checkpoint after the last delivered batch: where a pipeline error recovers to. Taken
        # after every batch only when skip_bad may need it; else read when state_dict() asks.
        self._last_good: str | None = None
        self.epoch = 0          # epochs completed
        self._position = 0      # batches yielded in the current epoch
        self._resumed = False   # the current epoch was restored by load_state_dict: continue it
        self._failure: DatasetError | None = None  # once set, the loader refuses to go on
        self._iterator = None
        # s3:// sources: through a bounded local shard cache kept ahead of the reader, or DALI's s3:// (remote_feed.py)
        self._feed = RemoteFeed(remote_feed, train=self.train, batch_size=batch_size, shard=self.shard,
                                shuffle_buffer=shuffle_buffer, prefetch_queue_depth=prefetch_queue_depth,
                                cache_dir=cache_dir, cache_bytes=cache_bytes, cache_prefetch=cache_prefetch)
        self._feed_at: tuple[int, int] | None = None  # (epoch, batch) a load_state_dict build resumes at
        try:
            self._build()
        except BaseException:
            self.close()  # its pipeline and shard cache (threads, folder) now, not when the traceback goes
            raise

    def _check_one_batch(self) -> None:
        """Refuse, before DALI builds, a loader that would yield no batch."""
        n, world, b = self.source.num_samples, self.shard.world_size, self.batch_size
        if self.contract.dali_drop and n // world < b:
            raise ValueError(f"{self.source.location}: {n} samples over {world} ranks give less than one batch of "
                             f"{b} per rank in train mode (the tail is dropped); lower batch_size")
        if self.contract.drop_last and self.contract.per_rank(n, world) < b:
            raise ValueError(f"{self.source.location}: {n} samples over {world} ranks give less than one batch of "
                             f"{b} per rank with drop_last=True; lower batch_size")

    # -- construction -------------------------------------------------------------------------

    def _build(self, checkpoint: str | None = None) -> None:
        """(Re)build the pipeline and iterator, at `checkpoint` or at the start. The iterator runs
        the first batch while it is constructed, so a bad sample can surface here too."""
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
        # DROP (train, drop_last unset) stops every rank before the smallest shard runs out. FILL
        # pads every rank's stream to the same batch count with repeats; the contract cuts it (contract.py).
        policy = LastBatchPolicy.DROP if self.contract.dali_drop else LastBatchPolicy.FILL
        while True:
            self.close()
            source, pipeline_args = self._pipeline_inputs()
            epoch, position = self._feed_at or (self.epoch, self._position)
            if checkpoint is None:  # a fresh pipeline: DALI counts its epochs (shard rotation) from here
                self._dali_epoch0 = epoch
            fed = self._feed.dali_source(source, epoch=epoch, position=position, fresh=checkpoint is None,
                                         subset=source is not self.source)
            if fed is not source:
                self._record.bind(fed)  # DALI names samples by the cache's paths: same storage order
            pipe = build_pipeline(fed, checkpoint=checkpoint, sample_ids=True, **pipeline_args)
            try:
                self._iterator = DALIGenericIterator(pipe, ["images", "labels", "ids"],
                                                     reader_name=READER_NAME, last_batch_policy=policy,
                                                     auto_reset=True)
            except RuntimeError as error:
                _shutdown_quietly(pipe)  # the iterator never took it: free its threads before the next try
                self._exclude_culprits(error)  # raises, or excludes them: then build again
                continue
            finally:
                elastic.remove_subset_indexes(source, self.source)  # read by DALI's build: none left behind
            self._last_good = checkpoint or self._iterator.checkpoints()[0]  # where to recover to
            self._feed.built()
            self._feed_at = None
            return

    def _pipeline_inputs(self) -> tuple[Source, dict]:
        """What to build: the source over this world's shards or, in the remainder epoch of an
        elastic resume, this rank's slice of the rest read as one shard (elastic.py)."""
        if self._record is None:
            self._record = elastic.DeliveryRecord(self.num_samples)
        self._record.bind(self.source)
        plan = self._record.remainder
        if plan is None:
            return self.source, self._pipeline_args
        shard = Shard(0, 1, self.shard.local_rank)  # seed per rank: ranks must not draw the same crops
        return elastic.subset_source(self.source, plan.indices), {**self._pipeline_args, "shard": shard,
                                                                   "seed": plan.seed + self.shard.rank}

    def close(self) -> None:
        """Free the pipeline (its threads and memory) now rather than at garbage collection."""
        if self._iterator is not None:
            pipes = iterator_pipelines(self._iterator)
            self._iterator = None
            for pipe in pipes:
                shutdown_pipeline(pipe)
            del pipes
        if getattr(self, "_feed", None) is not None:
            self._feed.close()

    @property
    def skip_bad(self) -> bool:
        return self.bad_policy.skip

    @property
    def bad_samples(self) -> list[BadSample]:
        """Samples excluded so far (skip_bad=True), in order."""
        return self.bad_policy.bad_samples

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- the DataLoader surface ---------------------------------------------------------------

    def __len__(self) -> int:
        """Batches this rank yields this epoch, as DataLoader counts them for the same arguments; the
        same on every rank (val_padding="none" aside)."""
        return self._cut().batches

    @property
    def num_samples(self) -> int:
        """Samples in the whole dataset (all ranks)."""
        return self.source.num_samples

    def _cut(self) -> EpochCut:
        """This rank's epoch (contract.py): from DALI's reader as modelled there, or the remainder plan."""
        if self.contract.dali_drop:
            return self.contract.dali_cut(len(self._iterator))
        plan = self._record.remainder if self._record is not None else None
        if plan is not None:  # the remainder epoch of an elastic resume (elastic.py)
            return self.contract.cut(plan.real, len(plan.indices))
        reader = self.reader_model()
        real = reader.slice_size(reader.shard_of(self.epoch - self._dali_epoch0))
        return self.contract.cut(real, self.contract.per_rank(self.num_samples, self.shard.world_size))

    def reader_model(self) -> ReaderModel:
        """DALI's reader of this rank's pipeline (reader.py)."""
        args = self._pipeline_args
        return ReaderModel(self.num_samples, self.shard.rank, self.shard.world_size, self.train, self.batch_size,
                           args["shuffle_buffer"], args["prefetch_queue_depth"],
                           list_shuffled=self.train and self.source.format.SHUFFLES_LIST)

    @property
    def samples_per_epoch(self) -> int:
        """Real samples this rank yields per epoch (repeats and padding not counted)."""
        cut = self._cut()
        return min(cut.real, cut.count)

    def sampler_len(self) -> int:
        """len(loader.sampler): the samples this rank yields per epoch, repeats included."""
        cut = self._cut()
        return cut.count if self.contract.dali_drop or self.val_padding == "none" else cut.per_rank

    @property
    def next_batch(self) -> tuple[int, int]:
        """(epoch, batch index) of the next batch this loader yields."""
        if self._position >= len(self):  # after an epoch's last batch: the next epoch comes next
            return self.epoch + 1, 0
        return self.epoch, self._position

    def set_epoch(self, epoch: int) -> None:
        """DistributedSampler's set_epoch (a DistributedSampler passed in reaches here too). DALI
        reshuffles every epoch by itself; in train, an epoch ahead of the loader's own, set before that
        epoch starts, moves the loader there (a script that resumes its model at epoch E calls it)."""
        self._requested_epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Lazy: nothing happens until the first next(). Frameworks probe a loader with a throwaway
        # iter() (Lightning does); acting at iter() would finish a resumed epoch it never reads.
        if self._failure is not None:
            raise self._failure  # never continue silently after a pipeline error
        return self._epoch()

    def _epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._failure is not None:
            raise self._failure
        if self._position and not self._resumed:
            self._finish_epoch()  # an epoch abandoned midway: DALI can only start at a boundary
        self._follow_requested_epoch()
        self._resumed = False
        yield from self._batches()

    def _follow_requested_epoch(self) -> None:
        sampler = self._user_sampler
        requested, self._requested_epoch = self._requested_epoch, None
        if sampler is not None and getattr(sampler, "epoch", None) != self._sampler_epoch:
            requested = self._sampler_epoch = sampler.epoch
        if not self.train or requested is None or requested <= self.epoch or self._position or self._resumed \
                or self._record.remainder is not None:
            return  # DALI's epochs only go forward, from a boundary; val epochs differ in nothing
        self.epoch = requested
        self._build()  # a fresh pipeline: its shard rotation starts at this epoch

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        cut = self._cut()
        while self._position < cut.batches:
            batch = self._next_dali_batch()
            if batch is None:
                break  # DALI ended the epoch first: never, as contract.py models it
            images, labels = self._shape(batch, cut)
            self._position += 1
            if self._position == cut.batches:
                self._drain()  # DALI's batches past the contract's and its epoch end, before the last yield
            yield images, labels
        self._end_epoch()

    def _next_dali_batch(self) -> dict | None:
        """DALI's next batch, recovering from bad samples; None at the end of DALI's epoch."""
        while True:
            self._feed.advance(self.epoch, self._position)  # s3:// cache: the reader's reach is local
            try:
                (batch,) = next(self._iterator)  # one pipeline per rank -> one dict per step
            except StopIteration:
                return None
            except RuntimeError as error:  # a DALI pipeline error: the iterator is unusable now
                self._exclude_culprits(error)  # raises, or excludes them from the source
                self._build(checkpoint=self._last_good)  # and back to the last good batch
                continue
            self._last_good = self._iterator.checkpoints()[0] if self.skip_bad else None
            return batch

    def _drain(self) -> None:
        """Read DALI's epoch to its end: a state taken after the last batch then starts the next one."""
        while self._next_dali_batch() is not None:
            pass
        if self.skip_bad:
            self._last_good = self._iterator.checkpoints()[0]

    def _shape(self, batch: dict, cut: EpochCut) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `self._position` of the epoch as the contract cuts it; records what it delivers."""
        size, real = cut.size(self._position), cut.real_in(self._position)
        images, labels, ids = batch["images"], batch["labels"], batch["ids"]
        if size < len(labels):
            images, labels = images[:size], labels[:size]
        if cut.pad_label and real < size:
            labels = labels.clone()
            labels[real:] = PADDING_LABEL  # val_padding="label": masked by the loop
        self._record.add(ids, real)
        if self.augment.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory, NCHW shape: torch's channels_last
        if self._pin:
            images, labels = images.pin_memory(), labels.pin_memory()
        return images, labels

    def _end_epoch(self) -> None:
        self.epoch += 1
        self._position = 0
        if self._record.end_epoch():  # a resumed epoch's rest is done: this world's own pipeline now
            self._build()
        if self.skip_bad:  # the count is always shown, so a dataset that rots is noticed
            print(f"dali_pipes: rank {self.shard.rank}: {len(self.bad_samples)} bad samples excluded after epoch "
                  f"{self.epoch - 1}", file=sys.stderr, flush=True)
        release_free_memory()  # once an epoch: else fragmented heap pages pile up (procfs.py)

    def _finish_epoch(self) -> None:
        for _ in self._batches():
            pass

    # -- bad samples ---------------------------------------------------------------------------

    def _exclude_culprits(self, error: RuntimeError) -> None:
        """Hand a pipeline error to the bad-sample policy: it raises naming the culprits, or
        excludes them from the source (skip_bad). Once it raises, the loader refuses to go on."""
        try:
            self.source = self.bad_policy.handle_failure(error, self.source, self.reader_model(), self._position,
                                                         self.epoch - self._dali_epoch0)
        except DatasetError as failure:
            self._failure = failure
            raise

    # -- resumption ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this rank is: DALI's checkpoint (reader position, shuffle and augmentation RNG)
        plus the epoch and batch counters, and the bad samples excluded so far. Take it between batches."""
        epoch, position = self.next_batch
        dali = self._last_good or self._iterator.checkpoints()[0]  # DALI's state after the last delivered batch
        if epoch != self.epoch and self._record.remainder is not None:
            dali = None  # a resumed epoch's rest is done: the next epoch starts this world's own pipeline afresh
        return {"version": _STATE_VERSION, "epoch": epoch, "position": position, **self._identity(),
                "dali": dali, "dali_epoch0": self._dali_epoch0, "contract": dataclasses.asdict(self.contract),
                **self.bad_policy.state(),
                **self._record.state(epoch_done=epoch != self.epoch)}

    def _identity(self) -> dict:
        return {"rank": self.shard.rank, "world_size": self.shard.world_size, "batch_size": self.batch_size,
                "train": self.train, "num_samples": self.num_samples, "seed": self.seed}

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue exactly where `state` was taken: the next batches are those the original
        loader would have yielded, also across epoch boundaries.

        `state` may be the list of every old rank's state_dict(), in rank order. On the same world
        size each rank takes its own entry. On another (elastic resume), the new ranks together yield,
        for the rest of the interrupted epoch, exactly the samples the old ranks had not yielded
        (train: less a tail of fewer than world_size * batch_size), then run as built for this world."""
        if isinstance(state, (list, tuple)):
            world = self.shard.world_size
            if len(state) != world or any(s.get("world_size") != world for s in state):
                return self._load_elastic(list(state))
            state = state[self.shard.rank]
        differ = {k: (state.get(k), v) for k, v in self._identity().items() if state.get(k) != v}
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"loader state of version {state.get('version')} was written by another dali_pipes "
                             f"(this one reads version {_STATE_VERSION}); resume with the version that wrote it, "
                             f"or start the epoch afresh")
        contract = dataclasses.asdict(self.contract)
        if state.get("contract", contract) != contract:  # older states have none: their batches cut as today's
            differ["contract"] = (state["contract"], contract)
        if differ:
            raise ValueError(f"loader state does not fit this loader: (saved, now) = {differ}; resume with "
                             f"the same data, rank, world size, batch size, seed, drop_last and val_padding")
        self.source = self.bad_policy.restore(state, self.source)
        self._record.restore(state, self.num_samples)
        base = state.get("elastic_base")  # taken in an elastic resume's remainder epoch: the same slice again
        self._record.remainder = self._plan_remainder(elastic.unpack(base, self.num_samples), state["epoch"]) \
            if base else None
        self._feed_at = (state["epoch"], state["position"])  # the s3:// cache fetches from there
        # The position first: the iterator runs a batch while it is built, and a bad sample there is
        # searched for from this position (and this epoch's shard), not from the start.
        self.epoch, self._position = state["epoch"], state["position"]
        self._resumed = self._position > 0
        self._dali_epoch0 = state.get("dali_epoch0", 0)
        self._build(checkpoint=state["dali"])

    def _load_elastic(self, states: list[dict]) -> None:
        """Resume the old ranks' interrupted epoch on this world size (elastic.py): this rank's
        share of what they had not delivered, then this world's own pipeline from the next epoch."""
        epoch = elastic.check_states(states, {"version": _STATE_VERSION, **self._identity()})
        bad = {str(b): b for s in states for b in s.get("bad_samples", [])}  # every old rank's, once
        excluded = {str(refs): refs for s in states for refs in s.get("excluded", [])}
        self.source = self.bad_policy.restore({"bad_samples": list(bad.values()), "excluded": list(excluded.values())},
                                              self.source)
        base = elastic.delivered_union(states, self.num_samples)
        self._record.end_epoch()
        plan = self._plan_remainder(base, epoch) if base.any() else None
        if plan is not None:
            self._record.delivered, self._record.remainder = base.copy(), plan
        self.epoch = epoch + 1 if base.any() and plan is None else epoch  # no batch left: that epoch is done
        self._position, self._resumed = 0, False
        self._build()

    def _plan_remainder(self, base, epoch: int) -> elastic.Remainder | None:
        return elastic.plan_remainder(base, epoch=epoch, rank=self.shard.rank, world_size=self.shard.world_size,
                                      batch_size=self.batch_size, train=self.train, seed=self.seed)
