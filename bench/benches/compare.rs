//! The comparison harness: ctxlog against sled 0.34, redb, SQLite (rusqlite, bundled) and
//! fjall on workload W1, each (engine, run) in its own child process, plus the disk's limits measured in
//! the same run. See docs/BENCHMARKS.md.
//!
//! ```text
//! cargo bench -p ctxlog-bench --bench compare -- --n 200000 --engines ctxlog,sled,redb,sqlite,fjall \
//!     --phases p1,p2,p3,p4,p5,p6,p7 --runs 3
//! ```
//!
//! Prints a Markdown table of the medians across runs, each ctxlog figure as a ratio to the best other
//! engine, and appends every worker's result (one JSON object per line) to `target/compare-results.jsonl`
//! (`--out FILE` to change). Beside P2's p50 and p99, each record holds latency distributions:
//! `p2_latency_ms_quantiles`, `p2_8t_latency_ms_quantiles`, and for P3, timing one resolve in 16,
//! `p3_latency_ms_quantiles` and `p3_raw_latency_ms_quantiles`: the values in ms at the quantiles
//! of `latency_quantiles` (`ctxlog_bench::charts::LATENCY_QUANTILES`, ending with 1.0, the largest).
//! `examples/charts.rs` draws the results as SVG charts.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ctxlog::{ContextItem, ContextQuery, Durability, ManualClock, Options, RawResolution, Resolution, Scope, Store};
use ctxlog::{Stats, TimeRange};
use redb::ReadableDatabase;
use serde_json::{json, Map, Value};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ALL_ENGINES: [&str; 5] = ["ctxlog", "sled", "redb", "sqlite", "fjall"];
const ALL_PHASES: [&str; 7] = ["p1", "p2", "p3", "p4", "p5", "p6", "p7"];
const BATCH: usize = 1000;
const THREADS: u64 = 8;
/// P3 times one resolve in this many (the first of each run of them), for its latency distribution.
const P3_SAMPLE_EVERY: usize = 16;

// ---------------------------------------------------------------------------------------------
// Workload W1: see src/w1.rs.

use ctxlog_bench::charts::LATENCY_QUANTILES;
use ctxlog_bench::w1;
use w1::{item, mix, peak_rss_kib, rss_kinds_kib, BASE_TS, TYPES};

// ---------------------------------------------------------------------------------------------

fn scope_key(scope: &Scope) -> String {
    match scope {
        Scope::Session(s) => format!("session:{s}"),
        other => other.as_str().to_owned(),
    }
}

/// The index keys a key-value user keeps beside the item: `type|ts|id`, `scope|ts|id`, `ts|id`.
fn index_keys(it: &ContextItem) -> [Vec<u8>; 3] {
    let ts = it.timestamp.to_be_bytes();
    let mut by_type = Vec::with_capacity(it.kind.len() + 9 + it.id.len());
    by_type.extend_from_slice(it.kind.as_bytes());
    by_type.push(0);
    by_type.extend_from_slice(&ts);
    by_type.extend_from_slice(it.id.as_bytes());
    let scope = scope_key(&it.scope);
    let mut by_scope = Vec::with_capacity(scope.len() + 9 + it.id.len());
    by_scope.extend_from_slice(scope.as_bytes());
    by_scope.push(0);
    by_scope.extend_from_slice(&ts);
    by_scope.extend_from_slice(it.id.as_bytes());
    let mut by_ts = Vec::with_capacity(8 + it.id.len());
    by_ts.extend_from_slice(&ts);
    by_ts.extend_from_slice(it.id.as_bytes());
    [by_type, by_scope, by_ts]
}

/// The `[start, end)` key range of the type index for `kind` and timestamps `start..=end`.
fn type_range(kind: &str, start: i64, end: i64) -> (Vec<u8>, Vec<u8>) {
    let mut lo = kind.as_bytes().to_vec();
    lo.push(0);
    let mut hi = lo.clone();
    lo.extend_from_slice(&start.to_be_bytes());
    hi.extend_from_slice(&(end + 1).to_be_bytes());
    (lo, hi)
}

/// The id at the end of a type-index key.
fn id_of_type_key<'a>(kind: &str, key: &'a [u8]) -> &'a [u8] {
    key.get(kind.len() + 9..).unwrap_or_default()
}

fn parse(bytes: &[u8]) -> Res<ContextItem> {
    Ok(ContextItem::from_json(std::str::from_utf8(bytes)?)?)
}

/// What a reader does with an item's stored JSON: parse it, or with `raw` copy it out unparsed (as a
/// server that forwards JSON unchanged would); the bytes are kept from the optimizer.
fn take(bytes: &[u8], raw: bool) -> Res<()> {
    if raw {
        std::hint::black_box(bytes.to_vec());
    } else {
        std::hint::black_box(parse(bytes)?);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The engines.

trait Engine: Send + Sync {
    /// One durable atomic batch: the items and their index entries.
    fn add(&self, items: Vec<ContextItem>) -> Res<()>;
    /// One item by id, parsed.
    fn resolve(&self, id: &str) -> Res<Option<ContextItem>>;
    /// One item by id as its JSON bytes, unparsed, copied out of the engine (ctxlog: `resolve_raw`):
    /// the length.
    fn resolve_raw(&self, id: &str) -> Res<Option<usize>>;
    /// Items of `kind` with `start <= timestamp <= end`, each parsed into a `ContextItem`, or with
    /// `raw`, its JSON bytes copied out unparsed (ctxlog: `get_raw`); the count.
    fn query(&self, kind: &str, start: i64, end: i64, raw: bool) -> Res<usize>;
    /// Expires (ctxlog) or deletes (the others) the items with a TTL among `0..total` and reclaims the
    /// space: (seconds expiring or deleting, seconds reclaiming, how).
    fn expire_half(&mut self, total: u64) -> Res<(f64, f64, String)>;
    /// Extra figures for the result line.
    fn extra(&self, _out: &mut Map<String, Value>) {}
}

fn open_engine(name: &str, dir: &Path, clock: &Arc<ManualClock>) -> Res<Box<dyn Engine>> {
    Ok(match name {
        "ctxlog" => Box::new(Ctxlog::open(dir, clock)?),
        "sled" => Box::new(Sled::open(dir)?),
        "redb" => Box::new(Redb::open(dir)?),
        "sqlite" => Box::new(Sqlite::open(dir)?),
        "fjall" => Box::new(Fjall::open(dir)?),
        other => return Err(format!("unknown engine {other:?}; known: {}", ALL_ENGINES.join(",")).into()),
    })
}

/// Even items carry a TTL: the ones P7 expires or deletes, generated in batches of 1,000.
fn for_ttl_batches(total: u64, mut f: impl FnMut(Vec<ContextItem>) -> Res<()>) -> Res<()> {
    let mut n = 0;
    while n < total {
        let batch: Vec<ContextItem> = (n..total.min(n + 2 * BATCH as u64)).step_by(2).map(item).collect();
        f(batch)?;
        n += 2 * BATCH as u64;
    }
    Ok(())
}

struct Ctxlog {
    store: Store,
    clock: Arc<ManualClock>,
}

impl Ctxlog {
    fn open(dir: &Path, clock: &Arc<ManualClock>) -> Res<Self> {
        let store = Options::new()
            .durability(Durability::Immediate)
            .clock(clock.clone())
            .auto_compact(false)
            .open(dir)?;
        Ok(Self {
            store,
            clock: clock.clone(),
        })
    }
}

impl Engine for Ctxlog {
    fn add(&self, items: Vec<ContextItem>) -> Res<()> {
        // The store computes the hash itself, as its users let it.
        self.store.add(items.into_iter().map(|mut it| {
            it.hash = None;
            it
        }))?;
        Ok(())
    }
    fn resolve(&self, id: &str) -> Res<Option<ContextItem>> {
        Ok(match self.store.resolve([id])?.pop() {
            Some(Resolution::Found(it)) => Some(it),
            _ => None,
        })
    }
    fn resolve_raw(&self, id: &str) -> Res<Option<usize>> {
        Ok(match self.store.resolve_raw([id])?.pop() {
            Some(RawResolution::Found(it)) => Some(it.len()),
            _ => None,
        })
    }
    fn query(&self, kind: &str, start: i64, end: i64, raw: bool) -> Res<usize> {
        let q = ContextQuery::new()
            .types([kind])
            .time_range(TimeRange::new(start, end)?);
        Ok(if raw {
            self.store.get_raw(&q)?.len()
        } else {
            self.store.get(&q)?.len()
        })
    }
    fn expire_half(&mut self, total: u64) -> Res<(f64, f64, String)> {
        // No per-item work: the clock passes every TTL (the newest item's expiry + 1 s).
        let started = Instant::now();
        self.clock.set(BASE_TS + i64::try_from(total)? + 3601);
        let expire = started.elapsed().as_secs_f64();
        let report = self.store.compact()?;
        let reclaim = started.elapsed().as_secs_f64() - expire;
        Ok((
            expire,
            reclaim,
            format!(
                "ManualClock past every TTL, then compact(): {} segments rewritten, {} expired reclaimed",
                report.segments_rewritten, report.reclaimed_expired
            ),
        ))
    }
    fn extra(&self, out: &mut Map<String, Value>) {
        let Stats {
            index_bytes,
            index_bytes_per_item,
            items,
            versions,
            segments,
            recovery,
            ..
        } = self.store.stats();
        out.insert("index_bytes".into(), json!(index_bytes));
        out.insert("index_bytes_per_item".into(), json!(index_bytes_per_item));
        out.insert("items".into(), json!(items));
        out.insert("versions".into(), json!(versions));
        out.insert("segments".into(), json!(segments));
        out.insert("checkpoint_used".into(), json!(recovery.checkpoint_seq.is_some()));
    }
}

/// sled 0.34: one tree, keys prefixed `i` (item), `t` (type|ts|id), `s` (scope|ts|id), `w` (ts|id), written
/// with `apply_batch` (atomic). `flush()` only calls `sync_file_range` on Linux, which persists neither
/// the file's metadata nor the disk's write cache, so every durable commit adds an `fdatasync` of sled's
/// log file (`db`), as the method asks.
struct Sled {
    db: sled::Db,
    log: File,
}

fn prefixed(p: u8, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(p);
    k.extend_from_slice(key);
    k
}

impl Sled {
    fn open(dir: &Path) -> Res<Self> {
        let db = sled::Config::new().path(dir).open()?;
        let log = File::open(dir.join("db"))?;
        Ok(Self { db, log })
    }
    fn durable(&self) -> Res<()> {
        self.db.flush()?;
        self.log.sync_data()?;
        Ok(())
    }
}

impl Engine for Sled {
    fn add(&self, items: Vec<ContextItem>) -> Res<()> {
        let mut batch = sled::Batch::default();
        for it in &items {
            let [t, s, w] = index_keys(it);
            batch.insert(prefixed(b'i', it.id.as_bytes()), it.to_json().into_bytes());
            batch.insert(prefixed(b't', &t), &[]);
            batch.insert(prefixed(b's', &s), &[]);
            batch.insert(prefixed(b'w', &w), &[]);
        }
        self.db.apply_batch(batch)?;
        self.durable()
    }
    fn resolve(&self, id: &str) -> Res<Option<ContextItem>> {
        self.db
            .get(prefixed(b'i', id.as_bytes()))?
            .map(|v| parse(&v))
            .transpose()
    }
    fn resolve_raw(&self, id: &str) -> Res<Option<usize>> {
        Ok(self.db.get(prefixed(b'i', id.as_bytes()))?.map(|v| v.to_vec().len()))
    }
    fn query(&self, kind: &str, start: i64, end: i64, raw: bool) -> Res<usize> {
        let (lo, hi) = type_range(kind, start, end);
        let mut count = 0;
        for kv in self.db.range(prefixed(b't', &lo)..prefixed(b't', &hi)) {
            let (key, _) = kv?;
            let id = id_of_type_key(kind, key.get(1..).unwrap_or_default());
            if let Some(v) = self.db.get(prefixed(b'i', id))? {
                take(&v, raw)?;
                count += 1;
            }
        }
        Ok(count)
    }
    fn expire_half(&mut self, total: u64) -> Res<(f64, f64, String)> {
        let mut secs = 0.0;
        for_ttl_batches(total, |items| {
            let started = Instant::now();
            let mut batch = sled::Batch::default();
            for it in &items {
                let [t, s, w] = index_keys(it);
                batch.remove(prefixed(b'i', it.id.as_bytes()));
                batch.remove(prefixed(b't', &t));
                batch.remove(prefixed(b's', &s));
                batch.remove(prefixed(b'w', &w));
            }
            self.db.apply_batch(batch)?;
            self.durable()?;
            secs += started.elapsed().as_secs_f64();
            Ok(())
        })?;
        let started = Instant::now();
        self.durable()?;
        Ok((
            secs,
            started.elapsed().as_secs_f64(),
            "deletes in durable batches of 1,000; sled 0.34 has no compaction call (its segment cleaner runs on its own): flush + fdatasync".into(),
        ))
    }
}

const R_ITEMS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("items");
const R_TYPE: redb::TableDefinition<&[u8], ()> = redb::TableDefinition::new("by_type");
const R_SCOPE: redb::TableDefinition<&[u8], ()> = redb::TableDefinition::new("by_scope");
const R_TS: redb::TableDefinition<&[u8], ()> = redb::TableDefinition::new("by_ts");

/// redb: four tables written in one write transaction (durability Immediate, its default).
struct Redb {
    db: redb::Database,
}

impl Redb {
    fn open(dir: &Path) -> Res<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            db: redb::Database::create(dir.join("data.redb"))?,
        })
    }
}

impl Engine for Redb {
    fn add(&self, items: Vec<ContextItem>) -> Res<()> {
        let tx = self.db.begin_write()?;
        {
            let mut main = tx.open_table(R_ITEMS)?;
            let mut by_type = tx.open_table(R_TYPE)?;
            let mut by_scope = tx.open_table(R_SCOPE)?;
            let mut by_ts = tx.open_table(R_TS)?;
            for it in &items {
                let [t, s, w] = index_keys(it);
                main.insert(it.id.as_str(), it.to_json().as_bytes())?;
                by_type.insert(t.as_slice(), ())?;
                by_scope.insert(s.as_slice(), ())?;
                by_ts.insert(w.as_slice(), ())?;
            }
        }
        tx.commit()?;
        Ok(())
    }
    fn resolve(&self, id: &str) -> Res<Option<ContextItem>> {
        let tx = self.db.begin_read()?;
        let main = tx.open_table(R_ITEMS)?;
        let got = main.get(id)?;
        got.map(|v| parse(v.value())).transpose()
    }
    fn resolve_raw(&self, id: &str) -> Res<Option<usize>> {
        let tx = self.db.begin_read()?;
        let main = tx.open_table(R_ITEMS)?;
        let got = main.get(id)?;
        Ok(got.map(|v| v.value().to_vec().len()))
    }
    fn query(&self, kind: &str, start: i64, end: i64, raw: bool) -> Res<usize> {
        let tx = self.db.begin_read()?;
        let main = tx.open_table(R_ITEMS)?;
        let by_type = tx.open_table(R_TYPE)?;
        let (lo, hi) = type_range(kind, start, end);
        let mut count = 0;
        for kv in by_type.range(lo.as_slice()..hi.as_slice())? {
            let (key, ()) = kv.map(|(k, v)| (k, v.value()))?;
            let id = std::str::from_utf8(id_of_type_key(kind, key.value()))?;
            if let Some(v) = main.get(id)? {
                take(v.value(), raw)?;
                count += 1;
            }
        }
        Ok(count)
    }
    fn expire_half(&mut self, total: u64) -> Res<(f64, f64, String)> {
        let mut secs = 0.0;
        let db = &self.db;
        for_ttl_batches(total, |items| {
            let started = Instant::now();
            let tx = db.begin_write()?;
            {
                let mut main = tx.open_table(R_ITEMS)?;
                let mut by_type = tx.open_table(R_TYPE)?;
                let mut by_scope = tx.open_table(R_SCOPE)?;
                let mut by_ts = tx.open_table(R_TS)?;
                for it in &items {
                    let [t, s, w] = index_keys(it);
                    main.remove(it.id.as_str())?;
                    by_type.remove(t.as_slice())?;
                    by_scope.remove(s.as_slice())?;
                    by_ts.remove(w.as_slice())?;
                }
            }
            tx.commit()?;
            secs += started.elapsed().as_secs_f64();
            Ok(())
        })?;
        let started = Instant::now();
        let compacted = self.db.compact()?;
        Ok((
            secs,
            started.elapsed().as_secs_f64(),
            format!("deletes in durable transactions of 1,000, then Database::compact() (returned {compacted})"),
        ))
    }
}

/// SQLite (bundled): one table with indexes on (type, ts), (scope, ts), (ts); WAL, synchronous=FULL.
struct Sqlite {
    conn: Mutex<rusqlite::Connection>,
}

impl Sqlite {
    fn open(dir: &Path) -> Res<Self> {
        std::fs::create_dir_all(dir)?;
        let conn = rusqlite::Connection::open(dir.join("data.sqlite"))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if mode != "wal" {
            return Err(format!("journal_mode is {mode}").into());
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(60))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS items (id TEXT PRIMARY KEY, type TEXT NOT NULL, scope TEXT NOT NULL,
                 ts INTEGER NOT NULL, body TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS items_type_ts ON items (type, ts);
             CREATE INDEX IF NOT EXISTS items_scope_ts ON items (scope, ts);
             CREATE INDEX IF NOT EXISTS items_ts ON items (ts);",
        )?;
        Ok(Self { conn: Mutex::new(conn) })
    }
    fn conn(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.conn.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Engine for Sqlite {
    fn add(&self, items: Vec<ContextItem>) -> Res<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut insert =
                tx.prepare_cached("INSERT INTO items (id, type, scope, ts, body) VALUES (?1, ?2, ?3, ?4, ?5)")?;
            for it in &items {
                insert.execute(rusqlite::params![
                    it.id,
                    it.kind,
                    scope_key(&it.scope),
                    it.timestamp,
                    it.to_json()
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
    fn resolve(&self, id: &str) -> Res<Option<ContextItem>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT body FROM items WHERE id = ?1")?;
        let mut rows = stmt.query([id])?;
        match rows.next()? {
            Some(row) => Ok(Some(parse(row.get_ref(0)?.as_bytes()?)?)),
            None => Ok(None),
        }
    }
    fn resolve_raw(&self, id: &str) -> Res<Option<usize>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT body FROM items WHERE id = ?1")?;
        let mut rows = stmt.query([id])?;
        Ok(match rows.next()? {
            Some(row) => Some(row.get_ref(0)?.as_bytes()?.to_vec().len()),
            None => None,
        })
    }
    fn query(&self, kind: &str, start: i64, end: i64, raw: bool) -> Res<usize> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare_cached("SELECT body FROM items WHERE type = ?1 AND ts BETWEEN ?2 AND ?3 ORDER BY ts, id")?;
        let mut rows = stmt.query(rusqlite::params![kind, start, end])?;
        let mut count = 0;
        while let Some(row) = rows.next()? {
            take(row.get_ref(0)?.as_bytes()?, raw)?;
            count += 1;
        }
        Ok(count)
    }
    fn expire_half(&mut self, total: u64) -> Res<(f64, f64, String)> {
        let mut secs = 0.0;
        for_ttl_batches(total, |items| {
            let started = Instant::now();
            let mut conn = self.conn();
            let tx = conn.transaction()?;
            {
                let mut delete = tx.prepare_cached("DELETE FROM items WHERE id = ?1")?;
                for it in &items {
                    delete.execute([&it.id])?;
                }
            }
            tx.commit()?;
            secs += started.elapsed().as_secs_f64();
            Ok(())
        })?;
        let started = Instant::now();
        self.conn().execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")?;
        Ok((
            secs,
            started.elapsed().as_secs_f64(),
            "DELETE in durable transactions of 1,000, then VACUUM and wal_checkpoint(TRUNCATE)".into(),
        ))
    }
}

/// fjall 2: partitions `items`, `by_type`, `by_scope`, `by_ts`, written in one batch committed with
/// `PersistMode::SyncData` (fdatasync of the journal).
struct Fjall {
    keyspace: fjall::Keyspace,
    items: fjall::PartitionHandle,
    by_type: fjall::PartitionHandle,
    by_scope: fjall::PartitionHandle,
    by_ts: fjall::PartitionHandle,
}

impl Fjall {
    fn open(dir: &Path) -> Res<Self> {
        let keyspace = fjall::Config::new(dir).open()?;
        let part = |name: &str| keyspace.open_partition(name, fjall::PartitionCreateOptions::default());
        Ok(Self {
            items: part("items")?,
            by_type: part("by_type")?,
            by_scope: part("by_scope")?,
            by_ts: part("by_ts")?,
            keyspace,
        })
    }
}

impl Engine for Fjall {
    fn add(&self, items: Vec<ContextItem>) -> Res<()> {
        let mut batch = self.keyspace.batch().durability(Some(fjall::PersistMode::SyncData));
        for it in &items {
            let [t, s, w] = index_keys(it);
            batch.insert(&self.items, it.id.as_bytes(), it.to_json().into_bytes());
            batch.insert(&self.by_type, t, []);
            batch.insert(&self.by_scope, s, []);
            batch.insert(&self.by_ts, w, []);
        }
        batch.commit()?;
        Ok(())
    }
    fn resolve(&self, id: &str) -> Res<Option<ContextItem>> {
        self.items.get(id)?.map(|v| parse(&v)).transpose()
    }
    fn resolve_raw(&self, id: &str) -> Res<Option<usize>> {
        Ok(self.items.get(id)?.map(|v| v.to_vec().len()))
    }
    fn query(&self, kind: &str, start: i64, end: i64, raw: bool) -> Res<usize> {
        let (lo, hi) = type_range(kind, start, end);
        let mut count = 0;
        for kv in self.by_type.range(lo..hi) {
            let (key, _) = kv?;
            if let Some(v) = self.items.get(id_of_type_key(kind, &key))? {
                take(&v, raw)?;
                count += 1;
            }
        }
        Ok(count)
    }
    fn expire_half(&mut self, total: u64) -> Res<(f64, f64, String)> {
        let mut secs = 0.0;
        for_ttl_batches(total, |items| {
            let started = Instant::now();
            let mut batch = self.keyspace.batch().durability(Some(fjall::PersistMode::SyncData));
            for it in &items {
                let [t, s, w] = index_keys(it);
                batch.remove(&self.items, it.id.as_bytes());
                batch.remove(&self.by_type, t);
                batch.remove(&self.by_scope, s);
                batch.remove(&self.by_ts, w);
            }
            batch.commit()?;
            secs += started.elapsed().as_secs_f64();
            Ok(())
        })?;
        let started = Instant::now();
        // fjall 2 has no public "reclaim now": seal the memtables (the flush worker writes them out as
        // segments; wait for it by its counter: `rotate_memtable_and_wait` never returns here, and
        // `force_flush` races the flush worker and panics), then a major compaction of every partition
        // drops the tombstoned keys.
        let before = self.keyspace.flushes_completed();
        let mut sealed = 0;
        for p in [&self.items, &self.by_type, &self.by_scope, &self.by_ts] {
            sealed += usize::from(p.rotate_memtable()?);
        }
        while self.keyspace.flushes_completed() < before + sealed {
            if started.elapsed().as_secs() > 300 {
                return Err("fjall: the memtable flushes did not finish in 300 s".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        for p in [&self.items, &self.by_type, &self.by_scope, &self.by_ts] {
            p.major_compact()?;
        }
        self.keyspace.persist(fjall::PersistMode::SyncAll)?;
        Ok((
            secs,
            started.elapsed().as_secs_f64(),
            "removes in durable batches of 1,000, then rotate_memtable + wait for the flushes + major_compact per partition"
                .into(),
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring.

/// (apparent bytes, allocated bytes) of every file under `dir`.
fn dir_bytes(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                let (a, b) = dir_bytes(&entry.path());
                total.0 += a;
                total.1 += b;
            } else {
                total.0 += meta.len();
                total.1 += meta.blocks() * 512;
            }
        }
    }
    total
}

/// CPU seconds the worker process has used, user and system, over all its threads
/// (`CLOCK_PROCESS_CPUTIME_ID`): on a shared machine, the time a phase actually ran, whatever else
/// was scheduled beside it, and counting every thread an engine works on for it (ctxlog's reads of
/// many items use helper threads, `Options::read_threads`; other engines' background threads).
#[allow(
    unsafe_code,
    reason = "a libc call with no safe wrapper in the benchmark's dependencies"
)]
fn process_cpu_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return f64::NAN;
    }
    #[allow(clippy::cast_precision_loss)]
    let secs = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    secs
}

/// Wall-clock and on-CPU time of one phase.
struct Timer {
    wall: Instant,
    cpu: f64,
}

impl Timer {
    fn start() -> Self {
        Timer {
            wall: Instant::now(),
            cpu: process_cpu_secs(),
        }
    }
    /// (wall seconds, CPU seconds) since the start.
    fn stop(&self) -> (f64, f64) {
        (self.wall.elapsed().as_secs_f64(), process_cpu_secs() - self.cpu)
    }
}

fn percentile_ms(sorted: &[f64], p: f64) -> f64 {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(at).copied().unwrap_or(0.0) * 1e3
}

/// The latencies at each of `LATENCY_QUANTILES`, in ms (`sorted` in seconds, ascending).
fn quantiles_ms(sorted: &[f64]) -> Value {
    json!(LATENCY_QUANTILES
        .iter()
        .map(|&q| percentile_ms(sorted, q))
        .collect::<Vec<f64>>())
}

fn to_f64(x: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let f = x as f64;
    f
}

/// Sizes of the phases for `n` (the issue's at N = 200,000; smaller for smoke runs).
struct Sizes {
    p2_ops: u64,
    p3_ops: u64,
    p4_queries: u64,
}

impl Sizes {
    fn for_n(n: u64) -> Self {
        Sizes {
            p2_ops: 2000.min(n / 4).max(THREADS),
            p3_ops: 100_000.min(n * 5),
            p4_queries: 1000.min((n / 200).max(10)),
        }
    }
}

/// The P4 query `q`: a type (cycling through the seven) and a window wide enough for ~1,000 items.
fn p4_query(q: u64, n: u64) -> (&'static str, i64, i64) {
    let (kind, share) = TYPES[usize::try_from(q % 7).unwrap_or(0)];
    let width = (100_000 / u64::from(share)).min(n);
    let start = mix(q ^ 0x5eed) % (n - width + 1);
    let start = BASE_TS + i64::try_from(start).unwrap_or(0);
    (kind, start, start + i64::try_from(width).unwrap_or(0) - 1)
}

/// The largest anonymous and file-backed resident sizes seen at the ends of the phases: what the
/// peak RSS (VmHWM, which the kernel keeps for the total only) is made of.
#[derive(Default)]
struct RssKinds {
    anon_kib: u64,
    file_kib: u64,
}

impl RssKinds {
    fn sample(&mut self) {
        let (anon, file) = rss_kinds_kib();
        self.anon_kib = self.anon_kib.max(anon);
        self.file_kib = self.file_kib.max(file);
    }
}

#[allow(clippy::too_many_lines)]
fn worker(engine: &str, run: u64, n: u64, dir: &Path, phases: &[String]) -> Res<Value> {
    let has = |p: &str| phases.iter().any(|x| x == p);
    let sizes = Sizes::for_n(n);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let clock = Arc::new(ManualClock::new(BASE_TS));
    let mut out = Map::new();
    out.insert("kind".into(), json!("engine"));
    out.insert("engine".into(), json!(engine));
    out.insert("run".into(), json!(run));
    out.insert("n".into(), json!(n));
    // The q of each value in the `*_latency_ms_quantiles` arrays (1.0: the largest).
    out.insert("latency_quantiles".into(), json!(LATENCY_QUANTILES));
    let mut db: Arc<dyn Engine> = Arc::from(open_engine(engine, dir, &clock)?);
    let mut logical = 0u64;

    // P1: bulk load in durable batches of 1,000 (always run: the later phases need the data).
    let mut secs = 0.0;
    let mut next = 0u64;
    while next < n {
        let end = n.min(next + BATCH as u64);
        let batch: Vec<ContextItem> = (next..end).map(item).collect();
        logical += batch.iter().map(|it| it.to_json().len() as u64).sum::<u64>();
        let started = Instant::now();
        db.add(batch)?;
        secs += started.elapsed().as_secs_f64();
        next = end;
    }
    let load_logical = logical;
    out.insert("p1_s".into(), json!(secs));
    out.insert("p1_items_s".into(), json!(to_f64(n) / secs));
    out.insert("p1_mb_s".into(), json!(to_f64(load_logical) / secs / 1e6));
    eprintln!("[{engine} run {run}] P1 {:.0} items/s", to_f64(n) / secs);

    let mut rss = RssKinds::default();
    rss.sample();

    // P2: durable single-item adds, from one thread, then from 8 threads at once.
    let mut total = n;
    if has("p2") {
        let mut lat = Vec::with_capacity(usize::try_from(sizes.p2_ops)?);
        let started_all = Instant::now();
        for i in total..total + sizes.p2_ops {
            let it = item(i);
            logical += it.to_json().len() as u64;
            let started = Instant::now();
            db.add(vec![it])?;
            lat.push(started.elapsed().as_secs_f64());
        }
        let wall = started_all.elapsed().as_secs_f64();
        let busy: f64 = lat.iter().sum();
        lat.sort_by(f64::total_cmp);
        out.insert("p2_ops_s".into(), json!(to_f64(sizes.p2_ops) / busy));
        out.insert("p2_wall_ops_s".into(), json!(to_f64(sizes.p2_ops) / wall));
        out.insert("p2_p50_ms".into(), json!(percentile_ms(&lat, 0.5)));
        out.insert("p2_p99_ms".into(), json!(percentile_ms(&lat, 0.99)));
        out.insert("p2_latency_ms_quantiles".into(), quantiles_ms(&lat));
        total += sizes.p2_ops;

        // Generating the items is never timed: each thread gets its items ready, the threads meet
        // at a barrier, and the wall clock runs from there until the last one is done.
        let per_thread = sizes.p2_ops / THREADS;
        let first = total;
        let start_line = Arc::new(std::sync::Barrier::new(usize::try_from(THREADS)? + 1));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let db = db.clone();
                let start_line = Arc::clone(&start_line);
                std::thread::spawn(move || -> Res<(Vec<f64>, u64)> {
                    let items: Vec<ContextItem> = (0..per_thread).map(|i| item(first + t * per_thread + i)).collect();
                    let bytes = items.iter().map(|it| it.to_json().len() as u64).sum();
                    let mut lat = Vec::with_capacity(items.len());
                    start_line.wait();
                    for it in items {
                        let started = Instant::now();
                        db.add(vec![it])?;
                        lat.push(started.elapsed().as_secs_f64());
                    }
                    Ok((lat, bytes))
                })
            })
            .collect();
        start_line.wait();
        let started = Instant::now();
        let mut lat = Vec::new();
        for h in handles {
            let (l, b) = h.join().map_err(|_| "a P2 thread panicked")??;
            lat.extend(l);
            logical += b;
        }
        let wall = started.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        out.insert("p2_8t_ops_s".into(), json!(to_f64(per_thread * THREADS) / wall));
        out.insert("p2_8t_p50_ms".into(), json!(percentile_ms(&lat, 0.5)));
        out.insert("p2_8t_p99_ms".into(), json!(percentile_ms(&lat, 0.99)));
        out.insert("p2_8t_latency_ms_quantiles".into(), quantiles_ms(&lat));
        total += per_thread * THREADS;
        eprintln!(
            "[{engine} run {run}] P2 {:.0} ops/s one thread, {:.0} ops/s 8 threads",
            to_f64(sizes.p2_ops) / busy,
            to_f64(per_thread * THREADS) / wall
        );
    }
    out.insert("items_total".into(), json!(total));
    out.insert("logical_bytes".into(), json!(logical));

    rss.sample();

    // P6: footprint, live, after the loads.
    if has("p6") {
        // Allocated blocks (what `du` shows): fjall preallocates its journals sparsely (32 MiB apparent).
        let (apparent, bytes) = dir_bytes(dir);
        out.insert("p6_bytes".into(), json!(bytes));
        out.insert("p6_apparent_bytes".into(), json!(apparent));
        out.insert("p6_ratio".into(), json!(to_f64(bytes) / to_f64(logical)));
    }

    // P3: random resolves by id, parsed; then the same ids as raw JSON.
    if has("p3") {
        let ids: Vec<String> = (0..sizes.p3_ops)
            .map(|i| format!("item-{:08}", mix(i ^ 0xabcd) % n))
            .collect();
        // One resolve in P3_SAMPLE_EVERY is timed on its own (two clock reads in 16 resolves: nothing
        // the phase's own figure notices).
        let mut lat = Vec::with_capacity(ids.len() / P3_SAMPLE_EVERY + 1);
        let timer = Timer::start();
        let mut found = 0u64;
        for (i, id) in ids.iter().enumerate() {
            let started = i.is_multiple_of(P3_SAMPLE_EVERY).then(Instant::now);
            if db.resolve(id)?.is_some() {
                found += 1;
            }
            if let Some(started) = started {
                lat.push(started.elapsed().as_secs_f64());
            }
        }
        let (secs, cpu) = timer.stop();
        lat.sort_by(f64::total_cmp);
        out.insert("p3_latency_ms_quantiles".into(), quantiles_ms(&lat));
        out.insert("p3_latency_sample_every".into(), json!(P3_SAMPLE_EVERY));
        lat.clear();
        if found != sizes.p3_ops {
            return Err(format!("P3: {found} of {} ids found", sizes.p3_ops).into());
        }
        out.insert("p3_ops_s".into(), json!(to_f64(sizes.p3_ops) / secs));
        out.insert("p3_cpu_ops_s".into(), json!(to_f64(sizes.p3_ops) / cpu));
        let timer = Timer::start();
        let (mut found, mut bytes) = (0u64, 0usize);
        for (i, id) in ids.iter().enumerate() {
            let started = i.is_multiple_of(P3_SAMPLE_EVERY).then(Instant::now);
            if let Some(len) = db.resolve_raw(id)? {
                found += 1;
                bytes += len;
            }
            if let Some(started) = started {
                lat.push(started.elapsed().as_secs_f64());
            }
        }
        let (raw_secs, raw_cpu) = timer.stop();
        lat.sort_by(f64::total_cmp);
        out.insert("p3_raw_latency_ms_quantiles".into(), quantiles_ms(&lat));
        if found != sizes.p3_ops {
            return Err(format!("P3 raw: {found} of {} ids found", sizes.p3_ops).into());
        }
        out.insert("p3_raw_ops_s".into(), json!(to_f64(sizes.p3_ops) / raw_secs));
        out.insert("p3_raw_cpu_ops_s".into(), json!(to_f64(sizes.p3_ops) / raw_cpu));
        out.insert("p3_raw_bytes".into(), json!(bytes));
        eprintln!(
            "[{engine} run {run}] P3 {:.0} resolves/s parsed, {:.0} raw",
            to_f64(sizes.p3_ops) / secs,
            to_f64(sizes.p3_ops) / raw_secs
        );
    }

    rss.sample();

    // P4: typed time-window queries, parsed, then the same queries raw.
    if has("p4") {
        let mut secs = [0.0; 2];
        let mut cpu = [0.0; 2];
        let mut items = [0; 2];
        for (pass, raw) in [false, true].into_iter().enumerate() {
            let timer = Timer::start();
            for q in 0..sizes.p4_queries {
                let (kind, start, end) = p4_query(q, n);
                items[pass] += db.query(kind, start, end, raw)?;
            }
            (secs[pass], cpu[pass]) = timer.stop();
        }
        if items[0] != items[1] {
            return Err(format!("P4: {} items parsed, {} raw", items[0], items[1]).into());
        }
        out.insert("p4_items".into(), json!(items[0]));
        out.insert("p4_queries".into(), json!(sizes.p4_queries));
        out.insert("p4_items_s".into(), json!(to_f64(items[0] as u64) / secs[0]));
        out.insert("p4_raw_items_s".into(), json!(to_f64(items[1] as u64) / secs[1]));
        out.insert("p4_cpu_items_s".into(), json!(to_f64(items[0] as u64) / cpu[0]));
        out.insert("p4_raw_cpu_items_s".into(), json!(to_f64(items[1] as u64) / cpu[1]));
        eprintln!(
            "[{engine} run {run}] P4 {:.0} items/s parsed, {:.0} raw ({} items)",
            to_f64(items[0] as u64) / secs[0],
            to_f64(items[1] as u64) / secs[1],
            items[0]
        );
    }

    rss.sample();

    // P5: close, then reopen until the first resolve answers.
    if has("p5") {
        let started = Instant::now();
        drop(db);
        out.insert("p5_close_s".into(), json!(started.elapsed().as_secs_f64()));
        let started = Instant::now();
        db = Arc::from(open_engine(engine, dir, &clock)?);
        let first = db.resolve("item-00000001")?;
        let secs = started.elapsed().as_secs_f64();
        if first.is_none() {
            return Err("P5: item-00000001 not found after reopen".into());
        }
        out.insert("p5_reopen_s".into(), json!(secs));
        let (_, bytes) = dir_bytes(dir);
        out.insert("p5_bytes_after_reopen".into(), json!(bytes));
        // P6 again, at a point every engine reaches the same way: a clean close (ctxlog writes its
        // checkpoint there; a live P6 may or may not see a periodic one) and a reopen.
        out.insert("p6_ratio_after_reopen".into(), json!(to_f64(bytes) / to_f64(logical)));
        eprintln!("[{engine} run {run}] P5 reopen {secs:.3} s");
    }
    rss.sample();
    db.extra(&mut out);

    // P7: expire half the items and reclaim the space.
    if has("p7") {
        let mut live_logical = 0u64;
        for i in (1..total).step_by(2) {
            live_logical += item(i).to_json().len() as u64;
        }
        let engine_mut = Arc::get_mut(&mut db).ok_or("P7: the engine is still shared")?;
        let (expire, reclaim, how) = engine_mut.expire_half(total)?;
        let (apparent, bytes) = dir_bytes(dir);
        out.insert("p7_expire_s".into(), json!(expire));
        out.insert("p7_reclaim_s".into(), json!(reclaim));
        out.insert("p7_total_s".into(), json!(expire + reclaim));
        out.insert("p7_bytes_after".into(), json!(bytes));
        out.insert("p7_apparent_bytes_after".into(), json!(apparent));
        out.insert("p7_live_logical".into(), json!(live_logical));
        out.insert("p7_ratio_live".into(), json!(to_f64(bytes) / to_f64(live_logical)));
        out.insert("p7_how".into(), json!(how));
        let check = if total > 1 { db.resolve("item-00000001")? } else { None };
        if total > 1 && check.is_none() {
            return Err("P7: a live item is gone".into());
        }
        eprintln!("[{engine} run {run}] P7 expire {expire:.3} s, reclaim {reclaim:.3} s, {bytes} bytes after");
    }
    rss.sample();
    drop(db);
    out.insert("rss_peak_kib".into(), json!(peak_rss_kib()));
    out.insert("rss_anon_phase_max_kib".into(), json!(rss.anon_kib));
    out.insert("rss_file_phase_max_kib".into(), json!(rss.file_kib));
    out.insert(
        "loadavg_end".into(),
        json!(std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()),
    );
    let _ = std::fs::remove_dir_all(dir);
    Ok(Value::Object(out))
}

// ---------------------------------------------------------------------------------------------
// The disk's limits, measured by the parent in the same run.

/// Sequential write of `mb` MiB straight to the device (`O_DIRECT`, 4 MiB aligned writes from one
/// buffer, then an fdatasync): the disk's bandwidth without the page cache, whose new pages a VM
/// may get slowly from its host (the buffered probe pays for them, as every engine's writes do).
/// `None` where the file system refuses `O_DIRECT`.
fn direct_write_mb_s(dir: &Path, mb: u64) -> Option<f64> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const ALIGN: usize = 4096;
    let path = dir.join("direct.probe");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .ok()?;
    let mut buf = vec![0x5au8; (4 << 20) + ALIGN];
    let skip = buf.as_ptr().align_offset(ALIGN);
    let chunk = buf.get_mut(skip..skip + (4 << 20))?;
    let started = Instant::now();
    let mut written = true;
    for k in 0..mb / 4 {
        if file.write_all_at(chunk, k * (4 << 20)).is_err() {
            written = false;
            break;
        }
    }
    let synced = written && file.sync_data().is_ok();
    let mb_s = to_f64(mb) * 1.048_576 / started.elapsed().as_secs_f64();
    drop(file);
    let _ = std::fs::remove_file(&path);
    synced.then_some(mb_s)
}

fn disk_limits(dir: &Path, n: u64) -> Res<Value> {
    std::fs::create_dir_all(dir)?;
    let mb: u64 = if n >= 50_000 { 512 } else { 64 };
    let path = dir.join("seq.probe");
    let chunk = vec![0x5au8; 4 << 20];
    let started = Instant::now();
    let mut file = File::create(&path)?;
    for _ in 0..mb / 4 {
        file.write_all(&chunk)?;
    }
    file.sync_data()?;
    let write_mb_s = to_f64(mb) * 1.048_576 / started.elapsed().as_secs_f64();
    drop(file);

    // Cold-ish read: drop the file's clean pages (posix_fadvise DONTNEED) and, as root, the page cache.
    let file = File::open(&path)?;
    #[allow(
        unsafe_code,
        reason = "a libc call with no safe wrapper in the benchmark's dependencies"
    )]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a plain syscall on an open descriptor.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let dropped = std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
    let mut file = file;
    let mut buf = vec![0u8; 4 << 20];
    let started = Instant::now();
    let mut read = 0u64;
    loop {
        let got = file.read(&mut buf)?;
        if got == 0 {
            break;
        }
        read += got as u64;
    }
    let read_mb_s = to_f64(read) / 1e6 / started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    let direct_mb_s = direct_write_mb_s(dir, mb);

    // 4 KiB append + fdatasync, from one thread.
    let ops: u64 = if n >= 50_000 { 2000 } else { 500 };
    let path = dir.join("append.probe");
    let mut file = File::create(&path)?;
    let block = vec![0xa5u8; 4096];
    let mut lat = Vec::new();
    let started = Instant::now();
    for _ in 0..ops {
        let t = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        lat.push(t.elapsed().as_secs_f64());
    }
    let append_ops_s = to_f64(ops) / started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(json!({
        "kind": "disk",
        "seq_write_mb_s": write_mb_s,
        "seq_write_mib": mb,
        "seq_write_direct_mb_s": direct_mb_s,
        "cold_read_mb_s": read_mb_s,
        "cold_read_how": if dropped { "posix_fadvise(DONTNEED) + drop_caches=3 (a VM's host cache may still serve it)" } else { "posix_fadvise(DONTNEED) only" },
        "append_fdatasync_ops_s": append_ops_s,
        "append_p50_ms": percentile_ms(&lat, 0.5),
        "append_p99_ms": percentile_ms(&lat, 0.99),
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    }))
}

// ---------------------------------------------------------------------------------------------
// The parent: runs the workers, collects, prints.

struct Args {
    n: u64,
    engines: Vec<String>,
    phases: Vec<String>,
    runs: u64,
    dir: PathBuf,
    out: PathBuf,
    worker: Option<String>,
    run: u64,
    timeout: u64,
}

fn parse_args() -> Res<Args> {
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let mut args = Args {
        n: 200_000,
        engines: ALL_ENGINES.iter().map(|s| (*s).to_owned()).collect(),
        phases: ALL_PHASES.iter().map(|s| (*s).to_owned()).collect(),
        runs: 3,
        dir: target.join("compare-data"),
        out: target.join("compare-results.jsonl"),
        worker: None,
        run: 1,
        timeout: 900,
    };
    let list = |s: String| {
        s.split(',')
            .map(|x| x.trim().to_lowercase())
            .filter(|x| !x.is_empty())
            .collect()
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--n" => args.n = value()?.replace('_', "").parse()?,
            "--engines" => args.engines = list(value()?),
            "--phases" => args.phases = list(value()?),
            "--runs" => args.runs = value()?.parse()?,
            "--dir" => args.dir = PathBuf::from(value()?),
            "--out" => args.out = PathBuf::from(value()?),
            "--worker" => args.worker = Some(value()?),
            "--run" => args.run = value()?.parse()?,
            "--timeout" => args.timeout = value()?.parse()?,
            "--bench" => {} // cargo bench passes it
            "--help" | "-h" => {
                println!(
                    "compare [--n N] [--engines {}] [--phases {}] [--runs R] [--dir DIR] [--out FILE.jsonl] [--timeout SECS per worker]",
                    ALL_ENGINES.join(","),
                    ALL_PHASES.join(",")
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    for e in &args.engines {
        if !ALL_ENGINES.contains(&e.as_str()) {
            return Err(format!("unknown engine {e:?}; known: {}", ALL_ENGINES.join(",")).into());
        }
    }
    for p in &args.phases {
        if !ALL_PHASES.contains(&p.as_str()) {
            return Err(format!("unknown phase {p:?}; known: {}", ALL_PHASES.join(",")).into());
        }
    }
    if args.n < 1000 {
        return Err("--n must be at least 1000".into());
    }
    Ok(args)
}

use ctxlog_bench::charts::median;

/// A row of the table: phase, label, JSON field, whether higher is better, format.
struct Row {
    phase: &'static str,
    label: &'static str,
    field: &'static str,
    higher_better: bool,
    /// Multiply for display (bytes to MB, KiB to MiB, s to ms).
    scale: f64,
    decimals: usize,
}

const ROWS: [Row; 30] = [
    row("p1", "P1 bulk load, items/s", "p1_items_s", true, 1.0, 0),
    row("p1", "P1 bulk load, MB/s of JSON", "p1_mb_s", true, 1.0, 1),
    row("p2", "P2 1 thread, durable adds/s", "p2_ops_s", true, 1.0, 0),
    row("p2", "P2 1 thread, p50 ms", "p2_p50_ms", false, 1.0, 2),
    row("p2", "P2 1 thread, p99 ms", "p2_p99_ms", false, 1.0, 2),
    row("p2", "P2 8 threads, durable adds/s", "p2_8t_ops_s", true, 1.0, 0),
    row("p2", "P2 8 threads, p50 ms", "p2_8t_p50_ms", false, 1.0, 2),
    row("p2", "P2 8 threads, p99 ms", "p2_8t_p99_ms", false, 1.0, 2),
    row("p3", "P3 resolves/s, parsed", "p3_ops_s", true, 1.0, 0),
    row("p3", "P3 resolves/s, raw JSON", "p3_raw_ops_s", true, 1.0, 0),
    row("p3", "P3 resolves per CPU-second, parsed", "p3_cpu_ops_s", true, 1.0, 0),
    row(
        "p3",
        "P3 resolves per CPU-second, raw",
        "p3_raw_cpu_ops_s",
        true,
        1.0,
        0,
    ),
    row(
        "p4",
        "P4 typed window query, items/s, parsed",
        "p4_items_s",
        true,
        1.0,
        0,
    ),
    row(
        "p4",
        "P4 typed window query, items/s, raw JSON",
        "p4_raw_items_s",
        true,
        1.0,
        0,
    ),
    row("p4", "P4 items per CPU-second, parsed", "p4_cpu_items_s", true, 1.0, 0),
    row("p4", "P4 items per CPU-second, raw", "p4_raw_cpu_items_s", true, 1.0, 0),
    row("p5", "P5 close, ms", "p5_close_s", false, 1e3, 1),
    row("p5", "P5 reopen to first resolve, ms", "p5_reopen_s", false, 1e3, 1),
    row("p6", "P6 bytes on disk (allocated), MB", "p6_bytes", false, 1e-6, 1),
    row("p6", "P6 bytes on disk / logical JSON", "p6_ratio", false, 1.0, 2),
    row(
        "p5",
        "P6 after close and reopen, bytes on disk / logical JSON",
        "p6_ratio_after_reopen",
        false,
        1.0,
        2,
    ),
    row("p7", "P7 expire/delete half, s", "p7_expire_s", false, 1.0, 3),
    row("p7", "P7 reclaim, s", "p7_reclaim_s", false, 1.0, 3),
    row("p7", "P7 total, s", "p7_total_s", false, 1.0, 3),
    row("p7", "P7 bytes after (allocated), MB", "p7_bytes_after", false, 1e-6, 1),
    row(
        "p7",
        "P7 bytes after / live logical JSON",
        "p7_ratio_live",
        false,
        1.0,
        2,
    ),
    row("", "index bytes/item (stats)", "index_bytes_per_item", false, 1.0, 1),
    row("", "peak RSS, MiB", "rss_peak_kib", false, 1.0 / 1024.0, 0),
    row(
        "",
        "of it: anonymous RSS, largest at a phase's end, MiB",
        "rss_anon_phase_max_kib",
        false,
        1.0 / 1024.0,
        0,
    ),
    row(
        "",
        "of it: file-backed RSS (mapped files), largest at a phase's end, MiB",
        "rss_file_phase_max_kib",
        false,
        1.0 / 1024.0,
        0,
    ),
];

const fn row(
    phase: &'static str,
    label: &'static str,
    field: &'static str,
    higher_better: bool,
    scale: f64,
    decimals: usize,
) -> Row {
    Row {
        phase,
        label,
        field,
        higher_better,
        scale,
        decimals,
    }
}

fn fmt(x: Option<f64>, decimals: usize) -> String {
    x.map_or_else(|| "–".to_owned(), |x| format!("{x:.decimals$}"))
}

fn table(args: &Args, results: &[Value], disks: &[Value]) -> String {
    let med = |engine: &str, field: &str| -> Option<f64> {
        median(
            results
                .iter()
                .filter(|r| r["engine"] == engine)
                .filter_map(|r| r[field].as_f64())
                .collect(),
        )
    };
    let disk = |field: &str| median(disks.iter().filter_map(|d| d[field].as_f64()).collect());
    let mut s = String::new();
    let runs = results.iter().filter_map(|r| r["run"].as_u64()).max().unwrap_or(0);
    s.push_str(&format!(
        "W1, N = {}, medians of {} run(s); each (engine, run) in its own process.\n\n",
        args.n, runs
    ));
    s.push_str("| metric |");
    for e in &args.engines {
        s.push_str(&format!(" {e} |"));
    }
    let has_ctxlog = args.engines.iter().any(|e| e == "ctxlog");
    let others: Vec<&String> = args.engines.iter().filter(|e| *e != "ctxlog").collect();
    if has_ctxlog && !others.is_empty() {
        s.push_str(" ctxlog vs best other |");
    }
    s.push_str("\n|---|");
    for _ in &args.engines {
        s.push_str("---:|");
    }
    if has_ctxlog && !others.is_empty() {
        s.push_str("---:|");
    }
    s.push('\n');
    for r in &ROWS {
        if !r.phase.is_empty() && !args.phases.iter().any(|p| p == r.phase) && r.phase != "p1" {
            continue;
        }
        let values: Vec<Option<f64>> = args.engines.iter().map(|e| med(e, r.field)).collect();
        if values.iter().all(Option::is_none) {
            continue;
        }
        s.push_str(&format!("| {} |", r.label));
        for v in &values {
            s.push_str(&format!(" {} |", fmt(v.map(|v| v * r.scale), r.decimals)));
        }
        if has_ctxlog && !others.is_empty() {
            let mine = med("ctxlog", r.field);
            let best = others
                .iter()
                .filter_map(|e| med(e, r.field).map(|v| (e.as_str(), v)))
                .reduce(|a, b| {
                    let better = if r.higher_better { b.1 > a.1 } else { b.1 < a.1 };
                    if better {
                        b
                    } else {
                        a
                    }
                });
            match (mine, best) {
                (Some(m), Some((who, b))) if b > 0.0 && m > 0.0 => {
                    // Always "how many times better": > 1 means ctxlog wins.
                    let ratio = if r.higher_better { m / b } else { b / m };
                    if ratio > 1000.0 {
                        s.push_str(&format!(" >1000x ({who}) |"));
                    } else {
                        s.push_str(&format!(" {ratio:.2}x ({who}) |"));
                    }
                }
                _ => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    s.push_str("\nRatios are \"times better than the best other engine\" (> 1: ctxlog ahead), whichever way the metric points.\n");
    // ctxlog's raw read against the others' parsed one: what a server that forwards JSON gains over
    // one that parses stored JSON back into items.
    for (label, raw_field, parsed_field) in [
        ("P3 resolves/s", "p3_raw_ops_s", "p3_ops_s"),
        ("P4 items/s", "p4_raw_items_s", "p4_items_s"),
        ("P3 resolves per CPU-second", "p3_raw_cpu_ops_s", "p3_cpu_ops_s"),
        ("P4 items per CPU-second", "p4_raw_cpu_items_s", "p4_cpu_items_s"),
    ] {
        let best = others
            .iter()
            .filter_map(|e| med(e, parsed_field).map(|v| (e.as_str(), v)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let (Some(mine), Some((who, b))) = (med("ctxlog", raw_field), best) {
            if b > 0.0 {
                s.push_str(&format!(
                    "{label}: ctxlog raw / best other parsed = {:.2}x ({who})\n",
                    mine / b
                ));
            }
        }
    }
    if !disks.is_empty() {
        let w = disk("seq_write_mb_s");
        let wd = disk("seq_write_direct_mb_s");
        let a = disk("append_fdatasync_ops_s");
        let rd = disk("cold_read_mb_s");
        s.push_str(&format!(
            "\nDisk limits (same run, medians): sequential write with fdatasync {} MB/s through the page cache, {} MB/s direct (O_DIRECT); 4 KiB append+fdatasync {} ops/s (p50 {} ms, p99 {} ms); cold sequential read {} MB/s ({}).\n",
            fmt(w, 0),
            fmt(wd, 0),
            fmt(a, 0),
            fmt(disk("append_p50_ms"), 2),
            fmt(disk("append_p99_ms"), 2),
            fmt(rd, 0),
            disks.last().and_then(|d| d["cold_read_how"].as_str()).unwrap_or("?"),
        ));
        if has_ctxlog {
            let p1 = med("ctxlog", "p1_mb_s");
            let p2 = med("ctxlog", "p2_ops_s");
            let p2_8 = med("ctxlog", "p2_8t_ops_s");
            let share = |x: Option<f64>, of: Option<f64>| match (x, of) {
                (Some(x), Some(of)) if of > 0.0 => format!("{:.0}%", x / of * 100.0),
                _ => "–".into(),
            };
            s.push_str(&format!(
                "ctxlog as a share of the physical limit: P1 {} of sequential write bandwidth through the page cache, {} of direct (JSON MB/s); P2 one thread {} of the raw append+fdatasync rate; P2 8 threads / 1 thread = {}.\n",
                share(p1, w),
                share(p1, wd),
                share(p2, a),
                match (p2_8, p2) {
                    (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
                    _ => "–".into(),
                }
            ));
        }
    }
    // Every engine must have answered P4 with the same items.
    let counts: BTreeMap<String, u64> = results
        .iter()
        .filter_map(|r| Some((r["engine"].as_str()?.to_owned(), r["p4_items"].as_u64()?)))
        .collect();
    let distinct: std::collections::BTreeSet<u64> = counts.values().copied().collect();
    if distinct.len() > 1 {
        s.push_str(&format!(
            "\nWARNING: P4 item counts differ between engines: {counts:?}\n"
        ));
    }
    s
}

fn parent(args: &Args) -> Res<()> {
    let exe = std::env::current_exe()?;
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut jsonl = std::fs::OpenOptions::new().create(true).append(true).open(&args.out)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let machine = json!({
        "nproc": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "mem_total_kib": std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
            m.lines().next()?.split_whitespace().nth(1)?.parse::<u64>().ok()
        }),
    });
    let mut results = Vec::new();
    let mut disks = Vec::new();
    for run in 1..=args.runs {
        eprintln!("== run {run}: disk limits");
        let mut d = disk_limits(&args.dir.join("disk"), args.n)?;
        d["run"] = json!(run);
        d["started"] = json!(stamp);
        d["machine"] = machine.clone();
        eprintln!("{d}");
        writeln!(jsonl, "{d}")?;
        disks.push(d);
        // Rotate the order each run so no engine always follows the same neighbour.
        let k = args.engines.len();
        for i in 0..k {
            let engine = &args.engines[(i + usize::try_from(run - 1)?) % k];
            let dir = args.dir.join(format!("{engine}-{run}"));
            eprintln!("== run {run}: {engine}");
            let result_file = args.dir.join(format!("{engine}-{run}.json"));
            let mut child = Command::new(&exe)
                .args([
                    "--worker",
                    engine,
                    "--run",
                    &run.to_string(),
                    "--n",
                    &args.n.to_string(),
                ])
                .arg("--phases")
                .arg(args.phases.join(","))
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::from(File::create(&result_file)?))
                .stderr(Stdio::inherit())
                .spawn()?;
            // A worker that hangs (an engine's bug) is killed and reported, not waited for forever.
            let started = Instant::now();
            let status = loop {
                if let Some(status) = child.try_wait()? {
                    break Some(status);
                }
                if started.elapsed().as_secs() > args.timeout {
                    eprintln!("worker {engine} run {run}: no answer after {} s, killed", args.timeout);
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            };
            let stdout = std::fs::read_to_string(&result_file).unwrap_or_default();
            let line = stdout.lines().rev().find(|l| l.starts_with('{'));
            match (status.is_some_and(|s| s.success()), line) {
                (true, Some(line)) => {
                    let mut v: Value = serde_json::from_str(line)?;
                    v["started"] = json!(stamp);
                    writeln!(jsonl, "{v}")?;
                    results.push(v);
                }
                _ => {
                    eprintln!("worker {engine} run {run} failed ({status:?}): {stdout}");
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&args.dir);
    println!("{}", table(args, &results, &disks));
    println!("(JSON lines appended to {})", args.out.display());
    Ok(())
}

fn main() {
    let result = parse_args().and_then(|args| match &args.worker {
        Some(engine) => worker(engine, args.run, args.n, &args.dir, &args.phases).map(|v| println!("{v}")),
        None => parent(&args),
    });
    if let Err(err) = result {
        eprintln!("compare: {err}");
        std::process::exit(1);
    }
}
