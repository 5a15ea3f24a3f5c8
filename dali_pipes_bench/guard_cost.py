"""What the pixel guard costs: the same DaliLoader with max_pixels on (the default, 100 million) and
off (None), alternating passes in one run, on the built-in dataset. Prints one JSON line per pass and
a summary: medians and their ratio. No timing is asserted anywhere.

    python -m dali_pipes_bench.guard_cost [--data PATH] [--pairs 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from dali_pipes import DaliLoader

DEFAULT_DATA = "data/sample/images/train"


def images_per_s(loader: DaliLoader, batches: int) -> float:
    """Images/s over `batches` batches, after one warm-up batch, crossing epochs when needed."""
    def stream():
        while True:
            yield from loader
    it = stream()
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(it)
    return batches * loader.batch_size / (time.perf_counter() - start)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    if args.data == DEFAULT_DATA and not os.path.isdir(args.data):
        from dali_pipes.tools.sample_data import make_sample_dataset
        make_sample_dataset(os.path.dirname(args.data))
    loaders = {name: DaliLoader(args.data, batch_size=args.batch_size, train=True, device=args.device, max_pixels=limit)
               for name, limit in (("guard on", 100_000_000), ("guard off", None))}
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for i in range(args.pairs):
        order = list(loaders) if i % 2 == 0 else list(reversed(loaders))  # alternate who goes first
        for name in order:
            rate = images_per_s(loaders[name], args.batches)
            rates[name].append(rate)
            print(json.dumps({"pass": i, "case": name, "images_per_s": round(rate, 1)}), flush=True)
    summary = {name: round(statistics.median(r), 1) for name, r in rates.items()}
    summary["ratio_on_over_off"] = round(summary["guard on"] / summary["guard off"], 3)
    print(json.dumps(summary))
    for loader in loaders.values():
        loader.close()
    return summary


if __name__ == "__main__":
    main()
