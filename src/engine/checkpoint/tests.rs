//! Tests of checkpoints: file names, the round trip of the encoding (buffered and streamed),
//! and files refused for damage or for tables that disagree with each other.

use super::encode::{encode, encode_body, put_names, seal};
use super::stream::{stream, STREAM_STEP};
use super::*;
use crate::index::{IdTable, Location, NAME_CHUNK, SEQ_OPEN};

#[test]
fn names_sort_like_numbers() {
    assert_eq!(checkpoint_file_name(42), "checkpoint-00000000000000000042.idx");
    assert_eq!(
        parse_checkpoint_file_name(&checkpoint_file_name(u64::MAX)),
        Some(u64::MAX)
    );
    assert_eq!(parse_checkpoint_file_name("checkpoint-42.idx"), None);
}

/// Where the test versions are: a record in segment 1.
const HERE: Location = Location {
    segment: 1,
    offset: 32,
    len: 10,
    crc: 0,
};

/// A checkpoint of two ids, "aa" (two versions) and "ab", over segment 1.
fn two_ids() -> (Index, Vec<SegmentMark>) {
    let mut index = Index::default();
    for (seq, id, version) in [(1, "aa", "1"), (2, "aa", "2"), (3, "ab", "1")] {
        index.apply_put(seq, &crate::index::tests::put(id, version, 10), HERE);
    }
    index.seq = 3;
    index.committed_at = 1_715_335_300;
    let marks = vec![SegmentMark {
        number: 1,
        rewrites: 0,
        len: 1000,
    }];
    (index, marks)
}

/// An index of 3,000 versions of 1,500 ids, with deletes and a forgotten version: a body of
/// a few hundred kilobytes, across many name chunks.
fn many_ids() -> (Index, Vec<SegmentMark>) {
    let name = |n: u64| {
        format!(
            "id-{:06}-{}",
            n * 7919 % 1500,
            "x".repeat(usize::try_from(n % 40).unwrap())
        )
    };
    let mut index = Index::default();
    let mut seq = 0;
    for n in 0..1500u64 {
        for version in ["1", "2"] {
            seq += 1;
            index.apply_put(seq, &crate::index::tests::put(&name(n), version, 10), HERE);
        }
    }
    for n in (0..1500u64).step_by(97) {
        seq += 1;
        assert!(index.apply_delete(seq, &name(n)));
    }
    assert!(index.forget(5));
    index.unlink_from_sets(5);
    index.purge_sets();
    index.seq = seq;
    // Unknown: the store's last batch was of a segment format without commit times.
    index.committed_at = 0;
    let marks = (1..=3)
        .map(|number| SegmentMark {
            number,
            rewrites: number - 1,
            len: 1000 * u64::from(number),
        })
        .collect();
    (index, marks)
}

#[test]
fn a_streamed_checkpoint_is_byte_for_byte_the_buffered_one_whatever_its_step() {
    let dir = Path::new("/store");
    for (index, marks) in [two_ids(), many_ids()] {
        let buffered = encode(&index, &marks);
        for step in [1, 7, 4096, STREAM_STEP] {
            let disk = crate::storage::SimDisk::new();
            disk.create_dir_all(dir).expect("dir");
            let tmp = dir.join("streamed.tmp");
            let (len, largest) = stream(&disk, &tmp, &index, &marks, step).expect("streamed");
            let streamed = disk.file_bytes(&tmp).expect("the file is there");
            assert_eq!(len, buffered.len() as u64, "step {step}");
            // A step ends at the first put that reaches it: a row, or at most a chunk of names.
            assert!(
                largest <= step + NAME_CHUNK + 4,
                "step {step}: a write of {largest} bytes"
            );
            if buffered.len() > 2 * (step + NAME_CHUNK + 4) {
                assert!(largest < buffered.len() / 2, "step {step}: written in one piece");
            }
            assert!(
                streamed == buffered,
                "step {step}: the streamed bytes differ from the buffered ones"
            );
            let loaded = decode(&streamed).expect("the streamed checkpoint loads");
            assert_eq!(loaded.seq, index.seq);
            assert_eq!(loaded.index.committed_at, index.committed_at);
            assert_eq!(loaded.segments, marks);
            assert_eq!(loaded.index.id_count(), index.id_count());
        }
    }
}

#[test]
fn the_commit_time_of_the_last_batch_is_in_the_header_after_the_seq() {
    let (mut index, marks) = two_ids();
    for committed_at in [0, 1_715_335_300, -1, i64::MAX] {
        index.committed_at = committed_at;
        let bytes = encode(&index, &marks);
        assert_eq!(CHECKPOINT_HEADER_BYTES, 40);
        assert_eq!(bytes[8..12], 7u32.to_le_bytes(), "format 7");
        assert_eq!(bytes[16..24], 3u64.to_le_bytes(), "seq");
        assert_eq!(bytes[24..32], committed_at.to_le_bytes(), "committed_at");
        let body_len = u64::try_from(bytes.len() - CHECKPOINT_HEADER_BYTES - 4).expect("length");
        assert_eq!(bytes[32..40], body_len.to_le_bytes(), "body length");
        assert_eq!(decode(&bytes).expect("intact").index.committed_at, committed_at);
        assert!(!is_older_format(&bytes));
    }
    // The same checkpoint under format 6's number (intact, its CRC recomputed) is refused as an
    // older format, which is never damage.
    let mut older = encode(&index, &marks);
    older.truncate(older.len() - 4);
    older[8..12].copy_from_slice(&6u32.to_le_bytes());
    let crc = crc32fast::hash(&older);
    older.extend_from_slice(&crc.to_le_bytes());
    let why = decode(&older).err().unwrap_or_default();
    assert!(why.contains("version 6 is not supported"), "{why}");
    assert!(is_older_format(&older));
}

#[test]
fn a_streamed_checkpoint_reports_a_failed_write_and_writes_nothing_after_it() {
    let (index, marks) = many_ids();
    let whole = encode(&index, &marks).len();
    for fault in [crate::storage::Fault::Io, crate::storage::Fault::ShortWrite] {
        let disk = crate::storage::SimDisk::new();
        disk.create_dir_all(Path::new("/store")).expect("dir");
        let tmp = Path::new("/store/streamed.tmp");
        disk.record_calls(true);
        // create, allocate, then the appends: the third of them fails.
        let first = disk.calls();
        disk.fail(first + 4, first + 4, fault);
        let error = stream(&disk, tmp, &index, &marks, 4096).expect_err("a write failed");
        assert!(
            error.to_string().contains("writing /store/streamed.tmp"),
            "{fault:?}: {error}"
        );
        let appends = disk
            .call_log()
            .iter()
            .filter(|call| call.kind == crate::storage::CallKind::Append)
            .count();
        assert_eq!(appends, 3, "{fault:?}: appends went on after the failed one");
        // The file holds the two steps written before the failure (and what a short write left),
        // then the zeros allocated ahead: it does not load.
        let left = disk.file_bytes(tmp).unwrap_or_default();
        assert_eq!(left.len(), whole, "{fault:?}: allocated as long as the checkpoint");
        assert!(whole > 64 * 4096, "the test index is too small: {whole} bytes");
        assert!(
            left[whole / 2..].iter().all(|byte| *byte == 0),
            "{fault:?}: bytes past the failure"
        );
        assert!(decode(&left).is_err(), "{fault:?}: a torn checkpoint loads");
    }
}

#[test]
fn an_id_with_no_version_left_loads_with_its_number_and_deletes() {
    let (mut index, marks) = two_ids();
    assert!(index.apply_delete(4, "ab"));
    // Compaction dropped the only version of the deleted "ab" (slot 2).
    assert!(index.forget(2));
    index.unlink_from_sets(2);
    index.purge_sets();
    index.seq = 4;
    let loaded = decode(&seal((4, 0), &encode_body(&index, &marks)))
        .expect("intact")
        .index;
    let ab = loaded.id_number("ab").expect("ab is still known");
    assert_eq!(Some(ab), index.id_number("ab"));
    assert_eq!(loaded.deletes_of(ab), 1);
    assert!(loaded.visible("ab", 4).is_none());
    let aa = loaded.id_number("aa").expect("aa");
    let chain: Vec<u32> = loaded.versions_of(aa).map(|(slot, _)| slot).collect();
    assert_eq!(chain, vec![1, 0]);
}

/// The type name and scope the index keeps for the latest version of `id`, `None` when unknown.
fn kind_and_scope_of(index: &Index, id: &str) -> Option<(String, crate::item::Scope)> {
    let (_, latest) = index.versions_of(index.id_number(id)?).next()?;
    assert!(latest.is_retired(), "{id}");
    if !latest.kind_and_scope_known() {
        return None;
    }
    let kind = index
        .kinds
        .value(u32::from(latest.kind()))
        .expect("a type number in range");
    let scope = index.scopes.value(latest.scope).expect("a scope number in range");
    Some((kind.to_string(), scope.clone()))
}

#[test]
fn retired_versions_keep_their_type_and_scope_or_that_they_are_unknown() {
    use crate::index::SCOPE_UNKNOWN;
    use crate::item::Scope;
    use crate::log::record::ScopeView;
    let mut index = Index::default();
    // Retired by compaction while the store is open: the put's type and scope stay.
    let mut put = crate::index::tests::put("compacted", "1", 10);
    (put.kind, put.scope) = ("note", ScopeView::Session("s1"));
    index.apply_put(1, &put, HERE);
    assert!(index.retire(0, HERE));
    index.unlink_from_sets(0);
    index.purge_sets();
    // Replayed from a retired record of format 3, and of format 1 or 2.
    index.apply_retired(
        2,
        "replayed",
        "1",
        Some(("tool_result", ScopeView::GlobalReadonly)),
        HERE,
    );
    index.apply_retired(3, "old", "1", None, HERE);
    index.apply_put(4, &crate::index::tests::put("stored", "1", 10), HERE);
    index.seq = 4;
    let expected = [
        ("compacted", Some(("note".to_owned(), Scope::Session("s1".into())))),
        ("replayed", Some(("tool_result".to_owned(), Scope::GlobalReadonly))),
        ("old", None),
    ];
    for (id, want) in &expected {
        assert_eq!(&kind_and_scope_of(&index, id), want, "{id} before the checkpoint");
    }
    let marks = [SegmentMark {
        number: 1,
        rewrites: 0,
        len: 1000,
    }];
    let body = encode_body(&index, &marks);
    let loaded = decode(&seal((4, 0), &body)).expect("intact").index;
    for (id, want) in &expected {
        assert_eq!(&kind_and_scope_of(&loaded, id), want, "{id} from the checkpoint");
    }
    assert_eq!(loaded.live_ids, 1, "retired versions are not live");

    // The rows of "old" and "replayed" (created at 3 and 2, open, timestamp 0, never expiring):
    // a retired row's type and scope must be in their tables, or be the unknown ones.
    let row_of = |seq: u64| -> Vec<u8> {
        [
            seq.to_le_bytes(),
            u64::MAX.to_le_bytes(),
            0u64.to_le_bytes(),
            i64::MAX.to_le_bytes(),
        ]
        .concat()
    };
    let at = |body: &[u8], seq: u64| {
        let row = row_of(seq);
        body.windows(row.len())
            .position(|w| w == row.as_slice())
            .expect("the row")
    };
    let old = at(&body, 3);
    assert_eq!(
        body[old + 56..old + 60],
        SCOPE_UNKNOWN.to_le_bytes(),
        "the unknown scope"
    );
    assert_eq!(body[old + 64..old + 66], [0, 0], "type 0");
    let replayed = at(&body, 2);
    let scopes = u32::try_from(index.scopes.len()).expect("a few scopes");
    let kinds = u16::try_from(index.kinds.len()).expect("a few types");
    for (row, offset, forged) in [
        (old, 64, 1u16.to_le_bytes().to_vec()),
        (replayed, 56, scopes.to_le_bytes().to_vec()),
        (replayed, 56, (SCOPE_UNKNOWN - 1).to_le_bytes().to_vec()),
        (replayed, 64, kinds.to_le_bytes().to_vec()),
    ] {
        let mut bad = body.clone();
        bad[row + offset..row + offset + forged.len()].copy_from_slice(&forged);
        let why = decode(&seal((4, 0), &bad)).err().expect("a number out of range");
        assert!(why.contains("table number is out of range"), "{why}");
    }
}

fn replace(body: &mut [u8], from: &[u8], to: &[u8]) {
    let at = body
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern in the body");
    body[at..at + to.len()].copy_from_slice(to);
}

#[test]
fn checkpoints_with_checksums_but_inconsistent_tables_are_refused() {
    let (index, marks) = two_ids();
    let body = encode_body(&index, &marks);
    let loaded = decode(&seal((3, 0), &body)).expect("intact");
    assert_eq!(loaded.index.id_count(), 2);
    assert_eq!(
        loaded.index.visible("aa", 3).map(|v| v.version.version_tag()),
        Some(crate::index::version_tag("2"))
    );
    assert_eq!(loaded.index.versions_of(0).count(), 2);

    let mut twice = body.clone();
    // Front-coded, "aa" and "ab" are stored as "aa" and "b" after one shared byte.
    replace(&mut twice, b"aab", b"aaa");
    let why = decode(&seal((3, 0), &twice)).err().expect("a name listed twice");
    assert!(why.contains("listed twice"), "{why}");

    // Swap the creation seqs of aa's versions: (1, ended 2) and (2, open) become (2, 2) and (1, open).
    let mut order = body.clone();
    let first: Vec<u8> = [1u64.to_le_bytes(), 2u64.to_le_bytes()].concat();
    let second: Vec<u8> = [2u64.to_le_bytes(), u64::MAX.to_le_bytes()].concat();
    replace(&mut order, &first, &2u64.to_le_bytes());
    replace(&mut order, &second, &1u64.to_le_bytes());
    let why = decode(&seal((3, 0), &order)).err().expect("versions out of order");
    assert!(why.contains("id's versions are out of order"), "{why}");

    // A timestamp no add accepts (the index keeps 40 bits of it): aa's first version, at 10.
    let row: Vec<u8> = [1u64.to_le_bytes(), 2u64.to_le_bytes(), 10u64.to_le_bytes()].concat();
    for timestamp in [-1, crate::limits::TIMESTAMP_MAX + 1, i64::MIN] {
        let mut late = body.clone();
        let forged: Vec<u8> = [1u64.to_le_bytes(), 2u64.to_le_bytes(), timestamp.to_le_bytes()].concat();
        replace(&mut late, &row, &forged);
        let why = decode(&seal((3, 0), &late)).err().expect("a timestamp out of range");
        assert!(why.contains("timestamp"), "{timestamp}: {why}");
    }
    // A version tag over 16 bits (the index keeps 16): aa's first version's, at byte 52 of its row.
    let mut wide = body.clone();
    let at = wide
        .windows(row.len())
        .position(|w| w == row.as_slice())
        .expect("aa's first row");
    wide[at + 54] = 1;
    let why = decode(&seal((3, 0), &wide)).err().expect("a tag over 16 bits");
    assert!(why.contains("over 16 bits"), "{why}");
    let mut latest = Index::default();
    latest.apply_put(
        1,
        &crate::index::tests::put("aa", "1", crate::limits::TIMESTAMP_MAX),
        HERE,
    );
    latest.seq = 1;
    let loaded = decode(&seal((1, 0), &encode_body(&latest, &marks))).expect("the largest timestamp is kept");
    let kept = loaded.index.visible("aa", 1).map(|v| v.version.timestamp());
    assert_eq!(kept, Some(crate::limits::TIMESTAMP_MAX));
}

#[test]
fn overflowing_expiries_generations_sources_and_ends_round_trip_across_chunks() {
    // 70,000 versions (eighteen chunks of rows), each from its own source, so that the last
    // 4,464 have source numbers past what an entry holds; every 997th with an expiry past what
    // an entry holds; one id deleted and added again 40 times, whose later generations
    // overflow; and ends more sequence numbers after a creation than an entry holds.
    const N: u64 = 70_000;
    let mut index = Index::default();
    let name = |n: u64| format!("id{n}");
    let source = |n: u64| format!("s{n}");
    let expiry_of = |n: u64| {
        if n.is_multiple_of(997) {
            Some(u64::from(u32::MAX) + n)
        } else if n.is_multiple_of(2) {
            Some(60 + n)
        } else {
            None
        }
    };
    for n in 0..N {
        let (id, from) = (name(n), source(n));
        let mut put = crate::index::tests::put(&id, "1", 1_000 + n as i64);
        put.ttl_seconds = expiry_of(n);
        put.source = &from;
        index.apply_put(n + 1, &put, HERE);
    }
    let mut seq = N + 1;
    for _ in 0..40 {
        index.apply_put(seq, &crate::index::tests::put("churn", "1", 7), HERE);
        index.apply_delete(seq + 1, "churn");
        seq += 2;
    }
    index.apply_put(seq, &crate::index::tests::put("churn", "2", 7), HERE);
    // id1 (inline) ended u32::MAX - 1 after its creation, the most an entry holds; id2 (inline)
    // u32::MAX after, and id0 (already in the overflow table for its expiry) much later.
    let end_fits = 2 + u64::from(u32::MAX) - 1;
    let end_does_not = 3 + u64::from(u32::MAX);
    index.apply_delete(end_fits, "id1");
    index.apply_put(end_does_not, &crate::index::tests::put("id2", "2", 5), HERE);
    seq = end_does_not + 1_000;
    index.apply_put(seq, &crate::index::tests::put("id0", "2", 5), HERE);
    index.seq = seq;
    let ended = |index: &Index, n: u64| -> Vec<u64> {
        let id = index.id_number(&name(n)).expect("id");
        index.versions_of(id).map(|(_, v)| index.seq_ended(&v)).collect()
    };
    assert_eq!(ended(&index, 1), vec![end_fits]);
    assert_eq!(ended(&index, 2), vec![SEQ_OPEN, end_does_not]);
    assert_eq!(ended(&index, 0), vec![SEQ_OPEN, seq]);
    let marks = [SegmentMark {
        number: 1,
        rewrites: 0,
        len: 1000,
    }];
    let loaded = decode(&seal((seq, 0), &encode_body(&index, &marks)))
        .expect("intact")
        .index;
    for n in 0..N {
        let expected = expiry_of(n).map_or(crate::index::NEVER_EXPIRES, |ttl| 1_000 + n as i64 + ttl as i64);
        let id = loaded.id_number(&name(n)).expect("id");
        let (_, first) = loaded.versions_of(id).last().expect("a version");
        assert_eq!(loaded.expires_at(&first), expected, "id {n}");
        let from = loaded.sources.value(loaded.source_of(&first)).map(|s| s.to_string());
        assert_eq!(from, Some(source(n)), "id {n}");
        assert!(loaded.visible_at(&first, n + 1), "id {n}");
    }
    for n in [0, 1, 2] {
        assert_eq!(ended(&loaded, n), ended(&index, n), "id {n}");
    }
    assert!(loaded.visible("id1", end_fits - 1).is_some() && loaded.visible("id1", end_fits).is_none());
    let tag_at = |seq: u64| loaded.visible("id2", seq).map(|v| v.version.version_tag());
    assert_eq!(tag_at(end_does_not - 1), Some(crate::index::version_tag("1")));
    assert_eq!(tag_at(end_does_not), Some(crate::index::version_tag("2")));
    let generations = |index: &Index| -> Vec<(u32, i64)> {
        let id = index.id_number("churn").expect("churn");
        index
            .versions_of(id)
            .map(|(_, v)| (index.generation(&v), index.expires_at(&v)))
            .collect()
    };
    assert_eq!(generations(&loaded), generations(&index));
    assert_eq!(generations(&loaded).first().map(|g| g.0), Some(40));
    assert_eq!(loaded.current_history("churn").count(), 1);
    // The same rows again, byte for byte.
    assert!(encode_body(&loaded, &marks) == encode_body(&index, &marks));
}

#[test]
fn names_in_many_chunks_round_trip_and_bad_name_layouts_are_refused() {
    // 2,000 ids of 100-byte names: four chunks of whole names.
    let mut index = Index::default();
    let name = |n: u64| format!("{n:0>100}");
    for n in 0..2000u64 {
        index.apply_put(n + 1, &crate::index::tests::put(&name(n), "1", n as i64), HERE);
    }
    index.seq = 2000;
    let marks = [SegmentMark {
        number: 1,
        rewrites: 0,
        len: 1000,
    }];
    let loaded = decode(&seal((2000, 0), &encode_body(&index, &marks))).expect("intact");
    assert_eq!(loaded.index.id_count(), 2000);
    for n in [0, 654, 655, 1999] {
        let found = loaded.index.visible(&name(n), 2000).map(|v| v.version.timestamp());
        assert_eq!(found, Some(n as i64), "id {n}");
        assert_eq!(loaded.index.id_name(u32::try_from(n).expect("small")), name(n));
    }
    assert!(loaded.index.visible(&name(2000), 2000).is_none());
    // The checkpoint stores the names as the arena holds them, front-coded: two bytes per id,
    // then one chunk (a mark's name whole every 16 ids, one to three bytes for the others).
    let mut names = Vec::new();
    put_names(&mut names, &index);
    assert_eq!(names.get(..2), Some(&[0u8, 100][..]));
    assert_eq!(names.get(2..4), Some(&[99u8, 1][..]));
    assert_eq!(names.get(4000..4004), Some(&1u32.to_le_bytes()[..]));
    let chunk = u32::from_le_bytes(names[4004..4008].try_into().expect("4 bytes")) as usize;
    assert_eq!(names.len(), 4008 + chunk);
    assert!(chunk < 2000 * 100 / 10, "{chunk} bytes for 2,000 names of 100");

    let table = |chunks: &[&[u8]], parts: &[[u8; 2]]| IdTable::from_name_chunk_bytes(chunks, parts).err();
    assert!(table(&[b"abcd"], &[[0, 2], [0, 2]]).is_none());
    assert!(table(&[b"abc"], &[[0, 2], [1, 1]]).is_none(), "ab, ac");
    assert!(table(&[], &[]).is_none());
    let seventeen = b"abcdefghijklmnopq";
    let mut marked = vec![[0, 1]; 17];
    marked[16] = [1, 1];
    let mut long = vec![b'a'; 255];
    long.push(b'b');
    let refused = [
        (table(&[b"abcd"], &[[0, 2], [0, 0], [0, 2]]), "empty name part"),
        (table(&[b"abcd"], &[[1, 2], [0, 2]]), "not stored whole"),
        (table(&[seventeen], &marked), "not stored whole"),
        (table(&[b"abcd"], &[[0, 2], [3, 2]]), "shares 3 bytes"),
        (table(&["éx".as_bytes()], &[[0, 2], [1, 1]]), "shares 1 bytes"),
        (table(&[b"abc", b"d"], &[[0, 2], [0, 2]]), "does not fit"),
        (table(&[b"abcd"], &[[0, 2], [0, 3]]), "does not fit"),
        (table(&["aé".as_bytes()], &[[0, 2], [0, 1]]), "does not fit"),
        (table(&[b"abcde"], &[[0, 2], [0, 2]]), "after the last id"),
        (table(&[b"ab", b""], &[[0, 2]]), "after the last id"),
        (table(&[b"abab"], &[[0, 2], [0, 2]]), "listed twice"),
        (table(&[b"abb"], &[[0, 2], [1, 1]]), "listed twice"),
        (table(&[&long], &[[0, 255], [255, 1]]), "longer than 255"),
        (table(&[b"a\xff"], &[[0, 1], [0, 1]]), "not UTF-8"),
        (table(&[&vec![b'a'; NAME_CHUNK + 1]], &[[0, 255]]), "more than"),
    ];
    for (why, expected) in refused {
        let why = why.unwrap_or_default();
        assert!(why.contains(expected), "{why:?} should say {expected:?}");
    }
}

#[test]
fn ordered_sets_that_disagree_with_the_versions_are_refused() {
    let (index, marks) = two_ids();
    let body = encode_body(&index, &marks);
    // The body ends with the time set (all three versions are stored, all at timestamp 10:
    // slots 0, 1, 2), then the one type's set size and the one scope's.
    let tail = body.len() - 16;
    assert_eq!(&body[tail - 16..tail], [3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(&body[tail..], [1, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0]);
    let refused = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut damaged = body.clone();
        edit(&mut damaged);
        decode(&seal((3, 0), &damaged)).err().unwrap_or_default()
    };
    let swapped = refused(&|b| b[tail - 8..tail].copy_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0]));
    assert!(swapped.contains("not in order"), "{swapped}");
    let unknown = refused(&|b| b[tail - 4..tail].copy_from_slice(&[5, 0, 0, 0]));
    assert!(unknown.contains("slot 5, which is not stored"), "{unknown}");
    let twice = refused(&|b| b[tail - 4..tail].copy_from_slice(&[1, 0, 0, 0]));
    assert!(twice.contains("not in order"), "{twice}");
    let sizes = refused(&|b| b[tail + 4..tail + 8].copy_from_slice(&[4, 0, 0, 0]));
    assert!(sizes.contains("do not add up"), "{sizes}");
    let short = refused(&|b| {
        b.truncate(tail - 4);
        b[tail - 16..tail - 12].copy_from_slice(&[2, 0, 0, 0]);
        b.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
    });
    assert!(short.contains("every stored version"), "{short}");
}

#[test]
fn tables_past_the_limits_of_a_store_are_refused() {
    // No segments, types or pins, then a count of interned types, scopes or sources, one past its
    // limit: refused before any of them is read.
    for (at, count, what) in [
        (0, crate::limits::TYPES_MAX + 1, "types"),
        (1, crate::limits::SCOPES_MAX + 1, "scopes"),
        (2, crate::limits::SOURCES_MAX + 1, "sources"),
    ] {
        let mut body = vec![0u8; 12];
        // The tables before the one past its limit, each empty.
        body.extend(std::iter::repeat_n(0u8, 4 * at));
        body.extend_from_slice(&u32::try_from(count).unwrap().to_le_bytes());
        let refused = decode(&seal((1, 0), &body)).map(|_| ()).expect_err("past the limit");
        assert!(refused.contains(&format!("{count} {what}, more than")), "{refused}");
    }
}

#[test]
fn damaged_checkpoints_are_refused() {
    let index = Index::default();
    let bytes = encode(
        &index,
        &[SegmentMark {
            number: 1,
            rewrites: 0,
            len: 32,
        }],
    );
    assert!(decode(&bytes).is_ok());
    for bit in 0..bytes.len() * 8 {
        let mut damaged = bytes.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        assert!(decode(&damaged).is_err(), "bit {bit}");
    }
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}
