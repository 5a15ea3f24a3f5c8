"""Decode + augment graphs: plain functions of DALI DataNodes, one code path for CPU and GPU.

`device="gpu"` decodes with DALI's mixed decoder (host parses, nvJPEG / the hardware JPEG
decoder decodes on the GPU) and augments on the GPU; `device="cpu"` is the same graph on CPU
operators.
"""

from __future__ import annotations

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def decoder_device(device: str) -> str:
    return "mixed" if device == "gpu" else "cpu"


def eval_augment(jpegs, *, image_size: int = 224, crop_ratio: float = 0.875, device: str = "cpu"):
    """Decode, resize the shorter side to image_size / crop_ratio, centre-crop image_size,
    normalise with ImageNet mean/std. Returns float32 CHW on `device`."""
    from nvidia.dali import fn, types
    images = fn.decoders.image(jpegs, device=decoder_device(device), output_type=types.RGB)
    images = fn.resize(images, resize_shorter=round(image_size / crop_ratio), interp_type=types.INTERP_LINEAR,
                       antialias=True)
    return fn.crop_mirror_normalize(images, crop=(image_size, image_size), crop_pos_x=0.5, crop_pos_y=0.5,
                                    dtype=types.FLOAT, output_layout="CHW", mean=IMAGENET_MEAN, std=IMAGENET_STD)
