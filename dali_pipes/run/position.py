"""Where a loader is: the epoch and the batches of it yielded. One owner, the loader (loader.py); the rank's
pipeline reads it, resume.py asks it for its state."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Position:
    """`batch` batches of epoch `epoch` yielded; `resumed`: that epoch was restored midway by
    load_state_dict (continue it, do not finish it as abandoned)."""
    epoch: int = 0
    batch: int = 0
    resumed: bool = False

    def next_epoch(self) -> None:
        self.epoch, self.batch = self.epoch + 1, 0

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.batch}

    def restore(self, epoch: int, batch: int = 0) -> None:
        """Continue at batch `batch` of epoch `epoch` (a resumed epoch, if midway)."""
        self.epoch, self.batch, self.resumed = epoch, batch, batch > 0
