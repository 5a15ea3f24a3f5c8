"""protobuf.py: the wire format read against bytes written by hand from the protobuf encoding rules."""

from dali_pipes.data.protobuf import fields, read_varint


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_varints_round_trip_at_the_byte_boundaries():
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**32, 2**63 - 1):
        assert read_varint(varint(n) + b"tail", 0) == (n, len(varint(n)))


def test_fields_of_a_message():
    message = bytes([0x08]) + varint(150) + bytes([0x12]) + varint(3) + b"abc"  # 1: varint 150, 2: bytes "abc"
    assert list(fields(message)) == [(1, 0, 150), (2, 2, b"abc")]
