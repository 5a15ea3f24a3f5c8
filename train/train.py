"""Image classification training: one loop body for both loaders, DDP on one or many nodes.

    python -m train --data PATH [--val-data PATH] --loader dali|torch [--device gpu|cpu] ...
    python -m train --config run.yaml [--flag value ...]   # the command line's flags override the file's
    torchrun --nproc_per_node=N -m train --data PATH ...

Recipe: SGD + Nesterov momentum, label smoothing, linear warm-up then cosine decay (per step),
no weight decay on norms and biases, bf16 autocast and channels_last on GPU. Progressive resizing:
--image-size 0:160,10:192 (the lr schedule runs by steps, the same at any size); --compile compiles
the training forward once per size (compiled.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time
from contextlib import AbstractContextManager, nullcontext
from typing import IO, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from dali_pipes import AugmentConfig, DaliLoader, LoaderConfig, Shard, SourceConfig
from dali_pipes.baseline import TorchLoader
from dali_pipes.graph import resolution
from dali_pipes.loader import Loader
from dali_pipes.options import CommandParser, RawDefaultsFormatter, add_arguments, add_config_file, from_args
from dali_pipes.run.machine import default_threads
from dali_pipes.run.usage import gpu_used_mb
from train import crash_tests, observe
from train.checkpoint import load_checkpoint, preempted, save_checkpoint
from train.compiled import CompileCounter, add_compile_arguments, training_forward
from train.data import DEFAULT_DATA, data_line, num_classes_of, resolve_data
from train.distributed import mean_over_ranks, setup_distributed, sum_over_ranks
from train.lock import hold as hold_workdir
from train.metrics import MemoryMeter
from train.models import ARCHS, create_model
from train.observe import TensorBoard, Trace
from train.optim import param_groups, warmup_cosine
from train.preemption import clear_status
from train.run import Run, close_run, replayable_args


def get_args_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="python -m train", description=__doc__, formatter_class=RawDefaultsFormatter)
    add_config_file(p)  # WORKDIR/args.json is one: a run's flags given back
    p.add_argument("--data", default="", help="train data (any dataset open_source takes); "
                   f"default: the built-in dataset, made in {DEFAULT_DATA} if missing")
    p.add_argument("--val-data", default="", help="val data; default: DATA/../val when that exists")
    p.add_argument("--loader", choices=["dali", "torch"], default="dali", help="DaliLoader, or DataLoader + PIL")
    p.add_argument("--arch", choices=list(ARCHS), default="resnet50", help="the ResNet")
    p.add_argument("--width", type=int, default=64, help="channels of the first ResNet stage (64 = standard)")
    p.add_argument("--num-classes", type=int, default=0, help="default: from the dataset")
    p.add_argument("--epochs", type=int, default=90, help="passes over the train data")
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--lr", type=float, default=0.0, help="default: 0.1 x global batch / 256")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD's (Nesterov)")
    p.add_argument("--weight-decay", type=float, default=5e-5, help="on weights, not on norms and biases")
    p.add_argument("--label-smoothing", type=float, default=0.1, help="of the cross-entropy loss")
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="linear lr warm-up, then cosine decay")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (default: on GPU)")
    p.add_argument("--workers", type=int, default=0, help="torch loader workers per rank (default: cores / ranks)")
    p.add_argument("--seed", type=int, default=0, help="initial weights, shuffling and augmentation")
    p.add_argument("--workdir", default="runs/latest", help="checkpoint.pt, metrics.jsonl, args.json and config.json "
                   "go here; one that holds another run's checkpoint is refused unless --resume, --resume-if-present "
                   "or --overwrite")
    p.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints (and at epoch end)")
    p.add_argument("--resume", action="store_true", help="continue from WORKDIR/checkpoint.pt (an error if none)")
    p.add_argument("--resume-if-present", action="store_true", help="continue from it if there is one, else start")
    p.add_argument("--overwrite", action="store_true", help="start a new run in a WORKDIR that holds another run's "
                   "checkpoint: it is replaced at the first save; metrics.jsonl keeps the old run's lines, told "
                   "apart by their run_id")
    p.add_argument("--record-labels", action="store_true",
                   help="write each step's labels to WORKDIR/labels-rank<R>.jsonl")
    p.add_argument("--dist-timeout", type=int, default=600, help="seconds a collective may wait for a lost rank")
    p.add_argument("--trace", default="", help="write a Chrome/Perfetto trace here: per rank, steps, waits, loader "
                   "rebuilds and tuning trials")
    p.add_argument("--tensorboard", default="",
                   help="log the epoch metrics here (pip install '.[tensorboard]' from the checkout)")
    # The loader's options, generated from the library's dataclasses (one config path; saved in config.json).
    add_arguments(p, LoaderConfig, "the DALI loader (bad samples excluded with --skip-bad are recorded in "
                  "WORKDIR/bad_samples-rank<R>.txt)")
    add_arguments(p, AugmentConfig, "decoding and augmentation (the DALI graph; --loader torch applies the same)",
                  defaults={"channels_last": None})  # None: on when the run is on the GPU (loader_configs)
    add_arguments(p, SourceConfig, "reading TFRecord / WebDataset shards")
    add_compile_arguments(p)
    return p


def loader_configs(args: argparse.Namespace) -> dict[str, Any]:
    """The dataclasses the flags resolve to, as saved with the run."""
    channels_last = args.device == "gpu" if args.channels_last is None else args.channels_last
    return {"loader": from_args(LoaderConfig, args),
            "augment": from_args(AugmentConfig, args, channels_last=channels_last),
            "source": from_args(SourceConfig, args)}


# ---------------------------------------------------------------------------------------------
# Set-up
# ---------------------------------------------------------------------------------------------

def build_loader(args: argparse.Namespace, data: str, train: bool, shard: Shard) -> Loader:
    """The one place where the two loaders differ: the constructor."""
    cfg = loader_configs(args)
    common = dict(batch_size=args.batch_size, train=train, rank=shard.rank, world_size=shard.world_size,
                  seed=args.seed, augment=cfg["augment"], num_classes=args.num_classes or None)  # the model's outputs:
    # a label at or above them fails in the loader, named, not in the loss as "Target 9 is out of bounds"
    source_args = cfg["source"].open_kwargs()
    if args.loader == "dali":  # its CUDA device: torch's current one (pipeline.cuda_device_id)
        loader_args = {**dataclasses.asdict(cfg["loader"]), "device": args.device}
        # val: full batches, padding labelled -1, which evaluate() masks: each sample counted once
        return DaliLoader(data, **source_args, **loader_args, **common, val_padding="label")
    return TorchLoader(data, num_workers=args.workers or default_threads(), pin_memory=True,
                       persistent_workers=True, keys=source_args["keys"], **common)


def create_run(args: argparse.Namespace) -> Run:
    shard, device = setup_distributed(args)
    random.seed(args.seed + shard.rank)
    np.random.seed(args.seed + shard.rank)
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts them)
    data, val = resolve_data(args)
    memory = MemoryMeter(before_loaders_mb=gpu_used_mb())  # the CUDA context (reading makes it), other processes
    built_at = time.perf_counter()
    train_loader = build_loader(args, data, True, shard)
    val_loader = build_loader(args, val, False, shard) if val else None
    num_classes = args.num_classes or num_classes_of(train_loader.source)
    model = create_model(args.arch, num_classes, args.width).to(device)
    if args.device == "gpu":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit it
    if shard.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if args.device == "gpu" else None)
    lr = args.lr or 0.1 * args.batch_size * shard.world_size / 256
    optimizer = torch.optim.SGD(param_groups(model, args.weight_decay), lr=lr, momentum=args.momentum, nesterov=True)
    global_batch = args.batch_size * shard.world_size  # the schedule runs by samples: see WarmupCosine
    steps = len(train_loader) * args.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(
        steps * global_batch, round(args.warmup_epochs * len(train_loader)) * global_batch, global_batch))
    scaler = torch.amp.GradScaler(enabled=False)  # bf16 needs no loss scaling; kept for fp16 and checkpoints
    forward = training_forward(model, args, len(resolution.sizes(loader_configs(args)["augment"].image_size)))
    return Run(args, shard, device, model, optimizer, scheduler, scaler, train_loader, val_loader, forward,
               memory=memory, loaders_built_at=built_at, trace=Trace(args.trace or None, shard.rank))


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def _autocast(run: Run) -> AbstractContextManager:
    amp = run.args.amp if run.args.amp is not None else run.args.device == "gpu"
    return torch.autocast(run.device.type, dtype=torch.bfloat16) if amp else nullcontext()


def _to_device(run: Run, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fmt = torch.channels_last if run.args.device == "gpu" else torch.preserve_format
    return (images.to(run.device, non_blocking=True, memory_format=fmt),
            labels.to(run.device, non_blocking=True))


def _train_step(run: Run, criterion: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One optimiser step on a batch (on the run's device, under autocast); the schedule and the step count on."""
    images, labels = _to_device(run, images, labels)
    with _autocast(run):
        loss = criterion(run.forward(images), labels)
    run.optimizer.zero_grad(set_to_none=True)
    run.scaler.scale(loss).backward()
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()
    run.step += 1
    return loss.detach()


def train_one_epoch(run: Run, epoch: int, criterion: nn.Module, label_log: IO[str] | None) -> dict:
    run.model.train()
    loader = run.train_loader
    loader.set_epoch(epoch)
    total, size = len(loader) - loader.next_batch[1], loader.image_size  # fewer when resumed mid-epoch
    bar = tqdm(total=total, desc=f"epoch {epoch}", unit="step", disable=not run.is_main, leave=False)
    loss_sum = torch.zeros((), device=run.device)
    waits, samples, first_step = observe.Waits(), 0, run.step  # each batch's (asked, got): the verdict's
    compiles = CompileCounter() if run.args.compile else None
    start = tick = time.perf_counter()
    for images, labels in loader:
        got = time.perf_counter()
        waits.add(tick, got)
        run.trace.span("wait", tick, got)
        if run.first_batch_s is None:  # includes building the pipeline (or starting the workers)
            run.first_batch_s = got - run.loaders_built_at
        observe.record_labels(label_log, run.step + 1, epoch, labels, images.shape[-1])  # before the move: no sync
        loss_sum += _train_step(run, criterion, images, labels)
        samples += len(labels)
        if run.args.checkpoint_every and run.step % run.args.checkpoint_every == 0:
            save_checkpoint(run)
        for hook in run.step_hooks:
            hook(run)
        bar.update()
        tick = time.perf_counter()
        run.trace.span("step", got, tick, step=run.step)
        if run.preemption.stop_now():
            break  # every rank after this same step: checkpointed there by main()
    waits.end(tick, time.perf_counter())  # the loop's last next(): the epoch's end and, once, the sharding check
    bar.close()
    if run.device.type == "cuda":
        torch.cuda.synchronize()  # sync point: the epoch's GPU work is done before its time is read
    seconds = time.perf_counter() - start
    steps, before = max(1, bar.n), first_step - run.epoch_start_step  # before: steps of a run this one resumed
    if loader.next_batch[0] > epoch:
        run.epoch_start_step = run.step  # the epoch's training is done: the next one starts here
    seen = loader.stats() if hasattr(loader, "stats") else {}  # the DataLoader baseline has none
    ranks = observe.gather(observe.rank_figures(run.shard.rank, waits, seconds, run.step - first_step, samples, seen))
    run.trace.flush(seen.get("events", ()))
    stats = {"train_loss": mean_over_ranks(loss_sum.item() / steps), "steps": bar.n,
             "images_per_s": sum_over_ranks(samples) / seconds,
             "data_wait_fraction": mean_over_ranks(waits.total / seconds), "epoch_seconds": seconds,
             "first_batch_s": run.first_batch_s, "image_size": size, **(compiles.stats() if compiles else {}),
             "partial": before > 0, **({"steps_before_resume": before} if before else {})}
    if ranks is not None:  # rank 0: every rank's figures and the verdict
        stats.update(ranks=ranks, verdict=observe.verdict(epoch, ranks, observe.profiled_rates(loader)))
    return stats


@torch.no_grad()
def evaluate(run: Run) -> dict:
    """Top-1/top-5 over the whole val set: each sample counted once across ranks (padding, label
    -1, is masked out), sums all-reduced. The unwrapped model runs: DDP does no collectives here,
    so ranks may run different numbers of val batches (the torch loader does)."""
    model, loader = run.unwrapped, run.val_loader
    if loader is None:
        return {}  # no val data
    model.eval()
    if dist.is_initialized():  # sync point: rank 0's norm statistics, as checkpointed (each rank's last
        for buffer in model.buffers():  # batch moved its own), so a validation run on resume is the same
            dist.broadcast(buffer, 0)
    sums = torch.zeros(4, dtype=torch.float64, device=run.device)  # correct@1, correct@5, loss, count
    for images, labels in loader:
        images, labels = _to_device(run, images, labels)
        real = labels >= 0
        with _autocast(run):
            logits = model(images).float()
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hits = (top5 == labels[:, None]) & real[:, None]
        loss = nn.functional.cross_entropy(logits, labels, ignore_index=-1, reduction="sum")  # padding: 0
        sums += torch.stack([hits[:, 0].sum(), hits.any(1).sum(), loss, real.sum()]).double()
    if dist.is_initialized():
        dist.all_reduce(sums)  # sync point: totals over all ranks
    correct1, correct5, loss, count = sums.tolist()
    return {"val_top1": correct1 / max(count, 1), "val_top5": correct5 / max(count, 1),
            "val_loss": loss / max(count, 1), "val_samples": int(count), "val_image_size": loader.image_size}


def main(args: argparse.Namespace) -> list[dict]:
    checkpoint = os.path.join(args.workdir, "checkpoint.pt")
    if args.resume and not os.path.exists(checkpoint):  # a mistyped workdir must not start from step 0
        raise SystemExit(f"--resume: no checkpoint at {checkpoint}; check --workdir, or pass --resume-if-present")
    if os.path.exists(checkpoint) and not (args.resume or args.resume_if_present or args.overwrite):
        raise SystemExit(f"error: {args.workdir}: holds another run's checkpoint ({checkpoint}); a new run would "
                         f"overwrite it and add its epochs to that run's metrics.jsonl. Pass --resume to continue "
                         f"that run, --overwrite to start a new one there, or another --workdir")
    os.makedirs(args.workdir, exist_ok=True)
    if hold_workdir(args.workdir):  # rank 0: one live job per workdir (lock.py), refused naming the holder
        clear_status(args.workdir)  # the last run's preempted.json: stale from now on, whatever comes next
    run = create_run(args)
    if run.is_main:
        print(data_line(args, run.train_loader.source, run.val_loader.source if run.val_loader else None), flush=True)
    if (args.resume or args.resume_if_present) and os.path.exists(checkpoint):
        load_checkpoint(run, checkpoint)  # the run goes on under its own run_id
        if run.is_main:
            print(f"resumed from {checkpoint} at step {run.step}", flush=True)
    run.step_hooks += crash_tests.step_hooks()  # none unless a test's environment asks for a crash
    if run.is_main:
        with open(os.path.join(args.workdir, "args.json"), "w") as f:
            json.dump(replayable_args(args), f, indent=1)
        with open(os.path.join(args.workdir, "config.json"), "w") as f:
            json.dump({k: dataclasses.asdict(v) for k, v in loader_configs(args).items()}, f, indent=1)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing, ignore_index=-1)
    label_log = open(os.path.join(args.workdir, f"labels-rank{run.shard.rank}.jsonl"), "a") \
        if args.record_labels else None
    history: list[dict] = []
    board = TensorBoard(args.tensorboard or None, run.is_main)
    if run.pending_epoch is not None:  # preempted between an epoch's training and its validation: finish it
        finish_epoch(run, dict(run.pending_epoch), history, board)
    while run.train_loader.next_batch[0] < args.epochs:
        epoch = run.train_loader.next_batch[0]
        stats = {"epoch": epoch, **train_one_epoch(run, epoch, criterion, label_log)}
        if run.preemption.stop_now():  # sync point: a vote after the epoch's training, also after its last step
            preempted(run, stats if run.train_loader.next_batch[0] > epoch else None)
        finish_epoch(run, stats, history, board)
    if label_log:
        label_log.close()
    board.close()
    close_run(run)
    return history


def finish_epoch(run: Run, stats: dict, history: list, board: TensorBoard) -> None:
    """Validate the epoch just trained, checkpoint, and log its line to metrics.jsonl (rank 0)."""
    if run.val_loader is not None:
        stats.update(evaluate(run))
    save_checkpoint(run)  # at epoch end, after the loader moved to the next epoch
    run.memory.sample()
    bad = run.train_loader.bad_samples
    if bad:
        with open(os.path.join(run.args.workdir, f"bad_samples-rank{run.shard.rank}.txt"), "w") as f:
            f.writelines(f"{b}\n" for b in bad)
    stats.update(run.memory.peaks(), bad_samples=len(bad), lr=run.scheduler.get_last_lr()[0], step=run.step,
                 loader=run.args.loader, device=run.args.device, world_size=run.shard.world_size, run_id=run.run_id)
    history.append(stats)
    if run.is_main:
        with open(os.path.join(run.args.workdir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(stats) + "\n")
        board.epoch(stats)
        print(observe.epoch_line(stats) + "\n" + stats["verdict"], flush=True)
