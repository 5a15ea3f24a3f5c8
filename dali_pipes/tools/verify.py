"""Verification: check every sample of a dataset, in parallel, and list each problem with its file.

DALI never checks TFRecord CRCs and cannot skip an image that fails to decode, so bad samples
must be found before training. Checks: zero-byte, truncated and non-image files; TFRecord
frames and CRCs; Examples without the image or label key; tar members cut short; classes with
no images; images whose header claims more pixels than a limit (a decompression-bomb guard,
checked before any pixel is decoded); labels out of range (negative after the label offset, or at or
above the classes of classes.json or the manifest); file-list lines naming a sample twice; and, where
a conversion's manifest.json sits beside shards, every shard it lists: present, of its size, count and
range of labels; no shard beside them that it does not list; its sample total and classes as found.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from PIL import Image
from tqdm import tqdm

from dali_pipes.data import manifest
from dali_pipes.data.formats import format_of, read_sample, sharded_format_of
from dali_pipes.data.image_check import DEFAULT_MAX_PIXELS, check_image
from dali_pipes.data.labels import PADDING_LABEL, check_label
from dali_pipes.data.location import classify, classify_remote, is_remote, named
from dali_pipes.data.samples import SampleKeys, SampleRef, required
from dali_pipes.data.source import classes_beside, file_list_source, folder_source
from dali_pipes.errors import DatasetError
from dali_pipes.tools.workers import process_pool


@dataclass(frozen=True)
class Problem:
    where: str  # file, or shard#record
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Report:
    location: str
    kind: str
    checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    clean: list[tuple[str, int]] = field(default_factory=list)  # (path, label) of good files

    @property
    def ok(self) -> bool:
        return not self.problems


def _lift_pil_limit() -> None:
    # Verification's own worker processes: the --max-pixels check above replaces PIL's guard,
    # which would otherwise refuse images between its limit and a higher --max-pixels.
    Image.MAX_IMAGE_PIXELS = None


def _check_ref(task: tuple[SampleRef, int, int | None]) -> tuple[str, int | None, str | None]:
    ref, max_pixels, num_classes = task
    try:
        sample = read_sample(ref)  # a negative label (after the offset) raises LabelError
        if sample.label != PADDING_LABEL:
            check_label(sample.label, sample.origin, num_classes=num_classes)
    except FileNotFoundError:
        return ref.path, None, "missing file"
    except DatasetError as e:
        return e.where or ref.origin, None, e.problem
    except OSError as e:
        return ref.origin, None, str(e)
    return sample.origin, sample.label, check_image(sample.data, max_pixels)


def verify(location, *, keys: SampleKeys | None = None, label_ext: str = "cls",
           max_pixels: int = DEFAULT_MAX_PIXELS, workers: int | None = None, progress: bool = True) -> Report:
    """Check every sample of `location` (any kind open_source takes); never raises on bad data."""
    keys = keys or SampleKeys()
    if is_remote(location):
        return _verify_remote(location, keys, label_ext, max_pixels, workers, progress)
    kind, shards = classify(location)
    report = Report(str(location), kind)
    if kind == "folder":
        source = folder_source(str(location))
        seen = set(required(source.labels, source, "labels"))
        report.problems += [Problem(os.path.join(str(location), name), "class folder with no images")
                            for label, name in enumerate(required(source.classes, source, "classes"))
                            if label not in seen]
        refs = source.refs()
    elif kind == "file_list":
        listed: list[DatasetError] = []
        refs = file_list_source(str(location), missing_ok=True, problems=listed).refs()
        report.problems += [Problem(e.where, e.problem) for e in listed]
    else:
        refs = _shard_refs(kind, shards, keys, label_ext, report)
        counts = [sum(1 for ref in refs if ref.path == shard) for shard in shards] if len(shards) < 1000 else None
        searched = isinstance(location, (str, os.PathLike)) and not os.path.isfile(location)
        num_classes = _check_manifest(report, shards, [os.path.getsize(s) for s in shards], counts, complete=searched)
        results = _parallel_checks(refs, max_pixels, workers, progress, num_classes)
        _check_label_ranges(report, shards[0], _label_ranges(refs, results), keys.label_offset)
        return _record(report, refs, results)
    return _record(report, refs, _parallel_checks(refs, max_pixels, workers, progress))


def _check_manifest(report: Report, shards: list[str], sizes: list[int], counts: list[int] | None,
                    complete: bool) -> int | None:
    """The shards against a manifest.json beside them (manifest.py), each problem into the report, and
    classes.json against its classes; returns the number of classes (classes.json, else the manifest's),
    which labels must be below."""
    path = manifest.path_beside(shards[0])
    found = manifest.read(path)
    classes = classes_beside(shards[0])
    if found is not None:
        report.problems += [Problem(e.where, e.problem) for e in
                            manifest.problems(found, path, shards, sizes, counts, complete,
                                              manifest.name_pattern(report.location))]
        stale = manifest.classes_problem(found, path, manifest.classes_path(path), classes)
        report.problems += [Problem(stale.where, stale.problem)] if stale else []
    classes = classes or (found or {}).get("classes")
    return len(classes) if classes else None


def _label_ranges(refs: list[SampleRef], results: list) -> dict[str, tuple[int, int]]:
    """(lowest, highest) label read of each shard whose every sample gave one (placeholders left out)."""
    labels: dict[str, list] = {}
    for ref, (_, label, _) in zip(refs, results):
        labels.setdefault(ref.path, []).append(label)
    return {shard: (min(ok), max(ok)) for shard, found in labels.items()
            if None not in found and (ok := [l for l in found if l != PADDING_LABEL])}


def _check_label_ranges(report: Report, shard: str, ranges: dict[str, tuple[int, int]], offset: int) -> None:
    """Each shard's range of labels (after `offset`) against the one the manifest beside `shard` lists."""
    path = manifest.path_beside(shard)
    found = manifest.read(path)
    if found is not None:
        report.problems += [Problem(e.where, e.problem) for e in manifest.label_problems(found, path, ranges, offset)]


def _verify_remote(location, keys: SampleKeys, label_ext: str, max_pixels: int, workers: int | None,
                   progress: bool) -> Report:
    """verify() of an s3:// location: images are read by URL; shards are downloaded one at a time
    into a temporary folder (checked against their listed size and ETag), checked there, deleted."""
    import tempfile

    from dali_pipes.data.source import remote_folder_source, remote_list_source
    from dali_pipes.storage import remote_urls, transfer
    location = named(location)  # no query string (a signature) in the report
    kind, infos = classify_remote(location)
    report = Report(str(location), kind)
    if kind in ("folder", "file_list"):
        listed: list[DatasetError] = []
        source = remote_folder_source(str(location)) if kind == "folder" else remote_list_source(
            str(location), keys, label_ext, None, True, progress, problems=listed)
        report.problems += [Problem(e.where, e.problem) for e in listed]
        refs = source.refs()
        return _record(report, refs, _parallel_checks(refs, max_pixels, workers, progress))

    complete = isinstance(location, (str, os.PathLike)) and [o.url for o in infos] != [str(location)]
    num_classes = _check_manifest(report, [o.url for o in infos], [o.size for o in infos], None, complete)
    ranges: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="dali_pipes-verify-") as folder:
        for i, info in enumerate(infos):
            local = os.path.join(folder, f"{i:06d}-{remote_urls.basename(info.url)}")
            transfer.download(info, local)
            shard_report = Report(info.url, kind)
            refs = _shard_refs(kind, [local], keys, label_ext, shard_report)
            results = _parallel_checks(refs, max_pixels, workers, False, num_classes)
            for r in _label_ranges(refs, results).values():  # the one shard, downloaded: its range under its url
                ranges[info.url] = r
            _record(shard_report, refs, results)
            report.checked += shard_report.checked
            report.problems += [Problem(p.where.replace(local, info.url), p.message.replace(local, info.url))
                                for p in shard_report.problems]
            os.remove(local)
    _check_label_ranges(report, infos[0].url, ranges, keys.label_offset)
    return report


def _record(report: Report, refs: list[SampleRef], results: list) -> Report:
    for ref, (where, label, problem) in zip(refs, results):
        report.checked += 1
        if problem:
            report.problems.append(Problem(where, problem))
        elif not format_of(ref.kind).SHARDED:  # image files: the clean list names them
            report.clean.append((where, label))
    return report


def _shard_refs(kind: str, shards: list[str], keys: SampleKeys, label_ext: str, report: Report) -> list[SampleRef]:
    """Walk each shard's framing (in threads: it is seeks and small reads); broken frames and
    shards become problems, readable records become refs for the per-sample checks."""
    fmt = sharded_format_of(kind)

    def walk(shard: str) -> tuple[list[SampleRef], list[DatasetError]]:
        if os.path.getsize(shard) == 0:
            return [], [DatasetError(shard, "zero-byte shard")]
        try:
            return fmt.verify_shard(shard, keys, label_ext)
        except DatasetError as e:
            return [], [e]

    all_refs = []
    with ThreadPoolExecutor(min(32, 4 * (os.cpu_count() or 1))) as pool:
        for shard, (refs, problems) in zip(shards, pool.map(walk, shards)):
            all_refs += refs
            report.problems += [Problem(e.where or shard, e.problem) for e in problems]
    return all_refs


def _parallel_checks(refs: list[SampleRef], max_pixels: int, workers: int | None, progress: bool,
                     num_classes: int | None = None) -> list:
    if not refs:
        return []
    with process_pool(workers, initializer=_lift_pil_limit) as pool:
        results = pool.map(_check_ref, [(ref, max_pixels, num_classes) for ref in refs], chunksize=16)
        return list(tqdm(results, total=len(refs), desc="verifying", unit="img", file=sys.stderr,
                         disable=None if progress else True))


def write_clean_list(report: Report, list_path: str) -> int:
    """Write the good samples as a file list ("relative/path label", relative to the list's
    folder), which open_source reads back. Returns the number of lines."""
    if report.kind not in ("folder", "file_list"):
        raise DatasetError(report.location, "--write-clean-list needs an image folder or a file list; "
                           "shards cannot be listed by file", "Convert the clean images again instead")
    base = os.path.dirname(os.path.abspath(list_path))
    lines = []
    for path, label in report.clean:
        relative = os.path.relpath(os.path.abspath(path), base)
        if relative.startswith(".."):
            raise DatasetError(list_path, f"a file list must sit in a folder that holds the images "
                               f"({path} is outside {base})", "Write it inside the dataset folder")
        lines.append(f"{relative} {label}\n")
    with open(list_path, "w") as f:
        f.writelines(lines)
    return len(lines)
