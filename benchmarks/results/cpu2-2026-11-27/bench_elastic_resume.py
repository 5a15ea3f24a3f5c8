"""Elastic resume, 2 ranks into 3 (run/elastic.py): the three new ranks' load_state_dict from the two old ranks'
mid-epoch states, against building three fresh loaders for 3 ranks; an image folder and the same images as 8
TFRecord shards.

The old ranks: train loaders for 2 ranks (CPU, batch 32, 224 px, 2 DALI threads each, seed 0), 5 batches each, then
their state_dict(): 320 of the 1,000 samples delivered, 680 left. The states are made once per format and loaded
again in every round. Two cases, each round per format, the order of the formats and of the cases alternated over
the rounds:
  - fresh:  DaliLoader(source, rank=r, world_size=3, ...) for r = 0, 1, 2 (each builds its pipeline), timed;
  - resume: the same three loaders built (untimed), then every rank's load_state_dict(both old states), timed: each
            builds the pipeline that reads its slice of the rest (a file list, or subset indexes over the shards).
The figure is the three ranks' building or load_state_dict alone, their first batch excluded (as on 2026-11-22);
the first batch of each rank after it is timed apart (the three ranks' sum). The sources are opened once
(open_source) and passed in, so no case times the opening of the data. Medians with [min, max] over the rounds,
raw numbers after them; the machine's load at the start and the end.

Data: the built-in sample's train folder (1,000 images, 10 classes), read where it is; its TFRecord copy
(dali_pipes.tools.convert.write_tfrecords, 8 shards) and the subset indexes go to a temporary folder, removed after.

    PYTHONPATH=. python benchmarks/results/cpu2-2026-11-27/bench_elastic_resume.py

(options: --data data/sample/images/train, --rounds 11: the defaults)"""
import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
import time

import nvidia.dali
import psutil

KW = dict(batch_size=32, train=True, device="cpu", num_threads=2, image_size=224, seed=0)


def load() -> str:
    return (f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min), {len(psutil.pids())} processes, "
            f"{psutil.cpu_count()} cores")


def old_states(source, batches=5):
    """Both old ranks' states after `batches` batches each (2 ranks)."""
    from dali_pipes import DaliLoader
    states = []
    for r in range(2):
        loader = DaliLoader(source, rank=r, world_size=2, **KW)
        it = iter(loader)
        for _ in range(batches):
            next(it)
        states.append(loader.state_dict())
        loader.close()
    return states


def new_ranks(source):
    from dali_pipes import DaliLoader
    return [DaliLoader(source, rank=r, world_size=3, **KW) for r in range(3)]


def first_batches(loaders) -> float:
    t = time.perf_counter()
    for loader in loaders:
        next(iter(loader))
    return time.perf_counter() - t


def fresh(source, _states):
    t = time.perf_counter()
    loaders = new_ranks(source)
    seconds = time.perf_counter() - t
    first = first_batches(loaders)
    for loader in loaders:
        loader.close()
    return seconds, first, None


def resume(source, states):
    loaders = new_ranks(source)
    given = [copy.deepcopy(states) for _ in loaders]  # each rank its own copy, as each would read it from disk
    t = time.perf_counter()
    for loader, own in zip(loaders, given):
        loader.load_state_dict(own)
    seconds = time.perf_counter() - t
    lengths = [len(loader) for loader in loaders]  # batches each new rank gives of the rest
    first = first_batches(loaders)
    for loader in loaders:
        loader.close()
    return seconds, first, lengths


def show(name, values, unit, fmt="{:.3f}"):
    print(f"  {name:34} {unit:3} median {fmt.format(statistics.median(values))} "
          f"[{fmt.format(min(values))}, {fmt.format(max(values))}]  raw {' '.join(fmt.format(v) for v in values)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="data/sample/images/train")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_elastic_")
    os.environ["DALI_PIPES_CACHE"] = os.path.join(tmp, "cache")  # the subset indexes: here, not the user's cache
    from dali_pipes import open_source
    from dali_pipes.tools.convert import write_tfrecords
    try:
        print("DALI", nvidia.dali.__version__, "Python", sys.version.split()[0], time.strftime("%Y-%m-%d %H:%M"),
              "data", args.data)
        print("start:", load())
        folder = open_source(args.data)
        write_tfrecords(folder, os.path.join(tmp, "tfrecord"), shards=8, progress=False)
        sources = {"image folder": folder, "TFRecord, 8 shards": open_source(os.path.join(tmp, "tfrecord"))}
        states = {kind: old_states(source) for kind, source in sources.items()}
        print(f"{folder.num_samples} samples; the old ranks delivered 2 x 5 batches of {KW['batch_size']}")
        cases = {"fresh": fresh, "resume": resume}
        res = {(kind, case): {"s": [], "first": []} for kind in sources for case in cases}
        lengths = {}
        for r in range(args.rounds):
            kinds = list(sources) if r % 2 == 0 else list(sources)[::-1]
            for kind in kinds:
                for case in (list(cases) if (r // 2) % 2 == 0 else list(cases)[::-1]):
                    seconds, first, got = cases[case](sources[kind], states[kind])
                    res[kind, case]["s"].append(seconds)
                    res[kind, case]["first"].append(first)
                    lengths[kind] = got or lengths.get(kind)
        print(f"{args.rounds} rounds, formats and cases alternated")
        for kind in sources:
            print(f"{kind}: after the load, the new ranks give {lengths[kind]} batches of the rest")
            show("fresh: build three loaders", res[kind, "fresh"]["s"], "s")
            show("resume: three load_state_dict", res[kind, "resume"]["s"], "s")
            show("resume / fresh, per round", [a / b for a, b in zip(res[kind, "resume"]["s"],
                                                                     res[kind, "fresh"]["s"])], "x")
            show("fresh: first batch, three ranks", res[kind, "fresh"]["first"], "s")
            show("resume: first batch, three ranks", res[kind, "resume"]["first"], "s")
        print("end:", load())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
