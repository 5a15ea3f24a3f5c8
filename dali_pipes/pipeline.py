"""Wire one Source to one graph for one rank as a DALI pipeline, and run it (PipelineRun)."""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import TYPE_CHECKING, Callable

import numpy as np

from dali_pipes import elastic, sharding, tuning
from dali_pipes._dali import iterator_pipelines, shutdown_pipeline
from dali_pipes.contract import Contract, Position
from dali_pipes.dali_checkpoint import restored_pipeline
from dali_pipes.dist import Shard, default_threads, usable_cpus
from dali_pipes.errors import DatasetError
from dali_pipes.graph import AugmentConfig, decode_only, eval_augment, resolve_decode_device, train_augment
from dali_pipes.reader import READER_NAME, ReaderModel
from dali_pipes.recovery import BadSamplePolicy, StoreOutage, network_fault
from dali_pipes.remote_feed import RemoteFeed
from dali_pipes.source import Source
from dali_pipes.stats import LoaderClock

if TYPE_CHECKING:
    from nvidia.dali import Pipeline

__all__ = ["READER_NAME", "PipelineRun", "RankPipeline", "build_pipeline", "cuda_device_id", "default_threads", "rank_seed",
           "usable_cpus"]


def rank_seed(seed: int, rank: int) -> int:
    """A distinct, reproducible DALI seed per (seed, rank): ranks must not draw the same crops."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0] & 0x7FFFFFFF)


def build_pipeline(source: Source, *, train: bool, batch_size: int, device: str = "cpu",
                   shard: Shard = Shard(), augment: AugmentConfig = AugmentConfig(), num_threads: int | None = None,
                   seed: int = 0, shuffle_buffer: int = 4096, prefetch_queue_depth: int = 2,
                   checkpoint: str | None = None, enable_checkpointing: bool = True,
                   decode_device: str | None = None, device_id: int | None = None, sample_ids: bool = False,
                   max_pixels: int | None = None, stage: str = "augment", shuffle: bool | None = None) -> Pipeline:
    """An unbuilt DALI pipeline yielding (images, labels) for one rank.

    Train: the reader shuffles through a buffer of `shuffle_buffer` samples and moves to the
    next shard each epoch (stick_to_shard=False), so ranks see other data every epoch. Val: no
    shuffle, each rank keeps its shard. `shuffle` (None: `train`) sets the reader apart from the
    graph: False reads the train graph in val's order (DataLoader's shuffle=False). Both pad the last
    batch (pad_last_batch=True) so that every rank runs the same number of batches; DaliLoader drops
    or masks the padding.

    device="gpu": images and labels come out on the GPU (`device_id`, default `cuda_device_id(shard)`);
    labels too, as DALI's own examples return them: a CPU output of a GPU pipeline arrives in
    pageable host memory and its copy to the GPU would sync. `decode_device` (None: `device`) "cpu"
    with device="gpu" decodes on the CPU threads and augments on the GPU (graph.py). `max_pixels`: a
    batch with an image whose header claims more pixels fails before decoding (reader.guard_pixels).
    `stage` "read" (encoded bytes) or "decode" (whole images, graph.decode_only) stops the graph early:
    `dali-pipes profile` times each stage alone."""
    from nvidia.dali import pipeline_def
    resolve_decode_device(device, decode_device)  # refuse a bad combination before DALI sees it
    shuffle = train if shuffle is None else shuffle
    if device == "gpu" and device_id is None:
        device_id = cuda_device_id(shard)

    @pipeline_def(batch_size=batch_size, num_threads=num_threads or default_threads(shard),
                  device_id=device_id if device == "gpu" else None, seed=rank_seed(seed, shard.rank),
                  prefetch_queue_depth=prefetch_queue_depth, enable_checkpointing=enable_checkpointing,
                  # auto_aug's policies and png16="pil"'s per-sample decode (graph.decode_rgb) are `if`s on samples
                  enable_conditionals=train and augment.auto_augment is not None or augment.png16 == "pil")
    def graph():
        jpegs, labels = source.dali_reader(
            name=READER_NAME, shard_id=shard.rank, num_shards=shard.world_size, random_shuffle=shuffle,
            initial_fill=shuffle_buffer, pad_last_batch=True, stick_to_shard=not shuffle, max_pixels=max_pixels)
        # After a decode error the loader finds the culprit from the reader's position (recovery.py);
        # sample_ids=True adds each sample's identity (elastic.py: what an elastic resume must skip).
        if stage == "read":
            return jpegs, labels
        augment_images = {"augment": train_augment if train else eval_augment, "decode": decode_only}[stage]
        images = augment_images(jpegs, augment, device, decode_device)
        if sample_ids:
            from dali_pipes.elastic import sample_ids as identity_rows
            return images, labels.gpu() if device == "gpu" else labels, identity_rows(jpegs)
        return images, labels.gpu() if device == "gpu" else labels

    return graph(checkpoint=checkpoint) if checkpoint else graph()


def cuda_device_id(shard: Shard) -> int:
    """The CUDA device a rank's pipeline runs on.

    Once torch has initialised CUDA (train.py calls torch.cuda.set_device first), torch's current
    device: right whether a rank sees every GPU of the node or, as under some schedulers
    (CUDA_VISIBLE_DEVICES per rank), only its own, where `local_rank` would name a device it cannot
    see. Before that: `local_rank` when that device is visible, device 0 when the rank sees exactly
    one GPU, else an error naming the fix. Without CUDA (a pipeline only defined, as the static
    graph checks do) `local_rank`."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0 or shard.local_rank < visible:
        return shard.local_rank
    if visible == 1:
        return 0
    raise ValueError(f"local rank {shard.local_rank} but this process sees {visible} GPUs (devices 0-{visible - 1}); "
                     f"call torch.cuda.set_device(...) for this rank before building the loader")


class PipelineRun:
    """One rank's DALI pipeline and its iterator, over a run of rebuilds: build it fresh or at a DALI
    checkpoint, give its batches, keep the last good checkpoint to recover to, shut it down.

    `inputs(fresh)` gives what to build, (source, pipeline keywords), each time (the source may have
    changed: bad samples excluded, a remote feed's cache paths); `cleanup()` runs after each attempt.
    `recover(error)` hears every pipeline error: it raises, or excludes the culprits, after which the
    pipeline is built again at the last good checkpoint. The iterator runs the first batch while it is
    built, so a bad sample can surface there too."""

    def __init__(self, inputs: Callable[[bool], tuple[Source, dict]], cleanup: Callable[[], None],
                 recover: Callable[[RuntimeError], None], *, drop: bool, keep_checkpoints: bool) -> None:
        self._inputs, self._cleanup, self._recover = inputs, cleanup, recover
        self.drop, self.keep_checkpoints = drop, keep_checkpoints  # DROP: DALI's full batches only
        self.iterator = None
        self.last_good: str | None = None  # DALI checkpoint after the last delivered batch

    def build(self, checkpoint: str | None = None, written_by: str = "this loader") -> None:
        """Build fresh, or at `checkpoint` (taken by `written_by`: a saved state's may come from an older
        graph, which dali_checkpoint.py carries over, or refuses with CheckpointError: never a data error)."""
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
        policy = LastBatchPolicy.DROP if self.drop else LastBatchPolicy.FILL
        while True:
            self.close()
            source, args = self._inputs(checkpoint is None)
            define = lambda at: build_pipeline(source, checkpoint=at, sample_ids=True, **args)  # noqa: E731
            pipe = None
            try:
                pipe = restored_pipeline(define, checkpoint, written_by) if checkpoint else define(None)
                self.iterator = DALIGenericIterator(pipe, ["images", "labels", "ids"], reader_name=READER_NAME,
                                                    last_batch_policy=policy, auto_reset=True)
            except RuntimeError as error:
                if pipe is not None:
                    shutdown_quietly(pipe)  # the iterator never took it: free its threads before the next try
                self._recover(error)  # raises, or excludes the culprits: then build again
                continue
            finally:
                self._cleanup()
            self.last_good = checkpoint or self.iterator.checkpoints()[0]
            return

    def next(self, before: Callable[[], None]) -> dict | None:
        """The next batch (`before()` first), recovering from bad samples; None at DALI's epoch end."""
        while True:
            before()
            try:
                (batch,) = next(self.iterator)  # one pipeline per rank -> one dict per step
            except StopIteration:
                return None
            except RuntimeError as error:  # a DALI pipeline error: the iterator is unusable now
                self._recover(error)
                self.build(checkpoint=self.last_good)  # and back to the last good batch
                continue
            # Taken after every batch only when a recovery may need it; else read by checkpoint().
            self.last_good = self.iterator.checkpoints()[0] if self.keep_checkpoints else None
            return batch

    def drain(self, before: Callable[[], None]) -> None:
        """Read DALI's epoch to its end: a checkpoint taken then starts the next epoch cleanly."""
        while self.next(before) is not None:
            pass
        if self.keep_checkpoints:
            self.last_good = self.iterator.checkpoints()[0]

    def checkpoint(self) -> str:
        """DALI's state after the last delivered batch (reader position, every random generator)."""
        return self.last_good or self.iterator.checkpoints()[0]

    def __len__(self) -> int:
        return len(self.iterator)

    def close(self) -> None:
        """Free the pipeline (its threads and memory) now rather than at garbage collection."""
        if self.iterator is not None:
            pipes = iterator_pipelines(self.iterator)
            self.iterator = None
            for pipe in pipes:
                shutdown_pipeline(pipe)
            del pipes


def shutdown_quietly(pipe) -> None:
    try:
        shutdown_pipeline(pipe)
    except Exception:  # a pipeline that failed to build may hold nothing to free
        pass


def weak_method(method: Callable) -> Callable:
    """`method` of an object, called through a weak reference to the object. An object's own callbacks held
    by something it owns would make a reference cycle: the loader would then be freed only by Python's cycle
    collector, which runs by object counts, not memory, so dropped loaders' DALI pipelines (threads, buffers)
    would pile up between collections. With weak callbacks the last reference frees everything at once."""
    ref = weakref.WeakMethod(method)
    return lambda *args: ref()(*args)


class RankPipeline:
    """This rank's pipeline over a loader's life: what it reads (the source, bad samples excluded; an
    elastic resume's remainder epoch; s3:// data through the remote feed), its run (PipelineRun), the
    samples it delivered this epoch (elastic.DeliveryRecord), and the bad-sample policy that its errors
    go to. `position` is the loader's, shared: a fresh build starts DALI's epoch count there."""

    def __init__(self, source: Source, args: dict, position: Position, policy: BadSamplePolicy, feed: RemoteFeed,
                 *, drop: bool, sharding_check: bool = True, every_sample: bool = True) -> None:
        self.source, self.position, self.policy, self.feed = source, position, policy, feed
        self.args, self.tuner, self.tuning_key = tuning.plan(args, source.kind, args["shard"].rank,
                                                             args["shard"].local_rank)
        self.record = elastic.DeliveryRecord(source.num_samples)
        self.failure: DatasetError | None = None  # once set, the loader refuses to go on
        self.epoch_end_due = False  # end_epoch_later
        self.every_sample = every_sample  # val delivers every sample (no drop_last): the sharding check may say so
        self.clock = LoaderClock()
        if self.tuner is not None:  # its trials on the loader's clock (a trace shows them); the clock, not self:
            clock = self.clock  # a callback holding self would close a reference cycle (weak_method says why)
            self.tuner.on_trial = lambda t: clock.event("tuning trial", t.started, time.perf_counter(),
                                                        settings=str(t.settings), result=t.describe())
        self.retune: tuning.Settings | None = None  # settings to rebuild with before the next batch
        self.whole_epoch = False  # this epoch runs from its start on this world's pipeline (sharding check)
        self.sharding_check = sharding_check
        self.outage = StoreOutage()
        # The last good batch is kept when an error may need a rebuild there: bad samples, network faults.
        self.run = PipelineRun(weak_method(self._inputs), weak_method(self._cleanup), weak_method(self._recover), drop=drop,
                               keep_checkpoints=policy.skip or source.remote is not None)
        self.built_augment: AugmentConfig | None = None  # the graph settings of the pipeline built last

    @classmethod
    def create(cls, source: Source, args: dict, position: Position, policy: BadSamplePolicy, *, contract: Contract,
               remote_feed: str, cache_dir: str | None, cache_bytes: int, cache_prefetch: int,
               sharding_check: bool = True) -> "RankPipeline":
        """With s3:// data fed through a bounded local shard cache kept ahead of the reader, or DALI's
        own s3:// reads (remote_feed.py); damage found while opening (skip_bad) excluded first. Under
        `contract` (contract.py): DALI's DROP policy or not; whether val delivers every sample."""
        if source.remote is not None and remote_feed == "cache":
            # Not tuned online: a rebuild would replay the epoch's shards into a new cache (and its bound is
            # sized to the reader's reach, which the depth sets). The remembered or default values run.
            args = {**args, "tune": False}
            if args["prefetch_queue_depth"] == tuning.AUTO:
                args["prefetch_queue_depth"] = 2
        reader_train = args.get("shuffle", args["train"])  # the reader's mode (shuffled, rotating): ReaderModel's
        feed = RemoteFeed(remote_feed, train=reader_train, batch_size=args["batch_size"], shard=args["shard"],
                          shuffle_buffer=args["shuffle_buffer"], prefetch_queue_depth=max(tuning.DEPTHS)
                          if args["prefetch_queue_depth"] == tuning.AUTO else args["prefetch_queue_depth"],
                          cache_dir=cache_dir, cache_bytes=cache_bytes, cache_prefetch=cache_prefetch)
        return cls(policy.take_damaged(source), args, position, policy, feed, drop=contract.dali_drop,
                   sharding_check=sharding_check, every_sample=not (contract.drop_last or contract.sampler_drop_last))

    def build(self, checkpoint: str | None = None, written_by: str = "this loader") -> None:
        self.epoch_end_due = False
        self.run.build(checkpoint, written_by)
        self.feed.built()

    def epoch_augment(self) -> AugmentConfig:
        """The graph settings of the loader's epoch: its image size from the schedule (resolution.py)."""
        return self.args["augment"].for_epoch(self.position.epoch, self.args["train"])

    def follow_schedule(self) -> None:
        """At an epoch boundary where the image size changes, the pipeline goes on from DALI's checkpoint
        (taken after the last epoch was drained) with the new size: its reader order, shard rotation and
        random generators continue as if one pipeline had changed size. A fresh pipeline would not: it
        would start the rotation and the generators again, repeating epoch 0's order and crops."""
        if self.built_augment is not None and self.epoch_augment() != self.built_augment:
            self.build(checkpoint=self.run.checkpoint())

    def _inputs(self, fresh: bool) -> tuple[Source, dict]:
        """This world's shards or, in an elastic resume's remainder epoch, this rank's slice of the rest
        read as one shard (elastic.py); s3:// data through the remote feed."""
        self.record.bind(self.source)
        plan, source, shard = self.record.remainder, self.source, self.args["shard"]
        args = {**self.args, "augment": self.epoch_augment()}  # this epoch's image size
        self.built_augment = args["augment"]
        if plan is not None:  # seed per rank: ranks must not draw the same crops
            source = self._subset = elastic.subset_source(self.source, plan.indices)
            args = {**args, "shard": Shard(0, 1, shard.local_rank), "seed": plan.seed + shard.rank}
        if fresh:  # DALI counts a fresh pipeline's epochs (shard rotation) from here
            self.position.dali_epoch0 = self.position.epoch
        fed = self.feed.dali_source(source, epoch=self.position.epoch, position=self.position.batch, fresh=fresh,
                                    subset=plan is not None)
        if fed is not source:
            self.record.bind(fed)  # DALI names samples by the cache's paths: same storage order
        return fed, args

    def _cleanup(self) -> None:
        elastic.remove_subset_indexes(self.__dict__.pop("_subset", self.source), self.source)

    def _recover(self, error: RuntimeError) -> None:
        """A network fault of s3:// data waits for the store (then the run rebuilds at its last good batch),
        never a culprit search; else to the bad-sample policy: it raises naming the culprits, or excludes them."""
        if network_fault(error, self.source):
            return self.outage.wait(error, self.source)
        try:
            self.source = self.policy.handle_failure(error, self.source, self.reader(), self.position.batch,
                                                     self.position.pipeline_epoch)
        except DatasetError as failure:
            self.failure = failure
            raise

    def reader(self) -> ReaderModel:
        """DALI's reader of this pipeline (reader.py): its train mode is the reader's (shuffled, rotating),
        which DataLoader's shuffle=False turns off in a train graph."""
        a, shard = self.args, self.args["shard"]
        shuffled = a.get("shuffle", a["train"])
        return ReaderModel(self.source.num_samples, shard.rank, shard.world_size, shuffled, a["batch_size"],
                           a["shuffle_buffer"], a["prefetch_queue_depth"],
                           list_shuffled=shuffled and self.source.format.SHUFFLES_LIST)

    def begin_epoch(self, batches: int) -> None:
        """An epoch of `batches` batches starts (at position.batch): its clock, and the tuner's budget
        when this is the first epoch this loader runs (tuning.py)."""
        epochs = self.clock.epochs
        if not epochs or epochs[-1].epoch != self.position.epoch or self.position.batch == 0:
            self.clock.begin(self.position.epoch)  # not when an abandoned epoch is finished: its figures stay
        self.whole_epoch = self.position.batch == 0 and self.record.remainder is None
        if self.tuner is not None and not self.tuner.done and not self.tuner.trials:
            self.tuner.begin(batches)

    def next(self, images: int | None = None) -> dict | None:
        """The next batch, timed (stats.py; `images`: what the loader yields of it, padding cut); while
        tuning, each batch is the tuner's to judge."""
        asked = time.perf_counter()
        if self.retune is not None:
            self._rebuild(self.retune)
        batch = self.run.next(self._advance)
        self.outage.delivered()
        if batch is not None:
            wait, wall, cpu = self.clock.batch(asked, time.perf_counter(),
                                               len(batch["labels"]) if images is None else images)
            if self.tuner is not None and not self.tuner.done:
                self.retune = self.tuner.observe(wait, wall, cpu)
                self._tuned()
        return batch

    def _rebuild(self, settings: tuning.Settings) -> None:
        """The same pipeline with other threads / prefetch depth, at the checkpoint of the last batch
        delivered: the batches go on exactly as before (tuning.py says why)."""
        started, self.retune = time.perf_counter(), None
        if self.args["device"] == "gpu":
            import torch
            torch.cuda.current_stream().synchronize()  # the last batch's copy out of DALI's buffers is done
        checkpoint = self.run.checkpoint()
        self.args = {**self.args, **dataclasses.asdict(settings)}
        self.run.build(checkpoint)
        self.clock.event("rebuild", started, time.perf_counter(), settings=str(settings))

    def _tuned(self) -> None:
        """Once the tuner has chosen: remembered for the next run (by local rank 0 only)."""
        if self.tuner.done and self.tuning_key is not None:
            tuning.remember(self.tuning_key, {**self.tuner.tuned_values(), "source": "online"})
            self.tuning_key = None

    def finish_epoch(self) -> None:
        """The epoch's batches are out: its tuning (if the search outlived it) and the sharding check."""
        if self.tuner is not None and not self.tuner.done and self.tuner.trials:
            self.retune = self.tuner.epoch_ended()
            self._tuned()
        if self.sharding_check and self.whole_epoch:
            self.sharding_check = False  # once per run
            sharding.check_delivery(self.record, self.args["shard"], train=self.args["train"],
                                    every_sample=self.every_sample,
                                    location=self.source.location, excluded=len(self.policy.bad_samples),
                                    name_of=lambda i: str(self.source.refs()[i]))

    def stats(self) -> dict:
        """This epoch's figures so far (the last epoch's once it ended; stats.py): data-wait fraction, seconds
        inside next() per batch, step rate, CPU; the pipeline's threads and prefetch depth now; its rebuilds
        and tuning trials as (name, start, end, args) on time.perf_counter's clock."""
        current = self.clock.current
        return {**current.summary(), "num_threads": self.args["num_threads"],
                "prefetch_queue_depth": self.args["prefetch_queue_depth"], "events": list(current.events)}

    def tuning_state(self) -> dict | None:
        return self.tuner.state() if self.tuner is not None else None

    def restore_tuning(self, chosen: dict | None) -> None:
        """A state's choice: this loader does not search again (its own fixed values stay fixed)."""
        if self.tuner is not None and chosen:
            self.retune = None  # a search this loader had begun is over: the state's choice stands
            self.tuner.done, self.tuner.chosen = True, tuning.Settings(**chosen)
            self.args = {**self.args, **self.tuner.tuned_values()}

    def drain(self) -> None:
        self.run.drain(self._advance)

    def end_epoch_later(self) -> None:
        """The epoch's last batch is out: read DALI's rest of the epoch (settle) once the loop comes back
        for more or asks for a state, not before the yield. The pipeline computes the batches past the
        contract's while the training step runs on the last one; draining first kept the loop waiting
        about one batch at every epoch boundary."""
        self.epoch_end_due = True

    def settle(self) -> None:
        """Finish an epoch end left for later (end_epoch_later): a checkpoint then starts the next epoch."""
        if self.epoch_end_due:
            self.epoch_end_due = False
            self.drain()

    def _advance(self) -> None:
        self.feed.advance(self.position.epoch, self.position.batch)  # s3:// cache: the reader's reach is local

    def close(self) -> None:
        self.run.close()
        self.feed.close()
