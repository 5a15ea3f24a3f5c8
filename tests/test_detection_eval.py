"""COCO metrics through the detection references' evaluation path (engine.evaluate + coco_eval.CocoEvaluator:
the val loader's batch_size=1 batches, the model's outputs keyed by image_id, pycocotools' COCOeval over
loader.dataset.coco), once from DataLoader's batches and once from DaliLoader's, for the same fixed weights and
the references' deterministic eval preset (PILToTensor / ToImage, then ToDtype(float, scale=True)): the 12 stats
are equal. The model is a small seeded torch module whose boxes and scores are functions of the pixels (torchvision's
compiled ops are not needed), so a pixel that differs moves its scores."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import detection_refs as R
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

from dali_pipes import DaliLoader

CATEGORIES = 3


class PixelDetector(torch.nn.Module):
    """Dense boxes (a grid of 3 sizes x 3 shapes) scored by how their inside's mean colour differs from a ring
    around them (an objectness), times a seeded linear classifier of the two colours: deterministic, and every
    score a smooth function of the pixels. Returns the references' model outputs: boxes xyxy, labels, scores."""

    def __init__(self, seed: int = 0, detections: int = 100) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.classify = torch.nn.Linear(6, CATEGORIES)
        with torch.no_grad():
            self.classify.weight.copy_(torch.randn(CATEGORIES, 6, generator=generator) * 4)
            self.classify.bias.copy_(torch.randn(CATEGORIES, generator=generator))
        self.detections = detections

    @staticmethod
    def _boxes(height: int, width: int) -> torch.Tensor:
        side = min(height, width)
        boxes = []
        for size in (0.2, 0.3, 0.45):
            for aspect in (0.6, 1.0, 1.6):
                w, h = size * side * aspect ** 0.5, size * side / aspect ** 0.5
                ys, xs = torch.meshgrid(torch.arange(0, height, side / 12.0), torch.arange(0, width, side / 12.0),
                                        indexing="ij")
                boxes.append(torch.stack([xs, ys, xs + w, ys + h], -1).reshape(-1, 4))
        boxes = torch.cat(boxes)
        return boxes[(boxes[:, 2] <= width) & (boxes[:, 3] <= height)]

    @staticmethod
    def _means(integral: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        x0, y0, x1, y1 = boxes.round().long().unbind(-1)
        total = integral[:, y1, x1] - integral[:, y0, x1] - integral[:, y1, x0] + integral[:, y0, x0]
        return (total / ((x1 - x0) * (y1 - y0)).clamp(min=1)).T

    def forward(self, images: list[torch.Tensor]) -> list[dict]:
        outputs = []
        for image in images:
            _, height, width = image.shape
            integral = torch.nn.functional.pad(image.double().cumsum(1).cumsum(2), (1, 0, 1, 0))
            boxes = self._boxes(height, width)
            grow = (boxes[:, 2:] - boxes[:, :2]) * 0.25
            ring = torch.cat([(boxes[:, :2] - grow).clamp(min=0),
                              torch.minimum(boxes[:, 2:] + grow, torch.tensor([width, height]))], -1)
            inside, around = self._means(integral, boxes), self._means(integral, ring)
            objectness = (inside - around).abs().sum(-1, keepdim=True).float()
            scores = objectness * self.classify(torch.cat([inside, around], -1).float()).softmax(-1)
            top = scores.flatten().topk(min(self.detections, scores.numel()))
            outputs.append({"boxes": boxes[top.indices // CATEGORIES], "labels": top.indices % CATEGORIES + 1,
                            "scores": top.values})
        return outputs


def coco_stats(coco_gt, predictions: dict[int, dict]) -> list[float]:
    """What CocoEvaluator("bbox") reports: the predictions (xywh, one entry per box) loaded as results, COCOeval
    over the image ids evaluated, accumulate, summarize; its 12 stats."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    results = [{"image_id": image_id, "category_id": label, "score": score,
                "bbox": [x0, y0, x1 - x0, y1 - y0]}
               for image_id, output in predictions.items()
               for (x0, y0, x1, y1), label, score in zip(output["boxes"].tolist(), output["labels"].tolist(),
                                                         output["scores"].tolist())]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(coco_gt, COCO.loadRes(coco_gt, results) if results else COCO(), "bbox")
        evaluation.params.imgIds = sorted(predictions)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats.tolist()


def evaluate(model, loader) -> tuple[dict[int, dict], dict[int, torch.Tensor]]:
    """engine.evaluate's loop: per batch, the model's outputs keyed by their target's image_id."""
    predictions, pixels = {}, {}
    with torch.no_grad():
        for images, targets in loader:
            outputs = model(list(images))
            for target, output, image in zip(targets, outputs, images):
                predictions[int(target["image_id"])] = output
                pixels[int(target["image_id"])] = image
    return predictions, pixels


@pytest.fixture(scope="module")
def val_set(tmp_path_factory):
    """The built-in detection sample's val split, small: 8 images of 96-160 px (JPEGs made by PIL)."""
    from dali_pipes.tools.sample_detection import DetectionSampleConfig, make_detection_sample
    root = tmp_path_factory.mktemp("detection_eval")
    make_detection_sample(str(root), DetectionSampleConfig(categories=CATEGORIES, train_images=1, val_images=8,
                                                           min_side=96, max_side=160, max_objects=3),
                          workers=1, progress=False)
    return str(root / "images" / "val"), str(root / "annotations" / "instances_val.json")


def v1_val(val_set):
    """get_coco(image_set="val", use_v2=False) with DetectionPresetEval(): no Subset for val."""
    preset = R.DetectionPresetEval(R.Compose([R.PILToTensor(), R.ToDtype(torch.float, scale=True)]))
    return R.v1_coco_detection(*val_set, R.Compose([R.ConvertCocoPolysToMask(), preset]))


def v2_val(torchvision, val_set):
    """get_coco(image_set="val", use_v2=True) with DetectionPresetEval(use_v2=True)."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2
    preset = R.DetectionPresetEval(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float, scale=True),
                                               v2.ToPureTensor()]))
    return wrap_dataset_for_transforms_v2(CocoDetection(*val_set, transforms=preset),
                                          target_keys=["boxes", "labels", "image_id"])


def collate_fn(batch):
    return tuple(zip(*batch))


@pytest.mark.filterwarnings("ignore:the v1 target conversion:UserWarning")
@pytest.mark.parametrize("form, sampler", [("v1", "sequential"), ("v1", "distributed"), ("v2", "distributed")])
def test_coco_stats_from_daliloader_equal_dataloaders(torchvision, val_set, form, sampler):
    dataset = v1_val(val_set) if form == "v1" else v2_val(torchvision, val_set)
    model = PixelDetector().eval()

    def make_sampler():  # the references' val sampler on one process, and DistributedSampler's on a world of 1
        if sampler == "sequential":
            return SequentialSampler(dataset)
        return DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)

    theirs, their_pixels = evaluate(model, DataLoader(dataset, batch_size=1, sampler=make_sampler(),
                                                      collate_fn=collate_fn))
    loader = DaliLoader(dataset, batch_size=1, sampler=make_sampler(), collate_fn=collate_fn, device="cpu")
    assert loader.dataset is dataset  # the evaluator's ground truth: loader.dataset.coco
    ours, our_pixels = evaluate(model, loader)
    assert list(ours) == list(theirs) == sorted(dataset.coco.getImgIds())  # each val image once, in order
    for image_id in theirs:
        assert our_pixels[image_id].shape == their_pixels[image_id].shape
        assert our_pixels[image_id].dtype == their_pixels[image_id].dtype == torch.float32
        mine, ref = our_pixels[image_id], their_pixels[image_id]
        assert torch.equal((mine * 255).round(), (ref * 255).round()), image_id  # DALI's decode is PIL's, exactly
        # the float step: DALI multiplies by 1/255, as v2's ToDtype does (bit-exact); v1's convert_image_dtype
        # divides by 255, which rounds apart by at most one unit in the last place
        assert torch.equal(mine, ref) if form == "v2" else bool(((mine - ref).abs() <= ref * 2 ** -23).all())
        assert torch.allclose(ours[image_id]["scores"], theirs[image_id]["scores"], rtol=1e-6, atol=0), image_id
    want = coco_stats(dataset.coco, theirs)
    assert 0 < want[1] < 1  # AP@0.5 neither nothing nor everything: the boxes found depend on the pixels
    assert coco_stats(loader.dataset.coco, ours) == want


def test_the_stats_see_a_pixel_change(torchvision, val_set):
    """The check above has teeth: one image's pixels darkened by 1/255 moves the stats."""
    dataset = v1_val(val_set)
    model = PixelDetector().eval()
    predictions, pixels = evaluate(model, DataLoader(dataset, batch_size=1, collate_fn=collate_fn))
    changed = dict(predictions)
    for image_id in list(pixels)[:4]:
        changed[image_id] = model([(pixels[image_id] - 1 / 255).clamp(min=0) * np.float32(0.97)])[0]
    assert coco_stats(dataset.coco, changed) != coco_stats(dataset.coco, predictions)


def test_coco_stats_on_2_ranks_equal_one_process_dataloaders(torchvision, val_set, tmp_path):
    """Under torchrun on 2 ranks (tests/detection_eval_job.py): DistributedSampler(shuffle=False) with
    batch_size=1 reads each val image once across the ranks (8 images: 4 each, no padding), and the gathered
    predictions' stats, DaliLoader's and DataLoader's, are one process's."""
    job = os.path.join(os.path.dirname(__file__), "detection_eval_job.py")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.dirname(job), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           job, *val_set, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{rank}.json")) for rank in range(2)]
    dataset = v1_val(val_set)
    want = coco_stats(dataset.coco, evaluate(PixelDetector().eval(), DataLoader(dataset, batch_size=1,
                                                                                collate_fn=collate_fn))[0])
    ids = sorted(dataset.coco.getImgIds())
    for rank, result in enumerate(ranks):
        assert result["read_ours"] == result["read_theirs"] == ids[rank::2]
        assert result["stats_ours"] == result["stats_theirs"] == want
