#!/usr/bin/env python3
"""Writes the committed seed inputs of every fuzz target into fuzz/seeds/<target>/.

Binary seeds are cut from the golden stores in tests/fixtures/ (format-v1, format-v2 and
format-v2-compacted); text seeds are written out here. Run from anywhere:
    python3 fuzz/make_seeds.py
"""
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
HEADER = 32  # segment header bytes
FRAME_HEADER = 17


def read(*parts):
    with open(os.path.join(FIXTURES, *parts), "rb") as f:
        return f.read()


def write(target, name, data):
    folder = os.path.join(SEEDS, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def frames(segment):
    at = HEADER
    while at + FRAME_HEADER <= len(segment):
        (length,) = struct.unpack_from("<I", segment, at)
        end = at + FRAME_HEADER + length
        if end > len(segment):
            break
        yield segment[at:end]
        at = end


plain = read("format-v1", "00000001.seg")
plain2 = read("format-v2", "00000001.seg")
compacted1 = read("format-v2-compacted", "00000001.seg")
compacted2 = read("format-v2-compacted", "00000002.seg")
checkpoint = read("format-v2-compacted", "checkpoint-00000000000000000009.idx")

# decode_frame: every frame of the golden stores (format 1 has no sync marks, format 2 has).
for store, segment in (("v1", plain), ("v2", plain2), ("compacted", compacted1)):
    for i, frame in enumerate(frames(segment)):
        write("decode_frame", f"{store}-frame-{i}", frame)

# scan_segment: the segment files, and a torn tail.
write("scan_segment", "v1-00000001.seg", plain)
write("scan_segment", "v1-torn-tail.seg", plain[:-7])
write("scan_segment", "v2-00000001.seg", plain2)
write("scan_segment", "v2-torn-tail.seg", plain2[:-7])
write("scan_segment", "compacted-00000001.seg", compacted1)
write("scan_segment", "compacted-00000002.seg", compacted2)

# decode_checkpoint: the golden checkpoint.
write("decode_checkpoint", "compacted-checkpoint-9.idx", checkpoint)

# recovery: a flags byte (bit 0: reseal CRCs), then the files, each starting with its magic.
write("recovery", "v1", b"\x00" + plain)
write("recovery", "v1-sealed", b"\x01" + plain)
write("recovery", "v1-torn-tail", b"\x00" + plain[:-7])
write("recovery", "v2", b"\x00" + plain2)
write("recovery", "v2-torn-tail", b"\x00" + plain2[:-7])
write("recovery", "compacted-with-checkpoint", b"\x00" + compacted1 + compacted2 + checkpoint)
write("recovery", "compacted-no-checkpoint", b"\x01" + compacted1 + compacted2)
write("recovery", "empty-segment", b"\x00" + compacted2)

# item_json: the API's JSON shape, valid and not.
items = {
    "document-chunk": '{"id":"ch3","type":"document_chunk","content":{"text":"Clause 3: ..."},'
    '"source":"contracts","timestamp":1715300000,"version":"1","scope":"global_readonly"}',
    "session-ttl-confidence": '{"id":"m1","type":"message","content":{"role":"user","b":[1,2.5,null]},'
    '"source":"chat","timestamp":1715335260,"version":"v1","scope":"session","session_id":"s1",'
    '"ttl_seconds":3600,"confidence":0.75}',
    "with-hash": '{"id":"x","type":"tool_result","content":1,"source":"tool","timestamp":0,"version":"1",'
    '"hash":"sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b",'
    '"scope":"global_writable"}',
    "unicode-content": '{"id":"u","type":"user_profile","content":{"名":"合同","a":{"z":1,"b":-0.0,"c":1e300}},'
    '"source":"crm","timestamp":253402300799,"version":"2024.05.12-1","scope":"global_writable"}',
    "unknown-field": '{"id":"a","type":"message","content":null,"source":"s","timestamp":1,"version":"1",'
    '"scope":"global_writable","ttl":5}',
    "session-null": '{"id":"a","type":"message","content":"hi","source":"s","timestamp":1,"version":"1",'
    '"scope":"global_readonly","session_id":null}',
    "unknown-type": '{"id":"a","type":"legal_clause","content":[],"source":"s","timestamp":1,"version":"1",'
    '"scope":"global_readonly"}',
    "bad-scope": '{"id":"a","type":"message","content":{},"source":"s","timestamp":-1,"version":"1",'
    '"scope":"Session"}',
}
for name, text in items.items():
    write("item_json", name, text)

# time_range: start and end on two lines.
ranges = {
    "day": "2024-05-10T00:00:00Z\n2024-05-12T23:59:59Z",
    "lowercase-fraction": "2024-05-10t00:00:00.999z\n2024-05-10T00:00:00.1Z",
    "bounds": "0000-01-01T00:00:00Z\n9999-12-31T23:59:59Z",
    "leap-day": "2024-02-29T12:00:00Z\n2024-02-29T12:00:00Z",
    "offset": "2024-05-10T00:00:00+08:00\n2024-05-12T23:59:59Z",
    "impossible": "2023-02-29T25:00:00Z\n2024-05-12T23:59:59Z",
    "reversed": "2024-05-12T00:00:00Z\n2024-05-10T00:00:00Z",
}
for name, text in ranges.items():
    write("time_range", name, text)
