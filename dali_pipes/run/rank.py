"""This rank's pipeline over a loader's life (RankPipeline): what it reads, an elastic resume's remainder,
its run of DALI pipelines (run.py) and their rebuilds. Everything else that acts around batches is a hook
(hooks.py); `rank_pipeline` assembles the hooks a loader asks for."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Callable

from dali_pipes.data.reader import ReaderModel
from dali_pipes.data.source import Source
from dali_pipes.errors import DatasetError
from dali_pipes.run import elastic, lifetime, tuning
from dali_pipes.run.contract import Contract
from dali_pipes.run.dali_checkpoint import sealed
from dali_pipes.run.delivery import DeliveryRecord, pack
from dali_pipes.run.hooks import BatchHook, BatchTiming
from dali_pipes.run.outage import StoreOutage, network_fault
from dali_pipes.run.pipeline import PipelineSpec, cuda_device_id, source_reader
from dali_pipes.run.pipeline_run import PipelineRun
from dali_pipes.run.position import Position
from dali_pipes.run.recovery import BadSamplePolicy
from dali_pipes.run.remote_feed import RemoteFeed
from dali_pipes.run.sampled import SampledEpochs, SamplerRead
from dali_pipes.run.schedule import SizeSchedule
from dali_pipes.run.sharding import ShardingCheck, check_listings
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
                 feed: RemoteFeed, hooks: list[BatchHook], *, drop: bool, clock: LoaderClock, outage: StoreOutage):
        self.source, self.spec, self.position, self.policy, self.feed = source, spec, position, policy, feed
        self.hooks, self.clock, self.outage = hooks, clock, outage
        self.sampled = next((h for h in hooks if isinstance(h, SampledEpochs)), None)  # a sampler's epochs, if drawn
        self.record = DeliveryRecord(source.num_samples)
        self.remainder: elastic.Remainder | None = None
        self.failure: DatasetError | None = None  # once set, the loader refuses to go on
        self.built: PipelineSpec | None = None  # the spec of the pipeline running now
        self.first_epoch, self._pending = 0, False  # the loader epoch DALI's slices rotate from; a rebuild due
        self.run = PipelineRun(weak_method(self._inputs), weak_method(self._cleanup), weak_method(self._recover),
                               drop=drop, keep_checkpoints=policy.skip or source.remote is not None,  # for rebuilds
                               feed=self.sampled.feed if self.sampled is not None else None, options=feed.options)

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

    def begin_epoch(self, batches: int) -> None:
        for hook in self.hooks:
            hook.begin_epoch(self, batches)

    def next(self, images: int | None = None) -> dict | None:
        """The next batch (`images`: what the loader yields of it), heard by every hook; None at DALI's end."""
        asked = time.perf_counter()
        if self._pending:
            self.rebuild(self.spec, now=True)
        batch = self.run.next(self._advance)
        if batch is not None:
            timing = BatchTiming(asked, time.perf_counter(), len(batch["labels"]) if images is None else images)
            for hook in self.hooks:
                hook.after_batch(self, timing)
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

    def state(self, epoch_done: bool) -> dict:
        """Its parts of the loader state, each from its owner (resume.py lays them out)."""
        base = self.remainder.base if self.remainder is not None and not epoch_done else None
        dali = None if epoch_done and self.remainder is not None else self.run.checkpoint()  # None: afresh
        return {"pipeline": {**sealed(dali), "dali_epoch0": self.first_epoch,
                             **{hook.name: hook.state() for hook in self.hooks if hook.name}},
                "bad_samples": self.policy.state(),
                "record": {**self.record.state(epoch_done), "elastic_base": None if base is None else pack(base)}}

    def restore(self, state: dict, remainder: elastic.Remainder | None) -> None:
        self.source = self.policy.restore(state, self.source)
        self.record.restore(state, self.source.num_samples)
        self.remainder, self.first_epoch = remainder, state.get("dali_epoch0", 0)
        for hook in self.hooks:
            hook.restore(self, state.get(hook.name) if hook.name else None)

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
            self.source = self.policy.handle_failure(error, self.source, self.sampled or self.reader(),
                                                     self.position.batch, self.pipeline_epoch)
        except DatasetError as failure:
            self.failure = failure
            raise

    def _advance(self) -> None:  # s3:// through the cache: the reader's reach is local before each batch
        self.feed.advance(self.position.epoch, self.position.batch)

    def close(self) -> None:
        self.run.close()
        self.feed.close()


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
                  contract: Contract, feed: FeedOptions, sharding_check: bool, started: float | None = None,
                  sampler: SamplerRead | None = None) -> RankPipeline:
    """The rank's pipeline with its hooks, in the order they run: the clock (the tuner judges its figures),
    online tuning of the knobs left "auto" (spec.tuned), the image-size schedule, the sharding check, the outage
    handler; with a `sampler` read by drawing it, its epochs (sampled.py) first, and no sharding check (the sampler
    decides what each rank reads). s3:// data read through the shard cache is not tuned online: a rebuild
    would replay the epoch's shards into a new cache (the remembered or default values run). Damage found
    while opening (skip_bad) is excluded first. `started`: when the loader's construction began
    (perf_counter), for stats' first_batch_s."""
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
    every_sample = not (contract.drop_last or contract.sampler_drop_last)  # val promises full cover
    drawn = [SampledEpochs(sampler, source, contract, position)] if sampler is not None else []
    hooks: list[BatchHook] = [*drawn, clock, *([tuner] if tuner else []), SizeSchedule(),
                              ShardingCheck(sharding_check and not drawn, every_sample=every_sample), outage]
    rank = RankPipeline(policy.take_damaged(source), spec, position, policy, remote, hooks, drop=contract.dali_drop,
                        clock=clock, outage=outage)
    lifetime.close_at_exit(rank)  # closed while modules are whole (a loader kept in a global lives till exit)
    return rank
