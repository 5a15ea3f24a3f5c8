"""Bad samples met mid-run: the policy that finds them, names them or excludes them in place, keeps
the count within a budget, and carries all of that through the loader's state.

DALI 2.4 cannot skip a sample that fails to decode: the whole batch is lost, the message names
no file ("nvImageCodec failure: '#2'"), and an iterator that goes on afterwards silently yields
fewer samples. So the loader hands every pipeline error to `BadSamplePolicy.handle`, which
  1. finds the culprits: DALI reads a shard in storage order through a shuffle buffer, so after
     k batches it has read at most the first ReaderModel.reach(...) samples of it; those are checked
     with DALI's own decoder (bisecting a failed batch), nearest the read frontier first;
  2. raises a DatasetError naming them, or (skip=True) excludes them *in place*: each becomes a tiny
     valid placeholder image with label -1, so the dataset size, shard boundaries and DALI
     checkpoints stay valid and the run resumes from its last good state without losing its place.
     Label -1 is ignored by CrossEntropyLoss(ignore_index=-1) and by `labels >= 0` masks, like val
     padding;
  3. raises once more samples than the budget (`max_bad`) have been excluded.

A network fault is not a bad sample: the rank's pipeline hands one to the outage handler
(outage.py) before any culprit search. A read that fails on the network during a culprit search
raises ConnectionError (object_store retries it first).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
from PIL import Image

from dali_pipes.data.formats import image_files, read_sample
from dali_pipes.data.image_check import check_image, oversized
from dali_pipes.data.indexes import INDEX_SUFFIX
from dali_pipes.data.labels import check_label, label_bound
from dali_pipes.data.samples import PADDING_LABEL, SampleRef, required
from dali_pipes.data.source import Source
from dali_pipes.errors import DatasetError, IndexMismatchError, LabelError
from dali_pipes.run.decode_probe import dali_decodes
from dali_pipes.storage.files import atomic_write, cache_root

SHOWN = 5  # bad samples named in a message; the rest are counted


class ReadReach(Protocol):
    """What a pipeline can have read when a batch fails: reader.ReaderModel, or a sampler's drawn order."""

    def reach(self, position: int, epoch: int) -> list[Sequence[int]]: ...
    def window(self) -> int: ...


@dataclass(frozen=True)
class BadSample:
    origin: str  # file, shard#record (byte offset) or tar#key: where to look
    reason: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.reason}"


def listing(bad: list[BadSample]) -> str:
    """The first few bad samples, and how many more."""
    text = "; ".join(str(b) for b in bad[:SHOWN])
    return text + (f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")


def budget_of(max_bad: int | float | None, num_samples: int) -> int | None:
    """How many excluded samples are tolerated: an int is a count, a float in (0, 1) a fraction of
    the dataset, None no limit."""
    if max_bad is None:
        return None
    if isinstance(max_bad, bool) or not isinstance(max_bad, (int, float)):
        raise ValueError(f"max_bad must be an int count, a float fraction in (0, 1) or None, got {max_bad!r}")
    if isinstance(max_bad, float):
        if not 0 < max_bad < 1:
            raise ValueError(f"max_bad as a fraction must be in (0, 1), got {max_bad}; pass an int for a count")
        return int(max_bad * num_samples)
    if max_bad < 0:
        raise ValueError(f"max_bad must be >= 0, got {max_bad}")
    return max_bad


def _clean_list(source: Source) -> str | None:
    """How to write and train from a clean list, where one can be written: a local image folder or file list
    (shards, Parquet and remote images have none: their bad samples are excluded with skip_bad)."""
    return image_files.clean_list_fix(source.location) if source.kind in ("folder", "file_list") else None


class BadSamplePolicy:
    """What the loader does about bad samples, in one object: find them after a pipeline error,
    raise naming them (skip=False) or exclude them in place (skip=True) within `max_bad`, and keep
    what was excluded in the loader's state so a resumed run excludes the same samples."""

    def __init__(self, *, skip: bool = False, max_bad: int | float | None = None, device: str = "cpu",
                 device_id: int | None = None, max_pixels: int | None = None) -> None:
        budget_of(max_bad, 1)  # refuse a malformed budget now, not at the first bad sample
        self.skip, self.max_bad = skip, max_bad
        self.device, self.device_id, self.max_pixels = device, device_id, max_pixels
        self.bad_samples: list[BadSample] = []   # excluded so far, in order
        self.excluded: list[list[SampleRef]] = []  # refs excluded by each event (re-applied on resume)

    def handle_failure(self, error: RuntimeError, source: Source, reader: ReadReach, position: int,
                       epoch: int) -> Source:
        """`handle` for a batch that failed after `position` delivered batches of the pipeline's epoch
        `epoch`: the samples the reader can have read then (reader.py's model; a sampler-driven epoch's
        order, sampled.py) are searched."""
        return self.handle(error, source, reader.reach(position, epoch), reader.window())

    def handle(self, error: RuntimeError, source: Source, reach: list[Sequence[int]], window: int) -> Source:
        """The source with the culprits of `error` excluded (skip=True); else raises DatasetError
        naming them. Raises too when no culprit is found or the budget is spent: never continue
        silently."""
        message = str(error).strip().splitlines()[-1][:300] if str(error).strip() else repr(error)
        bad: list[tuple[SampleRef, BadSample]] = []
        for indices in reach:
            bad = bad or find_bad_samples(source, indices, window, self.device, self.device_id, self.max_pixels)
        if not bad:
            raise DatasetError(source.location, f"the DALI pipeline failed and no bad sample was found near the "
                               f"reader's position: {message}") from error
        found = [b for _, b in bad]
        if not self.skip:
            clean = _clean_list(source)
            first = f"Remove or replace the file, train from a clean list ({clean})" if clean else \
                f"Find every bad sample with: dali-pipes verify {source.location}"
            raise DatasetError(f"decoding failed: {listing(found)}", "",
                               f"{first}, or exclude bad samples as they are met with skip_bad=True (train: "
                               f"--skip-bad)") from error
        for b in found:  # one warning per sample, each naming it
            warnings.warn(f"excluding a bad sample and resuming at the last good batch: {b}", stacklevel=1)
        self.bad_samples += found
        self.excluded.append([ref for ref, _ in bad])
        self.check_budget(source)
        return exclude(source, self.excluded[-1])

    def take_damaged(self, source: Source) -> Source:
        """Damage found while opening with skip_bad (source.damaged): one warning each, counted
        against the budget; samples still in the source are excluded in place."""
        if not source.damaged:
            return source
        refs = [ref for ref, _ in source.damaged if ref is not None]
        for _, error in source.damaged:
            warnings.warn(f"excluding a bad sample: {error.where}: {error.problem}", stacklevel=1)  # about the data
            self.bad_samples.append(BadSample(error.where, error.problem))
        source = dataclasses.replace(source, damaged=[])
        if refs:
            self.excluded.append(refs)
            source = exclude(source, refs)
        self.check_budget(source)
        return source

    def check_budget(self, source: Source) -> None:
        budget = budget_of(self.max_bad, source.num_samples)
        if budget is not None and len(self.bad_samples) > budget:
            clean = _clean_list(source)
            raise DatasetError(
                source.location, f"{len(self.bad_samples)} bad samples excluded, over the budget of {budget} "
                f"(max_bad={self.max_bad}); first: {listing(self.bad_samples)}",
                f"Check the data and train from a clean list: {clean}, or raise --max-bad" if clean else
                f"Check the data (dali-pipes verify {source.location} lists every bad sample), or raise --max-bad")

    def state(self) -> dict:
        return {"bad_samples": [dataclasses.asdict(b) for b in self.bad_samples], "excluded": self.excluded}

    @staticmethod
    def merge(states: list[dict]) -> dict:
        """One state() from every old rank's (an elastic resume): their excluded samples, each once."""
        bad = {str(b): b for s in states for b in s.get("bad_samples", [])}
        excluded = {str(refs): refs for s in states for refs in s.get("excluded", [])}
        return {"bad_samples": list(bad.values()), "excluded": list(excluded.values())}

    def restore(self, state: dict, source: Source) -> Source:
        """Take a saved state: the same samples excluded, in the same order, then anything found bad
        since (while this loader opened its data), counted against the budget. Returns the source."""
        saved_bad = [BadSample(**b) for b in state.get("bad_samples", [])]
        saved_excluded = [list(refs) for refs in state.get("excluded", [])]
        known = {b.origin for b in saved_bad}
        self.bad_samples = saved_bad + [b for b in self.bad_samples if b.origin not in known]
        known_refs = {str(refs) for refs in saved_excluded}
        self.excluded = saved_excluded + [refs for refs in self.excluded if str(refs) not in known_refs]
        for refs in saved_excluded:  # exclude() is idempotent: refs already excluded at open stay so
            source = exclude(source, refs)
        self.check_budget(source)
        return source


def placeholder_jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def find_bad_samples(source: Source, indices: Sequence[int], window: int, device: str = "cpu",
                     device_id: int | None = None, max_pixels: int | None = None) -> list[tuple[SampleRef, BadSample]]:
    """(ref, BadSample) for samples DALI cannot decode among `indices`, the storage indices the reader
    can have read so far in its read order (ReaderModel.reach). Delivered samples decoded, so every
    undecodable sample there is still to come. Windows are checked from the read frontier
    backwards (the likeliest culprits first), stopping at the first window with a bad sample.
    Headers are checked against `max_pixels` first: an oversized image never reaches a decoder."""
    every = source.refs()
    refs = [every[i] for i in indices]
    num_classes, classes_from = label_bound(source) if source.format.SHARDED else (None, "")  # files: checked at open
    for end in range(len(refs), 0, -window):
        chunk = refs[max(0, end - window):end]
        datas: list[bytes] = []
        reasons: list[str | None] = []  # what a header or a read says is wrong; None: ask DALI's decoder
        for ref in chunk:
            try:
                sample = read_sample(ref)  # a label out of range raises LabelError: never a bad sample to skip
                if sample.label != PADDING_LABEL:  # a placeholder (read_sample refuses every other negative)
                    check_label(sample.label, sample.origin, num_classes=num_classes, classes_from=classes_from)
                data = sample.data
            except LabelError:
                raise
            except IndexMismatchError as e:  # the index's fault: excluding the sample would drop a good one
                index = required(source.index_files, source, "index_files")[source.files.index(ref.path)]
                raise DatasetError(index, f"this index and {ref.path} disagree ({e.where}: {e.problem})",
                                   "Delete the index: it is rebuilt when the data is opened again (a shard whose "
                                   "records are damaged is named then)") from e
            except (DatasetError, OSError) as e:  # an unreadable record is bad too, whatever DALI thinks
                if isinstance(e, (ConnectionError, TimeoutError)):
                    raise  # the store, not the sample: object_store retried it already
                datas.append(b"")
                reasons.append(e.problem if isinstance(e, DatasetError) else str(e))
                continue
            too_big = oversized(data, max_pixels)
            datas.append(b"" if too_big else data)  # b"": undecodable, never given to DALI (dali_decodes)
            reasons.append(too_big)
        ok = dali_decodes(datas, device, device_id)
        bad = [(ref, BadSample(ref.origin, reason or check_image(data) or "DALI's decoder rejects it"))
               for ref, data, good, reason in zip(chunk, datas, ok, reasons) if not good or reason]
        if bad:
            return bad
    return []


def exclude(source: Source, bad_refs: list[SampleRef], cache_dir: str | None = None) -> Source:
    """A copy of `source` in which each bad sample is a placeholder image with label -1, at the
    same position. Files are swapped for the placeholder file; shards that hold bad records are
    rewritten (once, under the cache folder) with the records replaced, and get their own index."""
    folder = os.path.join(cache_dir or cache_root(), "excluded")
    os.makedirs(folder, exist_ok=True)
    jpeg = placeholder_jpeg()
    placeholder = os.path.join(folder, "placeholder.jpg")
    if not os.path.exists(placeholder):
        with atomic_write(placeholder) as f:
            f.write(jpeg)
    if not source.format.SHARDED:
        files, labels = image_files.excluded_files(source, bad_refs, placeholder)
        return dataclasses.replace(source, files=files, labels=labels)
    files, index_files = list(source.files), list(required(source.index_files, source, "index_files"))
    by_shard: dict[str, set[str]] = {}
    for ref in bad_refs:
        by_shard.setdefault(ref.path, set()).add(ref.key)  # record number (tfrecord) or sample key (tar)
    for shard, bad in by_shard.items():
        i = files.index(shard)
        # "|2": placeholders store labels.EXCLUDED_LABEL since 0.3 (copies made before stored -1)
        tag = hashlib.sha1(f"{os.path.abspath(shard)}|{sorted(bad)}|2".encode()).hexdigest()[:16]
        target = os.path.join(folder, f"{tag}-{os.path.basename(shard)}")
        if not os.path.exists(target + INDEX_SUFFIX):
            source.sharded_format.rewrite_without(shard, index_files[i], target, bad, jpeg, source)
        files[i], index_files[i] = target, target + INDEX_SUFFIX
    return dataclasses.replace(source, files=files, index_files=index_files)
