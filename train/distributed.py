"""The ranks: distributed set-up from torchrun's environment (the device, the process group), and
figures summed or averaged over the ranks."""

from __future__ import annotations

import argparse
import datetime

import torch
import torch.distributed as dist

from dali_pipes import Shard
from dali_pipes.loader import resolve_device
from dali_pipes.run.pipeline import cuda_device_id


def setup_distributed(args: argparse.Namespace) -> tuple[Shard, torch.device]:
    shard = Shard.from_env()
    try:
        args.device = resolve_device(args.device)  # "auto" -> gpu or cpu, once, for both loaders
    except RuntimeError as e:
        raise SystemExit(str(e)) from None  # one line for the user, not a traceback
    if args.device == "gpu":
        # cuda_device_id: the local rank's GPU, or the one GPU a rank sees under a scheduler that
        # sets CUDA_VISIBLE_DEVICES per rank (where local_rank would name a device it cannot see).
        index = cuda_device_id(shard)
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    if shard.world_size > 1 and not dist.is_initialized():
        # NCCL between GPUs; gloo on CPU. torchrun's env:// rendezvous gives rank and world size.
        # A finite timeout: a rank that dies outside torchrun must not leave the others waiting forever.
        dist.init_process_group("nccl" if args.device == "gpu" else "gloo", timeout=datetime.timedelta(
            seconds=args.dist_timeout), device_id=device if args.device == "gpu" else None)
    return shard, device


def sum_over_ranks(value: float) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.item()


def mean_over_ranks(value: float) -> float:
    return sum_over_ranks(value) / (dist.get_world_size() if dist.is_initialized() else 1)
