"""RandomPhotometricDistort (the SSD preset's colour step) as DALI arithmetic, following torchvision's uint8 math.

torchvision (transforms.v2.RandomPhotometricDistort, the references' v1 class of the same name) draws, each with
probability p: a brightness factor, a contrast factor (applied before saturation and hue, or after them, by a fair
coin), a saturation factor, a hue shift, and a random channel permutation. On a uint8 image each kernel blends in
float32 and truncates back to uint8 (functional/_color.py); the graph does the same, step by step, on float32
pixels holding integers, so the output is torchvision's within float rounding:
- brightness: image * f; contrast: blend with the mean of the floored grayscale (DALI's fn.contrast blends with a
  fixed centre, hence fn.reductions.mean here); saturation: blend with the floored grayscale per pixel;
- hue: torchvision's own RGB -> HSV -> RGB (fn.hue and fn.hsv rotate in YIQ, an approximation), written with
  masks where torchvision indexes;
- permutation: each output channel a mask-weighted sum of the inputs (no per-sample channel gather in DALI).
A step not drawn is exactly the identity (its factor 1, or its result masked out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# torch.randperm(3)'s six outcomes, as source channel per output channel (R, G, B)
PERMUTATIONS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


@dataclass(frozen=True, kw_only=True)
class PhotometricDistort:
    """RandomPhotometricDistort's settings: factor ranges (min, max) and the probability of each step."""
    brightness: tuple[float, float] = (0.875, 1.125)
    contrast: tuple[float, float] = (0.5, 1.5)
    saturation: tuple[float, float] = (0.5, 1.5)
    hue: tuple[float, float] = (-0.05, 0.05)
    p: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomPhotometricDistort: p must be within [0, 1], got {self.p}")
        for name in ("brightness", "contrast", "saturation"):
            low, high = getattr(self, name)
            if not 0.0 <= low <= high:
                raise ValueError(f"RandomPhotometricDistort: {name} must be (min, max) with 0 <= min <= max, "
                                 f"got {(low, high)}")
        if not -0.5 <= self.hue[0] <= self.hue[1] <= 0.5:
            raise ValueError(f"RandomPhotometricDistort: hue must be (min, max) within [-0.5, 0.5], got {self.hue}")


def photometric_distort(images: Any, settings: PhotometricDistort) -> Any:
    """uint8 HWC RGB in, uint8 HWC out: the distortion drawn per sample, in torchvision's order."""
    from nvidia.dali import fn
    types = _types()
    x = fn.cast(images, dtype=types.FLOAT)
    p = settings.p
    x = _blend(x, 0.0, _draw(settings.brightness, p, 1.0, "brightness"))
    contrast = _draw(settings.contrast, p, 1.0, "contrast")
    before = fn.cast(fn.random.coin_flip(probability=0.5, name="det_photo_contrast_before"), dtype=types.FLOAT)
    x = _contrast(x, 1.0 + before * (contrast - 1.0))
    x = _blend(x, _gray(x), _draw(settings.saturation, p, 1.0, "saturation"))
    hue_on = _coin(p, "hue")
    low, high = settings.hue
    shift = fn.random.uniform(range=[low, high], name="det_photo_hue") if high > low else low
    x = x + hue_on * (_hue(x, shift) - x)  # masked, not shifted by 0: the HSV round trip is not the identity
    x = _contrast(x, 1.0 + (1.0 - before) * (contrast - 1.0))
    x = _permute(x, _coin(p, "permute"))
    return fn.cast(x, dtype=types.UINT8)


def _types() -> Any:
    """nvidia.dali.types, typed Any (its enums come from a compiled module type checkers cannot see)."""
    from nvidia.dali import types
    return types


def _coin(p: float, name: str) -> Any:
    from nvidia.dali import fn
    types = _types()
    return fn.cast(fn.random.coin_flip(probability=p, name=f"det_photo_{name}_coin"), dtype=types.FLOAT)


def _draw(bounds: tuple[float, float], p: float, identity: float, name: str) -> Any:
    """The factor per sample: drawn uniformly from bounds with probability p, else `identity`."""
    from nvidia.dali import fn
    low, high = bounds
    drawn = fn.random.uniform(range=[low, high], name=f"det_photo_{name}") if high > low else low  # DALI: empty range
    return identity + _coin(p, name) * (drawn - identity)


def _blend(x: Any, other: Any, ratio: Any) -> Any:
    """torchvision's _blend on uint8: x * ratio + other * (1 - ratio), clamped, truncated."""
    from nvidia.dali import math as dali_math
    return dali_math.floor(dali_math.clamp(x * ratio + other * (1.0 - ratio), 0.0, 255.0))


def _gray(x: Any) -> Any:
    """torchvision's grayscale of a uint8 image, floored (H, W, 1: it broadcasts over the channels)."""
    from nvidia.dali import math as dali_math
    return dali_math.floor(x[:, :, 0:1] * GRAY[0] + x[:, :, 1:2] * GRAY[1] + x[:, :, 2:3] * GRAY[2])


def _contrast(x: Any, factor: Any) -> Any:
    from nvidia.dali import fn
    return _blend(x, fn.reductions.mean(_gray(x)), factor)


def _hue(x: Any, shift: Any) -> Any:
    """torchvision's adjust_hue on uint8: to [0, 1], _rgb_to_hsv, h + shift mod 1, _hsv_to_rgb, back with
    x * (255 + 1 - 1e-3) truncated."""
    from nvidia.dali import fn
    from nvidia.dali import math as dali_math
    x = x * (1.0 / 255.0)
    r, g, b = x[:, :, 0], x[:, :, 1], x[:, :, 2]
    high = dali_math.max(dali_math.max(r, g), b)
    span = high - dali_math.min(dali_math.min(r, g), b)
    flat = span == 0.0
    saturation = span / (high + flat * (1.0 - high))  # where(max == min, 1, max)
    divisor = span + flat * 1.0
    rc, gc, bc = (high - r) / divisor, (high - g) / divisor, (high - b) / divisor
    sixths = ((high == r) * (bc - gc) + ((high == g) & (high != r)) * (2.0 + rc - bc)
              + ((high != g) & (high != r)) * (4.0 + gc - rc))
    hue = _mod1(_mod1(sixths * (1.0 / 6.0) + 1.0) + shift)
    h6 = hue * 6.0
    sector = dali_math.floor(h6)
    frac = h6 - sector
    sector = sector - 6.0 * dali_math.floor(sector / 6.0)
    p = dali_math.clamp((1.0 - saturation) * high, 0.0, 1.0)
    q = dali_math.clamp((1.0 - saturation * frac) * high, 0.0, 1.0)
    t = dali_math.clamp((saturation * frac + (1.0 - saturation)) * high, 0.0, 1.0)
    # torchvision's select table: (v, p, q, t) indexed by sector, per output channel
    table = ((high, q, p, p, t, high), (t, high, high, q, p, p), (p, p, t, high, high, q))
    channels = [sum((sector == float(i)) * value for i, value in enumerate(row)) for row in table]
    return dali_math.floor(fn.stack(*channels, axis=2, axis_name="C") * (255.0 + 1.0 - 1e-3))


def _mod1(value: Any) -> Any:
    from nvidia.dali import math as dali_math
    return value - dali_math.floor(value)


def _permute(x: Any, applied: Any) -> Any:
    """The channels permuted by one of torch.randperm(3)'s outcomes when `applied`, else left as they are."""
    from nvidia.dali import fn
    types = _types()
    choice = fn.random.choice(len(PERMUTATIONS), name="det_photo_permutation")
    channels = []
    for out in range(3):
        drawn = fn.lookup_table(choice, keys=list(range(len(PERMUTATIONS))), dtype=types.FLOAT,
                                values=[float(perm[out]) for perm in PERMUTATIONS])
        source = out + applied * (drawn - out)
        channels.append(sum((source == float(c)) * x[:, :, c] for c in range(3)))
    return fn.stack(*channels, axis=2, axis_name="C")
