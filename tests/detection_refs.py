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
DetectionPresetEval = type("DetectionPresetEval", (Preset,), {})


def remove_images_without_annotations(dataset):
    """coco_utils' _coco_remove_images_without_annotations: a Subset of the images with at least one box wider
    and taller than 1 pixel."""
    keep = []
    for index, image_id in enumerate(dataset.ids):
        annotations = dataset.coco.loadAnns(dataset.coco.getAnnIds(imgIds=image_id, iscrowd=None))
        if annotations and not all(any(side <= 1 for side in a["bbox"][2:]) for a in annotations):
            keep.append(index)
    return Subset(dataset, keep)


class Compose:
    """transforms.Compose: each step called as step(image, target)."""

    def __init__(self, transforms) -> None:
        self.transforms = transforms

    def __call__(self, image, target):
        for step in self.transforms:
            image, target = step(image, target)
        return image, target


class RandomHorizontalFlip:
    """transforms.RandomHorizontalFlip: with probability p the image and its xyxy boxes mirrored."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, image, target):
        if torch.rand(1).item() < self.p:
            image = image.transpose(0)  # PIL's FLIP_LEFT_RIGHT
            boxes = target["boxes"].clone()
            boxes[:, [0, 2]] = image.width - target["boxes"][:, [2, 0]]
            target = {**target, "boxes": boxes}
        return image, target


class PILToTensor:
    def __call__(self, image, target):
        import numpy as np
        return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous(), target


class ToDtype:
    def __init__(self, dtype, scale: bool = False) -> None:
        self.dtype, self.scale = dtype, scale

    def __call__(self, image, target):
        return (image.to(self.dtype) / 255 if self.scale else image.to(self.dtype)), target


class ConvertCocoPolysToMask:
    """coco_utils.ConvertCocoPolysToMask's box part: crowd annotations dropped, xywh -> xyxy clamped to the
    image, boxes without width or height dropped; image_id as given; area and iscrowd (the references build
    masks from the polygons too: box models never read them, and DaliLoader does not deliver them). Like theirs,
    it reads every kept annotation's "segmentation": a KeyError where one has none."""

    def __call__(self, image, target):
        width, height = image.size
        annotations = [a for a in target["annotations"] if a["iscrowd"] == 0]
        for a in annotations:
            a["segmentation"]  # the references' masks come from these polygons
        boxes = torch.as_tensor([a["bbox"] for a in annotations], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        boxes[:, 0::2].clamp_(min=0, max=width)
        boxes[:, 1::2].clamp_(min=0, max=height)
        keep = (boxes[:, 3] > boxes[:, 1]) & (boxes[:, 2] > boxes[:, 0])
        labels = torch.tensor([a["category_id"] for a in annotations], dtype=torch.int64)
        area = torch.tensor([a["area"] for a in annotations], dtype=torch.float32)
        iscrowd = torch.tensor([a["iscrowd"] for a in annotations], dtype=torch.int64)
        return image, {"boxes": boxes[keep], "labels": labels[keep], "image_id": target["image_id"],
                       "area": area[keep], "iscrowd": iscrowd[keep]}


def v1_coco_detection(img_folder: str, ann_file: str, transforms):
    """coco_utils.CocoDetection: torchvision's, its target made dict(image_id, annotations) and the
    references' transforms kept in `_transforms`."""
    from torchvision.datasets import CocoDetection

    class ReferencesCocoDetection(CocoDetection):
        def __init__(self, img_folder, ann_file, transforms):
            super().__init__(img_folder, ann_file)
            self._transforms = transforms

        def __getitem__(self, idx):
            image, annotations = super().__getitem__(idx)
            target = dict(image_id=self.ids[idx], annotations=annotations)
            return self._transforms(image, target) if self._transforms is not None else (image, target)

    return ReferencesCocoDetection(img_folder, ann_file, transforms)


class RandomPhotometricDistort:
    """transforms.RandomPhotometricDistort: one ColorJitter per step (_brightness, _contrast, _saturation, _hue),
    each applied with probability p, contrast before or after saturation and hue by a coin, then with probability
    p a random channel permutation."""

    def __init__(self, contrast=(0.5, 1.5), saturation=(0.5, 1.5), hue=(-0.05, 0.05), brightness=(0.875, 1.125),
                 p=0.5) -> None:
        from torchvision.transforms import ColorJitter
        self._brightness, self._contrast = ColorJitter(brightness=brightness), ColorJitter(contrast=contrast)
        self._hue, self._saturation = ColorJitter(hue=hue), ColorJitter(saturation=saturation)
        self.p = p

    def __call__(self, image, target):
        from torchvision.transforms import functional as F
        r = torch.rand(7)
        image = self._brightness(image) if r[0] < self.p else image
        image = self._contrast(image) if r[1] < 0.5 and r[2] < self.p else image
        image = self._saturation(image) if r[3] < self.p else image
        image = self._hue(image) if r[4] < self.p else image
        image = self._contrast(image) if r[1] >= 0.5 and r[5] < self.p else image
        if r[6] < self.p:
            image = F.to_pil_image(F.pil_to_tensor(image)[torch.randperm(3)])
        return image, target


class ScaleJitter:
    """transforms.ScaleJitter (v1): a scale s drawn uniformly from scale_range, the image resized by
    r = min(target_size[1] / height, target_size[0] / width) * s (each side int(side * r)), its boxes with it."""

    def __init__(self, target_size, scale_range=(0.1, 2.0), interpolation="bilinear", antialias=True) -> None:
        self.target_size, self.scale_range = target_size, scale_range
        self.interpolation, self.antialias = interpolation, antialias

    def __call__(self, image, target):
        from torchvision.transforms import functional as F
        width, height = image.size
        low, high = self.scale_range
        r = min(self.target_size[1] / height, self.target_size[0] / width) * (low + torch.rand(1) * (high - low))
        size = [int(height * r), int(width * r)]
        image = F.resize(image, size, antialias=self.antialias)  # bilinear, PIL's
        boxes = target["boxes"] * torch.tensor([size[1] / width, size[0] / height] * 2)
        return image, {**target, "boxes": boxes}


class FixedSizeCrop:
    """transforms.FixedSizeCrop: a window of at most `size` (height, width) at a random offset (one uniform draw
    u for both axes: top = int((H - h) * u), left = int((W - w) * u)); where it cuts, the boxes are shifted and
    clipped to the window and those left without area removed with their labels (and area, iscrowd); then the
    image is padded at the bottom and right to exactly `size` with `fill`. Works on PIL images with v1 targets
    and on v2's (BoundingBoxes given the padded canvas)."""

    def __init__(self, size, fill=0, padding_mode="constant") -> None:
        self.crop_height, self.crop_width = (size, size) if isinstance(size, int) else size
        self.fill, self.padding_mode = fill, padding_mode

    def __call__(self, image, target):
        from torchvision import tv_tensors
        from torchvision.transforms.v2 import functional as F
        height, width = F.get_size(image)
        h, w = min(height, self.crop_height), min(width, self.crop_width)
        boxes = target["boxes"].as_subclass(torch.Tensor).clone().float()
        keep = torch.ones(len(boxes), dtype=torch.bool)
        if (h, w) != (height, width):
            u = torch.rand(1)
            top, left = int((height - h) * u), int((width - w) * u)
            image = F.crop(image, top, left, h, w)
            boxes = boxes - torch.tensor([left, top, left, top])
            boxes = torch.stack([boxes[:, 0].clamp(0, w), boxes[:, 1].clamp(0, h), boxes[:, 2].clamp(0, w),
                                 boxes[:, 3].clamp(0, h)], 1)
            keep = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
        fill = [int(v) for v in self.fill] if isinstance(self.fill, (list, tuple)) else int(self.fill)
        image = F.pad(image, [0, 0, self.crop_width - w, self.crop_height - h], fill=fill)
        boxes = boxes[keep]
        if isinstance(target["boxes"], tv_tensors.BoundingBoxes):
            boxes = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(self.crop_height, self.crop_width))
        per_box = {key: target[key][keep] for key in ("labels", "area", "iscrowd") if key in target}
        return image, {**target, **per_box, "boxes": boxes}
