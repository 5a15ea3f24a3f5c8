"""This rank's pipeline over a loader's life (RankPipeline): what it reads, an elastic resume's remainder,
its run of DALI pipelines (run.py) and their rebuilds. Everything else that acts around batches is a hook
(hooks.py); `rank_pipeline` assembles the hooks a loader asks for."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dali_pipes.data.reader import ReaderModel
from dali_pipes.data.source import Source
from dali_pipes.errors import DatasetError
from dali_pipes.run import elastic, lifetime, tuning
from dali_pipes.run.contract import EpochCut
from dali_pipes.run.dali_checkpoint import sealed
from dali_pipes.run.delivery import DeliveryRecord, pack
from dali_pipes.run.hooks import BatchHook, BatchTiming, EpochOrder, acts_after_batch
from dali_pipes.run.outage import StoreOutage, network_fault
from dali_pipes.run.pipeline import PipelineSpec, cuda_device_id, source_reader
from dali_pipes.run.pipeline_run import PipelineRun
from dali_pipes.run.position import Position
from dali_pipes.run.recovery import BadSamplePolicy
from dali_pipes.run.remote_feed import RemoteFeed
from dali_pipes.run.schedule import SizeSchedule
from dali_pipes.run.sharding import ShardingCheck, check_listings
from dali_pipes.run.stages import SourceReading, Wanted
from dali_pipes.run.stats import LoaderClock
from dali_pipes.storage.remote import ClientOptions


def weak_method(method: Callable) -> Callable:
    """`method` of an object, called through a weak reference to the object. An object's own callbacks held
    by something it owns would make a reference cycle: the loader would then be freed only by Python's cycle
    collector, which runs by object counts, not memory, so dropped loaders' DALI pipelines (threads, buffers)
    would pile up between collections. With weak callbacks the last reference frees everything at once."""
    ref = weakref.WeakMethod(method)
    return lambda *args: ref()(*args)  # type: ignore[misc]


class RankPipeline:
    """This rank's data (bad samples excluded as met), elastic remainder, pipelines; `position`: the loader's."""

    def __init__(self, source: Source, spec: PipelineSpec, position: Position, policy: BadSamplePolicy,
                 feed: RemoteFeed, hooks: list[BatchHook], *, clock: LoaderClock, outage: StoreOutage,
                 order: EpochOrder | None = None):
        self.source, self.spec, self.position, self.policy, self.feed = source, spec, position, policy, feed
        self.hooks, self.clock, self.outage = hooks, clock, outage
        self.order = order  # a hook that draws what each epoch reads (a sampler's, sampled.py), if any
        self._listeners = [hook for hook in hooks if acts_after_batch(hook)]  # a batch runs only these (begin_epoch)
        self.record = DeliveryRecord(source.num_samples)
        self.remainder: elastic.Remainder | None = None
        self.failure: DatasetError | None = None  # once set, the loader refuses to go on
        self.built: PipelineSpec | None = None  # the spec of the pipeline running now
        self.first_epoch, self._pending = 0, False  # the loader epoch DALI's slices rotate from; a rebuild due
        self.run = PipelineRun(weak_method(self._inputs), weak_method(self._cleanup), weak_method(self._recover),
                               drop=spec.contract.dali_drop, keep_checkpoints=policy.skip or source.remote is not None,
                               feed=order.feed if order is not None else None, options=feed.options)

    @property
    def pipeline_epoch(self) -> int:  # the loader's epoch as the current pipeline counts it (ReaderModel.shard_of)
        return self.position.epoch - self.first_epoch

    def build(self, checkpoint: bytes | None = None, written_by: str = "this loader") -> None:
        self._pending = False
        self.run.build(checkpoint, written_by)
        self.feed.built()

    def rebuild(self, spec: PipelineSpec, *, now: bool = False) -> None:
        """Go on with `spec` from the last delivered batch (DALI's checkpoint), now or before the next batch."""
        self.spec, self._pending = spec, not now
        if not now:
            return
        started, knobs = time.perf_counter(), spec.knobs
        copies_done(self.spec)
        self.build(self.run.checkpoint())
        self.clock.event("rebuild", started, time.perf_counter(),
                         settings=f"num_threads={knobs.num_threads} prefetch_queue_depth={knobs.prefetch_queue_depth}")

    def reader(self) -> ReaderModel:
        return source_reader(self.spec, self.source)

    def cut(self) -> EpochCut:
        """This rank's current epoch as the loader's contract (the spec carries it) cuts it (or the drawn order:
        EpochOrder.cut)."""
        if self.order is not None:
            return self.order.cut(self.position.epoch)
        return self.spec.contract.epoch_cut(self.reader(), self.pipeline_epoch, self.remainder, len(self.run),
                                            self.source.num_samples)

    def begin_epoch(self, batches: int) -> None:
        for hook in self.hooks:
            hook.begin_epoch(self, batches)
        self._listeners = [hook for hook in self.hooks if acts_after_batch(hook)]  # the tuner leaves once it chose

    def next(self, wanted: Wanted) -> dict | None:
        """The wanted batch, heard by the hooks that act after one; None at DALI's end. After the epoch's last
        batch DALI's batches past the contract's are read once the loop is back (settle), not before the step."""
        asked = time.perf_counter()
        if self._pending:
            self.rebuild(self.spec, now=True)
        batch = self.run.next(self._advance)
        if batch is not None:
            timing = BatchTiming(asked, time.perf_counter(), wanted.images)
            for hook in self._listeners:
                hook.after_batch(self, timing)
            if wanted.last:
                self.run.drain_later()
        return batch

    def settle(self) -> None:
        self.run.settle(self._advance)

    def end_epoch(self) -> bool:
        """The hooks hear the epoch end, the record starts afresh; True after an elastic resume's remainder."""
        for hook in self.hooks:
            hook.end_epoch(self)
        self.record.end_epoch()
        ended, self.remainder = self.remainder is not None, None
        return ended

    def _inputs(self, fresh: bool) -> tuple[Source, PipelineSpec]:
        """This world's slices or an elastic resume's remainder (elastic.py); s3:// data through the feed."""
        self.record.bind(self.source)
        spec = self.built = self.spec.at_epoch(self.position.epoch)  # this epoch's image size
        source, remainder = self.source, self.remainder
        if remainder is not None:
            source, spec = remainder.inputs(self.source, spec)
        if fresh:  # DALI counts a fresh pipeline's epochs (slice rotation) from here
            self.first_epoch = self.position.epoch
        fed = self.feed.dali_source(source, epoch=self.position.epoch, position=self.position.batch, fresh=fresh,
                                    subset=remainder is not None)
        if fed is not source:
            self.record.bind(fed)  # DALI names samples by the cache's paths: same storage order
        return fed, spec

    def _cleanup(self) -> None:
        if self.remainder is not None:
            self.remainder.cleanup(self.source)

    def _recover(self, error: Exception) -> None:
        """A network fault waits for the store (outage.py), never a culprit search; else the bad-sample policy."""
        self.feed.check_cache()  # its folder deleted: DALI fails on a shard it cannot open, no sample is bad
        if network_fault(error, self.source) or not isinstance(error, RuntimeError):  # wait raises the latter
            return self.outage.wait(error, self.source)
        try:
            self.source = self.policy.handle_failure(error, self.source, self.order or self.reader(),
                                                     self.position.batch, self.pipeline_epoch)
        except DatasetError as failure:
            self.failure = failure
            raise

    def _advance(self) -> None:  # s3:// through the cache: the reader's reach is local before each batch
        if self.feed.cache is not None:  # local data: nothing to keep local
            self.feed.advance(self.position.epoch, self.position.batch)

    def close(self) -> None:
        self.run.close()
        self.feed.close()


class RankBatches:
    """The rank's pipeline as the first batch source of the loader's batch path (stages.BatchSource), and all
    the val cache sees of it (val_cache.CachedSource)."""

    def __init__(self, rank: RankPipeline) -> None:
        self.rank = rank

    def next(self, wanted: Wanted) -> dict | None:
        return self.rank.next(wanted)

    def checkpoint(self) -> bytes:
        return self.rank.run.checkpoint()

    def given(self, checkpoint: bytes, timing: BatchTiming) -> None:
        self.rank.run.skipped_to(checkpoint)
        self.rank.clock.after_batch(self.rank, timing)

    def read_again(self, checkpoint: bytes) -> None:
        self.rank.run.skipped_to(checkpoint)
        self.rank.rebuild(self.rank.spec, now=True)

    def reading(self) -> SourceReading:
        rank = self.rank
        return SourceReading(rank.remainder is None, rank.source, len(rank.policy.bad_samples))

    def epoch_files(self) -> list[str]:
        source, reader = self.rank.source, self.rank.reader()
        counts = source.counts or [1] * len(source.files)
        return [source.files[i] for i, _ in reader.files_of(counts, reader.shard_of(0))]


def rank_state(rank: RankPipeline, epoch_done: bool) -> dict:
    """The rank's parts of the loader state, each from its owner: DALI's checkpoint and each named hook's part
    ("pipeline"), the bad-sample policy's, the delivery record's."""
    base = rank.remainder.base if rank.remainder is not None and not epoch_done else None
    dali = None if epoch_done and rank.remainder is not None else rank.run.checkpoint()  # None: afresh
    return {"pipeline": {**sealed(dali), "dali_epoch0": rank.first_epoch,
                         **{hook.name: hook.state() for hook in rank.hooks if hook.name}},
            "bad_samples": rank.policy.state(),
            "record": {**rank.record.state(epoch_done), "elastic_base": None if base is None else pack(base)}}


def restore_rank(rank: RankPipeline, parts: dict, remainder: elastic.Remainder | None) -> None:
    """Each owner takes back its own part of a state (resume.upgrade's layout): the bad-sample policy, the
    record, each named hook its key of "pipeline"; `remainder`: an elastic resume's rest of an epoch."""
    rank.source = rank.policy.restore(parts["bad_samples"], rank.source)
    rank.record.restore(parts["record"], rank.source.num_samples)
    pipeline = parts["pipeline"]
    rank.remainder, rank.first_epoch = remainder, pipeline.get("dali_epoch0", 0)
    for hook in rank.hooks:
        hook.restore(rank, pipeline.get(hook.name) if hook.name else None)


def merged_parts(rank: RankPipeline, parts: list[dict], delivered: np.ndarray | None) -> dict:
    """The rank's parts of an elastic resume, from every old rank's (rank order), each owner merging its own:
    the bad-sample policy, each named hook; the record starts at what the old ranks `delivered` together (None:
    nothing of their epoch is left)."""
    pipelines = [part["pipeline"] for part in parts]
    return {"pipeline": {hook.name: hook.merge([p.get(hook.name) for p in pipelines]) for hook in rank.hooks
                         if hook.name},
            "bad_samples": rank.policy.merge([part["bad_samples"] for part in parts]),
            "record": {"delivered": None if delivered is None else pack(delivered), "delivered_complete": True}}


def copies_done(spec: PipelineSpec) -> None:
    """On the GPU, before a pipeline is replaced: the last batch's copy out of DALI's buffers is done."""
    if spec.device == "gpu":
        import torch
        torch.cuda.current_stream().synchronize()


@dataclass(frozen=True)
class FeedOptions:
    """How a remote source reaches DALI's reader (remote_feed.py), and the loader's retries and timeouts."""
    mode: str = "cache"
    cache_dir: str | None = None
    cache_bytes: int = 0
    cache_prefetch: int = 0
    store: ClientOptions | None = None  # None: the process's default (remote.configure)


def rank_pipeline(source: Source, spec: PipelineSpec, position: Position, policy: BadSamplePolicy, *,
                  feed: FeedOptions, sharding_check: bool, started: float | None = None,
                  order: EpochOrder | None = None) -> RankPipeline:
    """The rank's pipeline with its hooks, in the order they run: the clock (the tuner judges its figures),
    online tuning of the knobs left "auto" (spec.tuned), the image-size schedule, the sharding check, the outage
    handler; with an `order` (a hook that draws what each epoch reads: a sampler's, sampled.py), it first, and no
    sharding check (the sampler decides what each rank reads). s3:// data read through the shard cache is not
    tuned online: a rebuild would replay the epoch's shards into a new cache (the remembered or default values
    run). Damage found while opening (skip_bad) is excluded first. `started`: when the loader's construction
    began (perf_counter), for stats' first_batch_s."""
    if sharding_check:
        check_listings(source, spec.shard)  # before anything is built: ranks that listed different data
    clock, outage = LoaderClock(started), StoreOutage(feed.store)
    if spec.device == "gpu" and policy.device_id is None:  # the bad-sample search decodes on the rank's own GPU
        policy.device_id = spec.device_id if spec.device_id is not None else cuda_device_id(spec.shard)
    through_cache = source.remote is not None and feed.mode == "cache"
    spec, tuner = tuning.plan(spec, source.kind, clock, online=not through_cache)
    # The feed keeps the reader's reach local: with the depth searched online, the deepest it may be
    deepest = spec.with_knobs(prefetch_queue_depth=max(tuning.DEPTHS)) if tuner and "prefetch_queue_depth" in (
        spec.tuned) else spec
    remote = RemoteFeed(feed.mode, deepest, cache_dir=feed.cache_dir, cache_bytes=feed.cache_bytes,
                        cache_prefetch=feed.cache_prefetch, options=feed.store)
    contract = spec.contract  # the loader's own (its epoch cut, its batch size)
    every_sample = not (contract.drop_last or contract.sampler_drop_last)  # val promises full cover
    drawn = [order] if order is not None else []
    hooks: list[BatchHook] = [*drawn, clock, *([tuner] if tuner else []), SizeSchedule(),
                              ShardingCheck(sharding_check and not drawn, every_sample=every_sample), outage]
    rank = RankPipeline(policy.take_damaged(source), spec, position, policy, remote, hooks, clock=clock, outage=outage,
                        order=order)
    lifetime.close_at_exit(rank)  # closed while modules are whole (a loader kept in a global lives till exit)
    return rank
