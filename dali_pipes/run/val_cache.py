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
from typing import TYPE_CHECKING

import torch

from dali_pipes.data import fingerprint
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.run.hooks import BatchTiming
from dali_pipes.run.pipeline import PipelineSpec

if TYPE_CHECKING:
    from dali_pipes.data.source import Source
    from dali_pipes.run.contract import EpochCut
    from dali_pipes.run.rank import RankPipeline

log = logging.getLogger("dali_pipes")


class ValCache:
    """Where a loader's batches come from: DALI, or, for a val loader with a budget, the cache once it holds a
    whole epoch. `spec` is the spec to build the rank's pipeline from (val with a budget: uint8 images)."""

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
        self._source: Source | None = None  # what the filling epoch read: a changed source (exclusions) differs
        self._constants: dict = {}

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(batch) for batch in self.batches)

    def next(self, pipe: RankPipeline, cut: EpochCut, index: int) -> dict | None:
        """Batch `index` of the epoch `cut`: from the cache, or from DALI (kept while a whole epoch fills);
        its images normalised either way. None where DALI ended the epoch first."""
        if self._replays(pipe, cut):
            return self._replay(pipe, cut, index)
        if self.active and index == 0:
            self._begin(pipe)
        batch = pipe.next(cut.size(index))
        if batch is None:
            return None
        if index == cut.batches - 1:
            pipe.run.drain_later()  # DALI's batches past the contract's, after the step (settle)
        if not self.active:
            return batch
        if self.filling:
            self._keep(pipe, cut, index, batch)
        return {**batch, "images": self.normalized(batch["images"])}

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

    def _replays(self, pipe: RankPipeline, cut: EpochCut) -> bool:
        if not (self.filled and pipe.remainder is None and pipe.source is self._source
                and len(self.batches) == cut.batches):
            return False
        if self._checked == pipe.position.epoch or fingerprint.stamp(_files(pipe)) == self._stamp:
            self._checked = pipe.position.epoch  # checked once per epoch, at its first batch given from the cache
            return True
        # A file changed or went since the cache filled: never give its old pixels again. DALI reads the epoch
        # anew (and fills the cache again), rebuilt at the epoch's start so that nothing it read ahead is kept.
        log.warning("val cache: the val files changed since it filled; val is read from the files again")
        self.filled, self.batches, self.checkpoints = False, [], []
        pipe.run.skipped_to(self.start)
        pipe.rebuild(pipe.spec, now=True)
        return False

    def _replay(self, pipe: RankPipeline, cut: EpochCut, index: int) -> dict:
        asked = time.perf_counter()
        kept = self.batches[index]
        batch = {**kept, "images": self.normalized(kept["images"])}
        last = index == cut.batches - 1
        pipe.run.skipped_to(self.start if last else self.checkpoints[index])  # what a state taken now resumes at
        pipe.clock.after_batch(pipe, BatchTiming(asked, time.perf_counter(), cut.size(index)))
        self.replayed += last
        return batch

    def _begin(self, pipe: RankPipeline) -> None:
        """A whole epoch starts (the first batch, from DALI): fill afresh, unless over budget or a remainder."""
        self.batches, self.checkpoints, self.filled = [], [], False
        self.filling = not self.over_budget and pipe.remainder is None
        if self.filling:
            self.start, self._source, self._excluded = pipe.run.checkpoint(), pipe.source, len(pipe.policy.bad_samples)
            self._stamp = fingerprint.stamp(_files(pipe))  # the files as this epoch reads them

    def _keep(self, pipe: RankPipeline, cut: EpochCut, index: int, batch: dict) -> None:
        if index != len(self.batches):  # not the next batch of the epoch being kept (a resume in between)
            self.filling, self.batches, self.checkpoints = False, [], []
            return
        if index == 0 and _nbytes(batch) * cut.batches > self.budget:
            self.filling, self.over_budget = False, _nbytes(batch) * cut.batches
            log.warning("val cache: not used; this rank's val epoch takes about %d bytes (%d batches of %d), over "
                        "val_cache_bytes=%d; val is decoded every epoch (raise --val-cache-bytes to keep it)",
                        self.over_budget, cut.batches, _nbytes(batch), self.budget)
            return
        self.batches.append({k: v.clone() for k, v in batch.items()})  # the cache's own: DALI reuses its buffers
        self.checkpoints.append(pipe.run.checkpoint())
        if index == cut.batches - 1:  # whole, unless samples were excluded meanwhile (then epochs differ)
            self.filling = False
            self.filled = (pipe.source is self._source and len(pipe.policy.bad_samples) == self._excluded
                           and fingerprint.stamp(_files(pipe)) == self._stamp)  # none changed while it filled

def _files(pipe: RankPipeline) -> list[str]:
    """The files this rank's val epoch reads (its reader's slice): those whose change its cache must see."""
    source, reader = pipe.source, pipe.reader()
    counts = source.counts or [1] * len(source.files)
    return [source.files[i] for i, _ in reader.files_of(counts, reader.shard_of(0))]


def _nbytes(batch: dict) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())
