"""Make the built-in dataset, convert it, and read one epoch of each format (image folder,
TFRecord, WebDataset) through a DALI val pipeline (decode + resize + centre crop + normalise),
printing images/s."""

import argparse
import os
import time

from dali_pipes import open_source
from dali_pipes.convert import write_tfrecords, write_webdataset
from dali_pipes.pipeline import eval_pipeline, run_epoch
from dali_pipes.sample_data import SampleDatasetConfig, make_sample_dataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="data/sample", help="where the built-in dataset goes (git-ignored)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args()


def main(args: argparse.Namespace) -> None:
    images = os.path.join(args.data, "images")
    if not os.path.isdir(os.path.join(images, "val")):
        print(make_sample_dataset(images, SampleDatasetConfig()))
    train = open_source(os.path.join(images, "train"))
    formats = {"image folder": train.location,
               "TFRecord": os.path.join(args.data, "tfrecord"), "WebDataset": os.path.join(args.data, "webdataset")}
    for name, write in (("TFRecord", write_tfrecords), ("WebDataset", write_webdataset)):
        if not os.path.exists(os.path.join(formats[name], "classes.json")):
            print(f"{name}: {write(train, formats[name], shards=8)}")
    for name, location in formats.items():
        source = open_source(location)
        pipe = eval_pipeline(source, batch_size=args.batch_size, device=args.device, num_threads=args.threads)
        start = time.perf_counter()
        samples, _ = run_epoch(pipe)
        seconds = time.perf_counter() - start
        print(f"{name:>12}: one epoch of {samples} images on DALI {args.device} in {seconds:.2f} s "
              f"= {samples / seconds:.0f} images/s")
        del pipe


if __name__ == "__main__":
    main(parse_args())
