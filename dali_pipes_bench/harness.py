"""Input-pipeline benchmarks: every loader on the same data and transforms, in one run.

A case is a named loader factory. `measure` builds it (first-batch latency counts the build),
warms it up, then times `passes` passes of `batches_per_pass` batches, each batch made ready
where training happens (copied to the GPU and synchronised when there is one). It records
images/s per pass (reported as median, min, max), CPU use of the whole process tree (workers
included), and peak host and GPU memory. A case that fails is recorded with its error, not fatal.

Images/s counts the samples a loader *decoded*: in train mode DALI's reader pads each epoch's last
batch and the loader drops it, work that a small benchmark set would otherwise charge to the
delivered samples (6-50% of an epoch of 1,000 images at batch 64-512; on ImageNet, nothing).

The "loader_overhead" case runs DaliLoader and the bare DALI pipeline it wraps (the same graph,
driven by DALI's own DALIGenericIterator) in one process, in alternating passes, and reports
loader / bare.
"""

from __future__ import annotations

import datetime
import importlib.util
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from dali_pipes.baseline import TorchLoader
from dali_pipes.data.formats import read_sample
from dali_pipes.data.reader import READER_NAME, ReaderModel
from dali_pipes.data.source import Source, open_source
from dali_pipes.graph._dali import iterator_pipelines, shutdown_pipeline
from dali_pipes.graph.augment import eval_augment, train_augment
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.loader import DaliLoader
from dali_pipes.run.contract import Contract
from dali_pipes.run.dist import Shard
from dali_pipes.run.machine import usable_cpus
from dali_pipes.run.pipeline import KNOBS, PipelineSpec, TunedKnobs, build_pipeline
from dali_pipes.run.stats import NOISY, Spread
from dali_pipes.run.usage import PeakSampler, cpu_seconds
from dali_pipes_bench.cli import fresh_folder

_DEFAULT_AUGMENT = AugmentConfig()  # frozen: one shared default is safe


@dataclass
class Measurement:
    name: str
    group: str
    mode: str
    params: dict
    images_per_s: list[float] = field(default_factory=list)
    first_batch_s: float | None = None
    cpu_cores: float | None = None  # CPU seconds of the process tree per wall second
    host_peak_mb: float | None = None
    gpu_peak_mb: float | None = None
    error: str | None = None
    dropped_counted: int = 0  # decoded samples the loader dropped (padded train batches), counted in images/s
    reference_images_per_s: list[float] = field(default_factory=list)  # loader_overhead: the bare pipeline
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """loader_overhead: median loader images/s over median bare-pipeline images/s."""
        if not self.reference_images_per_s or not self.images_per_s:
            return None
        return self.median / float(np.median(self.reference_images_per_s))

    @property
    def median(self) -> float:
        return float(np.median(self.images_per_s)) if self.images_per_s else 0.0

    def row(self) -> dict:
        out = asdict(self)
        out.update(median=self.median, min=min(self.images_per_s, default=0.0), max=max(self.images_per_s, default=0.0),
                   ratio=self.ratio)
        return out


@dataclass(frozen=True)
class Timing:
    passes: int = 5
    batches_per_pass: int = 8
    warmup_batches: int = 3


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    mode: str
    params: dict
    factory: Callable[[], Iterable]


def forever(loader: Iterable) -> Iterator:
    """Batches across epoch boundaries, without abandoning an epoch midway."""
    while True:
        yield from loader


def forever_counted(loader: Iterable) -> Iterator[tuple[object, int]]:
    """(batch, samples decoded but dropped) across epoch boundaries: 0, except with an epoch's last
    batch, which carries the padded batch a DALI loader decoded and dropped in that epoch."""
    dropped = dropped_per_epoch(loader)
    while True:
        previous = None
        for batch in loader:
            if previous is not None:
                yield previous, 0
            previous = batch
        if previous is None:
            raise RuntimeError("the loader yielded no batch in a whole epoch")
        yield previous, dropped


def dropped_per_epoch(loader: Iterable) -> int:
    """Samples a loader decodes per epoch but never yields. DALI's reader pads the shard's last
    batch (pad_last_batch) and, in train mode, DaliLoader (like DALI's DROP policy) drops it:
    ceil(shard / batch) batches decoded, floor(shard / batch) yielded. Other loaders drop nothing
    (DataLoader's drop_last never loads the partial batch)."""
    if isinstance(loader, (DaliLoader, _BareDali)) and loader.train:
        model = ReaderModel(loader.num_samples, loader.shard.rank, loader.shard.world_size)
        shard = model.slice_size(loader.shard.rank)
        return -(-shard // loader.batch_size) * loader.batch_size - len(loader) * loader.batch_size
    return 0


def _ready(batch, device: torch.device) -> int:
    """Make a batch usable by a training step on `device`; returns its number of samples."""
    images, labels = batch[0], batch[1]
    if device.type == "cuda":
        images = images.to(device, non_blocking=True)
    return len(labels)


def measure(case: Case, timing: Timing, device: torch.device, progress: Callable[[], object] = lambda: None
            ) -> Measurement:
    """`case` timed; `progress` is called at each of its case_steps (the build and warm-up, then each pass)."""
    m = Measurement(case.name, case.group, case.mode, case.params)
    loader = None
    try:
        with PeakSampler() as peaks:
            start = time.perf_counter()
            loader = case.factory()
            if isinstance(loader, LoaderOverhead):
                _measure_alternating(loader, m, timing, device, start, progress)
            else:
                _measure_one(loader, m, timing, device, start, progress)
        m.host_peak_mb, m.gpu_peak_mb = round(peaks.host_peak_mb, 1), peaks.gpu_peak_mb
    except Exception as e:  # one broken case must not lose the others' numbers
        m.error = f"{type(e).__name__}: {e}"[:500]
    finally:
        if loader is not None and hasattr(loader, "close"):
            loader.close()
    return m


def _timed_pass(batches: Iterator, count: int, device: torch.device) -> tuple[float, int]:
    """(images/s, dropped samples counted) over `count` batches."""
    t0, samples, dropped = time.perf_counter(), 0, 0
    for _ in range(count):
        batch, extra = next(batches)
        samples += _ready(batch, device) + extra
        dropped += extra
    if device.type == "cuda":
        torch.cuda.synchronize()
    return samples / (time.perf_counter() - t0), dropped


def _measure_one(loader: Iterable, m: Measurement, timing: Timing, device: torch.device, start: float,
                 progress: Callable[[], object]) -> None:
    batches = forever_counted(loader)
    _ready(next(batches)[0], device)
    m.first_batch_s = time.perf_counter() - start
    for _ in range(timing.warmup_batches):
        _ready(next(batches)[0], device)
    progress()
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    for _ in range(timing.passes):
        rate, dropped = _timed_pass(batches, timing.batches_per_pass, device)
        m.images_per_s.append(rate)
        m.dropped_counted += dropped
        progress()
    m.cpu_cores = (cpu_seconds() - cpu0) / (time.perf_counter() - wall0)


def _measure_alternating(pair: "LoaderOverhead", m: Measurement, timing: Timing, device: torch.device,
                         start: float, progress: Callable[[], object]) -> None:
    """Passes of the loader and of the bare pipeline, alternating (and alternating which goes
    first), so that both meet the same machine state; the idle one waits with a full queue."""
    arms = {"loader": forever_counted(pair.loader), "bare": forever_counted(pair.bare)}
    _ready(next(arms["loader"])[0], device)
    m.first_batch_s = time.perf_counter() - start
    for batches in arms.values():
        for _ in range(timing.warmup_batches):
            _ready(next(batches)[0], device)
    progress()
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    for i in range(timing.passes):
        for arm in (("loader", "bare") if i % 2 == 0 else ("bare", "loader")):
            rate, dropped = _timed_pass(arms[arm], timing.batches_per_pass, device)
            (m.images_per_s if arm == "loader" else m.reference_images_per_s).append(rate)
            m.dropped_counted += dropped if arm == "loader" else 0
        progress()
    m.cpu_cores = (cpu_seconds() - cpu0) / (time.perf_counter() - wall0)
    m.extra["pass_ratios"] = [a / b for a, b in zip(m.images_per_s, m.reference_images_per_s)]
    m.extra["checkpoint_us"] = pair.checkpoint_cost_us()


# ---------------------------------------------------------------------------------------------
# Loaders that exist only for comparison
# ---------------------------------------------------------------------------------------------

class EpochOrder:
    """Sample order of each epoch for an external_source callback: a seeded permutation per epoch
    in train mode (made once per epoch, not once per sample), storage order otherwise."""

    def __init__(self, count: int, train: bool, seed: int) -> None:
        self.count, self.train, self.seed = count, train, seed
        self._epoch, self._order = -1, None

    def __call__(self, epoch: int, index: int) -> int:
        if not self.train:
            return index
        if epoch != self._epoch:
            self._epoch, self._order = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.count)
        return int(self._order[index])


def preloaded_pipeline(data: list[np.ndarray], labels: list[np.int64], *, batch_size: int, train: bool, device: str,
                       augment: AugmentConfig = _DEFAULT_AUGMENT, num_threads: int | None = None, seed: int = 0,
                       device_id: int = 0, decode_device: str | None = None):
    """An unbuilt pipeline: the library's graph fed from encoded bytes in memory (external_source)
    instead of a reader. Each epoch yields the whole batches only; labels on the GPU with device="gpu"."""
    from nvidia.dali import fn, pipeline_def, types
    usable = len(data) // batch_size * batch_size
    order = EpochOrder(len(data), train, seed)

    def sample(info):
        if info.idx_in_epoch >= usable:
            raise StopIteration
        i = order(info.epoch_idx, info.idx_in_epoch)
        return data[i], labels[i]

    knobs = TunedKnobs.requested(num_threads or usable_cpus(), 2, augment.hw_decoder_load)[0]  # as the loader's

    @pipeline_def(batch_size=batch_size, num_threads=knobs.num_threads,
                  device_id=device_id if device == "gpu" else None, seed=seed,
                  enable_conditionals=train and augment.auto_augment is not None)
    def graph():
        jpegs, label = fn.external_source(source=sample, num_outputs=2, batch=False, dtype=[types.UINT8, types.INT64])
        images = (train_augment if train else eval_augment)(jpegs, augment, device, decode_device,
                                                            num_threads=knobs.num_threads,
                                                            hw_decoder_load=knobs.hw_decoder_load)
        return images, label.gpu() if device == "gpu" else label

    return graph()


class _IteratorBatches:
    """(images, labels) batches of a DALIGenericIterator held as `self.iterator`, and its shutdown."""
    iterator = None

    def __iter__(self):
        for (batch,) in self.iterator:
            yield batch["images"], batch["labels"]

    def close(self) -> None:
        for pipe in iterator_pipelines(self.iterator):
            shutdown_pipeline(pipe)


class PreloadedDaliLoader(_IteratorBatches):
    """The same DALI graph fed from encoded bytes held in memory (external_source) instead of a
    reader: does preloading pay? Shuffles per epoch in train mode; drops the last partial batch."""

    def __init__(self, source: Source, *, batch_size: int, train: bool, device: str, image_size: int = 224,
                 num_threads: int | None = None, seed: int = 0, augment: AugmentConfig | None = None) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
        samples = [read_sample(ref) for ref in source.refs()]
        data = [np.frombuffer(s.data, np.uint8) for s in samples]
        labels = [np.int64(s.label) for s in samples]
        pipe = preloaded_pipeline(data, labels, batch_size=batch_size, train=train, device=device,
                                  augment=augment or AugmentConfig(image_size=image_size), num_threads=num_threads,
                                  seed=seed, device_id=torch.cuda.current_device() if device == "gpu" else 0)
        self.iterator = DALIGenericIterator(pipe, ["images", "labels"], auto_reset=True)
        self.preloaded_mb = sum(len(d) for d in data) / 2**20


class _BareDali(_IteratorBatches):
    """The pipeline DaliLoader builds, driven the way DALI's own PyTorch examples drive one:
    DALIGenericIterator, and nothing else."""

    def __init__(self, source: Source, *, batch_size: int, train: bool, pipeline_args: dict) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
        self.train, self.batch_size, self.shard, self.num_samples = train, batch_size, Shard(), source.num_samples
        sample_ids = pipeline_args.pop("sample_ids", False)
        asked = {name: pipeline_args.pop(name, None) for name in KNOBS[:2]}  # the knobs as the loader reads them
        augment = pipeline_args.get("augment", _DEFAULT_AUGMENT)
        knobs = TunedKnobs.requested(asked["num_threads"], asked["prefetch_queue_depth"] or 2,
                                     augment.hw_decoder_load)[0]
        spec = PipelineSpec(contract=Contract(train, batch_size, drop_last=False), shard=self.shard, knobs=knobs,
                            **pipeline_args)
        pipe = build_pipeline(source, spec, sample_ids=sample_ids)
        outputs = ["images", "labels", "ids"] if sample_ids else ["images", "labels"]
        self.iterator = DALIGenericIterator(pipe, outputs, reader_name=READER_NAME, auto_reset=True,
                                            last_batch_policy=LastBatchPolicy.DROP if train else LastBatchPolicy.FILL)

    def __len__(self) -> int:
        return len(self.iterator)


class LoaderOverhead:
    """A DaliLoader and the bare DALI pipeline it wraps, built alike (same graph, same seed and
    settings), for `measure`'s alternating passes: what does the loader cost over DALI itself?"""

    def __init__(self, source: Source, *, batch_size: int, train: bool, device: str, num_threads: int,
                 augment: AugmentConfig, seed: int = 0, loader_args: dict | None = None) -> None:
        loader_args = {k: v for k, v in (loader_args or {}).items() if k not in ("device", "num_threads")}
        if loader_args.get("prefetch_queue_depth") in (None, "auto"):  # both sides alike, fixed: no tuning here
            loader_args["prefetch_queue_depth"] = 2
        self.loader = DaliLoader(source, batch_size=batch_size, train=train, device=device, num_threads=num_threads,
                                 augment=augment, seed=seed, **loader_args)
        pipeline_args = {k: loader_args[k] for k in ("shuffle_buffer", "prefetch_queue_depth", "decode_device")
                         if k in loader_args}
        # The same graph as the loader's (its pixel guard and sample ids): what is measured is the loader.
        pipeline_args.update(sample_ids=True, max_pixels=loader_args.get("max_pixels", 100_000_000))
        self.bare = _BareDali(source, batch_size=batch_size, train=train,
                              pipeline_args=dict(device=device, num_threads=num_threads, augment=augment, seed=seed,
                                                 **pipeline_args))

    def checkpoint_cost_us(self, calls: int = 50) -> float:
        """Microseconds per DALI checkpoint of the bare pipeline (what a checkpoint per batch costs)."""
        start = time.perf_counter()
        for _ in range(calls):
            self.bare.iterator.checkpoints()
        return (time.perf_counter() - start) / calls * 1e6

    def close(self) -> None:
        self.loader.close()
        self.bare.close()


class TorchvisionGpuLoader:
    """torchvision's batched GPU decode_jpeg + transforms v2 on the GPU; DataLoader workers only
    read the encoded bytes. Needs torchvision and CUDA."""

    def __init__(self, source: Source, *, batch_size: int, train: bool, image_size: int = 224,
                 num_workers: int = 4) -> None:
        import torchvision
        from torchvision.transforms import v2
        self._decode = lambda encoded: torchvision.io.decode_jpeg(encoded, mode=torchvision.io.ImageReadMode.RGB,
                                                                  device="cuda")
        refs = source.refs()
        self._loader = torch.utils.data.DataLoader(
            _EncodedBytes(refs), batch_size=batch_size, shuffle=train, drop_last=True, num_workers=num_workers,
            collate_fn=lambda items: items, persistent_workers=num_workers > 0)
        cfg = AugmentConfig(image_size=image_size)
        geometry = ([v2.RandomResizedCrop(image_size, scale=cfg.random_area, ratio=cfg.random_aspect_ratio,
                                          antialias=True), v2.RandomHorizontalFlip()] if train else
                    [v2.Resize(round(image_size / cfg.crop_ratio), antialias=True), v2.CenterCrop(image_size)])
        self._per_image = v2.Compose(geometry)
        self._normalize = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(cfg.mean, cfg.std)])

    def __iter__(self):
        for items in self._loader:
            encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data, _ in items]
            images = self._decode(encoded)  # one batched nvJPEG call
            images = torch.stack([self._per_image(img) for img in images])
            yield self._normalize(images), torch.tensor([label for _, label in items])

    def close(self) -> None:
        self._loader = None


class _EncodedBytes(torch.utils.data.Dataset):
    def __init__(self, refs: list) -> None:
        self.refs = refs

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        sample = read_sample(self.refs[i])
        return sample.data, sample.label


class TfDataLoader:
    """tf.data over TFRecord shards (parallel interleave, parallel map, prefetch AUTOTUNE),
    delivered as torch tensors. Needs TensorFlow."""

    def __init__(self, shards: list[str], *, batch_size: int, train: bool, image_size: int = 224) -> None:
        from dali_pipes_bench.tf_data import tf_dataset
        self._dataset = tf_dataset(shards, batch_size=batch_size, train=train, image_size=image_size)

    def __iter__(self):
        for images, labels in self._dataset:
            yield torch.from_numpy(images.numpy()), torch.from_numpy(labels.numpy())


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------------------------------------
# The comparison matrix
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    batch_size: int
    image_size: int
    threads: list[int]
    workers: list[int]
    batch_sizes: list[int]
    hw_loads: list[float]
    shard_counts: list[int]
    timing: Timing
    modes: tuple[str, ...] = ("train", "val")
    overhead_modes: tuple[str, ...] = ("train", "val")  # loader_overhead cases


def make_plan(quick: bool, gpu: bool, cores: int) -> Plan:
    powers = sorted({1, *[2 ** k for k in range(1, 8) if 2 ** k < cores], cores})
    if quick:
        return Plan(batch_size=32, image_size=224, threads=sorted({1, cores}), workers=sorted({0, cores}),
                    batch_sizes=[16, 32], hw_loads=[0.0, 0.65, 1.0] if gpu else [], shard_counts=[4],
                    timing=Timing(passes=5, batches_per_pass=3, warmup_batches=4), overhead_modes=("train",))
    return Plan(batch_size=256 if gpu else 64, image_size=224, threads=powers, workers=[0, *powers],
                batch_sizes=[64, 128, 256, 512] if gpu else [32, 64, 128],
                hw_loads=[0.0, 0.25, 0.5, 0.65, 0.75, 0.9, 1.0] if gpu else [], shard_counts=[4, 16, 64],
                timing=Timing(passes=5, batches_per_pass=20, warmup_batches=10) if gpu else
                Timing(passes=5, batches_per_pass=8, warmup_batches=3))


def format_copies(source: Source, out: str, shard_counts: list[int], progress: bool = True) -> dict[str, str]:
    """The same samples as TFRecord and WebDataset shards at several shard counts (made once, reused)."""
    from dali_pipes.tools.convert import write_tfrecords, write_webdataset
    copies = {f"{source.kind} (as given)": source.location}
    for k in shard_counts:
        k = min(k, source.num_samples)
        for kind, write in (("tfrecord", write_tfrecords), ("webdataset", write_webdataset)):
            folder = os.path.join(out, f"{kind}-{k}")
            if not os.path.exists(os.path.join(folder, "classes.json")):  # overwrite: a copy cut short is ours
                write(source, folder, shards=k, progress=progress, overwrite=True)
            copies[f"{kind} x{k} shards"] = folder
    return copies


def _loader_cases(source: Source, plan: Plan, gpu: bool, cores: int, formats: dict[str, str], dali: Callable,
                  torch_loader: Callable) -> list[Case]:
    """The "loaders" group: every loader, train and val, as build_cases makes them."""
    b, size = plan.batch_size, plan.image_size
    cases = []
    for mode in plan.modes:
        train = mode == "train"
        if gpu:
            cases.append(Case("DALI gpu", "loaders", mode, {"device": "gpu"}, dali(train=train)))
            cases.append(Case("DALI gpu, CPU decode (hybrid)", "loaders", mode, {"decode_device": "cpu"},
                              dali(train=train, extra={"decode_device": "cpu"})))
        cases.append(Case("DALI cpu", "loaders", mode, {"device": "cpu"},
                          dali(train=train, device="cpu", extra={"decode_device": None})))
        cases.append(Case(f"DataLoader+PIL {cores} workers", "loaders", mode, {"workers": cores},
                          torch_loader(train=train)))
        if gpu and available("torchvision"):
            cases.append(Case("torchvision GPU decode", "loaders", mode, {"workers": cores},
                              lambda train=train: TorchvisionGpuLoader(source, batch_size=b, train=train,
                                                                       image_size=size, num_workers=cores)))
        tfrecords = [v for k, v in formats.items() if k.startswith("tfrecord")]
        if available("tensorflow") and tfrecords:
            shards = open_source(tfrecords[-1]).files
            cases.append(Case("tf.data", "loaders", mode, {"shards": len(shards)},
                              lambda train=train, shards=shards: TfDataLoader(shards, batch_size=b, train=train,
                                                                              image_size=size)))
    return cases


def build_cases(source: Source, plan: Plan, gpu: bool, cores: int, formats: dict[str, str],
                augment: AugmentConfig | None = None, loader: object | None = None) -> list[Case]:
    """The comparison matrix. `augment` (default: AugmentConfig at the plan's image size) reaches
    every loader; `loader` (a LoaderConfig) every DALI loader, except the device and thread count,
    which the cases set."""
    dali_device = "gpu" if gpu else "cpu"
    b, size = plan.batch_size, plan.image_size
    augment = replace(augment, image_size=size) if augment else AugmentConfig(image_size=size)
    loader_args = {k: v for k, v in (asdict(loader) if loader is not None else {}).items()
                   if k not in ("device", "num_threads")}
    dali = lambda src=source, device=dali_device, train=True, batch=b, threads=cores, extra=None, **aug: (
        lambda: DaliLoader(src, batch_size=batch, train=train, device=device, num_threads=threads,
                           augment=replace(augment, **aug), **{**loader_args, **(extra or {})}))
    torch_loader = lambda train=True, workers=cores, pin=True, persistent=True: (
        lambda: TorchLoader(source, batch_size=b, train=train, num_workers=workers, pin_memory=pin,
                            persistent_workers=persistent, augment=augment))
    cases = _loader_cases(source, plan, gpu, cores, formats, dali, torch_loader)
    for mode in plan.overhead_modes:
        cases.append(Case(f"DaliLoader / bare DALI {dali_device}", "loader_overhead", mode,
                          {"device": dali_device, "threads": cores},
                          lambda train=mode == "train": LoaderOverhead(source, batch_size=b, train=train,
                                                                       device=dali_device, num_threads=cores,
                                                                       augment=augment, loader_args=loader_args)))
    for load in plan.hw_loads:
        cases.append(Case(f"hw_decoder_load={load}", "hw_decoder_load", "train", {"hw_decoder_load": load},
                          dali(hw_decoder_load=load)))
    for threads in plan.threads:
        cases.append(Case(f"DALI {dali_device} {threads} threads", "dali_threads", "train", {"threads": threads},
                          dali(threads=threads)))
    for workers in plan.workers:
        cases.append(Case(f"DataLoader {workers} workers", "torch_workers", "train", {"workers": workers},
                          torch_loader(workers=workers)))
    if len(plan.workers) > 2:  # the full run also shows what pinning and persistent workers change
        cases.append(Case(f"DataLoader {cores} workers, no pin_memory", "torch_workers", "train",
                          {"workers": cores, "pin_memory": False}, torch_loader(pin=False)))
        cases.append(Case(f"DataLoader {cores} workers, not persistent", "torch_workers", "train",
                          {"workers": cores, "persistent_workers": False}, torch_loader(persistent=False)))
    for batch in plan.batch_sizes:
        cases.append(Case(f"DALI {dali_device} batch {batch}", "batch_size", "train", {"batch_size": batch},
                          dali(batch=batch)))
    for name, location in formats.items():
        cases.append(Case(f"{name} (lazy)", "formats", "train", {"location": location},
                          dali(src=open_source(location))))
    cases.append(Case("preloaded in memory", "formats", "train", {"external_source": True},
                      lambda: PreloadedDaliLoader(source, batch_size=b, train=True, device=dali_device,
                                                  num_threads=cores, augment=augment)))
    return cases


# ---------------------------------------------------------------------------------------------
# Conditions and reports
# ---------------------------------------------------------------------------------------------

def machine_info() -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "cpus_usable": usable_cpus(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__, "pillow": Image.__version__,
            "date": datetime.date.today().isoformat()}
    import nvidia.dali
    info["dali"] = nvidia.dali.__version__
    for module in ("torchvision", "tensorflow"):
        if available(module):
            info[module] = __import__(module).__version__
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            info["driver"] = "unknown"
        info["cuda"] = torch.version.cuda
    return info


def machine_tag(info: dict) -> str:
    if "gpu" in info:
        return re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower().replace("nvidia", "")).strip("-")
    return f"cpu{info['cpu_count']}"


def dataset_info(source: Source, sample: int = 500) -> dict:
    refs = source.refs()
    picks = refs[:: max(1, len(refs) // sample)]
    sizes, pixels = [], []
    for ref in picks:
        data = read_sample(ref).data
        sizes.append(len(data))
        with Image.open(io.BytesIO(data)) as img:
            pixels.append(img.width * img.height)
    return {"location": str(source.location), "kind": source.kind, "count": source.num_samples,
            "mean_bytes": int(np.mean(sizes)), "mean_pixels": int(np.mean(pixels)), "measured_on": len(picks)}


def spread_of(row: dict) -> float:
    """(max - min) / median of a row's passes, the bare pipeline's too (loader_overhead)."""
    return max(Spread.of(row["images_per_s"]).spread, Spread.of(row.get("reference_images_per_s") or []).spread)


def markdown_table(rows: list[dict], baseline: str) -> str:
    """One table per group and mode; each row's ratio is to `baseline` in the same mode, or "not ranked" when
    its passes spread by more than 10% (protocol.py)."""
    base = {r["mode"]: r["median"] for r in rows if r["name"] == baseline and r["group"] == "loaders"}
    lines = []
    for group in dict.fromkeys(r["group"] for r in rows):
        lines += [f"\n### {group}\n", "| case | mode | images/s median [min, max] | vs " + baseline +
                  " | first batch s | CPU cores | host MB | GPU MB |", "|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["group"] == group):
            if r["error"]:
                lines.append(f"| {r['name']} | {r['mode']} | failed: {r['error'][:80]} | | | | | |")
                continue
            ratio = r["median"] / base[r["mode"]] if base.get(r["mode"]) else float("nan")
            versus = f"{ratio:.2f}x"
            if r.get("ratio") is not None:  # loader_overhead: to the bare pipeline, in the same run
                bare = r["reference_images_per_s"]
                versus = f"{r['ratio']:.3f}x of bare DALI ({float(np.median(bare)):.0f} images/s)"
            noisy = spread_of(r) if spread_of(r) > NOISY else 0.0
            if noisy:  # the protocol's rule (protocol.py): passes this far apart rank nothing
                versus = f"not ranked: spread {noisy:.0%} between passes"
            gpu = f"{r['gpu_peak_mb']:.0f}" if r["gpu_peak_mb"] else "-"
            lines.append(f"| {r['name']} | {r['mode']} | {r['median']:.0f} [{r['min']:.0f}, {r['max']:.0f}] | "
                         f"{versus} | {r['first_batch_s']:.2f} | {r['cpu_cores']:.2f} | "
                         f"{r['host_peak_mb']:.0f} | {gpu} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out_dir: str) -> list[str]:
    """Throughput per loader (bars) and scaling curves; returns the PNG paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    good = [r for r in rows if not r["error"]]
    loaders = [r for r in good if r["group"] in ("loaders", "formats")]
    if loaders:
        fig, ax = plt.subplots(figsize=(9, 0.4 * len(loaders) + 1.5))
        labels = [f"{r['name']} ({r['mode']})" for r in loaders]
        ax.barh(labels, [r["median"] for r in loaders],
                xerr=[[r["median"] - r["min"] for r in loaders], [r["max"] - r["median"] for r in loaders]])
        ax.invert_yaxis()
        ax.set_xlabel("images/s (median of passes; bars: min-max)")
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "throughput.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    curves = {"dali_threads": "threads", "torch_workers": "workers", "batch_size": "batch_size",
              "hw_decoder_load": "hw_decoder_load"}
    present = [(g, k) for g, k in curves.items() if any(r["group"] == g and k in r["params"] for r in good)]
    if present:
        fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 3.2), squeeze=False)
        for ax, (group, key) in zip(axes[0], present):
            pts = sorted((r["params"][key], r["median"]) for r in good if r["group"] == group and
                         key in r["params"] and len(r["params"]) == 1)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
            ax.set_xlabel(key)
            ax.set_ylabel("images/s")
            ax.set_title(group)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "scaling.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def results_dir(root: str, info: dict) -> str:
    """This run's folder, ROOT/<machine>-<date>, or -2, -3... after it when a run before made that one."""
    return fresh_folder(root, f"{machine_tag(info)}-{info['date']}")


RESULT_PREFIX = "BENCH_RESULT "
STEP_PREFIX = "BENCH_STEP "  # a child's line after each step of its case (measure's progress): a bar's tick


def case_steps(timing: Timing) -> int:
    """The steps `measure` reports: the build, first batch and warm-up as one, then each timed pass."""
    return 1 + timing.passes


def run_cases_isolated(cases: list[Case], command: list[str], steps: int) -> list[dict]:
    """Each case in a fresh process (`command --case i`), so that memory, CPU use and warm-up of
    one case do not leak into the next; the child prints its Measurement row. On a terminal each case
    draws a bar of its `steps` on stderr; stdout is left to the report."""
    rows = []
    for i, case in enumerate(cases):
        with tqdm(total=steps, desc=f"[{i + 1}/{len(cases)}] {case.name} ({case.mode})", unit="step",
                  file=sys.stderr, disable=None) as bar:
            rows.append(_run_case(case, [*command, "--case", str(i)], bar.update))
    return rows


def run_cases_here(cases: list[Case], timing: Timing, device: torch.device, steps: int) -> list[dict]:
    """Every case in this process, one after the other: --quick's smoke test, where a child's start (torch and
    DALI imported, about 4 s of CPU) would cost more than its cases. Each case draws its bar, as in a child."""
    rows = []
    for i, case in enumerate(cases):
        with tqdm(total=steps, desc=f"[{i + 1}/{len(cases)}] {case.name} ({case.mode})", unit="step",
                  file=sys.stderr, disable=None) as bar:
            rows.append(measure(case, timing, device, bar.update).row())
    return rows


def _run_case(case: Case, command: list[str], step: Callable[[], object]) -> dict:
    """The row a child process measured, ticking `step` at each of its steps; a failed row if it printed none."""
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: a chatty child cannot block on it
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        row = None
        for line in child.stdout or ():
            if line.startswith(STEP_PREFIX):
                step()
            elif line.startswith(RESULT_PREFIX):
                row = json.loads(line[len(RESULT_PREFIX):])
        returncode = child.wait()
        errors.seek(0)
        if row is None:
            row = Measurement(case.name, case.group, case.mode, case.params,
                              error=f"process failed ({returncode}): {errors.read()[-400:]}").row()
    return row
