"""The DALI checkpoint that skip_bad=True takes after every batch (run/pipeline_run.py, keep_checkpoints: the last good
state a bad sample rebuilds at), and one state_dict() on demand.

Two train loaders on the same data, one with skip_bad=True, one with skip_bad=False (CPU, batch 32, 224 px, 2 DALI
threads, seed 0), kept alive; each round runs one whole epoch of each (a warm-up epoch each first), the order
alternated over the rounds. Per epoch: images/s and microseconds per batch (the epoch's wall clock from iter() to
its end, over its batches; the state_dict() below left out). The checkpoint itself is timed where DALI takes it:
DALIGenericIterator.checkpoints is wrapped with a clock for the run (both loaders call the same method;
skip_bad=False calls it only at a build and on demand). On demand: the whole state_dict() after batch 10 of each
epoch (skip_bad=True hands over the checkpoint it holds; skip_bad=False asks DALI for one then), and its DALI
checkpoint alone. Medians with [min, max] over the rounds, raw numbers after them; the machine's load at the start
and the end.

Data: the built-in sample's train folder (1,000 images, 10 classes), read where it is, written nowhere.

    PYTHONPATH=. python benchmarks/results/cpu2-2026-11-27/bench_checkpoint_skip_bad.py

(options: --data data/sample/images/train, --rounds 21: the defaults)"""
import argparse
import logging
import os
import statistics
import sys
import time

import nvidia.dali
import psutil
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dali_pipes import DaliLoader

CHECKPOINT_CALLS: list[float] = []  # seconds of every DALIGenericIterator.checkpoints() call, in order


def clocked_checkpoints():
    """DALIGenericIterator.checkpoints, timed (a clock around DALI's own call; nothing else changes)."""
    original = DALIGenericIterator.checkpoints

    def checkpoints(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            CHECKPOINT_CALLS.append(time.perf_counter() - t)

    DALIGenericIterator.checkpoints = checkpoints


def load() -> str:
    return (f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min), {len(psutil.pids())} processes, "
            f"{psutil.cpu_count()} cores")


def epoch(loader, state_at=10):
    """One whole epoch: (seconds without the state_dict, batches, images, state_dict seconds, checkpoint calls
    during the batches, seconds of the state_dict's own checkpoint calls)."""
    seconds = state_s = 0.0
    batches = images = 0
    calls_before = len(CHECKPOINT_CALLS)
    state_calls: list[float] = []
    t = time.perf_counter()
    for images_batch, _ in loader:
        batches += 1
        images += images_batch.shape[0]
        if batches == state_at:
            seconds += time.perf_counter() - t
            before = len(CHECKPOINT_CALLS)
            s = time.perf_counter()
            loader.state_dict()
            state_s = time.perf_counter() - s
            state_calls = CHECKPOINT_CALLS[before:]
            del CHECKPOINT_CALLS[before:]  # the state's own, reported apart from the batches'
            t = time.perf_counter()
    seconds += time.perf_counter() - t
    return seconds, batches, images, state_s, CHECKPOINT_CALLS[calls_before:], sum(state_calls)


def show(name, values, unit, fmt="{:.1f}"):
    print(f"  {name:40} {unit:10} median {fmt.format(statistics.median(values))} "
          f"[{fmt.format(min(values))}, {fmt.format(max(values))}]  raw {' '.join(fmt.format(v) for v in values)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="data/sample/images/train")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    print("DALI", nvidia.dali.__version__, "Python", sys.version.split()[0], time.strftime("%Y-%m-%d %H:%M"),
          "data", args.data)
    print("start:", load())
    clocked_checkpoints()
    logging.getLogger("dali_pipes").setLevel(logging.ERROR)  # skip_bad's "0 bad samples excluded" after each epoch
    kw = dict(batch_size=32, train=True, device="cpu", num_threads=2, image_size=224, seed=0)
    loaders = {"skip_bad=True": DaliLoader(args.data, skip_bad=True, **kw),
               "skip_bad=False": DaliLoader(args.data, skip_bad=False, **kw)}
    for loader in loaders.values():  # a warm-up epoch each: DALI's buffers grown, files in the page cache
        epoch(loader)
    keys = ("rate", "us_batch", "state_us", "state_ckpt_us", "ckpt_us", "ckpt_n", "ckpt_per_batch")
    res = {name: {key: [] for key in keys} for name in loaders}
    for r in range(args.rounds):
        for name in (list(loaders) if r % 2 == 0 else list(loaders)[::-1]):
            seconds, batches, images, state_s, calls, state_ckpt_s = epoch(loaders[name])
            out = res[name]
            out["rate"].append(images / seconds)
            out["us_batch"].append(seconds / batches * 1e6)
            out["state_us"].append(state_s * 1e6)
            out["state_ckpt_us"].append(state_ckpt_s * 1e6)
            out["ckpt_n"].append(len(calls))
            out["ckpt_us"].extend(c * 1e6 for c in calls)
            out["ckpt_per_batch"].append(sum(calls) / batches * 1e6)
    print(f"{args.rounds} rounds of one epoch each ({batches} batches, {images} images), order alternated")
    for name, out in res.items():
        print(name)
        show("images/s", out["rate"], "img/s")
        show("wall clock per batch", out["us_batch"], "us")
        show("DALI checkpoints taken per epoch", out["ckpt_n"], "calls", "{:.0f}")
        if out["ckpt_us"]:
            show("one DALI checkpoint, during the batches", out["ckpt_us"], "us", "{:.0f}")
        show("state_dict() on demand, after batch 10", out["state_us"], "us")
        show("  its DALI checkpoint", out["state_ckpt_us"], "us")
    on, off = res["skip_bad=True"], res["skip_bad=False"]
    paired = [a / b for a, b in zip(off["rate"], on["rate"])]
    show("images/s skip_bad=False / skip_bad=True, per round", paired, "ratio", "{:.3f}")
    diff = [a - b for a, b in zip(on["us_batch"], off["us_batch"])]
    show("us per batch, skip_bad=True - False, per round", diff, "us", "{:.0f}")
    per_epoch = on["ckpt_per_batch"]
    show("checkpoint time per batch, skip_bad=True", per_epoch, "us")
    print(f"  that is {statistics.median(per_epoch) / statistics.median(on['us_batch']) * 100:.2f}% of a batch's "
          f"wall clock (medians); checkpoint size {len(loaders['skip_bad=False'].pipe.run.checkpoint())} bytes")
    for loader in loaders.values():
        loader.close()
    print("end:", load())


if __name__ == "__main__":
    main()
