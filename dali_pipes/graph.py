"""Decode + augment graphs: plain functions of DALI DataNodes, one code path for CPU and GPU.

`device="gpu"` decodes with DALI's mixed decoder (host parses, nvJPEG or the GPU's hardware
JPEG decoder decodes) and augments on the GPU; `device="cpu"` is the same graph on CPU operators.
"""

from __future__ import annotations

from dataclasses import dataclass

from dali_pipes.config import option

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUTO_AUGMENTS = ("autoaugment", "randaugment", "trivialaugment")

# Mixed-decoder buffers sized for ImageNet-like data (DALI's ResNet-50 example): nvJPEG grows its
# buffers to the largest image seen; padding them up front avoids reallocations mid-epoch.
DEVICE_MEMORY_PADDING = 211_025_920
HOST_MEMORY_PADDING = 140_544_512
HW_DECODER_WIDTH_HINT, HW_DECODER_HEIGHT_HINT = 5980, 6430  # ImageNet's largest image


@dataclass(frozen=True)
class AugmentConfig:
    """The decode + augment graph's settings; every field is also a flag (config.add_arguments)."""
    image_size: int = option(224, "output side in pixels (train crop, val centre crop)")
    random_area: tuple[float, float] = option((0.08, 1.0), "train: random-resized-crop area fraction, low high")
    random_aspect_ratio: tuple[float, float] = option((3 / 4, 4 / 3), "train: random-resized-crop aspect ratio range")
    flip_probability: float = option(0.5, "train: probability of a horizontal flip")
    color_jitter: float = option(0.0, "train: brightness/contrast/saturation drawn in 1 +- this (0: off)")
    auto_augment: str | None = option(None, "train: an AutoAugment-family policy (DALI auto_aug)", type=str,
                                      choices=(*AUTO_AUGMENTS, None))
    crop_ratio: float = option(0.875, "val: resize the shorter side to image_size / crop_ratio, then centre-crop")
    mean: tuple[float, float, float] = option(IMAGENET_MEAN, "normalisation mean per channel, on the [0, 1] scale")
    std: tuple[float, float, float] = option(IMAGENET_STD, "normalisation std per channel, on the [0, 1] scale")
    channels_last: bool = option(False, "NHWC memory (the logical shape stays N,3,H,W): faster convs on GPU")
    float16: bool = option(False, "float16 output instead of float32: half the bytes to move")
    hw_decoder_load: float = option(0.65, "gpu: share of images sent to the hardware JPEG decoder (A100/H100)")

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f"image_size must be positive, got {self.image_size}")
        if self.auto_augment not in (None, *AUTO_AUGMENTS):
            raise ValueError(f"auto_augment must be one of {AUTO_AUGMENTS} or None, got {self.auto_augment!r}")
        if not 0 < self.random_area[0] <= self.random_area[1] <= 1:
            raise ValueError(f"random_area must satisfy 0 < low <= high <= 1, got {self.random_area}")
        if not 0 <= self.hw_decoder_load <= 1:
            raise ValueError(f"hw_decoder_load must be in [0, 1], got {self.hw_decoder_load}")


def _decoder_args(device: str, cfg: AugmentConfig) -> dict:
    from nvidia.dali import types
    args = dict(device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)
    if device == "gpu":
        args.update(device_memory_padding=DEVICE_MEMORY_PADDING, host_memory_padding=HOST_MEMORY_PADDING,
                    hw_decoder_load=cfg.hw_decoder_load, preallocate_width_hint=HW_DECODER_WIDTH_HINT,
                    preallocate_height_hint=HW_DECODER_HEIGHT_HINT)
    return args


def _normalize(images, cfg: AugmentConfig, **crop_args):
    """Crop (optional), flip (optional), normalise, lay out: the last step of both graphs."""
    from nvidia.dali import fn, types
    return fn.crop_mirror_normalize(
        images, dtype=types.FLOAT16 if cfg.float16 else types.FLOAT,
        output_layout="HWC" if cfg.channels_last else "CHW",
        mean=[m * 255 for m in cfg.mean], std=[s * 255 for s in cfg.std], **crop_args)


def train_augment(jpegs, cfg: AugmentConfig, device: str = "cpu"):
    """Random-resized-crop decode (only the crop's region is decoded), resize to image_size,
    optional colour jitter and AutoAugment-family policy, flip, normalise.
    Returns float CHW (HWC with channels_last) images on `device`."""
    from nvidia.dali import fn, types
    images = fn.decoders.image_random_crop(jpegs, random_area=list(cfg.random_area),
                                           random_aspect_ratio=list(cfg.random_aspect_ratio), num_attempts=100,
                                           **_decoder_args(device, cfg))
    images = fn.resize(images, resize_x=cfg.image_size, resize_y=cfg.image_size, interp_type=types.INTERP_LINEAR,
                       antialias=True)
    if cfg.color_jitter:
        jitter = lambda: fn.random.uniform(range=[1 - cfg.color_jitter, 1 + cfg.color_jitter])
        images = fn.color_twist(images, brightness=jitter(), contrast=jitter(), saturation=jitter())
    if cfg.auto_augment:
        images = _auto_augment(images, cfg.auto_augment)
    mirror = fn.random.coin_flip(probability=cfg.flip_probability) if cfg.flip_probability else 0
    return _normalize(images, cfg, mirror=mirror)


def _auto_augment(images, policy: str):
    # DALI's auto_aug needs the pipeline built with enable_conditionals=True (pipeline.py does).
    from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment
    if policy == "autoaugment":
        return auto_augment.auto_augment_image_net(images)
    if policy == "randaugment":
        return rand_augment.rand_augment(images, n=2, m=9)
    return trivial_augment.trivial_augment_wide(images)


def eval_augment(jpegs, cfg: AugmentConfig, device: str = "cpu"):
    """Decode, resize the shorter side to image_size / crop_ratio, centre-crop image_size,
    normalise. Returns float CHW (HWC with channels_last) images on `device`."""
    from nvidia.dali import fn, types
    images = fn.decoders.image(jpegs, **_decoder_args(device, cfg))
    images = fn.resize(images, resize_shorter=round(cfg.image_size / cfg.crop_ratio),
                       interp_type=types.INTERP_LINEAR, antialias=True)
    return _normalize(images, cfg, crop=(cfg.image_size, cfg.image_size), crop_pos_x=0.5, crop_pos_y=0.5)
