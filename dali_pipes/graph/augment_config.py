"""The decode + augment graph's settings: AugmentConfig (every field also a flag) and its value checks.

DALI checks argument names and types when a graph is defined, not their values: a `hw_decoder_load` of 1.5 or
a negative padding is accepted even on a GPU, and a 2-value mean passes definition and serialization. The
values are checked here, when an AugmentConfig is made (`AugmentConfig.__post_init__`), before DALI sees them;
the decoders' own arguments in decoders.py (`check_decoder_args`). tests/test_graph_check.py has a case for each.

No DALI import here: this dataclass is imported by every command, converters, `verify` and `--help` included,
that never builds a pipeline (`import nvidia.dali` takes 0.7-0.8 s and loads libdali).
"""

from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass, replace

from dali_pipes.graph import resolution
from dali_pipes.graph.resolution import ImageSize
from dali_pipes.options import auto_or_fraction, option, written_as

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTO_AUGMENTS = ("autoaugment", "randaugment", "trivialaugment", "augmix")
INTERPOLATIONS = ("bilinear", "bicubic")
ERASING_MODES = ("const", "pixel", "rand")
PNG16_MODES = ("pil", "scale")
JPEG_MAX_SIDE = 65535
AUGMIX_BINS = 10  # torchvision's AugMix divides each magnitude range into 10 bins (its _PARAMETER_MAX)
AUTO_LOAD = "auto"  # hw_decoder_load="auto": a GPU loader tries run/tuning.HW_LOADS online, starting here:
DEFAULT_HW_LOAD = 0.65  # DALI's own default; "auto" reads as it wherever nothing tunes it (a CPU decode, profile)


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
    if not finite_number(cfg.flip_probability) or not 0 <= cfg.flip_probability <= 1:
        problems.append(f"flip_probability must be in [0, 1], got {cfg.flip_probability!r}")
    if not finite_number(cfg.color_jitter) or not 0 <= cfg.color_jitter < 1:
        problems.append(f"color_jitter must be in [0, 1) (factors drawn in 1 +- it stay positive), "
                        f"got {cfg.color_jitter!r}")
    if not finite_number(cfg.crop_ratio) or not 0 < cfg.crop_ratio <= 1:
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
    if not finite_number(cfg.augmix_alpha) or cfg.augmix_alpha <= 0:
        problems.append(f"augmix_alpha must be > 0, got {cfg.augmix_alpha!r}")
    if not finite_number(cfg.random_erasing) or not 0 <= cfg.random_erasing <= 1:
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
    if len(value) != 3 or not all(finite_number(v) for v in value):
        problems.append(f"random_erasing_value must be 3 finite numbers (R, G, B), got {cfg.random_erasing_value!r}")
    return problems


def finite_number(x) -> bool:
    """A real number, not a bool, not NaN or infinite (the checks' one test of a number)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _fraction(x) -> bool:
    return finite_number(x) and 0 <= x <= 1


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
    return (low, high) if finite_number(low) and finite_number(high) else None


def _normalisation_problems(mean, std) -> list[str]:
    problems = []
    for name, given in (("mean", mean), ("std", std)):
        values = tuple(given) if isinstance(given, (tuple, list)) else ()
        if len(values) != 3 or not all(finite_number(v) for v in values):
            problems.append(f"{name} must be 3 finite numbers (R, G, B), got {given!r}")
        elif any(v > 1 for v in values):
            problems.append(f"{name} is on the [0, 1] scale, got {values}; divide 0-255 values by 255")
        elif name == "mean" and any(v < 0 for v in values):
            problems.append(f"mean values must be in [0, 1], got {values}")
        elif name == "std" and any(v <= 0 for v in values):
            problems.append(f"std values must be > 0 (they divide), got {values}")
    return problems
