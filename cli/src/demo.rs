//! The tour itself: one step after the other on a store at a fresh directory, each printing what
//! it did and recording its checks; the verdict at the end.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ctxlog::{
    format_rfc3339, AddOutcome, Clock, ContextItem, ContextQuery, Error, ManualClock, Options, Receipt, Resolution,
    Scope, Snapshot, Store, TimeRange, TypeSpec,
};
use serde_json::json;

use crate::data::{
    amended_clause, bulk_items, late_chunks, revised_chunks, BULK_ITEMS, DAY, DEMO_NOW, HOUR, LATE, REVISED, SESSIONS,
};
use crate::report::{describe, describe_all, human_bytes, ms, print_compaction};

/// Items in one batch of the bulk write.
const BATCH_ITEMS: usize = 100;
/// The name the demo pins its snapshot under.
const PIN: &str = "audit-2024-05-10";

/// Errors of the demo: a message with what it was doing.
type Fallible<T> = Result<T, String>;

/// Adds what the demo was doing to an error.
trait Context<T> {
    fn context(self, what: &str) -> Fallible<T>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: &str) -> Fallible<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// The store directory: DIR as given, or a fresh one under the temp dir. A DIR that holds files but no
/// store is refused, so that the demo never writes into an unrelated directory.
fn demo_dir(dir: Option<PathBuf>) -> Fallible<PathBuf> {
    let Some(dir) = dir else {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        return Ok(std::env::temp_dir().join(format!("ctxlog-demo-{}-{nanos}", std::process::id())));
    };
    if dir.exists() {
        let entries = std::fs::read_dir(&dir).context(&format!("reading {}", dir.display()))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.context(&format!("reading {}", dir.display()))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        // The demo's story (a fixed clock, fresh ids) only holds in an empty store.
        if !names.is_empty() {
            return Err(format!(
                "{} is not empty; the demo needs an empty or new directory",
                dir.display()
            ));
        }
    }
    Ok(dir)
}

/// The first item `query` finds (`what` names it in errors).
fn first_item(store: &Store, query: &ContextQuery, what: &str) -> Fallible<ContextItem> {
    store
        .get(&query.clone().limit(1))
        .context(&format!("finding {what}"))?
        .into_iter()
        .next()
        .ok_or_else(|| format!("the demo data holds no {what}"))
}

/// An answer serialised, to compare answers byte for byte.
fn to_json<T: serde::Serialize>(value: &T) -> Fallible<String> {
    serde_json::to_string(value).context("serialising an answer")
}

/// What a snapshot answers, serialised: the chunk query, the resolve, and the digest.
fn snapshot_answers(snap: &Snapshot, query: &ContextQuery, refs: &[String]) -> Fallible<(String, String, String)> {
    let get = snap.get(query).context("snapshot get")?;
    let resolve = snap.resolve(refs).context("snapshot resolve")?;
    let digest = snap.digest().context("snapshot digest")?;
    Ok((to_json(&get)?, to_json(&resolve)?, digest))
}

/// Checks the demo makes as it goes; any failure makes it exit non-zero.
#[derive(Default)]
struct Checks(Vec<(&'static str, bool)>);

impl Checks {
    fn record(&mut self, what: &'static str, ok: bool) -> bool {
        self.0.push((what, ok));
        ok
    }
}

/// What the demo's steps share: the store's directory and clock, the query the snapshot story
/// follows (the document chunks of 08:00-09:59), and the checks made so far.
struct Demo {
    dir: PathBuf,
    clock: Arc<ManualClock>,
    chunks_query: ContextQuery,
    checks: Checks,
}

/// The pinned snapshot's record: the references resolved through it, what it answered when it was
/// taken (the chunk query's and the resolve's answers, serialised), its digest and the receipt of
/// its resolve. Every later step compares against it.
struct Pinned {
    refs: [String; 4],
    before: (String, String),
    digest: String,
    receipt: Receipt,
}

/// The tour, one step after the other; each step prints what it did and records its checks. The
/// error names a step that failed, or the checks that did not pass.
pub(crate) fn run(dir: Option<PathBuf>) -> Fallible<()> {
    let dir = demo_dir(dir)?;
    let window = TimeRange::parse("2024-05-10T08:00:00Z", "2024-05-10T09:59:59Z").context("parsing the window")?;
    let mut demo = Demo {
        dir,
        clock: Arc::new(ManualClock::new(DEMO_NOW)),
        chunks_query: ContextQuery::new().types(["document_chunk"]).time_range(window),
        checks: Checks::default(),
    };
    println!(
        "ctxlog demo: store {} (ManualClock at {})",
        demo.dir.display(),
        format_rfc3339(DEMO_NOW)
    );
    let store = demo.open()?;
    demo.register_clause_type(&store)?;
    bulk_write(&store)?;
    let chunks = demo.query(&store)?;
    let (doc, clause) = demo.resolve_each_kind(&store, &chunks)?;
    demo.isolate_sessions(&store)?;
    let deleted = chunks.last().cloned().ok_or("no document chunk in the window")?;
    let (snap, pinned) = demo.pin_snapshot(&store, &doc, &deleted, &clause)?;
    demo.change_the_store(&store, &chunks, &deleted)?;
    let live_get = demo.compare_snapshot_and_live(&store, snap, &pinned)?;
    demo.compact_with_pin(&store, &pinned, &live_get)?;
    let live_before = to_json(&live_get)?;
    let store = demo.reopen(store, &live_before)?;
    demo.open_pinned_after_reopen(&store, &pinned)?;
    demo.unpin_and_compact(&store, &pinned, &live_before)?;
    demo.stats_and_verify(&store)?;
    demo.finish()
}

impl Demo {
    /// Opens the store on the demo clock, with background compaction off: the demo compacts by hand.
    fn open_store(&self, what: &str) -> Fallible<Store> {
        Options::new()
            .clock(self.clock.clone())
            .auto_compact(false)
            .open(&self.dir)
            .context(what)
    }

    fn open(&self) -> Fallible<Store> {
        let started = Instant::now();
        let store = self.open_store("opening the store")?;
        println!(
            "open: {} (durability Immediate: every add returns after its fsync; auto_compact off: the demo compacts by hand)",
            ms(started.elapsed())
        );
        Ok(store)
    }

    /// Registers `legal_clause` with an id pattern, and shows an id that breaks it refused.
    fn register_clause_type(&mut self, store: &Store) -> Fallible<()> {
        let clause_pattern = r"^cl_[0-9.a-z]+$";
        store
            .register_type(TypeSpec::new("legal_clause").id_pattern(clause_pattern))
            .context("registering legal_clause")?;
        let refused = store.add([ContextItem::new(
            "clause-7",
            "legal_clause",
            json!({"text": "..."}),
            "contracts_sharepoint",
            DEMO_NOW,
            "1",
            Scope::GlobalReadonly,
        )]);
        let pattern_enforced = self.checks.record(
            "legal_clause id pattern enforced",
            matches!(refused, Err(Error::Invalid { .. })),
        );
        println!("register legal_clause {clause_pattern}: ok; id \"clause-7\" refused: {pattern_enforced}");
        Ok(())
    }

    /// The typed time-range query the snapshot story follows, and a query on content and
    /// confidence. Returns the document chunks of the window.
    fn query(&self, store: &Store) -> Fallible<Vec<ContextItem>> {
        let started = Instant::now();
        let (chunks, stats) = store
            .get_with_stats(&self.chunks_query)
            .context("querying document chunks")?;
        println!(
            "get document_chunk 08:00-09:59: returned {}, examined {}, index {:?}, {}",
            stats.returned,
            stats.examined,
            stats.index,
            ms(started.elapsed())
        );
        let cn_query = ContextQuery::new()
            .types(["legal_clause"])
            .content_eq("jurisdiction", json!("CN"))
            .min_confidence(0.8)
            .newest_first()
            .limit(5);
        let started = Instant::now();
        let (cn, stats) = store.get_with_stats(&cn_query).context("querying legal clauses")?;
        let cn_ids: Vec<&str> = cn.iter().map(|item| item.id.as_str()).collect();
        println!(
            "get legal_clause jurisdiction=CN confidence>=0.8 newest 5: [{}], examined {}, index {:?}, {}",
            cn_ids.join(", "),
            stats.examined,
            stats.index,
            ms(started.elapsed())
        );
        Ok(chunks)
    }

    /// Resolves that answer Found, Expired, Superseded and NotFound: a clause gets a second version,
    /// and the clock moves past the tool results' TTL. Returns the chunk found and the clause.
    fn resolve_each_kind(&mut self, store: &Store, chunks: &[ContextItem]) -> Fallible<(ContextItem, ContextItem)> {
        let doc = chunks.first().cloned().ok_or("no document chunk in the window")?;
        let tool = first_item(
            store,
            &ContextQuery::new().types(["tool_result"]).newest_first(),
            "tool result",
        )?;
        let clause = first_item(store, &ContextQuery::new().types(["legal_clause"]), "legal clause")?;
        store
            .add([amended_clause(&clause)])
            .context("adding a new version of a clause")?;
        self.clock.advance(6 * HOUR);
        let refs = [
            doc.id.clone(),
            tool.id.clone(),
            format!("{}@1", clause.id),
            "dc_99999".to_owned(),
        ];
        let started = Instant::now();
        let resolved = store.resolve(&refs).context("resolving")?;
        let elapsed = started.elapsed();
        println!(
            "added {}@2; clock +6 h to {} (tool results have a 6 h TTL); resolve in {}:",
            clause.id,
            format_rfc3339(self.clock.now()),
            ms(elapsed)
        );
        for (reference, resolution) in refs.iter().zip(&resolved) {
            println!("  {reference:<14} -> {}", describe(resolution));
        }
        let kinds_ok = matches!(
            resolved.as_slice(),
            [
                Resolution::Found(_),
                Resolution::Expired { .. },
                Resolution::Superseded { .. },
                Resolution::NotFound { .. }
            ]
        );
        self.checks
            .record("resolve gives Found, Expired, Superseded, NotFound", kinds_ok);
        Ok((doc, clause))
    }

    /// Session s1 sees only its own messages, cannot resolve s2's, and may neither write into s2's
    /// scope nor take one of s2's ids over.
    fn isolate_sessions(&mut self, store: &Store) -> Fallible<()> {
        let other = first_item(
            store,
            &ContextQuery::new()
                .types(["message"])
                .scopes([Scope::Session("s2".into())]),
            "message of s2",
        )?;
        let s1 = store.session("s1");
        let seen = s1.get(&ContextQuery::new().types(["message"])).context("session get")?;
        let own_only = seen.iter().all(|item| item.scope == Scope::Session("s1".into()));
        let through_s1 = s1.resolve([other.id.as_str()]).context("session resolve")?;
        let through_store = store.resolve([other.id.as_str()]).context("resolving")?;
        let write = s1.add([ContextItem::new(
            "msg_intruder",
            "message",
            json!({"role": "user", "text": "hi"}),
            "chat_ui",
            DEMO_NOW,
            "1",
            Scope::Session("s2".into()),
        )]);
        let denied = matches!(write, Err(Error::PermissionDenied { .. }));
        // A new version of s2's id in s1's own scope would take the id over: refused too.
        let takeover = s1.add([ContextItem::new(
            other.id.as_str(),
            "message",
            json!({"role": "user", "text": "taken over"}),
            "chat_ui",
            DEMO_NOW,
            "intruder",
            Scope::Session("s1".into()),
        )]);
        let takeover_denied = matches!(takeover, Err(Error::PermissionDenied { .. }));
        println!(
            "session s1: get message -> {} items, all s1: {own_only}; resolve {} (s2's) -> {} (store: {}); write to s2 denied: {denied}; new version of s2's id denied: {takeover_denied}",
            seen.len(),
            other.id,
            describe_all(&through_s1),
            describe_all(&through_store)
        );
        let isolated = own_only
            && denied
            && takeover_denied
            && matches!(through_s1.as_slice(), [Resolution::NotFound { .. }])
            && matches!(through_store.as_slice(), [Resolution::Found(_)]);
        self.checks.record("session isolation", isolated);
        Ok(())
    }

    /// Takes a snapshot and pins it; records its answers to the chunk query and to a resolve (with
    /// a receipt), and its digest.
    fn pin_snapshot(
        &self,
        store: &Store,
        doc: &ContextItem,
        deleted: &ContextItem,
        clause: &ContextItem,
    ) -> Fallible<(Snapshot, Pinned)> {
        let profile = first_item(
            store,
            &ContextQuery::new().types(["user_profile"]).newest_first(),
            "user profile",
        )?;
        let refs = [
            doc.id.clone(),
            deleted.id.clone(),
            format!("{}@1", clause.id),
            profile.id.clone(),
        ];
        let snap = store.snapshot();
        let info = snap.pin(PIN).context("pinning the snapshot")?;
        let snap_get = snap.get(&self.chunks_query).context("snapshot get")?;
        let (snap_resolve, receipt) = snap.resolve_with_receipt(&refs).context("snapshot resolve")?;
        let digest = snap.digest().context("snapshot digest")?;
        let before = (to_json(&snap_get)?, to_json(&snap_resolve)?);
        println!(
            "snapshot at seq {}, {}: get {} chunks; resolve {} -> {}",
            snap.seq(),
            format_rfc3339(snap.taken_at()),
            snap_get.len(),
            refs.join(" "),
            describe_all(&snap_resolve)
        );
        println!(
            "  pinned as {} (seq {}); receipt of {} answers; digest {digest}",
            info.name,
            info.seq,
            receipt.answers.len()
        );
        let pinned = Pinned {
            refs,
            before,
            digest,
            receipt,
        };
        Ok((snap, pinned))
    }

    /// Changes the store under the snapshot: second versions of some chunks, late chunks in the
    /// window, a delete, and the clock past the profiles' TTL.
    fn change_the_store(&self, store: &Store, chunks: &[ContextItem], deleted: &ContextItem) -> Fallible<()> {
        let revisions = revised_chunks(chunks);
        let late = late_chunks();
        let started = Instant::now();
        store.add(revisions).context("adding new versions")?;
        store.add(late).context("adding late chunks")?;
        let existed = store.delete(&deleted.id).context("deleting")?;
        self.clock.advance(7 * DAY);
        println!(
            "then: {REVISED} chunks at v2, {LATE} late chunks, delete {} ({existed}), clock +7 d (profiles have a 7 d TTL), in {}",
            deleted.id,
            ms(started.elapsed())
        );
        Ok(())
    }

    /// The snapshot answers as before while the live store's answers changed. Drops the snapshot's
    /// handle, so that from here on only the pin keeps what it sees. Returns the live chunk query's
    /// answer.
    fn compare_snapshot_and_live(
        &mut self,
        store: &Store,
        snap: Snapshot,
        pinned: &Pinned,
    ) -> Fallible<Vec<ContextItem>> {
        let snap_get = snap.get(&self.chunks_query).context("snapshot get")?;
        let snap_resolve = snap.resolve(&pinned.refs).context("snapshot resolve")?;
        let unchanged = (to_json(&snap_get)?, to_json(&snap_resolve)?) == pinned.before;
        self.checks.record("snapshot answers unchanged", unchanged);
        println!(
            "  snapshot: get {} chunks; resolve -> {}; unchanged: {unchanged}",
            snap_get.len(),
            describe_all(&snap_resolve)
        );
        let live_get = store.get(&self.chunks_query).context("live get")?;
        let live_resolve = store.resolve(&pinned.refs).context("live resolve")?;
        let at_v2 = live_get.iter().filter(|item| item.version == "2").count();
        let changed = to_json(&live_get)? != pinned.before.0 && to_json(&live_resolve)? != pinned.before.1;
        self.checks.record("live answers changed", changed);
        println!(
            "  live:     get {} chunks ({at_v2} at v2); resolve -> {}; changed: {changed}",
            live_get.len(),
            describe_all(&live_resolve)
        );
        drop(snap);
        Ok(live_get)
    }

    /// Compacts with the pin held: the pin alone keeps what the snapshot sees.
    fn compact_with_pin(&mut self, store: &Store, pinned: &Pinned, live_get: &[ContextItem]) -> Fallible<()> {
        let report = store.compact().context("compacting")?;
        print_compaction("compact (pin held)", &report);
        let kept = store
            .snapshots()
            .into_iter()
            .find(|info| info.name == PIN)
            .map_or(0, |info| info.bytes_kept);
        let opened = store.open_snapshot(PIN).context("opening the pinned snapshot")?;
        let after_compaction = snapshot_answers(&opened, &self.chunks_query, &pinned.refs)?;
        drop(opened);
        let pin_answers_kept = (&after_compaction.0, &after_compaction.1) == (&pinned.before.0, &pinned.before.1);
        let pin_digest_kept = after_compaction.2 == pinned.digest;
        self.checks
            .record("pinned answers unchanged by compaction", pin_answers_kept);
        self.checks
            .record("pinned digest unchanged by compaction", pin_digest_kept);
        let live_compacted = to_json(&store.get(&self.chunks_query).context("live get")?)? == to_json(&live_get)?;
        self.checks
            .record("live answers unchanged by compaction", live_compacted);
        println!(
            "  pin {PIN} keeps {} the live state no longer needs; its answers unchanged: {pin_answers_kept}, digest unchanged: {pin_digest_kept}; live answers unchanged: {live_compacted}",
            human_bytes(kept)
        );
        Ok(())
    }

    /// Closes the store and opens it again, from the checkpoint written at close: same counts, same
    /// answers (`live_before`, the chunk query's answer before, serialised).
    fn reopen(&mut self, store: Store, live_before: &str) -> Fallible<Store> {
        let before_stats = store.stats();
        drop(store);
        let started = Instant::now();
        let store = self.open_store("reopening the store")?;
        let reopen = started.elapsed();
        let after_stats = store.stats();
        let live_after = to_json(&store.get(&self.chunks_query).context("get after reopen")?)?;
        let counts_match = (before_stats.items, before_stats.versions, before_stats.seq)
            == (after_stats.items, after_stats.versions, after_stats.seq);
        let answers_match = live_before == live_after;
        self.checks.record("counts match after reopen", counts_match);
        self.checks.record("answers match after reopen", answers_match);
        let recovery = &after_stats.recovery;
        // The clean close wrote a checkpoint as of the last sequence number.
        let from_checkpoint =
            recovery.checkpoint_seq == Some(before_stats.seq) && recovery.checkpoint_rejected.is_none();
        self.checks
            .record("reopen starts from the checkpoint written at close", from_checkpoint);
        let checkpoint_seq = recovery
            .checkpoint_seq
            .map_or_else(|| "none".to_owned(), |seq| seq.to_string());
        println!(
            "reopen: {} from checkpoint at seq {checkpoint_seq} (recovery {} ms; replayed {} frames, {} records after it; {} segment(s) opened, {} torn bytes cut)",
            ms(reopen),
            recovery.millis,
            recovery.frames,
            recovery.records,
            recovery.segments,
            recovery.truncated_bytes
        );
        if let Some(reason) = &recovery.checkpoint_rejected {
            println!("  checkpoint rejected: {reason}");
        }
        println!("  counts match: {counts_match}; answers match: {answers_match}");
        Ok(store)
    }

    /// The pinned snapshot and the receipt after the restart: the same answers and digest.
    fn open_pinned_after_reopen(&mut self, store: &Store, pinned: &Pinned) -> Fallible<()> {
        let opened = store.open_snapshot(PIN).context("opening the pinned snapshot")?;
        let reopened = snapshot_answers(&opened, &self.chunks_query, &pinned.refs)?;
        drop(opened);
        let identical = (&reopened.0, &reopened.1) == (&pinned.before.0, &pinned.before.1);
        let same_digest = reopened.2 == pinned.digest;
        self.checks
            .record("open_snapshot answers identical after reopen", identical);
        self.checks
            .record("open_snapshot digest identical after reopen", same_digest);
        let replayed = store.replay(&pinned.receipt).context("replaying the receipt")?;
        let replay_same = to_json(&replayed)? == pinned.before.1;
        self.checks
            .record("replay of the receipt gives the same answers", replay_same);
        println!(
            "  open_snapshot({PIN}): answers byte-identical: {identical}, digest identical: {same_digest}; replay(receipt) -> {}; same: {replay_same}",
            describe_all(&replayed)
        );
        Ok(())
    }

    /// Unpins and compacts again: what only the pin kept goes, and the receipt can no longer be
    /// replayed; the live answers stay `live_before`.
    fn unpin_and_compact(&mut self, store: &Store, pinned: &Pinned, live_before: &str) -> Fallible<()> {
        let unpinned = store.unpin_snapshot(PIN).context("unpinning")?;
        let report = store.compact().context("compacting")?;
        let reclaimed = report.bytes_after < report.bytes_before;
        self.checks
            .record("unpin then compact reclaims space", unpinned && reclaimed);
        print_compaction(&format!("unpin {PIN} ({unpinned}), compact"), &report);
        let replay_refused = matches!(store.replay(&pinned.receipt), Err(Error::SnapshotNotFound { .. }));
        let open_refused = matches!(store.open_snapshot(PIN), Err(Error::SnapshotNotFound { .. }));
        self.checks.record(
            "replay and open_snapshot refused after unpin",
            replay_refused && open_refused,
        );
        let live_compacted = to_json(&store.get(&self.chunks_query).context("live get")?)? == live_before;
        self.checks
            .record("live answers unchanged by the second compaction", live_compacted);
        println!(
            "  replay(receipt) -> SnapshotNotFound: {replay_refused}; open_snapshot -> SnapshotNotFound: {open_refused}; live answers unchanged: {live_compacted}"
        );
        Ok(())
    }

    /// The store's figures, and a verify that reads every record back.
    fn stats_and_verify(&mut self, store: &Store) -> Fallible<()> {
        let after_stats = store.stats();
        println!(
            "stats: {} items, {} versions, {} segment(s), {} on disk, index ~{:.0} B per version (estimate)",
            after_stats.items,
            after_stats.versions,
            after_stats.segments,
            human_bytes(after_stats.bytes_on_disk),
            after_stats.index_bytes_per_item
        );
        let started = Instant::now();
        let report = store.verify().context("verifying")?;
        self.checks.record("verify finds no problem", report.is_ok());
        println!(
            "verify: {} segment(s), {} frames, {} records checked (CRC + SHA-256), {} checkpoint(s) decoded, in {}: {} problem(s)",
            report.segments_checked,
            report.frames_checked,
            report.records_checked,
            report.checkpoints_checked,
            ms(started.elapsed()),
            report.problems.len()
        );
        for problem in report.problems.iter().take(3) {
            println!("  {} @ {}: {}", problem.file.display(), problem.offset, problem.reason);
        }
        Ok(())
    }

    /// The verdict: success if every check passed, else the list of those that failed.
    fn finish(self) -> Fallible<()> {
        let checks = &self.checks.0;
        let failed: Vec<&str> = checks.iter().filter(|(_, ok)| !ok).map(|(what, _)| *what).collect();
        if failed.is_empty() {
            println!(
                "all {} checks passed; the store is left at {}",
                checks.len(),
                self.dir.display()
            );
            Ok(())
        } else {
            Err(format!("demo checks failed: {}", failed.join("; ")))
        }
    }
}

/// Writes the bulk items in batches, and prints how many of each type went in and how long it took.
fn bulk_write(store: &Store) -> Fallible<()> {
    let items = bulk_items();
    let mut per_type = std::collections::BTreeMap::<String, usize>::new();
    for item in &items {
        *per_type.entry(item.kind.clone()).or_default() += 1;
    }
    let (mut added, mut unchanged, mut batches) = (0usize, 0usize, 0u32);
    let started = Instant::now();
    for chunk in items.chunks(BATCH_ITEMS) {
        for outcome in store.add(chunk.iter().cloned()).context("adding a batch")? {
            match outcome {
                AddOutcome::Added { .. } => added += 1,
                _ => unchanged += 1,
            }
        }
        batches += 1;
    }
    let elapsed = started.elapsed();
    println!(
        "add: {BULK_ITEMS} items in {batches} batches of {BATCH_ITEMS}, sessions s1..s{SESSIONS}: {added} added, {unchanged} unchanged in {} ({} per batch)",
        ms(elapsed),
        ms(elapsed / batches.max(1))
    );
    let mix: Vec<String> = per_type.iter().map(|(kind, count)| format!("{kind} {count}")).collect();
    println!("  types: {}", mix.join(", "));
    Ok(())
}
