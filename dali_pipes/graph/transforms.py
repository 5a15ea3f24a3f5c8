"""A torchvision transform read as a description of the DALI graph (AugmentConfig keywords).

DaliLoader(dataset) takes the `transform` of a torchvision dataset the way DataLoader users write
it, but augmentation runs in DALI (on the GPU), so the transform is read, never run: each step
becomes an AugmentConfig field with the step's own arguments. A step or an argument that the graph
cannot do exactly is refused, naming it and what is supported; nothing is approximated silently.
torchvision is never imported: steps are recognised by class name and read by attribute, so v1 and
v2 transforms both work and the library keeps no dependency on torchvision.

What the graph does (graph.py), and so what is accepted:
  train: RandomResizedCrop(size, scale, ratio) [RandomHorizontalFlip(p)] [ColorJitter(b, c, s) with
         b == c == s, hue 0] [AutoAugment(IMAGENET) | RandAugment() | TrivialAugmentWide()]
  val:   Resize(shorter side) CenterCrop(size)
  then:  ToTensor() | PILToTensor() + ConvertImageDtype(float) | ToImage() + ToDtype(float, scale=True)
         [Normalize(mean, std)]
Interpolation must be bilinear (DALI's linear resize with antialiasing, as PIL's). One difference is
known and documented (README): ColorJitter applies its three adjustments in a random order, and blends
contrast towards the image's grey mean; DALI's color_twist has one fixed order and centre.
"""

from __future__ import annotations

from typing import Any

SUPPORTED = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip", "ColorJitter", "AutoAugment",
             "RandAugment", "TrivialAugmentWide", "ToTensor", "PILToTensor", "ConvertImageDtype", "ToImage",
             "ToDtype", "Normalize")
RANDOM_STEPS = ("RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "AutoAugment", "RandAugment",
                "TrivialAugmentWide")
_GEOMETRY = ("RandomResizedCrop", "Resize", "CenterCrop")


class TransformError(ValueError):
    """A transform step the DALI graph cannot reproduce exactly."""

    def __init__(self, step: Any, problem: str) -> None:
        super().__init__(f"transform step {step!r}: {problem}. DaliLoader runs the transform as a DALI graph and "
                         f"reads these steps only: {', '.join(SUPPORTED)} (see dali_pipes/graph/transforms.py); use "
                         f"them, or build the loader with its own keywords (image_size=, crop_ratio=, ...)")


def transform_steps(transform: Any) -> list:
    """The steps of a Compose (nested ones flattened), or [transform]."""
    if transform is None:
        return []
    if type(transform).__name__ == "Compose":
        return [step for inner in transform.transforms for step in transform_steps(inner)]
    return [transform]


def is_random(transform: Any) -> bool:
    """True when the transform draws random numbers: DataLoader users mean it for training."""
    return any(type(step).__name__ in RANDOM_STEPS for step in transform_steps(transform))


def augment_from_transform(transform: Any) -> tuple[dict, bool]:
    """(AugmentConfig keywords, True for the train graph) that reproduce `transform`."""
    steps = transform_steps(transform)
    if not steps:
        raise TransformError(transform, "no transform: DataLoader would yield PIL images, which a batch cannot "
                             "hold; give the dataset a transform that ends in ToTensor()")
    state: dict = {"train": None, "tensor": None, "resize": None, "crop": None, "args": {"flip_probability": 0.0}}
    for step in steps:
        name = type(step).__name__
        if name not in SUPPORTED:
            raise TransformError(step, f"{name} is not supported")
        _READERS[name](step, state)
    return _finish(steps, state)


def _finish(steps: list, state: dict) -> tuple[dict, bool]:
    args = state["args"]
    if state["tensor"] != "float":
        raise TransformError(steps[-1], "the transform must end in float tensors: ToTensor(), or PILToTensor() + "
                             "ConvertImageDtype(torch.float32)")
    args.setdefault("mean", (0.0, 0.0, 0.0))  # no Normalize: ToTensor's [0, 1] values as they are
    args.setdefault("std", (1.0, 1.0, 1.0))
    if state["train"]:
        if state["resize"] is not None or state["crop"] is not None:
            raise TransformError(steps[0], "RandomResizedCrop with Resize or CenterCrop in one transform")
        return args, True
    if state["resize"] is None or state["crop"] is None:
        raise TransformError(steps[0], "a val transform must be Resize(shorter side) then CenterCrop(size) (a train "
                             "transform starts with RandomResizedCrop): DALI batches need one output size")
    for key in ("color_jitter", "auto_augment"):
        if key in args:
            raise TransformError(steps[0], "random colour steps need RandomResizedCrop (the train graph) first")
    if args.pop("flip_probability"):
        raise TransformError(steps[0], "RandomHorizontalFlip needs RandomResizedCrop (the train graph) first")
    args.update(image_size=state["crop"], crop_ratio=state["crop"] / state["resize"])
    return args, False


def _before_tensor(step: Any, state: dict) -> None:
    if state["tensor"] == "float":  # after ToImage() / PILToTensor() (uint8 images) they may still come
        raise TransformError(step, "image steps must come before the conversion to float (ToTensor())")


def _square(step: Any, size: Any) -> int:
    sizes = [size] if isinstance(size, int) else list(size)
    if len(sizes) == 2 and sizes[0] == sizes[1]:
        sizes = sizes[:1]
    if len(sizes) != 1 or not isinstance(sizes[0], int) or sizes[0] < 1:
        raise TransformError(step, f"size {size!r}: only square outputs (one int) are supported")
    return sizes[0]


def _bilinear(step: Any) -> None:
    mode = getattr(step, "interpolation", None)
    if mode is not None and str(getattr(mode, "value", mode)).lower() not in ("bilinear", "2"):
        raise TransformError(step, f"interpolation {mode}: only bilinear (the default) is supported")
    if getattr(step, "antialias", True) is False:
        raise TransformError(step, "antialias=False: DALI's resize antialiases, as PIL does")


def _random_resized_crop(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    if state["train"]:
        raise TransformError(step, "a second RandomResizedCrop")
    _bilinear(step)
    state["train"] = True
    state["args"].update(image_size=_square(step, step.size), random_area=tuple(map(float, step.scale)),
                         random_aspect_ratio=tuple(map(float, step.ratio)))


def _resize(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    _bilinear(step)
    if getattr(step, "max_size", None) is not None:
        raise TransformError(step, "max_size is not supported")
    size = step.size
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]
    if not isinstance(size, int) or state["resize"] is not None or state["crop"] is not None:
        raise TransformError(step, "only one Resize(int) (shorter side) before CenterCrop is supported")
    state["resize"] = size


def _center_crop(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    if state["resize"] is None or state["crop"] is not None:
        raise TransformError(step, "CenterCrop must follow one Resize(int)")
    state["crop"] = _square(step, step.size)


def _flip(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    state["args"]["flip_probability"] = float(step.p)


def _color_jitter(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    ranges = [getattr(step, key) for key in ("brightness", "contrast", "saturation")]
    hue = getattr(step, "hue", None)
    ok = all(r is not None and len(r) == 2 and abs(1 - r[0] - (r[1] - 1)) < 1e-9 for r in ranges)
    if not ok or len({round(float(r[1]) - 1, 9) for r in ranges}) != 1 or (hue is not None and any(hue)):
        raise TransformError(step, "only ColorJitter(j, j, j) (brightness = contrast = saturation, no hue) is "
                             "supported: the graph draws the three factors in 1 +- j")
    state["args"]["color_jitter"] = float(ranges[0][1]) - 1


def _auto_augment(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    if "auto_augment" in state["args"]:
        raise TransformError(step, "a second AutoAugment-family step")
    name = type(step).__name__
    policy = str(getattr(getattr(step, "policy", None), "name", "IMAGENET"))
    defaults = {"AutoAugment": policy == "IMAGENET",
                "RandAugment": (step.__dict__.get("num_ops"), step.__dict__.get("magnitude"),
                                step.__dict__.get("num_magnitude_bins")) == (2, 9, 31),
                "TrivialAugmentWide": step.__dict__.get("num_magnitude_bins") == 31}
    if not defaults[name] or getattr(step, "fill", None) not in (None, 0):
        raise TransformError(step, "only the default arguments are supported (AutoAugment: the IMAGENET policy; "
                             "RandAugment: num_ops=2, magnitude=9; 31 magnitude bins; no fill)")
    state["args"]["auto_augment"] = {"AutoAugment": "autoaugment", "RandAugment": "randaugment",
                                     "TrivialAugmentWide": "trivialaugment"}[name]


def _to_tensor(step: Any, state: dict) -> None:
    if state["tensor"] is not None:
        raise TransformError(step, "a second ToTensor()")
    state["tensor"] = "float"


def _pil_to_tensor(step: Any, state: dict) -> None:
    if state["tensor"] is not None:
        raise TransformError(step, "a second tensor conversion")
    state["tensor"] = "uint8"


def _convert_dtype(step: Any, state: dict) -> None:
    dtype = str(step.dtype if not isinstance(step.dtype, dict) else next(iter(step.dtype.values())))
    if state["tensor"] == "uint8" and dtype == "torch.uint8":
        return  # ToDtype(torch.uint8, scale=True) after ToImage(): nothing changes
    if state["tensor"] != "uint8" or dtype not in ("torch.float32", "torch.float16"):
        raise TransformError(step, "only ConvertImageDtype(torch.float32 or torch.float16) after PILToTensor()")
    if getattr(step, "scale", True) is False:
        raise TransformError(step, "scale=False (0-255 floats): only [0, 1] floats, as ToTensor() gives")
    state["tensor"] = "float"
    state["args"]["float16"] = dtype == "torch.float16"


def _normalize(step: Any, state: dict) -> None:
    if state["tensor"] != "float" or "mean" in state["args"]:
        raise TransformError(step, "one Normalize, after ToTensor()")
    mean, std = (tuple(float(v) for v in values) for values in (step.mean, step.std))
    if len(mean) == 1:
        mean, std = mean * 3, std * 3 if len(std) == 1 else std
    state["args"].update(mean=mean, std=std)


_READERS = {"RandomResizedCrop": _random_resized_crop, "Resize": _resize, "CenterCrop": _center_crop,
            "RandomHorizontalFlip": _flip, "ColorJitter": _color_jitter, "AutoAugment": _auto_augment,
            "RandAugment": _auto_augment, "TrivialAugmentWide": _auto_augment, "ToTensor": _to_tensor,
            "PILToTensor": _pil_to_tensor, "ConvertImageDtype": _convert_dtype, "ToImage": _pil_to_tensor,
            "ToDtype": _convert_dtype, "Normalize": _normalize}
