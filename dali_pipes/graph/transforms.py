"""A torchvision transform read as a description of the DALI graph (AugmentConfig keywords).

DaliLoader(dataset) takes the `transform` of a torchvision dataset the way DataLoader users write
it, but augmentation runs in DALI (on the GPU), so the transform is read, never run: each step
becomes an AugmentConfig field with the step's own arguments. A step or an argument that the graph
cannot do exactly is refused, naming it and what is supported; nothing is approximated silently.
torchvision is never imported: steps are recognised by class name and read by attribute, so v1 and
v2 transforms both work and the library keeps no dependency on torchvision.

What the graph does (augment.py), and so what is accepted:
  train: RandomResizedCrop(size, scale, ratio) [RandomHorizontalFlip(p)] [ColorJitter(b, c, s) with
         b == c == s, hue 0] [AutoAugment(IMAGENET) | RandAugment() | TrivialAugmentWide() |
         AugMix(severity, mixture_width, chain_depth, alpha)]
  val:   Resize(shorter side) CenterCrop(size), or Resize((s, s)) (stretched to s x s, as torchvision does,
         the aspect ratio not kept: a ViT image processor's size) [CenterCrop]
  then:  ToTensor() | PILToTensor() + ConvertImageDtype(float) | ToImage() + ToDtype(float, scale=True)
         [Normalize(mean, std)] [RandomErasing(p, scale, ratio, value) (torchvision's or timm's)]
         [ToPureTensor()] (anywhere: it only drops the tv_tensors' type)
Interpolation bilinear or bicubic (DALI's linear or cubic resize with antialiasing, as PIL's). A preset
object (torchvision's references' ClassificationPresetTrain / Eval, or any callable object whose
`transforms` or `transform` attribute is a Compose) is read through that Compose. Differences that are
known and documented: ColorJitter applies its three adjustments in a random order, and blends contrast
towards the image's grey mean; DALI's color_twist has one fixed order and centre. AugMix and RandomErasing
draw what torchvision's draw (augment.py says where they differ).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

SUPPORTED = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip", "ColorJitter", "AutoAugment",
             "RandAugment", "TrivialAugmentWide", "AugMix", "ToTensor", "PILToTensor", "ConvertImageDtype", "ToImage",
             "ToDtype", "Normalize", "RandomErasing", "ToPureTensor")
RANDOM_STEPS = ("RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "AutoAugment", "RandAugment",
                "TrivialAugmentWide", "AugMix", "RandomErasing")
INTERPOLATIONS = {"bilinear": "bilinear", "2": "bilinear", "bicubic": "bicubic", "3": "bicubic"}  # PIL's ints too
PRESET_ATTRIBUTES = ("transforms", "transform")
_GEOMETRY = ("RandomResizedCrop", "Resize", "CenterCrop")


OWN_KEYWORDS = "pass the images' location instead, with the loader's own keywords: DaliLoader(PATH, image_size=, " \
    "crop_ratio=, ...)"  # a dataset object's transform is read whatever keywords come with it


class TransformError(ValueError):
    """A transform step the DALI graph cannot reproduce exactly; `fix` says how to build the loader without it
    (the DataLoader form says where the dataset's images are: dataloader_args.transform_fix)."""

    def __init__(self, step: Any, problem: str, fix: str = OWN_KEYWORDS) -> None:
        self.step, self.problem, self.fix = step, problem, fix
        super().__init__(f"transform step {step!r}: {problem}. DaliLoader runs the transform as a DALI graph and "
                         f"reads these steps only: {', '.join(SUPPORTED)} (see dali_pipes/graph/transforms.py); use "
                         f"them, or {fix}")

    def __reduce__(self):  # picklable with its fields
        return type(self), (self.step, self.problem, self.fix)


def transform_steps(transform: Any) -> list:
    """The steps of a Compose (nested ones flattened, presets read through: preset_compose), or [transform]."""
    if transform is None:
        return []
    if type(transform).__name__ == "Compose":
        return [step for inner in transform.transforms for step in transform_steps(inner)]
    inner = preset_compose(transform)
    return transform_steps(inner) if inner is not None else [transform]


def preset_compose(transform: Any) -> Any:
    """The Compose a preset wraps, or None. A preset is a callable object of the user's (not a torchvision
    step) whose `transforms` or `transform` attribute is a Compose, called as preset(img): torchvision's
    references' ClassificationPresetTrain / Eval, and scripts' own classes of that shape."""
    if type(transform).__module__.startswith("torchvision.") or not callable(transform):
        return None
    for attribute in PRESET_ATTRIBUTES:
        inner = getattr(transform, attribute, None)
        if type(inner).__name__ == "Compose":
            return inner
    return None


def _not_supported(step: Any) -> str:
    """Why an unknown step is refused; for an object that wraps something, what a preset must hold."""
    name = type(step).__name__
    held = {a: type(getattr(step, a)).__name__ for a in PRESET_ATTRIBUTES if hasattr(step, a)}
    if not held:
        return f"{name} is not supported"
    found = ", ".join(f".{a} is a {kind}" for a, kind in held.items())
    return (f"{name} is not supported: an object that wraps a transform is read through its .transforms or "
            f".transform attribute when that is a torchvision Compose, and here {found}")


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
            raise TransformError(step, _not_supported(step))
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
    if args.get("val_stretch") and state["crop"] is None:  # Resize((s, s)) alone: already one output size
        state["crop"] = state["resize"]
    if state["resize"] is None or state["crop"] is None:
        raise TransformError(steps[0], "a val transform must be Resize(shorter side) then CenterCrop(size) (a train "
                             "transform starts with RandomResizedCrop): DALI batches need one output size")
    for key in ("color_jitter", "auto_augment", "random_erasing"):
        if key in args:
            raise TransformError(steps[0], "random colour steps and RandomErasing need RandomResizedCrop (the train "
                                 "graph) first")
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


def _interpolation(step: Any, state: dict) -> None:
    """The resize filter: bilinear (the default) or bicubic, each as DALI's antialiased resize (augment._interp)."""
    mode = getattr(step, "interpolation", None)
    name = "bilinear" if mode is None else INTERPOLATIONS.get(str(getattr(mode, "value", mode)).lower())
    if name is None:
        raise TransformError(step, f"interpolation {mode}: only bilinear (the default) and bicubic are supported")
    if getattr(step, "antialias", True) is False:
        raise TransformError(step, "antialias=False: DALI's resize antialiases, as PIL does")
    if name != "bilinear":
        state["args"]["interpolation"] = name


def _random_resized_crop(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    if state["train"]:
        raise TransformError(step, "a second RandomResizedCrop")
    _interpolation(step, state)
    state["train"] = True
    state["args"].update(image_size=_square(step, step.size), random_area=tuple(map(float, step.scale)),
                         random_aspect_ratio=tuple(map(float, step.ratio)))


def _resize(step: Any, state: dict) -> None:
    _before_tensor(step, state)
    _interpolation(step, state)
    if getattr(step, "max_size", None) is not None:
        raise TransformError(step, "max_size is not supported")
    size = step.size
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]
    if isinstance(size, (list, tuple)) and len(size) == 2:  # (h, w): stretched to h x w, as torchvision does
        size = _square(step, size)
        state["args"]["val_stretch"] = True
    if not isinstance(size, int) or state["resize"] is not None or state["crop"] is not None:
        raise TransformError(step, "only one Resize(int) (shorter side) or Resize((s, s)) (stretched) before "
                             "CenterCrop is supported")
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
    if name == "AugMix":
        return _augmix(step, state)
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


def _augmix(step: Any, state: dict) -> None:
    """torchvision's AugMix (v1 or v2) as the graph's (augment._augmix): its severity, width, depth and alpha."""
    if getattr(step, "all_ops", True) is not True or getattr(step, "fill", None) not in (None, 0):
        raise TransformError(step, "only all_ops=True and no fill are supported (the graph composes all 13 of "
                             "AugMix's operations and fills with 0)")
    depth = int(step.chain_depth)
    state["args"].update(auto_augment="augmix", augmix_severity=int(step.severity),
                         augmix_width=int(step.mixture_width), augmix_depth=depth if depth > 0 else -1,
                         augmix_alpha=float(step.alpha))


def _random_erasing(step: Any, state: dict) -> None:
    """torchvision's RandomErasing (v1 or v2) or timm's, as the graph's random_erasing fields. It works on the
    tensor; before Normalize its constant fill is normalised with the image (_normalize)."""
    if state["tensor"] != "float":
        raise TransformError(step, "RandomErasing works on float tensors: put it after ToTensor() (or ToDtype("
                             "torch.float32, scale=True)), after Normalize as torchvision's references and timm do")
    if "random_erasing" in state["args"]:
        raise TransformError(step, "a second RandomErasing")
    state["args"].update(_timm_erasing(step) if hasattr(step, "probability") else _torchvision_erasing(step))


def _torchvision_erasing(step: Any) -> dict:
    value = step.value  # v1 keeps "random"; v2 stores None for it and a list for a number
    mode, fill = "pixel", (0.0, 0.0, 0.0)
    if value is not None and value != "random":
        values = [float(value)] if isinstance(value, numbers.Real) else [float(v) for v in value]
        if len(values) not in (1, 3):
            raise TransformError(step, f"value {value!r}: one number, three (R, G, B) or 'random'")
        red, green, blue = values * 3 if len(values) == 1 else values
        mode, fill = "const", (red, green, blue)
    return dict(random_erasing=float(step.p), random_erasing_area=tuple(map(float, step.scale)),
                random_erasing_ratio=tuple(map(float, step.ratio)), random_erasing_mode=mode,
                random_erasing_value=fill)


def _timm_erasing(step: Any) -> dict:
    if (step.min_count, step.max_count) != (1, 1):
        raise TransformError(step, f"min_count={step.min_count}, max_count={step.max_count}: the graph erases one "
                             f"rectangle per image (timm's default, and DeiT's re_count=1)")
    mode = step.mode or "const"
    if mode not in ("const", "rand", "pixel"):
        raise TransformError(step, f"mode {step.mode!r}: only 'const', 'rand' and 'pixel'")
    return dict(random_erasing=float(step.probability), random_erasing_area=(float(step.min_area),
                float(step.max_area)), random_erasing_ratio=tuple(math.exp(v) for v in step.log_aspect_ratio),
                random_erasing_mode=mode, random_erasing_value=(0.0, 0.0, 0.0))


def _to_pure_tensor(step: Any, state: dict) -> None:
    """v2's ToPureTensor: the tv_tensors' Python type goes, the values stay; the batches are plain tensors."""


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
    args = state["args"]
    if "random_erasing" in args:  # RandomErasing came first: its fill is normalised with the image
        if args["random_erasing_mode"] != "const":
            raise TransformError(step, "RandomErasing with random values before Normalize (the noise would be "
                                 "normalised too): put RandomErasing after Normalize, as torchvision's references "
                                 "and timm do")
        args["random_erasing_value"] = tuple((v - m) / s for v, m, s in zip(args["random_erasing_value"], mean, std))
    args.update(mean=mean, std=std)


_READERS = {"RandomResizedCrop": _random_resized_crop, "Resize": _resize, "CenterCrop": _center_crop,
            "RandomHorizontalFlip": _flip, "ColorJitter": _color_jitter, "AutoAugment": _auto_augment,
            "RandAugment": _auto_augment, "TrivialAugmentWide": _auto_augment, "AugMix": _auto_augment,
            "RandomErasing": _random_erasing, "ToPureTensor": _to_pure_tensor, "ToTensor": _to_tensor,
            "PILToTensor": _pil_to_tensor, "ConvertImageDtype": _convert_dtype, "ToImage": _pil_to_tensor,
            "ToDtype": _convert_dtype, "Normalize": _normalize}
