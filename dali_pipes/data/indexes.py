"""Index files for record shards: find, check, and build them where they may be written.

DALI needs an index per TFRecord shard (a missing one is a C++ assert, a short one silently
drops records), and reads tar shards faster with one. Policy:
  * the index of `shard` is `shard + ".idx"` beside it, or the same name under a cache
    directory (keyed by the shard directory's path) when the shard directory is read-only;
  * an existing index is used only while it still matches its shard (see the *_matches checks);
  * a missing or stale index is rebuilt, many shards in parallel, with a progress bar;
  * an s3:// shard's index lives only in the cache, at <cache>/remote/<ObjectInfo.version>.idx:
    the name changes with the object's size, ETag or last-modified, so a replaced object is
    never read with a stale index. It is built by streaming the shard once (no local copy).
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import shutil
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence, cast

from tqdm import tqdm

from dali_pipes.data.formats import ShardedFormat, format_of, sharded_format_of
from dali_pipes.errors import DatasetError
from dali_pipes.storage.files import cache_root, moved_by, private_tmp, remove_stale_temps

INDEX_SUFFIX = ".idx"
INDEX_FLAG = "--index-cache-dir (DaliLoader's index_cache_dir; or DALI_PIPES_CACHE)"


def default_cache_dir() -> str:
    """The index cache: indexes of read-only shard folders and of remote shards."""
    return os.path.join(cache_root(), "indexes")


def index_candidates(shard: str, cache_dir: str | None = None) -> tuple[str, str]:
    """(beside the shard, in the cache) paths for a shard's index."""
    shard = os.path.abspath(shard)
    folder, name = os.path.split(shard)
    key = hashlib.sha1(folder.encode()).hexdigest()[:16]
    return shard + INDEX_SUFFIX, os.path.join(cache_dir or default_cache_dir(), key, name + INDEX_SUFFIX)


def find_index(shard: str, kind: str, cache_dir: str | None = None) -> str | None:
    """The path of a matching index for `shard`, or None. An explicit `cache_dir` is looked in first,
    and an index beside the shard is then only read, never touched (the dataset is left alone)."""
    beside, cached = index_candidates(shard, cache_dir)
    for candidate in (cached, beside) if cache_dir else (beside, cached):
        if os.path.exists(candidate) and sharded_format_of(kind).index_matches(shard, candidate):
            if not cache_dir or candidate == cached:
                _mark_checked(shard, candidate)
            return candidate
    return None


def _mark_checked(shard: str, index: str) -> None:
    """An index older than its shard gets a full check; once it passes, date it after the shard
    so that the next start does only the cheap check."""
    if os.path.getmtime(index) < os.path.getmtime(shard):
        try:
            os.utime(index)
        except OSError:
            pass  # read-only: the full check simply repeats next time


def build_index(shard: str, kind: str, cache_dir: str | None = None, label_ext: str = "cls",
                damaged: list | None = None) -> str:
    """Build the index beside the shard, or in the cache when the shard's folder is read-only or
    `cache_dir` is given: an explicit cache wins, so a dataset the user asked to leave alone stays so.

    With a `damaged` list, per-sample damage is recorded there (format modules say what they
    tolerate) and an index of the readable samples is written under the cache folder with a
    `.partial.idx` name, where find_index never looks: a later run without skip_bad rebuilds and
    raises, rather than silently reading a shard with samples left out."""
    beside, cached = index_candidates(shard, cache_dir)
    if cache_dir is None and os.access(os.path.dirname(beside), os.W_OK) \
            and (not os.path.exists(beside) or os.access(beside, os.W_OK)):
        target = beside
    else:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        target = cached
    found: list = []
    remove_stale_temps(os.path.dirname(target))  # left by a writer that died (a full disk, a kill)
    tmp = private_tmp(target)
    try:
        with moved_by(INDEX_FLAG, target):
            sharded_format_of(kind).build_index(shard, tmp, label_ext, found if damaged is not None else None)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if found and damaged is not None:  # found only fills when damaged is given
        damaged.extend(found)
        target = cached.removesuffix(INDEX_SUFFIX) + ".partial" + INDEX_SUFFIX
        os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(tmp, target)  # a rename on one file system; the cache may sit on another
    return target


def ensure_indexes(shards: Sequence[str], kind: str, *, cache_dir: str | None = None, build: bool = True,
                   workers: int | None = None, progress: bool = True, label_ext: str = "cls",
                   damaged: list | None = None) -> list[str]:
    """A matching index path for each shard, building missing or stale ones in parallel.

    With build=False a missing or stale index is an error that says how to build it. With a
    `damaged` list, damaged samples are recorded there instead of raising (see build_index)."""
    found = _parallel(lambda s: find_index(s, kind, cache_dir), shards, workers, None)
    missing = [s for s, idx in zip(shards, found) if idx is None]
    if missing and not build:
        raise DatasetError(missing[0], f"no index that matches this shard ({len(missing)} of {len(shards)} shards "
                           f"lack one)", f"Build them with: python scripts/make_index.py "
                           f"{os.path.dirname(missing[0]) or '.'} (or: dali-pipes index ...)")
    if missing:
        desc = f"indexing {len(missing)} {kind} shard{'s' if len(missing) > 1 else ''}"
        built = dict(zip(missing, _parallel(lambda s: build_index(s, kind, cache_dir, label_ext, damaged), missing,
                                            workers, desc if progress else None)))
        found = [idx or built[s] for s, idx in zip(shards, found)]
    return found


def _parallel(fn, items: Sequence, workers: int | None, desc: str | None) -> list:
    # Index work is seeks and small reads: threads overlap the I/O waits.
    workers = workers or min(32, (os.cpu_count() or 1) * 4)
    context = contextvars.copy_context()  # the pool's threads run under this thread's options (retries, deadline)
    with ThreadPoolExecutor(workers) as pool:
        results = pool.map(lambda item: context.copy().run(fn, item), items)
        if desc:
            results = tqdm(results, total=len(items), desc=desc, unit="shard", file=sys.stderr,
                           disable=None)
        return list(results)


# ---------------------------------------------------------------------------------------------
# s3:// shards
# ---------------------------------------------------------------------------------------------

def remote_index_path(info, cache_dir: str | None = None) -> str:
    """Where the index of the remote shard `info` (an ObjectInfo) is cached: keyed by its version."""
    return os.path.join(cache_dir or default_cache_dir(), "remote", f"{info.version}{INDEX_SUFFIX}")


def build_remote_index(info, kind: str, cache_dir: str | None = None, label_ext: str = "cls") -> str:
    """Stream the shard once (a Python-fed format: read its footer) and write its index into the cache;
    returns the index path."""
    from dali_pipes.storage import transfer
    target = remote_index_path(info, cache_dir)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = private_tmp(target)
    fmt = cast(ShardedFormat, format_of(kind))
    if fmt.PYTHON_FED:  # read by ranged reads (Parquet): its index comes from them too, a footer
        with moved_by(INDEX_FLAG, target):
            fmt.build_index(info.url, tmp, label_ext, None)
        os.replace(tmp, target)
        return target
    try:
        with transfer.open_object(info) as f, moved_by(INDEX_FLAG, target):
            sharded_format_of(kind).build_index_stream(f, info.url, tmp, label_ext)
            f.read()  # to the end: the download's size and ETag checks run there
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def ensure_remote_indexes(infos: Sequence, kind: str, *, cache_dir: str | None = None, build: bool = True,
                          workers: int | None = None, progress: bool = True, label_ext: str = "cls") -> list[str]:
    """The cached index path of each remote shard, building the missing ones in parallel. A cached index is
    checked like a local one (the format's remote_index_matches: entries within the object's size, contiguous
    where the format's are, record headers where it puts them) before it is used; one that fails is rebuilt,
    with a warning naming the cache file: anyone who can write to a shared cache folder can put a file there."""
    found = [remote_index_path(info, cache_dir) for info in infos]
    cached = [(info, path) for info, path in zip(infos, found) if os.path.exists(path)]
    fits = _parallel(lambda pair: sharded_format_of(kind).remote_index_matches(*pair), cached,
                     workers or min(16, len(cached) or 1), None)
    for (info, path), ok in zip(cached, fits):
        if not ok:
            warnings.warn(f"{path}: this cached index does not describe {info.url} (its entries, the object's "
                          f"size or the record headers where it puts them differ): the cache file was altered or "
                          f"damaged, not the data; rebuilding it", stacklevel=2)
    good = {path for (_, path), ok in zip(cached, fits) if ok}
    missing = [info for info, path in zip(infos, found) if path not in good]
    if missing and not build:
        raise DatasetError(missing[0].url, f"no cached index for this version of the shard ({len(missing)} of "
                           f"{len(infos)} shards lack one)", "Open the source with build_indexes=True")
    if missing:
        desc = f"indexing {len(missing)} remote {kind} shard{'s' if len(missing) > 1 else ''}"
        _parallel(lambda info: build_remote_index(info, kind, cache_dir, label_ext), missing,
                  workers or min(16, len(missing)), desc if progress else None)
    return found

