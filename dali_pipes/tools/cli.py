"""The `dali-pipes` command (also `python -m dali_pipes`): make the sample dataset, convert, index,
verify, benchmark and diagnose, each subcommand a thin layer over one library call.

Bad input ends a command with one line, `error: <file>: <what> ... <fix>`, and exit status 1, never a
traceback. Long steps show progress bars on a terminal. The benchmarks run as `python -m
dali_pipes_bench.<name>` in a child process: the library never imports the benchmarks package.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from dali_pipes.config import SourceConfig, run_cli
from dali_pipes.data.samples import required
from dali_pipes.options import CommandParser, DefaultsFormatter, RawDefaultsFormatter, add_arguments, from_args, option

DESCRIPTION = """Image datasets for NVIDIA DALI: make the built-in sample dataset, convert, index and verify
datasets, run the benchmarks, the profile and the doctor. Each COMMAND has --help.

Bad input ends a command with one line (error: FILE: what was found. What to do) and exit status 1."""

BENCHMARKS = {  # name -> (module run with python -m, one line for --help)
    "loaders": ("dali_pipes_bench.loaders", "every loader, same data and transforms: DALI, DataLoader + PIL, sweeps"),
    "training": ("dali_pipes_bench.training", "a ResNet step fed by each loader vs. an ideal feed: GPU starved?"),
    "soak": ("dali_pipes_bench.soak", "many epochs of one DaliLoader, memory per epoch; exit 1 on growth"),
    "formats": ("dali_pipes_bench.formats", "one val epoch as image folder, TFRecord and WebDataset"),
    "resolution": ("dali_pipes_bench.resolution", "progressive resizing: loader images/s per size, train with a ramp "
                   "and without, compile s per size"),
    "s3": ("dali_pipes_bench.s3_feed", "TFRecords from disk, DALI's s3:// reader, the shard cache; with delay"),
    "epochs": ("dali_pipes_bench.epochs", "whole epochs: DaliLoader vs DALIGenericIterator on the same graph"),
    "auto": ("dali_pipes_bench.auto_settings", "num_threads=auto vs fixed counts: training and the loader alone"),
    "sharding": ("dali_pipes_bench.sharding_cost", "the sharding check's cost on 1.28 M samples, 2 gloo ranks"),
    "parquet": ("dali_pipes_bench.parquet_feed", "the Parquet feed vs local TFRecord shards of the same images"),
    "val-cache": ("dali_pipes_bench.val_cache", "val epochs decoded every epoch vs given from the val cache"),
    "startup": ("dali_pipes_bench.startup", "GPU: first-batch seconds and GPU memory per decoder preallocation"),
    "recipes": ("dali_pipes_bench.recipe_cost", "mixup + cutmix (each recipe extra) vs the plain loader, alternating"),
    "sampler": ("dali_pipes_bench.sampler_cost", "a WeightedRandomSampler read exactly vs the plain loader, "
                "alternating"),
    "detection": ("dali_pipes_bench.detection", "CocoDetection (v2) with the references' presets: DaliLoader vs "
                  "DataLoader + PIL, workers swept"),
    "detection-training": ("dali_pipes_bench.detection_training", "SSDlite320 training steps: the data wait fed by "
                           "DaliLoader vs DataLoader + PIL"),
}


@dataclass(frozen=True)
class ConvertConfig:
    """Shard layout of `dali-pipes convert tfrecord|webdataset`: keywords of write_tfrecords / write_webdataset."""
    shards: int = option(8, "output shards; samples are shuffled across them with a seeded permutation")
    prefix: str | None = option(None, "shard file names: PREFIX-00000-of-0000K (default: the name of SRC's folder, "
                                "so data/val gives val-*; None reads as that)", type=str)
    seed: int = option(0, "seed of that shuffle (the same seed gives the same bytes)")
    workers: int | None = option(None, "encoding processes; None: all cores", type=int)
    overwrite: bool = option(False, "OUT holds an earlier conversion with this prefix: remove it first (its "
                             "shards, .idx files, classes.json, manifest.json), else that is refused. Files no "
                             "conversion wrote are never removed")


@dataclass(frozen=True)
class CocoConfig:
    """Reading a COCO detection JSON (convert's SRC or verify's PATH ending in .json): keywords of coco_set."""
    images: str | None = option(None, "the image folder (or store URL) that the JSON's file names are relative "
                                "to; needed with a .json", type=str)
    keep_empty: bool = option(True, "keep images without annotations (--no-keep-empty drops them, as torchvision's "
                              "detection references do for training)")
    bad_boxes: str = option("raise", "an annotation outside its image, of no area or of an unknown category or "
                            "image: raise (name it and stop) or drop (leave it out, with a warning)",
                            choices=("raise", "drop"))


# ---------------------------------------------------------------------------------------------
# Subcommands: each takes the parsed flags and returns an exit status
# ---------------------------------------------------------------------------------------------

def sample(args: argparse.Namespace) -> int:
    if args.detection:
        return sample_detection(args)
    from dali_pipes.tools.sample_data import SampleDatasetConfig, make_sample_dataset, write_tfrecord_copy
    cfg = from_args(SampleDatasetConfig, args)
    start = time.perf_counter()
    stats = make_sample_dataset(args.out, cfg, workers=args.workers)
    print(f"{args.out}: {stats['train']} train + {stats['val']} val images in {cfg.classes} classes, "
          f"mean {stats['mean_bytes'] / 1e3:.0f} KB, {time.perf_counter() - start:.1f} s")
    if args.tfrecord_shards:
        for split, converted in write_tfrecord_copy(args.out, args.tfrecord_shards, workers=args.workers).items():
            print(f"{args.out}/tfrecord/{split}: {converted}")
    return 0


def sample_detection(args: argparse.Namespace) -> int:
    from dali_pipes.tools.sample_detection import DetectionSampleConfig, make_detection_sample
    cfg = from_args(DetectionSampleConfig, args)
    for split, made in make_detection_sample(args.out, cfg, workers=args.workers).items():
        print(f"{made['annotations']}: {made['images']} {split} images, {made['boxes']} boxes in "
              f"{cfg.categories} categories (images in {args.out}/images/{split})")
    return 0


def convert(args: argparse.Namespace) -> int:
    if args.src.endswith(".json"):
        return convert_detection(args)
    from dali_pipes import open_source
    from dali_pipes.tools.convert import default_prefix, write_tfrecords, write_webdataset
    write = {"tfrecord": write_tfrecords, "webdataset": write_webdataset}[args.format]
    source = open_source(args.src, **from_args(SourceConfig, args).open_kwargs())
    layout = from_args(ConvertConfig, args, prefix=args.prefix or default_prefix(args.src))
    stats = write(source, args.out, **asdict(layout))
    print(f"{args.out}: {stats}")
    return 0


def _images(args: argparse.Namespace, path: str) -> str:
    from dali_pipes.errors import DatasetError
    if not args.images:
        raise DatasetError(path, "a COCO JSON comes with its image folder", "Pass --images FOLDER (the folder its "
                           "file names are relative to, e.g. coco/train2017)")
    return args.images


def convert_detection(args: argparse.Namespace) -> int:
    """COCO JSON SRC (+ --images) -> detection shards of args.format with their manifest."""
    from dali_pipes.data.formats.coco import coco_set, default_prefix
    from dali_pipes.tools.convert_detection import write_detection_shards
    cfg = from_args(CocoConfig, args)
    found = coco_set(args.src, _images(args, args.src), keep_empty=cfg.keep_empty, bad_boxes=cfg.bad_boxes)
    layout = from_args(ConvertConfig, args, prefix=args.prefix or default_prefix(args.src))
    stats = write_detection_shards(found, args.out, kind=args.format, **asdict(layout))
    print(f"{args.out}: {stats}, {sum(len(s.labels) for s in found.samples)} boxes in {len(found.categories)} "
          f"categories")
    return 0


def decompress(args: argparse.Namespace) -> int:
    from dali_pipes.data.location import classify
    from dali_pipes.errors import DatasetError
    from dali_pipes.tools.convert import decompress_tfrecords
    kind, shards = classify(args.src)
    if kind != "tfrecord":
        raise DatasetError(args.src, f"decompress reads GZIP/ZLIB TFRecord shards, found {kind}",
                           f"Convert other data with: dali-pipes convert tfrecord {args.src} {args.out}")
    print(f"{args.out}: {decompress_tfrecords(shards, args.out, workers=args.workers)}")
    return 0


def index(args: argparse.Namespace) -> int:
    from dali_pipes import open_source
    source = open_source(args.path, **from_args(SourceConfig, args).open_kwargs())  # builds missing or stale ones
    if not source.index_files:
        print(f"{args.path}: {source.kind} needs no index")
        return 0
    for shard, index_file, count in zip(source.files, source.index_files, required(source.counts, source, "counts")):
        print(f"{shard}: {count} samples, index {index_file}")
    return 0


def verify(args: argparse.Namespace) -> int:
    from dali_pipes.tools.verify import verify as verify_location
    from dali_pipes.tools.verify import write_clean_list
    from dali_pipes.tools.verify_detection import is_coco_json, is_detection, verify_detection
    keywords = from_args(SourceConfig, args).open_kwargs()
    if is_detection(args.path):  # a COCO JSON, or shards of boxes: every bad annotation named
        images = _images(args, args.path) if is_coco_json(args.path) else None
        report = verify_detection(args.path, images=images, max_pixels=args.max_pixels)
    else:
        report = verify_location(args.path, keys=keywords["keys"], label_ext=keywords["label_ext"],
                                 max_pixels=args.max_pixels, workers=args.workers)
    for problem in report.problems:
        print(problem)
    print(f"{args.path}: {report.kind}, {report.checked} samples checked, {len(report.problems)} problems")
    if args.write_clean_list:
        lines = write_clean_list(report, args.write_clean_list)
        print(f"{args.write_clean_list}: {lines} good samples listed")
    return 1 if report.problems else 0


def bench(args: argparse.Namespace) -> int:
    """Run one benchmark in a child process (the library must not import the benchmarks)."""
    return subprocess.run([sys.executable, "-m", BENCHMARKS[args.benchmark][0], *args.args]).returncode


def doctor(argv: Sequence[str]) -> int:
    try:
        doctor_module = importlib.import_module("dali_pipes.tools.doctor")
    except ModuleNotFoundError as e:
        if e.name != "dali_pipes.tools.doctor":
            raise
        raise ImportError("dali-pipes doctor: this install of dali_pipes has no dali_pipes/tools/doctor.py; "
                          "install a version that has it") from None
    return doctor_module.main(list(argv))


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------

def _subcommand(commands, name: str, run: Callable, help: str, description: str = "",
                raw: bool = False) -> argparse.ArgumentParser:
    formatter = RawDefaultsFormatter if raw else DefaultsFormatter
    parser = commands.add_parser(name, help=help, description=description or help, formatter_class=formatter)
    parser.set_defaults(run=run)
    return parser


def _add_convert_parsers(commands) -> None:
    convert_parser = commands.add_parser("convert", help="image folder / file list / shards -> TFRecord or "
                                         "WebDataset shards with indexes; decompress GZIP/ZLIB TFRecords",
                                         description="Convert a dataset to another format.")
    formats = convert_parser.add_subparsers(dest="format", required=True, metavar="FORMAT")
    for name, layout in (("tfrecord", "TFRecord shards of tf.train.Example (.tfrecord)"),
                         ("webdataset", "WebDataset tar shards of <key>.jpg + <key>.cls (.tar)")):
        parser = _subcommand(formats, name, convert, f"any dataset -> {layout}, + .idx indexes + classes.json",
                             f"Convert SRC (image folder, file list or shards) to {layout}, each with its DALI "
                             f"index, and OUT/classes.json. Prints MB/s.")
        parser.add_argument("src", help="image folder, file list, or shards (a folder, glob or list file); or a "
                            "COCO detection JSON (with --images): detection shards")
        parser.add_argument("out", help="output folder")
        add_arguments(parser, ConvertConfig, "shards")
        add_arguments(parser, CocoConfig, "reading a COCO JSON (SRC ending in .json)")
        add_arguments(parser, SourceConfig, "reading SRC")
    parser = _subcommand(formats, "decompress", decompress, "GZIP/ZLIB TFRecords -> uncompressed ones "
                         "(DALI reads no compressed ones), same names, + .idx indexes")
    parser.add_argument("src", help="compressed TFRecord shards: a folder, glob or list file")
    parser.add_argument("out", help="output folder")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")


def build_parser() -> argparse.ArgumentParser:
    from dali_pipes import __version__
    parser = CommandParser(prog="dali-pipes", description=DESCRIPTION, formatter_class=RawDefaultsFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sample_parser(commands)
    _add_convert_parsers(commands)
    _add_check_parsers(commands)
    _add_tool_parsers(commands)
    return parser


def _add_sample_parser(commands) -> None:
    from dali_pipes.tools.sample_data import SampleDatasetConfig
    from dali_pipes.tools.sample_detection import DetectionSampleConfig
    p = _subcommand(commands, "sample", sample, "make the built-in ImageNet-like dataset (real photographs; "
                    "needs the [sample] extra)", "Make OUT/train/<class>/*.jpg and OUT/val/<class>/*.jpg from "
                    "photographs that ship inside scikit-image and matplotlib (pip install '.[sample]' from the "
                    "checkout); "
                    "with --tfrecord-shards, also as TFRecord shards. Any size: --classes 1000 --train-per-class "
                    "50 makes 50,000 train images.")
    p.add_argument("out", help="output folder")
    add_arguments(p, SampleDatasetConfig, "dataset")
    p.add_argument("--detection", action="store_true", help="make the built-in detection set instead: objects "
                   "pasted onto backgrounds, their boxes known, as OUT/annotations/instances_{train,val}.json (COCO) "
                   "and OUT/images/{train,val}/*.jpg; --seed, --min-side, --max-side apply")
    add_arguments(p, DetectionSampleConfig, "detection set (with --detection)", skip=("seed", "min_side", "max_side"))
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--tfrecord-shards", type=int, default=0, metavar="K", help="also write OUT/tfrecord/train and "
                   "OUT/tfrecord/val as K TFRecord shards each, with indexes (default: 0, the folders only). At "
                   "benchmark scale: --classes 1000 --train-per-class 50 --tfrecord-shards 64 (50,000 train images)")


def _add_check_parsers(commands) -> None:
    from dali_pipes.data.image_check import DEFAULT_MAX_PIXELS
    p = _subcommand(commands, "index", index, "build (or check) the DALI index of every TFRecord / tar shard",
                    "Build missing or stale indexes (SHARD.idx beside each shard, or under the cache folder "
                    "when the shard folder is read-only) and list each shard's sample count.")
    p.add_argument("path", help="shards: a folder, a glob such as 'train-*-of-*', or a list file")
    add_arguments(p, SourceConfig, "reading PATH")

    p = _subcommand(commands, "verify", verify, "check every sample; exit 1 if anything is wrong",
                    "Decode every image in parallel and list each problem with its file (and shard#record): "
                    "zero-byte, truncated and non-image files, bad TFRecord frames and CRCs, missing keys, "
                    "truncated tar members, empty classes, oversized images. Exit 1 if any.")
    p.add_argument("path", help="image folder, file list, or shards (a folder, glob or list file); a COCO JSON "
                   "(with --images) or detection shards: every bad box named")
    p.add_argument("--images", help="the image folder of a COCO JSON PATH")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help=f"images with more pixels are flagged, from the header alone (a decompression-bomb "
                        f"guard; default: {DEFAULT_MAX_PIXELS})")
    p.add_argument("--write-clean-list", metavar="FILE", help="write a file list ('relative/path label') of "
                   "the good samples; put it inside the dataset folder (paths are relative to it)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    add_arguments(p, SourceConfig, "reading PATH", skip=("index_cache_dir",))  # verify builds no index


def _add_tool_parsers(commands) -> None:
    lines = "\n".join(f"  {name:<9} {text}" for name, (_, text) in BENCHMARKS.items())
    p = _subcommand(commands, "bench", bench, f"benchmarks: {', '.join(BENCHMARKS)} (dali-pipes bench NAME --help)",
                    f"Run a benchmark in a process of its own; ARGS go to it.\n\n{lines}", raw=True)
    p.add_argument("benchmark", choices=list(BENCHMARKS), metavar="NAME", help=", ".join(BENCHMARKS))
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the benchmark's flags (see dali-pipes bench NAME --help)")
    commands.add_parser("doctor", help="check this machine's DALI, GPU and data setup (dali-pipes doctor --help)",
                        add_help=False)  # listed for --help only: main passes its flags to dali_pipes.tools.doctor
    commands.add_parser("profile", help="each stage's speed (read, decode, augment, iterator, copy) at 1, half and "
                        "all cores; the binding stage; recommended flags (dali-pipes profile DATA --help)",
                        add_help=False)  # listed for --help only: main runs dali_pipes_bench.profile


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `dali-pipes`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["doctor"]:  # its flags are its own: pass them through untouched
            return run_cli(doctor, argv[1:]) or 0
        if argv[:1] == ["profile"]:  # a benchmark: in a process of its own, its flags untouched
            return subprocess.run([sys.executable, "-m", "dali_pipes_bench.profile", *argv[1:]]).returncode
        args = build_parser().parse_args(argv)
        return run_cli(args.run, args) or 0
    except (ValueError, ImportError) as e:  # bad settings (DatasetError is caught by run_cli), missing extras
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
