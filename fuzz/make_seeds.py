#!/usr/bin/env python3
"""Writes the committed seed inputs of every fuzz target into fuzz/seeds/<target>/.

Binary seeds are cut from the golden stores in tests/fixtures/ (format-v1, format-v2, format-v3,
format-v2-compacted and format-v3-compacted); text seeds are written out here. Run from anywhere:
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
plain3 = read("format-v3", "00000001.seg")
v2_compacted1 = read("format-v2-compacted", "00000001.seg")
v2_compacted2 = read("format-v2-compacted", "00000002.seg")
compacted1 = read("format-v3-compacted", "00000001.seg")
compacted2 = read("format-v3-compacted", "00000002.seg")
checkpoint = read("format-v3-compacted", "checkpoint-00000000000000000012.idx")

# decode_frame: every frame of the golden stores (format 1 has no sync marks, format 2 has 8-byte
# ones, format 3 17-byte ones; compaction marks format 3 frames it altered; the compacted store's
# second segment holds the delete of an id whose latest version is retired).
for store, segment in (
    ("v1", plain),
    ("v2", plain2),
    ("v3", plain3),
    ("v2-compacted", v2_compacted1),
    ("compacted", compacted1),
    ("compacted-active", compacted2),
):
    for i, frame in enumerate(frames(segment)):
        write("decode_frame", f"{store}-frame-{i}", frame)

# scan_segment: the segment files, and a torn tail.
write("scan_segment", "v1-00000001.seg", plain)
write("scan_segment", "v1-torn-tail.seg", plain[:-7])
write("scan_segment", "v2-00000001.seg", plain2)
write("scan_segment", "v2-torn-tail.seg", plain2[:-7])
write("scan_segment", "v3-00000001.seg", plain3)
write("scan_segment", "v3-torn-tail.seg", plain3[:-7])
write("scan_segment", "v2-compacted-00000001.seg", v2_compacted1)
write("scan_segment", "compacted-00000001.seg", compacted1)
write("scan_segment", "compacted-00000002.seg", compacted2)

# decode_checkpoint: the golden checkpoint (of the format this build reads).
write("decode_checkpoint", "compacted-checkpoint-12.idx", checkpoint)

# recovery: a flags byte (bit 0: reseal CRCs), then the files, each starting with its magic.
write("recovery", "v1", b"\x00" + plain)
write("recovery", "v1-sealed", b"\x01" + plain)
write("recovery", "v1-torn-tail", b"\x00" + plain[:-7])
write("recovery", "v2", b"\x00" + plain2)
write("recovery", "v2-torn-tail", b"\x00" + plain2[:-7])
write("recovery", "v3", b"\x00" + plain3)
write("recovery", "v3-torn-tail", b"\x00" + plain3[:-7])
write("recovery", "compacted-with-checkpoint", b"\x00" + compacted1 + compacted2 + checkpoint)
write("recovery", "compacted-no-checkpoint", b"\x01" + compacted1 + compacted2)
# A segment of its header alone (the compacted store's second one before its first frame).
write("recovery", "empty-segment", b"\x00" + compacted2[:HEADER])

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


# stateful: store operations (see src/testing/stateful/ops.rs for the encoding). The first byte picks the
# durability (bit 0: Immediate or Never) and compression (bit 1: Options::compress_content); each
# operation is an opcode byte (mod 20) and its arguments.
VIEW = {None: 0, "s1": 4, "s2": 5}
READ_VIEW = {None: 0, "s1": 2, "s2": 3, "s3": 4}
IDS = "abcdef"
PINS = ["p1", "p2", "p3"]


def item(id, version="1", content=None, kind=0, source=0, scope=2, ttl=None, confidence=None, at=6):
    """One item: id in a..f, version "1".."3", content None (usual) or 0..5 (pool), kind 0..2,
    source 0..1, scope 0..3 (s1, s2, global_readonly, global_writable), ttl 1..12, confidence
    index 0..3, timestamp START - 6 + at."""
    identity = IDS.index(id) + 6 * (int(version) - 1) + 18 * (0 if content is None else 8 + content)
    labels = kind + 3 * source + 6 * scope
    for extras in range(256):
        if (extras & 0x80 != 0) != (ttl is not None):
            continue
        if ttl is not None and 1 + extras % 12 != ttl:
            continue
        c = (extras >> 4) & 7
        if (c if c < 4 else None) != confidence:
            continue
        break
    else:
        raise ValueError("no extras byte")
    return bytes([identity, labels, extras, at])


def add(*items, view=None):
    return bytes([0, VIEW[view], len(items) - 1]) + b"".join(items)


def ref(id, version=None):
    return IDS.index(id) + 6 * (0 if version is None else int(version))


def refs(*rs):
    return bytes([len(rs) - 1] + [ref(*r) if isinstance(r, tuple) else ref(r) for r in rs])


ALL = 0  # a query without filters


def get(view=None, flags=ALL, *args):
    return bytes([5, READ_VIEW[view], flags, *args])


def resolve(*rs, view=None):
    return bytes([6, READ_VIEW[view]]) + refs(*rs)


def delete(id):
    return bytes([4, IDS.index(id)])


def snapshot(view=None):
    return bytes([7, READ_VIEW[view]])


def read_snap(n, *rs):
    return bytes([8, n, ALL]) + refs(*rs)


def advance(secs):
    return bytes([9, secs])


COMPACT, FLUSH, REOPEN = bytes([10]), bytes([14]), bytes([15])


def pin(name, view=None):
    return bytes([11, PINS.index(name), READ_VIEW[view]])


def unpin(name):
    return bytes([12, PINS.index(name)])


def open_pinned(name, *rs):
    return bytes([13, PINS.index(name), ALL]) + refs(*rs)


def crash(seed, recovery_cut=None):
    if recovery_cut is None:
        return bytes([16, seed & 255, seed >> 8, 0])
    after, seed2 = recovery_cut
    return bytes([16, seed & 255, seed >> 8, (after << 1) | 1, seed2 & 255, seed2 >> 8])


def cut_power(after, seed):
    return bytes([17, after, seed & 255, seed >> 8])


def past_at(pick, *rs):
    return bytes([18, pick, ALL]) + refs(*rs)


def past_as_of(pick, *rs):
    return bytes([19, pick, ALL]) + refs(*rs)


IMMEDIATE, NEVER = b"\x00", b"\x01"
# Bit 2 of the first byte: a subscriber follows the change feed through reopens and power cuts.
SUBSCRIBED, NEVER_SUBSCRIBED = b"\x04", b"\x05"
IMMEDIATE_COMPRESSED, NEVER_COMPRESSED = b"\x02", b"\x03"
# Content 4 of the pool is long and repetitive: stored compressed under compression.
packed = [add(item(IDS[n % 6], str(1 + n // 6 % 3), content=4, ttl=2 if n % 2 else None), item(IDS[(n + 1) % 6], "1"))
          for n in range(12)]
fill = [add(item(IDS[n % 6], str(1 + n // 6 % 3), ttl=2 if n % 2 else None), item(IDS[(n + 1) % 6], "1"))
        for n in range(12)]
stateful = {
    "immediate-basics": IMMEDIATE + add(item("a"), item("b", kind=1, confidence=2)) + get()
    + resolve("a", ("a", "1"), ("b", "2")) + add(item("a", "2", scope=3)) + resolve(("a", "1"))
    + delete("b") + get() + REOPEN + resolve("a", "b") + add(item("a", "2", content=0)),
    "sessions": IMMEDIATE + add(item("a", scope=0), view="s1") + add(item("b", scope=1), view="s1")
    + add(item("c", scope=1), item("d", scope=3), view="s2") + get("s1") + get("s2") + get("s3")
    + resolve("a", "c", view="s2") + snapshot("s1") + delete("a") + read_snap(0, "a", "c"),
    "rotate-expire-compact": IMMEDIATE + b"".join(fill) + advance(6) + snapshot() + COMPACT
    + resolve("a", "b", "c") + read_snap(0, "a", "b") + crash(7) + COMPACT + resolve("a", "b", "c"),
    "pins": IMMEDIATE + b"".join(fill[:6]) + pin("p1") + add(item("a", "3", ttl=1)) + pin("p2", view="s1")
    + advance(6) + COMPACT + open_pinned("p1", "a", ("a", "1")) + REOPEN + open_pinned("p2", "a")
    + unpin("p1") + COMPACT + pin("p2") + crash(3),
    "never-flush-crash": NEVER + add(item("a"), item("b")) + FLUSH + add(item("c")) + add(item("a", "2"))
    + delete("b") + crash(1) + get() + b"".join(fill[:8]) + FLUSH + add(item("f", "3")) + crash(2, (20, 5)),
    "cut-in-add": IMMEDIATE + add(item("a")) + cut_power(1, 9) + add(item("b"), item("c")) + get()
    + cut_power(3, 4) + add(item("d")) + resolve("b", "c", "d"),
    "cut-in-compact": IMMEDIATE + b"".join(fill) + advance(6) + cut_power(12, 2) + COMPACT + resolve("a", "b")
    + COMPACT,
    "never-cut-in-compact": NEVER + b"".join(fill) + advance(6) + add(item("a", "3")) + cut_power(9, 6) + COMPACT
    + get(),
    "cut-in-reopen": NEVER + b"".join(fill[:5]) + cut_power(4, 11) + REOPEN + get(),
    "rotate-crash": IMMEDIATE + b"".join(fill[:8]) + crash(1) + b"".join(fill[8:]) + crash(2) + COMPACT + crash(3),
    "compressed-rotate-compact": IMMEDIATE_COMPRESSED + b"".join(packed) + pin("p1") + advance(6) + COMPACT
    + resolve("a", "b", "c") + open_pinned("p1", "a", ("a", "1")) + REOPEN + resolve("a", "b") + crash(5),
    "past-views": IMMEDIATE + b"".join(fill[:4]) + advance(2) + b"".join(fill[4:8])
    + past_at(1, "a", ("a", "1")) + past_as_of(5, "a", "b") + advance(6) + COMPACT + past_at(0, "a")
    + past_as_of(3, "a") + REOPEN + past_at(2, "a", "b") + crash(4) + b"".join(fill[8:10]) + past_at(1, "a"),
    "never-past-views": NEVER + b"".join(fill[:6]) + past_at(3, "a") + FLUSH + past_as_of(2, "b") + crash(3)
    + b"".join(fill[6:9]) + past_at(0, "a") + past_as_of(1, "a", ("b", "1")),
    "subscriber": SUBSCRIBED + b"".join(fill[:6]) + delete("a") + REOPEN + b"".join(fill[6:9]) + crash(2)
    + advance(6) + COMPACT + REOPEN + add(item("a", "3")) + cut_power(3, 4) + add(item("b", "3")) + REOPEN,
    "never-subscriber": NEVER_SUBSCRIBED + b"".join(fill[:5]) + REOPEN + b"".join(fill[5:8]) + crash(6)
    + add(item("c", "3")) + FLUSH + add(item("d", "3")) + crash(1) + REOPEN,
    "never-compressed-cut-in-compact": NEVER_COMPRESSED + b"".join(packed) + advance(6)
    + add(item("a", "3", content=4)) + cut_power(9, 6) + COMPACT + get() + resolve("a", ("a", "3")),
}
for name, data in stateful.items():
    write("stateful", name, data)
