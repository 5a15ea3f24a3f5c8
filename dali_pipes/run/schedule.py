"""The image-size schedule (progressive resizing, resolution.py) as a hook on the rank's batches.

At an epoch boundary where the size changes, the pipeline goes on from DALI's checkpoint (taken after the
last epoch was drained) with the new size: its reader order, slice rotation and random generators continue
as if one pipeline had changed size. A fresh pipeline would not: it would start the rotation and the
generators again, repeating epoch 0's order and crops.
"""

from __future__ import annotations

from dali_pipes.run.hooks import BatchHook, RankView


class SizeSchedule(BatchHook):
    def begin_epoch(self, rank: RankView, batches: int) -> None:
        built = rank.built
        if built is not None and rank.spec.at_epoch(rank.position.epoch).augment != built.augment:
            rank.rebuild(rank.spec, now=True)
