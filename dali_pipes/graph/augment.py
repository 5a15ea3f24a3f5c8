"""Decode + augment graphs: plain functions of DALI DataNodes, one code path for CPU and GPU.

Where each step runs (`device`, `decode_device`):
  * "gpu", "gpu" (the default for gpu): DALI's mixed decoder (the host parses, nvJPEG or the GPU's
    hardware JPEG decoder decodes), then resize, augmentation and normalisation on the GPU;
  * "gpu", "cpu" (hybrid): libjpeg-turbo decodes on the CPU threads (in train only the random crop's
    region), the decoded crop moves to the GPU, and the rest runs there. NVIDIA's ConvNets examples
    run this way when the GPU's decoders are the bottleneck;
  * "cpu", "cpu": the same graph on CPU operators. "cpu" with a GPU decode is refused (decoders.py, when the
    rank's PipelineSpec is made).

DALI is imported inside the functions, never at module level: `import nvidia.dali` takes 0.7-0.8 s
(measured on this project's 2-core machine) and loads libdali, and a command that never builds a pipeline may
import this module.

Every operator that draws random numbers has a name of its own ("RandomCrop", "Flip", ...): a DALI
checkpoint names operators, and DALI's generated names shift when an operator is added before them
(dali_checkpoint.py). DALI's auto_aug policies name theirs themselves, by place.

The settings (AugmentConfig and its value checks) are in augment_config.py, the decoders and their arguments in
decoders.py; this module holds the graphs that use them. The decoders' thread count and hardware share come in as
arguments (the rank's PipelineSpec has them resolved: run/pipeline.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dali_pipes.graph.augment_config import AUGMIX_BINS, DEFAULT_HW_LOAD, AugmentConfig
from dali_pipes.graph.decoders import decode_rgb

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode

ERASE_ATTEMPTS = 10  # torchvision's and timm's RandomErasing try 10 rectangles, then leave the image as it is


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


def train_augment(jpegs: DataNode, cfg: AugmentConfig, device: str = "cpu", decode_device: str | None = None, *,
                  num_threads: int = 1, hw_decoder_load: float = DEFAULT_HW_LOAD) -> DataNode:
    """Random-resized-crop decode (only the crop's region is decoded), resize to image_size,
    optional colour jitter and AutoAugment-family policy (AugMix included), flip, normalise, optional
    random erasing. Returns float CHW (HWC with channels_last) images on `device`. `decode_device` None: `device`;
    `num_threads` (the pipeline's) and `hw_decoder_load` go to the decoder (decoders.decoder_args)."""
    from nvidia.dali import fn
    if not isinstance(cfg.image_size, int):
        raise ValueError(f"train_augment builds one size, got the schedule {cfg.image_size}: pass "
                         f"cfg.for_epoch(epoch, train=True)")
    images = decode_rgb(fn.decoders.image_random_crop, jpegs, cfg, decode_device or device, num_threads=num_threads,
                        hw_decoder_load=hw_decoder_load, name="RandomCrop",
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


def decode_only(jpegs: DataNode, cfg: AugmentConfig, device: str = "cpu", decode_device: str | None = None, *,
                num_threads: int = 1, hw_decoder_load: float = DEFAULT_HW_LOAD) -> DataNode:
    """The whole image decoded, nothing else (uint8 HWC on `device`): `dali-pipes profile`'s decode
    stage, timed without the augmentation after it. Train's graph decodes only its crop's region, so
    this is the upper bound of its decode cost. The decoder's arguments as train_augment's."""
    from nvidia.dali import fn
    images = decode_rgb(fn.decoders.image, jpegs, cfg, decode_device or device, num_threads=num_threads,
                        hw_decoder_load=hw_decoder_load)
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
                 normalize: bool = True, *, num_threads: int = 1, hw_decoder_load: float = DEFAULT_HW_LOAD) -> DataNode:
    """Decode, resize the shorter side (both sides with val_stretch) to val_size / crop_ratio, centre-crop
    val_size (val_image_size, or image_size's last size), normalise. Returns float CHW (HWC with channels_last)
    images on `device`; uint8, not normalised, with `normalize=False` (the val cache keeps those: run/val_cache.py).
    The decoder's arguments as train_augment's."""
    from nvidia.dali import fn
    images = decode_rgb(fn.decoders.image, jpegs, cfg, decode_device or device, num_threads=num_threads,
                        hw_decoder_load=hw_decoder_load)
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
