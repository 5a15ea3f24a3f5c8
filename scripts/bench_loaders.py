"""Compare input pipelines on the same data and transforms, in one run: DALI gpu (with a
hw_decoder_load sweep) and cpu, DataLoader + PIL (a num_workers sweep), torchvision GPU decode
and tf.data when installed, storage formats (folder / TFRecord / WebDataset at several shard
counts, lazy vs preloaded), batch size and thread sweeps.

Writes results.json, results.md and PNG plots to OUT/<machine>-<date>/ and prints one JSON line
per case. No timing is asserted anywhere: read the numbers and their conditions."""

import argparse
import json
import os
import sys

import torch

from dali_pipes_bench import harness as bench
from dali_pipes import open_source

DEFAULT_DATA = "data/sample/images/train"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help=f"dataset (any location open_source takes); default: "
                        f"the built-in train split, {DEFAULT_DATA}, made if missing")
    parser.add_argument("--quick", action="store_true", help="a small matrix, under two minutes on 2 cores")
    parser.add_argument("--out", default="benchmarks/results", help="results root folder")
    parser.add_argument("--work", default="data/bench", help="where format copies of the data are made (git-ignored)")
    parser.add_argument("--only", default="", help="comma-separated groups to run (loaders, formats, ...)")
    parser.add_argument("--case", type=int, default=-1, help=argparse.SUPPRESS)  # internal: run one case, print JSON
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> str:
    data = args.data or DEFAULT_DATA
    if not args.data and not os.path.isdir(data):
        from dali_pipes.sample_data import make_sample_dataset
        make_sample_dataset(os.path.dirname(data))
    source = open_source(data)
    gpu, cores = torch.cuda.is_available(), os.cpu_count() or 1
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    plan = bench.make_plan(args.quick, gpu, cores)
    formats = bench.format_copies(source, os.path.join(args.work, f"{os.path.basename(data.rstrip('/'))}"),
                                  plan.shard_counts)
    cases = bench.build_cases(source, plan, gpu, cores, formats)
    if args.only:
        cases = [c for c in cases if c.group in args.only.split(",")]
    if args.case >= 0:  # a child process: one case, measured in a process of its own
        print(bench.RESULT_PREFIX + json.dumps(bench.measure(cases[args.case], plan.timing, device).row()), flush=True)
        return ""
    info, dataset = bench.machine_info(), bench.dataset_info(source)
    print(json.dumps({"machine": info, "dataset": dataset}), flush=True)
    rows = bench.run_cases_isolated(cases, [sys.executable, __file__, *sys.argv[1:]])
    out = bench.results_dir(args.out, info)
    baseline = "DALI gpu" if gpu else "DALI cpu"
    command = "python scripts/bench_loaders.py " + " ".join(sys.argv[1:])
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"command": command, "machine": info, "dataset": dataset, "plan": repr(plan), "results": rows},
                  f, indent=1, default=str)
    table = bench.markdown_table(rows, baseline)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(f"# Input pipelines: {bench.machine_tag(info)}, {info['date']}\n\n`{command}`\n\n"
                f"Machine: {json.dumps(info)}\n\nDataset: {json.dumps(dataset)}\n\n"
                f"Timing: {plan.timing}; batch {plan.batch_size}, {plan.image_size} px unless the case says "
                f"otherwise. Ratios are to {baseline} in the same mode.\n{table}")
    bench.plot(rows, out)
    print(table)
    print(f"results in {out}")
    return out


if __name__ == "__main__":
    main(parse_args())
