"""Shaped like torchvision's detection references (references/detection/: presets.py, transforms.py,
coco_utils.py), which are scripts, not a package: the classes DaliLoader reads by name and attribute, written
here for the tests (their behaviour per the references' documented contract, not their code)."""

from __future__ import annotations

import torch
from torch.utils.data import Subset


class Preset:
    """DetectionPresetTrain's shape: a Compose in .transforms, called as preset(image, target)."""

    def __init__(self, compose) -> None:
        self.transforms = compose

    def __call__(self, image, target):
        return self.transforms(image, target)


DetectionPresetTrain = type("DetectionPresetTrain", (Preset,), {})


def remove_images_without_annotations(dataset):
    """coco_utils' _coco_remove_images_without_annotations: a Subset of the images with at least one box wider
    and taller than 1 pixel."""
    keep = []
    for index, image_id in enumerate(dataset.ids):
        annotations = dataset.coco.loadAnns(dataset.coco.getAnnIds(imgIds=image_id, iscrowd=None))
        if annotations and not all(any(side <= 1 for side in a["bbox"][2:]) for a in annotations):
            keep.append(index)
    return Subset(dataset, keep)
