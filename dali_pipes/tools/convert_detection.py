"""COCO JSON + image folder -> detection shards (TFRecord with the Object Detection API's keys, or WebDataset
with a JSON member per sample), their DALI indexes and, last, manifest.json.

The output folder rules are convert.py's (an earlier conversion with this prefix refused, or removed with
overwrite; an s3:// `out` staged locally and uploaded, the manifest last). Images are copied as they are (no
re-encoding); each one's header must give the size its JSON entry gives, since the boxes are in those pixels.
Samples are dealt over the shards as convert.py deals them: a seeded permutation, round-robin.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

import numpy as np
from PIL import Image
from tqdm import tqdm

from dali_pipes.data import manifest
from dali_pipes.data.detection import DetectionSample
from dali_pipes.data.formats import detection_tfrecord, detection_webdataset
from dali_pipes.data.formats.coco import CocoSet
from dali_pipes.errors import DatasetError
from dali_pipes.storage import remote_urls, transfer
from dali_pipes.tools.convert import ConvertStats, _remote_out, shard_name

TASK = "detection"  # the manifest's "task": what verify and readers tell detection shards by
EXTENSIONS = {"tfrecord": ".tfrecord", "webdataset": ".tar"}
IMAGE_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp", "gif": "gif"}


def read_image(sample: DetectionSample) -> bytes:
    """The image file's bytes, its header checked against the sample's width and height."""
    if remote_urls.is_remote(sample.path):
        data = transfer.read_bytes(sample.path)
    else:
        with open(sample.path, "rb") as f:
            data = f.read()
    try:
        with Image.open(io.BytesIO(data)) as img:
            size = img.size
    except Exception as e:  # PIL raises several types for undecodable bytes
        raise DatasetError(sample.path, f"image {sample.image_id}: not a readable image ({e})",
                           "Replace the file, or remove the image from the JSON") from None
    if size != (sample.width, sample.height):
        raise DatasetError(sample.path, f"image {sample.image_id}: the file is {size[0]} x {size[1]}, the JSON says "
                           f"{sample.width} x {sample.height} (its boxes are in the JSON's pixels)",
                           "Fix the image's width and height in the JSON")
    return data


def _read_ahead(samples: list[DetectionSample], threads: int) -> Iterator[bytes]:
    """read_image of each sample, in order, at most 4 * threads images in memory at once."""
    with ThreadPoolExecutor(threads) as pool:
        pending: deque[Future] = deque()
        for sample in samples:
            pending.append(pool.submit(read_image, sample))
            if len(pending) >= 4 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _dealt(samples: list[DetectionSample], shards: int, seed: int) -> list[list[DetectionSample]]:
    if not 1 <= shards <= max(1, len(samples)):
        raise ValueError(f"--shards must be between 1 and the {len(samples)} images, got {shards}")
    order = np.random.default_rng(seed).permutation(len(samples))
    dealt: list[list[DetectionSample]] = [[] for _ in range(shards)]
    for position, i in enumerate(order):
        dealt[position % shards].append(samples[i])
    return dealt


def _shard_entry(path: str, samples: list[DetectionSample]) -> dict:
    labels = np.concatenate([s.labels for s in samples]) if samples else np.zeros(0, np.int64)
    return {"name": os.path.basename(path), "bytes": os.path.getsize(path), "samples": len(samples),
            "boxes": int(labels.size), "labels": [int(labels.min()), int(labels.max())] if labels.size else None,
            "largest": [max(s.width for s in samples), max(s.height for s in samples)] if samples else None}


def _write_one(kind: str, path: str, samples: list[DetectionSample], categories: dict[int, str],
               prefix: str, images, bar) -> None:
    def items():
        for sample in samples:
            image = next(images)
            bar.update()
            if kind == "tfrecord":
                yield sample, image
            else:
                key = f"{prefix}_{sample.image_id}".replace(".", "_")  # unique: COCO's image ids are
                yield key, sample, image, IMAGE_EXT.get(detection_tfrecord.image_format(image), "jpg")
    if kind == "tfrecord":
        detection_tfrecord.write_shard(path, items(), categories)
    else:
        detection_webdataset.write_shard(path, items())


@_remote_out
def write_detection_shards(found: CocoSet, out: str, *, kind: str = "tfrecord", shards: int = 8,
                           prefix: str = "train", seed: int = 0, workers: int | None = None,
                           progress: bool = True) -> ConvertStats:
    """Write `found`'s samples (coco_set) as `prefix-0000i-of-0000K.tfrecord` or `.tar` shards of `kind`, each
    with its DALI index, then manifest.json (task "detection", the categories). Returns ConvertStats."""
    if kind not in EXTENSIONS:
        raise ValueError(f"kind must be one of {', '.join(EXTENSIONS)}, got {kind!r}")
    start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    dealt = _dealt(found.samples, shards, seed)
    paths = [os.path.join(out, shard_name(prefix, i, shards, EXTENSIONS[kind])) for i in range(shards)]
    bar = tqdm(total=len(found.samples), desc=f"to_{kind}", unit="img", file=sys.stderr,
               disable=None if progress else True)
    images = _read_ahead([s for shard in dealt for s in shard], workers or 8)  # files or objects, not decoded
    for path, samples in zip(paths, dealt):
        _write_one(kind, path, samples, found.categories, prefix, images, bar)
    bar.close()
    entries = [_shard_entry(p, s) for p, s in zip(paths, dealt)]
    built = {**manifest.build(kind, None, entries), "task": TASK,
             "categories": [{"id": i, "name": n} for i, n in found.categories.items()]}
    previous = manifest.read(os.path.join(out, manifest.MANIFEST_NAME))
    manifest.write(out, manifest.merged(previous, built, prefix))
    return ConvertStats(len(found.samples), shards, sum(e["bytes"] for e in entries), time.perf_counter() - start)
