"""DaliLoader where Hugging Face Accelerate and Trainer expect a DataLoader (no import of either here).

Accelerate (tests/frameworks_job.py runs this on 2 processes):

    accelerator = Accelerator()                       # torch.distributed is up: each DaliLoader reads its rank's part
    train = DaliLoader("/data/train", batch_size=64, train=True)
    val = DaliLoader("/data/val", batch_size=64, train=False, val_padding="label")
    model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)   # the loaders come back as is
    accelerator.register_for_checkpointing(RankStates(train))   # every rank's position in the checkpoint
    ...
    predictions, labels = accelerator.gather_for_metrics((logits.argmax(1), labels))
    real = labels != PADDING_LABEL                    # count each val sample once: drop the padding

  * prepare() re-wraps torch DataLoaders only: a DaliLoader is handed back unchanged, so it is not sharded a
    second time and its batches are not moved (they stay where DALI made them: move them in the step).
  * gather_for_metrics cuts the repeats off the last gathered step of the loader registered in Accelerate's
    GradientState as the one being iterated: a DaliLoader registers itself there for each epoch
    (run/accelerate_end.py), and under Accelerate val process p reads slice world - 1 - p, so that the
    repeats come last and the default val_padding="repeat" counts each val sample once on 2 processes, as
    DataLoader does. Where the last step's layout allows no exact cut (val_padding="label", some sizes on 3+
    processes) nothing is cut: val_padding="label" gives every rank the same full batches with the padding
    labelled -1, drop those. ("none" can give the ranks different batch counts, and a gather on one rank alone
    waits forever.)
  * save_state writes a registered object's state from rank 0 alone and load_state gives that copy to every
    rank: RankStates gathers every rank's state into it (a collective: save_state runs on every rank) and
    hands each rank its own back (on another world size, the elastic resume, loader.py).
  * Accelerate hears where a DaliLoader's epoch ends (GradientState.end_of_dataloader, as for its own loaders),
    so accumulate() syncs the gradients at an epoch's last batch.

Hugging Face Trainer: get_train_dataloader / get_eval_dataloader return DictBatches(DaliLoader(...)); Trainer
calls model(**batch) on dict batches, len(), set_epoch(), .dataset and nothing else of the loader.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from dali_pipes.loader import DaliLoader


class RankStates:
    """A DaliLoader's state as every rank's, for a checkpointer that saves rank 0's copy alone and loads it
    into every rank (Accelerate's register_for_checkpointing; Lightning's datamodule does the same itself)."""

    def __init__(self, loader: DaliLoader) -> None:
        self.loader = loader

    def state_dict(self) -> dict:
        """{"ranks": [rank 0's loader state, rank 1's, ...]}. A collective: call it on every rank."""
        mine = self.loader.state_dict()
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return {"ranks": [mine]}
        states: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(states, mine)
        # In the loaders' rank order, which load_state_dict reads: a val loader under Accelerate has rank
        # world - 1 - process (running_framework.accelerate_shard), so process order is not always rank order
        return {"ranks": sorted(states, key=lambda state: state.get("loader", {}).get("rank", 0))}

    def load_state_dict(self, state: dict) -> None:
        """This rank's entry of a state_dict() (every old rank's, on another world size: elastic)."""
        if not isinstance(state, dict) or "ranks" not in state:
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"RankStates.load_state_dict takes what RankStates.state_dict() returned ({{'ranks': "
                             f"[...]}}), got {found}; a checkpoint that registered the DaliLoader itself holds rank "
                             f"0's state alone: start that run's loaders afresh, and register RankStates(loader)")
        self.loader.load_state_dict(list(state["ranks"]))


class DictBatches:
    """A DaliLoader whose batches are {images: (N,3,H,W), labels: (N,)} dicts, as Hugging Face's Trainer passes
    them to model(**batch). len, set_epoch, dataset, batch_size and the state are the loader's."""

    def __init__(self, loader: DaliLoader, images: str = "pixel_values", labels: str = "labels") -> None:
        self.loader, self.keys = loader, (images, labels)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        images, labels = self.keys
        for batch_images, batch_labels in self.loader:  # lazy, as DaliLoader's own iter() is meant to be
            yield {images: batch_images, labels: batch_labels}

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    @property
    def dataset(self) -> Any:  # Trainer's num_examples and eval sample count: len(dataset), all ranks' samples
        return self.loader.dataset

    @property
    def batch_size(self) -> int:
        return self.loader.batch_size

    @property
    def sampler(self) -> Any:
        # Read by accelerate.skip_first_batches alone, which Trainer calls to resume mid-epoch: it rebuilds the
        # loader as a torch DataLoader, which cannot skip inside DALI. An AttributeError keeps getattr() probes
        # quiet and stops that rebuild with the way out.
        raise AttributeError("DictBatches: Trainer resumes mid-epoch through accelerate.skip_first_batches, which "
                             "rebuilds a torch DataLoader and cannot skip inside a DaliLoader. Resume with "
                             "TrainingArguments(ignore_data_skip=True): the loader then restarts the interrupted "
                             "epoch from its start, in that epoch's order (Trainer's set_epoch)")

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict | list[dict]) -> None:
        self.loader.load_state_dict(state)
