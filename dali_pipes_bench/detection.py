"""Detection (issue 35's "Speed"): images/s and CPU cores busy of `DaliLoader` against torch's DataLoader + PIL on
torchvision's `CocoDetection` (the v2 wrapper, as the references' get_coco(use_v2=True) builds it), with the
detection references' own presets (presets.py, the default "pil" backend: the augmentation runs on PIL images,
then ToImage, ToDtype(float, scale=True), ConvertBoundingBoxFormat(XYXY), SanitizeBoundingBoxes, ToPureTensor):

  * hflip       RandomHorizontalFlip at the image's own size (Faster R-CNN, RetinaNet, FCOS: the model resizes
                to an 800 px shorter side on the GPU, inside GeneralizedRCNNTransform)
  * multiscale  RandomShortestSize(480..800, max_size=1333) + RandomHorizontalFlip: the 800 px-class resize in
                the loader
  * ssdlite     RandomIoUCrop + RandomHorizontalFlip at the image's own size (SSD / SSDlite: the model resizes to
                300 / 320 px; a resize after RandomIoUCrop is refused by DaliLoader today, no preset has one)

Both sides read the same dataset object with the references' collate_fn (tuple(zip(*batch))) and the same batch
size. DataLoader's num_workers is swept (--workers, default 0 1 2 on a 2-core machine): every count is a case of
its own in the alternated rounds, and the ratio is DaliLoader's median over the best DataLoader median. DaliLoader
runs `--threads` DALI threads (default: the cores) on `--device` (cpu; gpu: the graph's decode and boxes on the GPU,
and every side's batches moved there as the references' loop does, the GPU synchronised at each window's end).
The cases alternate round after round under the measurement
protocol (protocol.py); a table per preset of images/s median [min, max] and CPU cores busy (the process tree,
workers included), with the ranking (or why there is none) and the ratios under it.

torchvision: imported when installed; else from `--torchvision-path` (default: the side folder the tests install
the wheel into, $DALI_PIPES_CACHE/torchvision-side/0.N, see tests/torchvision_side.py): `pip install --no-deps
--target DIR "torchvision==0.N.*"` makes one. Data: `--data DIR`, a `dali-pipes sample DIR --detection` folder
(images/train and annotations/instances_train.json); default data/sample-detection, made once when missing.
Run: dali-pipes bench detection [flags] (or python -m dali_pipes_bench.detection)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
import types
from typing import Any, Callable, Sequence

import torch

from dali_pipes.run.stats import Spread
from dali_pipes_bench.cli import bar, command, markdown, median_range, out_help, report, require, run_main
from dali_pipes_bench.protocol import (
    Case,
    CaseResult,
    ProtocolConfig,
    add_protocol_arguments,
    compare,
    protocol_from_args,
)

PRESETS = ("hflip", "multiscale", "ssdlite")
DEFAULT_DATA = "data/sample-detection"
DEFAULTS = ProtocolConfig(min_seconds=40.0, min_epochs=1, rounds=4)
DALI = "DaliLoader"
# Modules of torchvision that register the compiled ops (torchvision::nms, roi_align, ...) with
# torch.library. _meta_registrations raises "operator torchvision::nms does not exist" at import when
# _C.so did not load, and torchvision/__init__.py imports it unconditionally; _autograd_registrations
# is guarded by _has_ops() today but does the same kind of work, so it is kept out too.
STUBBED = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


def side_folder() -> str:
    """The tests' side install of torchvision: cache_root()/torchvision-side/0.(N+15) for torch 2.N."""
    from dali_pipes.storage.files import cache_root
    minor = int(torch.__version__.split("+")[0].split(".")[1])
    return os.path.join(cache_root(), "torchvision-side", f"0.{minor + 15}")


def import_torchvision(path: str = "") -> types.ModuleType:
    """torchvision when importable, else its pure-Python parts from `path` (default: side_folder())."""
    if not path and importlib.util.find_spec("torchvision") is not None:
        return importlib.import_module("torchvision")
    folder = path or side_folder()
    if not os.path.isdir(os.path.join(folder, "torchvision")):
        raise ImportError(f"torchvision is not installed and {folder} holds no torchvision; install it "
                          f"(pip install torchvision), or put the wheel's Python parts there: pip install --no-deps "
                          f"--target {folder} 'torchvision=={os.path.basename(side_folder())}.*', and pass "
                          f"--torchvision-path {folder}")
    if folder not in sys.path:
        sys.path.append(folder)
    for name in STUBBED:
        sys.modules.setdefault(name, types.ModuleType(name))
    return importlib.import_module("torchvision")


def preset_steps(name: str) -> list:
    """The references' DetectionPresetTrain(data_augmentation=name, backend="pil", use_v2=True) steps."""
    from torchvision.transforms import v2
    augment = {"hflip": [v2.RandomHorizontalFlip(p=0.5)],
               "multiscale": [v2.RandomShortestSize(min_size=(480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800),
                                                    max_size=1333), v2.RandomHorizontalFlip(p=0.5)],
               "ssdlite": [v2.RandomIoUCrop(), v2.RandomHorizontalFlip(p=0.5)]}[name]
    return augment + [v2.ToImage(), v2.ToDtype(torch.float, scale=True), v2.ConvertBoundingBoxFormat("XYXY"),
                      v2.SanitizeBoundingBoxes(), v2.ToPureTensor()]


class DetectionPresetTrain:
    """The references' preset's shape (and name, which DaliLoader opens): a Compose in .transforms, called as
    preset(image, target)."""

    def __init__(self, compose: Any) -> None:
        self.transforms = compose

    def __call__(self, image: Any, target: Any) -> Any:
        return self.transforms(image, target)


def coco_dataset(data: str, preset: str) -> Any:
    """CocoDetection(images/train, annotations/instances_train.json, transforms=preset), the v2 wrapper, and the
    references' Subset without images lacking a box (their _coco_remove_images_without_annotations)."""
    from torch.utils.data import Subset
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2
    images, annotations = os.path.join(data, "images", "train"), os.path.join(data, "annotations",
                                                                              "instances_train.json")
    if not os.path.isfile(annotations):
        raise FileNotFoundError(f"{annotations}: no COCO annotations; --data takes a `dali-pipes sample DIR "
                                f"--detection` folder (images/train, annotations/instances_train.json)")
    with contextlib.redirect_stdout(sys.stderr):  # pycocotools' "loading annotations...": stdout holds the tables
        dataset = CocoDetection(images, annotations,
                                transforms=DetectionPresetTrain(v2.Compose(preset_steps(preset))))
    dataset = wrap_dataset_for_transforms_v2(dataset, target_keys=["boxes", "labels", "image_id"])
    keep = [i for i, image_id in enumerate(dataset.ids)
            if any(a["bbox"][2] > 1 and a["bbox"][3] > 1 for a in dataset.coco.imgToAnns[image_id])]
    return Subset(dataset, keep)


def collate_fn(batch: Any) -> tuple:  # the references' utils.collate_fn
    return tuple(zip(*batch))


def to_device(images: Sequence, targets: Sequence, device: str) -> tuple[list, list]:
    """The references' train loop's first lines: every image and every target tensor moved to `device` (a
    DaliLoader on the GPU hands them over there already: a no-op)."""
    images = [image.to(device, non_blocking=True) for image in images]
    targets = [{k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in t.items()}
               for t in targets]
    return images, targets


def loader_case(name: str, make: Callable[[], Any], device: str = "cpu") -> Case:
    """A case whose unit is one batch (images counted), epochs back to back; the loader is built once. On the
    GPU each batch is moved there as the references' loop does; the protocol synchronises at each window's end."""
    state: dict[str, Any] = {}

    def step() -> int:
        if "batches" not in state:
            state["loader"] = loader = make()
            state["batches"] = (batch for _ in iter(int, 1) for batch in loader)
        images, targets = next(state["batches"])
        if device == "gpu":
            to_device(images, targets, "cuda")
        return len(images)

    def close() -> None:
        getattr(state.get("loader"), "close", lambda: None)()
        state.clear()

    return Case(name, step, units_per_epoch=1, close=close)


def cases(dataset: Any, *, batch_size: int, threads: int, workers: Sequence[int], seed: int,
          device: str = "cpu") -> list[Case]:
    """DaliLoader on `device` (its graph there: decode and boxes), then DataLoader + PIL at each worker count;
    on the GPU every side's batches end there (the references' loop moves them)."""
    from torch.utils.data import DataLoader, RandomSampler

    from dali_pipes import DaliLoader
    out = [loader_case(DALI, lambda: DaliLoader(dataset, batch_size=batch_size, sampler=RandomSampler(dataset),
                                                drop_last=True, collate_fn=collate_fn, device=device,
                                                num_threads=threads, seed=seed), device)]
    for w in workers:  # persistent workers: no fork per epoch, DataLoader at its best
        out.append(loader_case(f"DataLoader + PIL, {w} workers", lambda w=w: DataLoader(
            dataset, batch_size=batch_size, sampler=RandomSampler(dataset), drop_last=True, collate_fn=collate_fn,
            num_workers=w, persistent_workers=w > 0), device))
    return out


def run(data: str, preset: str, *, batch_size: int, threads: int, workers: Sequence[int], seed: int,
        protocol: ProtocolConfig, progress: Any = None, device: str = "cpu") -> dict:
    """Every case of one preset under `protocol`: rows, the best DataLoader, DaliLoader's ratio to it."""
    dataset = coco_dataset(data, preset)
    if len(dataset) < batch_size:
        raise ValueError(f"{data}: {len(dataset)} train images with boxes, fewer than one batch of {batch_size}; "
                         f"pass a smaller --batch-size or make more images (--train-images)")
    result = compare(cases(dataset, batch_size=batch_size, threads=threads, workers=workers, seed=seed,
                           device=device), protocol, progress=progress)
    others = [r for r in result.results if r.name != DALI]
    best = max(others, key=lambda r: r.median)
    per_cpu = {r.name: per_cpu_second(r) for r in result.results}
    best_per_cpu = max(others, key=lambda r: per_cpu[r.name].median).name
    return {"preset": preset, "steps": [type(s).__name__ for s in preset_steps(preset)], "images": len(dataset),
            "device": device, "batch_size": batch_size, "dali_threads": threads, "workers": list(workers),
            "rows": [{**r.row(), "images_per_cpu_s": per_cpu[r.name].row()} for r in result.results],
            "best_dataloader": best.name, "ratio_to_best_dataloader": result.ratio(DALI, best.name),
            "best_dataloader_per_cpu_s": best_per_cpu,
            "ratio_per_cpu_s": ratio(per_cpu[DALI], per_cpu[best_per_cpu]),
            "ranking": result.ranking_text(),
            "lines": result.lines() + [f"{name}: {spread.text()} images per CPU second" for name, spread in
                                       per_cpu.items()]}


def ratio(a: Spread, b: Spread) -> float | None:
    """Median over median; None where a side's windows were too short for the CPU clock (tiny runs)."""
    return a.median / b.median if a.values and b.values else None


def per_cpu_second(result: CaseResult) -> Spread:
    """Images per CPU second of the process tree (DataLoader's workers included), each window: on a shared machine,
    where the wall clock measures the neighbours too, the work a side costs."""
    return Spread.of(w.images / w.cpu_seconds for w in result.windows if w.cpu_seconds > 0)


def data_or_builtin(data: str, images: int) -> str:
    """`data`, or the built-in detection set (COCO-sized images, 400-640 px sides), made once when missing."""
    if data:
        return data
    if not os.path.isfile(os.path.join(DEFAULT_DATA, "annotations", "instances_train.json")):
        from dali_pipes.tools.sample_detection import DetectionSampleConfig, make_detection_sample
        print(f"making the built-in detection set in {DEFAULT_DATA} (pass --data to use yours)", file=sys.stderr,
              flush=True)
        make_detection_sample(DEFAULT_DATA, DetectionSampleConfig(train_images=images, val_images=0,
                                                                  min_side=400, max_side=640))
    return DEFAULT_DATA


def batch_size_arg(text: str) -> int | tuple[str, int]:
    """--batch-size's items: N (every preset) or PRESET=N (that preset)."""
    preset, _, number = text.rpartition("=")
    if preset and preset not in PRESETS:
        raise argparse.ArgumentTypeError(f"{text!r}: no preset named {preset!r}; the presets: {', '.join(PRESETS)}")
    if not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected N or PRESET=N with N a positive whole number")
    return (preset, int(number)) if preset else int(number)


def batch_size_of(items: Sequence[int | tuple[str, int]], preset: str) -> int:
    """The batch size of `preset`: its PRESET=N, else the last plain N, else 8."""
    named = dict(i for i in items if isinstance(i, tuple))
    return named.get(preset) or next((i for i in reversed(items) if isinstance(i, int)), 8)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench detection", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help=f"a `dali-pipes sample DIR --detection` folder (default: "
                   f"{DEFAULT_DATA}, made with --images train images when missing)")
    p.add_argument("--images", type=int, default=256, help="train images of the built-in set when it is made")
    p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    p.add_argument("--batch-size", nargs="+", type=batch_size_arg, default=[8], metavar="[PRESET=]N",
                   help="the same on every side; PRESET=N for one preset (e.g. 2 ssdlite=24: the references' "
                        "Faster R-CNN and SSDlite recipes)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="DaliLoader's device (gpu: decode and "
                   "boxes on the GPU); on gpu every side's batches are moved there, as the references' loop does")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="DALI threads")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="DataLoader num_workers, each a case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torchvision-path", default="", help="a folder holding torchvision's Python parts, used when "
                   "torchvision is not installed (default: the tests' side folder)")
    p.add_argument("--out", default="", help=out_help("detection.json"))
    add_protocol_arguments(p, DEFAULTS)
    args = p.parse_args(argv)
    require("pycocotools", "torchvision's CocoDetection reads the annotations with it", "pip install pycocotools")
    if args.device == "gpu" and not torch.cuda.is_available():
        raise ValueError(f"--device gpu: torch {torch.__version__} sees no CUDA device here; run on a GPU machine "
                         f"or pass --device cpu")
    import_torchvision(args.torchvision_path)
    data, protocol = data_or_builtin(args.data, args.images), protocol_from_args(args)
    progress = lambda what: print(f"  {what}", file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    rows = [run(data, preset, batch_size=batch_size_of(args.batch_size, preset), threads=args.threads,
                workers=args.workers, seed=args.seed, protocol=protocol, progress=progress, device=args.device)
            for preset in bar(args.presets, desc="presets", unit="preset")]
    load = {"before": load_before, "after": os.getloadavg()}  # 1, 5, 15 minutes: a shared machine says so
    report({"command": command("detection", argv), "data": data, "device": args.device, "cpu_count": os.cpu_count(),
            "load_average": load, "protocol": vars(protocol), "rows": rows}, args.out, "detection",
           "\n".join(map(table, rows)))
    return 0


def table(r: dict) -> str:
    """One preset's summary (run's dict): every case as a markdown table, the ranking and DaliLoader's ratios."""
    cells = [(row["case"], median_range({"median": row["images_per_s"], "min": row["min"], "max": row["max"]}),
              f"{row['spread']:.1%}", f"{row['cpu_cores']:.2f}", median_range(row["images_per_cpu_s"]))
             for row in r["rows"]]
    headers = ["case", "images/s median [min, max]", "spread", "cores busy", "images per CPU second median [min, max]"]
    return (f"{r['preset']} ({', '.join(r['steps'])}), {r['images']} images, batch {r['batch_size']}:\n\n"
            f"{markdown(headers, cells)}\n{r['ranking']}\n"
            f"DaliLoader / {r['best_dataloader']}: {r['ratio_to_best_dataloader']:.3f}x (medians); per CPU second, "
            f"DaliLoader / {r['best_dataloader_per_cpu_s']}: {r['ratio_per_cpu_s'] or 0:.3f}x\n")


if __name__ == "__main__":
    sys.exit(run_main(main))
