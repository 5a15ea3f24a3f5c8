"""Detection through the rename (issue 35): torchvision's CocoDetection as the references build it (v1: their
target conversion and transforms, shaped in tests/detection_refs.py; v2: torchvision's own wrapper and
transforms.v2), read by DaliLoader into the detection graph, checked against torchvision itself: the same
images (within decoder rounding), boxes within a pixel, labels and image ids exact, DataLoader's batch counts
and sampler order."""

from __future__ import annotations

import json
import os

import detection_refs
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from dali_pipes import DaliLoader
from dali_pipes.detection_loader import DetectionLoader
from dali_pipes.errors import DatasetError

# (height, width) and boxes (x, y, w, h, category, iscrowd) per image; image 4 has no annotation (the references'
# Subset leaves it out), image 2 has a crowd box (v1 drops it), a box 0.5 px wide (SanitizeBoundingBoxes drops
# it, v1 keeps it) and a box past the image's right edge (v1 clamps it; v2 keeps it, and Sanitize drops it).
IMAGES = {
    1: ((48, 64), [(4, 6, 20, 12, 1, 0), (30, 10, 25, 30, 3, 0)]),
    2: ((40, 40), [(2, 2, 10, 10, 2, 1), (10, 12, 0.5, 8, 1, 0), (20, 5, 30, 20, 2, 0), (5, 20, 12, 14, 3, 0)]),
    3: ((64, 32), [(1, 1, 30, 62, 1, 0)]),
    4: ((30, 50), []),
    5: ((36, 52), [(10, 8, 16, 16, 2, 0), (0, 0, 52, 36, 1, 0)]),
}


def collate_fn(batch):  # the references' utils.collate_fn
    return tuple(zip(*batch))


@pytest.fixture(scope="module")
def coco_dir(tmp_path_factory):
    """A COCO-style folder: images/NNN.jpg (smooth gradients, so JPEG keeps them close and a flip shows) and
    annotations.json with the boxes above."""
    root = tmp_path_factory.mktemp("coco")
    (root / "images").mkdir()
    images, annotations, ann_id = [], [], 100
    for image_id, ((h, w), boxes) in IMAGES.items():
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 40 * image_id)], -1).astype(np.uint8)
        name = f"{image_id:03d}.jpg"
        Image.fromarray(pixels).save(root / "images" / name, quality=95)
        images.append({"id": image_id, "file_name": name, "height": h, "width": w})
        for bx, by, bw, bh, category, crowd in boxes:
            annotations.append({"id": ann_id, "image_id": image_id, "bbox": [bx, by, bw, bh], "category_id": category,
                                "iscrowd": crowd, "area": float(bw * bh), "segmentation": [[bx, by, bx + bw, by,
                                                                                            bx + bw, by + bh]]})
            ann_id += 1
    categories = [{"id": i, "name": f"c{i}"} for i in (1, 2, 3)]
    with open(root / "annotations.json", "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return root


def v2_dataset(torchvision, coco_dir, steps, target_keys=("boxes", "labels", "image_id"), subset=True):
    """As the references' get_coco(use_v2=True) builds it: CocoDetection(transforms=preset), wrapped, and for
    training the Subset without images lacking annotations."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2
    preset = detection_refs.DetectionPresetTrain(v2.Compose(steps))
    dataset = CocoDetection(str(coco_dir / "images"), str(coco_dir / "annotations.json"), transforms=preset)
    dataset = wrap_dataset_for_transforms_v2(dataset, target_keys=list(target_keys))
    return detection_refs.remove_images_without_annotations(dataset) if subset else dataset


def v2_hflip(torchvision, p=0.5):
    from torchvision.transforms import v2
    return [v2.ToImage(), v2.RandomHorizontalFlip(p=p), v2.ToDtype(torch.float, scale=True),
            v2.ConvertBoundingBoxFormat("XYXY"), v2.SanitizeBoundingBoxes(), v2.ToPureTensor()]


def pairs(loader):
    """Every (image, target) a loader delivers with the references' collate_fn, in order, and the batch sizes."""
    out, sizes = [], []
    for images, targets in loader:
        out += list(zip(images, targets))
        sizes.append(len(images))
    return out, sizes


def assert_same(ours, theirs, pixel_tolerance=2 / 255):
    assert len(ours) == len(theirs)
    for (image, target), (ref_image, ref_target) in zip(ours, theirs):
        assert target["image_id"] == ref_target["image_id"]
        assert set(target) == set(ref_target)
        assert image.shape == ref_image.shape and image.dtype == torch.float32
        assert (image - ref_image).abs().max().item() <= pixel_tolerance, target["image_id"]
        if "boxes" in ref_target:
            assert target["labels"].dtype == torch.int64
            assert target["labels"].tolist() == ref_target["labels"].tolist(), target["image_id"]
            assert target["boxes"].dtype == torch.float32 and target["boxes"].shape == ref_target["boxes"].shape
            assert torch.allclose(target["boxes"], ref_target["boxes"].float(), atol=1.0), target["image_id"]


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_v2_hflip_matches_torchvision(torchvision, coco_dir, p):
    dataset = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision, p))
    ours = DaliLoader(dataset, batch_size=2, sampler=SequentialSampler(dataset), collate_fn=collate_fn,
                      device="cpu")
    assert isinstance(ours, DetectionLoader) and ours.dataset is dataset
    theirs = DataLoader(dataset, batch_size=2, sampler=SequentialSampler(dataset), collate_fn=collate_fn)
    got, sizes = pairs(ours)
    want, want_sizes = pairs(theirs)
    assert sizes == want_sizes == [2, 2] and len(ours) == len(theirs)
    assert_same(got, want)
    boxes_of_2 = dict((t["image_id"], t) for _, t in got)[2]["boxes"]
    assert len(boxes_of_2) == 2  # the 0.5 px box and the one past the edge sanitised away; the crowd box kept


def v1_dataset(coco_dir, steps, subset=True):
    """As the references' get_coco(use_v2=False) builds it: their CocoDetection with ConvertCocoPolysToMask then
    the preset, and for training the Subset without images lacking annotations."""
    R = detection_refs
    transforms = R.Compose([R.ConvertCocoPolysToMask(), R.DetectionPresetTrain(R.Compose(steps))])
    dataset = R.v1_coco_detection(str(coco_dir / "images"), str(coco_dir / "annotations.json"), transforms)
    return R.remove_images_without_annotations(dataset) if subset else dataset


def v1_hflip(p=0.5):
    return [detection_refs.RandomHorizontalFlip(p), detection_refs.PILToTensor(),
            detection_refs.ToDtype(torch.float, scale=True)]


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_v1_hflip_matches_the_references_targets_without_masks(torchvision, coco_dir, p):
    dataset = v1_dataset(coco_dir, v1_hflip(p))
    with pytest.warns(UserWarning, match="without masks"):
        ours = DaliLoader(dataset, batch_size=3, sampler=SequentialSampler(dataset), collate_fn=collate_fn,
                          device="cpu")
    got, sizes = pairs(ours)
    want, want_sizes = pairs(DataLoader(dataset, batch_size=3, sampler=SequentialSampler(dataset),
                                        collate_fn=collate_fn))
    assert sizes == want_sizes == [3, 1]
    assert_same(got, want)
    for (_, target), (_, ref) in zip(got, want):
        assert target["area"].tolist() == ref["area"].tolist() and target["area"].dtype == torch.float32
        assert target["iscrowd"].tolist() == ref["iscrowd"].tolist() and target["iscrowd"].dtype == torch.int64
    by_id = {t["image_id"]: t for _, t in got}
    assert len(by_id[2]["boxes"]) == 3 and by_id[2]["boxes"][:, 0::2].max() <= 40  # no crowd; clamped, not dropped


def epochs_of(loader, epochs=2):
    return [[[t["image_id"] for t in targets] for _, targets in loader] for _ in range(epochs)]


def test_sampler_order_and_counts_are_dataloaders(torchvision, coco_dir):
    """A RandomSampler on torch's global stream (the references' train sampler) and a BatchSampler over a
    seeded one (the references' batch_sampler without aspect-ratio groups): the same image ids in the same
    batches as DataLoader, epoch after epoch. (No random step in the transform: DataLoader on one process runs
    it on the global stream between epochs, DaliLoader draws in DALI; with workers, DataLoader's main stream
    too serves only the base seed and the sampler.)"""
    dataset = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision)[:1] + v2_hflip(torchvision)[2:])
    for make in (lambda: {"batch_size": 2, "sampler": RandomSampler(dataset)},
                 lambda: {"batch_sampler": BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(
                     3)), 3, drop_last=True)}):
        torch.manual_seed(7)
        ours = DaliLoader(dataset, collate_fn=collate_fn, device="cpu", **make())
        got = epochs_of(ours)
        torch.manual_seed(7)
        theirs = DataLoader(dataset, collate_fn=collate_fn, **make())
        want = epochs_of(theirs)
        assert got == want and len(ours) == len(theirs)
        assert got[0] != got[1]  # drawn afresh each epoch
    assert [len(batch) for batch in got[0]] == [3]  # drop_last: 4 images, one batch of 3


def test_the_batch_size_has_one_home_the_batch_sampler(torchvision, coco_dir):
    """issue 34: a detection loader's batch size is stored once, in its batch sampler (DataLoader's BatchSampler,
    or the one given); `batch_size` reads it there as DataLoader's attribute does (None where a batch_sampler was
    given), and DALI batches by it."""
    dataset = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision)[:1] + v2_hflip(torchvision)[2:])
    for kwargs in ({"batch_size": 3}, {"batch_sampler": BatchSampler(SequentialSampler(dataset), 2, drop_last=False)}):
        ours = DaliLoader(dataset, collate_fn=collate_fn, device="cpu", **kwargs)
        assert "batch_size" not in vars(ours)  # no copy of its own
        assert ours.batch_size == DataLoader(dataset, collate_fn=collate_fn, **kwargs).batch_size
        assert ours.run.pipe.max_batch_size == ours.batch_sampler.batch_size  # what DALI batches by
        ours.close()


def test_an_image_without_annotations_gives_its_image_id_only_under_v2(torchvision, coco_dir):
    dataset = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision, 0.0)[:3], subset=False)  # no Sanitize
    got, _ = pairs(DaliLoader(dataset, batch_size=5, collate_fn=collate_fn, device="cpu"))
    want, _ = pairs(DataLoader(dataset, batch_size=5, collate_fn=collate_fn))
    assert [t for _, t in got if t["image_id"] == 4] == [{"image_id": 4}]
    assert_same(got, want)


def test_untranslatable_steps_and_mask_targets_are_refused_by_name(torchvision, coco_dir):
    from torchvision.transforms import v2
    rotate = v2_hflip(torchvision)[:2] + [v2.RandomRotation(10)] + v2_hflip(torchvision)[2:]
    with pytest.raises(ValueError, match="RandomRotation .* has no DALI translation"):
        DaliLoader(v2_dataset(torchvision, coco_dir, rotate), batch_size=2, collate_fn=collate_fn, device="cpu")
    unscaled = [v2.ToImage(), v2.ToDtype(torch.float)]
    with pytest.raises(ValueError, match=r"ToDtype\(dtype=torch.float32, scale=False\)"):
        DaliLoader(v2_dataset(torchvision, coco_dir, unscaled), batch_size=2, collate_fn=collate_fn, device="cpu")
    masks = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision), target_keys=("boxes", "labels", "masks"))
    with pytest.raises(ValueError, match=r"asks for \['masks'\].*not supported"):
        DaliLoader(masks, batch_size=2, collate_fn=collate_fn, device="cpu")


def test_a_missing_image_is_named(torchvision, coco_dir, tmp_path):
    import shutil
    shutil.copytree(coco_dir, tmp_path / "coco")
    os.remove(tmp_path / "coco" / "images" / "003.jpg")
    dataset = v2_dataset(torchvision, tmp_path / "coco", v2_hflip(torchvision))
    loader = DaliLoader(dataset, batch_size=2, collate_fn=collate_fn, device="cpu")
    with pytest.raises(DatasetError, match=r"003.jpg: image 3 cannot be read .*file_name"):
        list(loader)


def ssd_steps(torchvision, zoom: bool, photometric: bool = False):
    """The references' v2 ssdlite preset (RandomIoUCrop, RandomHorizontalFlip), ssd's geometric steps
    (RandomZoomOut first, filled with the preset's mean), or the whole ssd preset (RandomPhotometricDistort
    first)."""
    from torchvision.transforms import v2
    steps = v2_hflip(torchvision)
    zoom_out = [v2.RandomZoomOut(fill=[123.0, 117.0, 104.0])] if zoom else []
    distort = [v2.RandomPhotometricDistort()] if photometric else []
    return steps[:1] + distort + zoom_out + [v2.RandomIoUCrop()] + steps[1:]


@pytest.mark.parametrize("zoom, photometric", [(False, False), (True, False), (True, True)],
                         ids=["ssdlite", "ssd-geometry", "ssd"])
def test_iou_crop_and_zoom_out_keep_boxes_on_their_pixels(torchvision, coco_dir, zoom, photometric):
    """Random crops: every delivered box inside its image and at least a pixel wide and tall (sanitised), its
    labels among the image's; over epochs both cropped and uncropped images (and, with RandomZoomOut, larger
    canvases); image ids and counts as DataLoader's."""
    dataset = v2_dataset(torchvision, coco_dir, ssd_steps(torchvision, zoom, photometric))
    loader = DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu", seed=1)
    assert (loader.run.augment.photometric is not None) == photometric
    sizes = {i: (h, w) for i, ((h, w), _) in IMAGES.items()}
    smaller = larger = same = 0
    for _ in range(6):
        got, batch_sizes = pairs(loader)
        assert batch_sizes == [4] and [t["image_id"] for _, t in got] == [1, 2, 3, 5]
        for image, target in got:
            h, w = image.shape[-2:]
            boxes = target["boxes"]
            assert ((boxes[:, 2:] - boxes[:, :2]) >= 1).all() and (boxes >= 0).all()
            assert (boxes[:, 0::2] <= w).all() and (boxes[:, 1::2] <= h).all()
            labels = [c for *_, c, _ in IMAGES[target["image_id"]][1]]
            assert all(label in labels for label in target["labels"].tolist())
            original = sizes[target["image_id"]]
            smaller += h * w < original[0] * original[1]
            larger += h * w > original[0] * original[1]
            same += (h, w) == original
    assert smaller and same and (larger if zoom else not larger)


def window_of(image: torch.Tensor, size: tuple[int, int]) -> tuple[int, int, bool]:
    """(top, left, flipped) of a crop, read from its pixels: the fixture's red is 255 * x // width and its green
    255 * y // height of the original image, so a crop's first row and column tell where it was cut."""
    height, width = size
    red, green = image[0] * 255, image[1] * 255
    flipped = image.shape[-1] > 1 and bool(red[:, -1].mean() < red[:, 0].mean())
    first = red[:, -1] if flipped else red[:, 0]
    return round(float(green[0].mean()) * height / 255), round(float(first.mean()) * width / 255), flipped


def test_iou_crop_boxes_equal_torchvisions_for_the_same_window(torchvision, coco_dir):
    """The crop window fixed (read back from the pixels): torchvision's own crop, flip and sanitising of the
    original boxes give ours within a pixel, the same labels in the same order."""
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F
    dataset = v2_dataset(torchvision, coco_dir, ssd_steps(torchvision, zoom=False))
    loader = DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu", seed=2)
    cropped = 0
    for _ in range(5):
        for image, target in pairs(loader)[0]:
            (height, width), annotations = IMAGES[target["image_id"]]
            top, left, flipped = window_of(image, (height, width))
            boxes = tv_tensors.BoundingBoxes([[x, y, x + w, y + h] for x, y, w, h, *_ in annotations], format="XYXY",
                                             canvas_size=(height, width))
            boxes = F.crop(boxes, top, left, image.shape[-2], image.shape[-1])
            boxes = F.horizontal_flip(boxes) if flipped else boxes
            labels = torch.tensor([c for *_, c, _ in annotations])
            keep = [i for i, (x, y, w, h, *_) in enumerate(annotations)  # the centre rule: torchvision's and DALI's
                    if left < x + w / 2 < left + image.shape[-1] and top < y + h / 2 < top + image.shape[-2]]
            boxes, labels = boxes.as_subclass(torch.Tensor)[keep], labels[keep]
            valid = F.sanitize_bounding_boxes(boxes, format="XYXY", canvas_size=tuple(image.shape[-2:]))[1]
            boxes, labels = boxes[valid], labels[valid]
            assert target["labels"].tolist() == labels.tolist(), target["image_id"]
            assert torch.allclose(target["boxes"], boxes.float(), atol=1.0), (target, boxes, top, left, flipped)
            cropped += tuple(image.shape[-2:]) != (height, width)
    assert cropped


def test_zoom_out_moves_the_boxes_with_the_image(torchvision, coco_dir):
    """RandomZoomOut to exactly twice the side: the image found on its canvas by its blue (40 * image id, the
    fill's is 104) and the boxes shifted by where it sits, within a pixel; the canvas filled with the fill."""
    from torchvision.transforms import v2
    steps = v2_hflip(torchvision, 0.0)
    steps = steps[:1] + [v2.RandomZoomOut(fill=[123.0, 117.0, 104.0], side_range=(2.0, 2.0), p=1.0)] + steps[1:]
    dataset = v2_dataset(torchvision, coco_dir, steps)
    loader = DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu", seed=3)
    offsets = set()
    for _ in range(3):
        for image, target in pairs(loader)[0]:
            (height, width), annotations = IMAGES[target["image_id"]]
            assert tuple(image.shape[-2:]) == (2 * height, 2 * width)
            inside = ((image[2] * 255 - 104).abs() > 8).nonzero()
            top, left = inside.min(0).values.tolist()
            assert inside.max(0).values.tolist() == [top + height - 1, left + width - 1]
            assert abs(image[0, 0, 0].item() * 255 - 123) <= 2 or (top, left) == (0, 0)
            want = [[x + left, y + top, x + w + left, y + h + top] for x, y, w, h, *_ in annotations
                    if w >= 1 and x + w + left <= 2 * width]  # Sanitize: the thin box gone (and the one past the
            # image's edge where it is past the canvas's too, as torchvision's pad then Sanitize decide)
            assert torch.allclose(target["boxes"], torch.tensor(want, dtype=torch.float32), atol=1.0), target
            offsets.add((top, left))
    assert len(offsets) > 3  # placed at random


def test_multiscale_shortest_size_matches_torchvision(torchvision, coco_dir):
    """The references' multiscale preset's RandomShortestSize (one size, so it is deterministic; a max_size that
    binds for the long images): torchvision's output sizes, boxes within a pixel, pixels within resampling's
    differences."""
    from torchvision.transforms import v2
    steps = v2_hflip(torchvision, 1.0)
    steps = steps[:1] + [v2.RandomShortestSize(min_size=(56,), max_size=90)] + steps[1:]
    dataset = v2_dataset(torchvision, coco_dir, steps)
    got, _ = pairs(DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu"))
    want, _ = pairs(DataLoader(dataset, batch_size=4, collate_fn=collate_fn))
    assert [tuple(i.shape) for i, _ in got] == [tuple(i.shape) for i, _ in want] != [
        (3, *IMAGES[t["image_id"]][0]) for _, t in want]
    assert_same(got, want, pixel_tolerance=0.25)
    assert max((i - j).abs().mean().item() for (i, _), (j, _) in zip(got, want)) < 2 / 255


def photometric_steps(torchvision, **distort):
    """ToImage, RandomPhotometricDistort(**distort), no flip, float: the distortion alone on the whole image."""
    from torchvision.transforms import v2
    steps = v2_hflip(torchvision, 0.0)
    return steps[:1] + [v2.RandomPhotometricDistort(**distort)] + steps[1:]


def torchvision_distortions(image, brightness, contrast, saturation, hue):
    """torchvision's kernels on a uint8 image, every step applied: {(contrast_before, permutation): float image}."""
    import itertools

    from torchvision.transforms.v2 import functional as F
    out = {}
    for before, permutation in itertools.product((True, False), itertools.permutations(range(3))):
        x = F.adjust_brightness(image, brightness)
        x = F.adjust_contrast(x, contrast) if before else x
        x = F.adjust_hue(F.adjust_saturation(x, saturation), hue)
        x = x if before else F.adjust_contrast(x, contrast)
        out[before, permutation] = x[list(permutation)].float() / 255
    return out


def test_photometric_distort_forced_matches_torchvisions_kernels(torchvision, coco_dir):
    """Every step drawn (p=1, factors fixed by ranges of zero width): each image equals, within a level or two,
    torchvision's kernels on the same decoded image for one of the twelve outcomes left to chance (contrast
    before or after, the permutation), the closest by far; over epochs both orders and several permutations.
    With p=0 the image is untouched (the same as without the step)."""
    from torchvision.transforms import v2
    factors = {"brightness": 1.1, "contrast": 0.6, "saturation": 1.4, "hue": 0.04}
    dataset = v2_dataset(torchvision, coco_dir, photometric_steps(
        torchvision, p=1.0, **{name: (f, f) for name, f in factors.items()}))
    plain = v2_dataset(torchvision, coco_dir, [v2.ToImage()])
    decoded = {plain[i][1]["image_id"]: plain[i][0].as_subclass(torch.Tensor) for i in range(len(plain))}
    loader = DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu", seed=4)
    outcomes = set()
    for _ in range(2):
        for image, target in pairs(loader)[0]:
            candidates = torchvision_distortions(decoded[target["image_id"]], **factors)
            errors = sorted(((image - want).abs().max().item(), key) for key, want in candidates.items())
            (error, key), (runner_up, _) = errors[0], errors[1]
            assert error <= 3 / 255 and runner_up > 10 / 255, (target["image_id"], errors[:3])
            assert (image - candidates[key]).abs().mean().item() < 0.5 / 255
            outcomes.add(key)
    assert {before for before, _ in outcomes} == {True, False} and len({p for _, p in outcomes}) > 2
    untouched = v2_dataset(torchvision, coco_dir, photometric_steps(torchvision, p=0.0))
    got = pairs(DaliLoader(untouched, batch_size=4, collate_fn=collate_fn, device="cpu"))[0]
    reference = pairs(DaliLoader(v2_dataset(torchvision, coco_dir, v2_hflip(torchvision, 0.0)), batch_size=4,
                                 collate_fn=collate_fn, device="cpu"))[0]
    assert all(torch.equal(i, j) for (i, _), (j, _) in zip(got, reference))


@pytest.mark.parametrize("step, distort, changed", [
    ("brightness", {"brightness": (0.5, 0.5)}, "darker"),
    ("contrast", {"contrast": (0.2, 0.2)}, "flatter"),
    ("saturation", {"saturation": (0.0, 0.0)}, "gray"),
    ("hue", {"hue": (0.15, 0.15)}, "other"),
    ("permutation", {}, "other")])
def test_photometric_distort_applies_each_step_about_half_the_time(torchvision, coco_dir, step, distort, changed):
    """p=0.5 with only one step away from the identity: that step shows (the image is no permutation of the
    original's channels) in about half the images; the permutation alone (the image differs) in 5/12 (one of
    torch.randperm(3)'s six outcomes is the identity)."""
    import itertools
    identity = {"brightness": (1.0, 1.0), "contrast": (1.0, 1.0), "saturation": (1.0, 1.0), "hue": (0.0, 0.0)}
    dataset = v2_dataset(torchvision, coco_dir, photometric_steps(torchvision, p=0.5, **{**identity, **distort}))
    reference = [i for i, _ in pairs(DaliLoader(v2_dataset(torchvision, coco_dir, v2_hflip(torchvision, 0.0)),
                                                batch_size=4, collate_fn=collate_fn, device="cpu"))[0]]
    loader = DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu", seed=5)
    applied = draws = 0
    for _ in range(25):
        for image, original in zip([i for i, _ in pairs(loader)[0]], reference):
            draws += 1
            same = [original] if step == "permutation" else [original[list(p)] for p in itertools.permutations(
                range(3))]
            if not any(torch.equal(image, o) for o in same):
                applied += 1
                if changed == "darker":
                    assert image.mean() < 0.6 * original.mean()
                elif changed == "flatter":
                    assert image.std() < 0.5 * original.std()
                elif changed == "gray":
                    assert (image - image.mean(0)).abs().max() <= 1 / 255
    expected = 5 / 12 if step == "permutation" else 0.5
    assert abs(applied / draws - expected) < 0.12, (applied, draws)


def test_photometric_distort_v1_is_read_and_an_untranslatable_order_is_refused(torchvision, coco_dir):
    """The references' v1 class (ColorJitter per step) read to the same settings as v2's; RandomPhotometricDistort
    after a crop is refused by name."""
    from torchvision.transforms import v2

    from dali_pipes.graph.detection_transforms import detection_augment
    from dali_pipes.graph.photometric import PhotometricDistort
    v1 = detection_refs.RandomPhotometricDistort(hue=(-0.1, 0.1), brightness=(1.0, 1.0), p=0.25)
    augment, _ = detection_augment(detection_refs.Compose([v1] + v1_hflip(0.0)))
    assert augment.photometric == PhotometricDistort(brightness=(1.0, 1.0), hue=(-0.1, 0.1), p=0.25)
    augment, _ = detection_augment(v2.Compose(photometric_steps(torchvision)))
    assert augment.photometric == PhotometricDistort()
    dataset = v1_dataset(coco_dir, [detection_refs.RandomPhotometricDistort(p=0.0)] + v1_hflip(0.0))
    with pytest.warns(UserWarning, match="without masks"):
        got = pairs(DaliLoader(dataset, batch_size=4, collate_fn=collate_fn, device="cpu"))[0]
    assert_same(got, pairs(DataLoader(dataset, batch_size=4, collate_fn=collate_fn))[0])
    late = ssd_steps(torchvision, zoom=False)
    late = late[:2] + [v2.RandomPhotometricDistort()] + late[2:]
    with pytest.raises(ValueError, match="RandomPhotometricDistort after RandomIoUCrop.*put RandomPhotometricDistort"):
        DaliLoader(v2_dataset(torchvision, coco_dir, late), batch_size=2, collate_fn=collate_fn, device="cpu")


class ListedBatches(list):
    """A script's own batch sampler: fixed batches and the size of the largest, as numpy gives it."""
    def __init__(self, batches, batch_size):
        super().__init__(batches)
        if batch_size is not None:
            self.batch_size = batch_size


def test_a_batch_samplers_size_may_be_any_integer_and_a_missing_one_is_named(torchvision, coco_dir):
    dataset = v2_dataset(torchvision, coco_dir, v2_hflip(torchvision))
    loader = DaliLoader(dataset, batch_sampler=ListedBatches([[0, 1], [2]], np.int64(2)), collate_fn=collate_fn,
                        device="cpu")
    assert [len(images) for images, _ in loader] == [2, 1]
    with pytest.raises(ValueError, match=r"ListedBatches: a batch_sampler whose batch_size is None.*positive int"):
        DaliLoader(dataset, batch_sampler=ListedBatches([[0]], None), collate_fn=collate_fn, device="cpu")
