"""Which framework is running this process, for a DaliLoader built from a dataset object without a sampler:
a Lightning Trainer (noted by the callback Lightning adds through our entry point, adapters/lightning_trainer.py)
or Hugging Face Accelerate on several processes. Each would shard a DataLoader built there; DaliLoader is sharded
as it would be (dataloader_args.resolve_call asks here). A leaf: it imports nothing of ours, and neither
Lightning nor Accelerate (only an Accelerate already in use counts)."""

from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any

_TRAINERS: list[weakref.ref] = []  # the Lightning trainers set up and not torn down (adapters/lightning_trainer.py)


def trainer_started(trainer: Any) -> None:
    """A Lightning Trainer began fit/validate/test/predict (its setup hook, before any *_dataloader hook)."""
    _TRAINERS.append(weakref.ref(trainer))


def trainer_ended(trainer: Any) -> None:
    _TRAINERS[:] = [ref for ref in _TRAINERS if ref() is not None and ref() is not trainer]


def lightning_shard() -> tuple[int, int] | None:
    """(rank, world size) when this loader is built while a Lightning Trainer runs (a LightningModule's or
    LightningDataModule's *_dataloader hooks) under a distributed strategy that gives DataLoaders a
    DistributedSampler (use_distributed_sampler=True, the default). Lightning re-creates only real
    DataLoaders with that sampler; DaliLoader is read here instead, so that a script swapping the class name
    keeps Lightning's sharding. The trainer is the one Lightning's callback entry point noted
    (adapters/lightning_trainer.py); a trainer interrupted before its teardown no longer counts once it stops
    running."""
    running = [t for t in (ref() for ref in _TRAINERS)
               if t is not None and getattr(getattr(t.state, "status", None), "value", None) == "running"]
    if not running:
        return None
    trainer = running[-1]
    connector = getattr(trainer, "_accelerator_connector", None)  # the one setting Lightning keeps no public name for
    if trainer.world_size > 1 and getattr(connector, "use_distributed_sampler", True):
        warnings.warn(f"DaliLoader built under a Lightning Trainer: rank {trainer.global_rank} of "
                      f"{trainer.world_size}, sharded as Lightning shards a DataLoader",
                      stacklevel=4)  # the DaliLoader(...) line
        return trainer.global_rank, trainer.world_size
    return None


def accelerate_shard(train: bool) -> tuple[int, int] | None:
    """(rank, world size) when Hugging Face Accelerate runs on several processes (an Accelerator, or a Trainer's,
    exists). accelerator.prepare() shards a DataLoader but hands any other loader back unchanged, so a dataset
    object is sharded here, as prepare would shard a DataLoader of it; each process reading it whole would train
    on every sample once per rank. Nothing is imported: only an Accelerate already in use counts."""
    state = sys.modules.get("accelerate.state")
    if state is None or not state.is_initialized():
        return None
    shared = state.PartialState()  # the initialised state (a shared singleton), never a new one
    process, world = shared.process_index, shared.num_processes
    if world <= 1:
        return None
    val = "" if train else (f"; val: process {process} reads slice {world - 1 - process} (the longer slices first, "
                            f"so gather_for_metrics can cut the repeats off the last step, exact on 2 processes; "
                            f"where it cannot, pass val_padding='label' and drop labels -1 after gathering)")
    warnings.warn(f"DaliLoader built under Accelerate: rank {process} of {world}, sharded as accelerator.prepare "
                  f"shards a DataLoader (prepare passes a DaliLoader through){val}",
                  stacklevel=4)  # the DaliLoader(...) line (through resolve_call and __init__)
    # Val: DALI's later slices are the longer ones (reader.ReaderModel), and gather_for_metrics keeps a prefix
    # of the last gathered step (run/accelerate_end.py): the longer slices on the first processes put the
    # repeats last. Train keeps rank = process (its slices rotate every epoch).
    return (process if train else world - 1 - process), world
