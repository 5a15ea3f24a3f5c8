"""Decode + augment graphs: plain functions of DALI DataNodes, one code path for CPU and GPU.

Where each step runs (`device`, `decode_device`):
  * "gpu", "gpu" (the default for gpu): DALI's mixed decoder (the host parses, nvJPEG or the GPU's
    hardware JPEG decoder decodes), then resize, augmentation and normalisation on the GPU;
  * "gpu", "cpu" (hybrid): libjpeg-turbo decodes on the CPU threads (in train only the random crop's
    region), the decoded crop moves to the GPU, and the rest runs there. NVIDIA's ConvNets examples
    run this way when the GPU's decoders are the bottleneck;
  * "cpu", "cpu": the same graph on CPU operators. "cpu" with a GPU decode is refused.

DALI is imported inside the functions, never at module level: `import nvidia.dali` takes 0.7-0.8 s
(measured on this project's 2-core machine) and loads libdali, while this module's dataclass is
imported by every command, converters, `verify` and `--help` included, that never builds a pipeline.

Every operator that draws random numbers has a name of its own ("RandomCrop", "Flip", ...): a DALI
checkpoint names operators, and DALI's generated names shift when an operator is added before them
(dali_checkpoint.py). DALI's auto_aug policies name theirs themselves, by place.

DALI checks argument names and types when a graph is defined, not their values: a `hw_decoder_load`
of 1.5 or a negative padding is accepted even on a GPU, and a 2-value mean passes definition and
serialization. The values are checked here, before DALI sees them (`AugmentConfig.__post_init__`,
`check_decoder_args`); tests/test_graph_check.py has a case for each.
"""

from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from dali_pipes.graph import resolution
from dali_pipes.graph.resolution import ImageSize
from dali_pipes.options import auto_or_fraction, option, written_as

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTO_AUGMENTS = ("autoaugment", "randaugment", "trivialaugment", "augmix")
INTERPOLATIONS = ("bilinear", "bicubic")
ERASING_MODES = ("const", "pixel", "rand")
DEVICES = ("gpu", "cpu")
PNG16_MODES = ("pil", "scale")

# nvJPEG buffers of the mixed decoders. DALI preallocates them *per CPU thread*: one device buffer of
# `device_memory_padding` and two pinned host buffers of `host_memory_padding` per thread. DALI's
# ResNet-50 example pads 211 MB / 140 MB, sized for ImageNet's largest image; per thread, at 16
# threads that is 3.4 GB of GPU memory and 4.5 GB of pinned host memory per process. Here the
# example's sizes are a budget per *process*, split across the threads, and no thread gets less
# than DALI's own defaults (16 MiB / 8 MiB: a 5-Mpixel RGB image, larger than all but a handful of
# ImageNet's images). A larger image makes its thread grow the buffer once (one allocation, then
# reused), which is what the padding only postpones. A GPU run should confirm the sizes: the
# doctor's throughput runs report peak GPU memory.
DEVICE_PADDING_BUDGET = 211_025_920
HOST_PADDING_BUDGET = 140_544_512
DALI_DEFAULT_DEVICE_PADDING = 16 * 2**20
DALI_DEFAULT_HOST_PADDING = 8 * 2**20
MAX_PADDING = 4 * 2**30  # per thread; more is a unit mistake (bytes, not pixels or MB)
HW_DECODER_WIDTH_HINT, HW_DECODER_HEIGHT_HINT = 5980, 6430  # ImageNet's largest image (DALI's example)
JPEG_MAX_SIDE = 65535
AUGMIX_BINS = 10  # torchvision's AugMix divides each magnitude range into 10 bins (its _PARAMETER_MAX)
ERASE_ATTEMPTS = 10  # torchvision's and timm's RandomErasing try 10 rectangles, then leave the image as it is
AUTO_LOAD = "auto"  # hw_decoder_load="auto": a GPU loader tries run/tuning.HW_LOADS online, starting here:
DEFAULT_HW_LOAD = 0.65  # DALI's own default; "auto" reads as it wherever nothing tunes it (a CPU decode, profile)
# What is preallocated can be sized to the data (AugmentConfig.decoder_size_hint): the hardware decoder's
# width and height hints to the box around the data's images, and each thread's paddings to one decoded RGB
# image of that box (never above the budget's share). Where the data's sizes are not known (no conversion
# manifest lists them) the hints stay ImageNet's largest image, as above; (0, 0) preallocates nothing, and
# DALI allocates on first use, sized to the images met (its own default).


def parse_size_hint(text: str) -> tuple[int, int]:
    """"6000x4000" -> (6000, 4000): a width x height flag value."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT in pixels, e.g. 6000x4000 (0x0: "
                                         f"preallocate nothing)") from None
    return width, height


# a config file (python -m train --config WORKDIR/args.json) holds these flags' values parsed: their flag text
written_as(parse_size_hint, lambda hint: f"{hint[0]}x{hint[1]}")
written_as(resolution.parse_image_size, resolution.schedule_text)


@dataclass(frozen=True)
class AugmentConfig:
    """The decode + augment graph's settings; every field is also a flag (config.add_arguments)."""
    image_size: ImageSize = option(224, "output side in pixels (train crop, val centre crop), or a train schedule "
                                   "EPOCH:SIZE,... from epoch 0 (progressive resizing), e.g. 0:160,10:192,16:224",
                                   type=resolution.parse_image_size)
    val_image_size: int | None = option(None, "val centre-crop side in pixels (default: the last size of "
                                        "--image-size)", type=int)
    random_area: tuple[float, float] = option((0.08, 1.0), "train: random-resized-crop area fraction, low high")
    random_aspect_ratio: tuple[float, float] = option((3 / 4, 4 / 3), "train: random-resized-crop aspect ratio range")
    flip_probability: float = option(0.5, "train: probability of a horizontal flip")
    color_jitter: float = option(0.0, "train: brightness/contrast/saturation drawn in 1 +- this (0: off)")
    auto_augment: str | None = option(None, "train: an AutoAugment-family policy (DALI auto_aug; augmix: torchvision's "
                                      "AugMix composed of DALI's auto_aug operations)", type=str,
                                      choices=(*AUTO_AUGMENTS, None))
    augmix_severity: int = option(3, "train, augmix: magnitudes drawn from the first SEVERITY of 10 bins")
    augmix_width: int = option(3, "train, augmix: augmentation chains mixed per image")
    augmix_depth: int = option(-1, "train, augmix: operations per chain (-1: 1 to 3, drawn per chain)")
    augmix_alpha: float = option(1.0, "train, augmix: concentration of the Beta / Dirichlet mixing weights")
    random_erasing: float = option(0.0, "train: probability of erasing one random rectangle per image, after "
                                   "normalisation (torchvision's and timm's RandomErasing; 0: off)")
    random_erasing_area: tuple[float, float] = option((0.02, 0.33), "train: erased area as a fraction of the "
                                                      "image, low high")
    random_erasing_ratio: tuple[float, float] = option((0.3, 3.3), "train: erased rectangle's height / width, "
                                                       "low high (drawn log-uniform)")
    random_erasing_mode: str = option("const", "train: what fills an erased rectangle: const (random_erasing_value), "
                                      "pixel (per-pixel N(0, 1) noise: torchvision's value='random'), rand (one "
                                      "N(0, 1) colour per rectangle)", choices=ERASING_MODES)
    random_erasing_value: tuple[float, float, float] = option((0.0, 0.0, 0.0), "train: const erasing's fill per "
                                                              "channel, in normalised units (0: the mean colour)")
    interpolation: str = option("bilinear", "resize filter of the train crop and the val resize, antialiased as "
                                "PIL's: bilinear or bicubic (timm's default)", choices=INTERPOLATIONS)
    crop_ratio: float = option(0.875, "val: resize the shorter side to image_size / crop_ratio, then centre-crop")
    val_stretch: bool = option(False, "val: resize both sides to image_size / crop_ratio, the aspect ratio not "
                               "kept (torchvision's Resize((h, w)), a ViT image processor's), not the shorter side")
    mean: tuple[float, float, float] = option(IMAGENET_MEAN, "normalisation mean per channel, on the [0, 1] scale")
    std: tuple[float, float, float] = option(IMAGENET_STD, "normalisation std per channel, on the [0, 1] scale")
    channels_last: bool = option(False, "NHWC memory (the logical shape stays N,3,H,W): faster convs on GPU")
    float16: bool = option(False, "float16 output instead of float32: half the bytes to move")
    hw_decoder_load: float | str = option(DEFAULT_HW_LOAD, "gpu: share of images sent to the hardware JPEG decoder "
                                          "(A100/H100); auto: tried online among 0, 0.65 and 0.99 in the first "
                                          "epoch (a decoder change may alter pixels by rounding)",
                                          type=auto_or_fraction)
    decoder_size_hint: tuple[int, int] | None = option(
        None, "gpu: WIDTHxHEIGHT the GPU decoders preallocate for (the hardware decoder's hints; the per-thread "
        "paddings to one such RGB image); 0x0: nothing, allocated on first use. default: the box around the data's "
        "images where its conversion manifest lists it, else ImageNet's largest image (5980x6430)",
        type=parse_size_hint)
    # How images are read where DALI and PIL differ. None: the loader's form decides (DaliLoader(dataset) reads
    # as DataLoader + PIL; a location keeps DALI's way); the graph reads None as DALI's way.
    exif_orientation: bool | None = option(None, "rotate JPEGs as their EXIF orientation tag says (DALI's way); "
                                           "--no-exif-orientation: as stored (PIL's, DataLoader's). default: PIL's "
                                           "for a dataset object, DALI's for a location", type=bool)
    png16: str | None = option(None, "16-bit PNGs: 'pil' as PIL reads them (grey clipped at 255, colour's high "
                               "byte; those images are decoded at 16 bits), 'scale' DALI's (x 255/65535, rounded). "
                               "default: 'pil' for a dataset object that lists .png files, else 'scale'", type=str,
                               choices=(*PNG16_MODES, None))

    def __post_init__(self) -> None:
        problems = augment_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        object.__setattr__(self, "image_size", resolution.normalized(self.image_size))  # one form (resolution.py)

    def size_at(self, epoch: int) -> int:
        """The train size of epoch `epoch` under the image_size schedule."""
        return resolution.size_at(self.image_size, epoch)

    @property
    def val_size(self) -> int:
        """The val centre-crop side: val_image_size, or the schedule's last size."""
        return self.val_image_size or resolution.last_size(self.image_size)

    def for_epoch(self, epoch: int, train: bool) -> "AugmentConfig":
        """The settings of one pipeline: image_size the one size its graph has in epoch `epoch`."""
        size = self.size_at(epoch) if train else self.val_size
        return self if size == self.image_size else replace(self, image_size=size, val_image_size=None)


def augment_problems(cfg: AugmentConfig) -> list[str]:
    """Every value of `cfg` that DALI would accept silently (or fail on deep inside a run)."""
    problems = []
    problems += resolution.schedule_problems(cfg.image_size)
    val = cfg.val_image_size
    if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
        problems.append(f"val_image_size must be a positive integer or None, got {cfg.val_image_size!r}")
    if cfg.auto_augment not in (None, *AUTO_AUGMENTS):
        problems.append(f"auto_augment must be one of {AUTO_AUGMENTS} or None, got {cfg.auto_augment!r}")
    low_high = _pair(cfg.random_area)
    if not low_high or not 0 < low_high[0] <= low_high[1] <= 1:
        problems.append(f"random_area must be (low, high) with 0 < low <= high <= 1, got {cfg.random_area}")
    low_high = _pair(cfg.random_aspect_ratio)
    if not low_high or not 0 < low_high[0] <= low_high[1]:
        problems.append(f"random_aspect_ratio must be (low, high) with 0 < low <= high, got {cfg.random_aspect_ratio}")
    if not _number(cfg.flip_probability) or not 0 <= cfg.flip_probability <= 1:
        problems.append(f"flip_probability must be in [0, 1], got {cfg.flip_probability!r}")
    if not _number(cfg.color_jitter) or not 0 <= cfg.color_jitter < 1:
        problems.append(f"color_jitter must be in [0, 1) (factors drawn in 1 +- it stay positive), "
                        f"got {cfg.color_jitter!r}")
    if not _number(cfg.crop_ratio) or not 0 < cfg.crop_ratio <= 1:
        problems.append(f"crop_ratio must be in (0, 1], got {cfg.crop_ratio!r}")
    problems += _normalisation_problems(cfg.mean, cfg.std)
    problems += _recipe_problems(cfg)
    if cfg.hw_decoder_load != AUTO_LOAD and not _fraction(cfg.hw_decoder_load):
        problems.append(f"hw_decoder_load must be in [0, 1] or 'auto', got {cfg.hw_decoder_load!r}")
    hint = cfg.decoder_size_hint
    if hint is not None and not _size_hint(hint):
        problems.append(f"decoder_size_hint must be (width, height) in pixels, both in [1, {JPEG_MAX_SIDE}] or both 0 "
                        f"(preallocate nothing), or None, got {hint!r}")
    if cfg.exif_orientation is not None and not isinstance(cfg.exif_orientation, bool):
        problems.append(f"exif_orientation must be True, False or None, got {cfg.exif_orientation!r}")
    if cfg.png16 not in (None, *PNG16_MODES):
        problems.append(f"png16 must be one of {PNG16_MODES} or None, got {cfg.png16!r}")
    return problems


def _recipe_problems(cfg: AugmentConfig) -> list[str]:
    """AugMix's, random erasing's and the resize filter's values (the graph draws with them per sample)."""
    problems = []
    if cfg.interpolation not in INTERPOLATIONS:
        problems.append(f"interpolation must be one of {INTERPOLATIONS}, got {cfg.interpolation!r}")
    for name, low in (("augmix_severity", 1), ("augmix_width", 1)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= AUGMIX_BINS:
            problems.append(f"{name} must be an integer in [{low}, {AUGMIX_BINS}], got {value!r}")
    depth = cfg.augmix_depth
    if isinstance(depth, bool) or not isinstance(depth, int) or not (depth == -1 or 1 <= depth <= AUGMIX_BINS):
        problems.append(f"augmix_depth must be -1 (1 to 3 per chain) or an integer in [1, {AUGMIX_BINS}], "
                        f"got {depth!r}")
    if not _number(cfg.augmix_alpha) or cfg.augmix_alpha <= 0:
        problems.append(f"augmix_alpha must be > 0, got {cfg.augmix_alpha!r}")
    if not _number(cfg.random_erasing) or not 0 <= cfg.random_erasing <= 1:
        problems.append(f"random_erasing must be a probability in [0, 1], got {cfg.random_erasing!r}")
    low_high = _pair(cfg.random_erasing_area)
    if not low_high or not 0 < low_high[0] <= low_high[1] <= 1:
        problems.append(f"random_erasing_area must be (low, high) with 0 < low <= high <= 1, got "
                        f"{cfg.random_erasing_area}")
    low_high = _pair(cfg.random_erasing_ratio)
    if not low_high or not 0 < low_high[0] <= low_high[1]:
        problems.append(f"random_erasing_ratio must be (low, high) with 0 < low <= high, got "
                        f"{cfg.random_erasing_ratio}")
    if cfg.random_erasing_mode not in ERASING_MODES:
        problems.append(f"random_erasing_mode must be one of {ERASING_MODES}, got {cfg.random_erasing_mode!r}")
    value = tuple(cfg.random_erasing_value) if isinstance(cfg.random_erasing_value, (tuple, list)) else ()
    if len(value) != 3 or not all(_number(v) for v in value):
        problems.append(f"random_erasing_value must be 3 finite numbers (R, G, B), got {cfg.random_erasing_value!r}")
    return problems


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _fraction(x) -> bool:
    return _number(x) and 0 <= x <= 1


def hw_load(cfg: AugmentConfig) -> float:
    """The mixed decoder's hw_decoder_load: "auto" reads as DEFAULT_HW_LOAD (the loader's tuning replaces it
    before a graph is built; a graph built outside the loader runs the default)."""
    return DEFAULT_HW_LOAD if cfg.hw_decoder_load == AUTO_LOAD else float(cfg.hw_decoder_load)


def _size_hint(hint) -> bool:
    sides = tuple(hint) if isinstance(hint, (tuple, list)) else ()
    if len(sides) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in sides):
        return False
    return sides == (0, 0) or all(1 <= v <= JPEG_MAX_SIDE for v in sides)


def _pair(values) -> tuple[float, float] | None:
    try:
        low, high = values
    except (TypeError, ValueError):
        return None
    return (low, high) if _number(low) and _number(high) else None


def _normalisation_problems(mean, std) -> list[str]:
    problems = []
    for name, given in (("mean", mean), ("std", std)):
        values = tuple(given) if isinstance(given, (tuple, list)) else ()
        if len(values) != 3 or not all(_number(v) for v in values):
            problems.append(f"{name} must be 3 finite numbers (R, G, B), got {given!r}")
        elif any(v > 1 for v in values):
            problems.append(f"{name} is on the [0, 1] scale, got {values}; divide 0-255 values by 255")
        elif name == "mean" and any(v < 0 for v in values):
            problems.append(f"mean values must be in [0, 1], got {values}")
        elif name == "std" and any(v <= 0 for v in values):
            problems.append(f"std values must be > 0 (they divide), got {values}")
    return problems


def resolve_decode_device(device: str, decode_device: str | None) -> str:
    """Where the decoder runs: `decode_device`, or `device` when None. A GPU decode feeding a CPU
    pipeline is refused (the decoded images would come back to the host every batch)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    decode_device = decode_device or device
    if decode_device not in DEVICES:
        raise ValueError(f"decode_device must be one of {DEVICES} or None, got {decode_device!r}")
    if device == "cpu" and decode_device == "gpu":
        raise ValueError("decode_device='gpu' needs device='gpu': a GPU decode cannot feed a CPU pipeline. "
                         "For CPU decoding with GPU augmentation use device='gpu', decode_device='cpu'")
    return decode_device


def decoder_paddings(num_threads: int, size_hint: tuple[int, int] | None = None) -> tuple[int, int]:
    """(device_memory_padding, host_memory_padding) per thread: the per-process budget split across
    `num_threads`, never below DALI's defaults (see DEVICE_PADDING_BUDGET); with a `size_hint` (width, height)
    no more than one decoded RGB image of that size, (0, 0) none at all."""
    threads = max(1, num_threads)
    device, host = (max(DALI_DEFAULT_DEVICE_PADDING, DEVICE_PADDING_BUDGET // threads),
                    max(DALI_DEFAULT_HOST_PADDING, HOST_PADDING_BUDGET // threads))
    if size_hint is None:
        return device, host
    image = size_hint[0] * size_hint[1] * 3
    return min(device, image), min(host, image)


def check_decoder_args(args: dict) -> dict:
    """Check the decoder arguments DALI never checks by value; returns `args` unchanged."""
    for key in ("device_memory_padding", "host_memory_padding"):
        value = args.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PADDING:
            raise ValueError(f"{key} must be a byte count in [0, {MAX_PADDING}] per thread, got {value!r}")
    for key in ("preallocate_width_hint", "preallocate_height_hint"):
        value = args.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= JPEG_MAX_SIDE:
            raise ValueError(f"{key} must be a side in pixels in [0, {JPEG_MAX_SIDE}], got {value!r}")
    load = args.get("hw_decoder_load", 0.0)
    if not _number(load) or not 0 <= load <= 1:
        raise ValueError(f"hw_decoder_load must be in [0, 1], got {load!r}")
    return args


def decoder_args(decode_device: str, cfg: AugmentConfig, num_threads: int) -> dict:
    """Keywords for DALI's image decoders on `decode_device` ("gpu": the mixed decoder)."""
    from nvidia.dali import types
    # Fancy upsampling makes the mixed decoder upsample chroma as libjpeg-turbo does, so GPU and CPU
    # decodes agree at colour edges. DALI 2.4 accepts it on both backends; it changes only the mixed one.
    # adjust_orientation: False reads a JPEG as stored, as PIL does (DataLoader's ImageFolder applies no EXIF tag)
    args: dict[str, Any] = dict(device="mixed" if decode_device == "gpu" else "cpu",
                                output_type=types.DALIImageType.RGB, jpeg_fancy_upsampling=True,
                                adjust_orientation=cfg.exif_orientation is not False)
    if decode_device == "gpu":
        device_padding, host_padding = decoder_paddings(num_threads, cfg.decoder_size_hint)
        width, height = cfg.decoder_size_hint or (HW_DECODER_WIDTH_HINT, HW_DECODER_HEIGHT_HINT)
        args.update(device_memory_padding=device_padding, host_memory_padding=host_padding,
                    hw_decoder_load=hw_load(cfg), preallocate_width_hint=width, preallocate_height_hint=height)
    return check_decoder_args(args)


def decode_rgb(decoder: Callable[..., DataNode], jpegs: DataNode, cfg: AugmentConfig, decode_device: str,
               **args) -> DataNode:
    """`decoder` (one of DALI's image decoders) of `jpegs` with `args` and decoder_args: uint8 RGB HWC.

    png16="pil" reads 16-bit PNGs as PIL's convert("RGB") does, which DALI's uint8 decode cannot: PIL clips
    16-bit grey (mode I;16) at 255 and keeps the high byte of colour (and of grey + alpha); DALI scales each
    16-bit image by 255/65535, rounded. Those samples alone (a per-sample `if`: the pipeline is built with
    enable_conditionals, pipeline.py) are decoded at 16 bits and divided as their PNG header says; every
    other image takes the plain decode. tests/test_dataloader_args.py checks it against PIL, pixel for pixel."""
    from nvidia.dali import fn, types
    args.update(decoder_args(decode_device, cfg, _pipeline_threads()))
    if cfg.png16 != "pil":
        return decoder(jpegs, **args)
    # A PNG: 8-byte signature, then IHDR: length, "IHDR", width, height, bit depth (byte 24), colour type (25)
    head = fn.slice(jpegs, [0], [26], axes=[0], out_of_bounds_policy="pad", fill_values=0)
    if (head[0] == 0x89) & (head[1] == 0x50) & (head[24] == 16):  # a branch's operator needs a name of its own
        wide = {**args, "name": args["name"] + "16"} if "name" in args else args
        images = _as_pil_reduces(decoder(jpegs, dtype=types.DALIDataType.UINT16, **wide), grey=head[25] == 0)
    else:
        images = decoder(jpegs, **args)
    return images


def _as_pil_reduces(images: DataNode, grey: DataNode) -> DataNode:
    """16-bit images to uint8 as PIL reduces them: grey (mode I;16) clipped at 255, else the high byte."""
    from nvidia.dali import fn, types
    from nvidia.dali import math as dmath
    divisor = 256 - 255 * fn.cast(grey, dtype=types.DALIDataType.INT32)
    return fn.cast(dmath.min(images // divisor, 255), dtype=types.DALIDataType.UINT8)


def _pipeline_threads() -> int:
    """CPU threads of the pipeline being defined (decoder paddings are per thread)."""
    from nvidia.dali import Pipeline
    pipe = Pipeline.current()
    return pipe.num_threads if pipe is not None and pipe.num_threads else 1


def _normalize(images: DataNode, cfg: AugmentConfig, uint8: bool = False, **crop_args) -> DataNode:
    """Crop (optional), flip (optional), normalise, lay out: the last step of both graphs. `uint8`: the same
    crop and layout, not normalised (the val cache's graph: the loader normalises, val_cache.normalized)."""
    from nvidia.dali import fn, types
    layout = "HWC" if cfg.channels_last else "CHW"
    if uint8:
        return fn.crop_mirror_normalize(images, dtype=types.DALIDataType.UINT8, output_layout=layout, **crop_args)
    return fn.crop_mirror_normalize(
        images, dtype=types.DALIDataType.FLOAT16 if cfg.float16 else types.DALIDataType.FLOAT, output_layout=layout,
        mean=[m * 255 for m in cfg.mean], std=[s * 255 for s in cfg.std], **crop_args)


def train_augment(jpegs: DataNode, cfg: AugmentConfig, device: str = "cpu",
                  decode_device: str | None = None) -> DataNode:
    """Random-resized-crop decode (only the crop's region is decoded), resize to image_size,
    optional colour jitter and AutoAugment-family policy (AugMix included), flip, normalise, optional
    random erasing. Returns float CHW (HWC with channels_last) images on `device`."""
    from nvidia.dali import fn
    if not isinstance(cfg.image_size, int):
        raise ValueError(f"train_augment builds one size, got the schedule {cfg.image_size}: pass "
                         f"cfg.for_epoch(epoch, train=True)")
    decode_device = resolve_decode_device(device, decode_device)
    images = decode_rgb(fn.decoders.image_random_crop, jpegs, cfg, decode_device, name="RandomCrop",
                        random_area=list(cfg.random_area),
                        random_aspect_ratio=list(cfg.random_aspect_ratio), num_attempts=100)
    if device == "gpu":
        images = images.gpu()  # hybrid: the decoded crop moves once; a no-op after the mixed decoder
    # ignore: DALI's stub (2.4) gives fn.resize a node, a sequence or None; one node in is one node out
    images = fn.resize(images, resize_x=cfg.image_size, resize_y=cfg.image_size,  # type: ignore[assignment]
                       interp_type=_interp(cfg), antialias=True)
    if cfg.color_jitter:
        jitter = lambda name: fn.random.uniform(range=[1 - cfg.color_jitter, 1 + cfg.color_jitter], name=name)
        images = fn.color_twist(images, brightness=jitter("Brightness"), contrast=jitter("Contrast"),
                                saturation=jitter("Saturation"))
    if cfg.auto_augment == "augmix":
        images = _augmix(images, cfg, cfg.image_size)
    elif cfg.auto_augment:
        images = _auto_augment(images, cfg.auto_augment)
    mirror = fn.random.coin_flip(probability=cfg.flip_probability, name="Flip") if cfg.flip_probability else 0
    images = _normalize(images, cfg, mirror=mirror)
    return _random_erasing(images, cfg, cfg.image_size) if cfg.random_erasing else images


def _types() -> Any:
    """nvidia.dali.types, typed Any: its enums (INT32, INTERP_CUBIC, ...) come from a compiled module that type
    checkers cannot see."""
    from nvidia.dali import types
    return types


def _interp(cfg: AugmentConfig) -> Any:
    """DALI's filter for the resizes. With antialias=True DALI widens it by the scale when it shrinks, as PIL
    does for its BILINEAR and BICUBIC (Keys' cubic, a = -0.5, in both)."""
    types = _types()
    return types.INTERP_CUBIC if cfg.interpolation == "bicubic" else types.INTERP_LINEAR


def erase_region(size: int, cfg: AugmentConfig) -> tuple[DataNode, DataNode]:
    """(anchor, shape), each (y, x) float per sample: torchvision's RandomErasing rectangle on a size x size
    image. Up to ERASE_ATTEMPTS draws of area (uniform in random_erasing_area, a share of the image) and
    height / width (log-uniform in random_erasing_ratio), h = round(sqrt(area * ratio)), w = round(sqrt(area /
    ratio)); the first with h < size and w < size is placed uniformly, top-left in [0, size - h] x [0, size - w].
    All attempts are drawn at once and the first valid one picked by weight (2^-k), as DALI has no loop; a
    sample not erased (probability 1 - random_erasing, or no valid attempt) gets a 0 x 0 rectangle."""
    import numpy as np
    from nvidia.dali import fn
    from nvidia.dali import math as dmath
    types = _types()
    (low, high), ratio = cfg.random_erasing_area, cfg.random_erasing_ratio
    area = _uniform(low * size * size, high * size * size, name="EraseArea")
    aspect = dmath.exp(_uniform(math.log(ratio[0]), math.log(ratio[1]), name="EraseRatio"))
    h, w = dmath.floor(dmath.sqrt(area * aspect) + 0.5), dmath.floor(dmath.sqrt(area / aspect) + 0.5)
    first = types.Constant(np.array([2.0 ** -k for k in range(ERASE_ATTEMPTS)], np.float32))
    weights = ((h < size) & (w < size)) * first
    best = fn.reductions.max(weights)
    chosen = (weights == best) & (best > 0)  # one-hot of the first valid attempt, all 0 when none is
    erase = fn.random.coin_flip(probability=cfg.random_erasing, name="Erase")
    h, w = fn.reductions.sum(chosen * h) * erase, fn.reductions.sum(chosen * w) * erase
    place = fn.random.uniform(range=[0, 1], shape=[2], name="ErasePlace")
    top, left = dmath.floor(place[0] * (size - h + 1)), dmath.floor(place[1] * (size - w + 1))
    return (fn.cast(fn.stack(top, left), dtype=types.FLOAT), fn.cast(fn.stack(h, w), dtype=types.FLOAT))


def _uniform(low: float, high: float, name: str) -> DataNode:
    """ERASE_ATTEMPTS draws uniform in [low, high); a fixed value where low == high, which the checks allow
    (torchvision's RandomErasing takes scale=(a, a)) and DALI's range refuses ("end > start")."""
    from nvidia.dali import fn
    if low == high:
        return fn.random.uniform(values=[float(low)], shape=[ERASE_ATTEMPTS], name=name)
    return fn.random.uniform(range=[low, high], shape=[ERASE_ATTEMPTS], name=name)


def _random_erasing(images: DataNode, cfg: AugmentConfig, size: int) -> DataNode:
    """torchvision's / timm's RandomErasing after normalisation on size x size images: one rectangle
    (erase_region) filled with random_erasing_value (const), per-pixel N(0, 1) noise (pixel) or one N(0, 1)
    colour (rand)."""
    from nvidia.dali import fn
    types = _types()
    anchor, shape = erase_region(size, cfg)
    erase = lambda data, fill: fn.erase(data, anchor=anchor, shape=shape, axis_names="HW", fill_value=fill)
    if cfg.random_erasing_mode == "const":
        return erase(images, list(cfg.random_erasing_value))
    if cfg.random_erasing_mode == "rand":
        return erase(images, fn.random.normal(shape=[3], name="EraseColour"))
    noise = fn.reshape(fn.random.normal(images, name="EraseNoise"), layout="HWC" if cfg.channels_last else "CHW")
    inside = noise - erase(noise, 0.0)  # the noise in the rectangle, exact zeros outside
    outside = fn.cast(erase(images, 0.0), dtype=types.FLOAT)  # DALI's arithmetic takes no float16
    return fn.cast_like(outside + inside, images)


def augmix_weights(alpha: float, width: int) -> tuple[DataNode, list]:
    """(the original image's weight, one weight per chain), per sample, summing to 1: torchvision's AugMix
    draws m ~ Dirichlet(alpha, alpha) for (original, chains) and the chains' shares ~ Dirichlet(alpha, ...,
    alpha); DALI has Beta, so the shares are drawn by stick-breaking (share i ~ Beta(alpha, (width - 1 - i) *
    alpha) of what is left), which gives that Dirichlet exactly."""
    from nvidia.dali import fn
    original = fn.random.beta(alpha=alpha, beta=alpha, name="AugMixOriginal")
    left, shares = 1.0 - original, []
    for i in range(width - 1):
        share = fn.random.beta(alpha=alpha, beta=alpha * (width - 1 - i), name=f"AugMixShare{i}")
        shares.append(left * share)
        left = left * (1.0 - share)
    return original, shares + [left]


def augmix_operations(size: int) -> list:
    """torchvision's AugMix operations (all_ops=True) as DALI auto_aug augmentations with its magnitude
    ranges over AUGMIX_BINS bins: shear 0.3, translate size / 3 pixels, rotate 30 degrees, posterize 4..0
    bits, solarize 255..0, brightness / colour / contrast / sharpness 1 +- 0.9, autocontrast, equalize."""
    from nvidia.dali.auto_aug import augmentations as a
    enhance = lambda op: op.augmentation((0, 0.9), True, a.shift_enhance_range)
    return [a.shear_x.augmentation((0, 0.3), True), a.shear_y.augmentation((0, 0.3), True),
            a.translate_x_no_shape.augmentation((0, size / 3), True),
            a.translate_y_no_shape.augmentation((0, size / 3), True), a.rotate.augmentation((0, 30), True),
            a.posterize.augmentation((4, 0), False, a.poster_mask_uint8), a.solarize.augmentation((255, 0)),
            a.auto_contrast, a.equalize, enhance(a.brightness), enhance(a.color), enhance(a.contrast),
            a.sharpness.augmentation((0, 0.9), True, a.sharpness_kernel)]


def _augmix(images: DataNode, cfg: AugmentConfig, size: int) -> DataNode:
    """torchvision's AugMix on uint8 HWC images: augmix_width chains of augmix_depth operations (-1: 1 to 3
    drawn per chain), each drawn uniformly from augmix_operations with a magnitude bin below augmix_severity
    and a random sign, mixed with the original by augmix_weights and truncated to uint8, as torchvision's.
    A chain's steps past its drawn depth pick the identity. Geometric steps fill with 0, bilinear."""
    from nvidia.dali import fn
    from nvidia.dali import math as dmath
    from nvidia.dali.auto_aug import augmentations as a
    from nvidia.dali.auto_aug.core import select, signed_bin
    types = _types()
    operations = augmix_operations(size)
    identity, steps = len(operations), cfg.augmix_depth if cfg.augmix_depth > 0 else 3
    original, shares = augmix_weights(cfg.augmix_alpha, cfg.augmix_width)
    mixed = images * original
    for chain, share in enumerate(shares):
        if cfg.augmix_depth < 0:
            depth = fn.random.uniform(values=[1, 2, 3], dtype=types.INT32, name=f"AugMixDepth{chain}")
        chained = images
        for step in range(steps):
            op = fn.random.uniform(values=list(range(identity)), dtype=types.INT32, name=f"AugMixOp{chain}_{step}")
            if cfg.augmix_depth < 0 and step:  # past this chain's depth: the identity
                done = fn.cast(depth <= step, dtype=types.INT32)
                op = fn.cast(op * (1 - done) + identity * done, dtype=types.INT32)
            level = fn.random.uniform(values=list(range(cfg.augmix_severity)), dtype=types.INT32,
                                      name=f"AugMixLevel{chain}_{step}")
            chained = select([*operations, a.identity], op, data=chained, magnitude_bin=signed_bin(level),
                             num_magnitude_bins=AUGMIX_BINS, fill_value=0, interp_type=types.INTERP_LINEAR)
        mixed = mixed + chained * share
    return fn.cast(dmath.clamp(dmath.floor(mixed), 0, 255), dtype=types.UINT8)  # torchvision's .to(uint8)


def decode_only(jpegs: DataNode, cfg: AugmentConfig, device: str = "cpu", decode_device: str | None = None) -> DataNode:
    """The whole image decoded, nothing else (uint8 HWC on `device`): `dali-pipes profile`'s decode
    stage, timed without the augmentation after it. Train's graph decodes only its crop's region, so
    this is the upper bound of its decode cost."""
    from nvidia.dali import fn
    images = decode_rgb(fn.decoders.image, jpegs, cfg, resolve_decode_device(device, decode_device))
    return images.gpu() if device == "gpu" else images


def _auto_augment(images: DataNode, policy: str) -> DataNode:
    # DALI's auto_aug needs the pipeline built with enable_conditionals=True (pipeline.py does).
    from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment
    if policy == "autoaugment":
        return auto_augment.auto_augment_image_net(images)
    if policy == "randaugment":
        return rand_augment.rand_augment(images, n=2, m=9)
    return trivial_augment.trivial_augment_wide(images)


def eval_augment(jpegs: DataNode, cfg: AugmentConfig, device: str = "cpu", decode_device: str | None = None,
                 normalize: bool = True) -> DataNode:
    """Decode, resize the shorter side (both sides with val_stretch) to val_size / crop_ratio, centre-crop
    val_size (val_image_size, or image_size's last size), normalise. Returns float CHW (HWC with channels_last)
    images on `device`; uint8, not normalised, with `normalize=False` (the val cache keeps those: run/val_cache.py)."""
    from nvidia.dali import fn
    decode_device = resolve_decode_device(device, decode_device)
    images = decode_rgb(fn.decoders.image, jpegs, cfg, decode_device)
    if device == "gpu":
        images = images.gpu()
    size = cfg.val_size
    side = round(size / cfg.crop_ratio)
    # ignore: DALI's stub (2.4) gives fn.resize a node, a sequence or None; one node in is one node out
    if cfg.val_stretch:  # torchvision's Resize((h, w)): both sides, the aspect ratio not kept
        images = fn.resize(images, resize_x=side, resize_y=side,  # type: ignore[assignment]
                           interp_type=_interp(cfg), antialias=True)
    else:
        images = fn.resize(images, resize_shorter=side,  # type: ignore[assignment]
                           interp_type=_interp(cfg), antialias=True)
    return _normalize(images, cfg, uint8=not normalize, crop=(size, size), crop_pos_x=0.5, crop_pos_y=0.5)
