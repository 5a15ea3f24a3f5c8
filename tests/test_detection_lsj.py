"""The references' lsj preset (ScaleJitter, FixedSizeCrop, RandomHorizontalFlip) through DaliLoader, checked
against torchvision: v2's own ScaleJitter (and the references' v1 class, shaped in tests/detection_refs.py) and the
references' FixedSizeCrop as documented, at tiny sizes (target 40 px, crops of 48-64 px) given to the steps."""

from __future__ import annotations

import detection_refs
import pytest
import torch
from test_detection import IMAGES, assert_same, coco_dir, collate_fn, pairs, v1_dataset, v2_dataset  # noqa: F401
from torch.utils.data import DataLoader

from dali_pipes import DaliLoader

MEAN = (123.0, 117.0, 104.0)  # the presets' fill; its blue (104) is no fixture image's (40 * image id)


def lsj_v2(torchvision, target=40, scale=(1.2, 1.2), size=56, p=1.0, crop=True):
    """The references' v2 lsj preset at a small size: ScaleJitter, FixedSizeCrop(fill=mean), the flip, then the
    pil backend's ToImage and the v2 tail."""
    from torchvision.transforms import v2
    steps = [v2.ScaleJitter(target_size=(target, target), scale_range=scale, antialias=True)]
    steps += [detection_refs.FixedSizeCrop(size=(size, size), fill=MEAN)] if crop else []
    return steps + [v2.RandomHorizontalFlip(p=p), v2.ToImage(), v2.ToDtype(torch.float, scale=True),
                    v2.ConvertBoundingBoxFormat("XYXY"), v2.SanitizeBoundingBoxes(), v2.ToPureTensor()]


def lsj_v1(target=40, scale=(1.2, 1.2), size=56, p=1.0):
    R = detection_refs
    return [R.ScaleJitter(target_size=(target, target), scale_range=scale, antialias=True),
            R.FixedSizeCrop(size=(size, size), fill=MEAN), R.RandomHorizontalFlip(p), R.PILToTensor(),
            R.ToDtype(torch.float, scale=True)]


def image_extent(image: torch.Tensor) -> tuple[int, int, int]:
    """(height, width, first column) of the image on its padded canvas, found by its blue (the fill's is 104)."""
    inside = ((image[2] * 255 - MEAN[2]).abs() > 8).nonzero()
    (top, left), (bottom, right) = inside.min(0).values.tolist(), inside.max(0).values.tolist()
    assert top == 0
    return bottom + 1, right - left + 1, left


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_lsj_without_a_cut_matches_torchvision(torchvision, coco_dir, form):  # noqa: F811
    """A fixed scale whose images fit the crop: no random draw left, so DataLoader's samples are the reference:
    the output exactly `size`, the resized image where torchvision puts it (flipped: the padding on the left),
    pixels within resampling's differences, the padding exactly the fill, boxes within a pixel, labels exact."""
    import warnings
    if form == "v1":
        warnings.filterwarnings("ignore", message=".*without masks")
        dataset = v1_dataset(coco_dir, lsj_v1())
    else:
        dataset = v2_dataset(torchvision, coco_dir, lsj_v2(torchvision))
    got, _ = pairs(DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu"))
    want, _ = pairs(DataLoader(dataset, batch_size=4, collate_fn=collate_fn))
    assert {tuple(image.shape) for image, _ in got} == {(3, 56, 56)}
    assert_same(got, want, pixel_tolerance=0.25)
    for (image, target), (ref, _) in zip(got, want):
        height, width, left = image_extent(image)
        assert (height, width, left) == image_extent(ref) and left == 56 - width
        padding = torch.cat([image[:, height:].flatten(1), image[:, :, :left].flatten(1)], 1) * 255
        assert torch.equal(padding.round(), torch.tensor(MEAN)[:, None].expand_as(padding)), target["image_id"]
        assert (image - ref).abs().mean().item() < 2 / 255


def candidates(resized: torch.Tensor, size: int):
    """Every (window, top, left, flipped) of a size x size crop of `resized`, padded with the fill where shorter."""
    height, width = resized.shape[-2:]
    h, w = min(height, size), min(width, size)
    for top in range(height - h + 1):
        for left in range(width - w + 1):
            window = torch.tensor(MEAN)[:, None, None].expand(3, size, size) / 255
            window = window.clone()
            window[:, :h, :w] = resized[:, top:top + h, left:left + w]
            for flipped in (False, True):
                yield window.flip(-1) if flipped else window, top, left, flipped


def test_lsj_crop_boxes_equal_torchvisions_for_the_read_back_window(torchvision, coco_dir):  # noqa: F811
    """A fixed scale of 2 (every image larger than the 48 px crop): the window and flip read back by matching the
    output against torchvision's own ScaleJitter image; torchvision's crop, clamp, flip and sanitising of its
    ScaleJitter boxes give ours within a pixel, the same labels; the window's top and left one draw u apart
    (top = int((H - 48) * u), left = int((W - 48) * u)), and over epochs at several offsets."""
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F
    dataset = v2_dataset(torchvision, coco_dir, lsj_v2(torchvision, scale=(2.0, 2.0), size=48, p=0.5))
    jittered = v2_dataset(torchvision, coco_dir, lsj_v2(torchvision, scale=(2.0, 2.0), p=0.0, crop=False)[:4])
    references = {target["image_id"]: (image, target) for image, target in pairs(DataLoader(
        jittered, batch_size=4, collate_fn=collate_fn))[0]}
    loader = DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu", seed=6)
    windows = set()
    for _ in range(4):
        for image, target in pairs(loader)[0]:
            resized, reference = references[target["image_id"]]
            assert tuple(image.shape) == (3, 48, 48)
            scored = sorted(((image - w).abs().mean().item(), t, left, f) for w, t, left, f in candidates(resized, 48))
            (error, top, left, flipped), runner_up = scored[0], scored[1][0]
            assert error < 1.5 / 255 and error < 0.5 * runner_up, (target["image_id"], scored[:2])
            height, width = resized.shape[-2:]
            u_low = max(top / max(height - 48, 1), left / max(width - 48, 1))
            u_high = min((top + 1) / (height - 48) if height > 48 else 1, (left + 1) / (width - 48) if width > 48
                         else 1)
            assert u_low < u_high, (top, left, height, width)  # one draw for both axes, as the references'
            boxes = F.crop(tv_tensors.BoundingBoxes(reference["boxes"], format="XYXY", canvas_size=(height, width)),
                           top, left, min(height, 48), min(width, 48)).as_subclass(torch.Tensor)
            labels = reference["labels"]
            kept = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
            boxes, labels = boxes[kept], labels[kept]
            boxes = F.horizontal_flip_bounding_boxes(boxes, format=tv_tensors.BoundingBoxFormat.XYXY,
                                                     canvas_size=(48, 48)) if flipped else boxes
            valid = F.sanitize_bounding_boxes(boxes, format="XYXY", canvas_size=(48, 48))[1]
            assert target["labels"].tolist() == labels[valid].tolist(), target["image_id"]
            assert torch.allclose(target["boxes"], boxes[valid].float(), atol=1.0), (target, boxes[valid])
            windows.add((target["image_id"], top, left))
    assert len(windows) > 8


def test_lsj_scale_is_drawn_uniformly_from_scale_range(torchvision, coco_dir):  # noqa: F811
    """scale_range (0.5, 2.0) with every image fitting the 64 px crop: each image's size on its canvas gives the
    drawn scale (within the truncation to whole pixels: both sides int(side * r) for one r, as torchvision sizes
    them); over 100 draws all within the range, spread over it (mean and median near 1.25, both ends reached)."""
    dataset = v2_dataset(torchvision, coco_dir, lsj_v2(torchvision, target=32, scale=(0.5, 2.0), size=64, p=0.0))
    loader = DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu", seed=7)
    scales = []
    for _ in range(25):
        for image, target in pairs(loader)[0]:
            (h, w), _ = IMAGES[target["image_id"]]
            height, width, left = image_extent(image)
            base = min(32 / h, 32 / w)
            low, high = max(height / h, width / w), min((height + 1) / h, (width + 1) / w)
            assert left == 0 and low < high, (target["image_id"], height, width)  # int(h * r), int(w * r): one r
            assert 0.5 <= high / base and low / base <= 2.0, (target["image_id"], height, width)
            scale = (low + high) / 2 / base
            scales.append(scale)
    scales.sort()
    assert len(scales) == 100 and abs(sum(scales) / 100 - 1.25) < 0.15 and abs(scales[50] - 1.25) < 0.2
    assert scales[0] < 0.7 and scales[-1] > 1.8


def test_lsj_is_read_alike_from_v1_and_v2_and_other_orders_are_refused(torchvision):
    """The references' v1 ScaleJitter / FixedSizeCrop and v2's ScaleJitter read to the same settings; a flip
    before the crop, the crop before the jitter, lsj with another geometric step and a non-bilinear resize are
    refused, naming the step."""
    from torchvision.transforms import v2

    from dali_pipes.graph.detection_transforms import detection_augment
    from dali_pipes.graph.scale_jitter import FixedSizeCrop, ScaleJitter
    v1, _ = detection_augment(detection_refs.Compose(lsj_v1(scale=(0.1, 2.0), size=64, p=0.5)))
    v2_read, _ = detection_augment(v2.Compose(lsj_v2(torchvision, scale=(0.1, 2.0), size=64, p=0.5)))
    assert v1.scale_jitter == v2_read.scale_jitter == ScaleJitter(target_size=(40, 40), scale_range=(0.1, 2.0))
    assert v1.fixed_crop == v2_read.fixed_crop == FixedSizeCrop(size=(64, 64), fill=MEAN)
    assert v1.flip_prob == v2_read.flip_prob == 0.5 and v2_read.sanitize is not None
    steps = lsj_v2(torchvision)
    refused = {"RandomHorizontalFlip before FixedSizeCrop": [steps[0], steps[2], steps[1]] + steps[3:],
               r"\['FixedSizeCrop', 'ScaleJitter'\]: the graph does ScaleJitter once": [steps[1], steps[0]] + steps[2:],
               "ScaleJitter with RandomIoUCrop": [steps[0], v2.RandomIoUCrop()] + steps[1:],
               r"ScaleJitter\(interpolation=.*NEAREST.*\): only bilinear": [v2.ScaleJitter(
                   (40, 40), interpolation=v2.InterpolationMode.NEAREST)] + steps[1:],
               r"FixedSizeCrop\(padding_mode='edge'\)": [steps[0], detection_refs.FixedSizeCrop(
                   48, padding_mode="edge")] + steps[2:]}
    for message, transform in refused.items():
        with pytest.raises(ValueError, match=message):
            detection_augment(v2.Compose(transform))
