"""Reading the protobuf wire format: enough for tf.train.Example records and DALI's serialized
pipelines, without a protobuf dependency. Written from the protobuf encoding specification."""

from __future__ import annotations

from typing import Iterator


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, payload) for each field of one protobuf message."""
    pos = 0
    while pos < len(buf):
        tag, pos = read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = read_varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("field runs past the end of its message")
            yield number, wire, buf[pos:pos + size]
            pos += size
        elif wire == 5:
            yield number, wire, buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            yield number, wire, buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def as_bytes(payload: bytes | int) -> bytes:
    """A field's payload where the message's schema has a length-delimited field (bytes, a string, an
    embedded message); a varint there is a malformed message: ValueError, as fields() raises for others."""
    if isinstance(payload, int):
        raise ValueError("a varint where a length-delimited field belongs")
    return payload


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def length_delimited(number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2): a string, bytes or an embedded message."""
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload
