"""torchvision's CocoDetection as the detection references build it, read as DetectionSamples (never indexed).

The references (references/detection/coco_utils.py, get_coco) build one of two forms:
  * v1: their CocoDetection subclass, whose `_transforms` starts with ConvertCocoPolysToMask (crowd annotations
    dropped, boxes xywh -> xyxy clamped to the image, empty boxes dropped), then the preset;
  * v2: torchvision's CocoDetection (the preset as its `transforms`) wrapped by
    `wrap_dataset_for_transforms_v2(dataset, target_keys=...)` (every annotation, boxes xywh -> xyxy unclamped);
each, for training, inside the `Subset` that leaves out images without annotations. What is read: the COCO
object's `imgs` and `imgToAnns` (pycocotools' index, so pycocotools is never imported here), `ids`, `root`.
Index i of the DetectionDataset's samples is index i of the dataset object: what a sampler draws.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dali_pipes.data.detection import DetectionSample, detection_sample
from dali_pipes.errors import DatasetError

V2_WRAPPER = "VisionDatasetTVTensorWrapper"  # torchvision.tv_tensors._dataset_wrapper's class
V2_DEFAULT_KEYS = ("image_id", "boxes", "labels")  # its target_keys when none are given
V2_ALL_KEYS = ("segmentation", "area", "iscrowd", "image_id", "bbox", "category_id", "boxes", "masks", "labels")


@dataclass(frozen=True)
class DetectionDataset:
    """A detection dataset object read: its samples by the object's index, its transform (the object the
    references pass: a preset, a Compose, or None), the form ("v1" or "v2") and the target keys asked for."""
    samples: list[DetectionSample]
    transforms: Any
    form: str
    target_keys: tuple[str, ...]
    where: str  # the image root, for messages


def is_detection_dataset(dataset: Any) -> bool:
    """A CocoDetection (or the references' subclass), its v2 wrapper, or a Subset of one: anything with a COCO
    index (`coco.imgs`), `ids` and `root` below its Subsets and wrapper."""
    base, _ = _unwrapped(dataset)
    base = base._dataset if is_v2_wrapper(base) else base
    return hasattr(base, "ids") and hasattr(base, "root") and hasattr(getattr(base, "coco", None), "imgs")


def read_detection_dataset(dataset: Any) -> DetectionDataset:
    """The DetectionDataset of a CocoDetection in either of the references' forms (see the module's text)."""
    outer, indices = _unwrapped(dataset)
    if is_v2_wrapper(outer):
        base, form, transforms = outer._dataset, "v2", outer.transforms
        keys = _v2_keys(outer._target_keys)
    else:
        base, form, keys = outer, "v1", ("boxes", "labels", "image_id", "area", "iscrowd")
        transforms = getattr(base, "_transforms", None) or getattr(base, "transforms", None)
    ids = list(base.ids)
    picked = range(len(ids)) if indices is None else indices
    root = str(base.root)
    samples = [coco_sample(base.coco, ids[i], root, form) for i in picked]
    return DetectionDataset(samples, transforms, form, keys, root)


def is_v2_wrapper(dataset: Any) -> bool:
    """wrap_dataset_for_transforms_v2's object: a class made per dataset class (WrappedCocoDetection) on
    VisionDatasetTVTensorWrapper."""
    return any(cls.__name__ == V2_WRAPPER for cls in type(dataset).__mro__) and hasattr(dataset, "_dataset")


def _unwrapped(dataset: Any) -> tuple[Any, list[int] | None]:
    """The object below any torch Subsets, and the base indices they pick (None: all), composed outer first."""
    indices: list[int] | None = None
    while type(dataset).__name__ == "Subset" and hasattr(dataset, "indices"):
        picks = [int(i) for i in dataset.indices]
        indices = picks if indices is None else [picks[i] for i in indices]
        dataset = dataset.dataset
    return dataset, indices


def _v2_keys(target_keys: Any) -> tuple[str, ...]:
    if target_keys is None:
        return V2_DEFAULT_KEYS
    return V2_ALL_KEYS if target_keys == "all" else tuple(target_keys)


def coco_sample(coco: Any, image_id: int, root: str, form: str) -> DetectionSample:
    """One image's DetectionSample from a COCO index: v1 as ConvertCocoPolysToMask converts (no crowd, boxes
    clamped to the image, empty ones dropped), v2 as the v2 wrapper does (every annotation as given)."""
    info = coco.imgs[image_id]
    path = os.path.join(root, info["file_name"])
    width, height = int(info["width"]), int(info["height"])
    annotations = list(coco.imgToAnns.get(image_id, ())) if hasattr(coco.imgToAnns, "get") else \
        list(coco.imgToAnns[image_id])
    if form == "v1":
        annotations = [a for a in annotations if a.get("iscrowd", 0) == 0]
    boxes = np.array([_bbox(a, path, image_id) for a in annotations], np.float32).reshape(-1, 4)
    boxes[:, 2:] += boxes[:, :2]
    keep = np.ones(len(boxes), bool)
    if form == "v1":
        np.clip(boxes[:, 0::2], 0, width, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, height, out=boxes[:, 1::2])
        keep = (boxes[:, 3] > boxes[:, 1]) & (boxes[:, 2] > boxes[:, 0])
    kept = [a for a, k in zip(annotations, keep) if k]
    return detection_sample(path, image_id, width, height, boxes[keep], [a["category_id"] for a in kept],
                            annotation_ids=[a.get("id", -1) for a in kept],
                            iscrowd=[a.get("iscrowd", 0) for a in kept], area=[a.get("area", 0.0) for a in kept])


def _bbox(annotation: dict, path: str, image_id: int) -> list[float]:
    box = annotation.get("bbox")
    if not isinstance(box, (list, tuple)) or len(box) != 4 or "category_id" not in annotation:
        raise DatasetError(f"{path} (image {image_id}, annotation {annotation.get('id')})",
                           f"an annotation without a 4-number bbox or a category_id (bbox={box!r})",
                           "fix or remove the annotation in the COCO JSON")
    return [float(v) for v in box]
