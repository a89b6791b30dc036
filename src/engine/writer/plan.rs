//! The write plan: each batch of a group checked against the index and the batches before it in the
//! group (an [`Overlay`] of what they changed), and the frame of what it writes encoded. It stands
//! in the engine because it judges a batch by the index's state, under its read lock, with the
//! read layer's scope rules.

use crate::error::{Error, Result};
use crate::index::{FastMap, Index};
use crate::item::{format_hash, Scope, TypeRegistry, TypeSpec};
use crate::limits::{check_room, TYPES_MAX};
use crate::log::put::ValidItem;
use crate::log::record::{BatchEncoder, ScopeView};
use crate::read::view::{may_write_over, scope_writable, stored_scope_visible};

use super::{Command, EncodedBatch, Group, Op, OpOutcome, RecordSpan, Staged, Writer};

/// What the batches earlier in a group changed, for checking the later ones.
#[derive(Default, Clone)]
struct Overlay {
    ids: FastMap<String, PendingId>,
    types: FastMap<String, Option<String>>,
    /// Pins made (true) or ended (false) by earlier batches of the group.
    pins: FastMap<String, bool>,
    /// Versions added (puts written), counted even when `ids` is not kept.
    puts: usize,
}

#[derive(Default, Clone)]
struct PendingId {
    /// Deleted in this group: the index's history of the id no longer counts.
    reset: bool,
    /// Each version added, oldest first.
    versions: Vec<PendingVersion>,
}

/// A version added by a batch of the group: what the later operations check against it, and what a
/// delete of it records.
#[derive(Clone)]
struct PendingVersion {
    version: String,
    hash: [u8; 32],
    scope: Scope,
    kind: String,
}

impl Overlay {
    fn merge(&mut self, batch: Overlay) {
        let puts = self.puts + batch.puts;
        if self.ids.is_empty() && self.types.is_empty() && self.pins.is_empty() {
            *self = batch;
            self.puts = puts;
            return;
        }
        self.puts = puts;
        for (id, pending) in batch.ids {
            let entry = self.ids.entry(id).or_default();
            if pending.reset {
                *entry = pending;
            } else {
                entry.versions.extend(pending.versions);
            }
        }
        self.types.extend(batch.types);
        self.pins.extend(batch.pins);
    }
}

impl Writer {
    /// Checks every write of `group` in turn, each against the index and the batches before it that
    /// passed (under the index's read lock, taken once for the group), and answers at once those
    /// refused (or every write, once the store is poisoned); sorts out the flushes and rotations.
    pub(super) fn check_group(&self, group: Vec<Command>) -> Group {
        let mut staged = Vec::new();
        let mut flushes = Vec::new();
        let mut rotations = Vec::new();
        let index = self.shared.read_index();
        let registry = self.shared.registry();
        let mut overlay = Overlay::default();
        let solo = group.iter().filter(|c| matches!(c, Command::Write { .. })).count() == 1;
        for command in group {
            match command {
                Command::Flush { reply } => flushes.push(reply),
                Command::Rotate { reply } => rotations.push(reply),
                Command::Write { ops, session, reply } => {
                    if let Some(reason) = &self.poisoned {
                        let _ = reply.send(Err(Error::Poisoned { reason: reason.clone() }));
                        continue;
                    }
                    match plan(&index, &registry, &overlay, &ops, solo, session.as_deref()) {
                        Ok((outcomes, batch_overlay, encoder)) => {
                            overlay.merge(batch_overlay);
                            staged.push(Staged {
                                ops,
                                outcomes,
                                frame: encoder,
                                reply,
                                seq: 0,
                                committed_at: 0,
                                location: None,
                            });
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
            }
        }
        Group {
            staged,
            flushes,
            rotations,
        }
    }
}

type Plan = (Vec<OpOutcome>, Overlay, Option<EncodedBatch>);

/// Checks one batch against the index and the earlier batches of its group, and encodes what it
/// writes. Nothing is changed if any operation is refused. `solo`: the batch is the only write of
/// its group.
fn plan(
    index: &Index,
    registry: &TypeRegistry,
    group: &Overlay,
    ops: &[Op],
    solo: bool,
    session: Option<&str>,
) -> Result<Plan> {
    let mut batch = BatchPlan::new(index, registry, group, ops, solo, session);
    for (position, op) in ops.iter().enumerate() {
        match op {
            Op::Put(valid) => batch.put(position, valid)?,
            Op::Delete(id) => batch.delete(position, id),
            Op::RegisterType(spec) => batch.register_type(position, spec)?,
            Op::Pin {
                name,
                seq,
                taken_at,
                session,
            } => batch.pin(position, name, *seq, *taken_at, session.as_deref())?,
            Op::Unpin(name) => batch.unpin(position, name),
        }
    }
    batch.finish()
}

/// One batch being planned: what it is checked against, what its operations did so far, and its
/// frame as far as it is encoded.
struct BatchPlan<'a> {
    index: &'a Index,
    registry: &'a TypeRegistry,
    /// What the earlier batches of the group changed.
    group: &'a Overlay,
    /// The session view the batch comes from (`None`: the store itself).
    session: Option<&'a str>,
    /// Whether the batch's puts are recorded in its overlay (see [`BatchPlan::new`]).
    tracked: bool,
    /// What the batch's operations so far changed.
    batch: Overlay,
    outcomes: Vec<OpOutcome>,
    encoder: BatchEncoder,
    records: Vec<RecordSpan>,
}

impl<'a> BatchPlan<'a> {
    fn new(
        index: &'a Index,
        registry: &'a TypeRegistry,
        group: &'a Overlay,
        ops: &[Op],
        solo: bool,
        session: Option<&'a str>,
    ) -> Self {
        // The overlay tells the batch's later operations and the group's later batches what the batch
        // did. The only batch of a group, of puts of distinct ids (a bulk load), has no reader for it:
        // none is built (three allocations per put saved on the writer thread).
        let tracked = !(solo && distinct_put_ids(ops));
        let mut batch = Overlay::default();
        if tracked {
            batch.ids.reserve(ops.len());
        }
        let outcomes = Vec::with_capacity(ops.len());
        let record_bytes = ops
            .iter()
            .map(|op| match op {
                Op::Put(valid) => valid.record.len(),
                _ => 0,
            })
            .sum();
        let encoder = BatchEncoder::with_capacity(record_bytes);
        let records = Vec::with_capacity(ops.len());
        BatchPlan {
            index,
            registry,
            group,
            session,
            tracked,
            batch,
            outcomes,
            encoder,
            records,
        }
    }

    /// Operation `position`, a put: refused if the session may not write the id or the version is
    /// there with another content, unchanged if it is there with this one; otherwise encoded.
    #[inline]
    fn put(&mut self, position: usize, valid: &ValidItem) -> Result<()> {
        let (index, group, session) = (self.index, self.group, self.session);
        let item = &valid.item;
        // An id the validating thread found unknown to the index, which has learned no id
        // since, is still unknown to it: only the overlays are looked at.
        let unknown = valid.unknown_among == Some(index.id_count());
        // Before anything about the id's versions is compared (and so revealed): a session
        // adds versions only to ids whose latest version it may write itself.
        if let Some(session) = session {
            if !session_may_write(index, group, &self.batch, &item.id, session, unknown) {
                return Err(Error::PermissionDenied {
                    reason: format!(
                        "session {session:?} may not add a version of id {:?}: its latest version is in a \
                         scope this session may not write",
                        item.id
                    ),
                    index: Some(position),
                });
            }
        }
        match existing_hash(index, group, &self.batch, &item.id, &item.version, session, unknown)? {
            // A session compares only versions it may see: a version in another session's
            // scope, or one whose record compaction reclaimed (whatever its scope), is refused
            // alike, so that neither a `VersionConflict` (the stored hash) nor an `Unchanged` (a
            // guessed content confirmed) tells the session about it.
            Some((_, false)) => {
                return Err(Error::PermissionDenied {
                    reason: format!(
                        "session {:?} may not add version {:?} of id {:?}: that version was added \
                         before, and is in a scope this session may not see, or its content was \
                         reclaimed by compaction",
                        session.unwrap_or_default(),
                        item.version,
                        item.id
                    ),
                    index: Some(position),
                });
            }
            Some((existing, true)) if existing == valid.hash => {
                self.outcomes.push(OpOutcome::Unchanged);
                return Ok(());
            }
            Some((existing, true)) => {
                return Err(Error::VersionConflict {
                    id: item.id.clone(),
                    version: item.version.clone(),
                    existing: format_hash(&existing),
                    attempted: format_hash(&valid.hash),
                    index: Some(position),
                });
            }
            None => {}
        }
        if self.tracked {
            self.batch
                .ids
                .entry(item.id.clone())
                .or_default()
                .versions
                .push(PendingVersion {
                    version: item.version.clone(),
                    hash: valid.hash,
                    scope: item.scope.clone(),
                    kind: item.kind.clone(),
                });
        }
        let start = self.encoder.push_encoded(&valid.record);
        self.records.push(RecordSpan::since(position, start, &self.encoder));
        self.batch.puts += 1;
        self.outcomes.push(OpOutcome::Added { seq: 0 });
        Ok(())
    }

    /// Operation `position`, a delete of `id`: a record only if the id has a history to end, with
    /// the type and scope of the version it ends.
    fn delete(&mut self, position: usize, id: &str) {
        let ended = latest_kind_and_scope(self.index, self.group, &self.batch, id);
        let existed = ended.is_some();
        if let Some(ended) = ended {
            let start = self
                .encoder
                .delete(id, ended.map(|(kind, scope)| (kind, ScopeView::from(scope))));
            self.records.push(RecordSpan::since(position, start, &self.encoder));
        }
        let pending = self.batch.ids.entry(id.to_owned()).or_default();
        pending.reset = true;
        pending.versions.clear();
        self.outcomes.push(OpOutcome::Deleted(existed));
    }

    /// Operation `position`, a type registration: a record only if the type is new; refused if the
    /// type is known (or being registered) with another id pattern.
    fn register_type(&mut self, position: usize, spec: &TypeSpec) -> Result<()> {
        let pending = self
            .batch
            .types
            .get(spec.name())
            .or_else(|| self.group.types.get(spec.name()));
        let is_new = match pending {
            Some(pattern) if pattern.as_deref() == spec.pattern() => false,
            Some(_) => {
                return Err(Error::invalid(
                    "type",
                    format!("{:?} is being registered with another id pattern", spec.name()),
                ))
            }
            None => self.registry.check_register(spec)?,
        };
        if is_new {
            // The registry holds the types of every group published before this one.
            let held = self.registry.len() + self.group.types.len() + self.batch.types.len();
            check_room(held, 1, TYPES_MAX, "types")?;
            self.batch
                .types
                .insert(spec.name().to_owned(), spec.pattern().map(str::to_owned));
            let start = self.encoder.register_type(spec);
            self.records.push(RecordSpan::since(position, start, &self.encoder));
        }
        self.outcomes.push(OpOutcome::Registered(is_new));
        Ok(())
    }

    /// Operation `position`, a pin of snapshot `name` (at `seq`, taken at `taken_at`, by
    /// `session`): refused if the name is pinned already.
    fn pin(&mut self, position: usize, name: &str, seq: u64, taken_at: i64, session: Option<&str>) -> Result<()> {
        let pinned = is_pinned(self.index, self.group, &self.batch, name);
        if pinned {
            return Err(Error::invalid(
                "name",
                format!("a snapshot named {name:?} is already pinned"),
            ));
        }
        self.batch.pins.insert(name.to_owned(), true);
        let start = self.encoder.pin(name, seq, taken_at, session);
        self.records.push(RecordSpan::since(position, start, &self.encoder));
        self.outcomes.push(OpOutcome::Pinned);
        Ok(())
    }

    /// Operation `position`, an unpin of `name`: a record only if the name is pinned.
    fn unpin(&mut self, position: usize, name: &str) {
        let pinned = is_pinned(self.index, self.group, &self.batch, name);
        if pinned {
            self.batch.pins.insert(name.to_owned(), false);
            let start = self.encoder.unpin(name);
            self.records.push(RecordSpan::since(position, start, &self.encoder));
        }
        self.outcomes.push(OpOutcome::Unpinned(pinned));
    }

    /// The batch's outcomes, its overlay, and its frame if it writes anything; refused whole when
    /// its puts could take the index past one of its limits, with those of the group's earlier
    /// batches (see [`Counts::check_room`](crate::index::Counts::check_room)).
    fn finish(self) -> Result<Plan> {
        if self.encoder.is_empty() {
            return Ok((self.outcomes, self.batch, None));
        }
        if self.batch.puts > 0 {
            self.index.counts().check_room(self.group.puts + self.batch.puts)?;
        }
        // The sequence number and the CRC are filled in when the frame is written; finishing here
        // checks the size.
        let frame = self.encoder.finish_unsealed()?;
        Ok((self.outcomes, self.batch, Some((frame, self.records))))
    }
}

/// Whether every operation of `ops` is a put, each of another id.
fn distinct_put_ids(ops: &[Op]) -> bool {
    // Ids that rise from each put to the next (a load in id order) are distinct: no set is built.
    let mut last: Option<&str> = None;
    let rising = ops.iter().all(|op| match op {
        Op::Put(valid) => {
            let id = valid.item.id.as_str();
            last.replace(id).is_none_or(|before| before < id)
        }
        _ => false,
    });
    if rising {
        return true;
    }
    let mut ids: std::collections::HashSet<&str, foldhash::fast::RandomState> =
        std::collections::HashSet::with_capacity_and_hasher(ops.len(), foldhash::fast::RandomState::default());
    ops.iter().all(|op| match op {
        Op::Put(valid) => ids.insert(valid.item.id.as_str()),
        _ => false,
    })
}

/// The hash of version `version` of id `id` (in this batch, the group's earlier batches, or the
/// index, since the id's last delete), if there is one, and whether a view of `session` may see
/// that version: always without a session; with one, when its record is stored and its scope is
/// the session's own or a global one. No session may see a version whose record compaction
/// reclaimed, whatever its scope (the index may keep it, or not know it). `unknown`: the index is
/// known not to know the id, and is not looked at.
fn existing_hash(
    index: &Index,
    group: &Overlay,
    batch: &Overlay,
    id: &str,
    version: &str,
    session: Option<&str>,
    unknown: bool,
) -> Result<Option<([u8; 32], bool)>> {
    let visible = |scope: Option<&Scope>| stored_scope_visible(scope, session);
    for overlay in [batch, group] {
        if let Some(pending) = overlay.ids.get(id) {
            if let Some(found) = pending.versions.iter().find(|v| v.version == version) {
                return Ok(Some((found.hash, visible(Some(&found.scope)))));
            }
            if pending.reset {
                return Ok(None);
            }
        }
    }
    if unknown {
        return Ok(None);
    }
    for entry in index.current_history(id) {
        if entry.version_tag() != crate::index::version_tag(version) {
            continue;
        }
        let (found, hash) = crate::read::record::read_identity(index, &entry).map_err(Error::from)?;
        if found == version {
            let scope = if entry.is_stored() {
                index.scopes.value(entry.scope)
            } else {
                None
            };
            return Ok(Some((hash, visible(scope))));
        }
    }
    Ok(None)
}

/// Whether a session view of `session` may add a version of id `id`: the id's latest version
/// (in this batch, the group's earlier batches, or the index, since the id's last delete), if its
/// record is still stored, is in a scope the session may write (its own or `GlobalWritable`).
/// Otherwise a session could replace a `GlobalReadonly` item for every reader, or another session's
/// item under that session's own id, and comparing its version with the stored ones would tell it
/// their hashes. A latest version whose record compaction reclaimed (expired) holds no content: it
/// does not count, whatever its scope ([`may_write_over`]). `unknown`: the index is known not to
/// know the id, and is not looked at.
fn session_may_write(index: &Index, group: &Overlay, batch: &Overlay, id: &str, session: &str, unknown: bool) -> bool {
    let writable = |scope: &Scope| scope_writable(scope, session);
    for overlay in [batch, group] {
        if let Some(pending) = overlay.ids.get(id) {
            if let Some(latest) = pending.versions.last() {
                return writable(&latest.scope);
            }
            if pending.reset {
                return true;
            }
        }
    }
    if unknown {
        return true;
    }
    index
        .current_history(id)
        .next()
        .is_none_or(|latest| may_write_over(index, &latest, session))
}

/// Whether `name` is pinned once the earlier batches of the group and this one are applied.
fn is_pinned(index: &Index, group: &Overlay, batch: &Overlay, name: &str) -> bool {
    batch
        .pins
        .get(name)
        .or_else(|| group.pins.get(name))
        .copied()
        .unwrap_or_else(|| index.pins.contains_key(name))
}

/// The type and scope of the latest version of `id` (in this batch, the group's earlier batches,
/// or the index, since the id's last delete, retired versions included), if the id has a history:
/// `Some` with them, or with `None` when they are unknown (a version retired by a record of segment
/// format 1 or 2, which keeps neither, and replayed from it).
fn latest_kind_and_scope<'a>(
    index: &'a Index,
    group: &'a Overlay,
    batch: &'a Overlay,
    id: &str,
) -> Option<Option<(&'a str, &'a Scope)>> {
    for overlay in [batch, group] {
        if let Some(pending) = overlay.ids.get(id) {
            if let Some(latest) = pending.versions.last() {
                return Some(Some((latest.kind.as_str(), &latest.scope)));
            }
            if pending.reset {
                return None;
            }
        }
    }
    let latest = index.current_history(id).next()?;
    if !latest.kind_and_scope_known() {
        return Some(None);
    }
    // The index interned both numbers when it took the version in (checkpoints check them).
    let kind = index.kinds.value(u32::from(latest.kind()));
    Some(
        kind.zip(index.scopes.value(latest.scope))
            .map(|(kind, scope)| (&**kind, scope)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::ContextItem;
    use crate::limits::CONTENT_BYTES_DEFAULT;
    use crate::log::put::validate_item;
    use crate::log::record::RECORD_HEADER_BYTES;

    fn put(id: &str, version: &str, text: &str) -> Op {
        scoped_put(id, version, text, Scope::GlobalWritable)
    }

    fn scoped_put(id: &str, version: &str, text: &str, scope: Scope) -> Op {
        let item = ContextItem::new(
            id,
            "document_chunk",
            serde_json::json!({ "text": text }),
            "test",
            1_700_000_000,
            version,
            scope,
        );
        Op::Put(validate_item(item, &TypeRegistry::default(), CONTENT_BYTES_DEFAULT, false).expect("valid item"))
    }

    fn pin(name: &str) -> Op {
        Op::Pin {
            name: name.into(),
            seq: 0,
            taken_at: 0,
            session: None,
        }
    }

    /// Plans `batches` as one group, as `Writer::check_group` does (a batch that passes adds its
    /// changes to the group's overlay): what each batch was answered.
    fn plan_group(batches: Vec<Vec<Op>>) -> Vec<std::result::Result<Vec<OpOutcome>, String>> {
        plan_group_of(batches.into_iter().map(|ops| (None, ops)).collect())
    }

    /// As [`plan_group`], each batch from the session view named beside it (`None`: the store).
    fn plan_group_of(batches: Vec<(Option<&str>, Vec<Op>)>) -> Vec<std::result::Result<Vec<OpOutcome>, String>> {
        let index = Index::default();
        let registry = TypeRegistry::default();
        let mut overlay = Overlay::default();
        let mut answers = Vec::new();
        for (session, ops) in batches {
            match plan(&index, &registry, &overlay, &ops, false, session) {
                Ok((outcomes, batch, _frame)) => {
                    overlay.merge(batch);
                    answers.push(Ok(outcomes));
                }
                Err(e) => answers.push(Err(e.to_string())),
            }
        }
        answers
    }

    #[test]
    fn a_sessions_batch_may_not_add_to_an_id_an_earlier_batch_of_its_group_gave_a_scope_it_may_not_write() {
        use OpOutcome::*;
        let added = || Added { seq: 0 };
        let s1 = || Scope::Session("s1".into());
        let answers = plan_group_of(vec![
            (
                Some("s1"),
                vec![
                    scoped_put("a", "1", "mine", s1()),
                    scoped_put("b", "1", "shared", Scope::GlobalWritable),
                ],
            ),
            (None, vec![scoped_put("c", "1", "read only", Scope::GlobalReadonly)]),
            // Another session: s1's id (same version, same content: no Unchanged answer), s1's id
            // again (new version), the read-only id: each refused before its versions are compared.
            (Some("s2"), vec![scoped_put("a", "1", "mine", Scope::GlobalWritable)]),
            (Some("s2"), vec![scoped_put("a", "2", "taken", Scope::GlobalWritable)]),
            (
                Some("s2"),
                vec![
                    scoped_put("b", "2", "fine", Scope::GlobalWritable),
                    scoped_put("c", "2", "x", Scope::GlobalWritable),
                ],
            ),
            // What s2 may write: the global_writable id, and its own.
            (
                Some("s2"),
                vec![
                    scoped_put("b", "2", "fine", Scope::GlobalWritable),
                    scoped_put("d", "1", "own", Scope::Session("s2".into())),
                ],
            ),
            // The owner and the store itself are not refused.
            (Some("s1"), vec![scoped_put("a", "2", "mine again", s1())]),
            (None, vec![scoped_put("c", "2", "by the store", Scope::GlobalReadonly)]),
        ]);
        assert_eq!(answers[0], Ok(vec![added(), added()]));
        assert_eq!(answers[1], Ok(vec![added()]));
        for (at, answer) in [(2, 0), (3, 0), (4, 1)] {
            let message = answers[at].as_ref().expect_err("refused");
            assert!(
                message.contains(&format!("item {answer}: permission denied")),
                "{message}"
            );
            assert!(!message.contains("hash"), "{message}");
        }
        assert_eq!(answers[5], Ok(vec![added(), added()]));
        assert_eq!(answers[6], Ok(vec![added()]));
        assert_eq!(answers[7], Ok(vec![added()]));
    }

    #[test]
    fn a_session_compares_only_versions_it_may_see_among_the_earlier_batches_of_its_group() {
        use OpOutcome::*;
        let s1 = || Scope::Session("s1".into());
        let answers = plan_group_of(vec![
            // s1's id: a private version 1, then a global_writable version 2 (its latest).
            (
                Some("s1"),
                vec![
                    scoped_put("a", "1", "secret", s1()),
                    scoped_put("a", "2", "public", Scope::GlobalWritable),
                ],
            ),
            // s2 may add to the id now, but not compare with its private version 1: neither the
            // right content (no Unchanged) nor another (no VersionConflict naming the hash).
            (Some("s2"), vec![scoped_put("a", "1", "secret", Scope::GlobalWritable)]),
            (Some("s2"), vec![scoped_put("a", "1", "guess", Scope::GlobalWritable)]),
            // Version 2 is global: s2 sees it, so it is compared.
            (Some("s2"), vec![scoped_put("a", "2", "public", Scope::GlobalWritable)]),
            (Some("s2"), vec![scoped_put("a", "2", "other", Scope::GlobalWritable)]),
            // The owner and the store compare version 1 as before.
            (Some("s1"), vec![scoped_put("a", "1", "secret", s1())]),
            (None, vec![scoped_put("a", "1", "guess", s1())]),
        ]);
        assert_eq!(answers[0], Ok(vec![Added { seq: 0 }, Added { seq: 0 }]));
        for at in [1, 2] {
            let message = answers[at].as_ref().expect_err("refused");
            assert!(message.contains("item 0: permission denied"), "{message}");
            assert!(!message.contains("hash") && !message.contains("sha256"), "{message}");
        }
        assert_eq!(answers[3], Ok(vec![Unchanged]));
        let conflict = answers[4].as_ref().expect_err("conflict");
        assert!(conflict.contains("version conflict"), "{conflict}");
        assert_eq!(answers[5], Ok(vec![Unchanged]));
        let conflict = answers[6].as_ref().expect_err("conflict");
        assert!(conflict.contains("version conflict"), "{conflict}");
    }

    /// The deletes a planned batch encodes, in order.
    fn deletes_of(plan: &Plan) -> Vec<(String, Option<Scope>, Option<String>, usize)> {
        let (frame, _) = plan.2.as_ref().expect("a frame");
        let payload = &frame[crate::log::record::FRAME_HEADER_BYTES..];
        crate::log::record::decode_batch(payload)
            .expect("a frame that decodes")
            .into_iter()
            .filter_map(|(_, len, record)| match record {
                crate::log::record::RecordView::Delete { id, scope, kind } => Some((
                    id.to_owned(),
                    scope.map(ScopeView::to_scope),
                    kind.map(str::to_owned),
                    len,
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_delete_names_the_type_and_scope_of_the_version_it_ends_retired_or_not() {
        use crate::index::tests::put as put_view;
        let here = crate::index::Location::default();
        let mut index = Index::default();
        // Stored; retired by compaction while the store is open; replayed from a retired record
        // of segment format 3; and of format 1 or 2, which keeps no type and scope.
        let mut stored = put_view("stored", "1", 10);
        (stored.kind, stored.scope) = ("note", ScopeView::Session("s1"));
        index.apply_put(1, &stored, here);
        let mut compacted = put_view("compacted", "1", 10);
        (compacted.kind, compacted.scope) = ("tool_result", ScopeView::GlobalReadonly);
        index.apply_put(2, &compacted, here);
        assert!(index.retire(1, here));
        index.apply_retired(
            3,
            "replayed",
            "1",
            Some(("user_profile", ScopeView::Session("s2"))),
            here,
        );
        index.apply_retired(4, "old", "1", None, here);
        let registry = TypeRegistry::default();
        let delete = |id: &str| Op::Delete(id.into());
        let first = vec![
            delete("stored"),
            delete("compacted"),
            delete("replayed"),
            delete("old"),
            // Added by this batch, then deleted: the type and scope it was added with.
            scoped_put("fresh", "1", "x", Scope::Session("s3".into())),
            delete("fresh"),
            delete("never"),
            delete("old"),
            put("group", "1", "x"),
        ];
        let planned = plan(&index, &registry, &Overlay::default(), &first, false, None).expect("planned");
        let long = |id: &str| RECORD_HEADER_BYTES + 1 + id.len() + 3;
        let named = |id: &str, scope: Scope, kind: &str| {
            let len = long(id) + scope.session_id().map_or(0, str::len) + kind.len();
            (id.to_owned(), Some(scope), Some(kind.to_owned()), len)
        };
        assert_eq!(
            deletes_of(&planned),
            vec![
                named("stored", Scope::Session("s1".into()), "note"),
                named("compacted", Scope::GlobalReadonly, "tool_result"),
                named("replayed", Scope::Session("s2".into()), "user_profile"),
                // The scope byte "unknown", an empty session id and type.
                ("old".to_owned(), None, None, long("old")),
                named("fresh", Scope::Session("s3".into()), "document_chunk"),
            ]
        );
        use OpOutcome::*;
        assert_eq!(
            planned.0[..8],
            [
                Deleted(true),
                Deleted(true),
                Deleted(true),
                Deleted(true),
                Added { seq: 0 },
                Deleted(true),
                Deleted(false),
                Deleted(false)
            ]
        );
        // A later batch of the group deletes what an earlier one added.
        let mut group = Overlay::default();
        group.merge(planned.1);
        let later = plan(&index, &registry, &group, &[delete("group")], false, None).expect("planned");
        assert_eq!(
            deletes_of(&later),
            vec![named("group", Scope::GlobalWritable, "document_chunk")]
        );
    }

    #[test]
    fn a_group_checks_each_batch_against_the_earlier_ones_and_forgets_a_batch_that_failed() {
        use OpOutcome::*;
        let added = Added { seq: 0 };
        let answers = plan_group(vec![
            // Within a batch: a repeat with the same content is unchanged.
            vec![
                put("a", "1", "x"),
                put("b", "1", "y"),
                put("a", "1", "x"),
                put("a", "2", "z"),
            ],
            // Fails on its second put (a@1 with other content): its first put must not count.
            vec![put("c", "1", "w"), put("a", "1", "other")],
            vec![put("c", "1", "w2"), Op::Delete("c".into()), Op::Delete("c".into())],
            // A delete ends the history: a@1 may then come with other content.
            vec![Op::Delete("a".into()), put("a", "1", "other")],
            vec![put("a", "1", "other"), put("b", "1", "y"), put("a", "2", "z")],
            vec![Op::Delete("b".into()), Op::Delete("b".into()), put("b", "1", "new")],
            vec![put("b", "1", "y")],
            vec![pin("p"), Op::Unpin("p".into()), Op::Unpin("p".into()), pin("p")],
            vec![pin("p")],
            vec![Op::Unpin("p".into()), pin("q")],
            vec![pin("q")],
        ]);
        let expected: Vec<std::result::Result<Vec<OpOutcome>, &str>> = vec![
            Ok(vec![added.clone(), added.clone(), Unchanged, added.clone()]),
            Err("version conflict"),
            Ok(vec![added.clone(), Deleted(true), Deleted(false)]),
            Ok(vec![Deleted(true), added.clone()]),
            Ok(vec![Unchanged, Unchanged, added.clone()]),
            Ok(vec![Deleted(true), Deleted(false), added.clone()]),
            Err("version conflict"),
            Ok(vec![Pinned, Unpinned(true), Unpinned(false), Pinned]),
            Err("already pinned"),
            Ok(vec![Unpinned(true), Pinned]),
            Err("already pinned"),
        ];
        assert_eq!(answers.len(), expected.len());
        for (at, (answer, want)) in answers.iter().zip(&expected).enumerate() {
            match (answer, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "batch {at}"),
                (Err(got), Err(want)) => assert!(
                    got.to_lowercase().contains(want),
                    "batch {at}: {got:?} does not say {want:?}"
                ),
                (got, want) => panic!("batch {at}: {got:?}, expected {want:?}"),
            }
        }
    }

    /// The only batch of a group builds no overlay when its puts are of distinct ids; it must answer
    /// and encode exactly as when it builds one, and a repeated id must still be checked.
    #[test]
    fn a_group_of_one_batch_answers_as_a_batch_among_others() {
        use OpOutcome::*;
        let added = Added { seq: 0 };
        let registry = TypeRegistry::default();
        let none = Overlay::default();
        let index = Index::default();
        let distinct: Vec<Op> = (0..300).map(|n| put(&format!("id-{n}"), "1", "x")).collect();
        assert!(distinct_put_ids(&distinct));
        let (solo, solo_overlay, solo_frame) = plan(&index, &registry, &none, &distinct, true, None).expect("solo");
        let (tracked, tracked_overlay, tracked_frame) =
            plan(&index, &registry, &none, &distinct, false, None).expect("tracked");
        assert_eq!(solo, tracked);
        assert!(solo.iter().all(|o| *o == added));
        assert_eq!(solo_frame.map(|f| f.0), tracked_frame.map(|f| f.0), "the same frame");
        assert!(solo_overlay.ids.is_empty(), "no overlay built");
        assert_eq!(tracked_overlay.ids.len(), 300);

        // A repeated id in a group of one batch: the overlay is built, and checked.
        let repeated = vec![
            put("a", "1", "x"),
            put("b", "1", "y"),
            put("a", "1", "x"),
            put("a", "1", "z"),
        ];
        assert!(!distinct_put_ids(&repeated));
        let conflict = plan(&index, &registry, &none, &repeated, true, None).map(|p| p.0);
        assert!(
            matches!(conflict, Err(Error::VersionConflict { ref id, .. }) if id == "a"),
            "{conflict:?}"
        );
        let same = plan(&index, &registry, &none, &repeated[..3], true, None).map(|p| p.0);
        assert_eq!(same.ok(), Some(vec![added.clone(), added, Unchanged]));
        // Not only puts: the overlay is built.
        assert!(!distinct_put_ids(&[put("a", "1", "x"), Op::Delete("b".into())]));
        assert!(!distinct_put_ids(&[Op::Delete("b".into()), put("a", "1", "x")]));
        // Rising ids are distinct; a repeat, next to its first or after a fall, is found.
        let rising: Vec<Op> = (0..300).map(|n| put(&format!("id-{n:04}"), "1", "x")).collect();
        assert!(distinct_put_ids(&rising));
        for ids in [["a", "b", "b"], ["a", "b", "a"], ["b", "a", "b"], ["c", "c", "d"]] {
            let ops: Vec<Op> = ids.iter().map(|id| put(id, "1", "x")).collect();
            assert!(!distinct_put_ids(&ops), "{ids:?}");
        }
        let falling: Vec<Op> = ["c", "b", "a"].iter().map(|id| put(id, "1", "x")).collect();
        assert!(distinct_put_ids(&falling));
    }

    #[test]
    fn the_index_has_room_for_puts_up_to_each_of_its_limits_and_not_one_more() {
        use crate::index::Counts;
        use crate::limits::{IDS_MAX, SCOPES_MAX, SOURCES_MAX, VERSIONS_MAX};
        let near = Counts {
            versions: VERSIONS_MAX - 3,
            ids: IDS_MAX - 3,
            scopes: SCOPES_MAX - 3,
            sources: SOURCES_MAX - 3,
        };
        assert!(near.check_room(3).is_ok());
        assert!(Counts::default().check_room(crate::limits::BATCH_ITEMS_MAX).is_ok());
        for (what, limit, counts) in [
            (
                "versions",
                VERSIONS_MAX,
                Counts {
                    versions: VERSIONS_MAX - 2,
                    ..near
                },
            ),
            (
                "ids",
                IDS_MAX,
                Counts {
                    ids: IDS_MAX - 2,
                    ..near
                },
            ),
            (
                "scopes",
                SCOPES_MAX,
                Counts {
                    scopes: SCOPES_MAX - 2,
                    ..near
                },
            ),
            (
                "sources",
                SOURCES_MAX,
                Counts {
                    sources: SOURCES_MAX - 2,
                    ..near
                },
            ),
        ] {
            match counts.check_room(3) {
                Err(Error::Full { what: full, limit: max }) => {
                    assert_eq!((full.as_str(), max), (what, limit as u64));
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_group_counts_the_puts_of_its_batches_against_the_limits() {
        let index = Index::default();
        let registry = TypeRegistry::default();
        let mut group = Overlay::default();
        // The second batch is refused (a conflict): its put does not count.
        for ops in [
            vec![put("a", "1", "x"), put("b", "1", "x")],
            vec![put("a", "1", "other")],
            vec![put("a", "2", "x"), put("a", "2", "x"), Op::Delete("b".into())],
        ] {
            if let Ok((_, batch, _)) = plan(&index, &registry, &group, &ops, false, None) {
                group.merge(batch);
            }
        }
        assert_eq!(group.puts, 3, "two puts, then one (the repeat is unchanged)");
        // The only batch of its group keeps no ids, but counts its puts.
        let solo = vec![put("a", "1", "x"), put("b", "1", "x")];
        let (_, batch, _) = plan(&index, &registry, &Overlay::default(), &solo, true, None).expect("planned");
        assert!(batch.ids.is_empty());
        assert_eq!(batch.puts, 2);
    }

    #[test]
    fn a_type_past_the_limit_is_refused_with_the_batch_that_registers_it() {
        let mut registry = TypeRegistry::default();
        let mut n = 0;
        while registry.len() < crate::limits::TYPES_MAX - 1 {
            registry.insert(TypeSpec::new(format!("t{n}"))).expect("room");
            n += 1;
        }
        let index = Index::default();
        let none = Overlay::default();
        let register =
            |names: &[&str]| -> Vec<Op> { names.iter().map(|n| Op::RegisterType(TypeSpec::new(*n))).collect() };
        // One more fits; a known one takes no room; two more do not, in one batch or in two.
        let (_, last, _) = plan(&index, &registry, &none, &register(&["last", "t0"]), true, None).expect("fits");
        for (group, ops) in [(&none, register(&["last", "t0", "past"])), (&last, register(&["past"]))] {
            let refused = plan(&index, &registry, group, &ops, false, None).map(|p| p.0);
            assert!(
                matches!(&refused, Err(Error::Full { what, limit: 65_535 }) if what == "types"),
                "{refused:?}"
            );
        }
        // A registry cannot be filled past it either (as a checkpoint's or the log's types load).
        let mut full = registry.clone();
        full.insert(TypeSpec::new("last")).expect("the last one");
        assert!(matches!(full.insert(TypeSpec::new("past")), Err(Error::Full { .. })));
        assert!(full.insert(TypeSpec::new("t0")).is_ok(), "a known type takes no room");
    }

    #[test]
    fn many_ids_in_a_group_are_all_found() {
        // Enough ids for the overlay to grow several times; every other one deleted again.
        let ops: Vec<Op> = (0..3000).map(|n| put(&format!("id-{n}"), "1", "x")).collect();
        let deletes: Vec<Op> = (0..3000).step_by(2).map(|n| Op::Delete(format!("id-{n}"))).collect();
        let again: Vec<Op> = (0..3000).map(|n| put(&format!("id-{n}"), "1", "changed")).collect();
        let answers = plan_group(vec![ops, deletes, again]);
        assert!(answers[0]
            .as_ref()
            .is_ok_and(|o| o.iter().all(|o| *o == OpOutcome::Added { seq: 0 })));
        assert!(answers[1]
            .as_ref()
            .is_ok_and(|o| o.iter().all(|o| *o == OpOutcome::Deleted(true))));
        // id-1, id-3, ... still hold version 1 with the old content: the batch conflicts on id-1.
        let Err(conflict) = &answers[2] else {
            panic!("a put of a kept version with other content passed: {:?}", answers[2]);
        };
        assert!(conflict.contains("id-1"), "{conflict}");
    }
}
