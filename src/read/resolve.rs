//! Resolving references (`id` or `id@version`): parsing them, answering each as a view sees the
//! index ([`Answer`]: found, not found, expired, superseded, damaged), and reading the answers'
//! items, under the index lock for a few references, after it on several threads for many.

use std::ops::Deref;

use crate::error::{Error, Result};
use crate::index::{version_tag, Index, VersionEntry};
use crate::item::{validate_name, validate_version, ContextItem};
use crate::log::record::{DecodeError, PutView};
use crate::read::answer::{RawItem, RawResolution, Resolution};
use crate::read::record::{is_version, with_record, Finish, Held, Located, ReadFailure};
use crate::read::runs::Reader;
use crate::read::view::{Sight, View};

/// A resolve of at most this many references reads its items under the index lock (a few
/// microseconds each): for so few, finding the records first and reading them after the lock costs
/// more than the lock's hold.
const READ_UNDER_LOCK: usize = 8;

/// What one reference resolves to, whatever form its items take: becomes a [`Resolution`] or a
/// [`RawResolution`].
pub(crate) enum Answer<T> {
    Found(T),
    NotFound,
    Expired { expired_at: i64 },
    Superseded { latest: T },
    HashMismatch,
}

impl Answer<Located> {
    /// Reads the item of a found answer with `read`; a record found damaged now answers
    /// `HashMismatch`, as one found damaged under the lock does.
    fn read<T>(&self, held: &Held, read: impl FnOnce(&PutView<'_>) -> Result<T, DecodeError>) -> Result<Answer<T>> {
        let item = |located: &Located| or_mismatch(located.finish(held, read));
        Ok(match self {
            Answer::Found(located) => item(located)?.map_or_else(|mismatch| mismatch, Answer::Found),
            Answer::Superseded { latest } => {
                item(latest)?.map_or_else(|mismatch| mismatch, |latest| Answer::Superseded { latest })
            }
            Answer::NotFound => Answer::NotFound,
            Answer::Expired { expired_at } => Answer::Expired {
                expired_at: *expired_at,
            },
            Answer::HashMismatch => Answer::HashMismatch,
        })
    }
}

impl Answer<ContextItem> {
    /// The [`Resolution`] of `reference` (`id`, `asked` version if any) this answer gives.
    pub(crate) fn into_resolution(self, reference: &str, id: &str, asked: Option<&str>) -> Resolution {
        match self {
            Answer::Found(item) => Resolution::Found(item),
            Answer::NotFound => Resolution::NotFound {
                reference: reference.to_owned(),
            },
            Answer::Expired { expired_at } => Resolution::Expired {
                id: id.to_owned(),
                expired_at,
            },
            Answer::Superseded { latest } => Resolution::Superseded {
                id: id.to_owned(),
                requested_version: asked.unwrap_or_default().to_owned(),
                latest,
            },
            Answer::HashMismatch => Resolution::HashMismatch { id: id.to_owned() },
        }
    }
}

impl Answer<RawItem> {
    /// The [`RawResolution`] of `reference` (`id`, `asked` version if any) this answer gives.
    pub(crate) fn into_raw_resolution(self, reference: &str, id: &str, asked: Option<&str>) -> RawResolution {
        match self {
            Answer::Found(item) => RawResolution::Found(item),
            Answer::NotFound => RawResolution::NotFound {
                reference: reference.to_owned(),
            },
            Answer::Expired { expired_at } => RawResolution::Expired {
                id: id.to_owned(),
                expired_at,
            },
            Answer::Superseded { latest } => RawResolution::Superseded {
                id: id.to_owned(),
                requested_version: asked.unwrap_or_default().to_owned(),
                latest,
            },
            Answer::HashMismatch => RawResolution::HashMismatch { id: id.to_owned() },
        }
    }
}

/// A read's outcome as a resolve answers it: damage is `HashMismatch`, I/O fails the resolve.
fn or_mismatch<X, T>(read: Result<X, ReadFailure>) -> Result<Result<X, Answer<T>>> {
    match read {
        Ok(x) => Ok(Ok(x)),
        Err(ReadFailure::Damaged(_)) => Ok(Err(Answer::HashMismatch)),
        Err(ReadFailure::Io(e)) => Err(e),
    }
}

/// Parses every reference ([`parse_reference`]).
///
/// # Errors
/// `Invalid`, with the reference's position as `index`, for the first that does not parse.
pub(crate) fn parse_references<R: AsRef<str>>(refs: &[R]) -> Result<Vec<(&str, Option<&str>)>> {
    let mut parsed = Vec::with_capacity(refs.len());
    for (position, reference) in refs.iter().enumerate() {
        parsed.push(parse_reference(reference.as_ref()).map_err(|e| e.at(position))?);
    }
    Ok(parsed)
}

/// Answers each of `refs` (parsed as `parsed`) at `view` over `index`, the index read lock's guard,
/// reads the items with `read` and turns each answer into the caller's form with `answer`. Up to
/// [`READ_UNDER_LOCK`] references read their items under the lock too; more only find and check
/// their records under it and read the items after releasing it (on up to `reader.threads`
/// threads when there are many), so that a long resolve does not hold back the writer's
/// publication.
pub(crate) fn resolve<R: AsRef<str>, T: Send, O>(
    reader: &Reader<'_>,
    index: impl Deref<Target = Index>,
    view: &View<'_>,
    refs: &[R],
    parsed: Vec<(&str, Option<&str>)>,
    read: &Finish<'_, T>,
    answer: impl Fn(Answer<T>, &str, &str, Option<&str>) -> O,
) -> Result<Vec<O>> {
    if refs.len() <= READ_UNDER_LOCK {
        let mut scratch = Vec::new();
        let mut read =
            |entry: &VersionEntry, id: &str| with_record(&index, entry, Some(id), |put| read(&mut scratch, put));
        return parsed
            .into_iter()
            .zip(refs)
            .map(|((id, version), reference)| {
                let found = resolve_one(&index, view, id, version, &mut read)?;
                Ok(answer(found, reference.as_ref(), id, version))
            })
            .collect();
    }
    let mut held = Held::default();
    let mut find = |entry: &VersionEntry, id: &str| {
        let mut located = Located::find(&index, entry, Some(id))?;
        held.hold(&index, &mut located);
        Ok(located)
    };
    let mut found = parsed
        .iter()
        .map(|(id, version)| resolve_one(&index, view, id, *version, &mut find))
        .collect::<Result<Vec<_>>>()?;
    drop(index);
    let answers = reader.in_runs(&mut found, &|scratch: &mut Vec<u8>, found| {
        found.read(&held, |put| read(scratch, put))
    })?;
    Ok(answers
        .into_iter()
        .zip(parsed)
        .zip(refs)
        .map(|((found, (id, version)), reference)| answer(found, reference.as_ref(), id, version))
        .collect())
}

/// The answer for one reference, its record read with `read` (an item, or a record found and
/// checked to be read later).
fn resolve_one<X>(
    index: &Index,
    view: &View<'_>,
    id: &str,
    version: Option<&str>,
    read: &mut dyn FnMut(&VersionEntry, &str) -> Result<X, ReadFailure>,
) -> Result<Answer<X>> {
    let Some(visible) = index.visible(id, view.seq) else {
        return Ok(Answer::NotFound);
    };
    let (latest_slot, latest) = (visible.slot, &visible.version);
    // A retired version's content was reclaimed: nothing is stored to answer with. A version in a
    // scope the view may not see is not found either.
    match view.judge(index, latest) {
        Sight::Hidden => return Ok(Answer::NotFound),
        Sight::Expired { expired_at } => return Ok(Answer::Expired { expired_at }),
        Sight::Live => {}
    }
    let mut read = |entry: &VersionEntry| or_mismatch(read(entry, id));
    let Some(asked) = version else {
        return Ok(read(latest)?.map_or_else(|mismatch| mismatch, Answer::Found));
    };
    // The version tag rules the latest version out without reading it; when it matches, the
    // record decides (a damaged one answers HashMismatch, as a plain `id` would).
    if latest.version_tag() == version_tag(asked) {
        match is_version(index, latest, asked) {
            Ok(true) => return Ok(read(latest)?.map_or_else(|mismatch| mismatch, Answer::Found)),
            Ok(false) => {}
            Err(ReadFailure::Damaged(_)) => return Ok(Answer::HashMismatch),
            Err(ReadFailure::Io(e)) => return Err(e),
        }
    }
    if !seen_earlier(index, view, latest_slot, latest, asked)? {
        return Ok(Answer::NotFound);
    }
    Ok(match read(latest)? {
        Ok(item) => Answer::Superseded { latest: item },
        Err(mismatch) => mismatch,
    })
}

/// Whether `asked` is an earlier version of the history of `latest` (at `latest_slot`) that `view`
/// has seen. A record whose tag matches but that cannot be read is taken as that version: its
/// identity is not in doubt, only its bytes, and it is not returned.
fn seen_earlier(index: &Index, view: &View<'_>, latest_slot: u32, latest: &VersionEntry, asked: &str) -> Result<bool> {
    for (slot, entry) in index.versions_of(latest.id) {
        let entry = &entry;
        if slot == latest_slot || index.generation(entry) != index.generation(latest) || !view.has_seen(entry) {
            continue;
        }
        match is_version(index, entry, asked) {
            Ok(true) | Err(ReadFailure::Damaged(_)) if entry.version_tag() == version_tag(asked) => {
                return Ok(true);
            }
            Ok(_) | Err(ReadFailure::Damaged(_)) => {}
            Err(ReadFailure::Io(e)) => return Err(e),
        }
    }
    Ok(false)
}

/// The item of each found answer: what a parsed resolve reads (see [`Finish`]).
pub(crate) fn finish_item(scratch: &mut Vec<u8>, put: &PutView<'_>) -> Result<ContextItem, DecodeError> {
    crate::read::record::item_of(put, scratch)
}

/// The JSON of each found answer: what a raw resolve reads.
pub(crate) fn finish_raw(_: &mut Vec<u8>, put: &PutView<'_>) -> Result<RawItem, DecodeError> {
    crate::read::record::raw_item_of(put)
}

/// Splits `id@version`, validating both parts.
pub(crate) fn parse_reference(reference: &str) -> Result<(&str, Option<&str>)> {
    let (id, version) = match reference.split_once('@') {
        Some((id, version)) => (id, Some(version)),
        None => (reference, None),
    };
    let refuse = |e: Error| match e {
        Error::Invalid { reason, .. } => Error::invalid(
            "reference",
            format!("{reference:?} is not `id` or `id@version`: {reason}"),
        ),
        other => other,
    };
    validate_name("id", id).map_err(refuse)?;
    if let Some(version) = version {
        validate_version(version).map_err(refuse)?;
    }
    Ok((id, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        assert_eq!(parse_reference("ch3").unwrap(), ("ch3", None));
        assert_eq!(parse_reference("ch9@20240512.1").unwrap(), ("ch9", Some("20240512.1")));
        for bad in ["", "@1", "a@", "a b", "a@1@2", "a@x y"] {
            assert!(matches!(parse_reference(bad), Err(Error::Invalid { .. })), "{bad:?}");
        }
    }

    #[test]
    fn positions_of_bad_references_are_told() {
        let error = parse_references(&["a", "b@", "c"]).expect_err("b@ refused");
        assert!(matches!(error, Error::Invalid { index: Some(1), .. }), "{error:?}");
    }
}
