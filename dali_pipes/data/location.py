"""Locations: what a path, glob or list names, before anything is read.

`classify(location)` tells an image folder, a file list, TFRecord shards and WebDataset tar shards
apart, given as a folder, a glob ("train-*-of-*"), a Python list of paths, or a text file of paths.
It returns the kind and the shard paths (folders and file lists are listed by their format module).

Remote locations (s3://, gs://, az://, hf://, http(s)://: remote_urls.is_remote) are classified the same way
from a listing: a prefix or a glob is listed, a list of URLs is checked with HEADs, and a shard's kind is
told by its extension or by its first 12 bytes (one ranged read). http(s) servers are never listed: a URL
names one shard or one text list. `classify_remote` also returns the
ObjectInfo of every shard, which the source keeps (indexes and the shard cache are keyed by it).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Sequence

from dali_pipes.data.formats import SNIFF_BYTES, UNNAMED_SHARD_KIND, not_a_shard, shard_kind_by_name, shard_kind_of
from dali_pipes.data.formats.image_files import IMAGE_EXTENSIONS, looks_like_file_list_line
from dali_pipes.errors import DatasetError
from dali_pipes.storage import remote, remote_urls, transfer
from dali_pipes.storage.files import remove_stale_temps
from dali_pipes.storage.remote_urls import ObjectInfo

NOT_SHARDS = (".idx", ".json", ".txt", ".md", ".csv", ".tmp")  # files that sit beside shards

Location = str | os.PathLike | Sequence[str]
# TensorFlow's and our converters' shard names: STEM-NNNNN-of-MMMMM[.ext]. Such a set is complete or refused.
_NUMBERED = re.compile(r"^(?P<stem>.+)-(?P<index>\d+)-of-(?P<total>\d+)(?P<ext>(\.[A-Za-z0-9]+)*)$")


def check_complete(names: Sequence[str], where: str) -> None:
    """Raise DatasetError when shards named STEM-NNNNN-of-MMMMM miss some of the M (a copy or conversion cut
    short): found by a folder, prefix or glob, they must all be there. An explicit list reads what it names."""
    sets: dict[tuple, list[int]] = {}
    for name in names:
        found = _NUMBERED.match(os.path.basename(name.rstrip("/")))
        if found:
            key = (os.path.dirname(name), found["stem"], found["total"], found["ext"])
            sets.setdefault(key, []).append(int(found["index"]))
    for (_folder, stem, total, ext), indices in sorted(sets.items()):
        missing = sorted(set(range(int(total))) - set(indices))
        if missing:
            first = f"{stem}-{missing[0]:0{len(total)}d}-of-{total}{ext}"
            raise DatasetError(where, f"{len(missing)} of {int(total)} shards {stem}-*-of-{total}{ext} are missing "
                               f"(first: {first}), as after a copy or a conversion cut short",
                               "Complete the set, or pass the shards to read as an explicit list")


def check_one_set(names: Sequence[str], where: str) -> None:
    """Raise DatasetError when a folder or prefix holds numbered sets of several stems (train-* and val-*, as
    convert writes them into one output folder): read together they would be one dataset of both splits."""
    sets: dict[str, int] = {}
    for name in names:
        found = _NUMBERED.match(os.path.basename(name.rstrip("/")))
        if found:
            label = f"{found['stem']}-*-of-{found['total']}{found['ext']}"
            sets[label] = sets.get(label, 0) + 1
    stems = sorted({label.split("-*-of-")[0] for label in sets})
    if len(stems) > 1:
        listed = ", ".join(f"{label} ({count} shards)" for label, count in sorted(sets.items()))
        raise DatasetError(where, f"holds {len(sets)} numbered shard sets ({listed}), which would be read as one "
                           f"dataset", f"Point at one set with a glob: {where.rstrip('/')}/{stems[0]}-*-of-*")


def check_no_images_beside_shards(images: Sequence[str], where: str) -> None:
    """Raise DatasetError when a folder or prefix that holds shards also holds images (class folders or image
    files): the shards alone would be read and the images left out without a word."""
    if images:
        named = ", ".join(images[:3]) + (", ..." if len(images) > 3 else "")
        raise DatasetError(where, f"holds both shard files and images ({named}), so it is neither a shard folder "
                           f"nor an image folder",
                           "Keep shards and images in separate folders, or point at the shards with a glob such as "
                           f"{where.rstrip('/')}/train-*-of-*")


def _image_entries(entries: list[os.DirEntry]) -> list[str]:
    """Names of the image files, and of the folders that hold image files (first level), among `entries`."""
    def holds_images(folder: str) -> bool:
        with os.scandir(folder) as inside:
            return any(e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS) for e in inside)
    return [e.name + ("/" if e.is_dir() else "") for e in entries
            if (e.is_dir() and holds_images(e.path)) or (e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS))]


def describe(location: Location) -> str:
    return str(location) if isinstance(location, (str, os.PathLike)) else f"{len(location)} paths"


def is_remote(location: Location) -> bool:
    """True for a remote URL (s3://, gs://, ...), or a list whose entries are URLs of one scheme."""
    if isinstance(location, (str, os.PathLike)):
        return remote_urls.is_remote(str(location))
    items = [str(p) for p in location]
    schemes = {remote_urls.scheme_of(p) for p in items}
    if len(schemes) > 1:
        named = sorted(f"{s}://" if s else "local paths" for s in schemes)
        raise DatasetError(describe(location), f"mixes {' and '.join(named)}", "Give paths of one kind")
    return bool(items) and None not in schemes


def classify(location: Location) -> tuple[str, list[str]]:
    """(kind, shard paths) for a location; folders and file lists get [] (their format lists them)."""
    if not isinstance(location, (str, os.PathLike)):
        return _classify_list([str(p) for p in location], describe(location))
    location = str(location)
    if glob.has_magic(location) and not os.path.exists(location):
        remove_stale_temps(os.path.dirname(location) if not glob.has_magic(os.path.dirname(location)) else "")
        shards = sorted(p for p in glob.glob(location) if os.path.isfile(p) and not p.endswith(NOT_SHARDS))
        if not shards:
            raise FileNotFoundError(f"{location}: no files match this pattern")
        check_complete(shards, location)
        return shard_kind(shards, location), shards
    if not os.path.exists(location):
        raise FileNotFoundError(f"{location}: no such file or directory")
    if os.path.isdir(location):
        return _classify_folder(location)
    if local_shard_kind(location):
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
    remove_stale_temps(location)  # a write that died here (a full disk, a kill) leaves no litter for good
    entries = [e for e in sorted(os.scandir(location), key=lambda e: e.name) if not e.name.startswith(".")]
    files = [e.path for e in entries if e.is_file() and not e.name.endswith(NOT_SHARDS)]
    if any(local_shard_kind(p) for p in files):
        check_no_images_beside_shards(_image_entries(entries), location)
        check_one_set(files, location)
        check_complete(files, location)
        return shard_kind(files, location), files
    if any(e.is_dir() for e in entries):
        return "folder", []
    if files:
        return shard_kind(files, location), files  # raises: names a file that is no shard
    raise DatasetError(location, f"empty folder; expected {location}/<class name>/<image>.jpg, "
                       f"TFRecord shards or .tar shards")


def local_shard_kind(path: str) -> str | None:
    """The format of a local shard file (by name, else by its first bytes), or None."""
    def head() -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read(SNIFF_BYTES)
        except OSError:
            return b""
    return shard_kind_of(path, head)


def shard_kind(shards: list[str], where: str) -> str:
    """The one format of a list of shard files, or a DatasetError naming the odd one."""
    return _one_kind([(p, local_shard_kind(p)) for p in shards], where, "folder")


def _one_kind(kinds: list[tuple[str, str | None]], where: str, container: str) -> str:
    odd = [name for name, kind in kinds if kind is None]
    if odd:
        raise DatasetError(odd[0], f"{not_a_shard()} ({len(odd)} such files in {where})",
                           f"Point at a {container} that holds only shards, or at a glob such as 'train-*-of-*'")
    found = sorted({kind for _, kind in kinds if kind is not None})  # none is, by now
    if len(found) > 1:
        raise DatasetError(where, f"holds shards of several formats ({', '.join(found)})",
                           "Point at one kind (e.g. a glob)")
    return found[0]


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


# ---------------------------------------------------------------------------------------------
# Remote locations
# ---------------------------------------------------------------------------------------------

def named(location: Location) -> Location:
    """A remote location as messages, states and caches name it: each URL's remote_urls.identity (no query string, no
    user info: they grant access, and are kept aside for the requests)."""
    if isinstance(location, (str, os.PathLike)):
        return remote_urls.identity(str(location))
    return [remote_urls.identity(str(p)) for p in location]


def classify_remote(location: Location) -> tuple[str, list[ObjectInfo]]:
    """(kind, shard infos) of a remote location; folders and file lists get [] (their format lists
    them). Errors from remote.py name the bucket, key and endpoint (missing, denied, unreachable)."""
    location = named(location)
    if not isinstance(location, (str, os.PathLike)):
        urls = [str(p) for p in location]
        infos = _heads(urls)
        return remote_shard_kind(infos, describe(location)), infos
    url = str(location)
    if remote_urls.has_wildcard(remote_urls.RemoteUrl.parse(url).key):
        infos = [o for o in remote.list_objects(url) if not _not_shard(o.url)]
        if not infos:
            raise FileNotFoundError(f"{url}: no shards match this pattern (only index or metadata files)")
        check_complete([o.url for o in infos], url)
        return remote_shard_kind(infos, url), infos
    found = remote.list_objects(url)
    if len(found) == 1 and found[0].url == url:  # one object: a shard or a text list
        info = found[0]
        if remote_kind(info):
            return remote_shard_kind([info], url), [info]
        return "file_list", []
    return _classify_remote_folder(url.rstrip("/") + "/", found)


def _not_shard(url: str) -> bool:
    return url.endswith(NOT_SHARDS) or os.path.basename(url).startswith(".")


def _heads(urls: list[str]) -> list[ObjectInfo]:
    if not urls:
        raise DatasetError("an empty list of shards was given")
    return remote.heads(urls)


def _classify_remote_folder(prefix: str, found: list[ObjectInfo]) -> tuple[str, list[ObjectInfo]]:
    """Objects directly below the prefix that are shards -> shards; objects only in "subfolders"
    -> an image folder (class = first key segment below the prefix)."""
    top = [o for o in found if "/" not in remote_urls.relative_to(o.url, prefix)]
    shards = [o for o in top if not _not_shard(o.url)]
    if any(shard_kind_by_name(o.url) for o in shards) or (shards and remote_kind(shards[0])):
        check_no_images_beside_shards(_remote_image_entries(found, prefix), prefix)
        check_one_set([o.url for o in shards], prefix)
        check_complete([o.url for o in shards], prefix)
        return remote_shard_kind(shards, prefix), shards
    if len(top) < len(found):
        return "folder", []
    if shards:
        return remote_shard_kind(shards, prefix), shards  # raises: names an object that is no shard
    raise DatasetError(prefix, "no shards below this prefix (only index or metadata objects)",
                       "Point at the prefix of the shards, e.g. s3://bucket/imagenet/train/")


def _remote_image_entries(found: list[ObjectInfo], prefix: str) -> list[str]:
    """Image objects directly below the prefix, and the "folders" below it that hold image objects."""
    names = set()
    for o in found:
        if o.url.lower().endswith(IMAGE_EXTENSIONS):
            relative = remote_urls.relative_to(o.url, prefix)
            names.add(relative.split("/")[0] + "/" if "/" in relative else relative)
    return sorted(names)


def remote_kind(info: ObjectInfo) -> str | None:
    """The format of a remote object: by its name, else by its first bytes (one ranged read)."""
    def head() -> bytes:
        return transfer.read_range(info, 0, SNIFF_BYTES) if info.size >= SNIFF_BYTES else b""
    return shard_kind_of(info.url, head)


def remote_shard_kind(infos: list[ObjectInfo], where: str) -> str:
    """The one format of listed objects, or a DatasetError naming the odd one. Only the first and
    last objects' heads are read when names do not tell (a GET per shard would cost too much); an
    empty (0-byte) shard is named by its index build, as locally."""
    named = [(o.url, shard_kind_by_name(o.url)) for o in infos]
    if all(kind for _, kind in named):
        return _one_kind(named, where, "prefix")
    ends = [infos[0], infos[-1]] if len(infos) > 1 else infos
    sniffed = [(o.url, remote_kind(o)) for o in ends if o.size]
    kinds = [(name, kind) for name, kind in named if kind] + sniffed
    return _one_kind(kinds or [(where, UNNAMED_SHARD_KIND)], where, "prefix")
