"""Long-run check: host memory (process tree) and GPU memory after every epoch of a loader.
Growth after the second epoch (the first two allocate caches and pools) should stay under 5%.

The command runs many epochs of one DaliLoader (each a tick of a bar on stderr), prints a table of the epochs
and the verdict, writes one JSON line per epoch and then the verdict (with the resolved configs) to soak.jsonl
at --out (default: a folder of this run's own under $DALI_PIPES_CACHE/bench), and exits 1 if memory grew by
--max-growth or more. Not part of the
default test run (tests/test_soak.py runs a CI-sized one). Run: dali-pipes bench soak [flags]
(or python -m dali_pipes_bench.soak)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Iterable, Iterator, Sequence

from dali_pipes import AugmentConfig, DaliLoader, LoaderConfig, SourceConfig, open_source
from dali_pipes.options import add_arguments, from_args
from dali_pipes.run.usage import gpu_used_mb, host_memory_mb
from dali_pipes_bench.cli import DEFAULT_DATA, bar, command, configs, data_or_builtin, markdown, results_file, run_main


def soak(loader: Iterable, epochs: int) -> Iterator[dict]:
    """Run `epochs` epochs; yield one record per epoch: samples, seconds, host and GPU memory."""
    for epoch in range(epochs):
        start, samples = time.perf_counter(), 0
        for _images, labels in loader:
            samples += len(labels)
        yield {"epoch": epoch, "samples": samples, "seconds": round(time.perf_counter() - start, 3),
               "host_mb": round(host_memory_mb(), 1), "gpu_used_mb": gpu_used_mb()}


def growth_after(records: list[dict], key: str, baseline_epoch: int = 1) -> float | None:
    """Relative growth of `key` from the end of `baseline_epoch` (0-based: the second epoch) to the last."""
    values = [r[key] for r in records if r[key] is not None]
    if len(values) <= baseline_epoch + 1:
        return None
    return (values[-1] - values[baseline_epoch]) / values[baseline_epoch]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dali-pipes bench soak", description=__doc__)
    parser.add_argument("--data", default="", help=f"dataset; default: the built-in train split, {DEFAULT_DATA}, "
                        f"made if missing")
    parser.add_argument("--epochs", type=int, default=20, help="epochs to run")
    parser.add_argument("--batch-size", type=int, default=64, help="per step")
    parser.add_argument("--val", action="store_true", help="val mode instead of train")
    parser.add_argument("--max-growth", type=float, default=0.05, help="fail (exit 1) when host or GPU memory "
                        "grows by this fraction or more after the second epoch")
    parser.add_argument("--out", default="", help="write the JSON lines (epochs, then the verdict) "
                        "here (default: soak.jsonl in a folder of this run's own under $DALI_PIPES_CACHE/bench)")
    add_arguments(parser, SourceConfig, "reading --data")
    add_arguments(parser, AugmentConfig, "augmentation")
    add_arguments(parser, LoaderConfig, "DALI loader")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    source_cfg, augment, loader_cfg = (from_args(cls, args) for cls in (SourceConfig, AugmentConfig, LoaderConfig))
    source = open_source(data_or_builtin(args.data), **source_cfg.open_kwargs())
    loader = DaliLoader(source, batch_size=args.batch_size, train=not args.val, augment=augment, **asdict(loader_cfg))
    records = list(bar(soak(loader, args.epochs), total=args.epochs, desc="epochs", unit="epoch"))
    loader.close()
    growth = {key: growth_after(records, key) for key in ("host_mb", "gpu_used_mb")}
    failed = [k for k, g in growth.items() if g is not None and g >= args.max_growth]
    verdict = {"growth_after_epoch_2": growth, "limit": args.max_growth, "ok": not failed,
               "command": command("soak", argv),
               "configs": configs(source=source_cfg, augment=augment, loader=loader_cfg)}
    print(markdown(["epoch", "samples", "seconds", "host MB", "GPU MB"],
                   [(r["epoch"], r["samples"], r["seconds"], r["host_mb"], r["gpu_used_mb"] or "-") for r in records]))
    show = lambda g: "-" if g is None else f"{g:+.1%}"
    print(f"memory growth after epoch 2: host {show(growth['host_mb'])}, GPU {show(growth['gpu_used_mb'])}; limit "
          f"{args.max_growth:.0%}: {'FAILED (' + ', '.join(failed) + ')' if failed else 'ok'}")
    path = results_file(args.out, "soak", "soak.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in [*records, verdict])
    print(f"results in {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
