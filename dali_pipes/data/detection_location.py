"""Detection data by location: a COCO JSON with its image folder, or detection shards (`dali-pipes convert`'s,
with a manifest.json that says "task": "detection"), local or in any supported store, read as DetectionSamples
with the one function that gives each sample's encoded image.

The formats' own readers do the reading (formats/coco.py, detection_tfrecord.py, detection_webdataset.py); here:
telling a detection location from a classification one (by the manifest beside the shards: one small read), the
manifest's checks (a shard missing or not listed, of another size or count), and the image reads: a local file, a
whole object (COCO images in a store), or one ranged read of the record or tar member (shards), each remote call
under the store's retries and deadline (storage/remote.py), with the loader's options where it gave them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

from dali_pipes.data import manifest
from dali_pipes.data.detection import DetectionSample
from dali_pipes.data.formats import coco, detection_tfrecord, detection_webdataset
from dali_pipes.data.location import Location, classify, classify_remote, describe
from dali_pipes.errors import DatasetError
from dali_pipes.storage import remote, remote_urls, transfer
from dali_pipes.storage.remote_urls import ObjectInfo

DETECTION_TASK = "detection"  # a conversion manifest's "task" for detection shards (tools/convert_detection.py)
SHARD_EXTENSIONS = (".tfrecord", ".tar", ".tfrec", ".record")
CONVERT_FIX = ("Convert a COCO JSON to detection shards with `dali-pipes convert tfrecord|webdataset "
               "ANNOTATIONS.json OUT --images FOLDER`, or give the COCO JSON itself with images=FOLDER")


@dataclass(frozen=True)
class DetectionSet:
    """A detection location opened: its samples (COCO: ascending image id; shards: in shard order), the format
    ("coco", "tfrecord" or "webdataset"), the location as messages name it, and the listed shards of a store
    (their ObjectInfo, so an image is one ranged read pinned to the version listed)."""
    samples: list[DetectionSample]
    kind: str
    where: str
    objects: dict[str, ObjectInfo] = field(default_factory=dict)
    options: remote.ClientOptions | None = None  # the loader's retries, timeout and deadline for the image reads

    def image_bytes(self, sample: DetectionSample) -> bytes:
        """The encoded image of `sample` (OSError or DatasetError naming it where it cannot be read)."""
        with remote.options_in_force(self.options):  # DALI's feed thread has no loader options of its own
            if self.kind == "coco":
                return transfer.read_bytes(sample.path) if remote_urls.is_remote(sample.path) else \
                    _read_local(sample.path)
            reader = detection_tfrecord if self.kind == "tfrecord" else detection_webdataset
            return reader.image_bytes(sample, self.objects.get(sample.path))


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def is_coco_json(location: object) -> bool:
    """A COCO JSON by its name (a presigned URL's query string is not part of it)."""
    return isinstance(location, (str, os.PathLike)) and remote_urls.identity(str(location)).lower().endswith(".json")


def manifest_path_of(location: Location) -> str:
    """Where a location's manifest.json would be: in the folder or prefix itself, else beside its (first) shard
    or glob."""
    first = str(location) if isinstance(location, (str, os.PathLike)) else str(list(location)[0])
    if remote_urls.is_remote(first):
        named = remote_urls.identity(first)
        is_folder = named.endswith("/") or not (named.lower().endswith(SHARD_EXTENSIONS) or "*" in named)
        return remote_urls.join(named.rstrip("/") + "/", manifest.MANIFEST_NAME) if is_folder \
            else manifest.path_beside(named)
    if os.path.isdir(first):
        return os.path.join(first, manifest.MANIFEST_NAME)
    return manifest.path_beside(first)


def location_task(location: Location) -> tuple[str, str | None]:
    """(the manifest's path, its "task": "detection", "classification" for a manifest without one, None without
    a manifest). A COCO JSON is ("the file", "detection")."""
    if is_coco_json(location):
        return remote_urls.identity(str(location)), DETECTION_TASK
    if isinstance(location, (list, tuple)) and not location:
        return "an empty list", None
    path = manifest_path_of(location)
    try:
        found = manifest.read(path)
    except (PermissionError, IsADirectoryError, NotADirectoryError, DatasetError):
        return path, None  # no manifest to read there: the classification reader names what is wrong
    # an unreachable store goes on as it is (storage/remote.py names the endpoint, after the loader's attempts)
    return path, None if found is None else str(found.get("task", "classification"))


def is_detection_location(location: object) -> bool:
    """A COCO JSON, or shards whose manifest says "task": "detection" (one small read: local, or one GET)."""
    if not isinstance(location, (str, os.PathLike, list, tuple)):
        return False
    return location_task(location)[1] == DETECTION_TASK


def open_detection_location(location: Location, images: str | None = None, *, keep_empty: bool = True,
                            options: remote.ClientOptions | None = None) -> DetectionSet:
    """The DetectionSet of a COCO JSON (`images`: its image folder or store prefix) or of detection shards.
    keep_empty: keep images without boxes. Raises DatasetError naming the file and the fix: a classification
    set, a JSON without images=, a missing image, a shard the manifest does not list, ..."""
    with remote.options_in_force(options):
        if is_coco_json(location):
            if images is None:
                raise DatasetError(remote_urls.identity(str(location)), "a COCO JSON is read with its image folder",
                                   "Pass images=FOLDER (the folder or store prefix its file_names are relative to)")
            samples = coco.read_coco(str(location), str(images), keep_empty=keep_empty)
            found = DetectionSet(samples, "coco", remote_urls.identity(str(location)), options=options)
        else:
            found = _open_shards(location, options)
    if images is not None and found.kind != "coco":
        raise DatasetError(found.where, "images= is for a COCO JSON; detection shards hold their images",
                           "Leave images= out")
    if not keep_empty:
        found = DetectionSet([s for s in found.samples if len(s.labels)], found.kind, found.where, found.objects,
                             options)
    if not found.samples:
        raise DatasetError(found.where, "no images to read" + ("" if keep_empty else " with boxes"),
                           "Check the location (and that its images have annotations)")
    return found


def _open_shards(location: Location, options: remote.ClientOptions | None) -> DetectionSet:
    path, task = location_task(location)
    where = describe(location)
    if task != DETECTION_TASK:
        found = f"its manifest {path} says task {task!r}" if task else f"no conversion manifest at {path}"
        raise DatasetError(where, f"not detection shards ({found})", CONVERT_FIX)
    objects: dict[str, ObjectInfo] = {}
    if remote_urls.is_remote(str(location) if isinstance(location, (str, os.PathLike)) else str(location[0])):
        kind, infos = classify_remote(location)
        objects = {info.url: info for info in infos}
        shards, sizes = list(objects), [info.size for info in infos]
    else:
        kind, shards = classify(location)
        sizes = [os.path.getsize(s) for s in shards]
    if kind not in ("tfrecord", "webdataset"):
        raise DatasetError(where, f"{kind} data beside a detection manifest ({path})", CONVERT_FIX)
    samples = _read_shards(kind, shards)
    counts = _counts(samples, shards)
    named = str(location) if isinstance(location, (str, os.PathLike)) else ""
    searched = bool(named) and ("*" in named or not named.lower().endswith(SHARD_EXTENSIONS))  # not named one by one
    manifest.check(manifest.read(path) or {}, path, shards, sizes, counts, searched,
                   manifest.name_pattern(named) if named else "*")
    return DetectionSet(samples, kind, where, objects, options)


def _read_shards(kind: str, shards: Sequence[str]) -> list[DetectionSample]:
    reader = detection_tfrecord if kind == "tfrecord" else detection_webdataset
    return reader.read_shards(shards)


def _counts(samples: Sequence[DetectionSample], shards: Sequence[str]) -> list[int]:
    per_shard = dict.fromkeys(shards, 0)
    for sample in samples:
        per_shard[sample.path] += 1
    return list(per_shard.values())
