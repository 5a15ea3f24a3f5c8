"""Run: what the training loop carries between steps (counters, and everything a checkpoint holds), shared by
the loop (train.py), the checkpoints (checkpoint.py) and the crash tests' hooks (crash_tests.py)."""

from __future__ import annotations

import argparse
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from dali_pipes import Shard
from dali_pipes.loader import Loader
from dali_pipes.storage.remote_urls import identity
from train.metrics import MemoryMeter
from train.observe import Trace
from train.optim import WarmupCosine
from train.preemption import Preemption


@dataclass
class Run:
    """What the loop carries between steps: counters, and everything a checkpoint holds."""
    args: argparse.Namespace
    shard: Shard
    device: torch.device
    model: nn.Module  # under DDP, its wrapper: `unwrapped` gives the model itself
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR  # its factor: a WarmupCosine (`schedule`)
    scaler: torch.amp.GradScaler
    train_loader: Loader
    val_loader: Loader | None
    forward: Callable[[torch.Tensor], torch.Tensor]  # the model's training forward (--compile: compiled)
    step: int = 0
    epoch_start_step: int = 0  # the step the epoch in progress began at (in an earlier run, when resumed)
    pending_epoch: dict | None = None  # an epoch trained but not validated when preempted (from the checkpoint)
    memory: MemoryMeter = field(default_factory=MemoryMeter)
    # called as hook(run) after every step (the crash tests' hooks: crash_tests.py)
    step_hooks: list[Callable[[Run], None]] = field(default_factory=list)
    preemption: Preemption = field(default_factory=Preemption)  # SIGTERM / SIGUSR1: stop at a step boundary
    loaders_built_at: float = 0.0          # perf_counter() before the loaders were constructed
    trace: Trace = field(default_factory=lambda: Trace(None, 0))
    first_batch_s: float | None = None     # construction -> first batch in hand (this process)
    run_id: str = field(default_factory=lambda: new_run_id())  # in every metrics.jsonl line; a resume keeps it

    @property
    def is_main(self) -> bool:
        return self.shard.rank == 0

    @property
    def unwrapped(self) -> nn.Module:
        """The model itself, without DDP's wrapper: its state_dict's keys, and a forward without collectives."""
        model = self.model
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

    @property
    def schedule(self) -> WarmupCosine:
        """The lr schedule by samples seen that the scheduler runs (create_run made it)."""
        schedule = self.scheduler.lr_lambdas[0]
        if not isinstance(schedule, WarmupCosine):
            raise TypeError(f"the scheduler's factor is a {type(schedule).__name__}, not a WarmupCosine")
        return schedule


def new_run_id() -> str:
    """A short id, unique per run: its start time and 6 random hex digits (20260127-101500-3fa2c1)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def close_run(run: Run) -> None:
    run.memory.close()
    for loader in (run.train_loader, run.val_loader):
        if loader is not None:
            loader.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def saved_args(args: argparse.Namespace) -> dict:
    """The flags as args.json and the checkpoint keep them: a URL by its identity (remote_urls.identity: no query string
    or user info, which grant access; --resume takes the URL from the command line again)."""
    def named(value):
        if isinstance(value, str):
            return identity(value)
        return type(value)(named(v) for v in value) if isinstance(value, (list, tuple)) else value
    return {k: named(v) for k, v in vars(args).items()}


NOT_REPLAYED = ("config", "resume", "resume_if_present", "overwrite")  # what one invocation does, not the run's


def replayable_args(args: argparse.Namespace) -> dict:
    """args.json: the run's effective flags (a --config file's values, the command line's over them), as saved_args
    keeps them, less NOT_REPLAYED: `python -m train --config WORKDIR/args.json` runs the same settings again (into
    the same WORKDIR only with --resume or --overwrite)."""
    return {k: v for k, v in saved_args(args).items() if k not in NOT_REPLAYED}
