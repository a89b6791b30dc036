//! Tests of the simulated disk: what survives a crash, allocations, faults, power cuts, the call
//! log and switched-off syncs.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use super::state::{EIO, ENOSPC};
use super::*;
use crate::storage::Allocation;

const DIR: &str = "/d";

fn disk_with_dir() -> SimDisk {
    let disk = SimDisk::new();
    disk.create_dir_all(Path::new(DIR)).unwrap();
    disk
}

fn path(name: &str) -> PathBuf {
    Path::new(DIR).join(name)
}

#[test]
fn synced_data_and_entries_survive_every_crash() {
    let disk = disk_with_dir();
    let mut file = disk.create_new(&path("a")).unwrap();
    file.append(b"hello").unwrap();
    file.sync_data().unwrap();
    disk.sync_dir(Path::new(DIR)).unwrap();
    file.append(b" world").unwrap();
    for seed in 0..200 {
        let after = disk.crash(seed);
        let bytes = after.read(&path("a")).unwrap();
        assert!(bytes.starts_with(b"hello"), "seed {seed}: {bytes:?}");
        assert!(b"hello world".starts_with(&bytes), "seed {seed}: {bytes:?}");
    }
    assert_eq!(disk.crash_losing_unsynced().read(&path("a")).unwrap(), b"hello");
}

#[test]
fn unsynced_entries_roll_back() {
    let disk = disk_with_dir();
    let mut file = disk.create(&path("old")).unwrap();
    file.append(b"old").unwrap();
    file.sync_all().unwrap();
    disk.sync_dir(Path::new(DIR)).unwrap();
    let mut tmp = disk.create(&path("new.tmp")).unwrap();
    tmp.append(b"new").unwrap();
    tmp.sync_all().unwrap();
    disk.rename(&path("new.tmp"), &path("old")).unwrap();
    let lost = disk.crash_losing_unsynced();
    assert_eq!(lost.file_names(Path::new(DIR)), vec!["old".to_string()]);
    assert_eq!(lost.read(&path("old")).unwrap(), b"old");
    // A crash keeps a prefix of the directory's changes: the rename is whole or absent.
    let mut seen = HashSet::new();
    for seed in 0..100 {
        let after = disk.crash(seed);
        let names = after.file_names(Path::new(DIR));
        let old = after.read(&path("old")).unwrap();
        seen.insert((names.clone(), old.clone()));
        assert!(
            (names == ["new.tmp", "old"] && old == b"old") || (names == ["old"] && (old == b"old" || old == b"new")),
            "seed {seed}: {names:?} {old:?}"
        );
    }
    assert_eq!(seen.len(), 3, "every prefix of the changes happens for some seed");
    assert!(disk.remove(&path("old")).is_err(), "a crashed disk stays powered off");
}

#[test]
fn allocated_space_reads_as_zeros_and_appends_write_into_it() {
    let disk = disk_with_dir();
    let mut file = disk.create_new(&path("a")).unwrap();
    disk.sync_dir(Path::new(DIR)).unwrap();
    file.append(b"head").unwrap();
    file.allocate(16, Allocation::Reserved).unwrap();
    assert_eq!(disk.read(&path("a")).unwrap(), b"head\0\0\0\0\0\0\0\0\0\0\0\0");
    // The write position stays where the last append ended, not at the new end of the file.
    file.append(b"body").unwrap();
    assert_eq!(disk.read(&path("a")).unwrap(), b"headbody\0\0\0\0\0\0\0\0");
    // Allocating less than the file holds changes nothing.
    file.allocate(4, Allocation::Zeroed).unwrap();
    assert_eq!(disk.len(&path("a")).unwrap(), 16);
    assert_eq!(&*file.map_prefix(8).unwrap(), b"headbody");
    assert!(file.map_prefix(17).is_err(), "a prefix longer than the file");
    file.sync_data().unwrap();
    // Cutting the zeros moves the write position to the new end.
    file.set_len(8).unwrap();
    file.append(b"tail").unwrap();
    assert_eq!(disk.read(&path("a")).unwrap(), b"headbodytail");
    // Unsynced, the cut, the append and a new allocation may each be lost; what an allocation
    // covers reads as zeros.
    file.allocate(32, Allocation::Reserved).unwrap();
    let mut lengths = HashSet::new();
    for seed in 0..100 {
        let bytes = disk.crash(seed).read(&path("a")).unwrap();
        assert!(bytes.starts_with(b"headbody"), "seed {seed}: {bytes:?}");
        assert!(bytes.len() <= 32, "seed {seed}: {} bytes", bytes.len());
        assert!(
            bytes.iter().skip(12).all(|byte| *byte == 0),
            "seed {seed}: past the append, only zeros: {bytes:?}"
        );
        lengths.insert(bytes.len());
    }
    assert!(lengths.contains(&32) && lengths.contains(&16), "{lengths:?}");
    assert_eq!(
        disk.crash_losing_unsynced().read(&path("a")).unwrap(),
        b"headbody\0\0\0\0\0\0\0\0"
    );
}

#[test]
fn written_zeros_are_a_write_a_power_cut_may_keep_in_part() {
    let disk = disk_with_dir();
    let mut file = disk.create_new(&path("a")).unwrap();
    disk.sync_dir(Path::new(DIR)).unwrap();
    file.append(b"head").unwrap();
    file.sync_data().unwrap();
    file.allocate(64, Allocation::Zeroed).unwrap();
    let mut want = b"head".to_vec();
    want.resize(64, 0);
    assert_eq!(disk.read(&path("a")).unwrap(), want);
    // Allocating less than the file holds writes nothing.
    file.allocate(16, Allocation::Zeroed).unwrap();
    assert_eq!(disk.len(&path("a")).unwrap(), 64);
    // Unlike reserved space, which a power cut keeps whole or not at all, written zeros may be
    // kept up to any point.
    let mut lengths = HashSet::new();
    for seed in 0..300 {
        let bytes = disk.copy().crash(seed).read(&path("a")).unwrap();
        assert!(
            bytes.starts_with(b"head") && bytes.len() <= 64,
            "seed {seed}: {bytes:?}"
        );
        assert!(bytes.iter().skip(4).all(|byte| *byte == 0), "seed {seed}: {bytes:?}");
        lengths.insert(bytes.len());
    }
    assert!(lengths.contains(&4) && lengths.contains(&64), "{lengths:?}");
    assert!(lengths.iter().any(|len| (5..64).contains(len)), "{lengths:?}");
    // The write position stays after the last append.
    file.append(b"body").unwrap();
    assert_eq!(disk.read(&path("a")).unwrap().get(..8), Some(b"headbody".as_slice()));
    // A short write of zeros leaves part of them, like a short append.
    let next = disk.calls();
    disk.fail(next, next, Fault::ShortWrite);
    let error = file.allocate(128, Allocation::Zeroed).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::WriteZero);
    assert_eq!(disk.len(&path("a")).unwrap(), 96);
    // Other faults change nothing, whichever the allocation.
    for how in [Allocation::Zeroed, Allocation::Reserved] {
        let next = disk.calls();
        disk.fail(next, next, Fault::NoSpace);
        assert_eq!(file.allocate(256, how).unwrap_err().raw_os_error(), Some(ENOSPC));
        assert_eq!(disk.len(&path("a")).unwrap(), 96);
    }
    file.allocate(128, Allocation::Reserved).unwrap();
    assert_eq!(disk.len(&path("a")).unwrap(), 128);
}

#[test]
fn power_cut_and_faults_fail_calls() {
    let disk = disk_with_dir();
    let mut file = disk.create_new(&path("a")).unwrap();
    let next = disk.calls();
    disk.fail(next, next, Fault::NoSpace);
    assert_eq!(file.append(b"abcd").unwrap_err().raw_os_error(), Some(ENOSPC));
    disk.fail(next + 1, next + 1, Fault::ShortWrite);
    assert_eq!(file.append(b"abcd").unwrap_err().kind(), io::ErrorKind::WriteZero);
    assert_eq!(disk.read(&path("a")).unwrap(), b"ab");
    disk.cut_power_after(1);
    assert!(!disk.is_powered_off());
    file.sync_data().unwrap();
    assert!(disk.is_powered_off());
    assert_eq!(file.append(b"x").unwrap_err().raw_os_error(), Some(EIO));
    assert!(disk.sync_dir(Path::new(DIR)).is_err());
}

#[test]
fn the_call_log_names_each_call_its_handle_and_its_fault() {
    let disk = disk_with_dir();
    disk.record_calls(true);
    let first = disk.calls();
    let mut file = disk.create_new(&path("a")).unwrap();
    disk.fail(first + 2, first + 2, Fault::ShortWrite);
    file.append(b"ab").unwrap();
    assert!(file.append(b"cd").is_err());
    let reader = disk.open_read(&path("a")).unwrap();
    let mut byte = [0u8; 1];
    reader.read_exact_at(&mut byte, 0).unwrap();
    disk.clear_faults();
    disk.sync_dir(Path::new(DIR)).unwrap();
    let log: Vec<(u64, CallKind, Option<u64>, Option<Fault>)> = disk
        .call_log()
        .iter()
        .map(|call| (call.index, call.kind, call.handle, call.fault))
        .collect();
    assert_eq!(
        log,
        vec![
            (first, CallKind::CreateNew, Some(0), None),
            (first + 1, CallKind::Append, Some(0), None),
            (first + 2, CallKind::Append, Some(0), Some(Fault::ShortWrite)),
            (first + 3, CallKind::OpenRead, Some(1), None),
            (first + 4, CallKind::ReadAt, Some(1), None),
            (first + 5, CallKind::SyncDir, None, None),
        ]
    );
    assert_eq!(disk.call_log()[0].path, path("a"));
    assert_eq!(disk.read(&path("a")).unwrap(), b"abc", "half of the short write");
    disk.record_calls(false);
    assert!(disk.call_log().is_empty());
}

#[test]
fn switched_off_syncs_keep_nothing() {
    let disk = disk_with_dir();
    disk.set_sync_files(false);
    disk.set_sync_dirs(false);
    let mut file = disk.create_new(&path("a")).unwrap();
    file.append(b"data").unwrap();
    file.sync_all().unwrap();
    disk.sync_dir(Path::new(DIR)).unwrap();
    assert!(disk.crash_losing_unsynced().file_names(Path::new(DIR)).is_empty());
}
