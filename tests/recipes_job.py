"""One rank of a torchrun job (gloo, CPU) shaped like torchvision's references/classification/train.py and
pytorch/examples' imagenet validate(), for tests/test_real_loops.py: each recipe is built twice from the same
arguments, once with torch.utils.data.DataLoader and once with DaliLoader (the class name the only change),
and read for EPOCHS epochs, set_epoch called on the sampler before each as the references do. Writes
OUT/rank<R>.json: per recipe, per loader, per epoch len(loader) and each batch's shapes and labels (or, for
soft targets, their row sums and per-class mass). Not a test: torchrun runs it once per rank.

    torchrun --nproc_per_node 2 tests/recipes_job.py TRAIN_FOLDER VAL_FOLDER OUT

The folders hold one image per class, so a label names its sample. Recipes:
  mixup_cutmix_erasing   a preset object (RandomErasing 0.25), DistributedSampler, and a collate_fn closure
                         over v2 RandomChoice([MixUp, CutMix]), as the references' main() builds it;
  bicubic_augmix         bicubic crop + v2 AugMix in the preset, a WeightedRandomSampler on each rank (every
                         rank reads its own whole draw, as DataLoader does);
  repeated_augmentation  a repeated-augmentation sampler (num_replicas, rank, 3 repetitions, set_epoch, trimmed);
  references_val         ClassificationPresetEval's shape through DistributedSampler(shuffle=False);
  examples_val           DistributedSampler(shuffle=False, drop_last=True), then the rest through a Subset read
                         whole on every rank (pytorch/examples' aux_val_loader).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import torch

EPOCHS = 2
BATCH = 4


def describe(images: torch.Tensor, targets: torch.Tensor) -> dict:
    """What the test compares of one batch: shapes, and the labels (or soft targets' row sums and class mass)."""
    batch: dict[str, Any] = {"images": list(images.shape), "targets": list(targets.shape), "dtype": str(targets.dtype)}
    if targets.ndim == 2:
        batch.update(row_sums=[round(x, 5) for x in targets.sum(1).tolist()],
                     mass=[round(x, 5) for x in targets.sum(0).tolist()])
    else:
        batch["labels"] = targets.tolist()
    return batch


def read_epochs(loader: Any, sampler: Any) -> list[dict]:
    """EPOCHS epochs of `loader`, the sampler's set_epoch called first, as train.py's epoch loop does."""
    epochs = []
    for epoch in range(EPOCHS):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        epochs.append({"len": len(loader), "batches": [describe(*batch) for batch in loader]})
    return epochs


def train_recipes(v2: Any, datasets: Any, root: str, rank: int, world: int) -> dict[str, Callable]:
    """name -> a function building (dataset, sampler, collate_fn) afresh, so each loader gets its own sampler
    in the same state."""
    from samplers_job import RepeatedAugmentationSampler
    from torch.utils.data import DistributedSampler, WeightedRandomSampler, default_collate
    from torchvision.transforms import InterpolationMode

    from conftest import TrainPreset
    bilinear, bicubic = InterpolationMode.BILINEAR, InterpolationMode.BICUBIC

    def mixup_cutmix_erasing():
        dataset = datasets.ImageFolder(root, TrainPreset(v2, 16, bilinear, None, 0.25))
        classes = len(dataset.classes)
        mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes),
                                        v2.CutMix(alpha=1.0, num_classes=classes)])

        def collate_fn(batch):  # the references' own closure
            return mixup_cutmix(*default_collate(batch))
        return dataset, DistributedSampler(dataset), collate_fn

    def bicubic_augmix():
        dataset = datasets.ImageFolder(root, TrainPreset(v2, 16, bicubic, v2.AugMix(), 0.0))
        weights = torch.linspace(1, 3, len(dataset))
        return dataset, WeightedRandomSampler(weights, 18, generator=torch.Generator().manual_seed(rank)), None

    def repeated_augmentation():
        dataset = datasets.ImageFolder(root, TrainPreset(v2, 16, bilinear, None, 0.0))
        return dataset, RepeatedAugmentationSampler(dataset, world, rank, repeats=3, multiple=4), None

    return {"mixup_cutmix_erasing": mixup_cutmix_erasing, "bicubic_augmix": bicubic_augmix,
            "repeated_augmentation": repeated_augmentation}


def val_recipes(v2: Any, datasets: Any, root: str, world: int, loader_class: type) -> dict[str, list]:
    """The two val forms, read EPOCHS times with `loader_class`: name -> epochs (examples_val's batches are
    the sampled loader's then the Subset remainder's)."""
    from torch.utils.data import DistributedSampler, Subset
    from torchvision.transforms import InterpolationMode

    from conftest import EvalPreset
    dataset = datasets.ImageFolder(root, EvalPreset(v2, 16, 18, InterpolationMode.BICUBIC))
    references: DistributedSampler = DistributedSampler(dataset, shuffle=False)
    out = {"references_val": read_epochs(loader_class(dataset, batch_size=BATCH, sampler=references,
                                                      num_workers=0, pin_memory=True), references)}
    sampled: DistributedSampler = DistributedSampler(dataset, shuffle=False, drop_last=True)
    main = loader_class(dataset, batch_size=BATCH, sampler=sampled, num_workers=0, pin_memory=True)
    rest = Subset(dataset, range(len(sampled) * world, len(dataset)))
    aux = loader_class(rest, batch_size=BATCH, shuffle=False, num_workers=0, pin_memory=True)
    out["examples_val"] = [{"len": [first["len"], second["len"]], "batches": first["batches"] + second["batches"],
                            "rest": len(second["batches"])}
                           for first, second in zip(read_epochs(main, sampled), read_epochs(aux, None))]
    return out


def main(train_root: str, val_root: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from dali_pipes import DaliLoader

    from torchvision_side import import_torchvision
    import_torchvision()
    from torchvision import datasets
    from torchvision.transforms import v2

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict[str, dict] = {}
    for name, build in train_recipes(v2, datasets, train_root, rank, world).items():
        for loader_class in (DataLoader, DaliLoader):
            dataset, sampler, collate_fn = build()
            loader = loader_class(dataset, batch_size=BATCH, sampler=sampler, num_workers=0, pin_memory=True,
                                  collate_fn=collate_fn)
            result.setdefault(name, {})[loader_class.__name__] = read_epochs(loader, sampler)
    for loader_class in (DataLoader, DaliLoader):
        for name, epochs in val_recipes(v2, datasets, val_root, world, loader_class).items():
            result.setdefault(name, {})[loader_class.__name__] = epochs
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
