"""Locations: what a path, glob or list names, before anything is read.

`classify(location)` tells an image folder, a file list, TFRecord shards and WebDataset tar shards
apart, given as a folder, a glob ("train-*-of-*"), a Python list of paths, or a text file of paths.
It returns the kind and the shard paths (folders and file lists are listed by their format module).
"""

from __future__ import annotations

import glob
import os
from typing import Sequence

from dali_pipes.errors import DatasetError
from dali_pipes.formats import tfrecord
from dali_pipes.formats.image_files import looks_like_file_list_line

NOT_SHARDS = (".idx", ".json", ".txt", ".md", ".csv", ".tmp")  # files that sit beside shards

Location = str | os.PathLike | Sequence[str]


def describe(location: Location) -> str:
    return str(location) if isinstance(location, (str, os.PathLike)) else f"{len(location)} paths"


def classify(location: Location) -> tuple[str, list[str]]:
    """(kind, shard paths) for a location; folders and file lists get [] (their format lists them)."""
    if not isinstance(location, (str, os.PathLike)):
        return _classify_list([str(p) for p in location], describe(location))
    location = str(location)
    if glob.has_magic(location) and not os.path.exists(location):
        shards = sorted(p for p in glob.glob(location) if os.path.isfile(p) and not p.endswith(NOT_SHARDS))
        if not shards:
            raise FileNotFoundError(f"{location}: no files match this pattern")
        return shard_kind(shards, location), shards
    if not os.path.exists(location):
        raise FileNotFoundError(f"{location}: no such file or directory")
    if os.path.isdir(location):
        return _classify_folder(location)
    if location.endswith(".tar") or tfrecord.looks_like_tfrecord(location):
        return shard_kind([location], location), [location]
    return _classify_text_list(location)


def _classify_list(shards: list[str], where: str) -> tuple[str, list[str]]:
    if not shards:
        raise DatasetError("an empty list of shards was given")
    for path in shards:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such shard file")
    return shard_kind(shards, where), shards


def _classify_folder(location: str) -> tuple[str, list[str]]:
    entries = [e for e in sorted(os.scandir(location), key=lambda e: e.name) if not e.name.startswith(".")]
    files = [e.path for e in entries if e.is_file() and not e.name.endswith(NOT_SHARDS)]
    if any(p.endswith(".tar") or tfrecord.looks_like_tfrecord(p) for p in files):
        return shard_kind(files, location), files
    if any(e.is_dir() for e in entries):
        return "folder", []
    if files:
        return shard_kind(files, location), files  # raises: names a file that is no shard
    raise DatasetError(location, f"empty folder; expected {location}/<class name>/<image>.jpg, "
                       f"TFRecord shards or .tar shards")


def shard_kind(shards: list[str], where: str) -> str:
    """"tfrecord" or "webdataset" for a list of shard files, or a DatasetError naming the odd one."""
    if all(p.endswith(".tar") for p in shards):
        return "webdataset"
    not_records = [p for p in shards if not p.endswith(".tar") and not tfrecord.looks_like_tfrecord(p)]
    if not_records:
        raise DatasetError(not_records[0], f"neither a TFRecord shard nor a .tar shard ({len(not_records)} such "
                           f"files in {where})",
                           "Point at a folder that holds only shards, or at a glob such as 'train-*-of-*'")
    if any(p.endswith(".tar") for p in shards):
        raise DatasetError(where, "holds both TFRecord and .tar shards", "Point at one kind (e.g. a glob)")
    return "tfrecord"


def _classify_text_list(path: str) -> tuple[str, list[str]]:
    """A text file: either a list of shards (one path per line) or a file list (path label)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"\0" in head:
        raise DatasetError(path, "not a recognised dataset (not a TFRecord, .tar, folder or text list)")
    with open(path) as f:
        lines = [l for l in f.read().splitlines() if l.strip() and not l.startswith("#")]
    if not lines:
        raise DatasetError(path, "empty list file")
    if looks_like_file_list_line(lines[0]):
        return "file_list", []
    base = os.path.dirname(os.path.abspath(path))
    shards = [os.path.join(base, l.strip()) for l in lines]
    for shard in shards:
        if not os.path.isfile(shard):
            raise FileNotFoundError(f"{shard}: listed in {path} but no such file")
    return shard_kind(shards, path), shards
