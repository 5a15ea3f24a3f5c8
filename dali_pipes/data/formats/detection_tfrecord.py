"""Detection TFRecord shards with the TensorFlow Object Detection API's keys, written and read as DetectionSamples.

One tf.train.Example per image, with the keys of the Object Detection API's `create_coco_tf_record.py` (and
its `tf_example_decoder.py`): `image/encoded`, `image/format`, `image/filename`, `image/source_id` (the image
id as text), `image/height`, `image/width`, `image/object/bbox/xmin|ymin|xmax|ymax` (float lists, normalised by
the image's width and height), `image/object/class/label` (int64, the dataset's category ids), `image/object/
class/text` (the categories' names), `image/object/is_crowd`, `image/object/area`, plus one key of ours,
`image/object/annotation_id` (int64: COCO's annotation ids, for messages; readers that do not know it skip it).
An image without boxes has the same keys with empty lists. The framing and the Example wire format are
tfrecord.py's and protobuf.py's; each list is written with its own type, so an empty one parses in TensorFlow.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator

import numpy as np

from dali_pipes.data.detection import DetectionSample, detection_sample
from dali_pipes.data.formats.tfrecord import (
    FOOTER_BYTES,
    HEADER_BYTES,
    decode_example,
    frame_record,
    walk_records,
    write_tfrecord_index,
)
from dali_pipes.data.protobuf import encode_varint, length_delimited
from dali_pipes.errors import DatasetError
from dali_pipes.storage import transfer
from dali_pipes.storage.files import atomic_write
from dali_pipes.storage.remote_urls import ObjectInfo

IMAGE, FORMAT, FILENAME, SOURCE_ID = "image/encoded", "image/format", "image/filename", "image/source_id"
HEIGHT, WIDTH = "image/height", "image/width"
XMIN, YMIN, XMAX, YMAX = (f"image/object/bbox/{k}" for k in ("xmin", "ymin", "xmax", "ymax"))
LABEL, TEXT = "image/object/class/label", "image/object/class/text"
IS_CROWD, AREA, ANNOTATION_ID = "image/object/is_crowd", "image/object/area", "image/object/annotation_id"
REQUIRED = (IMAGE, HEIGHT, WIDTH, XMIN, YMIN, XMAX, YMAX, LABEL)


def _bytes_list(values: Iterable[bytes]) -> bytes:
    return length_delimited(1, b"".join(length_delimited(1, v) for v in values))  # Feature.bytes_list = 1


def _float_list(values: Iterable[float]) -> bytes:
    packed = np.asarray(list(values), "<f4").tobytes()  # packed repeated float, as proto3 writes it
    return length_delimited(2, length_delimited(1, packed) if packed else b"")  # Feature.float_list = 2


def _int64_list(values: Iterable[int]) -> bytes:
    packed = b"".join(encode_varint(int(v) & (1 << 64) - 1) for v in values)  # int64: two's complement
    return length_delimited(3, length_delimited(1, packed) if packed else b"")  # Feature.int64_list = 3


def encode_typed_example(features: dict[str, bytes]) -> bytes:
    """A tf.train.Example from {key: an encoded Feature} (_bytes_list, _float_list, _int64_list), keys sorted."""
    entries = b"".join(length_delimited(1, length_delimited(1, key.encode()) + length_delimited(2, feature))
                       for key, feature in sorted(features.items()))  # map entries: key = 1, value = 2
    return length_delimited(1, entries)  # Example.features = 1, whose entries are Features.feature (1)


def image_format(data: bytes) -> str:
    """'jpeg', 'png' or 'bmp'/'webp'/'gif' by the file's magic bytes (the OD API's image/format), else ''."""
    signatures = ((b"\xff\xd8", "jpeg"), (b"\x89PNG", "png"), (b"BM", "bmp"), (b"GIF8", "gif"))
    found = next((name for magic, name in signatures if data.startswith(magic)), "")
    return "webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else found


def encode_sample(sample: DetectionSample, image: bytes, categories: dict[int, str]) -> bytes:
    """The Example of one image and its boxes (normalised by sample.width / height), not yet framed."""
    w, h = float(sample.width), float(sample.height)
    boxes = sample.boxes.astype(np.float64)
    return encode_typed_example({
        IMAGE: _bytes_list([image]), FORMAT: _bytes_list([image_format(image).encode()]),
        FILENAME: _bytes_list([os.path.basename(sample.path).encode()]),
        SOURCE_ID: _bytes_list([str(sample.image_id).encode()]),
        HEIGHT: _int64_list([sample.height]), WIDTH: _int64_list([sample.width]),
        XMIN: _float_list(boxes[:, 0] / w), YMIN: _float_list(boxes[:, 1] / h),
        XMAX: _float_list(boxes[:, 2] / w), YMAX: _float_list(boxes[:, 3] / h),
        LABEL: _int64_list(sample.labels), TEXT: _bytes_list(categories.get(int(c), str(c)).encode()
                                                             for c in sample.labels),
        IS_CROWD: _int64_list(sample.iscrowd), AREA: _float_list(sample.area),
        ANNOTATION_ID: _int64_list(sample.annotation_ids),
    })


def write_shard(path: str, items: Iterable[tuple[DetectionSample, bytes]], categories: dict[int, str]) -> int:
    """Write (sample, image bytes) pairs as one TFRecord shard (atomically) and its DALI index beside it
    (PATH.idx); returns the number of records."""
    entries: list[tuple[int, int]] = []
    with atomic_write(path) as f:
        offset = 0
        for sample, image in items:
            frame = frame_record(encode_sample(sample, image, categories))
            f.write(frame)
            entries.append((offset, len(frame)))
            offset += len(frame)
    write_tfrecord_index(entries, path + ".idx")
    return len(entries)


def _one(example: dict[str, list], key: str, where: str):
    values = example.get(key) or [None]
    if values[0] is None:
        raise DatasetError(where, f"no value for {key!r}", "Write the shard with the Object Detection API's keys")
    return values[0]


def decode_sample(data: bytes, shard: str, index: int, offset: int, position: int) -> tuple[DetectionSample, bytes]:
    """(DetectionSample, image bytes) of one record's data; boxes back in pixels. A source_id that is not an
    integer (other converters write file names) gives the record's `position` in the set as the image id."""
    where = f"{shard}#{index}"
    try:
        example = decode_example(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise DatasetError(where, f"not a tf.train.Example ({e})", "Re-create the shard") from None
    missing = [k for k in REQUIRED if k not in example]
    if missing:
        raise DatasetError(where, f"no feature {', '.join(missing)}; keys present: {', '.join(sorted(example))}",
                           "Write the shard with the Object Detection API's keys (dali-pipes convert)")
    width, height = int(_one(example, WIDTH, where)), int(_one(example, HEIGHT, where))
    columns = [example[k] for k in (XMIN, YMIN, XMAX, YMAX, LABEL)]
    if len({len(c) for c in columns}) != 1:
        raise DatasetError(where, "bbox and label lists of different lengths "
                           f"({', '.join(f'{k}: {len(c)}' for k, c in zip(REQUIRED[3:], columns))})",
                           "Re-create the shard")
    n = len(columns[4])
    boxes = np.array(columns[:4], np.float64).reshape(4, n).T * [width, height, width, height]
    source = (example.get(SOURCE_ID) or [b""])[0]
    image_id = int(source) if source.strip().lstrip(b"-").isdigit() else position
    optional = {k: example[k] if k in example and len(example[k]) == n else None  # the OD API's optional lists
                for k in (ANNOTATION_ID, IS_CROWD, AREA)}
    sample = detection_sample(shard, image_id, width, height, boxes, columns[4],
                              annotation_ids=optional[ANNOTATION_ID], iscrowd=optional[IS_CROWD],
                              area=optional[AREA], extra=(offset, HEADER_BYTES + len(data) + FOOTER_BYTES))
    return sample, _one(example, IMAGE, where)


def iter_shard(shard: str, first_position: int = 0) -> Iterator[tuple[DetectionSample, bytes]]:
    """(sample, image bytes) of each record of a local or remote shard, in order; DatasetError naming
    shard#record on a broken frame, a bad CRC or a record without the detection keys."""
    with transfer.local_copy(shard) as local:
        for index, (offset, _, data, problem) in enumerate(walk_records(local)):
            if problem or data is None:
                raise DatasetError(f"{shard}#{index}", f"byte {offset}: {problem.message if problem else 'no data'}",
                                   "Re-create the shard")
            sample, image = decode_sample(data, shard, index, offset, first_position + index)
            yield sample, image


def read_shards(shards: Iterable[str]) -> list[DetectionSample]:
    """Every record of `shards` as a DetectionSample (path: the shard; extra: the record's (offset, framed
    size)), in order. Image ids: each record's source_id, or else its position in the whole set."""
    samples: list[DetectionSample] = []
    for shard in shards:
        samples += [sample for sample, _ in iter_shard(shard, len(samples))]
    return samples


def image_bytes(sample: DetectionSample, listed: ObjectInfo | None = None) -> bytes:
    """The encoded image of a sample read_shards gave (one ranged read of its record; of `listed`, the shard's
    ObjectInfo where it was listed, without a HEAD first)."""
    offset, size = sample.extra
    frame = transfer.read_range(listed or sample.path, offset, size)
    data = frame[HEADER_BYTES:-FOOTER_BYTES]
    return decode_sample(data, sample.path, -1, offset, sample.image_id)[1]


def is_detection_record(data: bytes) -> bool:
    """Does this record's Example hold the detection keys (bbox lists and labels)?"""
    try:
        return all(k in decode_example(data) for k in (XMIN, LABEL))
    except (ValueError, UnicodeDecodeError):
        return False
