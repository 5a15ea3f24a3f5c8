"""Does the GPU starve? A training step fed (a) the same batch replayed from device memory,
the ideal with no input cost, and (b) each real loader. Real/ideal images/s and the fraction of
time spent waiting for data say how much the input pipeline costs training."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable, Iterable

import torch
from torch import nn

from dali_pipes_bench.harness import forever
from train.models import create_model
from train.train import param_groups


def ideal_feed(batch_size: int, image_size: int, num_classes: int, device: torch.device) -> Iterable:
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, num_classes, (batch_size,), device=device)
    while True:
        yield images, labels


def measure_training(feed_factory: Callable[[], Iterable], *, arch: str, width: int, num_classes: int,
                     steps: int, warmup: int, device: torch.device, amp: bool) -> dict:
    """images/s and data-wait fraction of `steps` timed training steps after `warmup` steps."""
    torch.manual_seed(0)
    model = create_model(arch, num_classes, width).to(device)
    fmt = torch.channels_last if device.type == "cuda" else torch.preserve_format
    model = model.to(memory_format=fmt)
    optimizer = torch.optim.SGD(param_groups(model, 5e-5), lr=0.01, momentum=0.9, nesterov=True)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if amp else nullcontext()
    start = time.perf_counter()
    loader = feed_factory()
    batches = forever(loader)
    wait = samples = 0.0
    first_batch = None
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            wait, samples, timed_from = 0.0, 0, time.perf_counter()
        tick = time.perf_counter()
        images, labels = next(batches)
        wait += time.perf_counter() - tick
        first_batch = first_batch or time.perf_counter() - start
        images = images.to(device, non_blocking=True, memory_format=fmt)
        labels = labels.to(device, non_blocking=True).clamp_(0, num_classes - 1)
        with autocast:
            loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        samples += len(labels)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - timed_from
    if hasattr(loader, "close"):
        loader.close()
    return {"images_per_s": samples / seconds, "data_wait_fraction": wait / seconds, "first_batch_s": first_batch,
            "steps": steps, "loss": loss.item()}
