"""A repeated-augmentation sampler for tests/test_samplers.py, and one rank of a torchrun job (gloo, CPU) that
reads an image folder through it with DaliLoader and with DataLoader, writing OUT/rank<R>.json: the sample ids
(labels: one image per class) per epoch, each loader's. Not a test: torchrun runs it once per rank.

    torchrun --nproc_per_node 2 tests/samplers_job.py FOLDER OUT
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch
from torch.utils.data import Sampler


class RepeatedAugmentationSampler(Sampler[int]):
    """DeiT's repeated augmentation, written here from its description: every epoch a permutation seeded by
    the epoch (storage order without shuffle), each index repeated `repeats` times in a row, the list padded
    from its start to a multiple of the world size and dealt out round-robin, every rank keeping only its first
    floor(N // multiple * multiple / world) indices (DeiT's multiple is 256). It has num_replicas and rank, as
    a DistributedSampler has, and yields something else entirely."""

    def __init__(self, dataset, num_replicas: int, rank: int, shuffle: bool = True, repeats: int = 3,
                 multiple: int = 256) -> None:
        self.size, self.num_replicas, self.rank, self.shuffle, self.repeats = len(dataset), num_replicas, rank, \
            shuffle, repeats
        self.per_rank = math.ceil(self.size * repeats / num_replicas)
        self.kept = self.size // multiple * multiple // num_replicas
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.kept

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        else:
            order = list(range(self.size))
        repeated = [index for index in order for _ in range(self.repeats)]
        repeated += repeated[:self.per_rank * self.num_replicas - len(repeated)]
        return iter(repeated[self.rank::self.num_replicas][:self.kept])


def main(folder: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from dali_pipes import DaliLoader

    from torchvision_side import import_torchvision
    import_torchvision()
    from torchvision import datasets
    from torchvision import transforms as T

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = datasets.ImageFolder(folder, T.Compose([T.RandomResizedCrop(16), T.ToTensor()]))
    ours_sampler, their_sampler = (RepeatedAugmentationSampler(dataset, world, rank, multiple=8) for _ in range(2))
    ours = DaliLoader(dataset, batch_size=4, sampler=ours_sampler, num_workers=1)
    theirs = DataLoader(dataset, batch_size=4, sampler=their_sampler)
    result: dict = {"ours": [], "theirs": [], "len": [len(ours), len(theirs), len(ours.sampler)]}
    for epoch in range(2):
        for sampler, loader, key in ((ours_sampler, ours, "ours"), (their_sampler, theirs, "theirs")):
            sampler.set_epoch(epoch)
            result[key].append([labels.tolist() for _, labels in loader])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    ours.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
