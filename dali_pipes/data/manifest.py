"""The manifest a conversion writes last: `manifest.json` beside the shards, naming every shard with its
size, its sample count, its range of labels and the box around its images (width, height), and the classes.

`convert` writes it after every shard, index and classes.json (and, to s3://, uploads it after them), so
a conversion cut short leaves none (the STEM-NNNNN-of-MMMMM check still applies then). `open_source` and
`verify` check it when present: a shard it lists that is missing, of another size or with another sample
count is refused, naming the shard and the manifest; so is a shard it does not list found beside those it
lists (another conversion's, into the same folder), a sample total other than its own, and a classes.json
whose classes differ from its. `verify` also compares each shard's range of labels with the one it lists.
It is a `.json` file: no reader takes it for a shard.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath

from dali_pipes.errors import DatasetError
from dali_pipes.storage import remote_urls, transfer
from dali_pipes.storage.files import atomic_write

MANIFEST_NAME = "manifest.json"
FORMAT = "dali_pipes manifest"
VERSION = 1
STALE_FIX = "Remove the files of the other conversion, or convert again with --overwrite (overwrite=True)"


class SetError(DatasetError):
    """A shard set that is not the manifest's: a shard it lists missing, or one it does not list found.
    The whole set is wrong, not a sample: skip_bad never turns it into a warning."""


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
    # keys beyond build's (a detection set's task and categories) are the new conversion's
    return {**new, **build(new["kind"], new["classes"], sorted(kept + new["shards"], key=lambda s: s["name"]))}


def write(folder: str, manifest: dict) -> str:
    """Write `folder`/manifest.json atomically; returns its path."""
    path = os.path.join(folder, MANIFEST_NAME)
    with atomic_write(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def path_beside(shard: str) -> str:
    """The manifest's path (or s3:// URL) in the folder of `shard`."""
    if remote_urls.is_remote(shard):
        return remote_urls.join(remote_urls.dirname(shard), MANIFEST_NAME)
    return os.path.join(os.path.dirname(os.path.abspath(shard)), MANIFEST_NAME)


def classes_path(manifest_path: str) -> str:
    """The classes.json beside a manifest (local or s3://)."""
    return manifest_path[:len(manifest_path) - len(MANIFEST_NAME)] + "classes.json"


def read(path: str) -> dict | None:
    """The manifest at `path` (local or s3://), or None where there is none."""
    try:
        if remote_urls.is_remote(path):
            text = transfer.read_bytes(path).decode()
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
    return posixpath.basename(name) if remote_urls.is_remote(name) else os.path.basename(name)


def problems(manifest: dict, manifest_path: str, shards: list[str], sizes: list[int],
             counts: list[int] | None, complete: bool, pattern: str = "*") -> list[DatasetError]:
    """What is wrong with `shards` (their sizes, and sample counts where known) by the manifest. When
    `complete` (found through a folder, prefix or glob; of a glob, the listed names that match its last part,
    `pattern`): a listed shard missing, a shard it does not list (SetError), and, once nothing else is wrong,
    a sample total other than the manifest's. Always: a listed shard of another size or count. A set it shares
    no shard with is not its business (an explicit list of other shards beside it)."""
    listed = {s["name"]: s for s in manifest.get("shards", [])}
    found = {_base(shard): i for i, shard in enumerate(shards)}
    if not set(found) & set(listed):
        return []
    out = _set_problems(manifest, manifest_path, shards, found, listed, counts, pattern) if complete else []
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
    if not out and complete and pattern == "*" and counts is not None and sum(counts) != manifest.get("samples"):
        out.append(DatasetError(_folder(shards[0]).rstrip("/"), f"{sum(counts)} samples in its {len(shards)} "
                                f"shards, but {manifest_path} lists {manifest.get('samples')} in all", "Convert again"))
    return out


def _folder(shard: str) -> str:
    """The folder or s3:// prefix of a shard, with its trailing separator."""
    return shard[:len(shard) - len(_base(shard))]


def _set_problems(manifest: dict, manifest_path: str, shards: list[str], found: dict[str, int], listed: dict,
                  counts: list[int] | None, pattern: str) -> list[DatasetError]:
    """Listed shards (matching `pattern`) missing, then shards found that the manifest does not list."""
    folder = _folder(shards[0])
    out: list[DatasetError] = [
        SetError(folder + name, f"missing: {manifest_path} lists it ({entry['bytes']} bytes, {entry['samples']} "
                 f"samples), as after a copy or an upload cut short", "Copy it again, or convert again")
        for name, entry in listed.items() if name not in found and fnmatch.fnmatchcase(name, pattern)]
    unlisted = [name for name in found if name not in listed]
    held = f" ({sum(counts)} samples)" if counts is not None else ""
    for name in unlisted:
        out.append(SetError(shards[found[name]], f"not listed in {manifest_path} ({len(listed)} shards, "
                            f"{manifest.get('samples')} samples), but found with its shards: {len(found)} shards"
                            f"{held}, {len(unlisted)} unlisted, as when two conversions write one folder",
                            STALE_FIX))
    return out


def classes_problem(manifest: dict, manifest_path: str, classes_path: str,
                    classes: list[str] | None) -> DatasetError | None:
    """classes.json's classes against the manifest's, when both name them: a difference is a stale file."""
    listed = manifest.get("classes")
    if classes is None or listed is None or list(classes) == list(listed):
        return None
    return DatasetError(classes_path, f"lists {len(classes)} classes ({_first(classes)}), but {manifest_path} lists "
                        f"{len(listed)} ({_first(listed)})", "One of them is stale: convert again")


def _first(names: list[str], n: int = 3) -> str:
    return ", ".join(map(str, names[:n])) + (", ..." if len(names) > n else "")


def label_problems(manifest: dict, manifest_path: str, ranges: dict[str, tuple[int, int]],
                   offset: int = 0) -> list[DatasetError]:
    """Each shard's (lowest, highest) label as read, after `offset`, against the range the manifest lists."""
    listed = {s["name"]: s for s in manifest.get("shards", [])}
    out = []
    for shard, (low, high) in ranges.items():
        entry = listed.get(_base(shard))
        if entry is None or not entry.get("labels"):
            continue
        want = [entry["labels"][0] - offset, entry["labels"][1] - offset]
        if [low, high] != want:
            out.append(DatasetError(shard, f"labels {low} .. {high}, but {manifest_path} lists {want[0]} .. {want[1]}"
                                    + (f" (after label offset {offset})" if offset else ""),
                                    "Convert again, or check --label-offset"))
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


def largest_image(manifest: dict, shards: list[str]) -> tuple[int, int] | None:
    """(width, height) of the box around every image of `shards`, when the manifest lists it for each of them
    (convert writes "largest" per shard after 0.3.0; older manifests have none), else None."""
    listed = {s["name"]: s for s in manifest.get("shards", [])}
    boxes: list[list[int]] = [listed[_base(s)].get("largest") or [] if _base(s) in listed else [] for s in shards]
    if not boxes or any(len(box) != 2 for box in boxes):
        return None
    return max(box[0] for box in boxes), max(box[1] for box in boxes)


def name_pattern(location: str) -> str:
    """The names a folder, prefix or glob location finds, for `problems`: its last part if it is a glob."""
    last = location.rstrip("/").rsplit("/", 1)[-1]
    return last if location and not location.endswith("/") and any(c in last for c in "*?[") else "*"
