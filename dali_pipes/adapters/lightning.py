"""Lightning: a LightningDataModule over DaliLoader, one loader per split per rank (optional extra).

    from dali_pipes.lightning import DaliDataModule  # needs: pip install '.[lightning]' (a checkout)
    data = DaliDataModule("/data/train", "/data/val", batch_size=256, image_size=224)
    Trainer(accelerator="gpu", devices=8, strategy="ddp").fit(model, datamodule=data)

Contracts (DaliLoader's, see loader.py, carried through Lightning):
  * Each rank reads DALI shard trainer.global_rank of trainer.world_size and yields len(loader) batches per
    epoch, the same on every rank. Lightning gets a plain iterable, not a torch DataLoader, so it injects no
    DistributedSampler (it only rebuilds DataLoaders) and stops each epoch at len(loader) without reading ahead.
  * Val pads the last batches with label -1: validation_step must count only `labels >= 0`.
  * Resume: the datamodule's state holds every rank's train-loader position. `fit(ckpt_path=...)` then continues
    with exactly the batches an uninterrupted run would yield, mid-epoch included, in step with Lightning's own
    batch counter. Resume with the same data, rank count, batch size and seed.
  * Preemption is Lightning's: on SIGTERM it stops every rank after the current step (SIGTERMException) and
    calls the callbacks' on_exception; Lightning's OnExceptionCheckpoint then saves, this state included, and a
    later fit(ckpt_path=None) with that callback resumes from it (tests/test_lightning.py).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import torch

from dali_pipes.errors import install_hint

try:
    import lightning.pytorch as pl
except ImportError as error:
    raise ImportError(f"dali_pipes.lightning needs Lightning, an optional extra: {install_hint('lightning')}"
                      ) from error

from dali_pipes import DaliLoader, Source

Location = Source | str | os.PathLike | list


class _LoaderView:
    """A DaliLoader as Lightning sees it: iterable, with an exact len; `.loader` is the DaliLoader.

    Not the loader itself: Lightning saves the state_dict() of a train loader that has one from rank 0 alone and
    loads it into every rank, which fails on rank 1 (a DaliLoader state belongs to one rank). The datamodule
    keeps every rank's state instead. The empty hooks below tell Lightning that the loader is resumable, so it
    does not warn that a mid-epoch resume is unreliable."""

    def __init__(self, loader: DaliLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Lazy: DaliLoader.__iter__ acts when called (it finishes an abandoned epoch, or starts the rest of a
        # resumed one), but Lightning calls iter() once only to check that the loader is iterable
        # (_check_dataloader_iterable in 2.6) and drops that iterator. Called eagerly, the real iter() that
        # follows would take the resumed epoch for abandoned and skip its remaining batches.
        yield from self.loader

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict:
        return {}  # the position lives in DaliDataModule.state_dict(), per rank

    def load_state_dict(self, state: dict) -> None:
        pass  # restored by DaliDataModule.load_state_dict()


class DaliDataModule(pl.LightningDataModule):
    """Train (and optionally val) DaliLoaders for this rank, built in setup() with the trainer's rank.

    `loader_kwargs` go to DaliLoader as they are (device, image_size, seed, num_threads, augmentation...)."""

    def __init__(self, train: Location, val: Location | None = None, *, batch_size: int,
                 **loader_kwargs: Any) -> None:
        super().__init__()
        self.train_location, self.val_location = train, val
        self.batch_size, self.loader_kwargs = batch_size, loader_kwargs
        self.train_loader: DaliLoader | None = None
        self.val_loader: DaliLoader | None = None
        self._pending: list[dict] | None = None  # every rank's train state from a checkpoint, until applied
        self._closed_state: dict | None = None  # this rank's train state when teardown closed the loader

    def _build(self, location: Location, train: bool) -> DaliLoader:
        # Outside a Trainer the loader takes its rank from torch.distributed or torchrun (Shard.from_env).
        trainer = self.trainer
        shard: dict[str, Any] = {} if trainer is None else dict(rank=trainer.global_rank, world_size=trainer.world_size,
                                                local_rank=trainer.local_rank)
        # val_padding="label" (override it in loader_kwargs): every sample once, padding labelled -1
        return DaliLoader(location, batch_size=self.batch_size, train=train, **shard,
                          **{"val_padding": "label", **self.loader_kwargs})

    def setup(self, stage: str) -> None:
        """Build this rank's loaders for `stage`, once; a pending checkpoint state is applied here."""
        if stage == "fit" and self.train_loader is None:
            self.train_loader = self._build(self.train_location, train=True)
            self._closed_state = None
            self._apply_pending()
        if stage in ("fit", "validate") and self.val_location is not None and self.val_loader is None:
            self.val_loader = self._build(self.val_location, train=False)

    def train_dataloader(self) -> _LoaderView:
        self.setup("fit")  # a no-op under a Trainer, which calls setup first
        assert self.train_loader is not None
        return _LoaderView(self.train_loader)

    def val_dataloader(self) -> _LoaderView | list:
        """The val loader, or [] (Lightning then skips validation) when no val location was given."""
        if self.val_location is None:
            return []
        self.setup("validate")
        assert self.val_loader is not None
        return _LoaderView(self.val_loader)

    def teardown(self, stage: str) -> None:
        """Free the DALI pipelines (threads, pinned and device memory) when the trainer is done. The train
        position is kept: a checkpoint saved after fit() returns still continues where it ended."""
        if self.train_loader is not None:
            self._closed_state = self.train_loader.state_dict()
        for loader in (self.train_loader, self.val_loader):
            if loader is not None:
                loader.close()
        self.train_loader = self.val_loader = None

    def state_dict(self) -> dict[str, Any]:
        """{"train": [rank 0's train-loader state, rank 1's, ...]}, or {} before any train loader existed.

        A collective: only rank 0 writes the checkpoint, so every rank's state is gathered to it. Lightning
        calls this on every rank (Trainer.save_checkpoint must be called on every rank)."""
        if self.train_loader is None and self._closed_state is None:
            return {"train": self._pending} if self._pending else {}
        mine = self._closed_state if self.train_loader is None else self.train_loader.state_dict()
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return {"train": [mine]}
        states: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(states, mine)
        return {"train": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take this rank's entry of a state_dict() from a checkpoint; applied now if the train loader
        exists, else when setup("fit") builds it (Lightning calls this after setup)."""
        if state_dict.get("train"):
            self._pending = list(state_dict["train"])
            self._apply_pending()

    def _apply_pending(self) -> None:
        if self._pending is None or self.train_loader is None:
            return
        # Every old rank's state: this rank's own on the same world size, the rest of the interrupted
        # epoch split over the new ranks on another (elastic resume, loader.py).
        self.train_loader.load_state_dict(self._pending)
        self._pending = None
