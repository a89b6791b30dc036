//! A store's answers read in the model's terms, for comparing them with the model's: an add's
//! outcomes ([`StoreAdd`]), a pin ([`pin_in_store`]), the pin list, and everything a store shows of
//! its state ([`Observation`], read by [`observe`], expected by [`State::observation`]).

#[cfg(doc)]
use crate::testing::model::State;
use crate::testing::model::{all_refs, ref_text, AddAnswer, AddError, AddExpect, AlreadyPinned, PinListing};
use crate::{AddOutcome, ContextItem, ContextQuery, Error, Resolution, Snapshot, Store};

/// A store's answer to an add in the model's terms, with the sequence numbers it gave.
#[derive(Debug)]
pub struct StoreAdd {
    /// The outcomes, or the refusal.
    pub answer: AddAnswer,
    /// The sequence number of each `Added` outcome, in order.
    pub seqs: Vec<u64>,
}

impl StoreAdd {
    /// Reads the store's answer; errors other than the refusals the model answers are returned.
    ///
    /// # Errors
    /// The store's error, when it is neither `PermissionDenied` nor `VersionConflict` with an index.
    pub fn read(result: crate::Result<Vec<AddOutcome>>) -> crate::Result<StoreAdd> {
        let outcomes = match result {
            Ok(outcomes) => outcomes,
            Err(Error::PermissionDenied { index: Some(i), .. }) => {
                return Ok(StoreAdd {
                    answer: Err(AddError::PermissionDenied(i)),
                    seqs: Vec::new(),
                })
            }
            Err(Error::VersionConflict { index: Some(i), .. }) => {
                return Ok(StoreAdd {
                    answer: Err(AddError::VersionConflict(i)),
                    seqs: Vec::new(),
                })
            }
            Err(e) => return Err(e),
        };
        let mut seqs = Vec::new();
        let answer = outcomes
            .into_iter()
            .map(|outcome| match outcome {
                AddOutcome::Added { id, version, seq } => {
                    seqs.push(seq);
                    AddExpect::Added(id, version)
                }
                AddOutcome::Unchanged { id, version } => AddExpect::Unchanged(id, version),
            })
            .collect();
        Ok(StoreAdd {
            answer: Ok(answer),
            seqs,
        })
    }

    /// The batch's sequence number, if it added anything: one for the whole batch, after `last`
    /// (the last one seen).
    ///
    /// # Errors
    /// What is wrong, when the batch has several sequence numbers or one not after `last`.
    pub fn batch_seq(&self, last: u64) -> std::result::Result<Option<u64>, String> {
        let Some(&seq) = self.seqs.first() else {
            return Ok(None);
        };
        if self.seqs.iter().any(|other| *other != seq) {
            return Err(format!("one batch, several seqs: {:?}", self.seqs));
        }
        if seq <= last {
            return Err(format!("seq {seq} not after {last}"));
        }
        Ok(Some(seq))
    }
}

/// Pins `name` through the store (`session` `None`) or a session view's snapshot and checks the
/// answer: a new pin is listed as (`name`, `seq_before`, `now`, `session`); a name already pinned
/// is refused with `Invalid` and writes nothing. Other errors are returned.
///
/// # Errors
/// The store's error, other than `Invalid`.
///
/// # Panics
/// When the pin's info is not the expected one, or a refused pin wrote (`step` is for the message).
pub fn pin_in_store(
    store: &Store,
    name: &str,
    session: Option<&str>,
    seq_before: u64,
    now: i64,
    step: usize,
) -> crate::Result<Result<(), AlreadyPinned>> {
    let result = match session {
        None => store.pin_snapshot(name),
        Some(session) => store.session(session).snapshot().pin(name),
    };
    match result {
        Ok(info) => {
            assert_eq!(
                (info.name.as_str(), info.seq, info.taken_at, info.session.as_deref()),
                (name, seq_before, now, session),
                "step {step}: pin info"
            );
            Ok(Ok(()))
        }
        Err(Error::Invalid { .. }) => {
            assert_eq!(store.stats().seq, seq_before, "step {step}: a refused pin wrote");
            Ok(Err(AlreadyPinned))
        }
        Err(e) => Err(e),
    }
}

/// What `snapshots()` lists.
#[must_use]
pub fn listed_pins(store: &Store) -> Vec<PinListing> {
    store
        .snapshots()
        .into_iter()
        .map(|info| (info.name, info.seq, info.taken_at, info.session))
        .collect()
}

/// Everything a store shows of its state, read through the store handle: what is compared with the
/// model after a reopen, after a power cut, and at the end of a sequence.
#[derive(Debug, PartialEq)]
pub struct Observation {
    /// `get` of everything.
    pub items: Vec<ContextItem>,
    /// `resolve` of [`all_refs`].
    pub resolved: Vec<Resolution>,
    /// `stats().items`.
    pub live_ids: u64,
    /// `snapshots()`.
    pub pins: Vec<PinListing>,
    /// Each pin, opened.
    pub pinned: Vec<Pinned>,
}

/// What a pinned snapshot shows, opened.
#[derive(Debug, PartialEq)]
pub struct Pinned {
    /// `Snapshot::seq`.
    pub seq: u64,
    /// `Snapshot::taken_at`.
    pub taken_at: i64,
    /// `Snapshot::session`.
    pub session: Option<String>,
    /// `get` of everything.
    pub items: Vec<ContextItem>,
    /// `resolve` of [`all_refs`].
    pub resolved: Vec<Resolution>,
    /// `digest`.
    pub digest: String,
}

/// What `store` shows (see [`Observation`]).
///
/// # Errors
/// The first read that fails.
pub fn observe(store: &Store) -> crate::Result<Observation> {
    let everything = ContextQuery::new();
    let refs: Vec<String> = all_refs().iter().map(ref_text).collect();
    let pins = listed_pins(store);
    let mut pinned = Vec::new();
    for (name, ..) in &pins {
        let snapshot: Snapshot = store.open_snapshot(name)?;
        pinned.push(Pinned {
            seq: snapshot.seq(),
            taken_at: snapshot.taken_at(),
            session: snapshot.session().map(str::to_owned),
            items: snapshot.get(&everything)?,
            resolved: snapshot.resolve(&refs)?,
            digest: snapshot.digest()?,
        });
    }
    Ok(Observation {
        items: store.get(&everything)?,
        resolved: store.resolve(&refs)?,
        live_ids: store.stats().items,
        pins,
        pinned,
    })
}

impl Observation {
    /// A short account, for failure messages: the items `get` shows, each reference's resolution
    /// (`F` found, with the version; `S` superseded; `E` expired; `N` not found; `H` damaged),
    /// `stats().items`, and the pins.
    #[must_use]
    pub fn brief(&self) -> String {
        let items: Vec<String> = self
            .items
            .iter()
            .map(|item| format!("{}@{}", item.id, item.version))
            .collect();
        let resolved: Vec<String> = all_refs()
            .iter()
            .zip(&self.resolved)
            .map(|(r, answer)| {
                let short = match answer {
                    Resolution::Found(item) => format!("F{}", item.version),
                    Resolution::Superseded { .. } => "S".to_owned(),
                    Resolution::Expired { expired_at, .. } => format!("E{expired_at}"),
                    Resolution::NotFound { .. } => "N".to_owned(),
                    Resolution::HashMismatch { .. } => "H".to_owned(),
                };
                format!("{}:{short}", ref_text(r))
            })
            .collect();
        let pins: Vec<String> = self
            .pins
            .iter()
            .zip(&self.pinned)
            .map(|((name, seq, taken_at, session), pinned)| {
                format!("{name}@{seq}/{taken_at}/{session:?}:{}", pinned.items.len())
            })
            .collect();
        format!(
            "items [{}] refs [{}] stats().items {} pins [{}]",
            items.join(" "),
            resolved.join(" "),
            self.live_ids,
            pins.join(" ")
        )
    }

    /// `None` when this observation is `expected`; else where each differing part first differs,
    /// and both observations in brief.
    #[must_use]
    pub fn mismatch(&self, expected: &Observation) -> Option<String> {
        let differ: Vec<String> = [
            ("items", first_difference(&self.items, &expected.items)),
            ("resolved", first_difference(&self.resolved, &expected.resolved)),
            (
                "stats().items",
                first_difference(&[self.live_ids], &[expected.live_ids]),
            ),
            ("pins", first_difference(&self.pins, &expected.pins)),
            ("pinned", first_difference(&self.pinned, &expected.pinned)),
        ]
        .into_iter()
        .filter_map(|(what, difference)| Some(format!("{what} {}", difference?)))
        .collect();
        (!differ.is_empty()).then(|| {
            format!(
                "{}\n the store shows {}\n the model expects {}",
                differ.join("\n "),
                self.brief(),
                expected.brief()
            )
        })
    }
}

/// Where `seen` first differs from `expected`, if it does.
fn first_difference<T: PartialEq + std::fmt::Debug>(seen: &[T], expected: &[T]) -> Option<String> {
    match seen.iter().zip(expected).enumerate().find(|(_, (a, b))| a != b) {
        Some((at, (a, b))) => Some(format!(
            "differ at {at}: the store shows {a:?}, the model expects {b:?}"
        )),
        None if seen.len() != expected.len() => Some(format!(
            "differ: the store shows {} entries, the model expects {}",
            seen.len(),
            expected.len()
        )),
        None => None,
    }
}
