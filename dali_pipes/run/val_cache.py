"""The val cache: val images decoded, resized and cropped once, kept, and given again on later val epochs
without running DALI.

Val's graph is deterministic (no random operator; the reader keeps each rank's slice in storage order), so
every val epoch yields the same batches. With a budget (DaliLoader(val_cache_bytes=...), --val-cache-bytes) a
val loader's graph stops before normalisation: uint8 images after the resize and centre crop
(graph.eval_augment's normalize=False), which the loader normalises in torch as DALI's crop_mirror_normalize
does, (x - mean) * (1 / std) in float32 (`normalized`). The first whole val epoch keeps each batch (uint8
images, labels, sample ids) where the loader's batches are (device="gpu": GPU memory; "cpu": host memory);
later val epochs give them again, normalised, without DALI: the same batches, counts,
labels and padding, timed by the loader's clock, while the files the rank's val epoch reads are unchanged: each
such epoch first compares their sizes and modification times (ETags of remote objects; fingerprint.stamp) with
the filling epoch's, and an epoch after a change reads the files again (a deleted one fails as it would without
the cache) and fills the cache anew. A cache that would outgrow the budget is not kept (one log
line, at the first batch of the first epoch) and val runs through DALI every epoch, as without it.

A loader state taken in an epoch given from the cache carries the DALI checkpoint the filling epoch had at that
batch (PipelineRun.skipped_to), so a resumed loader, whose cache starts empty, reads the rest from DALI exactly.
An elastic resume's remainder epoch, or one after bad samples were excluded, is neither kept nor given again.

Opt-in (val_cache_bytes=0, off): it holds its memory for the whole run (ImageNet's val at 224 px is 7.5 GB of
uint8 over all ranks), memory the model may need; a run that can spare it turns it on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Protocol

import torch

from dali_pipes.data import fingerprint
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.run.hooks import BatchTiming
from dali_pipes.run.pipeline import PipelineSpec
from dali_pipes.run.stages import BatchSource, SourceReading, Wanted

log = logging.getLogger("dali_pipes")


class CachedSource(BatchSource, Protocol):
    """What the val cache sees of the batch source behind it (the rank's pipeline, rank.py)."""

    def checkpoint(self) -> bytes:
        """DALI's state after the last batch it delivered."""

    def given(self, checkpoint: bytes, timing: BatchTiming) -> None:
        """A batch was given without DALI: a state taken now starts DALI at `checkpoint`; `timing` is the
        loop's (the loader's clock hears it)."""

    def read_again(self, checkpoint: bytes) -> None:
        """DALI goes on from `checkpoint`, rebuilt now: nothing it read ahead is kept."""

    def reading(self) -> SourceReading:
        """What it reads now."""

    def epoch_files(self) -> list[str]:
        """The files its epoch reads (its reader's slice): those whose change the cache must see."""


class ValCache:
    """Where a loader's batches come from: DALI, or, for a val loader with a budget, the cache once it holds a
    whole epoch (a batch source in front of the rank's pipeline: `over`). `spec` is the spec to build the
    rank's pipeline from (val with a budget: uint8 images)."""

    def __init__(self, budget: int, spec: PipelineSpec, augment: AugmentConfig) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"val_cache_bytes must be a byte count >= 0 (0: off), got {budget!r}")
        self.budget, self.augment = budget, augment
        self.active = budget > 0 and not spec.train and not spec.shuffled  # val in storage order: epochs repeat
        self.spec = dataclasses.replace(spec, normalize=False) if self.active else spec
        self.batches: list[dict] = []       # the filling epoch's batches, uint8 images
        self.checkpoints: list[bytes] = []  # DALI's checkpoint after each of them
        self.start = b""                    # DALI's checkpoint at the filling epoch's start
        self.filled, self.filling, self.over_budget = False, False, 0  # over_budget: the bytes it would take
        self.replayed, self._excluded = 0, 0
        self._stamp = ""  # fingerprint.stamp of the files the filling epoch read
        self._checked = -1  # the epoch whose replay found them unchanged
        self._data: object = None  # what the filling epoch read: changed data (exclusions) differs
        self._constants: dict = {}
        self.source: CachedSource | None = None

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(batch) for batch in self.batches)

    def over(self, source: CachedSource) -> BatchSource:
        """The batch source the loader reads: the cache in front of `source`, or `source` itself when off."""
        self.source = source
        return self if self.active else source

    def _upstream(self) -> CachedSource:
        if self.source is None:
            raise ValueError("the val cache reads no batch source yet: over(source) comes first")
        return self.source

    def next(self, wanted: Wanted) -> dict | None:
        """The wanted batch: from the cache, or from DALI (kept while a whole epoch fills); its images normalised
        either way. None where DALI ended the epoch first."""
        if self._replays(wanted):
            return self._replay(wanted)
        if wanted.index == 0:
            self._begin()
        batch = self._upstream().next(wanted)
        if batch is None:
            return None
        if self.filling:
            self._keep(wanted, batch)
        return {**batch, "images": self.normalized(batch["images"])}

    def state(self) -> dict | None:
        """Nothing: a resumed loader's cache starts empty (a state taken in an epoch given from the cache carries
        the filling epoch's DALI checkpoint at that batch: CachedSource.given)."""
        return None

    def restore(self, state: dict | None) -> None:
        return None

    def normalized(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images normalised as DALI's crop_mirror_normalize does: (x - mean) * (1 / std), float32 (the
        same values on CPU; float16 rounded from them, as DALI's)."""
        cfg = self.augment
        if images.device not in self._constants:
            shape = (1, 1, 1, 3) if cfg.channels_last else (1, 3, 1, 1)
            mean = torch.tensor([m * 255 for m in cfg.mean], dtype=torch.float32, device=images.device)
            std = torch.tensor([s * 255 for s in cfg.std], dtype=torch.float32, device=images.device)
            self._constants[images.device] = (mean.view(shape), (1 / std).view(shape))
        mean, scale = self._constants[images.device]
        out = images.float().sub_(mean).mul_(scale)  # in place: one float tensor made, half the time of (x - m) * s
        return out.half() if cfg.float16 else out

    def describe(self) -> dict:
        """For DaliLoader.stats()["val_cache"]."""
        state = ("off" if not self.active else "over budget" if self.over_budget else "filled" if self.filled
                 else "filling" if self.filling else "empty")
        return {"state": state, "budget_bytes": self.budget, "bytes": self.nbytes, "batches": len(self.batches),
                "epochs_replayed": self.replayed, "needed_bytes": self.over_budget or None}

    def _replays(self, wanted: Wanted) -> bool:
        source = self._upstream()
        reading = source.reading()
        if not (self.filled and reading.whole and reading.data is self._data and len(self.batches) == wanted.batches):
            return False
        if self._checked == wanted.epoch or fingerprint.stamp(source.epoch_files()) == self._stamp:
            self._checked = wanted.epoch  # checked once per epoch, at its first batch given from the cache
            return True
        # A file changed or went since the cache filled: never give its old pixels again. DALI reads the epoch
        # anew (and fills the cache again), rebuilt at the epoch's start so that nothing it read ahead is kept.
        log.warning("val cache: the val files changed since it filled; val is read from the files again")
        self.filled, self.batches, self.checkpoints = False, [], []
        source.read_again(self.start)
        return False

    def _replay(self, wanted: Wanted) -> dict:
        asked = time.perf_counter()
        kept = self.batches[wanted.index]
        batch = {**kept, "images": self.normalized(kept["images"])}
        timing = BatchTiming(asked, time.perf_counter(), wanted.images)
        # what a state taken now resumes at
        self._upstream().given(self.start if wanted.last else self.checkpoints[wanted.index], timing)
        self.replayed += wanted.last
        return batch

    def _begin(self) -> None:
        """A whole epoch starts (the first batch, from DALI): fill afresh, unless over budget or a remainder."""
        source = self._upstream()
        reading = source.reading()
        self.batches, self.checkpoints, self.filled = [], [], False
        self.filling = not self.over_budget and reading.whole
        if self.filling:
            self.start, self._data, self._excluded = source.checkpoint(), reading.data, reading.excluded
            self._stamp = fingerprint.stamp(source.epoch_files())  # the files as this epoch reads them

    def _keep(self, wanted: Wanted, batch: dict) -> None:
        index, source = wanted.index, self._upstream()
        if index != len(self.batches):  # not the next batch of the epoch being kept (a resume in between)
            self.filling, self.batches, self.checkpoints = False, [], []
            return
        if index == 0 and _nbytes(batch) * wanted.batches > self.budget:
            self.filling, self.over_budget = False, _nbytes(batch) * wanted.batches
            log.warning("val cache: not used; this rank's val epoch takes about %d bytes (%d batches of %d), over "
                        "val_cache_bytes=%d; val is decoded every epoch (raise --val-cache-bytes to keep it)",
                        self.over_budget, wanted.batches, _nbytes(batch), self.budget)
            return
        self.batches.append({k: v.clone() for k, v in batch.items()})  # the cache's own: DALI reuses its buffers
        self.checkpoints.append(source.checkpoint())
        if wanted.last:  # whole, unless samples were excluded meanwhile (then epochs differ)
            self.filling = False
            reading = source.reading()
            self.filled = (reading.data is self._data and reading.excluded == self._excluded
                           and fingerprint.stamp(source.epoch_files()) == self._stamp)  # none changed while it filled


def _nbytes(batch: dict) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())
