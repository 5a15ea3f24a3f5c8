"""A detection transform (the references' presets, v1 or v2) read as a DetectionAugment: never run, never imported.

Steps are recognised by class name and read by attribute, as graph/transforms.py reads classification ones; the
references' v1 classes (references/detection/transforms.py, coco_utils.ConvertCocoPolysToMask) and
torchvision.transforms.v2's share their names. A step with no translation is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dali_pipes.graph.detection import DetectionAugment, IoUCrop, ShortestSize, ZoomOut
from dali_pipes.graph.photometric import PhotometricDistort
from dali_pipes.graph.scale_jitter import FixedSizeCrop, ScaleJitter

CONTAINERS = ("Compose", "DetectionPresetTrain", "DetectionPresetEval")  # steps inside, in order
NO_OPS = ("PILToTensor", "ToImage", "ToPureTensor")  # the decoded image is a tensor already
TO_FLOAT = ("ConvertImageDtype", "ToDtype", "ToTensor")
MASKS_STEP = "ConvertCocoPolysToMask"  # v1 target conversion: its masks are not delivered (a warning says so)


class UntranslatableTransform(ValueError):
    """A step of a detection transform the DALI graph does not do; names the step and what is supported."""


def transform_steps(transform: Any) -> list[Any]:
    """The transform's steps in order, Compose and the references' presets opened."""
    if transform is None:
        return []
    inner = getattr(transform, "transforms", None)
    if type(transform).__name__ in CONTAINERS and inner is not None:
        items = inner if isinstance(inner, (list, tuple)) else [inner]
        return [step for item in items for step in transform_steps(item)]
    return [transform]


def detection_augment(transform: Any) -> tuple[DetectionAugment, bool]:
    """(the DetectionAugment of `transform`, whether it has the v1 ConvertCocoPolysToMask step). Raises
    UntranslatableTransform naming the first step the graph cannot do."""
    settings: dict[str, Any] = {}
    names, has_masks, to_float = [], False, False
    for step in transform_steps(transform):
        name = type(step).__name__
        names.append(name)
        if name == MASKS_STEP:
            has_masks = True
        elif name in TO_FLOAT:
            to_float = _float_step(step, name) or to_float
        elif name not in NO_OPS:
            _read_step(step, name, settings)
    if not to_float:
        raise UntranslatableTransform(
            f"detection transform {names}: no ConvertImageDtype(torch.float) / ToDtype(torch.float, scale=True) "
            f"step; the DALI graph delivers float images in [0, 1], as the references' presets end. Add the step")
    if "crop" in settings and "zoom" in settings and names.index("RandomIoUCrop") < names.index("RandomZoomOut"):
        raise UntranslatableTransform("RandomIoUCrop before RandomZoomOut: the graph zooms out first, as the "
                                      "references' ssd preset does; put RandomZoomOut first")
    _check_photometric_first(names)
    if "shortest" in settings and ("crop" in settings or "zoom" in settings):
        raise UntranslatableTransform("RandomShortestSize with RandomIoUCrop or RandomZoomOut: no references' "
                                      "preset has both, and the graph resizes the decoded image only")
    _check_large_scale_jitter(names)
    return DetectionAugment(flip_prob=settings.get("flip", 0.0), zoom_out=settings.get("zoom"),
                            iou_crop=settings.get("crop"), sanitize=settings.get("sanitize"),
                            shortest_size=settings.get("shortest"), photometric=settings.get("photometric"),
                            scale_jitter=settings.get("jitter"), fixed_crop=settings.get("fixed_crop"),
                            steps=tuple(names)), has_masks


def _float_step(step: Any, name: str) -> bool:
    import torch
    dtype = getattr(step, "dtype", torch.float32)
    if isinstance(dtype, Mapping):  # v2's ToDtype({tv_tensors.Image: torch.float32, "others": None})
        dtype = next((v for k, v in dtype.items() if getattr(k, "__name__", k) == "Image"), None)
    if name == "ToDtype" and not getattr(step, "scale", False):
        raise UntranslatableTransform(f"{name}(dtype={dtype}, scale=False): images stay in [0, 255]; the DALI graph "
                                      f"delivers [0, 1], as ToDtype(torch.float, scale=True) does. Use scale=True")
    if dtype not in (torch.float32, torch.float):
        raise UntranslatableTransform(f"{name}(dtype={dtype}): the DALI graph delivers float32 images only")
    return True


def _read_step(step: Any, name: str, settings: dict[str, Any]) -> None:
    if name == "RandomHorizontalFlip":
        settings["flip"] = float(step.p)
    elif name == "SanitizeBoundingBoxes":
        settings["sanitize"] = (float(step.min_size), float(getattr(step, "min_area", 1.0)))
    elif name == "ConvertBoundingBoxFormat" and str(getattr(step.format, "name", step.format)).upper() == "XYXY":
        pass  # the boxes are xyxy already
    elif name == "RandomIoUCrop":
        settings["crop"] = _iou_crop(step)
    elif name == "RandomShortestSize":
        settings["shortest"] = ShortestSize(min_size=tuple(int(m) for m in step.min_size),
                                            max_size=None if step.max_size is None else int(step.max_size))
    elif name == "RandomPhotometricDistort":
        settings["photometric"] = _photometric(step)
    elif name == "RandomZoomOut":
        low, high = (float(side) for side in step.side_range)
        settings["zoom"] = ZoomOut(fill=_image_fill(step.fill), side_range=(low, high), p=float(step.p))
    elif name == "ScaleJitter":
        settings["jitter"] = _scale_jitter(step)
    elif name == "FixedSizeCrop":
        settings["fixed_crop"] = _fixed_size_crop(step)
    else:
        raise UntranslatableTransform(
            f"detection transform step {name} ({step!r}) has no DALI translation; supported: RandomHorizontalFlip, "
            f"RandomIoUCrop, RandomPhotometricDistort, RandomShortestSize, RandomZoomOut, ScaleJitter, "
            f"FixedSizeCrop, SanitizeBoundingBoxes, "
            f"ConvertBoundingBoxFormat(XYXY), PILToTensor / ToImage, ConvertImageDtype / ToDtype(torch.float, "
            f"scale=True), ToPureTensor. Remove the step or use torch's DataLoader for this transform")


GEOMETRIC = ("RandomZoomOut", "RandomIoUCrop", "RandomShortestSize", "ScaleJitter", "FixedSizeCrop")
LSJ = ("ScaleJitter", "FixedSizeCrop")  # the lsj preset's steps, in its order


def _check_large_scale_jitter(names: list[str]) -> None:
    """The graph resizes (ScaleJitter), then crops and pads (FixedSizeCrop), then flips, as the lsj preset orders
    them; another order, or lsj with another geometric step, has no translation."""
    present = [name for name in names if name in LSJ]
    if not present:
        return
    others = [name for name in names if name in GEOMETRIC and name not in LSJ]
    if others:
        raise UntranslatableTransform(f"{present[0]} with {others[0]}: no references' preset has both, and the "
                                      f"graph does the lsj preset's ScaleJitter and FixedSizeCrop alone")
    if present != sorted(present, key=LSJ.index) or len(present) != len(set(present)):
        raise UntranslatableTransform(f"{present}: the graph does ScaleJitter once, then FixedSizeCrop once, as the "
                                      f"references' lsj preset does; put them in that order")
    flips = [i for i, name in enumerate(names) if name == "RandomHorizontalFlip"]
    if "FixedSizeCrop" in names and flips and flips[0] < names.index("FixedSizeCrop"):
        raise UntranslatableTransform("RandomHorizontalFlip before FixedSizeCrop: the graph flips the padded crop, "
                                      "as the references' lsj preset does (the padding on the right before the "
                                      "flip); put RandomHorizontalFlip after FixedSizeCrop")


def _scale_jitter(step: Any) -> ScaleJitter:
    """v2's ScaleJitter and the references' v1 class share their attributes; the graph resizes bilinearly with
    antialiasing, as torchvision does for PIL images (the presets' default) and for tensors with antialias=True."""
    mode = getattr(step, "interpolation", "bilinear")
    if str(getattr(mode, "value", mode)).lower() not in ("bilinear", "2"):  # 2: PIL's BILINEAR
        raise UntranslatableTransform(f"ScaleJitter(interpolation={mode}): only bilinear resizes are translated")
    width_for, height_for = (int(side) for side in step.target_size)  # torchvision: [1] / height, [0] / width
    low, high = (float(s) for s in step.scale_range)
    try:
        return ScaleJitter(target_size=(width_for, height_for), scale_range=(low, high))
    except ValueError as e:
        raise UntranslatableTransform(f"{step!r}: {e}") from e


def _fixed_size_crop(step: Any) -> FixedSizeCrop:
    """The references' FixedSizeCrop: crop_height, crop_width, fill, padding_mode (constant only)."""
    mode = getattr(step, "padding_mode", "constant")
    if mode != "constant":
        raise UntranslatableTransform(f"FixedSizeCrop(padding_mode={mode!r}): only padding_mode='constant' (the "
                                      f"references' default) is translated")
    try:
        return FixedSizeCrop(size=(int(step.crop_height), int(step.crop_width)), fill=_image_fill(step.fill))
    except ValueError as e:
        raise UntranslatableTransform(f"{step!r}: {e}") from e


def _check_photometric_first(names: list[str]) -> None:
    """The graph distorts the whole decoded image before any geometric step, as the references' ssd preset does;
    after a crop or a zoom-out its contrast mean (and the fill's colours) would differ, so that order is refused."""
    if "RandomPhotometricDistort" not in names:
        return
    where = names.index("RandomPhotometricDistort")
    before = [name for name in names[:where] if name in GEOMETRIC]
    if before:
        raise UntranslatableTransform(f"RandomPhotometricDistort after {before[0]}: the graph distorts the whole "
                                      f"decoded image first, as the references' ssd preset does; put "
                                      f"RandomPhotometricDistort first")


def _photometric(step: Any) -> PhotometricDistort:
    """v2's ranges are attributes; the references' v1 class keeps one ColorJitter per step (_brightness, ...),
    whose range is None where it is the identity ((1, 1), or (0, 0) for hue)."""
    def bounds(name: str, identity: float) -> tuple[float, float]:
        value = getattr(step, name, None)
        if value is None and hasattr(step, f"_{name}"):
            value = getattr(getattr(step, f"_{name}"), name)
        if value is None:
            return (identity, identity)
        low, high = (float(v) for v in value)
        return (low, high)
    try:
        return PhotometricDistort(brightness=bounds("brightness", 1.0), contrast=bounds("contrast", 1.0),
                                  saturation=bounds("saturation", 1.0), hue=bounds("hue", 0.0), p=float(step.p))
    except ValueError as e:
        raise UntranslatableTransform(f"{step!r}: {e}") from e


def _iou_crop(step: Any) -> IoUCrop:
    options = sorted(float(o) for o in step.options)
    if options != [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]:
        raise UntranslatableTransform(f"RandomIoUCrop(sampler_options={options}): only the default options "
                                      f"[0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] are translated")
    return IoUCrop(min_scale=float(step.min_scale), max_scale=float(step.max_scale),
                   min_aspect_ratio=float(step.min_aspect_ratio), max_aspect_ratio=float(step.max_aspect_ratio),
                   trials=int(step.trials))


def _image_fill(fill: Any) -> tuple[float, float, float]:
    """RandomZoomOut's fill for the image: a number, a per-channel list, or v2's dict by type (the references'
    defaultdict(lambda: mean, {tv_tensors.Mask: 0}))."""
    if isinstance(fill, Mapping):
        image = [v for k, v in fill.items() if getattr(k, "__name__", k) == "Image"]
        factory = getattr(fill, "default_factory", None)
        fill = image[0] if image else factory() if factory is not None else 0
    values = [float(fill)] * 3 if isinstance(fill, (int, float)) else [float(v) for v in fill]
    values = values * 3 if len(values) == 1 else values
    return (values[0], values[1], values[2])


# The references' presets by their --data-augmentation name (references/detection/presets.py), v2 form, as
# DetectionAugment settings: what DetectionPresetTrain(data_augmentation=NAME, use_v2=True) reads as, without
# torchvision. Each ends ToDtype(float, scale=True), ConvertBoundingBoxFormat(XYXY), SanitizeBoundingBoxes().
PRESET_MEAN = (123.0, 117.0, 104.0)  # the presets' RandomZoomOut fill
MULTISCALE_SIZES = (480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800)
PRESET_STEPS = {
    "hflip": ("RandomHorizontalFlip",),
    "multiscale": ("RandomShortestSize", "RandomHorizontalFlip"),
    "ssd": ("RandomPhotometricDistort", "RandomZoomOut", "RandomIoUCrop", "RandomHorizontalFlip"),
    "ssdlite": ("RandomIoUCrop", "RandomHorizontalFlip"),
    "lsj": ("ScaleJitter", "FixedSizeCrop", "RandomHorizontalFlip"),
}
LSJ_SIZE = (1024, 1024)  # the lsj preset's ScaleJitter target_size and FixedSizeCrop size
PRESET_TAIL = ("ToDtype", "ConvertBoundingBoxFormat", "SanitizeBoundingBoxes", "ToPureTensor")
EVAL_STEPS = ("ToImage", "ToDtype", "ToPureTensor")  # DetectionPresetEval


def preset_augment(name: str, train: bool, hflip_prob: float = 0.5) -> DetectionAugment:
    """The DetectionAugment of the references' preset `name` ("hflip", "multiscale", "ssd", "ssdlite", "lsj")
    when `train`; of DetectionPresetEval (decode, float in [0, 1], nothing random) otherwise, whatever the name."""
    if name not in PRESET_STEPS:
        raise UntranslatableTransform(f"data_augmentation={name!r}: the presets read are "
                                      f"{', '.join(PRESET_STEPS)}, as torchvision's detection references name them")
    if not train:
        return DetectionAugment(steps=EVAL_STEPS)
    steps = PRESET_STEPS[name]
    return DetectionAugment(
        flip_prob=hflip_prob, sanitize=(1.0, 1.0), steps=("ToImage", *steps, *PRESET_TAIL),
        photometric=PhotometricDistort() if "RandomPhotometricDistort" in steps else None,
        zoom_out=ZoomOut(fill=PRESET_MEAN, side_range=(1.0, 4.0), p=0.5) if "RandomZoomOut" in steps else None,
        iou_crop=IoUCrop() if "RandomIoUCrop" in steps else None,
        shortest_size=ShortestSize(min_size=MULTISCALE_SIZES, max_size=1333) if name == "multiscale" else None,
        scale_jitter=ScaleJitter(target_size=LSJ_SIZE) if name == "lsj" else None,
        fixed_crop=FixedSizeCrop(size=LSJ_SIZE, fill=PRESET_MEAN) if name == "lsj" else None)
