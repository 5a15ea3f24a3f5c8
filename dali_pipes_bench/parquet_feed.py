"""The Parquet feed against local TFRecord shards of the same images: the built-in train split written both
ways, then rounds that alternate which format goes first, each reading each format (a) through DaliLoader in
train mode (decode, random crop, flip, normalise) and (b) through the bare feed (the reader step alone, encoded
bytes: what the format itself costs), each timed after a first epoch. Prints a table of the median and spread
of each and the Parquet / TFRecord ratio, and where the results went: parquet.json at --out, default
$DALI_PIPES_CACHE/bench/parquet-<date>/ (each round: a bar on stderr).
Run: dali-pipes bench parquet [flags] (or python -m dali_pipes_bench.parquet_feed)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Sequence

from dali_pipes import AugmentConfig, DaliLoader, LoaderConfig, open_source
from dali_pipes.data.source import Source
from dali_pipes.options import add_arguments, from_args
from dali_pipes_bench.cli import bar, command, configs, markdown, report, run_main
from dali_pipes_bench.formats import format_copies

CASES = ("TFRecord", "Parquet")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dali-pipes bench parquet", description=__doc__)
    parser.add_argument("--data", default="data/sample", help="where the built-in dataset and its copies go "
                        "(DATA/tfrecord, DATA/parquet); each is made once")
    parser.add_argument("--shards", type=int, default=8, help="TFRecord shards and Parquet files")
    parser.add_argument("--rows-per-group", type=int, default=100, help="Parquet row group size (datasets' "
                        "default for image datasets)")
    parser.add_argument("--batch-size", type=int, default=64, help="per step")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each reads one epoch of each format twice")
    parser.add_argument("--out", default="", help="write the results as JSON here (default: "
                        "parquet.json in a folder of this run's own under $DALI_PIPES_CACHE/bench)")
    add_arguments(parser, AugmentConfig, "augmentation")
    add_arguments(parser, LoaderConfig, "DALI loader", defaults={"device": "cpu", "num_threads": 2,
                                                                "prefetch_queue_depth": 2})
    return parser.parse_args(argv)


def write_parquet_copy(train: Source, out: str, files: int, rows_per_group: int) -> str:
    """The samples of `train` as `files` Parquet files in Hugging Face datasets' layout (Image struct of bytes
    and path, int64 label, ClassLabel names in the schema metadata), written with its column options; made once."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if os.path.exists(os.path.join(out, ".complete")):
        return out
    os.makedirs(out, exist_ok=True)
    samples = list(train.iter_samples())
    features = {"image": {"_type": "Image"}, "label": {"names": train.classes, "_type": "ClassLabel"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for k in range(files):
        part = samples[k::files]  # dealt, as the TFRecord conversion deals its shuffled samples
        table = pa.table({"image": pa.array([{"bytes": s.data, "path": os.path.basename(s.origin)} for s in part],
                                            image_type),
                          "label": pa.array([s.label for s in part], pa.int64())}).replace_schema_metadata(meta)
        # as datasets writes an Image column: its leaves uncompressed, PLAIN (no dictionary); the label snappy
        pq.write_table(table, os.path.join(out, f"train-{k:05d}-of-{files:05d}.parquet"), row_group_size=rows_per_group,
                       compression={"image.bytes": "none", "image.path": "none", "label": "snappy"},
                       use_dictionary=["label"], column_encoding={"image.bytes": "PLAIN", "image.path": "PLAIN"})
    open(os.path.join(out, ".complete"), "w").close()
    return out


def loader_epoch(location: str, batch_size: int, augment: AugmentConfig, loader_cfg: LoaderConfig) -> float:
    """Images/s of a train epoch through DaliLoader, after a first epoch (building, filling the buffers)."""
    loader = DaliLoader(location, batch_size=batch_size, train=True, augment=augment, **asdict(loader_cfg))
    sum(len(labels) for _, labels in loader)
    start = time.perf_counter()
    images = sum(len(labels) for _, labels in loader)
    seconds = time.perf_counter() - start
    loader.close()
    return images / seconds


def feed_epoch(source: Source, batch_size: int, loader_cfg: LoaderConfig) -> float:
    """Images/s of the reader step alone (encoded bytes and labels), shuffled as in train: two epochs' batches
    after a first epoch's."""
    from dali_pipes.graph._dali import shutdown_pipeline
    from dali_pipes.run.contract import Contract
    from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs, build_pipeline
    threads = loader_cfg.num_threads if isinstance(loader_cfg.num_threads, int) else 2
    depth = loader_cfg.prefetch_queue_depth if isinstance(loader_cfg.prefetch_queue_depth, int) else 2
    spec = PipelineSpec(contract=Contract(True, batch_size, drop_last=False), device="cpu",
                        knobs=TunedKnobs(num_threads=threads, prefetch_queue_depth=depth),
                        shuffle_buffer=loader_cfg.shuffle_buffer)
    pipe = build_pipeline(source, spec, stage="read", enable_checkpointing=False)
    pipe.build()
    batches = source.num_samples // batch_size
    run_batches(pipe, batches)
    start = time.perf_counter()
    run_batches(pipe, 2 * batches)
    seconds = time.perf_counter() - start
    shutdown_pipeline(pipe)
    return 2 * batches * batch_size / seconds


def run_batches(pipe, count: int) -> None:
    """`count` batches of a pipeline; a Python-fed source ends its epochs with StopIteration (then reset)."""
    while count:
        try:
            pipe.run()
            count -= 1
        except StopIteration:
            pipe.reset()


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "rounds": [round(v, 1) for v in values]}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    augment, loader_cfg = from_args(AugmentConfig, args), from_args(LoaderConfig, args)
    copies = format_copies(args.data, args.shards)
    train = open_source(copies["image folder"])
    locations = {"TFRecord": copies["TFRecord"],
                 "Parquet": write_parquet_copy(train, os.path.join(args.data, "parquet"), args.shards,
                                               args.rows_per_group)}
    sources = {name: open_source(location) for name, location in locations.items()}
    figures: dict[str, dict[str, list[float]]] = {name: {"loader": [], "feed": []} for name in CASES}
    for round_index in bar(range(args.rounds), desc="rounds", unit="round"):
        for name in CASES if round_index % 2 == 0 else CASES[::-1]:  # alternate which goes first
            figures[name]["feed"].append(feed_epoch(sources[name], args.batch_size, loader_cfg))
            figures[name]["loader"].append(loader_epoch(locations[name], args.batch_size, augment, loader_cfg))
    rows = {name: {what: summary(values) for what, values in parts.items()} for name, parts in figures.items()}
    ratios = {what: round(rows["Parquet"][what]["median"] / rows["TFRecord"][what]["median"], 3)
              for what in ("loader", "feed")}
    result = {"command": command("parquet", argv), "samples": train.num_samples, "results": rows,
              "parquet_over_tfrecord": ratios, "configs": configs(augment=augment, loader=loader_cfg)}
    span = lambda s: f"{s['median']:.0f} [{s['min']:.0f}, {s['max']:.0f}]"
    table = markdown(["format", "feed images/s median [min, max]", "loader images/s median [min, max]"],
                     [(name, span(rows[name]["feed"]), span(rows[name]["loader"])) for name in CASES])
    report(result, args.out, "parquet", f"{table}\nParquet / TFRecord (medians of {args.rounds} rounds): feed "
           f"{ratios['feed']:.2f}x, loader {ratios['loader']:.2f}x\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
