#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets into corpus/<target>/ (committed; rerun after
a wire-format change). Each seed is a valid message or a near miss, a few bytes each.
Layouts: docs/wire-format.md (frames, handshake), include/rdmx/memory.hpp (descriptor)."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SEND, WRITE, WRITE_IMM, READ_REQ, ACK, READ_RESP, NAK = 1, 2, 3, 4, 16, 17, 18


def frame(op, seq=0, addr=0, key=0, length=0, imm=0, flags=0, status=0, payload=b""):
    # op, flags, reserved(2), imm, seq, addr, key, length, status: 40 bytes, little endian
    return struct.pack("<BBHIQQQII", op, flags, 0, imm, seq, addr, key, length, status) + payload


def handshake(kind, pdata=b"", max_rd=16, size=None, version=2, flags=None):
    size = size or (72 if kind == 1 else 212)
    if flags is None:
        flags = 0 if kind == 3 else 1  # GOODBYE in HELLO and ACCEPT, as rdmx sends them
    head = b"RDXT" + struct.pack("<BBBBII", version, kind, len(pdata), flags, max_rd, 0)
    return (head + pdata).ljust(size, b"\0")


def descriptor(addr, length, key, backend=2, version=1):
    return b"RDMX" + struct.pack("<BBHQQQ", version, backend, 0, addr, length, key)


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


# fuzz_frame: a header, then an optional byte choosing a test region (see fuzz_frame.cpp).
write("fuzz_frame", {
    "send": frame(SEND, length=16, flags=1),
    "write-rw": frame(WRITE, addr=0, length=64) + b"\0",
    "write-ro": frame(WRITE, addr=0, length=64) + b"\1",
    "write-gone": frame(WRITE, addr=0, length=64) + b"\2",
    "write-imm-edge": frame(WRITE_IMM, addr=4096 - 128 - 8, length=8, imm=7) + b"\0",
    "read-wraps": frame(READ_REQ, addr=0xFFFFFFFFFFFFFFF0, length=32) + b"\0",
    "ack": frame(ACK, seq=3),
    "read-resp": frame(READ_RESP, seq=2, length=256),
    "nak-rnr": frame(NAK, seq=1, status=1),
    "max-length": frame(WRITE, length=1 << 30) + b"\0",
    # Near misses: fields a request does not use (docs/wire-format.md section 2).
    "write-solicited": frame(WRITE, addr=0, length=64, flags=1) + b"\0",
    "send-with-key": frame(SEND, length=16, key=1),
    "read-with-imm": frame(READ_REQ, addr=0, length=32, imm=1) + b"\0",
})

# fuzz_handshake: first byte 1 = the listener's side (expects HELLO), 0 = the client's.
write("fuzz_handshake", {
    "hello": b"\1" + handshake(1, b"hi"),
    "hello-full": b"\1" + handshake(1, b"x" * 56),
    "hello-too-long": b"\1" + handshake(1, b"x" * 57, size=72),
    "accept": b"\0" + handshake(2, b"welcome", max_rd=4),
    "reject": b"\0" + handshake(3, b"r" * 148, max_rd=0),
    "short": b"\0" + handshake(2)[:20],
    "bad-version": b"\1" + b"RDXT\3\1" + handshake(1)[6:],
    "version-1": b"\1" + handshake(1, b"hi", version=1, flags=0),
    "reject-goodbye": b"\0" + handshake(3, b"r", max_rd=0, flags=1),
    # Near misses: padding not zero, no reads served, a reject that serves reads.
    "hello-padding": b"\1" + handshake(1, b"hi")[:71] + b"\1",
    "hello-no-reads": b"\1" + handshake(1, b"hi", max_rd=0),
    "reject-with-reads": b"\0" + handshake(3, b"no", max_rd=4),
})

write("fuzz_descriptor", {
    "tcp": descriptor(0x7F0000001000, 4096, 0x0123456789ABCDEF),
    "verbs": descriptor(0x10000, 1 << 20, 0x1234, backend=1),
    "verbs-wide-key": descriptor(0x10000, 1, 1 << 32, backend=1),
    "wraps": descriptor(0xFFFFFFFFFFFFF000, 0x1000, 1),
    "end-of-space": descriptor(0xFFFFFFFFFFFFF000, 0xFFF, 1),
    # Found by fuzz_descriptor: a valid descriptor of the whole address space (length + 1
    # overflowed in the harness's own slice check).
    "whole-address-space": descriptor(0, 0xFFFFFFFFFFFFFFFF, 0x1234, backend=1),
    "bad-backend": descriptor(0, 0, 0, backend=3),
})

# fuzz_engine: byte streams a peer sends after the handshake. Keys 0..3 name the test
# regions [target, read-only, deregistered, local-only] and addresses are offsets in them;
# the engine has posted: send 0, write 1, read 2 (256 B), write_imm 3, read 4 (128 B).
write("fuzz_engine", {
    "send": frame(SEND, length=16, payload=b"s" * 16),
    "target-ops": frame(WRITE, seq=0, addr=64, length=64, payload=b"w" * 64)
    + frame(READ_REQ, seq=1, addr=0, length=128)
    + frame(WRITE_IMM, seq=2, addr=4000, length=8, imm=9, payload=b"i" * 8)
    + frame(SEND, seq=3, length=100, payload=b"t" * 100),
    "responses": frame(ACK, seq=1) + frame(READ_RESP, seq=2, length=256, payload=b"r" * 256)
    + frame(ACK, seq=3) + frame(READ_RESP, seq=4, length=128, payload=b"q" * 128),
    "nak-rnr": frame(NAK, seq=0, status=1) + frame(ACK, seq=0),
    "nak-access": frame(NAK, seq=0, status=2),
    "write-read-only": frame(WRITE, key=1, length=32, payload=b"x" * 32),
    "write-deregistered": frame(WRITE, key=2, length=32, payload=b"x" * 32),
    "write-local-only": frame(WRITE, key=3, length=32, payload=b"x" * 32),
    "write-past-end": frame(WRITE, addr=4090, length=64, payload=b"x" * 64),
    "read-read-only": frame(READ_REQ, key=1, addr=100, length=50),
    "send-too-long": frame(SEND, length=600, payload=b"l" * 600),
    "rnr-go-back": frame(SEND, seq=0, length=4, payload=b"a" * 4) + frame(SEND, seq=1, length=4, payload=b"b" * 4)
    + frame(SEND, seq=2, length=4, payload=b"c" * 4) + frame(SEND, seq=3, length=4, payload=b"d" * 4),
    "truncated": frame(WRITE, length=64)[:17],
    "unknown-op": frame(0x7F),
})
