"""Every GPU graph proven on a CPU machine, as far as a CPU machine can prove it.

A DALI pipeline with GPU and mixed operators can be *defined* without CUDA, and DALI then checks
argument names and types, and the devices of inputs (GPU data into a CPU or mixed operator, a GPU
node as a named argument). `check_gpu_graph` takes such a pipeline further: it has DALI assemble
and serialize the whole C++ graph without a device (`_dali.serialize_without_device`), which
checks required arguments, then walks the serialized graph for what DALI checks only when it
builds on a GPU, or never:
  * every operator has an implementation for the device it was placed on. DALI 2.4 silently
    places a CPU-only operator fed GPU data on "gpu" (`fn.peek_image_shape(images.gpu())`), and
    such a graph fails only when a GPU builds it;
  * no GPU-to-CPU edge (`.cpu()` of GPU data): legal in DALI 2.4's dynamic executor, but a
    device-to-host copy and a sync every batch;
  * every pipeline output is on the GPU (a CPU output of a GPU pipeline, labels for instance,
    reaches torch in pageable host memory, and its copy to the GPU syncs), except the outputs
    Python reads (the loader's sample ids: GraphVariant.host_outputs), which must stay on the CPU.
Argument *values* are not checked by DALI even on a GPU; graph.py checks them. On a GPU, the GPU tests
check where a built pipeline's outputs really are by their types (`placement_problems`).

`project_graphs(sources)` lists every graph the library builds for device="gpu"; the test
(tests/test_graph_check.py) and the doctor (`python -m dali_pipes.tools.doctor`) both check that list.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from dali_pipes.graph import _dali
from dali_pipes.graph.augment_config import AUTO_AUGMENTS, AugmentConfig
from dali_pipes.run.contract import Contract
from dali_pipes.run.dist import Shard

if TYPE_CHECKING:
    from nvidia.dali import Pipeline

    from dali_pipes.data.source import Source

PrivateApiChanged = _dali.PrivateApiChanged
DECODER_PREFIX = "decoders__Image"  # decoders__Image, decoders__ImageRandomCrop, ...
SIZE_SCHEDULE = {0: 128, 1: 160, 2: 192, 3: 224}  # progressive resizing's sizes (resolution.py), each a graph


@dataclass(frozen=True)
class Edge:
    """A tensor between operators: its name, where it lives, and the argument it feeds, if any."""
    name: str
    device: str
    argument: str = ""


@dataclass(frozen=True)
class OpNode:
    """One operator of the serialized graph: its schema (e.g. "decoders__ImageRandomCrop"), its
    instance name, the device it runs on ("cpu", "gpu", "mixed"), and its edges."""
    schema: str
    name: str
    device: str
    inputs: tuple[Edge, ...] = ()
    outputs: tuple[Edge, ...] = ()


@dataclass(frozen=True)
class GraphReport:
    """A checked graph: its operators, outputs and the problems found (none when it passed)."""
    name: str
    ops: tuple[OpNode, ...]
    outputs: tuple[Edge, ...]
    problems: tuple[str, ...] = ()
    dali_version: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def devices_of(self, schema_prefix: str) -> list[str]:
        """Devices of the operators whose schema starts with `schema_prefix`."""
        return [op.device for op in self.ops if op.schema.startswith(schema_prefix)]

    def summary(self) -> dict:
        """JSON-ready: name, result, operators per device, output devices, problems."""
        per_device: dict[str, int] = {}
        for op in self.ops:
            per_device[op.device] = per_device.get(op.device, 0) + 1
        return {"graph": self.name, "ok": self.ok, "operators": per_device,
                "decoder": self.devices_of(DECODER_PREFIX), "outputs": [e.device for e in self.outputs],
                "problems": list(self.problems), "dali": self.dali_version}


class GraphError(ValueError):
    """A graph that cannot run as meant on a GPU: `where` (the graph), `problems` (every one
    found) and `fix`. Code that needs the parts reads the fields; nothing parses the message."""

    def __init__(self, where: str, problems: list[str], fix: str = "", report: GraphReport | None = None) -> None:
        self.where, self.problems, self.fix, self.report = where, list(problems), fix, report
        super().__init__(str(self))

    def __str__(self) -> str:
        listed = "".join(f"\n  - {p}" for p in self.problems)
        return f"{self.where}: {len(self.problems)} problem(s) in the GPU graph:{listed}" + (
            f"\n{self.fix}" if self.fix else "")

    def __reduce__(self):
        return type(self), (self.where, self.problems, self.fix)


def check_gpu_graph(pipe: Pipeline, name: str = "pipeline", *, outputs_on_gpu: bool = True,
                    host_outputs: tuple[int, ...] = ()) -> GraphReport:
    """Check an unbuilt pipeline defined for a GPU (any device id; no CUDA needed). Returns the
    report, or raises GraphError listing every problem. The pipeline is spent (serialized without
    a device): check a fresh one, never the one to run. Raises PrivateApiChanged when the DALI
    internals this relies on (checked on DALI 2.4.0) have changed."""
    registered = _dali.registered_ops()
    try:
        serialized = _dali.serialize_without_device(pipe)
    except RuntimeError as e:  # DALI's own checks: required arguments, devices, types
        if isinstance(e, PrivateApiChanged):
            raise
        raise GraphError(name, [f"DALI cannot assemble the graph: {_first_line(e)}"]) from e
    ops, outputs = _dali.parse_serialized_graph(serialized)
    report = GraphReport(name, tuple(_op_node(op) for op in ops), tuple(Edge(**o) for o in outputs),
                         dali_version=_dali.dali_version())
    problems = graph_problems(report.ops, report.outputs, registered, outputs_on_gpu=outputs_on_gpu,
                              host_outputs=host_outputs)
    report = replace(report, problems=tuple(problems))
    if problems:
        raise GraphError(name, problems, "Each problem names the operator; a GPU would fail on it or run it "
                         "with a sync per batch.", report)
    return report


def check_defined(name: str, define: Callable[[], Pipeline], **check_args) -> GraphReport:
    """Define a pipeline with `define()` and check it. DALI's definition-time refusals (unknown or
    mistyped arguments, GPU data into a CPU operator, GPU named arguments) become a GraphError."""
    try:
        pipe = define()
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise GraphError(name, [f"DALI refused the definition: {type(e).__name__}: {_first_line(e)}"]) from e
    return check_gpu_graph(pipe, name, **check_args)


def graph_problems(ops: tuple[OpNode, ...], outputs: tuple[Edge, ...], registered: Mapping[str, frozenset],
                   *, outputs_on_gpu: bool = True, host_outputs: tuple[int, ...] = ()) -> list[str]:
    """What DALI checks only on a GPU, or never: implementations per device, GPU-to-CPU edges, and
    (with `outputs_on_gpu`) outputs left on the CPU, except `host_outputs`: outputs made on the CPU
    for Python to read (the loader's sample ids), which must never come from the GPU either."""
    problems = []
    produced = {edge.name: (op, edge.device) for op in ops for edge in op.outputs}
    for op in ops:
        if op.schema not in registered.get(op.device, ()):
            have = [d for d, names in registered.items() if op.schema in names]
            problems.append(f"{op.name} ({op.schema}) is placed on {op.device!r} but DALI has no {op.device} "
                            f"implementation of it (it has: {', '.join(have) or 'none'}); DALI places an operator "
                            f"on the GPU when its input is on the GPU: feed it CPU data")
        for edge in op.inputs:
            source = produced.get(edge.name)
            if source and source[1] == "gpu" and edge.device == "cpu":
                what = f"argument {edge.argument!r}" if edge.argument else "input"
                problems.append(f"GPU-to-CPU edge: {op.name} ({op.schema}, {op.device}) reads {edge.name} from "
                                f"{source[0].name} ({source[0].schema}) on the CPU as its {what}: a device-to-host "
                                f"copy and a sync every batch")
    for i, edge in enumerate(outputs):
        source = produced.get(edge.name)
        if source and source[1] == "gpu" and edge.device == "cpu":
            problems.append(f"GPU-to-CPU edge: pipeline output {i} ({edge.name}) is copied back to the CPU")
        elif i in host_outputs and edge.device != "cpu":
            problems.append(f"pipeline output {i} ({edge.name}) is read in Python (a host output) but is on the "
                            f"{edge.device.upper()}: every batch would be copied back; leave it on the CPU")
        elif outputs_on_gpu and edge.device != "gpu" and i not in host_outputs:
            problems.append(f"pipeline output {i} ({edge.name}, from {source[0].schema if source else '?'}) is on the "
                            f"CPU: it reaches torch in pageable host memory and its copy to the GPU syncs; "
                            f"return it with .gpu()")
    return problems


def _op_node(op: dict) -> OpNode:
    return OpNode(op["schema"], op["name"], op["device"], tuple(Edge(**e) for e in op["inputs"]),
                  tuple(Edge(**e) for e in op["outputs"]))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else repr(error))[:400]


# -- the project's GPU graphs ------------------------------------------------------------------------

@dataclass(frozen=True)
class GraphVariant:
    """A graph the library builds with device="gpu": `define()` returns it unbuilt, for GPU 0;
    `decoder` is where its decoder must run ("mixed": GPU decode; "cpu": hybrid)."""
    name: str
    define: Callable[[], Pipeline] = field(repr=False)
    decoder: str = "mixed"
    host_outputs: tuple[int, ...] = ()  # CPU outputs read in Python (see graph_problems)


def _variant(name: str, source: Source, train: bool, decoder: str = "mixed", *, batch_size: int, device_id: int = 0,
             sample_ids: bool = False, stage: str = "augment", fed: bool = False, **spec_args) -> GraphVariant:
    """One graph as the loader builds it on a GPU: `spec_args` are PipelineSpec fields; `fed`: a sampler's
    drawn order read through sampled.OrderFeed instead of the source's reader."""
    from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs, build_pipeline
    from dali_pipes.run.position import Position
    from dali_pipes.run.sampled import OrderFeed
    load = spec_args.get("augment", AugmentConfig()).hw_decoder_load  # a tuning variant's: the knobs carry it
    spec_args.setdefault("knobs", TunedKnobs.requested(1, 2, load)[0])
    spec = PipelineSpec(contract=Contract(train, batch_size, drop_last=False), device="gpu", device_id=device_id,
                        shuffle_buffer=4, **spec_args)
    feed = OrderFeed(spec.contract, Position()) if fed else None
    return GraphVariant(f"{name} ({'train' if train else 'val'})",
                        lambda: build_pipeline(source, spec, sample_ids=sample_ids, stage=stage, feed=feed), decoder)


def project_graphs(sources: Mapping[str, Source], *, batch_size: int = 2) -> list[GraphVariant]:
    """Every graph the library builds for device="gpu": train and val for each source in `sources`
    (kind -> Source: folder, tfrecord, webdataset) as DaliLoader builds them, then the variants of the
    first source's graph (_variants_of). A new graph variant in the library gets a line here."""
    variant = functools.partial(_variant, batch_size=batch_size)
    out = [variant(kind, source, train) for kind, source in sources.items() for train in (True, False)]
    # As DaliLoader builds them: the pixel guard before the decoder, and sample ids (delivery.py) that
    # stay on the CPU for the loader to read.
    for kind, source in sources.items():
        for train in (True, False):
            loader_graph = variant(f"{kind} as DaliLoader builds it", source, train, sample_ids=True,
                                   max_pixels=100_000_000)
            out.append(replace(loader_graph, host_outputs=(2,)))
        out.append(replace(variant(f"{kind} as DaliLoader builds it, hybrid", source, True, "cpu",
                                   decode_device="cpu", sample_ids=True, max_pixels=100_000_000), host_outputs=(2,)))
    # A sampler other than DistributedSampler (sampled.py): its drawn order's files read by fn.io.file.read
    first = next(iter(sources.values()))
    for train, decoder in ((True, "mixed"), (False, "mixed"), (True, "cpu")):
        out.append(replace(variant(f"a sampler's drawn order{', hybrid' if decoder == 'cpu' else ''}", first, train,
                                   decoder, sample_ids=True, fed=True, max_pixels=100_000_000,
                                   decode_device="cpu" if decoder == "cpu" else None), host_outputs=(2,)))
    return out + _variants_of(first, variant, batch_size) + detection_graphs(batch_size)


def detection_graphs(batch_size: int) -> list[GraphVariant]:
    """The detection graph (graph/detection.py) as DetectionLoader builds it on a GPU: the hflip preset, ssdlite's
    IoU crop (the decoder decodes the window: ROI decode), multiscale's resize, ssd's zoom-out before the crop, and
    the whole ssd preset (its photometric distortion first, on the whole decoded image), and lsj's scale jitter and
    fixed-size crop (a resize, then one padded slice). Its boxes, kept box indices and sample indices stay on the
    CPU, for Python."""
    from dali_pipes.graph.detection import (
        HOST_OUTPUTS,
        DetectionAugment,
        IoUCrop,
        ShortestSize,
        ZoomOut,
        detection_pipeline,
    )
    from dali_pipes.graph.photometric import PhotometricDistort
    from dali_pipes.graph.scale_jitter import FixedSizeCrop, ScaleJitter
    presets = {"hflip": DetectionAugment(flip_prob=0.5, sanitize=(1.0, 1.0)),
               "ssdlite": DetectionAugment(flip_prob=0.5, iou_crop=IoUCrop(), sanitize=(1.0, 1.0)),
               "multiscale": DetectionAugment(flip_prob=0.5, shortest_size=ShortestSize(min_size=(480, 800),
                                                                                        max_size=1333)),
               "ssd geometry": DetectionAugment(flip_prob=0.5, zoom_out=ZoomOut(fill=(123.0, 117.0, 104.0)),
                                                iou_crop=IoUCrop(), sanitize=(1.0, 1.0)),
               "ssd": DetectionAugment(flip_prob=0.5, zoom_out=ZoomOut(fill=(123.0, 117.0, 104.0)),
                                       iou_crop=IoUCrop(), sanitize=(1.0, 1.0), photometric=PhotometricDistort()),
               "lsj": DetectionAugment(flip_prob=0.5, scale_jitter=ScaleJitter(target_size=(64, 64)),
                                       fixed_crop=FixedSizeCrop(size=(64, 64), fill=(123.0, 117.0, 104.0)),
                                       sanitize=(1.0, 1.0))}

    def define(augment: DetectionAugment) -> Callable[[], Pipeline]:
        return lambda: detection_pipeline(_DetectionBatch(batch_size), augment, batch_size=batch_size, device="gpu",
                                          num_threads=1, device_id=0, seed=1)
    return [GraphVariant(f"detection, {name} preset", define(augment), host_outputs=HOST_OUTPUTS)
            for name, augment in presets.items()]


class _DetectionBatch:
    """A detection feed's batch of one small JPEG with two boxes, every iteration: what a GPU run of a checked
    detection graph decodes (tests/test_graph_check.py runs each on a GPU)."""

    def __init__(self, batch_size: int) -> None:
        import io

        import numpy as np
        from PIL import Image
        buffer = io.BytesIO()
        Image.fromarray(np.full((32, 48, 3), 90, np.uint8)).save(buffer, format="JPEG")
        self.jpeg, self.batch_size = np.frombuffer(buffer.getvalue(), np.uint8), batch_size
        self.boxes = np.array([[2, 3, 20, 30], [10, 0, 48, 16]], np.float32)

    def __call__(self, info: object) -> tuple:
        import numpy as np
        n = self.batch_size
        return ([self.jpeg] * n, [self.boxes] * n, [np.arange(2, dtype=np.int32)] * n,
                [np.array([i], np.int64) for i in range(n)])


def _variants_of(first: Source, variant: Callable[..., GraphVariant], batch_size: int) -> list[GraphVariant]:
    """Each auto-augment policy (AugMix included), colour jitter, torchvision-read settings, bicubic resizes,
    random erasing's fills, float16, channels_last, the hybrid decode, a second rank, each size of an image_size
    schedule, and the bad-sample search's decode graph; then _memory_and_tuning_variants."""
    from dali_pipes.run.decode_probe import decode_pipeline
    from dali_pipes.run.recovery import placeholder_jpeg
    out = [variant(f"auto_augment={p}", first, True, augment=AugmentConfig(auto_augment=p)) for p in AUTO_AUGMENTS]
    out.append(variant("color_jitter=0.4", first, True, augment=AugmentConfig(color_jitter=0.4)))
    # DaliLoader(dataset) reads a torchvision transform into these fields (transforms.py): ToTensor without
    # Normalize gives mean 0 / std 1, and the steps' own crop, flip and jitter arguments
    from_transform: dict[str, Any] = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), crop_ratio=0.8,
                                          random_area=(0.5, 1.0), flip_probability=0.3)
    out.append(variant("from a torchvision transform", first, True,
                       augment=AugmentConfig(**from_transform, color_jitter=0.2)))
    out.append(variant("from a torchvision transform", first, False, augment=AugmentConfig(**from_transform)))
    out.append(variant("Resize((h, w)) stretched (val_stretch)", first, False,
                       augment=AugmentConfig(**from_transform, val_stretch=True)))
    # ... and reads images as PIL does (dataloader_args.read_as_pil): no EXIF rotation, 16-bit PNGs decoded at
    # 16 bits and divided per sample (graph.decode_rgb), on the mixed decoder and in the hybrid decode
    # ... and the recipes' steps (transforms.py): bicubic resizes; RandomErasing (_random_erasing_variants)
    for train in (True, False):
        out.append(variant("interpolation=bicubic", first, train, augment=AugmentConfig(interpolation="bicubic")))
    out += _random_erasing_variants(first, variant)
    as_pil = AugmentConfig(**from_transform, exif_orientation=False, png16="pil")
    for train in (True, False):
        out.append(variant("read as PIL reads (no EXIF, png16='pil')", first, train, augment=as_pil))
    out.append(variant("read as PIL reads, hybrid", first, True, "cpu", decode_device="cpu", augment=as_pil))
    for train in (True, False):
        out.append(variant("float16", first, train, augment=AugmentConfig(float16=True)))
        out.append(variant("channels_last", first, train, augment=AugmentConfig(channels_last=True)))
        out.append(variant("hybrid decode_device=cpu", first, train, "cpu", decode_device="cpu"))
    out.append(variant("hybrid + randaugment + jitter + float16 + channels_last", first, True, "cpu",
                       decode_device="cpu", augment=AugmentConfig(auto_augment="randaugment", color_jitter=0.4,
                                                                  float16=True, channels_last=True)))
    out.append(variant("rank 1 of 2", first, True, shard=Shard(1, 2, 1), device_id=1))
    out += _memory_and_tuning_variants(first, variant, batch_size)
    # Progressive resizing: the loader builds one graph per size of its schedule, as for_epoch gives it.
    scheduled = AugmentConfig(image_size=SIZE_SCHEDULE, val_image_size=256)
    out += [variant(f"image_size {scheduled.size_at(epoch)} of the schedule {SIZE_SCHEDULE}", first, True,
                    augment=scheduled.for_epoch(epoch, True)) for epoch in SIZE_SCHEDULE]
    out.append(variant("val_image_size 256 beside a schedule", first, False, augment=scheduled.for_epoch(0, False)))
    out.append(GraphVariant("bad-sample search decode (decode_probe.decode_pipeline)",
                            lambda: decode_pipeline([placeholder_jpeg()] * 2, "gpu", device_id=0)))
    return out


def _random_erasing_variants(first: Source, variant: Callable[..., GraphVariant]) -> list[GraphVariant]:
    """RandomErasing after the normalisation: its three fills, in either layout and precision (its noise and colour
    drawn on the GPU, its rectangle on the CPU), in the hybrid decode, and of a fixed area and ratio."""
    erasing: tuple[tuple[str, dict[str, Any]], ...] = (("const", {}), ("pixel", dict(float16=True,
                                                                                     channels_last=True)), ("rand", {}))
    out = [variant(f"random_erasing_mode={mode}{' float16 channels_last' if extra else ''}", first, True,
                   augment=AugmentConfig(random_erasing=0.25, random_erasing_mode=mode, **extra))
           for mode, extra in erasing]
    out.append(variant("random_erasing hybrid", first, True, "cpu", decode_device="cpu",
                       augment=AugmentConfig(random_erasing=0.25, random_erasing_mode="pixel")))
    out.append(variant("random_erasing of a fixed area and ratio (constants, no uniform draw)", first, True,
                       augment=AugmentConfig(random_erasing=0.25, random_erasing_area=(0.25, 0.25),
                                             random_erasing_ratio=(1.0, 1.0))))
    return out


def _memory_and_tuning_variants(first: Source, variant: Callable[..., GraphVariant],
                                batch_size: int) -> list[GraphVariant]:
    """The decoders' preallocation sized to the data or none, the val cache's uint8 graph, profile's decode stage,
    and the graphs online tuning rebuilds: thread counts and hw_decoder_loads."""
    from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs, build_pipeline
    from dali_pipes.run.trials import HW_LOADS
    out: list[GraphVariant] = []
    # The GPU decoders' preallocation: sized to the data (a conversion manifest's box, or the flag), or none
    # (0x0: DALI allocates on first use); the default, ImageNet's largest image, is every other graph's.
    for hint in ((640, 480), (0, 0)):
        out += [variant(f"decoder_size_hint {hint[0]}x{hint[1]}", first, train, augment=AugmentConfig(
            decoder_size_hint=hint)) for train in (True, False)]
    # The val cache's graph (val_cache.py): val's resize and centre crop, uint8, normalised by the loader
    out.append(variant("val uint8 for the val cache", first, False, normalize=False))
    out.append(variant("val uint8 for the val cache, hybrid", first, False, "cpu", decode_device="cpu",
                       normalize=False))
    out.append(variant("val uint8 for the val cache, channels_last", first, False, normalize=False,
                       augment=AugmentConfig(channels_last=True)))
    # dali-pipes profile's decode stage (the whole image, nothing after), and DaliLoader's online tuning:
    # a thread count sets the mixed decoder's per-thread memory paddings (graph/decoders.decoder_paddings).
    out.append(variant("profile's decode stage", first, True, stage="decode"))
    out.append(variant("profile's decode stage, hybrid", first, True, "cpu", decode_device="cpu", stage="decode"))
    for threads in (2, 8, 64):
        out.append(replace(variant(f"num_threads={threads} (tuning)", first, True),
                           define=functools.partial(build_pipeline, first, PipelineSpec(
                               contract=Contract(True, batch_size, drop_last=False), device="gpu",
                               knobs=TunedKnobs(num_threads=threads), device_id=0, shuffle_buffer=4))))
    # ... and hw_decoder_load="auto": each load it tries is a decoder argument, so a graph of its own (train and val)
    for load in HW_LOADS:
        for train in (True, False):
            out.append(variant(f"hw_decoder_load={load} (tuning)", first, train,
                               augment=AugmentConfig(hw_decoder_load=load)))
    return out


def check_variant(variant: GraphVariant) -> GraphReport:
    """Check one project graph, and that its decoders (two with png16="pil": one per branch) run where the
    variant says."""
    report = check_defined(variant.name, variant.define, host_outputs=variant.host_outputs)
    decoders = report.devices_of(DECODER_PREFIX)
    if not decoders or set(decoders) != {variant.decoder}:
        raise GraphError(variant.name, [f"decoder devices {decoders}, expected [{variant.decoder!r}]"], report=report)
    return report


# -- on a GPU: where a built pipeline's outputs really are --------------------------------------------------

def placement_problems(outputs: Sequence, host_outputs: tuple[int, ...] = ()) -> list[str]:
    """Where outputs really are, told by their types: a built pipeline's run() (DALI TensorLists) or a loader's
    batch (torch tensors). Each must be on the GPU (TensorListGPU, a CUDA tensor) except `host_outputs`, made on
    the CPU for Python to read (GraphVariant.host_outputs: the loader's sample ids), which must be on the CPU
    (TensorListCPU, a CPU tensor). Never `hasattr(out, "as_cpu")`: DALI 2.4's CPU lists have as_cpu() too."""
    import torch
    from nvidia.dali.tensors import TensorListCPU, TensorListGPU
    problems = [f"host output {i} is missing: there are {len(outputs)} outputs"
                for i in sorted(set(host_outputs) - set(range(len(outputs))))]
    for i, out in enumerate(outputs):
        if isinstance(out, (TensorListCPU, TensorListGPU)):
            on_gpu = isinstance(out, TensorListGPU)
        elif isinstance(out, torch.Tensor):
            on_gpu = out.device.type == "cuda"
        else:
            problems.append(f"output {i} is a {type(out).__name__}: neither a DALI TensorList nor a torch tensor")
            continue
        if on_gpu == (i in host_outputs):
            want = "on the CPU (a host output, read in Python)" if i in host_outputs else "on the GPU"
            where = f" on {out.device}" if isinstance(out, torch.Tensor) else ""
            problems.append(f"output {i} is a {type(out).__name__}{where}, expected {want}")
    return problems
