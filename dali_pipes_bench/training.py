"""Does the GPU starve? A training step (ResNet-50, AMP on GPU, by default) fed (a) the same batch
replayed from device memory, the ideal with no input cost, and (b) each real loader on the same
data. Real/ideal images/s and the fraction of time spent waiting for data say how much the input
pipeline costs training. Writes OUT/<machine>-<date>/training.json (with the resolved configs) and
training.md (OUT: --out, default $DALI_PIPES_CACHE/bench) and prints the table.
Run: dali-pipes bench training [flags] (or python -m dali_pipes_bench.training)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from typing import Callable, Iterable, Sequence

import torch
from torch import nn
from tqdm import tqdm

from dali_pipes import AugmentConfig, DaliLoader, LoaderConfig, SourceConfig, open_source
from dali_pipes.baseline import TorchLoader
from dali_pipes.graph.resolution import schedule_text
from dali_pipes.options import add_arguments, from_args
from dali_pipes_bench import harness as bench
from dali_pipes_bench.cli import DEFAULT_DATA, command, configs, data_or_builtin, results_root, run_main
from dali_pipes_bench.harness import forever

try:  # train/ is the reference training loop of a checkout, not an installed package
    from train.models import create_model
    from train.optim import param_groups
except ImportError as error:
    raise SystemExit("the training benchmark trains train/'s ResNet, which is not installed: run it from the root "
                     "of a dali_pipes checkout (python -m dali_pipes_bench.training ..., or dali-pipes bench "
                     "training ... there)") from error


def ideal_feed(batch_size: int, image_size: int, num_classes: int, device: torch.device) -> Iterable:
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, num_classes, (batch_size,), device=device)
    while True:
        yield images, labels


def measure_training(feed_factory: Callable[[], Iterable], *, arch: str, width: int, num_classes: int,
                     steps: int, warmup: int, device: torch.device, amp: bool) -> dict:
    """images/s and data-wait fraction of `steps` timed training steps after `warmup` steps."""
    torch.manual_seed(0)
    model = create_model(arch, num_classes, width).to(device)
    fmt = torch.channels_last if device.type == "cuda" else torch.preserve_format
    model = model.to(memory_format=fmt)
    optimizer = torch.optim.SGD(param_groups(model, 5e-5), lr=0.01, momentum=0.9, nesterov=True)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if amp else nullcontext()
    start = time.perf_counter()
    loader = feed_factory()
    batches = forever(loader)
    wait = samples = 0.0
    first_batch = None
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            wait, samples, timed_from = 0.0, 0, time.perf_counter()
        tick = time.perf_counter()
        images, labels = next(batches)
        wait += time.perf_counter() - tick
        first_batch = first_batch or time.perf_counter() - start
        images = images.to(device, non_blocking=True, memory_format=fmt)
        labels = labels.to(device, non_blocking=True).clamp_(0, num_classes - 1)
        with autocast:
            loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        samples += len(labels)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - timed_from
    tuned = tuner_report(loader)
    if hasattr(loader, "close"):
        loader.close()
    return {"images_per_s": samples / seconds, "data_wait_fraction": wait / seconds, "first_batch_s": first_batch,
            "steps": steps, "loss": loss.item(), **tuned}


def tuner_report(loader) -> dict:
    """What the tuner did in a DaliLoader's run ("auto" knobs): its view (start, trials, choice, decision) and
    the seconds of each rebuild and trial (stats()'s events); nothing for another feed."""
    if not isinstance(loader, DaliLoader):
        return {}
    stats = loader.stats()
    events = [{"event": name, "seconds": round(end - start, 3), **(args or {})}
              for name, start, end, args in stats.get("events", []) if name in ("rebuild", "tuning trial")]
    return {"tuned": stats.get("tuned"), "tuner_events": events,
            "rebuild_s": round(sum(e["seconds"] for e in events if e["event"] == "rebuild"), 3)}


# ---------------------------------------------------------------------------------------------
# The command: every feed on the same data, the ideal first and last
# ---------------------------------------------------------------------------------------------

QUICK = dict(arch="resnet18", width=16, image_size=112, steps=6, warmup=2)  # --quick: a smoke test


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = QUICK if "--quick" in argv else {}  # --quick changes defaults; explicit flags still win
    gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(prog="dali-pipes bench training", description=__doc__)
    parser.add_argument("--data", default="", help=f"dataset; default: the built-in train split, {DEFAULT_DATA}, "
                        f"made if missing")
    parser.add_argument("--arch", default=quick.get("arch", "resnet50"), help="model (train.models)")
    parser.add_argument("--width", type=int, default=quick.get("width", 64), help="ResNet base width")
    parser.add_argument("--batch-size", type=int, default=256 if gpu else 32, help="per step (default: 256 on "
                        "GPU, 32 on CPU)")
    parser.add_argument("--steps", type=int, default=quick.get("steps", 50 if gpu else 10),
                        help="timed steps per feed (default: 50 on GPU, 10 on CPU)")
    parser.add_argument("--warmup", type=int, default=quick.get("warmup", 10 if gpu else 3),
                        help="untimed steps first (default: 10 on GPU, 3 on CPU)")
    parser.add_argument("--quick", action="store_true", help="a small model and few steps: a smoke test")
    parser.add_argument("--feeds", default="", help="comma-separated names (or their first words) of the feeds to "
                        "run, say 'ideal,DALI gpu' (default: every feed)")
    parser.add_argument("--out", default="", help="results root folder (default: $DALI_PIPES_CACHE/bench, under "
                        "the cache root)")
    add_arguments(parser, SourceConfig, "reading --data")
    add_arguments(parser, AugmentConfig, "augmentation (every loader)",
                  defaults={"image_size": quick.get("image_size", 224), "channels_last": gpu})
    add_arguments(parser, LoaderConfig, "DALI loader (device: one feed each)", skip=("device",))
    return parser.parse_args(argv)


def feeds(source, args, augment: AugmentConfig, loader: LoaderConfig, num_classes: int,
          device: torch.device) -> dict[str, Callable[[], Iterable]]:
    """Name -> factory of each feed: the ideal, DALI (gpu when present, cpu), DataLoader + PIL,
    torchvision GPU decode when installed."""
    gpu, cores, batch = device.type == "cuda", os.cpu_count() or 1, args.batch_size
    dali = {k: v for k, v in asdict(loader).items() if k != "device"}
    out = {"ideal (one batch replayed from device memory)":
           lambda: ideal_feed(batch, augment.image_size, num_classes, device)}
    if gpu:
        out["DALI gpu"] = lambda: DaliLoader(source, batch_size=batch, train=True, device="gpu", augment=augment,
                                             **dali)
    out["DALI cpu"] = lambda: DaliLoader(source, batch_size=batch, train=True, device="cpu", augment=augment,
                                         **{**dali, "decode_device": None})  # all on CPU, whatever --decode-device
    out[f"DataLoader+PIL {cores} workers"] = lambda: TorchLoader(source, batch_size=batch, train=True,
                                                                 num_workers=cores, augment=augment)
    if gpu and bench.available("torchvision"):
        out["torchvision GPU decode"] = lambda: bench.TorchvisionGpuLoader(
            source, batch_size=batch, train=True, image_size=augment.image_size, num_workers=cores)
    return out


def chosen_feeds(factories: dict, names: str) -> dict:
    """The feeds named in `names` (each the start of a feed's name; "" keeps every feed), the ideal always
    first: it is the reference of real / ideal."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        return factories
    unknown = [w for w in wanted if not any(name.startswith(w) for name in factories)]
    if unknown:
        raise ValueError(f"--feeds: no feed named {', '.join(map(repr, unknown))} here; the feeds: "
                         f"{', '.join(map(repr, factories))}")
    return {name: f for i, (name, f) in enumerate(factories.items())
            if i == 0 or any(name.startswith(w) for w in wanted)}


def run_feeds(factories: dict, args, num_classes: int, device: torch.device) -> list[dict]:
    """One row per feed; the ideal's row is the better of its first and last run."""
    rows = []
    # The ideal runs first and again last: the better of the two is the reference, so that a
    # warming machine (clocks, kernel caches) cannot make a real loader beat the ideal.
    order = list(factories.items()) + [next(iter(factories.items()))]
    for name, factory in tqdm(order, desc="feeds", unit="feed", file=sys.stderr, disable=None):
        try:
            row = measure_training(factory, arch=args.arch, width=args.width, num_classes=num_classes,
                                   steps=args.steps, warmup=args.warmup, device=device, amp=device.type == "cuda")
        except Exception as e:  # one broken feed must not lose the others' numbers
            row = {"error": f"{type(e).__name__}: {e}"[:500]}
        rows.append({"feed": name, **row})
    first, last = rows[0], rows.pop()
    if last.get("images_per_s", 0) > first.get("images_per_s", 0):
        rows[0] = last
    ideal = rows[0].get("images_per_s")
    for row in rows:
        row["real_over_ideal"] = row.get("images_per_s", 0) / ideal if ideal else None
    return rows


def markdown(rows: list[dict], run: dict) -> str:
    info = run["machine"]
    lines = [f"# Training step fed by each loader: {bench.machine_tag(info)}, {info['date']}\n",
             f"`{run['command']}`\n", f"Setup: {json.dumps(run['setup'])}\n",
             f"Configs: {json.dumps(run['configs'])}\n",
             "| feed | images/s | real / ideal | data-wait fraction | first batch s |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['feed']} | failed: {r['error'][:80]} | | | |")
        else:
            lines.append(f"| {r['feed']} | {r['images_per_s']:.1f} | {r['real_over_ideal']:.2f} | "
                         f"{r['data_wait_fraction']:.3f} | {r['first_batch_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    source_cfg, augment = from_args(SourceConfig, args), from_args(AugmentConfig, args)
    if not isinstance(augment.image_size, int):
        raise ValueError(f"--image-size {schedule_text(augment.image_size)}: bench training measures one size; "
                         f"dali-pipes bench resolution measures each size of a schedule")
    loader = from_args(LoaderConfig, args)
    source = open_source(data_or_builtin(args.data), **source_cfg.open_kwargs())
    num_classes = len(source.classes) if source.classes else 1000
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    rows = run_feeds(chosen_feeds(feeds(source, args, augment, loader, num_classes, device), args.feeds), args,
                     num_classes, device)
    info = bench.machine_info()
    out = bench.results_dir(results_root(args.out), info)
    run = {"command": command("training", argv), "machine": info, "dataset": bench.dataset_info(source),
           "setup": {"arch": args.arch, "width": args.width, "batch_size": args.batch_size, "steps": args.steps,
                     "warmup": args.warmup, "amp_bf16": device.type == "cuda"},
           "configs": configs(source=source_cfg, augment=augment, loader=loader)}
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump({**run, "results": rows}, f, indent=1, default=str)
    table = markdown(rows, run)
    with open(os.path.join(out, "training.md"), "w") as f:
        f.write(table)
    print(f"{table}\nresults in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
