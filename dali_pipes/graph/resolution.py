"""Progressive resizing: the training image size as a schedule over epochs.

A schedule maps the epoch at which a size starts to that size, `{0: 160, 10: 192, 16: 224}`: epochs
0-9 train at 160 px, 10-15 at 192, 16 on at 224. It must start at epoch 0; a plain int is a schedule
of one size. On the command line it is written `0:160,10:192,16:224` (`--image-size`). The size is a
property of the DALI graph, fixed when a pipeline is built, so it changes only at epoch boundaries,
where the loader rebuilds its pipeline (pipeline.RankPipeline); every rank reads the same schedule,
so every rank has the same size in the same epoch, and the shapes a run produces are exactly the
schedule's sizes (plus the validation size): few and known, which a compiled model needs.

This module imports nothing of the project's (graph.py and config.py's flags use it).
"""

from __future__ import annotations

import argparse
import math
from typing import Mapping, Union

ImageSize = Union[int, Mapping[int, int]]


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def schedule_problems(value) -> list[str]:
    """Why `value` is neither a positive int nor a valid {start epoch: size} schedule ([] when it is)."""
    if not isinstance(value, Mapping):
        return [] if _positive_int(value) else [f"image_size must be a positive integer or a schedule "
                                                 f"{{start epoch: size}} such as {{0: 160, 10: 192}}, got {value!r}"]
    problems = []
    epochs = [e for e in value if isinstance(e, bool) or not isinstance(e, int) or e < 0]
    if epochs:
        problems.append(f"image_size schedule: epochs must be integers >= 0, got {epochs} in {dict(value)}")
    sizes = [s for s in value.values() if not _positive_int(s)]
    if sizes:
        problems.append(f"image_size schedule: sizes must be positive integers, got {sizes} in {dict(value)}")
    if 0 not in value:
        problems.append(f"image_size schedule must say the size of epoch 0, e.g. {{0: 160, ...}}; got {dict(value)}")
    return problems


def normalized(value: ImageSize) -> ImageSize:
    """A valid `value` in one form: a schedule of one size becomes that int; a schedule of several a
    dict sorted by epoch, without entries that repeat the size before them. Raises ValueError."""
    problems = schedule_problems(value)
    if problems:
        raise ValueError("; ".join(problems))
    if not isinstance(value, Mapping):
        return value
    out: dict[int, int] = {}
    for epoch in sorted(value):
        if not out or list(out.values())[-1] != value[epoch]:
            out[epoch] = value[epoch]
    return out[0] if len(out) == 1 else out


def size_at(schedule: ImageSize, epoch: int) -> int:
    """The size of epoch `epoch` (0-based) under a normalized `schedule`."""
    if not isinstance(schedule, Mapping):
        return schedule
    return schedule[max(e for e in schedule if e <= max(epoch, 0))]


def sizes(schedule: ImageSize) -> list[int]:
    """Every size of `schedule`, in the order they come."""
    return list(schedule.values()) if isinstance(schedule, Mapping) else [schedule]


def last_size(schedule: ImageSize) -> int:
    return sizes(schedule)[-1]


def schedule_text(schedule: ImageSize) -> str:
    """The command-line form: "224", or "0:160,10:192,16:224"."""
    if not isinstance(schedule, Mapping):
        return str(schedule)
    return ",".join(f"{epoch}:{size}" for epoch, size in schedule.items())


def parse_image_size(text: str) -> ImageSize:
    """--image-size's type: "224", or "EPOCH:SIZE,..." such as "0:160,10:192,16:224"."""
    try:
        if ":" not in text:
            return normalized(int(text))
        schedule: dict[int, int] = {}
        for item in text.split(","):
            epoch, size = (int(part) for part in item.split(":"))
            if epoch in schedule:
                raise ValueError(f"image_size schedule names epoch {epoch} twice")
            schedule[epoch] = size
        return normalized(schedule)
    except ValueError as error:
        detail = str(error) if "image_size" in str(error) else "not a number"
        raise argparse.ArgumentTypeError(f"{text!r}: {detail}; expected a size such as 224 or a schedule "
                                         f"EPOCH:SIZE,... starting at epoch 0, such as 0:160,10:192,16:224") from None


parse_image_size.__name__ = "image size"  # argparse names the type in its errors


def progressive(min_size: int = 160, max_size: int = 192, start_epoch: int = 2, end_epoch: int = 13,
                step: int = 32) -> dict[int, int]:
    """FFCV's linear resolution ramp as a schedule for `image_size`.

    The size of epoch e is `max_size` for e >= end_epoch, else `min_size` for e <= start_epoch, and in
    between the straight line from (start_epoch, min_size) to (end_epoch, max_size) rounded to the
    nearest multiple of `step` (halves up), kept within [min_size, max_size]. Returned as
    {epoch: size} for epoch 0 and each epoch where the size changes; the defaults (FFCV's ResNet-50
    recipe) give {0: 160, 8: 192}."""
    for name, value in (("min_size", min_size), ("max_size", max_size), ("step", step)):
        if not _positive_int(value):
            raise ValueError(f"progressive: {name} must be a positive integer, got {value!r}")
    for name, value in (("start_epoch", start_epoch), ("end_epoch", end_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"progressive: {name} must be an integer >= 0, got {value!r}")
    if min_size > max_size or start_epoch > end_epoch:
        raise ValueError(f"progressive: needs min_size <= max_size and start_epoch <= end_epoch, got sizes "
                         f"{min_size}..{max_size} over epochs {start_epoch}..{end_epoch}")

    def size(epoch: int) -> int:
        if epoch >= end_epoch:
            return max_size
        if epoch <= start_epoch:
            return min_size
        line = min_size + (max_size - min_size) * (epoch - start_epoch) / (end_epoch - start_epoch)
        return min(max_size, max(min_size, math.floor(line / step + 0.5) * step))

    schedule = normalized({epoch: size(epoch) for epoch in range(end_epoch + 1)})
    return {0: schedule} if isinstance(schedule, int) else dict(schedule)
