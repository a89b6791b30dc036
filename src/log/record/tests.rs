//! Tests of the frame and record codec: tags, round trips of every record kind, sync marks,
//! compression, the JSON written from a put record, and damaged or short frames refused.

use super::kinds::ScopeTag;
use super::*;
use crate::item::{Scope, TypeSpec};

#[test]
fn tags_parse_from_their_byte_and_nothing_else_does() {
    for byte in 0..=u8::MAX {
        match RecordTag::try_from(byte) {
            Ok(tag) => assert_eq!(tag as u8, byte),
            Err(e) => {
                assert!(!(1..=7).contains(&byte), "{byte}");
                assert_eq!(e.0, format!("unknown record tag {byte}"));
            }
        }
        match ScopeTag::try_from(byte) {
            Ok(tag) => assert_eq!(tag as u8, byte),
            Err(e) => assert!(byte > 2 && e.0 == format!("unknown scope tag {byte}"), "{byte}"),
        }
    }
}

fn sample_put<'a>(scope: &'a Scope, hash: &'a [u8; 32]) -> PutRef<'a> {
    PutRef {
        id: "ch3",
        kind: "document_chunk",
        version: "1",
        scope,
        source: "crm",
        timestamp: 1_700_000_000,
        ttl_seconds: Some(60),
        confidence: Some(0.5),
        hash,
        content: br#"{"a":1}"#,
        compress: true,
    }
}

#[test]
fn the_sync_mark_is_set_with_the_sequence_number() {
    let scope = Scope::GlobalWritable;
    let hash = [1u8; 32];
    let mut enc = BatchEncoder::new();
    assert!(enc.is_empty(), "a sync mark alone is an empty batch");
    enc.put(&sample_put(&scope, &hash));
    assert!(!enc.is_empty());
    let mut frame = enc.finish(0).unwrap();
    set_frame_header(&mut frame, 77, 4_096, 1_715_335_300);
    let (header, payload) = read_frame(&frame).unwrap();
    assert_eq!(header.seq, 77);
    assert_eq!(frame_sync_mark(payload), Some(4_096));
    let records = decode_batch(payload).unwrap();
    assert_eq!(
        records[0].2,
        RecordView::SyncMark {
            synced: 4_096,
            committed_at: Some(1_715_335_300),
            altered: false
        }
    );
    assert!(matches!(records[1].2, RecordView::Put(_)));
    check_frame_format(3, &records).unwrap();
    assert!(
        check_frame_format(2, &records).is_err(),
        "a format 3 mark in a format 2 segment"
    );
    // A frame of segment format 1 starts with its first operation's record: no mark.
    let mut old = frame.clone();
    let count = u32::from_le_bytes(old[17..21].try_into().unwrap()) - 1;
    old.drain(21..21 + RECORD_HEADER_BYTES + 17);
    old[17..21].copy_from_slice(&count.to_le_bytes());
    let len = u32::try_from(old.len() - FRAME_HEADER_BYTES).unwrap();
    old[0..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&old[8..]);
    old[4..8].copy_from_slice(&crc.to_le_bytes());
    let (_, payload) = read_frame(&old).unwrap();
    assert_eq!(frame_sync_mark(payload), None);
    let records = decode_batch(payload).unwrap();
    assert_eq!(records.len(), 1);
    check_frame_format(1, &records).unwrap();
    assert!(
        check_frame_format(3, &records).is_err(),
        "a format 3 frame without its mark"
    );
}

#[test]
fn a_frame_finished_unsealed_is_the_same_frame_once_its_header_is_set() {
    let scope = Scope::Session("s1".into());
    let hash = [3u8; 32];
    let encoder = || {
        let mut enc = BatchEncoder::new();
        enc.put(&sample_put(&scope, &hash));
        enc.delete("gone", Some(("message", ScopeView::from(&scope))));
        enc
    };
    let mut sealed = encoder().finish(5).unwrap();
    let mut unsealed = encoder().finish_unsealed().unwrap();
    assert_eq!(sealed.len(), unsealed.len());
    assert!(read_frame(&unsealed).is_err(), "no CRC yet: not a frame");
    set_frame_header(&mut sealed, 77, 4_096, 9);
    set_frame_header(&mut unsealed, 77, 4_096, 9);
    assert_eq!(sealed, unsealed);
    let (header, payload) = read_frame(&unsealed).unwrap();
    assert_eq!(header.seq, 77);
    assert_eq!(decode_batch(payload).unwrap().len(), 3);
}

#[test]
fn a_put_whose_timestamp_is_out_of_range_is_refused() {
    // Adds never store such a timestamp: only damage or a forged record carries one, and the
    // index, which keeps timestamps in 40 bits, must never see it.
    let scope = Scope::GlobalWritable;
    let hash = [2u8; 32];
    for (timestamp, ok) in [
        (0, true),
        (crate::limits::TIMESTAMP_MAX, true),
        (-1, false),
        (crate::limits::TIMESTAMP_MAX + 1, false),
        (i64::MIN, false),
        (i64::MAX, false),
    ] {
        let mut put = sample_put(&scope, &hash);
        put.timestamp = timestamp;
        let mut enc = BatchEncoder::new();
        enc.put(&put);
        let frame = enc.finish(1).unwrap();
        let (_, payload) = read_frame(&frame).unwrap();
        match decode_batch(payload) {
            Ok(records) if ok => {
                let RecordView::Put(view) = &records[1].2 else {
                    panic!("not a put")
                };
                assert_eq!(view.timestamp, timestamp);
            }
            Err(e) if !ok => assert!(e.0.contains("timestamp"), "{timestamp}: {e:?}"),
            other => panic!("timestamp {timestamp}: {other:?}"),
        }
    }
}

#[test]
fn batch_roundtrips() {
    let scope = Scope::Session("s1".into());
    let hash = [7u8; 32];
    let mut enc = BatchEncoder::new();
    let put_at = enc.put(&sample_put(&scope, &hash));
    let del_at = enc.delete("old", Some(("message", ScopeView::from(&scope))));
    let spec = TypeSpec::new("legal_clause").id_pattern("^cl_");
    enc.register_type(&spec);
    enc.retired("gone", "7", &[3u8; 32], "tool_result", ScopeView::GlobalReadonly);
    enc.pin("audit", 41, -5, Some("s1"));
    enc.pin("all", 40, 9, None);
    enc.unpin("audit");
    let frame = enc.finish(42).unwrap();
    let (header, payload) = read_frame(&frame).unwrap();
    assert_eq!(header.seq, 42);
    assert_eq!(header.len as usize, frame.len() - FRAME_HEADER_BYTES);
    let all = decode_batch(payload).unwrap();
    assert_eq!(all.len(), 8);
    assert_eq!(
        all[0].2,
        RecordView::SyncMark {
            synced: 0,
            committed_at: Some(0),
            altered: false
        },
        "every frame starts with its sync mark"
    );
    let records = &all[1..];
    assert_eq!(
        records[3].2,
        RecordView::Retired {
            hash: [3u8; 32],
            id: "gone",
            version: "7",
            kind: Some("tool_result"),
            scope: Some(ScopeView::GlobalReadonly),
        }
    );
    assert_eq!(
        records[4].2,
        RecordView::Pin {
            name: "audit",
            seq: 41,
            taken_at: -5,
            session: Some("s1")
        }
    );
    assert_eq!(
        records[5].2,
        RecordView::Pin {
            name: "all",
            seq: 40,
            taken_at: 9,
            session: None
        }
    );
    assert_eq!(records[6].2, RecordView::Unpin { name: "audit" });
    // A record copied whole decodes the same in another frame.
    let (start, len, _) = records[3];
    let mut copy = BatchEncoder::new();
    copy.raw(&payload[start..start + len]);
    let copied = copy.finish(43).unwrap();
    let (_, copied_payload) = read_frame(&copied).unwrap();
    assert_eq!(decode_batch(copied_payload).unwrap()[1].2, records[3].2);
    assert_eq!(records[0].0 + FRAME_HEADER_BYTES, put_at);
    assert_eq!(records[1].0 + FRAME_HEADER_BYTES, del_at);
    match &records[0].2 {
        RecordView::Put(p) => {
            assert_eq!(p.id, "ch3");
            assert_eq!(p.scope, ScopeView::Session("s1"));
            assert_eq!(p.ttl_seconds, Some(60));
            assert_eq!(p.confidence, Some(0.5));
            assert_eq!(p.content, br#"{"a":1}"#);
            assert_eq!(p.expires_at(), Some(1_700_000_060));
        }
        other => panic!("expected a put, got {other:?}"),
    }
    assert_eq!(
        records[1].2,
        RecordView::Delete {
            id: "old",
            scope: Some(ScopeView::Session("s1")),
            kind: Some("message"),
        }
    );
    assert_eq!(
        records[2].2,
        RecordView::RegisterType {
            name: "legal_clause",
            pattern: Some("^cl_")
        }
    );
    // The record at its location decodes alone too.
    let (start, len, _) = records[0];
    let at = FRAME_HEADER_BYTES + start;
    assert!(matches!(decode_record(&frame[at..at + len]), Ok(RecordView::Put(_))));
}

#[test]
fn every_flipped_bit_of_a_frame_is_refused() {
    let scope = Scope::GlobalReadonly;
    let hash = [1u8; 32];
    let mut enc = BatchEncoder::new();
    enc.put(&sample_put(&scope, &hash));
    let frame = enc.finish(1).unwrap();
    for bit in 0..frame.len() * 8 {
        let mut damaged = frame.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        assert!(read_frame(&damaged).is_err(), "flip of bit {bit} went unnoticed");
    }
}

#[test]
fn short_frames_are_short() {
    let mut enc = BatchEncoder::new();
    enc.delete("x", Some(("message", ScopeView::GlobalReadonly)));
    let frame = enc.finish(9).unwrap();
    for cut in 0..frame.len() {
        assert_eq!(read_frame(&frame[..cut]), Err(FrameError::Short), "cut at {cut}");
    }
}

#[test]
fn long_repetitive_content_is_stored_compressed_and_reads_back() {
    let scope = Scope::GlobalWritable;
    let hash = [2u8; 32];
    let content = format!("{{\"text\":\"{}\"}}", "the same words again and again ".repeat(40));
    let mut put = sample_put(&scope, &hash);
    put.content = content.as_bytes();
    let mut enc = BatchEncoder::new();
    enc.put(&put);
    let frame = enc.finish(1).unwrap();
    assert!(
        frame.len() < content.len() / 2,
        "{} bytes for {} of content",
        frame.len(),
        content.len()
    );
    let (_, payload) = read_frame(&frame).unwrap();
    let records = decode_batch(payload).unwrap();
    let RecordView::Put(view) = &records[1].2 else {
        panic!("not a put")
    };
    assert!(view.compressed);
    assert_eq!(&*view.content().unwrap(), content.as_bytes());
    // Short content is stored as it is.
    let mut enc = BatchEncoder::new();
    enc.put(&sample_put(&scope, &hash));
    let frame = enc.finish(2).unwrap();
    let (_, payload) = read_frame(&frame).unwrap();
    let RecordView::Put(view) = &decode_batch(payload).unwrap()[1].2 else {
        panic!("not a put")
    };
    assert!(!view.compressed);
}

#[test]
fn compressed_content_never_claims_more_than_the_limit() {
    let mut field = u32::MAX.to_le_bytes().to_vec();
    field.extend_from_slice(&[0x10, 0x61]);
    let scope = Scope::GlobalWritable;
    let hash = [0u8; 32];
    let put = sample_put(&scope, &hash);
    let view = PutView {
        id: put.id,
        kind: put.kind,
        version: put.version,
        scope: ScopeView::GlobalWritable,
        source: put.source,
        timestamp: 0,
        ttl_seconds: None,
        confidence: None,
        hash,
        content: &field,
        compressed: true,
    };
    assert!(view.content().is_err());
    assert!(view.to_item().is_err());
}

/// The JSON of a put record, written from its fields and its canonical content.
fn raw_json(view: &PutView<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    view.write_json_head(&mut out);
    view.append_content(&mut out).unwrap();
    view.write_json_tail(&mut out);
    out
}

#[test]
fn raw_json_is_what_serde_json_writes_for_the_item() {
    let long = format!("{{\"text\":\"{}\"}}", "words é 中 \\\" again ".repeat(20));
    let scopes = [
        Scope::Session("s\"1".into()),
        Scope::GlobalReadonly,
        Scope::GlobalWritable,
    ];
    for (n, scope) in scopes.iter().enumerate() {
        for content in [&br#"[1,-0.0,1e-7,"\u0001"]"#[..], long.as_bytes()] {
            let hash = [u8::try_from(n).unwrap(); 32];
            let mut put = sample_put(scope, &hash);
            put.content = content;
            put.source = "a \"source\" \\ é";
            if n == 1 {
                put.ttl_seconds = None;
                put.confidence = Some(1.0 / 3.0);
            }
            if n == 2 {
                put.confidence = None;
                put.timestamp = 0;
            }
            let mut enc = BatchEncoder::new();
            enc.put(&put);
            let frame = enc.finish(1).unwrap();
            let (_, payload) = read_frame(&frame).unwrap();
            let RecordView::Put(view) = &decode_batch(payload).unwrap()[1].2 else {
                panic!("not a put")
            };
            assert_eq!(view.compressed, content.len() > 100, "{n}");
            let item = view.to_item().unwrap();
            assert_eq!(raw_json(view), serde_json::to_vec(&item).unwrap(), "scope {n}");
            assert!(raw_json(view).len() <= view.json_envelope_len() + view.content_len() + 16);
            assert_eq!(view.content_len(), content.len());
            let mut scratch = b"stale".to_vec();
            assert_eq!(view.content_in(&mut scratch).unwrap(), content);
        }
    }
}

#[test]
fn appending_damaged_compressed_content_leaves_the_output_as_it_was() {
    let scope = Scope::GlobalWritable;
    let hash = [0u8; 32];
    let content = "the same words again and again ".repeat(40);
    let block = lz4_flex::block::compress(content.as_bytes());
    for field in [
        // A length over the limit, one shorter and one longer than the block gives, a cut block.
        [&u32::MAX.to_le_bytes()[..], &block].concat(),
        [&u32::try_from(content.len() - 1).unwrap().to_le_bytes()[..], &block].concat(),
        [&u32::try_from(content.len() + 1).unwrap().to_le_bytes()[..], &block].concat(),
        [
            &u32::try_from(content.len()).unwrap().to_le_bytes()[..],
            &block[..block.len() / 2],
        ]
        .concat(),
        vec![1, 2],
    ] {
        let put = sample_put(&scope, &hash);
        let view = PutView {
            id: put.id,
            kind: put.kind,
            version: put.version,
            scope: ScopeView::GlobalWritable,
            source: put.source,
            timestamp: 0,
            ttl_seconds: None,
            confidence: None,
            hash,
            content: &field,
            compressed: true,
        };
        let mut out = b"kept".to_vec();
        assert!(view.append_content(&mut out).is_err());
        assert_eq!(out, b"kept");
    }
}

#[test]
fn absurd_counts_do_not_allocate() {
    let mut payload = u32::MAX.to_le_bytes().to_vec();
    payload.extend_from_slice(&[0; 16]);
    assert!(decode_batch(&payload).is_err());
}

/// The frame of `enc`, finished with sequence number 1.
fn frame_records(enc: BatchEncoder) -> Vec<u8> {
    enc.finish(1).unwrap()
}

/// A record (header and body) whose body is `body`, with its CRC.
fn record_of(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut record = vec![tag];
    record.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    record.extend_from_slice(body);
    record
}

#[test]
fn sync_marks_of_both_formats_decode_by_their_length() {
    // Format 2: `synced` alone, 8 bytes.
    let mut v2 = frame_records(BatchEncoder::for_format(2));
    set_frame_header(&mut v2, 4, 0x222, 1_715_335_300);
    let (_, payload) = read_frame(&v2).unwrap();
    let mark = &payload[4..];
    assert_eq!(mark.len(), RECORD_HEADER_BYTES + 8, "a format 2 mark is 8 bytes");
    assert_eq!(
        decode_record(mark).unwrap(),
        RecordView::SyncMark {
            synced: 0x222,
            committed_at: None,
            altered: false
        },
        "a format 2 mark has no commit time, and setting one leaves it as it is"
    );
    assert_eq!(frame_sync_mark(payload), Some(0x222));
    assert_eq!(
        BatchEncoder::for_format(1).len(),
        v2.len(),
        "a format 1 segment is rewritten in format 2"
    );

    // Format 3: `synced`, `committed_at`, `flags`, 17 bytes; the flags set by compaction survive the
    // header being set.
    let mut enc = BatchEncoder::for_format(3);
    enc.set_mark(-7, true);
    let mut v3 = frame_records(enc);
    set_frame_header(&mut v3, 4, 0x222, 1_715_335_300);
    let (_, payload) = read_frame(&v3).unwrap();
    let mark = &payload[4..];
    assert_eq!(mark.len(), RECORD_HEADER_BYTES + 17, "a format 3 mark is 17 bytes");
    assert_eq!(mark[RECORD_HEADER_BYTES + 16], 1, "flags: altered");
    assert_eq!(
        decode_record(mark).unwrap(),
        RecordView::SyncMark {
            synced: 0x222,
            committed_at: Some(1_715_335_300),
            altered: true
        }
    );
    assert_eq!(frame_sync_mark(payload), Some(0x222));
    let mut enc = BatchEncoder::new();
    enc.set_mark(1_715_335_300, false);
    let frame = frame_records(enc);
    let (_, payload) = read_frame(&frame).unwrap();
    assert_eq!(
        decode_batch(payload).unwrap()[0].2,
        RecordView::SyncMark {
            synced: 0,
            committed_at: Some(1_715_335_300),
            altered: false
        }
    );
    // A format 2 encoder keeps its 8-byte mark whatever it is told.
    let mut enc = BatchEncoder::for_format(2);
    enc.set_mark(5, true);
    assert_eq!(enc.len(), BatchEncoder::for_format(2).len());

    // Any other length is refused: the body is read by its length, not up to it.
    let mut body = 0x222u64.to_le_bytes().to_vec();
    body.extend_from_slice(&1_715_335_300i64.to_le_bytes());
    body.push(0);
    for len in [0, 7, 9, 16, 18] {
        let mut long = body.clone();
        long.resize(len, 0);
        let refused = decode_record(&record_of(7, &long)).expect_err("another length");
        assert!(
            refused.0.contains("sync mark") || refused.0.contains("past the end"),
            "{len}: {refused:?}"
        );
    }
    assert!(decode_record(&record_of(7, &body)).is_ok());
}

#[test]
fn a_sync_mark_with_an_unknown_flag_bit_is_refused() {
    let mut body = 0u64.to_le_bytes().to_vec();
    body.extend_from_slice(&1_715_335_300i64.to_le_bytes());
    for flags in 0..=u8::MAX {
        let mut marked = body.clone();
        marked.push(flags);
        match decode_record(&record_of(7, &marked)) {
            Ok(RecordView::SyncMark { altered, .. }) => {
                assert!(flags <= 1, "flags {flags:#04x} taken");
                assert_eq!(altered, flags == 1);
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                assert!(flags > 1, "flags {flags:#04x} refused: {e:?}");
                assert_eq!(e.0, format!("unknown sync mark flags {flags:#04x}"));
            }
        }
    }
}

#[test]
fn deletes_of_both_formats_decode() {
    // Formats 1 and 2: the id alone.
    assert_eq!(
        decode_record(&record_of(2, b"\x04gone")).unwrap(),
        RecordView::Delete {
            id: "gone",
            scope: None,
            kind: None,
        }
    );
    // Format 3: the id, then the scope of the version it ended, as a put stores it, and its type.
    for (view, body) in [
        (ScopeView::Session("s1"), &b"\x04gone\x00\x02s1\x07message"[..]),
        (ScopeView::GlobalReadonly, &b"\x04gone\x01\x00\x07message"[..]),
        (ScopeView::GlobalWritable, &b"\x04gone\x02\x00\x07message"[..]),
    ] {
        let expected = RecordView::Delete {
            id: "gone",
            scope: Some(view),
            kind: Some("message"),
        };
        assert_eq!(decode_record(&record_of(2, body)).unwrap(), expected);
        let mut enc = BatchEncoder::new();
        let at = enc.delete("gone", Some(("message", view)));
        let frame = enc.finish(1).unwrap();
        assert_eq!(&frame[at..], &record_of(2, body)[..], "{view:?}");
        // A format 2 frame gives the id alone.
        let mut enc = BatchEncoder::for_format(2);
        let at = enc.delete("gone", Some(("message", view)));
        assert_eq!(&enc.finish(1).unwrap()[at..], &record_of(2, b"\x04gone")[..]);
    }
    // Format 3, the type and scope unknown (the version was retired by a format 1 or 2 record):
    // scope byte 3, an empty session id and type. It decodes as the old form does.
    let unknown = &b"\x04gone\x03\x00\x00"[..];
    assert_eq!(
        decode_record(&record_of(2, unknown)).unwrap(),
        RecordView::Delete {
            id: "gone",
            scope: None,
            kind: None,
        }
    );
    let mut enc = BatchEncoder::new();
    let at = enc.delete("gone", None);
    assert_eq!(&enc.finish(1).unwrap()[at..], &record_of(2, unknown)[..]);
    let mut enc = BatchEncoder::for_format(2);
    let at = enc.delete("gone", None);
    assert_eq!(&enc.finish(1).unwrap()[at..], &record_of(2, b"\x04gone")[..]);
    // Refused: an unknown scope tag, a session id on a global scope, a session or a type with the
    // unknown scope, a cut or overlong body.
    for (body, why) in [
        (&b"\x04gone\x04\x00\x00"[..], "unknown scope tag 4"),
        (
            &b"\x04gone\x01\x02s1\x07message"[..],
            "session id stored on a global scope",
        ),
        (&b"\x04gone\x03\x02s1\x00"[..], "a delete of an unknown scope"),
        (&b"\x04gone\x03\x00\x07message"[..], "a delete of an unknown scope"),
        (&b"\x04gone\x00"[..], "session length"),
        (&b"\x04gone\x00\x02s"[..], "session_id"),
        (&b"\x04gone\x00\x02s1"[..], "type length"),
        (&b"\x04gone\x02\x00"[..], "type length"),
        (&b"\x04gone\x02\x00\x07mess"[..], "type"),
        (&b"\x04gone\x02\x00\x07message\x00"[..], "bytes after the end"),
        (&b"\x04gone\x03\x00\x00\x00"[..], "bytes after the end"),
    ] {
        let refused = decode_record(&record_of(2, body)).expect_err(why);
        assert!(refused.0.contains(why), "{body:?}: {refused:?}");
    }
}

#[test]
fn retired_records_of_both_formats_decode() {
    let hash = [9u8; 32];
    let body = |tail: &[u8]| {
        let mut body = hash.to_vec();
        body.extend_from_slice(b"\x04gone\x017");
        body.extend_from_slice(tail);
        body
    };
    // Formats 1 and 2: hash, id and version.
    let old = body(b"");
    assert_eq!(
        decode_record(&record_of(4, &old)).unwrap(),
        RecordView::Retired {
            hash,
            id: "gone",
            version: "7",
            kind: None,
            scope: None,
        }
    );
    // Format 3: then the type and the scope of the version it replaces.
    for (view, tail) in [
        (ScopeView::Session("s1"), &b"\x07message\x00\x02s1"[..]),
        (ScopeView::GlobalReadonly, &b"\x07message\x01\x00"[..]),
        (ScopeView::GlobalWritable, &b"\x07message\x02\x00"[..]),
    ] {
        let long = body(tail);
        assert_eq!(
            decode_record(&record_of(4, &long)).unwrap(),
            RecordView::Retired {
                hash,
                id: "gone",
                version: "7",
                kind: Some("message"),
                scope: Some(view),
            }
        );
        let mut enc = BatchEncoder::new();
        let at = enc.retired("gone", "7", &hash, "message", view);
        assert_eq!(&enc.finish(1).unwrap()[at..], &record_of(4, &long)[..], "{view:?}");
        // A format 2 frame keeps the old body.
        let mut enc = BatchEncoder::for_format(2);
        let at = enc.retired("gone", "7", &hash, "message", view);
        assert_eq!(&enc.finish(1).unwrap()[at..], &record_of(4, &old)[..], "{view:?}");
    }
    // Refused: the unknown scope (only a delete has it), a session id on a global scope, a cut or
    // overlong body.
    for (tail, why) in [
        (&b"\x07message\x03\x00"[..], "unknown scope tag 3"),
        (&b"\x07message\x02\x02s1"[..], "session id stored on a global scope"),
        (&b"\x07message"[..], "scope"),
        (&b"\x07mess"[..], "type"),
        (&b"\x07message\x00"[..], "session length"),
        (&b"\x07message\x02\x00\x00"[..], "bytes after the end"),
    ] {
        let refused = decode_record(&record_of(4, &body(tail))).expect_err(why);
        assert!(refused.0.contains(why), "{tail:?}: {refused:?}");
    }
}

#[test]
fn a_frame_holds_deletes_and_retired_records_of_its_segments_format_only() {
    // The records of a frame of format `version` (its sync mark of that format) after `records`.
    let frame_of = |version: u32, records: &[Vec<u8>]| {
        let mut enc = BatchEncoder::for_format(version);
        for record in records {
            enc.raw(record);
        }
        enc.finish(1).unwrap()
    };
    let check = |version: u32, records: &[Vec<u8>]| {
        let frame = frame_of(version, records);
        let (_, payload) = read_frame(&frame).unwrap();
        let decoded = decode_batch(payload).unwrap();
        check_frame_format(version, &decoded)
    };
    let mut retired_v3 = [9u8; 32].to_vec();
    retired_v3.extend_from_slice(b"\x04gone\x017\x07message\x02\x00");
    let retired_v2 = retired_v3[..32 + 7].to_vec();
    let delete_v3 = record_of(2, b"\x04gone\x02\x00\x07message");
    let delete_unknown = record_of(2, b"\x04gone\x03\x00\x00");
    let delete_v2 = record_of(2, b"\x04gone");
    let (retired_v3, retired_v2) = (record_of(4, &retired_v3), record_of(4, &retired_v2));
    for version in [1, 2, 3] {
        // The unknown scope is of format 3 too.
        let (fits, other) = if version == 3 {
            (
                vec![&delete_v3, &delete_unknown, &retired_v3],
                vec![&delete_v2, &retired_v2],
            )
        } else {
            (
                vec![&delete_v2, &retired_v2],
                vec![&delete_v3, &delete_unknown, &retired_v3],
            )
        };
        let fits: Vec<Vec<u8>> = fits.into_iter().cloned().collect();
        check(version, &fits).unwrap_or_else(|e| panic!("format {version}: {e:?}"));
        for record in other {
            let mut records = fits.clone();
            records.push(record.clone());
            let refused = check(version, &records).expect_err("a record of another format");
            assert!(
                refused
                    .0
                    .starts_with(&format!("a frame of segment format {version} holds a")),
                "{refused:?}"
            );
        }
    }
}
