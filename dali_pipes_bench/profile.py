"""`dali-pipes profile DATA [loader flags]`: how fast each stage of the loader's pipeline can go on this
machine, and the settings to run it with.

Stages, each a pipeline of its own, cumulative (each adds one step to the one before):
  read      the reader alone: encoded bytes and labels out (pipeline.build_pipeline(stage="read"))
  decode    + the whole image decoded (graph.decode_only; train decodes only its crop: an upper bound)
  augment   + the full graph: the loader's pipeline, run by DALI alone
  iterator  + into torch tensors through DALIGenericIterator, as DaliLoader reads it
  copy      + the copy to the GPU (a CPU pipeline on a GPU machine; a GPU pipeline's outputs are there)
each timed at 1, half and all usable cores (num_threads), under the measurement protocol (protocol.py):
every case at least 30 s in all (--min-epochs adds whole epochs), in at least 3 rounds that alternate every
case (each window on a pipeline built afresh and warmed up), so a machine that slows down mid-run slows every
case alike.
Per case: images/s median [min, max] over the rounds, the spread, and the CPU cores busy (process CPU
seconds per wall second). On a GPU also: the full graph at hw_decoder_load 0, 0.65 and 0.99, the hybrid
decode (decode_device="cpu"), and the hardware JPEG decoder's use through NVML (extra [doctor]).

The binding stage is named only if its own rate (its pipeline alone, at all cores) is below the need: the
training step's (--need), else the whole path's measured rate (a stage alone no faster than the whole
path, within 10%); the earliest such stage binds. Otherwise no single stage binds, and the whole path's
shortfall is the per-batch host cost of the iterator (and the copy), printed in ms per batch.

It ends with the recommended settings as flags, writes them to the tuning memory (tuning.py), where
num_threads="auto" starts from them, with each stage's rate (python -m train's verdict compares the model's
need with them), and writes profile.json, profile.md and (extra [bench]) a plot under --out (default
$DALI_PIPES_CACHE/profile/<time>/). When a case's rounds spread by more than 10%, nothing is ranked,
recommended or remembered: the lines say so.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import os
import statistics
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

from tqdm import tqdm

from dali_pipes.config import LoaderConfig, SourceConfig
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.options import add_arguments, from_args
from dali_pipes.run import tuning, tuning_memory
from dali_pipes.run.contract import Contract
from dali_pipes.run.dist import Shard
from dali_pipes.run.machine import default_threads
from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs
from dali_pipes.run.remote_feed import RemoteFeed
from dali_pipes.run.stats import NOISY, Spread
from dali_pipes.storage.remote import ClientOptions
from dali_pipes_bench.cli import data_or_builtin, run_main
from dali_pipes_bench.doctor_throughput import NvmlSampler
from dali_pipes_bench.harness import forever
from dali_pipes_bench.protocol import (
    Case,
    Comparison,
    ProtocolConfig,
    add_protocol_arguments,
    compare,
    protocol_from_args,
    source_files,
)

CPU_STAGES = ("read", "decode", "augment", "iterator")
# 30 s a case; no whole epochs asked: the stages run batch after batch, and 3 epochs of ImageNet a case (19 cases
# on a GPU) would take hours. --min-epochs 3 asks for them on a small dataset (or for --cold: every file read).
DEFAULTS = ProtocolConfig(min_epochs=0)
STAGE_NAMES = {"read": "read", "decode": "decode", "augment": "augment (the rest of the graph)",
               "iterator": "into torch tensors (the iterator)", "copy": "the copy to the GPU"}
HW_LOADS = (0.0, 0.65, 0.99)
FAST_ENOUGH = 0.95  # the fewest threads within this fraction of the best rate are recommended


def thread_levels(cores: int) -> list[int]:
    """1, half and all of the cores this rank may use (each once)."""
    return sorted({1, max(1, cores // 2), cores})


class StageRun:
    """One case of the profile as the protocol times it: its pipeline built before each window (then
    `warmup` batches run untimed, so its queue is full) and shut down after, so one is alive at a time. A
    remote source is read through `feed` as DaliLoader reads it (remote_feed.py: the shard cache kept ahead of
    the reader, or DALI's own reader), from the start of an epoch: a read stage then includes the fetches."""

    def __init__(self, stage: str, source, spec: PipelineSpec, warmup: int, nvml: bool,
                 feed: RemoteFeed | None = None) -> None:
        self.stage, self.source, self.spec, self.warmup, self.nvml = stage, source, spec, warmup, nvml
        self.feed, self.taken = feed, itertools.count()
        self.pipe: Any = None  # a DALI pipeline while a window runs
        self.run_one: Callable[[], Any] | None = None
        self.sampler: NvmlSampler | None = None
        self.jpeg_use: list[dict] = []  # NVML's summary of each window (GPU runs)

    def prepare(self) -> None:
        from dali_pipes.run.pipeline import build_pipeline
        graph_stage = self.stage if self.stage in ("read", "decode") else "augment"
        fed, self.taken = self.source, itertools.count()
        if self.feed is not None:  # a fresh pipeline reads from the epoch's start
            fed = self.feed.dali_source(self.source, epoch=0, position=0, fresh=True)
        pipe = self.pipe = build_pipeline(fed, self.spec, stage=graph_stage)
        run_one: Callable[[], Any] = pipe.run
        if self.stage in ("iterator", "copy"):
            from nvidia.dali.plugin.pytorch import DALIGenericIterator

            from dali_pipes.run.pipeline import READER_NAME
            batches = forever(DALIGenericIterator(pipe, ["images", "labels"], reader_name=READER_NAME,
                                                  auto_reset=True))
            copy = self.stage == "copy"
            run_one = lambda: next(batches)[0]["images"].cuda(non_blocking=True) if copy else next(batches)
        else:
            pipe.build()
        self.run_one = run_one
        for _ in range(self.warmup):
            self._one()
        if self.nvml:  # the hardware decoder's use over the window
            self.sampler = NvmlSampler().__enter__()

    def _one(self) -> None:
        assert self.run_one is not None, "prepare() runs before each window"  # the protocol's order, not user input
        if self.feed is not None:
            self.feed.advance(0, next(self.taken))  # the files the reader reaches before the next batch are local
        self.run_one()

    def step(self) -> int:
        self._one()
        return self.spec.batch_size

    def release(self) -> None:
        from dali_pipes.graph._dali import shutdown_pipeline
        if self.sampler is not None:
            self.sampler.__exit__(None, None, None)
            self.jpeg_use.append(self.sampler.summary())
            self.sampler = None
        if self.pipe is not None:
            shutdown_pipeline(self.pipe)
        self.pipe = self.run_one = None

    def case(self, name: str, batches_per_epoch: int, files: list[str]) -> Case:
        return Case(name, self.step, batches_per_epoch, files, prepare=self.prepare, release=self.release)


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


def case_spec(base: PipelineSpec, threads: int, extra: dict) -> PipelineSpec:
    """`base` with a case's thread count and `extra` fields (the hw_decoder_load sweep's augment, the hybrid
    decode), its knobs replaced whole: the depth kept, the case's threads and hardware decoder share."""
    augment = extra.get("augment", base.augment)
    knobs = TunedKnobs.requested(threads, base.knobs.prefetch_queue_depth, augment.hw_decoder_load)[0]
    return replace(base, **extra, knobs=knobs)


def run_profile(data: str, *, batch_size: int, train: bool, loader: LoaderConfig, augment: AugmentConfig,
                source_cfg: SourceConfig, protocol: ProtocolConfig, warmup: int, need: float | None = None) -> dict:
    """Every case under `protocol` (alternating rounds), the binding stage and the recommended settings."""
    from dali_pipes import open_source
    from dali_pipes.loader import resolve_device
    source = open_source(data, **source_cfg.open_kwargs())
    device, cores = resolve_device(loader.device), default_threads()
    base = PipelineSpec(contract=Contract(train, batch_size, drop_last=False), device=device, shard=Shard(),
                        augment=augment, decode_device=loader.decode_device, shuffle_buffer=loader.shuffle_buffer,
                        knobs=TunedKnobs.requested(None, loader.prefetch_queue_depth, augment.hw_decoder_load)[0],
                        max_pixels=loader.max_pixels)
    todo = cases(device, cores, augment)
    per_epoch = -(-source.num_samples // batch_size)  # the reader pads the last batch
    files = source_files(source) if protocol.cold else []
    quiet = not sys.stderr.isatty()
    with remote_feed(source, base, loader) as feed, \
            tqdm(total=protocol.rounds * len(todo), desc="profile", unit="case", disable=quiet) as bar:
        runs = [StageRun(stage, source, case_spec(base, threads, extra), warmup, device == "gpu", feed)
                for stage, threads, extra in todo]
        result = compare([run.case(case_name(*c), per_epoch, files) for run, c in zip(runs, todo)], protocol,
                         progress=lambda _: bar.update())
    rows = [{**result[case_name(stage, threads, extra)].row(), "stage": stage, "threads": threads,
             **({"hw_decoder_load": extra["augment"].hw_decoder_load} if "augment" in extra else {}),
             **({"decode_device": extra["decode_device"]} if "decode_device" in extra else {}),
             **_jpeg_use(run.jpeg_use)} for run, (stage, threads, extra) in zip(runs, todo)]
    return {"data": data, "kind": source.kind, "device": device, "batch_size": batch_size, "train": train,
            "cores": cores, "rows": rows, "pipeline_args": base, "protocol": vars(protocol),
            "ranking": result.ranking_text(), **recommend(result, rows, cores, batch_size, need)}


@contextmanager
def remote_feed(source, spec: PipelineSpec, loader: LoaderConfig) -> Iterator[RemoteFeed | None]:
    """How a remote source reaches the reader, with the loader's flags (--remote-feed, --cache-*, --s3-*);
    None for a local one. Its cache is closed (and its folder deleted) at the end."""
    if source.remote is None:
        yield None
        return
    feed = RemoteFeed(loader.remote_feed, spec, cache_dir=loader.cache_dir, cache_bytes=loader.cache_bytes,
                      cache_prefetch=loader.cache_prefetch,
                      options=ClientOptions.of(loader.storage_attempts, loader.storage_timeout,
                                               deadline=loader.download_deadline))
    try:
        yield feed
    finally:
        feed.close()


def _jpeg_use(rounds: list[dict]) -> dict:
    """The hardware JPEG decoder's mean use over the rounds, where NVML told (GPU runs, extra [doctor])."""
    values = [r["jpeg_util_mean"] for r in rounds if r.get("jpeg_util_mean") is not None]
    return {"jpeg_util_mean": statistics.mean(values)} if values else {}


def recommend(result: Comparison, rows: list[dict], cores: int, batch_size: int, need: float | None) -> dict:
    """The binding stage (at all cores; `binding`), and the fewest threads within FAST_ENOUGH of the best
    rate; nothing recommended when the rounds spread too much to rank the cases (protocol.py)."""
    plain = [r for r in rows if r["case"] == f"{r['stage']}, {r['threads']} threads"]
    last = "copy" if any(r["stage"] == "copy" for r in plain) else "iterator"
    at_all = {r["stage"]: result[r["case"]].rate for r in plain if r["threads"] == cores}
    found = binding(at_all, last, batch_size, need, result.unranked_because())
    final = {r["threads"]: r["images_per_s"] for r in plain if r["stage"] == last}
    best = max(final.values())
    threads = min(t for t, rate in final.items() if rate >= FAST_ENOUGH * best)
    flags = f"--num-threads {threads} --prefetch-queue-depth 2"
    loads = {r["hw_decoder_load"]: r["images_per_s"] for r in rows if "hw_decoder_load" in r}
    if loads:
        flags += f" --hw-decoder-load {max(loads, key=loads.get)}"
    ranked = result.unranked_because() is None
    return {"binding_stage": STAGE_NAMES[found.stage] if found.stage else None, "binding": found.text,
            "stage_images_per_s": {stage: rate.median for stage, rate in at_all.items()},
            "recommended": {"num_threads": threads, "prefetch_queue_depth": 2} if ranked else None,
            "recommended_flags": flags if ranked else None, "best_images_per_s": best}


@dataclass(frozen=True)
class Binding:
    stage: str | None  # a key of STAGE_NAMES, or None: no single stage binds (or the rounds were too noisy)
    text: str          # why, as printed


def binding(rates: dict[str, Spread], last: str, batch_size: int, need: float | None,
            unranked: str | None = None) -> Binding:
    """Which stage binds, from each stage's own rate at all cores (`rates`: the pipeline that ends with it,
    run alone; `last` is the whole path). A stage binds only if its own rate is below the need: the model's
    (`need`, images/s), else the whole path's measured rate, within NOISY (a stage alone no faster than the
    whole path). The earliest such stage binds; with none, the whole path's shortfall is the per-batch host
    cost of the iterator (and copy). `unranked`: the protocol's reason to rank nothing."""
    if unranked:
        return Binding(None, f"not named: {unranked.removeprefix('not ranked: ')}")
    whole = rates[last]
    stages = [s for s in CPU_STAGES if s in rates and s != last]
    limit = need if need else whole.median * (1 + NOISY)
    of_need = f"the model's need of {need:,.0f} images/s" if need else f"the whole path's {whole.median:,.0f} images/s"
    for stage in stages:
        if rates[stage].median < limit:
            return Binding(stage, f"{STAGE_NAMES[stage]}: alone it gives {rates[stage].text()} images/s, "
                                  f"{'below' if need else 'no faster than'} {of_need}")
    if need and whole.median >= need:
        return Binding(None, f"no stage binds: the whole path gives {whole.text()} images/s, above {of_need}")
    before = rates[stages[-1]].median if stages else whole.median
    host_ms = batch_size * max(0.0, 1 / max(whole.median, 1e-9) - 1 / max(before, 1e-9)) * 1e3
    alone = ", ".join(f"{s} {rates[s].median:,.0f}" for s in stages)
    return Binding(None, f"no single stage binds: each alone is faster ({alone} images/s) than {of_need}; "
                         f"the rest is the per-batch host cost of {STAGE_NAMES[last]}, {host_ms:.2f} ms per batch")


def markdown(result: dict) -> str:
    lines = [f"# dali-pipes profile: {result['data']} ({result['kind']}, {'train' if result['train'] else 'val'}, "
             f"batch {result['batch_size']}, device {result['device']})", "",
             f"{result['date']}; {result['machine']}; {protocol_text(result['protocol'])}", "",
             "| case | images/s median [min, max] | spread | CPU cores busy |", "|---|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['images_per_s']:,.0f} [{r['min']:,.0f}, {r['max']:,.0f}] | {r['spread']:.1%} | "
              f"{r['cpu_cores']:.2f} |" + (f" hardware JPEG decoder {r['jpeg_util_mean']:.0f}% busy"
                                         if "jpeg_util_mean" in r else "") for r in result["rows"]]
    lines += [line for verdict in verdict_lines(result) for line in ("", verdict)] + [""]
    if result["device"] != "gpu":
        lines.append("Not measured without a GPU pipeline: hw_decoder_load 0 / 0.65 / 0.99, the hybrid decode, the "
                     "hardware JPEG decoder's use (NVML); the copy to the GPU only where torch sees CUDA.")
    return "\n".join(lines) + "\n"


def protocol_text(protocol: dict) -> str:
    return (f"{protocol['rounds']} alternating rounds, each case at least {protocol['min_seconds']:g} s and "
            f"{protocol['min_epochs']:g} epochs in all" + (", read cold" if protocol["cold"] else ""))


def verdict_lines(result: dict) -> list[str]:
    """The binding stage, the ranking and the recommended flags; or, when the rounds may not be ranked, the reason,
    said once, and what it leaves out."""
    if result["recommended_flags"] is None:  # the protocol's reason (protocol.py) is the ranking's text
        return [f"{result['ranking']}: no stage named as binding, nothing recommended; the tuning memory is left as "
                f"it was."]
    return [f"binding: {result['binding']}", result["ranking"],
            f"Recommended: `{result['recommended_flags']}` (written to the tuning memory: num_threads=auto starts "
            f"from it)."]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dali-pipes profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default="", help="any dataset open_source takes (default: the built-in train "
                   "split, made if missing)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--val", action="store_true", help="profile the val graph (default: train)")
    p.add_argument("--batches", type=int, default=8, help="timed batches per case and round, at least")
    p.add_argument("--warmup", type=int, default=2, help="batches run before each timed window, after the build")
    p.add_argument("--need", type=float, default=None, help="images/s the training step takes (say, from python -m "
                   "train's model_images_per_s): a stage binds only below it (default: the whole path's rate)")
    p.add_argument("--out", default="", help="results folder (default: $DALI_PIPES_CACHE/profile/<time>)")
    add_protocol_arguments(p, DEFAULTS)
    add_arguments(p, LoaderConfig, "the DALI loader (as DaliLoader takes them)")
    add_arguments(p, AugmentConfig, "decoding and augmentation", defaults={"channels_last": None})
    add_arguments(p, SourceConfig, "reading DATA")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from dali_pipes.storage.files import cache_root
    args = parse_args(argv)
    loader = from_args(LoaderConfig, args)
    from dali_pipes.loader import resolve_device
    gpu = resolve_device(loader.device) == "gpu"  # channels_last as python -m train sets it
    augment = from_args(AugmentConfig, args, channels_last=gpu if args.channels_last is None else args.channels_last)
    started = datetime.datetime.now()
    result = run_profile(data_or_builtin(args.data), batch_size=args.batch_size, train=not args.val, loader=loader,
                         augment=augment, source_cfg=from_args(SourceConfig, args), warmup=args.warmup,
                         protocol=protocol_from_args(args, warmup=0, min_units=args.batches), need=args.need)
    result.update(date=started.isoformat(timespec="seconds"), machine=tuning_memory.machine(),
                  command=" ".join(["dali-pipes", "profile", *(argv if argv is not None else sys.argv[1:])]))
    key = tuning.memory_key(result.pop("pipeline_args"), result["kind"])
    if result["recommended"] is not None:  # never from rounds too noisy to rank
        tuning.remember(key, {**result["recommended"], "source": "profile",
                              "stage_images_per_s": result["stage_images_per_s"],
                              **({"binding_stage": result["binding_stage"]} if result["binding_stage"] else {})})
    out = args.out or os.path.join(cache_root(), "profile", started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "profile.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(out, "profile.md"), "w") as f:
        f.write(markdown(result))
    save_chart(result["rows"], f"images/s ({'val' if args.val else 'train'}, {augment.image_size} px, batch "
               f"{args.batch_size})", os.path.join(out, "profile.png"))
    for r in result["rows"]:
        print(f"{r['case']:<48} {r['images_per_s']:>9,.0f} [{r['min']:,.0f}, {r['max']:,.0f}] images/s  "
              f"spread {r['spread']:.1%}  {r['cpu_cores']:.2f} cores busy")
    print("\n".join(verdict_lines(result)) + f"\nresults: {out}")
    return 0


def stage_chart(rows: list[dict], xlabel: str):
    """The cases' images/s as bars on a log axis: the reader alone runs at tens of times decode's rate, which a
    linear axis would shrink the stages that bind to slivers beside."""
    from dali_pipes_bench.doctor_throughput import bar_chart
    return bar_chart([{"case": r["case"], "images_per_s": r["images_per_s"]} for r in rows], xlabel, log=True)


def save_chart(rows: list[dict], xlabel: str, path: str) -> None:
    """stage_chart as a PNG at `path`; nothing without matplotlib (extra [bench])."""
    if importlib.util.find_spec("matplotlib") is None:
        return
    import matplotlib.pyplot as plt
    figure = stage_chart(rows, xlabel)
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(run_main(main))
