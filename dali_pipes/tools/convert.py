"""Converters: any Source -> TFRecord shards or WebDataset tar shards, with their indexes, classes.json
and, written last, manifest.json (manifest.py): a conversion cut short leaves no manifest.

The output folder (or s3:// prefix) must hold nothing but other prefixes' sets that its manifest lists (train
and val, converted one after the other): an earlier conversion with this prefix is refused, or with
overwrite=True (--overwrite) removed first (its shards of either format, their .idx files, classes.json and,
when it lists no other set, manifest.json), so that two conversions never leave one folder holding both. Files
no conversion wrote are never removed: they are refused, named.

Samples are shuffled across shards (a seeded permutation dealt round-robin, so shard sizes
differ by at most one). Worker processes read and encode samples; the parent process alone
writes, so each shard's bytes and index come out in one deterministic order.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image
from tqdm import tqdm

from dali_pipes.data import manifest
from dali_pipes.data.formats import read_sample, tfrecord, webdataset
from dali_pipes.data.indexes import INDEX_SUFFIX
from dali_pipes.data.samples import SampleRef
from dali_pipes.data.source import Source
from dali_pipes.errors import DatasetError
from dali_pipes.storage.files import atomic_write, is_temp, moved_by, private_tmp, remove_own_temps
from dali_pipes.tools.workers import process_pool


@dataclass(frozen=True)
class ConvertStats:
    samples: int
    shards: int
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)

    def __str__(self) -> str:
        return (f"{self.samples} samples -> {self.shards} shards, {self.bytes / 1e6:.1f} MB in "
                f"{self.seconds:.2f} s ({self.mb_per_s:.1f} MB/s)")


def default_prefix(src: str) -> str:
    """The shard name prefix for a source named `src`: its folder's name (data/val -> "val"; a glob or a list
    file -> the folder it sits in), so that a val split converted beside train keeps its own name."""
    from dali_pipes.storage import remote_urls
    if remote_urls.is_remote(src):  # unlisted: a key with a wildcard or an extension is an object or a glob
        key = remote_urls.RemoteUrl.parse(src).key.rstrip("/")
        last = os.path.basename(key)
        folder = os.path.dirname(key) if remote_urls.has_wildcard(last) or "." in last else key
    else:
        folder = os.path.abspath(src) if os.path.isdir(src) else os.path.dirname(os.path.abspath(src))
    return re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(folder)) or "train"


def shard_name(prefix: str, index: int, count: int, ext: str) -> str:
    return f"{prefix}-{index:05d}-of-{count:05d}{ext}"


def _image_info(data: bytes, where: str) -> tuple[int, int, str]:
    """(height, width, format) from the image header; the pixels are not decoded."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.height, img.width, img.format or "JPEG"
    except Exception as e:  # PIL raises several types for undecodable bytes
        raise DatasetError(where, f"not a readable image ({e})", "Find every bad sample with: "
                           "dali-pipes verify SRC --write-clean-list SRC/clean.txt (or: python "
                           "scripts/verify_dataset.py ...), then convert SRC/clean.txt") from None


_classes: list[str] | None = None  # set in each worker by _init_worker


def _init_worker(classes: list[str] | None) -> None:
    global _classes
    _classes = classes


def _class_text(label: int) -> str:
    return _classes[label] if _classes and 0 <= label < len(_classes) else str(label)


def _encode_tfrecord(ref: SampleRef) -> tuple[bytes, int, tuple[int, int]]:
    sample = read_sample(ref)
    height, width, fmt = _image_info(sample.data, sample.origin)
    example = tfrecord.encode_example({
        "image/encoded": sample.data, "image/format": fmt, "image/class/label": sample.label,
        "image/class/text": _class_text(sample.label), "image/height": height, "image/width": width,
        "image/channels": 3, "image/colorspace": "RGB",
        "image/filename": os.path.basename(sample.origin.split("#")[0]),
    })
    return tfrecord.frame_record(example), sample.label, (width, height)


def _encode_tar_sample(ref: SampleRef) -> tuple[str, bytes, int, tuple[int, int]]:
    sample = read_sample(ref)
    height, width, fmt = _image_info(sample.data, sample.origin)
    return {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "TIFF": "tif"}.get(fmt, "jpg"), \
        sample.data, sample.label, (width, height)


def _grown(box: list[int], size: tuple[int, int]) -> None:
    """`box` (width, height) grown to hold an image of `size`: the manifest's "largest" of a shard."""
    box[0], box[1] = max(box[0], size[0]), max(box[1], size[1])


def _dealt(source: Source, shards: int, seed: int) -> list[tuple[int, SampleRef]]:
    """(shard, ref) in writing order: a seeded shuffle dealt round-robin over the shards."""
    refs = source.refs()
    if shards < 1:
        raise ValueError(f"--shards must be at least 1, got {shards}")
    if shards > len(refs):
        raise ValueError(f"--shards {shards} is more than the {len(refs)} samples; use at most {len(refs)}")
    order = np.random.default_rng(seed).permutation(len(refs))
    return [(position % shards, refs[i]) for position, i in enumerate(order)]


def _run(source: Source, out: str, shards: int, seed: int, workers: int | None, progress: bool,
         encode, desc: str):
    """Yield (shard index, position in writing order, encoded result) as workers finish, in order."""
    dealt = _dealt(source, shards, seed)
    with process_pool(workers, initializer=_init_worker, initargs=(source.classes,)) as pool:
        results = pool.map(encode, [ref for _, ref in dealt], chunksize=32)
        bar = tqdm(total=len(dealt), desc=desc, unit="img", file=sys.stderr, disable=None if progress else True)
        for position, ((shard, _), result) in enumerate(zip(dealt, results)):
            yield shard, position, result
            bar.update()
        bar.close()


@dataclass(frozen=True)
class OutputContents:
    """What an output folder holds before a conversion with `prefix`, by name: an earlier conversion with
    this prefix (`old`: its shards and indexes, and the shared classes.json and manifest.json unless another
    set is kept), other prefixes' sets its manifest lists (`kept`), and anything else (`foreign`)."""
    old: list[str]
    kept: list[str]
    foreign: list[str]


def survey_output(names: list[str], prefix: str, previous: dict | None) -> OutputContents:
    """Sort the names in an output folder (relative to it; s3:// keys below the prefix may hold "/").
    Hidden and temporary files are no one's data (every reader skips them) and are left out."""
    ours = re.compile(rf"^{re.escape(prefix)}-\d+-of-\d+\.(tfrecord|tar)(\.idx)?$")
    listed = {s["name"] for s in (previous or {}).get("shards", []) if not s["name"].startswith(f"{prefix}-")}
    old, kept, foreign, shared = [], [], [], []
    for name in sorted(n for n in names if not n.startswith(".") and not is_temp(n)):
        if name in (manifest.MANIFEST_NAME, "classes.json"):
            shared.append(name)
        elif ours.match(name):
            old.append(name)
        elif name in listed or name.removesuffix(INDEX_SUFFIX) in listed:
            kept.append(name)
        else:
            foreign.append(name)
    return OutputContents(old + shared, kept, foreign) if not kept else OutputContents(old, kept + shared, foreign)


def _first(names: list[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


def files_to_replace(out: str, contents: OutputContents, prefix: str, overwrite: bool) -> list[str]:
    """The names to remove before converting into `out`: the old set, with `overwrite`. Raises DatasetError
    naming `out` and what it holds when it holds files no conversion wrote, or an old set without `overwrite`."""
    if contents.foreign:
        raise DatasetError(out, f"not empty: holds {len(contents.foreign)} files or folders that no conversion "
                           f"with prefix {prefix!r} wrote ({_first(contents.foreign)})",
                           "Convert into an empty (or new) folder, or move them away: --overwrite replaces only an "
                           f"earlier conversion's {prefix}-*-of-* shards, their .idx files, classes.json and "
                           "manifest.json")
    if contents.old and not overwrite:
        shown = sorted(contents.old, key=lambda n: (n.endswith(INDEX_SUFFIX), n))  # shards before their indexes
        raise DatasetError(out, f"not empty: holds an earlier conversion ({_first(shown)}); converting "
                           f"into it would leave both sets there", "Pass --overwrite (overwrite=True) to remove it "
                           "first, or convert into an empty (or new) folder")
    return contents.old


def _clear_local(out: str, prefix: str, overwrite: bool) -> None:
    if not os.path.isdir(out):
        return
    try:
        previous = manifest.read(os.path.join(out, manifest.MANIFEST_NAME))
    except DatasetError:
        previous = None  # unreadable: part of the old set
    contents = survey_output(os.listdir(out), prefix, previous)
    for name in files_to_replace(out, contents, prefix, overwrite):
        os.remove(os.path.join(out, name))


def _clear_remote(out: str, prefix: str, overwrite: bool) -> None:
    from dali_pipes.storage import remote, remote_urls, transfer
    try:
        found = remote.list_objects(out)
    except FileNotFoundError:
        return  # nothing below the prefix (a missing bucket is named by the upload)
    try:
        previous = manifest.read(remote_urls.join(out, manifest.MANIFEST_NAME))
    except DatasetError:
        previous = None
    contents = survey_output([remote_urls.relative_to(o.url, out) for o in found], prefix, previous)
    for name in files_to_replace(out, contents, prefix, overwrite):
        transfer.delete(remote_urls.join(out, name))


def _remote_out(write):
    """Check the output folder (survey_output: an earlier conversion there is refused, or with overwrite
    removed first), and let a writer take an s3:// `out`: it writes into a temporary folder, then every file it
    wrote (shards, indexes, classes.json) is uploaded below the prefix, checked by size. A write that
    fails leaves none of its temp files; a full disk is one line naming the file and where to write."""
    import functools

    @functools.wraps(write)
    def wrapper(source: Source, out: str, **kwargs) -> ConvertStats:
        from dali_pipes.storage import remote_urls, transfer
        prefix, overwrite = kwargs.get("prefix", "train"), kwargs.pop("overwrite", False)
        if not remote_urls.is_remote(out):
            _clear_local(out, prefix, overwrite)
            try:
                with moved_by("convert's output argument (a folder on a disk with room, or an s3:// prefix)", out):
                    return write(source, out, **kwargs)
            except BaseException:
                remove_own_temps(out)
                raise
        import tempfile
        out = out.rstrip("/") + "/"
        scheme = remote_urls.RemoteUrl.parse(out).scheme
        if not remote_urls.SCHEMES[scheme].writable:
            upload = ", and upload that with huggingface_hub (hf upload)" if scheme == "hf" else ""
            raise DatasetError(out, f"{scheme}:// locations are read-only here",
                               f"Convert to a local folder or a bucket{upload}")
        _clear_remote(out, prefix, overwrite)
        with tempfile.TemporaryDirectory(prefix="dali_pipes-convert-") as folder, \
                moved_by("TMPDIR (convert stages remote output there: a folder on a disk with room)", folder):
            stats = write(source, folder, **kwargs)
            ours = manifest.read(os.path.join(folder, manifest.MANIFEST_NAME))
            assert ours is not None, "every writer writes a manifest"
            manifest.write(folder, manifest.merged(manifest.read(remote_urls.join(out, manifest.MANIFEST_NAME)),
                                                   ours, prefix))
            names = sorted(os.listdir(folder), key=lambda n: n == manifest.MANIFEST_NAME)  # the manifest last
            for name in names:
                transfer.upload(os.path.join(folder, name), remote_urls.join(out, name))
        return stats
    return wrapper


@_remote_out
def write_tfrecords(source: Source, out: str, *, shards: int = 8, prefix: str = "train", seed: int = 0,
                    workers: int | None = None, progress: bool = True, overwrite: bool = False) -> ConvertStats:
    """Write `prefix-0000i-of-0000K.tfrecord` shards of tf.train.Example records, their DALI
    indexes (`.idx` beside each) and `classes.json`. An s3:// `out` gets them uploaded. An earlier
    conversion with this prefix in `out` is refused, or with `overwrite` removed first (by _remote_out, before
    this body runs)."""
    start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, shard_name(prefix, i, shards, ".tfrecord")) for i in range(shards)]
    tmps = [private_tmp(p) for p in paths]
    files = [open(t, "wb") for t in tmps]
    entries: list[list[tuple[int, int]]] = [[] for _ in paths]
    labels: list[list[int]] = [[] for _ in paths]
    boxes = [[0, 0] for _ in paths]
    total = 0
    try:
        for shard, _, (frame, label, size) in _run(source, out, shards, seed, workers, progress, _encode_tfrecord,
                                                   "to_tfrecord"):
            entries[shard].append((files[shard].tell(), len(frame)))
            labels[shard].append(label)
            _grown(boxes[shard], size)
            files[shard].write(frame)
            total += len(frame)
    finally:
        for f in files:
            f.close()
    for path, tmp, shard_entries in zip(paths, tmps, entries):
        os.replace(tmp, path)  # shard complete: only now does it get its final name
        tfrecord.write_tfrecord_index(shard_entries, path + INDEX_SUFFIX)
    _write_classes_json(out, source, shards, [len(e) for e in entries])
    _write_manifest(out, "tfrecord", source, prefix, paths, labels, boxes)
    return ConvertStats(sum(len(e) for e in entries), shards, total, time.perf_counter() - start)


@_remote_out
def write_webdataset(source: Source, out: str, *, shards: int = 8, prefix: str = "train", seed: int = 0,
                     workers: int | None = None, progress: bool = True, overwrite: bool = False) -> ConvertStats:
    """Write `prefix-0000i-of-0000K.tar` shards of <key>.jpg + <key>.cls samples, their DALI
    webdataset indexes (`.idx` beside each) and `classes.json`. An earlier conversion with this prefix in
    `out` is refused, or with `overwrite` removed first (by _remote_out, before this body runs)."""
    start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, shard_name(prefix, i, shards, ".tar")) for i in range(shards)]
    tmps = [private_tmp(p) for p in paths]
    tars = [tarfile.open(t, "w", format=tarfile.GNU_FORMAT) for t in tmps]
    labels: list[list[int]] = [[] for _ in paths]
    boxes = [[0, 0] for _ in paths]
    try:
        for shard, position, (ext, data, label, size) in _run(source, out, shards, seed, workers, progress,
                                                              _encode_tar_sample, "to_webdataset"):
            _grown(boxes[shard], size)
            key = f"{prefix}_{position:08d}"  # unique, and free of dots (the key ends at the first dot)
            webdataset.add_member(tars[shard], f"{key}.{ext}", data)
            webdataset.add_member(tars[shard], f"{key}.cls", str(label).encode())
            labels[shard].append(label)
    finally:
        for t in tars:
            t.close()
    total = 0
    for path, tmp in zip(paths, tmps):
        os.replace(tmp, path)
        webdataset.write_tar_index(webdataset.build_tar_index(path), path + INDEX_SUFFIX)
        total += os.path.getsize(path)
    _write_classes_json(out, source, shards, [len(l) for l in labels])
    _write_manifest(out, "webdataset", source, prefix, paths, labels, boxes)
    return ConvertStats(sum(len(l) for l in labels), shards, total, time.perf_counter() - start)


def _write_classes_json(out: str, source: Source, shards: int, counts: list[int]) -> None:
    info = {"classes": source.classes, "label_offset": 0, "source": str(source.location),
            "shards": shards, "samples_per_shard": counts}
    with open(os.path.join(out, "classes.json"), "w") as f:
        json.dump(info, f, indent=1)


def _write_manifest(out: str, kind: str, source: Source, prefix: str, paths: list[str],
                    labels: list[list[int]], boxes: list[list[int]]) -> None:
    """manifest.json, last: every shard with its size, sample count, label range and the box around its images
    (width, height: what the GPU decoders preallocate for; manifest.py)."""
    shards = [{"name": os.path.basename(p), "bytes": os.path.getsize(p), "samples": len(l),
               "labels": [min(l), max(l)] if l else None, "largest": box if l else None}
              for p, l, box in zip(paths, labels, boxes)]
    previous = manifest.read(os.path.join(out, manifest.MANIFEST_NAME))
    manifest.write(out, manifest.merged(previous, manifest.build(kind, source.classes, shards), prefix))


def _decompress_one(task: tuple[str, str]) -> tuple[int, int]:
    src, dst = task
    compression = tfrecord.sniff_compression(src)
    entries, offset = [], 0
    with atomic_write(dst) as f:
        for _, _, data, problem in tfrecord.walk_records(src, compression=compression):
            if problem:
                raise DatasetError(problem.path, f"record {problem.index} (byte {problem.offset}): {problem.message}")
            assert data is not None  # walk_records reads every intact record's data (compressed: always)
            frame = tfrecord.frame_record(data)
            f.write(frame)
            entries.append((offset, len(frame)))
            offset += len(frame)
    tfrecord.write_tfrecord_index(entries, dst + INDEX_SUFFIX)
    return len(entries), offset


def decompress_tfrecords(shards: list[str], out: str, *, workers: int | None = None,
                         progress: bool = True) -> ConvertStats:
    """Rewrite GZIP/ZLIB TFRecords uncompressed (same names, same records) with their indexes."""
    start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    tasks = [(s, os.path.join(out, os.path.basename(s).removesuffix(".gz").removesuffix(".zz"))) for s in shards]
    with process_pool(workers) as pool:
        done = list(tqdm(pool.map(_decompress_one, tasks), total=len(tasks), desc="decompressing",
                         unit="shard", file=sys.stderr, disable=None if progress else True))
    return ConvertStats(sum(n for n, _ in done), len(tasks), sum(b for _, b in done), time.perf_counter() - start)
