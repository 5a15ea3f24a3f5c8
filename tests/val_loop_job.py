"""Validation loops with the shapes of real scripts, one rank of a torchrun job (gloo, CPU), for
tests/test_real_loops.py. Not a test: torchrun runs it once per rank.

    torchrun --nproc_per_node 2 tests/val_loop_job.py FOLDER OUT --loop per_batch|at_end|examples [...] --batch B

The "model" is an oracle that is right exactly on even labels, so a loop's top-1 says which samples it
counted: over the whole set it is (samples with an even label) / N.
  per_batch: timm's validate(): top-1 and loss per batch as fractions of target.size(0), all-reduced
             (mean over ranks) every batch; DaliLoader called the dali_pipes way, val_padding default.
  at_end:    sums and counts over the epoch, all-reduced once; val_padding="none".
  examples:  pytorch/examples' validate(): ImageFolder + DistributedSampler(shuffle=False, drop_last=True),
             AverageMeter sums all-reduced after the loop, then the tail through Subset(val_loader.dataset)
             read by every rank; DaliLoader called exactly as DataLoader is.
The loops named run one after the other in the same job (one torchrun start for them all: each start costs
3 processes importing torch). Rank 0 writes OUT/<loop>.json for each: {"top1", "loss", "count",
"batches": [per rank], "finite"}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))

from dali_pipes import DaliLoader  # noqa: E402

CLASSES = 3


def oracle(target: torch.Tensor) -> torch.Tensor:
    """Logits that are right on even labels and wrong on odd ones."""
    guess = torch.where(target % 2 == 0, target, (target + 1) % CLASSES)
    return F.one_hot(guess, CLASSES).float() * 4


def reduce_mean(value: torch.Tensor) -> torch.Tensor:
    value = value.clone()
    dist.all_reduce(value)  # timm's reduce_tensor: sum over ranks, then / world size
    return value / dist.get_world_size()


def per_batch(folder: str, batch: int) -> dict:
    loader = DaliLoader(folder, batch_size=batch, train=False, device="cpu", image_size=16, num_threads=1)
    top1_sum = loss_sum = count = 0.0
    batches = 0
    for _images, target in loader:
        output = oracle(target)
        loss = F.cross_entropy(output, target)  # crashes on a label -1
        top1 = (output.argmax(1) == target).float().sum() * 100.0 / target.size(0)
        loss, top1 = reduce_mean(loss), reduce_mean(top1)
        top1_sum += top1.item() * target.size(0)  # timm's AverageMeter.update(value, n)
        loss_sum += loss.item() * target.size(0)
        count += target.size(0)
        batches += 1
    return {"top1": top1_sum / count, "loss": loss_sum / count, "count": count, "batches": batches}


def at_end(folder: str, batch: int) -> dict:
    loader = DaliLoader(folder, batch_size=batch, train=False, device="cpu", image_size=16, num_threads=1,
                        val_padding="none")
    sums = torch.zeros(3, dtype=torch.float64)
    batches = 0
    for _images, target in loader:
        output = oracle(target)
        sums += torch.tensor([(output.argmax(1) == target).sum().item(),
                              F.cross_entropy(output, target, reduction="sum").item(), target.size(0)])
        batches += 1
    dist.all_reduce(sums)  # once, at the end
    return {"top1": 100 * sums[0].item() / sums[2].item(), "loss": sums[1].item() / sums[2].item(),
            "count": sums[2].item(), "batches": batches}


def examples(folder: str, batch: int) -> dict:
    from torchvision_side import import_torchvision
    import_torchvision()
    from torch.utils.data import Subset
    from torch.utils.data.distributed import DistributedSampler
    from torchvision import datasets, transforms
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    val_dataset = datasets.ImageFolder(folder, transforms.Compose([
        transforms.Resize(20), transforms.CenterCrop(16), transforms.ToTensor(), normalize]))
    val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    val_loader = DaliLoader(val_dataset, batch_size=batch, shuffle=False, num_workers=1, pin_memory=True,
                            sampler=val_sampler)
    meter = torch.zeros(2, dtype=torch.float64)  # AverageMeter: sum of top-1 %, count

    def run_validate(loader) -> int:
        seen = 0
        for images, target in loader:
            output = oracle(target)
            acc1 = (output.argmax(1) == target).float().sum() * 100.0 / target.size(0)  # accuracy()
            meter.add_(torch.tensor([acc1.item() * images.size(0), images.size(0)], dtype=torch.float64))
            seen += 1
        return seen

    batches = run_validate(val_loader)
    dist.all_reduce(meter)  # top1.all_reduce()
    world = dist.get_world_size()
    if len(val_loader.sampler) * world < len(val_loader.dataset):
        aux = Subset(val_loader.dataset, range(len(val_loader.sampler) * world, len(val_loader.dataset)))
        run_validate(DaliLoader(aux, batch_size=batch, shuffle=False, num_workers=1, pin_memory=True))
    return {"top1": meter[0].item() / meter[1].item(), "loss": 0.0, "count": meter[1].item(), "batches": batches}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--loop", choices=("per_batch", "at_end", "examples"), nargs="+", required=True)
    parser.add_argument("--batch", type=int, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    for loop in args.loop:
        result = {"per_batch": per_batch, "at_end": at_end, "examples": examples}[loop](args.folder, args.batch)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result["batches"])
        result.update(batches=gathered, finite=all(math.isfinite(result[k]) for k in ("top1", "loss")))
        if dist.get_rank() == 0:
            with open(os.path.join(args.out, f"{loop}.json"), "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
