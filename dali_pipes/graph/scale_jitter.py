"""The references' large-scale jitter (the `lsj` preset) in the detection graph: ScaleJitter, then FixedSizeCrop.

ScaleJitter (torchvision.transforms.v2.ScaleJitter, and the references' v1 class of the same name) draws a scale s
in scale_range and resizes the image by r = min(target_size[1] / height, target_size[0] / width) * s, each side
int(side * r), in float32 as torchvision computes it. FixedSizeCrop (references/detection/transforms.py) cuts a
window of min(size, image) at a random offset (one uniform draw u for both axes: top = int((H - h) * u), left =
int((W - w) * u), as the references draw it), shifts the boxes by it and, when it did cut, clamps them to the
window and removes those left without area with their labels; then it pads at the bottom and right to exactly
`size` with `fill`. In the graph, one slice of `size` at (top, left) does both: past the image it pads.

A removed box stays in the graph's outputs, its index in `kept` set to -1 (DALI has no per-box filter outside
random_bbox_crop): the run leaves it out (run/detection.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ScaleJitter:
    """ScaleJitter's settings: the base scale fits the image into target_size (torchvision pairs target_size[1]
    with the height and target_size[0] with the width), times a scale drawn uniformly from scale_range."""
    target_size: tuple[int, int]
    scale_range: tuple[float, float] = (0.1, 2.0)

    def __post_init__(self) -> None:
        if not 0 < self.scale_range[0] <= self.scale_range[1] or min(self.target_size) < 1:
            raise ValueError(f"ScaleJitter: scale_range (min, max) with 0 < min <= max and a positive target_size "
                             f"expected, got {self.scale_range}, {self.target_size}")


@dataclass(frozen=True, kw_only=True)
class FixedSizeCrop:
    """FixedSizeCrop's settings: the output's (height, width), and the fill of the padding (per channel)."""
    size: tuple[int, int]
    fill: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        if min(self.size) < 1:
            raise ValueError(f"FixedSizeCrop: a positive size (height, width) expected, got {self.size}")


def _types() -> Any:
    """nvidia.dali.types, typed Any (its enums come from a compiled module type checkers cannot see)."""
    from nvidia.dali import types
    return types


def jittered_size(shape: Any, settings: ScaleJitter) -> tuple[Any, Any]:
    """ScaleJitter's (new height, new width) for the peeked (H, W, C), as float nodes: torchvision's float32 math
    (a float32 scale times the base ratio, times each side, truncated), so the sizes are its own."""
    from nvidia.dali import fn
    from nvidia.dali import math as dali_math
    height, width = shape[0], shape[1]
    low, high = settings.scale_range
    scale = fn.random.uniform(range=[low, high], name="det_jitter_scale") if high > low else low  # DALI: empty range
    ratio = dali_math.min(settings.target_size[1] / height, settings.target_size[0] / width) * scale
    return dali_math.floor(height * ratio), dali_math.floor(width * ratio)


def scale_jitter_crop(images: Any, boxes: Any, kept: Any, shape: Any, jitter: ScaleJitter | None,
                      crop: FixedSizeCrop | None) -> tuple[Any, Any, Any]:
    """(images, boxes, kept) after ScaleJitter and FixedSizeCrop (either may be None). `images`: the decoded HWC
    image of the peeked `shape`; `boxes`: normalised xyxy to it; `kept`: their indices (int32). Out: the image of
    exactly crop.size, boxes normalised to it, a removed box's index -1."""
    from nvidia.dali import fn
    height, width = shape[0], shape[1]
    if jitter is not None:  # boxes are normalised: a resize leaves them as they are
        height, width = jittered_size(shape, jitter)
        images = fn.resize(images, size=fn.stack(height, width), antialias=True, name="det_scale_jitter")
    if crop is None:
        return images, boxes, kept
    from nvidia.dali import math as dali_math
    types = _types()
    size_h, size_w = (float(side) for side in crop.size)
    draw = fn.random.uniform(range=[0.0, 1.0], name="det_fixed_crop_offset")  # one draw for both axes
    top = dali_math.floor(dali_math.max(height - size_h, 0.0) * draw)
    left = dali_math.floor(dali_math.max(width - size_w, 0.0) * draw)
    images = fn.slice(images, start=fn.cast(fn.stack(left, top), dtype=types.INT32), shape=[crop.size[1], crop.size[0]],
                      axis_names="WH", out_of_bounds_policy="pad", fill_values=list(crop.fill), name="det_fixed_crop")
    pixels = boxes * fn.stack(width, height, width, height) - fn.stack(left, top, left, top)
    cut = fn.cast((height > size_h) | (width > size_w), dtype=types.FLOAT)  # the references clamp only then
    window_w, window_h = dali_math.min(width, size_w), dali_math.min(height, size_h)
    clamped = dali_math.min(dali_math.max(pixels, 0.0), fn.stack(window_w, window_h, window_w, window_h))
    pixels = pixels + cut * (clamped - pixels)
    empty = (pixels[:, 0] >= pixels[:, 2]) | (pixels[:, 1] >= pixels[:, 3])
    gone = fn.cast(cut * fn.cast(empty, dtype=types.FLOAT), dtype=types.INT32)
    kept = kept - (kept + 1) * gone
    return images, pixels / fn.stack(size_w, size_h, size_w, size_h), kept
