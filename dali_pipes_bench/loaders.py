"""Compare input pipelines on the same data and transforms, in one run: DALI gpu (with a
hw_decoder_load sweep) and cpu, DataLoader + PIL (a num_workers sweep), torchvision GPU decode
and tf.data when installed, storage formats (folder / TFRecord / WebDataset at several shard
counts, lazy vs preloaded), batch size and thread sweeps.

Writes results.json (with the resolved configs), results.md and PNG plots to OUT/<machine>-<date>/
(OUT: --out, default $DALI_PIPES_CACHE/bench) and prints the tables and that folder; on a terminal each case
draws a bar on stderr. No timing is asserted anywhere: read the numbers and their
conditions. Run: dali-pipes bench loaders [flags] (or python -m dali_pipes_bench.loaders)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Sequence

import torch

from dali_pipes import AugmentConfig, LoaderConfig, SourceConfig, open_source
from dali_pipes.graph.resolution import schedule_text
from dali_pipes.options import add_arguments, from_args
from dali_pipes_bench import harness as bench
from dali_pipes_bench.cli import DEFAULT_DATA, command, configs, data_or_builtin, require, results_root, run_main

SWEPT = ("device", "num_threads")  # set by each case (DALI gpu / cpu, the thread sweep), not by flags


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dali-pipes bench loaders", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help=f"dataset (any location open_source takes); default: "
                        f"the built-in train split, {DEFAULT_DATA}, made if missing")
    parser.add_argument("--quick", action="store_true", help="a small matrix, under two minutes on 2 cores; "
                        "a smoke test: its cases run in this process (a real run gives each case a process of its own)")
    parser.add_argument("--out", default="", help="results root folder (default: $DALI_PIPES_CACHE/bench, under "
                        "the cache root)")
    parser.add_argument("--work", default="data/bench", help="where format copies of the data are made")
    parser.add_argument("--only", default="", help="comma-separated case groups to run: loaders, loader_overhead, "
                        "hw_decoder_load, dali_threads, torch_workers, batch_size, formats")
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                        help="write throughput.png and scaling.png (needs matplotlib: the [bench] extra)")
    parser.add_argument("--case", type=int, default=-1, help=argparse.SUPPRESS)  # internal: run one case, print JSON
    add_arguments(parser, SourceConfig, "reading --data")
    add_arguments(parser, AugmentConfig, "augmentation (every case that takes it)")
    add_arguments(parser, LoaderConfig, "DALI loader (every DALI case; device and threads are swept)", skip=SWEPT)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.plots:
        require("matplotlib", "the plots need it", "pass --no-plots")
    source_cfg, augment = from_args(SourceConfig, args), from_args(AugmentConfig, args)
    loader = from_args(LoaderConfig, args)  # device and num_threads keep their defaults: each case sets them
    data = data_or_builtin(args.data)
    source = open_source(data, **source_cfg.open_kwargs())
    gpu, cores = torch.cuda.is_available(), os.cpu_count() or 1
    if not isinstance(augment.image_size, int):
        raise ValueError(f"--image-size {schedule_text(augment.image_size)}: bench loaders measures one size; "
                         f"dali-pipes bench resolution measures each size of a schedule")
    plan = dataclasses.replace(bench.make_plan(args.quick, gpu, cores), image_size=augment.image_size)
    formats = bench.format_copies(source, os.path.join(args.work, os.path.basename(data.rstrip("/"))),
                                  plan.shard_counts)
    cases = bench.build_cases(source, plan, gpu, cores, formats, augment=augment, loader=loader)
    if args.only:
        cases = [c for c in cases if c.group in args.only.split(",")]
        if not cases:
            raise ValueError(f"--only {args.only}: no such case group")
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if args.case >= 0:  # a child process: one case, measured in a process of its own
        step = lambda: print(bench.STEP_PREFIX, flush=True)  # the parent's bar for this case ticks
        print(bench.RESULT_PREFIX + json.dumps(bench.measure(cases[args.case], plan.timing, device, step).row()),
              flush=True)
        return 0
    info, dataset = bench.machine_info(), bench.dataset_info(source)
    steps, child = bench.case_steps(plan.timing), [sys.executable, "-m", "dali_pipes_bench.loaders", *argv]
    rows = (bench.run_cases_here(cases, plan.timing, device, steps) if args.quick else
            bench.run_cases_isolated(cases, child, steps))
    out = bench.results_dir(results_root(args.out), info)
    run = {"command": command("loaders", argv), "machine": info, "dataset": dataset, "plan": repr(plan),
           "configs": configs(source=source_cfg, augment=augment, loader=loader)}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({**run, "results": rows}, f, indent=1, default=str)
    write_report(rows, run, plan, gpu, out, args.plots)
    print(f"results in {out}")
    return 0


def write_report(rows: list[dict], run: dict, plan, gpu: bool, out: str, plots: bool) -> None:
    """results.md (one table per case group) and, with plots, the PNGs; prints the tables."""
    baseline = "DALI gpu" if gpu else "DALI cpu"
    info = run["machine"]
    table = bench.markdown_table(rows, baseline)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(f"# Input pipelines: {bench.machine_tag(info)}, {info['date']}\n\n`{run['command']}`\n\n"
                f"Machine: {json.dumps(info)}\n\nDataset: {json.dumps(run['dataset'])}\n\n"
                f"Configs: {json.dumps(run['configs'])}\n\n"
                f"Timing: {plan.timing}; batch {plan.batch_size}, {plan.image_size} px unless the case says "
                f"otherwise. Ratios are to {baseline} in the same mode.\n{table}")
    if plots:
        bench.plot(rows, out)
    print(table)


if __name__ == "__main__":
    sys.exit(run_main(main))
