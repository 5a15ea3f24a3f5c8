"""Wire one Source to one graph for one rank as a DALI pipeline: the rank's settings as one typed value
(PipelineSpec), and the pipeline built from it (build_pipeline). num_threads goes from DaliLoader(...)
(loader.py) into the spec's TunedKnobs here ("auto" and None resolved once, TunedKnobs.requested), and from the
spec to DALI's pipeline_def below, once; the decoders get it from build_pipeline as an argument (their paddings
are per thread). Tuning (tuning.py) makes new specs in between, replacing the knobs whole."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, cast

import numpy as np

from dali_pipes.data.formats import PythonFedFormat
from dali_pipes.data.reader import READER_NAME, ReaderModel
from dali_pipes.data.source import Source
from dali_pipes.graph.augment import decode_only, eval_augment, train_augment
from dali_pipes.graph.augment_config import AUTO_LOAD, DEFAULT_HW_LOAD, AugmentConfig
from dali_pipes.graph.decoders import resolve_decode_device
from dali_pipes.graph.wheel import require_dali
from dali_pipes.run.contract import Contract
from dali_pipes.run.dist import Shard
from dali_pipes.run.machine import default_threads

if TYPE_CHECKING:
    from nvidia.dali import Pipeline

__all__ = ["AUTO", "KNOBS", "READER_NAME", "PipelineSpec", "TunedKnobs", "build_pipeline", "cuda_device_id",
           "rank_seed", "reader_model", "source_reader"]

AUTO = AUTO_LOAD  # "auto": tuned online, whichever knob (augment_config spells it for hw_decoder_load)
KNOBS = ("num_threads", "prefetch_queue_depth", "hw_decoder_load")  # TunedKnobs' fields: what tuning may search


def rank_seed(seed: int, rank: int) -> int:
    """A distinct, reproducible DALI seed per (seed, rank): ranks must not draw the same crops."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0] & 0x7FFFFFFF)


@dataclass(frozen=True, kw_only=True)
class TunedKnobs:
    """The settings tuning (tuning.py) may change, as one value that it replaces whole: none changes a sample
    (a pipeline rebuilt with others at DALI's checkpoint goes on with the same batches; hw_decoder_load but for
    the decoders' rounding). Resolved: no "auto" and no None here (TunedKnobs.requested reads them)."""
    num_threads: int = 0                  # DALI's CPU threads; 0: machine.default_threads(), resolved here
    prefetch_queue_depth: int = 2         # batches DALI computes ahead
    hw_decoder_load: float = DEFAULT_HW_LOAD  # the share of a GPU's mixed decoder on the hardware JPEG decoder

    def __post_init__(self) -> None:
        if not self.num_threads:
            object.__setattr__(self, "num_threads", default_threads())
        for name in ("num_threads", "prefetch_queue_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive count, got {value!r}")
        load = self.hw_decoder_load
        if isinstance(load, (bool, str)) or not 0 <= load <= 1:
            raise ValueError(f"hw_decoder_load must be in [0, 1], got {load!r}")

    @classmethod
    def requested(cls, num_threads: int | str | None, prefetch_queue_depth: int | str,
                  hw_decoder_load: float | str) -> tuple["TunedKnobs", tuple[str, ...]]:
        """(the knobs to start with, the names of those left AUTO): the one place "auto" is read. AUTO starts at
        the default (threads: machine.default_threads(); depth 2; hw_decoder_load DEFAULT_HW_LOAD), as does a
        None thread count; tuning searches from there. Another string is a ValueError."""
        given = {"num_threads": num_threads, "prefetch_queue_depth": prefetch_queue_depth,
                 "hw_decoder_load": hw_decoder_load}
        for name, value in given.items():
            if isinstance(value, str) and value != AUTO:
                raise ValueError(f"{name} must be a count or {AUTO!r}, got {value!r}")
        auto = tuple(name for name in KNOBS if given[name] == AUTO)
        fixed: dict[str, Any] = {name: value for name, value in given.items() if name not in auto and value is not None}
        return cls(**fixed), auto


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """Everything one rank's DALI pipeline is built from, its source aside: a value, built once by the loader
    (loader.py) with keywords only and checked once, here (decode_device resolved, never None after); tuning
    and schedules make new ones (dataclasses.replace), never edit one. `contract` is the loader's own epoch
    contract (contract.py), the same object: the one home of its batch size and train flag, read through
    `batch_size` and `train`, so that DALI batches by the size the epoch is cut by."""
    contract: Contract                  # the loader's Contract: train or val, batch_size (DALI batches by it), ...
    device: str = "cpu"                 # where batches come out: "gpu" (device_id's GPU) or "cpu"
    decode_device: str | None = None    # None: device, resolved at construction; "cpu" with device "gpu": hybrid
    shard: Shard = Shard()              # this rank, of how many: DALI's shard_id / num_shards (the slice)
    seed: int = 0                       # one per run; each rank's DALI seed is rank_seed(seed, rank)
    augment: AugmentConfig = AugmentConfig()  # image_size may be a schedule: at_epoch picks the epoch's size
    knobs: TunedKnobs = field(default_factory=TunedKnobs)  # threads, prefetch depth, hw_decoder_load: tuning's
    tuned: tuple[str, ...] = ()         # the knobs left "auto" (TunedKnobs.requested): tuning searches them
    shuffle_buffer: int = 4096          # the reader's shuffle buffer (train)
    shuffle: bool | None = None         # the reader shuffles and rotates slices per epoch; None: train
    max_pixels: int | None = None       # the pixel guard (reader.guard_pixels); None: off
    device_id: int | None = None        # the GPU; None: cuda_device_id(shard)
    normalize: bool = True              # False (val only): uint8 images, normalised by the loader (val_cache.py)

    def __post_init__(self) -> None:
        # Refuse a bad combination before DALI sees it; readers get the decode device resolved
        object.__setattr__(self, "decode_device", resolve_decode_device(self.device, self.decode_device))
        load = self.augment.hw_decoder_load  # the user's request; the graph builds with knobs.hw_decoder_load
        if load != AUTO and load != self.knobs.hw_decoder_load:
            raise ValueError(f"augment.hw_decoder_load={load!r} but knobs.hw_decoder_load="
                             f"{self.knobs.hw_decoder_load!r}: the knobs are what the decoder gets; pass "
                             f"knobs=TunedKnobs(hw_decoder_load={load!r}) (TunedKnobs.requested reads the request)")
        if not set(self.tuned) <= set(KNOBS):
            raise ValueError(f"tuned must name knobs among {KNOBS}, got {self.tuned!r}")

    @property
    def batch_size(self) -> int:
        """DALI's batch: the contract's (pipeline_def, the reader's model and the remote feed read it here)."""
        return self.contract.batch_size

    @property
    def train(self) -> bool:
        """The train graph (random crop, flip, ...) or val's (resize, centre crop): the contract's."""
        return self.contract.train

    def with_knobs(self, **values: Any) -> "PipelineSpec":
        """This spec with `values` of its knobs (tuning's choice), the TunedKnobs replaced whole: a new spec."""
        return replace(self, knobs=replace(self.knobs, **values))

    @property
    def shuffled(self) -> bool:
        """The reader shuffles (DataLoader's shuffle=False keeps a train graph in storage order)."""
        return self.train if self.shuffle is None else self.shuffle

    def at_epoch(self, epoch: int) -> "PipelineSpec":
        """This spec with the one image size of epoch `epoch` (a pipeline's graph has one size)."""
        augment = self.augment.for_epoch(epoch, self.train)
        return self if augment is self.augment else replace(self, augment=augment)


class Feed(Protocol):
    """What reads a sampler-driven epoch in place of the source's reader (hooks.EpochOrder's feed)."""

    def dali_nodes(self, max_pixels: int | None) -> tuple:
        """Inside a pipeline definition: (encoded images, int64 labels, identity rows)."""

    def bind(self, source: Source) -> None:
        """Before each build: what the pipeline reads, from the loader's position."""

    def has_next(self) -> bool:
        """The feed has batches left in its epoch (a pipeline that read its end starts again)."""


def build_pipeline(source: Source, spec: PipelineSpec, checkpoint: bytes | None = None, *, sample_ids: bool = False,
                   stage: str = "augment", enable_checkpointing: bool = True, feed: Feed | None = None) -> Pipeline:
    """An unbuilt DALI pipeline yielding (images, labels) for one rank, at DALI's `checkpoint` if given.

    Train: the reader shuffles through a buffer of `shuffle_buffer` samples and moves to the next slice
    each epoch (stick_to_shard=False), so ranks see other data every epoch. Val: no shuffle, each rank
    keeps its slice. `spec.shuffle` sets the reader apart from the graph: False reads the train graph in
    val's order (DataLoader's shuffle=False). Both pad the last batch (pad_last_batch=True) so that every
    rank runs the same number of batches; DaliLoader drops or masks the padding.

    device="gpu": images and labels come out on the GPU; labels too, as DALI's own examples return them:
    a CPU output of a GPU pipeline arrives in pageable host memory and its copy to the GPU would sync.
    `sample_ids` adds each sample's identity (delivery.py). `stage` "read" (encoded bytes) or "decode"
    (whole images, graph.decode_only) stops the graph early: `dali-pipes profile` times each stage alone.
    `feed` reads a sampler-driven epoch (sampled.py) instead of the source's reader: exactly the samples it
    is given, in that order, into the same graph."""
    require_dali()  # a missing DALI is named with the wheel that fits torch
    from nvidia.dali import pipeline_def
    if not spec.normalize and (spec.train or stage != "augment"):
        raise ValueError("normalize=False is val's augment graph alone (the val cache's uint8 output)")
    augment, shard, gpu, knobs = sized_to_data(spec.augment, source), spec.shard, spec.device == "gpu", spec.knobs
    device_id = (spec.device_id if spec.device_id is not None else cuda_device_id(shard)) if gpu else None

    # ignore: DALI's stub (2.4) types device_id as int; None is DALI's documented "no GPU" (CPU pipelines)
    @pipeline_def(batch_size=spec.batch_size, num_threads=knobs.num_threads,  # DALI's one read of the threads
                  device_id=device_id,  # type: ignore[arg-type]
                  seed=rank_seed(spec.seed, shard.rank), prefetch_queue_depth=knobs.prefetch_queue_depth,
                  enable_checkpointing=enable_checkpointing,
                  # auto_aug's policies and png16="pil"'s per-sample decode (graph.decode_rgb) are `if`s on samples
                  enable_conditionals=spec.train and augment.auto_augment is not None or augment.png16 == "pil")
    def graph():
        if feed is not None:
            jpegs, labels, fed_ids = feed.dali_nodes(spec.max_pixels)
            ids = [fed_ids] if sample_ids else []
        else:
            jpegs, labels, *ids = source.dali_reader(
                name=READER_NAME, shard_id=shard.rank, num_shards=shard.world_size, random_shuffle=spec.shuffled,
                initial_fill=spec.shuffle_buffer, pad_last_batch=True, stick_to_shard=not spec.shuffled,
                max_pixels=spec.max_pixels, with_ids=sample_ids)
        # After a decode error the loader finds the culprit from the reader's position (recovery.py)
        if stage == "read":
            return jpegs, labels
        augment_images = {"augment": train_augment if spec.train else eval_augment, "decode": decode_only}[stage]
        uint8 = {} if spec.normalize else {"normalize": False}
        images = augment_images(jpegs, augment, spec.device, spec.decode_device, num_threads=knobs.num_threads,
                                hw_decoder_load=knobs.hw_decoder_load, **uint8)
        labels = labels.gpu() if gpu else labels
        return (images, labels, *ids)  # ids: each sample's identity (delivery.py), when asked

    return graph(checkpoint=checkpoint) if checkpoint else graph()


def sized_to_data(augment: AugmentConfig, source: Source) -> AugmentConfig:
    """`augment` with the GPU decoders' preallocation sized to the box around the data's images where the data
    tells it (Source.largest_image, from a conversion manifest) and no size was given; else as it is."""
    if augment.decoder_size_hint is not None or source.largest_image is None:
        return augment
    return replace(augment, decoder_size_hint=source.largest_image)


def reader_model(spec: PipelineSpec, num_samples: int, list_order_shuffles: bool,
                 order: Callable[[int, Sequence[int]], Sequence[int]] | None = None) -> ReaderModel:
    """DALI's reader as build_pipeline configures it from `spec` (reader.py models it), for a source of
    `num_samples` whose format shuffles the reader's list order when the reader shuffles (SHUFFLES_LIST);
    `order`: a Python-fed format's read order of a shuffled epoch (source_reader gives it)."""
    shard = spec.shard
    return ReaderModel(num_samples, shard.rank, shard.world_size, spec.shuffled, spec.batch_size, spec.shuffle_buffer,
                       spec.knobs.prefetch_queue_depth, list_shuffled=spec.shuffled and list_order_shuffles,
                       order=order if spec.shuffled else None)


def source_reader(spec: PipelineSpec, source: Source) -> ReaderModel:
    """reader_model for `source` as build_pipeline reads it, a Python-fed format's read order included (its
    source draws it from the pipeline's seed, rank_seed)."""
    fmt = source.format
    order = cast(PythonFedFormat, fmt).order_model(source, rank_seed(spec.seed, spec.shard.rank),
                                                   spec.shuffle_buffer) if fmt.PYTHON_FED and spec.shuffled else None
    return reader_model(spec, source.num_samples, fmt.SHUFFLES_LIST, order)


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
