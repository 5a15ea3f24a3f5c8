"""A fingerprint of a dataset's files, from their names and sizes (and, for s3:// objects, their ETags):
nothing is read, so it costs what listing the data costs. A resumed loader state carries the fingerprint
of the data it was taken on (resume.py); data whose count is the same but whose files changed is refused,
naming what changed.

    {"files": N, "bytes": total, "digest": sha1 of every (name, size) in order,
     "entries": [[name, size(, etag)], ...]              # up to ENTRY_LIMIT files: the exact file is named
     "groups": [[folder, files, bytes, digest], ...]}    # else per folder (a class folder): the folder is named

Names are relative to the files' common folder, so a dataset moved or mounted elsewhere keeps its fingerprint.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
from typing import Any, Sequence

from dali_pipes.storage import remote, remote_urls

ENTRY_LIMIT = 10_000  # files listed one by one in a state; more are summed up per folder


def _relative(paths: Sequence[str]) -> list[str]:
    common = os.path.commonprefix(list(paths)) if len(paths) > 1 else os.path.dirname(paths[0]) + "/"
    cut = common.rfind("/") + 1
    return [p[cut:] for p in paths]


def of_files(paths: Sequence[str], sizes: Sequence[int], versions: Sequence[str] | None = None) -> dict:
    """The fingerprint of files in order; `versions` (ETags of s3:// objects) count as well when given."""
    if not paths:
        return {"files": 0, "bytes": 0, "digest": hashlib.sha1().hexdigest()}
    names = _relative(paths)
    rows: list[list[Any]] = [[n, s] for n, s in zip(names, sizes)] if versions is None else \
        [[n, s, v] for n, s, v in zip(names, sizes, versions)]
    digest = hashlib.sha1()
    groups: dict[str, list[Any]] = {}  # {folder: [files, bytes, digest]}
    for row in rows:
        line = "\t".join(map(str, row)).encode() + b"\n"
        digest.update(line)
        group = groups.setdefault(row[0].rpartition("/")[0], [0, 0, hashlib.sha1()])
        group[0] += 1
        group[1] += row[1]
        group[2].update(line)
    out = {"files": len(rows), "bytes": sum(sizes), "digest": digest.hexdigest()}
    if len(rows) <= ENTRY_LIMIT:
        out["entries"] = rows
    elif len(groups) <= ENTRY_LIMIT:
        out["groups"] = [[name, n, size, h.hexdigest()] for name, (n, size, h) in groups.items()]
    return out


def changes(saved: dict, now: dict) -> str | None:
    """What changed from `saved` to `now`, in words (the first file or folder that differs), or None."""
    if saved.get("digest") == now.get("digest"):
        return None
    if "entries" in saved and "entries" in now:
        return _first_change(saved["entries"], now["entries"], "file")
    if "groups" in saved and "groups" in now:
        def rows(fp: dict) -> list[list]:
            return [[name or ".", f"{n} files, {size} bytes, digest {digest[:8]}"]
                    for name, n, size, digest in fp["groups"]]
        return _first_change(rows(saved), rows(now), "folder")
    return (f"{saved.get('files')} files of {saved.get('bytes')} bytes then, {now.get('files')} files of "
            f"{now.get('bytes')} bytes now (their names or sizes differ)")


def _first_change(old: list[list], new: list[list], what: str) -> str:
    before, after = {r[0]: r[1:] for r in old}, {r[0]: r[1:] for r in new}
    for name in before:
        if name not in after:
            return f"{what} {name} was removed ({len(old)} {what}s then, {len(new)} now)"
    for name in after:
        if name not in before:
            return f"{what} {name} was added ({len(old)} {what}s then, {len(new)} now)"
    for name, then in before.items():
        if after[name] != then:
            return f"{what} {name} changed ({_show(then)} then, {_show(after[name])} now)"
    for i, (a, b) in enumerate(zip(old, new)):
        if a[0] != b[0]:
            return f"the order of the {what}s changed (at position {i}: {a[0]} then, {b[0]} now)"
    return f"the {what}s differ"


def _show(values: list) -> str:
    return ", ".join(f"{v} bytes" if isinstance(v, int) else f"ETag {v}" if len(values) > 1 else str(v) for v in values)


def stamp(paths: Sequence[str]) -> str:
    """A digest of every file as it is now: size and modification time (ns) of a local file, size and ETag of a
    remote object (a HEAD each, 16 at a time, under the caller's options), "missing" for one that is gone. Unlike
    the fingerprint it sees a file rewritten at the same size; the val cache compares it between epochs (it costs
    one stat, or HEAD, per file)."""
    from concurrent.futures import ThreadPoolExecutor
    remote_paths = [path for path in paths if "://" in path and remote_urls.is_remote(path)]
    states: dict[str, str] = {}
    if remote_paths:
        context = contextvars.copy_context()
        with ThreadPoolExecutor(min(16, len(remote_paths))) as pool:
            states = dict(zip(remote_paths, pool.map(lambda u: context.copy().run(_state_now, u), remote_paths)))
    digest = hashlib.sha1()
    for path in paths:
        digest.update(f"{path}\t{states[path] if path in states else _state_now(path)}\n".encode())
    return digest.hexdigest()


def _state_now(path: str) -> str:
    try:
        if "://" in path and remote_urls.is_remote(path):  # the cheap test first: most val sets are local files
            info = remote.head(path)
            return f"{info.size}\t{info.etag}"
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    return f"{st.st_size}\t{st.st_mtime_ns}"
