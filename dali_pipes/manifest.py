"""The manifest a conversion writes last: `manifest.json` beside the shards, naming every shard with its
size, its sample count and its range of labels, and the classes.

`convert` writes it after every shard, index and classes.json (and, to s3://, uploads it after them), so
a conversion cut short leaves none (the STEM-NNNNN-of-MMMMM check still applies then). `open_source` and
`verify` check it when present: a shard it lists that is missing, of another size or with another sample
count is refused, naming the shard and the manifest. It is a `.json` file: no reader takes it for a shard.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath

from dali_pipes import object_store
from dali_pipes.errors import DatasetError
from dali_pipes.files import atomic_write

MANIFEST_NAME = "manifest.json"
FORMAT = "dali_pipes manifest"
VERSION = 1


def build(kind: str, classes: list[str] | None, shards: list[dict]) -> dict:
    """A manifest for shards given as {"name", "bytes", "samples", "labels": [lowest, highest]}."""
    return {"format": FORMAT, "version": VERSION, "kind": kind, "classes": classes,
            "samples": sum(s["samples"] for s in shards), "shards": shards}


def merged(previous: dict | None, new: dict, prefix: str) -> dict:
    """`new`, keeping the shards of other prefixes that a manifest already in the folder lists (two
    conversions, train and val, into one folder); shards of this prefix are replaced."""
    if not previous or previous.get("format") != FORMAT:
        return new
    kept = [s for s in previous.get("shards", []) if not s["name"].startswith(f"{prefix}-")]
    return build(new["kind"], new["classes"], sorted(kept + new["shards"], key=lambda s: s["name"]))


def write(folder: str, manifest: dict) -> str:
    """Write `folder`/manifest.json atomically; returns its path."""
    path = os.path.join(folder, MANIFEST_NAME)
    with atomic_write(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def path_beside(shard: str) -> str:
    """The manifest's path (or s3:// URL) in the folder of `shard`."""
    if object_store.is_remote(shard):
        return object_store.join(object_store.dirname(shard), MANIFEST_NAME)
    return os.path.join(os.path.dirname(os.path.abspath(shard)), MANIFEST_NAME)


def read(path: str) -> dict | None:
    """The manifest at `path` (local or s3://), or None where there is none."""
    try:
        if object_store.is_remote(path):
            text = object_store.read_bytes(path).decode()
        else:
            with open(path) as f:
                text = f.read()
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise DatasetError(path, f"not a readable manifest ({e})", "Convert again, or remove it") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None  # someone else's manifest.json: not ours to check
    return manifest


def _base(name: str) -> str:
    return posixpath.basename(name) if object_store.is_remote(name) else os.path.basename(name)


def problems(manifest: dict, manifest_path: str, shards: list[str], sizes: list[int],
             counts: list[int] | None, complete: bool, pattern: str = "*") -> list[DatasetError]:
    """What is wrong with `shards` (their sizes, and sample counts where known) by the manifest: a listed
    shard missing (only when `complete`: found through a folder, prefix or glob; of a glob, the listed
    names that match its last part, `pattern`), of another size, or of another count. Shards the manifest
    does not list are not its business; nor is a set it shares none with."""
    listed = {s["name"]: s for s in manifest.get("shards", [])}
    found = {_base(shard): i for i, shard in enumerate(shards)}
    if not set(found) & set(listed):
        return []
    out = []
    folder = shards[0][:len(shards[0]) - len(_base(shards[0]))]
    if complete:
        out += [DatasetError(folder + name, f"missing: {manifest_path} lists it ({entry['bytes']} bytes, "
                             f"{entry['samples']} samples), as after a copy or an upload cut short",
                             "Copy it again, or convert again") for name, entry in listed.items()
                if name not in found and fnmatch.fnmatchcase(name, pattern)]
    for name, i in found.items():
        entry = listed.get(name)
        if entry is None:
            continue
        if sizes[i] != entry["bytes"]:
            out.append(DatasetError(shards[i], f"{sizes[i]} bytes, but {manifest_path} lists {entry['bytes']}",
                                    "Copy it again, or convert again"))
        elif counts is not None and counts[i] != entry["samples"]:
            out.append(DatasetError(shards[i], f"{counts[i]} samples, but {manifest_path} lists {entry['samples']}",
                                    "Copy it again, or convert again"))
    return out


def check(manifest: dict, manifest_path: str, shards: list[str], sizes: list[int], counts: list[int] | None,
          complete: bool, pattern: str = "*") -> None:
    """Raise the first of `problems`, counting the rest."""
    found = problems(manifest, manifest_path, shards, sizes, counts, complete, pattern)
    if found:
        first = found[0]
        more = f" ({len(found) - 1} more problems by the manifest)" if len(found) > 1 else ""
        raise DatasetError(first.where, first.problem + more, first.fix)


def label_range(manifest: dict, shards: list[str]) -> tuple[int, int] | None:
    """(lowest, highest) stored label of the listed `shards`, or None where the manifest does not say."""
    listed = {s["name"]: s for s in manifest.get("shards", [])}
    ranges = [listed[_base(s)].get("labels") for s in shards if _base(s) in listed]
    ranges = [r for r in ranges if r]
    if not ranges:
        return None
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def name_pattern(location: str) -> str:
    """The names a folder, prefix or glob location finds, for `problems`: its last part if it is a glob."""
    last = location.rstrip("/").rsplit("/", 1)[-1]
    return last if location and not location.endswith("/") and any(c in last for c in "*?[") else "*"
