"""Bad samples found mid-run: which ones they are, and a Source that excludes them in place.

DALI 2.4 cannot skip a sample that fails to decode: the whole batch is lost, the message names
no file ("nvImageCodec failure: '#2'"), and an iterator that goes on afterwards silently yields
fewer samples. So the loader, on a pipeline error:
  1. finds the culprits: DALI reads a shard in storage order through a shuffle buffer, so after
     k batches it has read at most the first (k + prefetch + 2) x batch + buffer samples; those
     are checked with DALI's own decoder (bisecting a failed batch), nearest the frontier first;
  2. excludes them *in place*: each becomes a tiny valid placeholder image with label -1, so the
     dataset size, shard boundaries and DALI checkpoints stay valid and the run resumes from its
     last good state without losing its place. Label -1 is ignored by
     CrossEntropyLoss(ignore_index=-1) and by `labels >= 0` masks, like val padding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass

import numpy as np
from PIL import Image

from dali_pipes._dali import shutdown_pipeline
from dali_pipes.formats import tfrecord, webdataset
from dali_pipes.indexes import INDEX_SUFFIX, default_cache_dir
from dali_pipes.sources import Source, read_sample
from dali_pipes.verify import check_image

PLACEHOLDER_LABEL = -1


@dataclass(frozen=True)
class BadSample:
    origin: str  # file, shard#record or tar#key: where to look
    reason: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.reason}"


def placeholder_jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def shard_refs(source: Source, shard_id: int, num_shards: int) -> list[tuple]:
    """Refs of DALI's shard `shard_id` in storage order: [floor(i*N/S), floor((i+1)*N/S))."""
    refs = source.refs()
    n = len(refs)
    return refs[shard_id * n // num_shards:(shard_id + 1) * n // num_shards]


def dali_decodes(datas: list[bytes], device: str = "cpu", device_id: int | None = None) -> list[bool]:
    """Whether DALI's decoder (mixed on gpu, cpu otherwise) decodes each encoded image. One
    pipeline per batch; a failed batch is split in halves until the failures are single samples."""
    if not datas:
        return []
    if _decode_batch(datas, device, device_id):
        return [True] * len(datas)
    if len(datas) == 1:
        return [False]
    mid = len(datas) // 2
    return dali_decodes(datas[:mid], device, device_id) + dali_decodes(datas[mid:], device, device_id)


def decode_pipeline(datas: list[bytes], device: str = "cpu", device_id: int | None = None):
    """An unbuilt pipeline that decodes `datas` as one batch with the loader's decoder: mixed
    (nvJPEG / hardware decoder) on `device_id` for gpu, cpu otherwise."""
    from nvidia.dali import fn, pipeline_def, types
    batch = [np.frombuffer(d, np.uint8) if d else np.zeros(0, np.uint8) for d in datas]

    @pipeline_def(batch_size=len(batch), num_threads=min(4, os.cpu_count() or 1),
                  device_id=device_id if device == "gpu" else None, exec_pipelined=False, exec_async=False)
    def decode():
        return fn.decoders.image(fn.external_source(source=lambda: batch, batch=True, dtype=types.UINT8),
                                 device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)

    return decode()


def _decode_batch(datas: list[bytes], device: str, device_id: int | None) -> bool:
    pipe = decode_pipeline(datas, device, device_id)
    try:
        pipe.build()
        pipe.run()
        return True
    except RuntimeError:
        return False
    finally:
        shutdown_pipeline(pipe)


def find_bad_samples(source: Source, shard_id: int, num_shards: int, reach: int, window: int,
                     device: str = "cpu", device_id: int | None = None) -> list[tuple[tuple, BadSample]]:
    """(ref, BadSample) for samples DALI cannot decode among the first `reach` samples of the
    shard in storage order: all the reader can have read so far. Delivered samples decoded, so
    every undecodable sample there is still to come. Windows are checked from the read frontier
    backwards (the likeliest culprits first), stopping at the first window with a bad sample."""
    refs = shard_refs(source, shard_id, num_shards)[:reach]
    for end in range(len(refs), 0, -window):
        chunk = refs[max(0, end - window):end]
        datas, reasons = [], []
        for ref in chunk:
            try:
                datas.append(read_sample(ref).data)
                reasons.append(None)
            except Exception as e:  # an unreadable record is bad too, whatever DALI thinks
                datas.append(b"")
                reasons.append(str(e))
        ok = dali_decodes(datas, device, device_id)
        bad = [(ref, BadSample(_origin(ref), reason or check_image(data) or "DALI's decoder rejects it"))
               for ref, data, good, reason in zip(chunk, datas, ok, reasons) if not good or reason]
        if bad:
            return bad
    return []


def _origin(ref: tuple) -> str:
    if ref[0] == "file":
        return ref[1]
    if ref[0] == "tfrecord":
        return f"{ref[1]}#{ref[2]} (byte {ref[3]})"
    return f"{ref[1]}#{ref[2]}"


def exclude(source: Source, bad_refs: list[tuple], cache_dir: str | None = None) -> Source:
    """A copy of `source` in which each bad sample is a placeholder image with label -1, at the
    same position. Files are swapped for the placeholder file; shards that hold bad records are
    rewritten (once, under the cache folder) with the records replaced, and get their own index."""
    folder = os.path.join(cache_dir or os.path.dirname(default_cache_dir()), "excluded")
    os.makedirs(folder, exist_ok=True)
    jpeg = placeholder_jpeg()
    placeholder = os.path.join(folder, "placeholder.jpg")
    if not os.path.exists(placeholder):
        with open(placeholder + ".tmp", "wb") as f:
            f.write(jpeg)
        os.replace(placeholder + ".tmp", placeholder)
    new = dataclasses.replace(source, files=list(source.files),
                              labels=list(source.labels) if source.labels is not None else None,
                              index_files=list(source.index_files) if source.index_files else None)
    if source.kind in ("folder", "file_list"):
        bad_paths = {ref[1] for ref in bad_refs}
        for i, path in enumerate(source.files):
            if path in bad_paths:  # every listing of a bad file
                new.files[i], new.labels[i] = placeholder, PLACEHOLDER_LABEL
        return new
    by_shard: dict[str, set] = {}
    for ref in bad_refs:
        by_shard.setdefault(ref[1], set()).add(ref[2])  # record index (tfrecord) or sample key (tar)
    for shard, bad in by_shard.items():
        i = new.files.index(shard)
        tag = hashlib.sha1(f"{os.path.abspath(shard)}|{sorted(bad)}".encode()).hexdigest()[:16]
        target = os.path.join(folder, f"{tag}-{os.path.basename(shard)}")
        if not os.path.exists(target + INDEX_SUFFIX):
            if source.kind == "tfrecord":
                _rewrite_tfrecord(shard, target, bad, jpeg, source)
            else:
                _rewrite_tar(shard, new.index_files[i], target, bad, jpeg, source.label_ext)
        new.files[i], new.index_files[i] = target, target + INDEX_SUFFIX
    return new


def _rewrite_tfrecord(shard: str, target: str, bad: set[int], jpeg: bytes, source: Source) -> None:
    keys = source.keys
    stand_in = tfrecord.frame_record(tfrecord.encode_example(
        {keys.image: jpeg, keys.label: PLACEHOLDER_LABEL + keys.label_offset}))
    entries, offset = [], 0
    with open(target + ".tmp", "wb") as out:
        for i, (_, _, data, _) in enumerate(tfrecord.walk_records(shard, check_data_crc=False)):
            frame = stand_in if i in bad else tfrecord.frame_record(data)
            out.write(frame)
            entries.append((offset, len(frame)))
            offset += len(frame)
    os.replace(target + ".tmp", target)
    tfrecord.write_tfrecord_index(entries, target + INDEX_SUFFIX)


def _rewrite_tar(shard: str, index: str, target: str, bad: set[str], jpeg: bytes, label_ext: str) -> None:
    with open(shard, "rb") as f, tarfile.open(target + ".tmp", "w", format=tarfile.GNU_FORMAT) as out:
        for members in webdataset.read_tar_index(index):
            key = members[0].key_ext[0]
            for m in members:
                ext = m.key_ext[1]
                if key not in bad:
                    data = webdataset.read_member(f, m)
                elif ext == label_ext:
                    data = str(PLACEHOLDER_LABEL).encode()
                else:
                    data = jpeg
                webdataset.add_member(out, m.name, data)
    os.replace(target + ".tmp", target)
    webdataset.write_tar_index(webdataset.build_tar_index(target, label_ext), target + INDEX_SUFFIX)
