"""One rank of a torchrun job (gloo, CPU) that runs torchvision's detection references' loaders twice, once as
DaliLoader and once as DataLoader, over the same samplers, writing OUT/rank<R>.json: the image ids of every batch
per epoch, each loader's. Not a test: tests/test_detection_ranks.py runs it (torchrun runs it once per rank).

    torchrun --nproc_per_node 2 tests/detection_ranks_job.py FOLDER OUT

FOLDER holds images/ and train.json, val.json (COCO). As references/detection/train.py builds them: training
reads DistributedSampler(dataset) through aspect-ratio groups (GroupedBatchSampler, below) or
BatchSampler(sampler, batch_size, drop_last=True), calling set_epoch each epoch; evaluation reads
DistributedSampler(dataset_test, shuffle=False) with batch_size=1, each rank's image ids gathered as the
references' evaluator gathers them. Then each rank's training loader stopped mid-epoch and resumed from its
state_dict in a fresh loader (resume_midway).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import sys
from collections import defaultdict

import torch
from torch.utils.data import BatchSampler

BATCH_SIZE = 2


class GroupedBatchSampler(BatchSampler):
    """The references' group_by_aspect_ratio.GroupedBatchSampler, written here from its contract: indices of
    `sampler` gathered per group and yielded as a batch once `batch_size` of one group are in; at the end, until
    there are len(sampler) // batch_size batches, the fullest leftover groups topped up with their own indices
    (repeated from the group's first as needed)."""

    def __init__(self, sampler, group_ids: list[int], batch_size: int) -> None:
        self.sampler, self.group_ids, self.batch_size = sampler, group_ids, batch_size

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self):
        waiting: dict[int, list[int]] = defaultdict(list)
        seen: dict[int, list[int]] = defaultdict(list)
        yielded = 0
        for index in self.sampler:
            group = self.group_ids[index]
            waiting[group].append(index)
            seen[group].append(index)
            if len(waiting[group]) == self.batch_size:
                yield waiting.pop(group)
                yielded += 1
        for group in sorted(waiting, key=lambda g: len(waiting[g]), reverse=True)[:len(self) - yielded]:
            missing = self.batch_size - len(waiting[group])
            filler = seen[group] * math.ceil(missing / len(seen[group]))
            yield waiting[group] + filler[:missing]


def aspect_ratio_groups(dataset, k: int = 3) -> list[int]:
    """create_aspect_ratio_groups(dataset, k): each image's width / height (from the COCO index, through the
    Subset), binned at 2 ** linspace(-1, 1, 2k + 1)."""
    indices = list(getattr(dataset, "indices", range(len(dataset))))
    base = getattr(dataset, "dataset", dataset)
    coco = getattr(base, "coco", None) or base._dataset.coco  # the v2 wrapper keeps the dataset in _dataset
    ids = getattr(base, "ids", None) or base._dataset.ids
    bins = [2 ** (-1 + 2 * i / (2 * k)) for i in range(2 * k + 1)]
    ratios = [coco.imgs[ids[i]]["width"] / coco.imgs[ids[i]]["height"] for i in indices]
    return [bisect.bisect_right(bins, ratio) for ratio in ratios]


def collate_fn(batch):  # the references' utils.collate_fn
    return tuple(zip(*batch))


def image_ids(loader, flips: list | None = None) -> list[list[int]]:
    """Each batch's image ids; into `flips`, whether each image came out mirrored (the fixture's red grows
    from left to right)."""
    ids = []
    for images, targets in loader:
        ids.append([int(target["image_id"]) for target in targets])
        if flips is not None:
            flips.append([bool(image[0, :, -1].mean() < image[0, :, 0].mean()) for image in images])
    return ids


def datasets(folder: str, form: str):
    """(train, val) as the references' get_coco builds them: v1 (their CocoDetection, ConvertCocoPolysToMask,
    the preset) or v2 (torchvision's wrapper), the train set without images lacking annotations."""
    import detection_refs as R
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2
    images = os.path.join(folder, "images")
    if form == "v1":
        train_steps = [R.RandomHorizontalFlip(0.5), R.PILToTensor(), R.ToDtype(torch.float, scale=True)]
        train = R.v1_coco_detection(images, os.path.join(folder, "train.json"), R.Compose(
            [R.ConvertCocoPolysToMask(), R.DetectionPresetTrain(R.Compose(train_steps))]))
        val = R.v1_coco_detection(images, os.path.join(folder, "val.json"), R.Compose(
            [R.ConvertCocoPolysToMask(), R.DetectionPresetEval(R.Compose(train_steps[1:]))]))
        return R.remove_images_without_annotations(train), val
    keys = ["boxes", "labels", "image_id"]
    train_steps = [v2.ToImage(), v2.RandomHorizontalFlip(0.5), v2.ToDtype(torch.float, scale=True),
                   v2.ConvertBoundingBoxFormat("XYXY"), v2.SanitizeBoundingBoxes(), v2.ToPureTensor()]
    val_steps = [v2.ToImage(), v2.ToDtype(torch.float, scale=True), v2.ToPureTensor()]
    train = CocoDetection(images, os.path.join(folder, "train.json"),
                          transforms=R.DetectionPresetTrain(v2.Compose(train_steps)))
    val = CocoDetection(images, os.path.join(folder, "val.json"), transforms=R.DetectionPresetEval(v2.Compose(
        val_steps)))
    return (R.remove_images_without_annotations(wrap_dataset_for_transforms_v2(train, target_keys=keys)),
            wrap_dataset_for_transforms_v2(val, target_keys=keys))


def train_epochs(dataset, grouped: bool) -> dict:
    """Two epochs of the references' training loaders, DaliLoader's and DataLoader's, on one DistributedSampler
    (set_epoch before each epoch, as train.py does)."""
    from torch.utils.data import DataLoader, DistributedSampler

    from dali_pipes import DaliLoader
    sampler = DistributedSampler(dataset)
    if grouped:
        batch_sampler = GroupedBatchSampler(sampler, aspect_ratio_groups(dataset), BATCH_SIZE)
    else:
        batch_sampler = BatchSampler(sampler, BATCH_SIZE, drop_last=True)
    ours = DaliLoader(dataset, batch_sampler=batch_sampler, num_workers=1, collate_fn=collate_fn)
    theirs = DataLoader(dataset, batch_sampler=batch_sampler, num_workers=0, collate_fn=collate_fn)
    result: dict = {"ours": [], "theirs": [], "len": [len(ours), len(theirs)], "flips": []}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        result["ours"].append(image_ids(ours, result["flips"]))
        result["theirs"].append(image_ids(theirs))
    ours.close()
    return result


def signature(batch) -> list:
    """Each (image, target) of a batch as [image id, boxes, the image's left columns' sum (a flip changes it)]."""
    images, targets = batch
    return [[int(t["image_id"]), [[round(float(v), 3) for v in box] for box in t["boxes"].tolist()],
             round(float(image[:, :, :3].sum()), 3)] for image, t in zip(images, targets)]


def resume_midway(dataset, grouped: bool) -> dict:
    """Each rank's training loader (DistributedSampler in the batch sampler, set_epoch) stopped after one batch of
    epoch 0, its state_dict taken; the rest of that epoch and the next uninterrupted, then a fresh loader over a
    fresh sampler (a restarted script) loaded with the state: the rest of epoch 0 and epoch 1 again."""
    from torch.utils.data import DistributedSampler

    from dali_pipes import DaliLoader

    def build():
        sampler = DistributedSampler(dataset)
        batch_sampler = (GroupedBatchSampler(sampler, aspect_ratio_groups(dataset), BATCH_SIZE) if grouped
                         else BatchSampler(sampler, BATCH_SIZE, drop_last=True))
        return DaliLoader(dataset, batch_sampler=batch_sampler, num_workers=1, collate_fn=collate_fn), sampler
    loader, sampler = build()
    sampler.set_epoch(0)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    result: dict = {"rest": [signature(b) for b in batches]}
    sampler.set_epoch(1)
    result["next"] = [signature(b) for b in loader]
    loader.close()
    resumed, sampler = build()
    resumed.load_state_dict(state)
    sampler.set_epoch(0)  # the script's loop, at the epoch it resumes
    result["resumed_rest"] = [signature(b) for b in resumed]
    sampler.set_epoch(1)
    result["resumed_next"] = [signature(b) for b in resumed]
    resumed.close()
    return result


def evaluation(dataset) -> dict:
    """The references' evaluation loader on DistributedSampler(shuffle=False), batch_size=1: each loader's image
    ids on this rank and gathered from every rank (as the evaluator gathers its image ids), and the largest
    pixel and box difference between the two loaders' (deterministic) samples."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from dali_pipes import DaliLoader
    sampler = DistributedSampler(dataset, shuffle=False)
    ours = DaliLoader(dataset, batch_size=1, sampler=sampler, num_workers=1, collate_fn=collate_fn)
    theirs = DataLoader(dataset, batch_size=1, sampler=sampler, num_workers=0, collate_fn=collate_fn)
    got, want = list(ours), list(theirs)
    pixels = boxes = 0.0
    for (images, targets), (ref_images, ref_targets) in zip(got, want):
        pixels = max(pixels, (images[0] - ref_images[0]).abs().max().item())
        if len(ref_targets[0].get("boxes", [])):
            boxes = max(boxes, (targets[0]["boxes"] - ref_targets[0]["boxes"].float()).abs().max().item())
    result: dict = {"len": [len(ours), len(theirs)], "pixels": pixels, "boxes": boxes}
    for key, batches in (("ours", got), ("theirs", want)):
        result[key] = [int(t["image_id"]) for _, targets in batches for t in targets]
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result[key])
        result[f"gathered_{key}"] = gathered
    ours.close()
    return result


def main(folder: str, out: str) -> None:
    import warnings

    import torch.distributed as dist

    from torchvision_side import import_torchvision
    import_torchvision()
    warnings.filterwarnings("ignore", message=".*without masks")  # v1: said once per loader, expected here
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # a script seeding every rank alike: DaliLoader's seed is torch's, its draws the rank's
    result: dict = {}
    for form, kind in (("v1", "grouped"), ("v2", "plain")):
        train, val = datasets(folder, form)
        result[f"train_{form}"] = train_epochs(train, grouped=kind == "grouped")
        result[f"val_{form}"] = evaluation(val)
        result[f"resume_{form}"] = resume_midway(train, grouped=kind == "grouped")
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
