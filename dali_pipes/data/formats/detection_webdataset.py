"""Detection WebDataset shards: `<key>.jpg` (or .png, ...) and `<key>.json` per sample, written and read as
DetectionSamples.

The JSON member holds the image's annotations in pixels, as the DetectionSample has them:
    {"image_id": 7, "width": 32, "height": 24, "file_name": "a.jpg",
     "boxes": [[x0, y0, x1, y1], ...], "labels": [1, ...], "annotation_ids": [100, ...],
     "iscrowd": [0, ...], "area": [44.5, ...]}
("annotation_ids", "iscrowd", "area" and "file_name" may be left out; "boxes" are xyxy pixels, "labels" the
dataset's category ids). Tar members, grouping and DALI's index are webdataset.py's.
"""

from __future__ import annotations

import json
import tarfile
from typing import Iterable

from dali_pipes.data.detection import DetectionSample, detection_sample
from dali_pipes.data.formats.webdataset import (
    IMAGE_EXTS,
    Member,
    add_member,
    build_tar_index,
    group_samples,
    read_member,
    scan_members,
    write_tar_index,
)
from dali_pipes.errors import DatasetError
from dali_pipes.storage import transfer
from dali_pipes.storage.files import atomic_write
from dali_pipes.storage.remote_urls import ObjectInfo

JSON_EXT = "json"
REQUIRED = ("image_id", "width", "height", "boxes", "labels")
FIX = "Re-create the shard (dali-pipes convert webdataset ANNOTATIONS.json OUT --images FOLDER)"


def annotation_json(sample: DetectionSample) -> bytes:
    """The JSON member of one sample."""
    return json.dumps({
        "image_id": sample.image_id, "width": sample.width, "height": sample.height,
        "file_name": sample.path.replace("\\", "/").rsplit("/", 1)[-1],
        "boxes": sample.boxes.tolist(), "labels": sample.labels.tolist(),
        "annotation_ids": sample.annotation_ids.tolist(), "iscrowd": sample.iscrowd.tolist(),
        "area": sample.area.tolist()}, separators=(",", ":")).encode()


def write_shard(path: str, items: Iterable[tuple[str, DetectionSample, bytes, str]]) -> int:
    """Write (key, sample, image bytes, image extension) as one tar shard (atomically) and its DALI index beside
    it (PATH.idx); keys must be unique in the shard and hold no dot. Returns the number of samples."""
    count = 0
    with atomic_write(path) as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for key, sample, image, ext in items:
                add_member(tar, f"{key}.{ext}", image)
                add_member(tar, f"{key}.{JSON_EXT}", annotation_json(sample))
                count += 1
    write_tar_index(build_tar_index(path, JSON_EXT), path + ".idx")
    return count


def decode_sample(shard: str, key: str, text: bytes, image: Member) -> DetectionSample:
    """The DetectionSample of one JSON member (path: the shard; extra: the image member's (offset, size))."""
    where = f"{shard}#{key}"
    try:
        entry = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise DatasetError(where, f"malformed .{JSON_EXT} member ({e})", FIX) from None
    missing = [k for k in REQUIRED if k not in entry] if isinstance(entry, dict) else list(REQUIRED)
    if missing:
        raise DatasetError(where, f".{JSON_EXT} member lacks {', '.join(missing)}", FIX)
    try:
        return detection_sample(shard, entry["image_id"], entry["width"], entry["height"], entry["boxes"],
                                entry["labels"], entry.get("annotation_ids"), entry.get("iscrowd"),
                                entry.get("area"), extra=(image.offset, image.size))
    except (ValueError, TypeError) as e:
        raise DatasetError(where, f".{JSON_EXT} member does not describe boxes ({e})", FIX) from None


def _parts(shard: str, members: list[Member]) -> tuple[str, Member, Member]:
    by_ext = {m.key_ext[1]: m for m in members}
    key = members[0].key_ext[0]
    image = next((by_ext[e] for e in IMAGE_EXTS if e in by_ext), None)
    if image is None or JSON_EXT not in by_ext:
        raise DatasetError(f"{shard}#{key}", f"sample without an image or a .{JSON_EXT} member "
                           f"(members: {', '.join(sorted(by_ext))})", FIX)
    return key, image, by_ext[JSON_EXT]


def read_shard(shard: str) -> list[DetectionSample]:
    """Every sample of one local or remote shard, in order; DatasetError naming shard#key where a sample
    lacks its image or its JSON, or the JSON is not one of boxes."""
    with transfer.local_copy(shard) as local, open(local, "rb") as f:
        samples = []
        for members in group_samples(scan_members(local)):
            key, image, text = _parts(shard, members)
            samples.append(decode_sample(shard, key, read_member(f, text), image))
    return samples


def read_shards(shards: Iterable[str]) -> list[DetectionSample]:
    """Every sample of `shards`, in order."""
    return [sample for shard in shards for sample in read_shard(shard)]


def image_bytes(sample: DetectionSample, listed: ObjectInfo | None = None) -> bytes:
    """The encoded image of a sample read_shards gave (one ranged read of its member; of `listed`, the shard's
    ObjectInfo where it was listed, without a HEAD first)."""
    offset, size = sample.extra
    return transfer.read_range(listed or sample.path, offset, size)


def is_detection_sample(members: list[Member]) -> bool:
    """Do these members (one sample's) hold a JSON member and no .cls label (a detection sample)?"""
    exts = {m.key_ext[1] for m in members}
    return JSON_EXT in exts and "cls" not in exts
