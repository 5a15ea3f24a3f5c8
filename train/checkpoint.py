"""Checkpoints: model, optimizer, scaler, scheduler, every rank's loader state and RNG, written atomically;
resume from one; and the checkpoint a preempted run stops with."""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from train.metrics import atomic_save
from train.preemption import write_status
from train.run import Run, close_run, saved_args

# ---------------------------------------------------------------------------------------------

def _rng_state() -> dict:
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    numpy_state = (name, list(map(int, keys)), pos, has_gauss, gauss)  # no ndarray: weights_only=True loads lists
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def save_checkpoint(run: Run, pending: dict | None = None) -> None:
    """pending: the train stats of an epoch whose training is done but whose validation and metrics.jsonl
    line are not (a preemption between the two); --resume finishes that epoch first."""
    per_rank = {"loader": run.train_loader.state_dict(), "rng": _rng_state()}
    gathered: list[Any] = [per_rank]
    if dist.is_initialized():  # sync point: every rank hands its loader position to rank 0
        gathered = [None] * run.shard.world_size
        dist.all_gather_object(gathered, per_rank)
    if run.is_main:
        mid_epoch = run.train_loader.next_batch[1] > 0  # else the next epoch starts at this step
        atomic_save({"model": run.unwrapped.state_dict(), "optimizer": run.optimizer.state_dict(),
                     "scheduler": run.scheduler.state_dict(), "scaler": run.scaler.state_dict(),
                     "step": run.step, "epoch_start_step": run.epoch_start_step if mid_epoch else run.step,
                     "pending_epoch": pending, "ranks": gathered, "args": saved_args(run.args), "run_id": run.run_id},
                    os.path.join(run.args.workdir, "checkpoint.pt"))


def load_trusted(path: str) -> dict:
    """The checkpoint at `path`, unpickled with weights_only=True: tensors, numbers, strings and containers, never
    an object whose unpickling runs code (a checkpoint copied from elsewhere could carry one). numpy's scalars
    and arrays of numbers are let in too: checkpoints of dali_pipes 0.3.0 and earlier hold the lr as a numpy
    float and numpy's RNG state as an array (torch's documented allowlist for them)."""
    import pickle
    numpy_data: list = [np.float64(0).__reduce__()[0], np.zeros(1).__reduce__()[0], np.ndarray, np.dtype,  # scalar,
                        type(np.dtype(np.float64)), type(np.dtype(np.uint32))]  # array, of the dtypes they held
    if hasattr(torch.serialization, "safe_globals"):  # torch 2.5+
        allowed: contextlib.AbstractContextManager = torch.serialization.safe_globals(numpy_data)
    else:  # torch 2.4 has add_safe_globals only: process-wide, and numpy's number types only
        torch.serialization.add_safe_globals(numpy_data)
        allowed = contextlib.nullcontext()
    try:
        with allowed:
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = next((line.strip() for line in str(error).splitlines() if "Unsupported global" in line),
                     str(error).splitlines()[0] if str(error) else type(error).__name__)
        raise SystemExit(f"--resume: {path} holds more than weights and numbers, and loading it could run code "
                         f"({first}); this training loop never writes such a checkpoint. Resume only from "
                         f"checkpoints this loop wrote, or start afresh with a new --workdir") from None


def load_checkpoint(run: Run, path: str) -> None:
    """Everything as saved. On another world size (elastic resume, DALI loader only) the loaders
    split the rest of the interrupted epoch over the new ranks, the lr schedule goes on by samples
    seen, and the peak lr follows the new global batch (0.1 x global batch / 256) unless --lr is given."""
    state = load_trusted(path)
    old_world, world = len(state["ranks"]), run.shard.world_size
    if old_world != world and not run.train_loader.supports_elastic:
        raise SystemExit(f"{path} was written by {old_world} ranks; --loader {run.args.loader} resumes only on "
                         f"the same world size ({world} now); --loader dali resumes on any")
    run.unwrapped.load_state_dict(state["model"])
    base_lrs = list(run.scheduler.base_lrs)  # this world's peak lr (the scaling rule), before the saved one
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    run.step = state["step"]
    run.pending_epoch = state.get("pending_epoch")
    run.run_id = state.get("run_id") or run.run_id  # the same run goes on (older checkpoints have none)
    schedule = run.schedule
    schedule.rebase(run.step, run.args.batch_size * world)  # by samples: the global batch may have changed
    if old_world != world:
        run.scheduler.base_lrs = base_lrs
        for group, base in zip(run.optimizer.param_groups, base_lrs):
            group["initial_lr"], group["lr"] = base, base * schedule(run.step)
    loader_states = [r["loader"] for r in state["ranks"]]  # every old rank's, in rank order
    run.train_loader.load_state_dict(loader_states[run.shard.rank] if old_world == world else loader_states)
    # older checkpoints lack it: on the same world size, the batch index counts the epoch's steps
    run.epoch_start_step = state.get("epoch_start_step", run.step - run.train_loader.next_batch[1])
    if run.shard.rank >= old_world:  # a rank that did not exist: its own streams, not a copy of rank 0's
        seed = run.args.seed + run.shard.rank + 1_000_003 * run.step
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        return
    rng = state["ranks"][run.shard.rank]["rng"]
    random.setstate(rng["python"])
    name, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def preempted(run: Run, pending: dict | None = None) -> None:
    """Checkpoint at this step on every rank (with `pending`: see save_checkpoint), say where it stopped and how
    to go on, leave WORKDIR/preempted.json for a requeue script, and exit with 128 + the signal (non-zero:
    schedulers and torchrun requeue on it; torchrun itself exits 1)."""
    stop, path = run.preemption.decision, os.path.join(run.args.workdir, "checkpoint.pt")
    save_checkpoint(run, pending)  # atomic: a second signal or a SIGKILL now leaves the old file or this one
    if run.is_main:
        epoch, batch = run.train_loader.next_batch
        status = write_status(run.args.workdir, stop, run.step, epoch, batch, pending["epoch"] if pending else None)
        cause = (f"preempted by {status['signal']}" if stop.signum else "stopped") + \
            (" (the torchrun launcher is gone)" if stop.launcher_lost else "")
        first = "" if not pending else f" (epoch {pending['epoch']}'s " + (
            "validation runs first on --resume)" if run.val_loader else "metrics.jsonl line is written on --resume)")
        print(f"{cause} at step {run.step} (epoch {epoch}, batch {batch}): checkpoint {path}{first}; "
              f"go on with the same command and --resume", flush=True)
    close_run(run)
    raise SystemExit(stop.exit_code)
