"""TFRecord framing and tf.train.Example encoding, checked against an independent reader
written here from the TFRecord and protobuf specifications (its own CRC32C, its own parser)."""

import glob
import io
import json
import os
import struct

import pytest
from PIL import Image

from dali_pipes.data.formats import tfrecord, tfrecord_framing
from dali_pipes.data.samples import SampleKeys, SampleRef
from dali_pipes.data.source import open_source
from dali_pipes.errors import DatasetError
from dali_pipes.tools.convert import write_tfrecords

from conftest import expected_multiset


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # Castagnoli polynomial, reflected
        table.append(c)
    return table


_TABLE = _crc32c_table()


def spec_masked_crc(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def spec_read_tfrecord(path):
    """Records of a TFRecord file, every CRC checked."""
    out = []
    with open(path, "rb") as f:
        while header := f.read(12):
            (length,), (length_crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
            assert length_crc == spec_masked_crc(header[:8])
            data = f.read(length)
            (data_crc,) = struct.unpack("<I", f.read(4))
            assert data_crc == spec_masked_crc(data)
            out.append(data)
    return out


def spec_varint(buf, pos):
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def spec_message(buf):
    """[(field number, wire type, value)] of one protobuf message."""
    pos, out = 0, []
    while pos < len(buf):
        tag, pos = spec_varint(buf, pos)
        if tag & 7 == 2:
            n, pos = spec_varint(buf, pos)
            out.append((tag >> 3, 2, buf[pos:pos + n]))
            pos += n
        elif tag & 7 == 0:
            v, pos = spec_varint(buf, pos)
            out.append((tag >> 3, 0, v))
        else:
            raise AssertionError(f"unexpected wire type {tag & 7}")
    return out


def spec_parse_example(data):
    """{key: ('bytes'|'int64', [values])} from a serialized tf.train.Example."""
    [(number, _, features)] = spec_message(data)
    assert number == 1
    parsed = {}
    for entry_number, _, entry in spec_message(features):
        assert entry_number == 1
        fields = dict((n, v) for n, _, v in spec_message(entry))
        key, feature = fields[1].decode(), fields[2]
        [(kind, _, values)] = spec_message(feature)
        if kind == 1:
            parsed[key] = ("bytes", [v for _, _, v in spec_message(values)])
        elif kind == 3:
            [(_, wire, packed)] = spec_message(values)
            ints, pos = [], 0
            while pos < len(packed):
                v, pos = spec_varint(packed, pos)
                ints.append(v)
            parsed[key] = ("int64", ints)
    return parsed


def test_converted_tfrecords_parse_with_an_independent_reader(jpeg_folder, tmp_path):
    out = str(tmp_path / "tfr")
    stats = write_tfrecords(open_source(jpeg_folder), out, shards=3, progress=False)
    shards = sorted(glob.glob(f"{out}/train-*-of-00003.tfrecord"))
    assert [os.path.basename(s) for s in shards] == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
    got, classes = [], json.load(open(f"{out}/classes.json"))["classes"]
    for shard in shards:
        for data in spec_read_tfrecord(shard):
            ex = spec_parse_example(data)
            image = ex["image/encoded"][1][0]
            label = ex["image/class/label"][1][0]
            with Image.open(io.BytesIO(image)) as img:
                assert ex["image/height"] == ("int64", [img.height])
                assert ex["image/width"] == ("int64", [img.width])
            assert ex["image/format"] == ("bytes", [b"JPEG"])
            assert ex["image/class/text"] == ("bytes", [classes[label].encode()])
            assert ex["image/filename"][1][0].decode().startswith(classes[label])
            got.append((image, label))
    assert sorted(got) == sorted(expected_multiset(jpeg_folder).elements())
    assert stats.samples == 12 and stats.bytes == sum(os.path.getsize(s) for s in shards)
    # DALI's index format: "offset size" per record, ending exactly at the file size.
    for shard in shards:
        entries = [tuple(map(int, line.split())) for line in open(shard + ".idx")]
        assert entries[0][0] == 0 and sum(size for _, size in entries) == os.path.getsize(shard)


def test_example_round_trip_and_crc_against_spec():
    features = {"a": b"\x00\xff", "b": [1, -2, 2 ** 40], "c": [0.5, -1.25], "d": "text"}
    decoded = tfrecord.decode_example(tfrecord.encode_example(features))
    assert decoded == {"a": [b"\x00\xff"], "b": [1, -2, 2 ** 40], "c": [0.5, -1.25], "d": [b"text"]}
    for data in (b"", b"a", bytes(range(256)) * 3):
        assert tfrecord.masked_crc32c(data) == spec_masked_crc(data)


def test_gzip_and_zlib_are_recognised(tmp_path):
    import gzip
    import zlib
    framed = tfrecord.frame_record(tfrecord.encode_example({"image/encoded": b"x", "image/class/label": 1}))
    (tmp_path / "g").write_bytes(gzip.compress(framed))
    (tmp_path / "z").write_bytes(zlib.compress(framed))
    (tmp_path / "p").write_bytes(framed)
    assert tfrecord_framing.sniff_compression(str(tmp_path / "g")) == "GZIP"
    assert tfrecord_framing.sniff_compression(str(tmp_path / "z")) == "ZLIB"
    assert tfrecord_framing.sniff_compression(str(tmp_path / "p")) is None
    for name in "gzp":
        assert tfrecord_framing.looks_like_tfrecord(str(tmp_path / name))
    walked = [d for _, _, d, p in tfrecord_framing.walk_records(str(tmp_path / "z"), compression="ZLIB")]
    assert walked == [framed[12:-4]]


def test_a_varint_where_a_message_belongs_is_not_an_example(tmp_path):
    """A record whose Example holds a varint where its feature map belongs is a malformed Example:
    ValueError from the parser, and read_sample names the record (DatasetError), never a TypeError."""
    data = b"\x08\x05"  # field 1 (Example.features) with wire type 0: a varint, not a message
    with pytest.raises(ValueError, match="a varint where a length-delimited field belongs"):
        tfrecord.decode_example(data)
    shard = tmp_path / "a.tfrecord"
    shard.write_bytes(tfrecord.frame_record(data))
    ref = SampleRef("tfrecord", str(shard), 0, "0", 0, shard.stat().st_size, extra=(SampleKeys(),))
    with pytest.raises(DatasetError, match=r"a\.tfrecord#0: not a tf\.train\.Example \(a varint where"):
        tfrecord.read_sample(ref)
