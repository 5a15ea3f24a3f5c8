"""Where a DaliLoader's epoch ends, told to Hugging Face Accelerate as its own loaders tell it.

accelerator.prepare() re-wraps torch DataLoaders and hands a DaliLoader back unchanged. Accelerate's own loaders
register in its GradientState while they are iterated (DataLoaderStateMixin in accelerate/data_loader.py; checked
on accelerate 1.15.0): `end_of_dataloader` turns True as the last batch is handed out, and `remainder` says how
many entries of the last step, gathered over the processes in process order, are real. gather_for_metrics keeps
that many of the last gathered step (the repeats that make the ranks' batches equal are cut) and accumulate()
syncs the gradients at the epoch's end. A DaliLoader registers the same way for each epoch it yields.

The cut keeps a prefix, so it is exact only where the real entries of the last gathered step come first: every
process before the first short one full, every one after it without a real entry. Where they do not, `remainder`
is 0 (gather_for_metrics cuts nothing, as for a loader it does not know) and the loader's construction warning
names val_padding="label". Nothing is imported: only an Accelerate already in use counts.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence


def gradient_state() -> Any:
    """Accelerate's GradientState (a shared singleton) where an Accelerate state exists in this process, else None."""
    state = sys.modules.get("accelerate.state")
    if state is None or not state.is_initialized():
        return None
    return state.GradientState()


def process_place() -> tuple[int, int]:
    """(this process's place in Accelerate's gather order, the number of processes)."""
    shared = sys.modules["accelerate.state"].PartialState()  # the initialised state, never a new one
    return int(shared.process_index), int(shared.num_processes)


def gathered_real(last_reals: Sequence[int], size: int) -> int:
    """`remainder` for a last step whose batches have `size` entries each and `last_reals[p]` real entries on
    process p (first in its batch): how many to keep, or 0 where nothing is to be cut or a prefix cannot be exact."""
    if all(real == size for real in last_reals):
        return 0
    short = next(p for p, real in enumerate(last_reals) if real < size)
    if any(real for real in last_reals[short + 1:]):
        return 0  # a real entry after a repeat: cutting a prefix would drop it
    return sum(last_reals)


class EpochEnd:
    """One epoch of a DaliLoader as Accelerate's GradientState sees one of its loaders: registered while the
    epoch runs (a `with` block: an abandoned epoch leaves it too), `end_of_dataloader` from its last batch on."""

    def __init__(self, state: Any, remainder: int) -> None:
        self.state, self.remainder, self.end_of_dataloader = state, remainder, False

    def __enter__(self) -> "EpochEnd":
        if self.state is not None:
            self.state._add_dataloader(self)  # private: what DataLoaderStateMixin.begin calls (1.15.0)
        return self

    def batch(self, last: bool) -> None:
        """The batch about to be handed out is the epoch's last (or not)."""
        self.end_of_dataloader = last

    def __exit__(self, *exc: object) -> None:
        if self.state is not None:
            self.state._remove_dataloader(self)  # private: DataLoaderStateMixin.end's call (1.15.0)
