"""`dali-pipes profile DATA [loader flags]`: how fast each stage of the loader's pipeline can go on this
machine, and the settings to run it with.

Stages, each a pipeline of its own, cumulative (each adds one step to the one before):
  read      the reader alone: encoded bytes and labels out (pipeline.build_pipeline(stage="read"))
  decode    + the whole image decoded (graph.decode_only; train decodes only its crop: an upper bound)
  augment   + the full graph: the loader's pipeline, run by DALI alone
  iterator  + into torch tensors through DALIGenericIterator, as DaliLoader reads it
  copy      + the copy to the GPU (a CPU pipeline on a GPU machine; a GPU pipeline's outputs are there)
each timed at 1, half and all usable cores (num_threads), in rounds that alternate every case, so a
machine that slows down mid-run slows every case alike. Per case: images/s (median over rounds) and
CPU cores busy (process CPU seconds per wall second). The binding stage is the one that adds the most
time per image at all cores. On a GPU also: the full graph at hw_decoder_load 0, 0.65 and 0.99, the
hybrid decode (decode_device="cpu"), and the hardware JPEG decoder's use through NVML (extra [doctor]).

It ends with the recommended settings as flags, writes them to the tuning memory (tuning.py), where
num_threads="auto" starts from them, and writes profile.json, profile.md and (extra [bench]) a plot
under --out (default $DALI_PIPES_CACHE/profile/<time>/).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Iterator, Sequence

from tqdm import tqdm

from dali_pipes.config import LoaderConfig, SourceConfig
from dali_pipes.graph.augment import AugmentConfig
from dali_pipes.options import add_arguments, from_args
from dali_pipes.run import tuning
from dali_pipes.run.dist import Shard
from dali_pipes.run.machine import default_threads
from dali_pipes.run.pipeline import PipelineSpec
from dali_pipes.run.remote_feed import RemoteFeed
from dali_pipes.storage.remote import ClientOptions
from dali_pipes_bench.cli import data_or_builtin, run_main
from dali_pipes_bench.doctor_throughput import NvmlSampler
from dali_pipes_bench.harness import forever

CPU_STAGES = ("read", "decode", "augment", "iterator")
STAGE_NAMES = {"read": "read", "decode": "decode", "augment": "augment (the rest of the graph)",
               "iterator": "into torch tensors (the iterator)", "copy": "the copy to the GPU"}
HW_LOADS = (0.0, 0.65, 0.99)
FAST_ENOUGH = 0.95  # the fewest threads within this fraction of the best rate are recommended


def thread_levels(cores: int) -> list[int]:
    """1, half and all of the cores this rank may use (each once)."""
    return sorted({1, max(1, cores // 2), cores})


def measure(stage: str, source, spec: PipelineSpec, batches: int, warmup: int, feed: RemoteFeed | None = None) -> dict:
    """One case: images/s and CPU cores busy over `batches` batches after `warmup`. A remote source is read
    through `feed` as DaliLoader reads it (remote_feed.py: the shard cache kept ahead of the reader, or DALI's
    own reader), from the start of an epoch: a read stage then includes the fetches it waits for."""
    import torch

    from dali_pipes.graph._dali import shutdown_pipeline
    from dali_pipes.run.pipeline import READER_NAME, build_pipeline
    graph_stage = stage if stage in ("read", "decode") else "augment"
    fed = source if feed is None else feed.dali_source(source, epoch=0, position=0, fresh=True)
    pipe = build_pipeline(fed, spec, stage=graph_stage)
    taken = itertools.count()
    try:
        if stage in ("iterator", "copy"):
            from nvidia.dali.plugin.pytorch import DALIGenericIterator
            batches_of = forever(DALIGenericIterator(pipe, ["images", "labels"], reader_name=READER_NAME,
                                                     auto_reset=True))

            def run_one():
                (batch,) = next(batches_of)
                if stage == "copy":
                    batch["images"].cuda(non_blocking=True)
        else:
            pipe.build()
            run_one = pipe.run

        def step():
            if feed is not None:
                feed.advance(0, next(taken))  # the files the reader reaches before the next batch are local
            run_one()
        for _ in range(warmup):
            step()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(batches):
            step()
        if stage == "copy":
            torch.cuda.synchronize()  # the copies are done before the time is read
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        shutdown_pipeline(pipe)
    return {"images_per_s": batches * spec.batch_size / wall, "cpu_cores": cpu / wall}


def cases(device: str, cores: int, augment: AugmentConfig) -> list[tuple[str, int, dict]]:
    """(stage, threads, extra pipeline args) of every case of one round. The copy to the GPU is a stage of
    a CPU pipeline on a GPU machine; a GPU pipeline's outputs are on the GPU already."""
    import torch
    stages = CPU_STAGES + (("copy",) if device == "cpu" and torch.cuda.is_available() else ())
    out = [(stage, threads, {}) for threads in thread_levels(cores) for stage in stages]
    if device == "gpu":
        out += [("iterator", cores, {"augment": AugmentConfig(**{**vars(augment), "hw_decoder_load": load})})
                for load in HW_LOADS]
        out.append(("iterator", cores, {"decode_device": "cpu"}))
    return out


def case_name(stage: str, threads: int, extra: dict) -> str:
    if "augment" in extra:  # the hw_decoder_load sweep
        return f"{stage}, hw_decoder_load={extra['augment'].hw_decoder_load}, {threads} threads"
    if "decode_device" in extra:
        return f"{stage}, hybrid decode, {threads} threads"
    return f"{stage}, {threads} threads"


def run_profile(data: str, *, batch_size: int, train: bool, loader: LoaderConfig, augment: AugmentConfig,
                source_cfg: SourceConfig, rounds: int, batches: int, warmup: int) -> dict:
    from dali_pipes import open_source
    from dali_pipes.loader import resolve_device
    source = open_source(data, **source_cfg.open_kwargs())
    device = resolve_device(loader.device)
    shard = Shard()
    cores = default_threads()
    base = PipelineSpec(train=train, batch_size=batch_size, device=device, shard=shard, augment=augment,
                        decode_device=loader.decode_device, shuffle_buffer=loader.shuffle_buffer,
                        prefetch_queue_depth=2 if loader.prefetch_queue_depth == tuning.AUTO
                        else loader.prefetch_queue_depth, max_pixels=loader.max_pixels)
    todo = cases(device, cores, augment)
    rates: dict[str, list[dict]] = {case_name(*c): [] for c in todo}
    with remote_feed(source, base, loader) as feed, \
            tqdm(total=rounds * len(todo), desc="profile", unit="case", disable=not sys.stderr.isatty()) as bar:
        for _ in range(rounds):
            for stage, threads, extra in todo:
                with NvmlSampler() if device == "gpu" else nullcontext() as nvml:  # hardware decoder use
                    one = measure(stage, source, replace(base, **extra, num_threads=threads), batches, warmup, feed)
                rates[case_name(stage, threads, extra)].append({**one, **(nvml.summary() if nvml else {})})
                bar.update()
    rows = [{"case": case_name(stage, threads, extra), "stage": stage, "threads": threads,
             "images_per_s": statistics.median(r["images_per_s"] for r in rates[case_name(stage, threads, extra)]),
             "cpu_cores": statistics.median(r["cpu_cores"] for r in rates[case_name(stage, threads, extra)]),
             "rounds": rates[case_name(stage, threads, extra)],
             **({"hw_decoder_load": extra["augment"].hw_decoder_load} if "augment" in extra else {}),
             **({"decode_device": extra["decode_device"]} if "decode_device" in extra else {}),
             **_jpeg_use(rates[case_name(stage, threads, extra)])}
            for stage, threads, extra in todo]
    return {"data": data, "kind": source.kind, "device": device, "batch_size": batch_size, "train": train,
            "cores": cores, "rows": rows, "pipeline_args": base, **recommend(rows, device, cores)}


@contextmanager
def remote_feed(source, spec: PipelineSpec, loader: LoaderConfig) -> Iterator[RemoteFeed | None]:
    """How a remote source reaches the reader, with the loader's flags (--remote-feed, --cache-*, --s3-*);
    None for a local one. Its cache is closed (and its folder deleted) at the end."""
    if source.remote is None:
        yield None
        return
    feed = RemoteFeed(loader.remote_feed, spec, cache_dir=loader.cache_dir, cache_bytes=loader.cache_bytes,
                      cache_prefetch=loader.cache_prefetch,
                      options=ClientOptions.of(loader.s3_attempts, loader.s3_timeout))
    try:
        yield feed
    finally:
        feed.close()


def _jpeg_use(rounds: list[dict]) -> dict:
    """The hardware JPEG decoder's mean use over the rounds, where NVML told (GPU runs, extra [doctor])."""
    values = [r["jpeg_util_mean"] for r in rounds if r.get("jpeg_util_mean") is not None]
    return {"jpeg_util_mean": statistics.mean(values)} if values else {}


def recommend(rows: list[dict], device: str, cores: int) -> dict:
    """The binding stage (at all cores), and the fewest threads within FAST_ENOUGH of the best rate."""
    plain = [r for r in rows if r["case"] == f"{r['stage']}, {r['threads']} threads"]
    last = "copy" if any(r["stage"] == "copy" for r in plain) else "iterator"
    at_all = {r["stage"]: r["images_per_s"] for r in plain if r["threads"] == cores}
    stages = [s for s in CPU_STAGES + ("copy",) if s in at_all]
    per_image = [1 / at_all[s] for s in stages]
    added = [per_image[0]] + [max(0.0, b - a) for a, b in zip(per_image, per_image[1:])]
    binding = stages[max(range(len(stages)), key=added.__getitem__)]
    final = {r["threads"]: r["images_per_s"] for r in plain if r["stage"] == last}
    best = max(final.values())
    threads = min(t for t, rate in final.items() if rate >= FAST_ENOUGH * best)
    settings = {"num_threads": threads, "prefetch_queue_depth": 2}
    flags = f"--num-threads {threads} --prefetch-queue-depth 2"
    loads = {r["hw_decoder_load"]: r["images_per_s"] for r in rows if "hw_decoder_load" in r}
    if loads:
        flags += f" --hw-decoder-load {max(loads, key=loads.get)}"
    return {"binding_stage": STAGE_NAMES[binding], "stage_seconds_per_image": dict(zip(stages, added)),
            "recommended": settings, "recommended_flags": flags, "best_images_per_s": best}


def markdown(result: dict) -> str:
    lines = [f"# dali-pipes profile: {result['data']} ({result['kind']}, {'train' if result['train'] else 'val'}, "
             f"batch {result['batch_size']}, device {result['device']})", "",
             f"{result['date']}; {result['machine']}", "",
             "| case | images/s (median) | CPU cores busy |", "|---|---:|---:|"]
    lines += [f"| {r['case']} | {r['images_per_s']:,.0f} | {r['cpu_cores']:.2f} |"
              + (f" hardware JPEG decoder {r['jpeg_util_mean']:.0f}% busy" if "jpeg_util_mean" in r else "")
              for r in result["rows"]]
    lines += ["", f"Binding stage: **{result['binding_stage']}**.", "",
              f"Recommended: `{result['recommended_flags']}` (written to the tuning memory: "
              f"num_threads=auto starts from it).", ""]
    if result["device"] != "gpu":
        lines.append("Not measured without a GPU pipeline: hw_decoder_load 0 / 0.65 / 0.99, the hybrid decode, the "
                     "hardware JPEG decoder's use (NVML); the copy to the GPU only where torch sees CUDA.")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dali-pipes profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default="", help="any dataset open_source takes (default: the built-in train "
                   "split, made if missing)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--val", action="store_true", help="profile the val graph (default: train)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds over every case")
    p.add_argument("--batches", type=int, default=8, help="timed batches per case and round")
    p.add_argument("--warmup", type=int, default=2, help="batches run before timing each case")
    p.add_argument("--out", default="", help="results folder (default: $DALI_PIPES_CACHE/profile/<time>)")
    add_arguments(p, LoaderConfig, "the DALI loader (as DaliLoader takes them)")
    add_arguments(p, AugmentConfig, "decoding and augmentation", defaults={"channels_last": None})
    add_arguments(p, SourceConfig, "reading DATA")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from dali_pipes.storage.files import cache_root
    from dali_pipes_bench.doctor_throughput import plot
    args = parse_args(argv)
    loader = from_args(LoaderConfig, args)
    from dali_pipes.loader import resolve_device
    gpu = resolve_device(loader.device) == "gpu"  # channels_last as python -m train sets it
    augment = from_args(AugmentConfig, args, channels_last=gpu if args.channels_last is None else args.channels_last)
    started = datetime.datetime.now()
    result = run_profile(data_or_builtin(args.data), batch_size=args.batch_size, train=not args.val, loader=loader,
                         augment=augment, source_cfg=from_args(SourceConfig, args), rounds=args.rounds,
                         batches=args.batches, warmup=args.warmup)
    result.update(date=started.isoformat(timespec="seconds"), machine=tuning.machine(),
                  command=" ".join(["dali-pipes", "profile", *(argv if argv is not None else sys.argv[1:])]))
    key = tuning.memory_key(result.pop("pipeline_args"), result["kind"])
    tuning.remember(key, {**result["recommended"], "source": "profile", "binding_stage": result["binding_stage"]})
    out = args.out or os.path.join(cache_root(), "profile", started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "profile.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(out, "profile.md"), "w") as f:
        f.write(markdown(result))
    plot(out, [{"case": r["case"], "images_per_s": r["images_per_s"]} for r in result["rows"]], "profile.png",
         f"images/s ({'val' if args.val else 'train'}, {augment.image_size} px, batch {args.batch_size})")
    for r in result["rows"]:
        print(f"{r['case']:<48} {r['images_per_s']:>9,.0f} images/s  {r['cpu_cores']:.2f} cores busy")
    print(f"binding stage: {result['binding_stage']}\nrecommended: {result['recommended_flags']}\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
