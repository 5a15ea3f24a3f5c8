"""Verification of detection data: a COCO JSON with its image folder, or detection shards (TFRecord with the
Object Detection API's keys, WebDataset with a JSON member), every problem listed with its file, image id and
annotation id. Checks: the JSON's form, duplicate ids, missing images, annotations of unknown images or
categories, boxes outside their image or of no area, labels outside the categories (the manifest's, for
shards), images that do not decode or whose size is not the one their annotations are in, and, beside shards,
the manifest (verify.py's checks: shards present, of their size and count, their label ranges).
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from dali_pipes.data import manifest
from dali_pipes.data.detection import DetectionSample
from dali_pipes.data.formats import coco, detection_tfrecord, detection_webdataset
from dali_pipes.data.formats.tfrecord import walk_records
from dali_pipes.data.formats.webdataset import group_samples, scan_members
from dali_pipes.data.image_check import DEFAULT_MAX_PIXELS, check_image
from dali_pipes.data.location import classify, classify_remote
from dali_pipes.errors import DatasetError
from dali_pipes.storage import remote_urls, transfer
from dali_pipes.tools.convert_detection import TASK
from dali_pipes.tools.verify import Problem, Report

SHARD_TOLERANCE = 0.01  # pixels: boxes read back from normalised float32 land within this of the edge


def is_coco_json(location) -> bool:
    return isinstance(location, (str, os.PathLike)) and str(location).endswith(".json")


def is_detection(location) -> bool:
    """A COCO JSON, or shards whose manifest says they are detection shards (else, locally, whose first sample
    holds boxes)."""
    if is_coco_json(location):
        return True
    try:
        kind, shards = (classify_remote(location) if remote_urls.is_remote(str(location)) else classify(location))
    except (DatasetError, OSError, ValueError):
        return False
    if kind not in ("tfrecord", "webdataset") or not shards:
        return False
    first = shards[0] if isinstance(shards[0], str) else shards[0].url
    found = manifest.read(manifest.path_beside(first))
    if found is not None:
        return found.get("task") == TASK
    return not remote_urls.is_remote(first) and _first_is_detection(kind, first)


def _first_is_detection(kind: str, shard: str) -> bool:
    try:
        if kind == "tfrecord":
            data = next(walk_records(shard), (0, 0, None, None))[2]
            return data is not None and detection_tfrecord.is_detection_record(data)
        samples = group_samples(scan_members(shard))
        return bool(samples) and detection_webdataset.is_detection_sample(samples[0])
    except (DatasetError, OSError):
        return False


def image_problem(data: bytes, sample: DetectionSample, max_pixels: int) -> str | None:
    """What is wrong with a sample's image: check_image's, or a size other than its annotations'."""
    problem = check_image(data, max_pixels)
    if problem:
        return problem
    with Image.open(io.BytesIO(data)) as img:
        size = img.size
    if size != (sample.width, sample.height):
        return (f"image {sample.image_id} is {size[0]} x {size[1]}, its annotations are for "
                f"{sample.width} x {sample.height}")
    return None


def verify_coco(annotations: str, images: str, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Report:
    """Check a COCO JSON and its image folder; never raises on bad data."""
    report = Report(annotations, "coco")
    try:
        data = coco.load_json(annotations)
        categories = coco.read_categories(annotations, data)
        entries = coco.read_images(annotations, data)
        _, bad = coco.annotation_problems(annotations, data, entries, categories)
    except DatasetError as e:
        report.problems.append(Problem(e.where or annotations, e.problem))
        return report
    report.problems += [Problem(e.where, e.problem) for e in bad]
    missing = coco.missing_images(annotations, images, entries.values())
    report.problems += [Problem(e.where, e.problem) for e in missing]
    gone = {e.where for e in missing}
    present = [coco.detection_sample(coco.image_location(images, e["file_name"]), e["id"], e["width"],
                                     e["height"], [], []) for e in entries.values()]
    present = [s for s in present if s.path not in gone]
    with ThreadPoolExecutor(min(16, 2 * (os.cpu_count() or 1))) as pool:
        found = pool.map(lambda s: image_problem(_read(s.path), s, max_pixels), present)
        report.problems += [Problem(s.path, p) for s, p in zip(present, found) if p]
    report.checked = len(entries)
    return report


def _read(path: str) -> bytes:
    if remote_urls.is_remote(path):
        return transfer.read_bytes(path)
    with open(path, "rb") as f:
        return f.read()


def box_problems(sample: DetectionSample, where: str, category_ids: set[int] | None) -> list[Problem]:
    """Each box of a sample outside its image or of no area, and each label outside `category_ids`."""
    out = []
    t = SHARD_TOLERANCE
    for (x0, y0, x1, y1), label, ann in zip(sample.boxes.tolist(), sample.labels.tolist(),
                                            sample.annotation_ids.tolist()):
        name = f"{where} (image {sample.image_id}, annotation {ann if ann >= 0 else '-'})"
        if not (x1 > x0 and y1 > y0):
            out.append(Problem(name, f"box {[x0, y0, x1, y1]} (xyxy) has no area"))
        elif x0 < -t or y0 < -t or x1 > sample.width + t or y1 > sample.height + t:
            out.append(Problem(name, f"box {[x0, y0, x1, y1]} (xyxy) is outside the {sample.width} x "
                                     f"{sample.height} image"))
        if category_ids is not None and label not in category_ids:
            out.append(Problem(name, f"label {label} is not among the categories "
                                     f"({coco._ids(category_ids)}) of the manifest"))
    return out


def _shard_samples(kind: str, shard: str) -> list[tuple[DetectionSample, bytes]]:
    if kind == "tfrecord":
        return list(detection_tfrecord.iter_shard(shard))
    return [(s, detection_webdataset.image_bytes(s)) for s in detection_webdataset.read_shard(shard)]


def _check_shard(report: Report, kind: str, shard: str, category_ids: set[int] | None,
                 max_pixels: int) -> tuple[int, tuple[int, int] | None]:
    """Every sample of one shard into the report; returns (samples, its (lowest, highest) label or None)."""
    try:
        pairs = _shard_samples(kind, shard)
    except DatasetError as e:
        report.problems.append(Problem(e.where or shard, e.problem))
        return 0, None
    labels: list[int] = []
    for position, (sample, image) in enumerate(pairs):
        where = f"{shard}#{position}"
        report.problems += box_problems(sample, where, category_ids)
        problem = image_problem(image, sample, max_pixels)
        report.problems += [Problem(f"{where} (image {sample.image_id})", problem)] if problem else []
        labels += sample.labels.tolist()
    report.checked += len(pairs)
    return len(pairs), (min(labels), max(labels)) if labels else None


def verify_shards(location, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Report:
    """Check detection shards (a folder, glob or list; local or remote) and the manifest beside them."""
    if remote_urls.is_remote(str(location)):
        kind, infos = classify_remote(location)
        shards, sizes = [o.url for o in infos], [o.size for o in infos]
    else:
        kind, shards = classify(location)
        sizes = [os.path.getsize(s) for s in shards]
    report = Report(str(location), f"{kind} detection shards")
    path = manifest.path_beside(shards[0])
    found = manifest.read(path)
    category_ids = {int(c["id"]) for c in found["categories"]} if found and found.get("categories") else None
    counts, ranges = [], {}
    for shard in shards:
        count, labels = _check_shard(report, kind, shard, category_ids, max_pixels)
        counts.append(count)
        if labels:
            ranges[shard] = labels
    if found is not None:
        complete = isinstance(location, (str, os.PathLike)) and not os.path.isfile(str(location))
        report.problems += [Problem(e.where, e.problem) for e in
                            manifest.problems(found, path, shards, sizes, counts, complete,
                                              manifest.name_pattern(str(location)))]
        report.problems += [Problem(e.where, e.problem) for e in manifest.label_problems(found, path, ranges, 0)]
    return report


def verify_detection(location, *, images: str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> Report:
    """verify_coco for a .json (images: its image folder), else verify_shards."""
    if is_coco_json(location):
        if images is None:
            raise DatasetError(str(location), "a COCO JSON is checked with its image folder",
                               "Pass --images FOLDER (images=)")
        return verify_coco(str(location), images, max_pixels=max_pixels)
    return verify_shards(location, max_pixels=max_pixels)
