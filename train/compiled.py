"""--compile: the training forward through torch.compile, compiled once per image size and never again.

With progressive resizing (--image-size 0:160,10:192,...) the batches of a run come in the few sizes
of the schedule, each from the epoch it starts at on, and every train batch is full (the DALI
loader's train batches drop the tail). The model is compiled with dynamic=False: every input shape
is static, so each size compiles one specialised graph once. Under dynamo's default (dynamic=None) the
second shape would instead recompile a graph with symbolic sizes (slower kernels, and CUDA graphs per
shape under mode="reduce-overhead" all the same). The recompile limit is raised to the number of
sizes, so a long schedule never falls back to eager.

Only the training forward is compiled: evaluate() runs the plain model (its val batches have the val
size, and eval mode would be another graph), so the compile count of a run is its training graph's.
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch
from torch import nn

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", action="store_true", help="torch.compile the training forward, static shapes: "
                        "one compilation per image size (of --image-size's schedule)")
    parser.add_argument("--compile-mode", default="default", choices=MODES, help="torch.compile's mode")


def training_forward(model: nn.Module, args, sizes: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`model`, or with --compile the model compiled for static shapes; `sizes`: how many image sizes
    the training batches will have (the schedule's)."""
    if not args.compile:
        return model
    import torch._dynamo
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # before torch 2.6
    setattr(config, limit, max(getattr(config, limit), sizes + 1))  # one graph per size, and a spare
    return torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode, dynamic=False)


class CompileCounter:
    """Dynamo's own counts since this object was made: graphs compiled, and their compile seconds
    (forward and backward, as dynamo times them; 0 on a torch that names its timers otherwise)."""

    TIMERS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")  # torch 2.13's names

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, float]:
        from torch._dynamo import utils
        times = utils.compilation_time_metrics
        seconds = sum(sum(times.get(name, ())) for name in CompileCounter.TIMERS)
        return utils.counters["stats"]["unique_graphs"], seconds

    def stats(self) -> dict:
        graphs, seconds = self._read()
        return {"compiles": graphs - self.start[0], "compile_s": round(seconds - self.start[1], 3)}

