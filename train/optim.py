"""The optimizer's recipe: parameter groups without weight decay on norms and biases, and the learning-rate
schedule (linear warm-up, then cosine decay) by samples seen, so that it holds across a change of world size."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on norm weights and biases (1-D parameters)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class WarmupCosine:
    """LambdaLR's factor by samples seen (all ranks), not by steps: linear warm-up over
    `warmup_samples`, then cosine decay to 0 at `total_samples`. LambdaLR calls it with its step
    count; samples seen = base_samples + (step - base_step) * global_batch. An object, not a function,
    so that LambdaLR's state_dict saves it: a run resumed on another world size (another global
    batch) calls `rebase` and goes on along the same schedule by samples."""

    def __init__(self, total_samples: int, warmup_samples: int, global_batch: int) -> None:
        self.total_samples, self.warmup_samples, self.global_batch = total_samples, warmup_samples, global_batch
        self.base_step = self.base_samples = 0

    def samples(self, step: int) -> int:
        return self.base_samples + (step - self.base_step) * self.global_batch

    def rebase(self, step: int, global_batch: int) -> None:
        """From `step` on, each step trains on `global_batch` samples."""
        self.base_samples, self.base_step, self.global_batch = self.samples(step), step, global_batch

    def __call__(self, step: int) -> float:
        samples = self.samples(step)
        if samples < self.warmup_samples:
            # steps: (step + 1) / warmup steps; capped, since after a rebase to another global batch
            # the samples need not land on the warm-up's end
            return min(1.0, (samples + self.global_batch) / self.warmup_samples)
        progress = (samples - self.warmup_samples) / max(1, self.total_samples - self.warmup_samples)
        # a float, not numpy's: the lr is saved in the checkpoint, which loads with weights_only=True
        return float(0.5 * (1 + np.cos(np.pi * min(1.0, progress))))


def warmup_cosine(total_samples: int, warmup_samples: int, global_batch: int) -> WarmupCosine:
    return WarmupCosine(total_samples, warmup_samples, global_batch)
