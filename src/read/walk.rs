//! Running a plan (`read::plan`): the merged walk of its sets in `(timestamp, id)` order, the
//! versions the view sees live, and the reads of the records it picks, under the index lock or
//! after it on several threads.

use std::iter::Peekable;
use std::ops::Deref;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::index::{Index, Keys, Location, NameBuf, VersionEntry};
use crate::item::ContextItem;
use crate::log::record::{DecodeError, PutView};
use crate::read::answer::RawItem;
use crate::read::plan::{self, Plan};
use crate::read::query::{confidence_passes, content_passes, filters_content, ContextQuery, QueryStats};
use crate::read::record::{item_of, json_of, touch_records, with_record, Finish, Held, Located, TOUCH_AHEAD};
use crate::read::runs::Reader;
use crate::read::view::View;

/// What a parsed read ([`Snapshot::get`](crate::Snapshot::get)) makes of each put record: its
/// item, if its content passes the query's content filter.
pub(crate) fn finish_item(
    query: &ContextQuery,
) -> impl Fn(&mut Vec<u8>, &PutView<'_>) -> Result<Option<ContextItem>, DecodeError> + Sync + '_ {
    move |scratch: &mut Vec<u8>, put: &PutView<'_>| {
        let item = item_of(put, scratch)?;
        Ok(content_passes(query, &item.content).then_some(item))
    }
}

/// What a raw read ([`Snapshot::get_raw`](crate::Snapshot::get_raw)) makes of each put record:
/// its JSON, if its content passes the query's content filter (parsed only when there is one).
pub(crate) fn finish_raw(
    query: &ContextQuery,
) -> impl Fn(&mut Vec<u8>, &PutView<'_>) -> Result<Option<RawItem>, DecodeError> + Sync + '_ {
    let filters_content = filters_content(query);
    move |_: &mut Vec<u8>, put: &PutView<'_>| {
        json_of(put, |_, content| {
            if !filters_content {
                return Ok(true);
            }
            let content: Value =
                serde_json::from_slice(content).map_err(|e| DecodeError(format!("stored content is not JSON: {e}")))?;
            Ok(content_passes(query, &content))
        })
    }
}

/// Walks several ordered sets as one, in timestamp order (or its reverse).
struct Merge<'a> {
    inputs: Vec<Peekable<Keys<'a>>>,
    reverse: bool,
}

impl Iterator for Merge<'_> {
    type Item = (i64, u32);

    fn next(&mut self) -> Option<(i64, u32)> {
        let mut best: Option<(usize, i64)> = None;
        for (position, input) in self.inputs.iter_mut().enumerate() {
            if let Some((timestamp, _)) = input.peek() {
                let better = match best {
                    None => true,
                    Some((_, best_timestamp)) => {
                        if self.reverse {
                            *timestamp > best_timestamp
                        } else {
                            *timestamp < best_timestamp
                        }
                    }
                };
                if better {
                    best = Some((position, *timestamp));
                }
            }
        }
        let (position, _) = best?;
        self.inputs.get_mut(position)?.next()
    }
}

/// Plans `query` ([`plan::plan`]) and runs the plan ([`run_plan`]).
pub(crate) fn run<T>(
    index: &Index,
    query: &ContextQuery,
    view: &View<'_>,
    fetch: &dyn Fn(&VersionEntry) -> Result<Option<T>>,
) -> Result<(Vec<T>, QueryStats)> {
    let plan = plan::plan(index, query, view)?;
    run_plan(index, &plan, view, fetch)
}

/// Runs `plan` against `index` as `view` sees it: walks its sets merged in timestamp order, keeps
/// the versions the view sees live that pass the plan's filters, and hands each timestamp's to
/// [`emit`]. `fetch` reads a version's item and applies the filters on what only the record holds
/// (`min_confidence`, `content_eq`: see [`confidence_passes`], [`content_passes`]); `None` leaves
/// the item out.
pub(crate) fn run_plan<T>(
    index: &Index,
    plan: &Plan<'_>,
    view: &View<'_>,
    fetch: &dyn Fn(&VersionEntry) -> Result<Option<T>>,
) -> Result<(Vec<T>, QueryStats)> {
    let merged = Merge {
        inputs: plan
            .sets
            .iter()
            .map(|set| set.range(&index.slots, plan.start, plan.end, plan.reverse).peekable())
            .collect(),
        reverse: plan.reverse,
    };
    let limit = plan.limit;
    let mut out = Vec::new();
    let mut examined = 0u64;
    let mut group: Vec<VersionEntry> = Vec::new();
    let mut group_timestamp = None;
    let mut merged = merged.peekable();
    loop {
        let next = merged.next();
        if let Some((timestamp, slot)) = next {
            let version = index.slot(slot);
            if plan
                .counted_scopes
                .as_ref()
                .is_none_or(|counted| version.is_some_and(|version| counted.contains(&version.scope)))
            {
                examined += 1;
            }
            if group_timestamp.is_some_and(|t| t != timestamp) {
                emit(index, plan.reverse, &mut group, fetch, &mut out, limit)?;
                if out.len() >= limit {
                    break;
                }
            }
            group_timestamp = Some(timestamp);
            let Some(version) = version else {
                continue;
            };
            // Compaction unlinks reclaimed versions from the sets a little after reclaiming them.
            let passes = version.is_stored() && view.sees_live(index, &version) && plan.filters.pass(index, &version);
            if passes {
                group.push(version);
            }
        } else {
            emit(index, plan.reverse, &mut group, fetch, &mut out, limit)?;
            break;
        }
    }
    let returned = out.len() as u64;
    Ok((
        out,
        QueryStats {
            index: plan.index_used,
            examined,
            returned,
        },
    ))
}

/// Orders one timestamp's candidates by id (descending when `reverse`), reads them (`fetch`
/// applies the content filters), and appends them to `out` up to `limit`.
fn emit<T>(
    index: &Index,
    reverse: bool,
    group: &mut Vec<VersionEntry>,
    fetch: &dyn Fn(&VersionEntry) -> Result<Option<T>>,
    out: &mut Vec<T>,
    limit: usize,
) -> Result<()> {
    if group.len() > 1 {
        // The names rebuilt once, back to back in one string, rather than at each comparison.
        let mut names = String::new();
        let mut buf = NameBuf::new();
        let mut keyed: Vec<(std::ops::Range<usize>, VersionEntry)> = group
            .drain(..)
            .map(|version| {
                let start = names.len();
                names.push_str(index.id_name_into(version.id, &mut buf));
                (start..names.len(), version)
            })
            .collect();
        keyed.sort_unstable_by(|(a, _), (b, _)| {
            let order = names.get(a.clone()).cmp(&names.get(b.clone()));
            if reverse {
                order.reverse()
            } else {
                order
            }
        });
        group.extend(keyed.into_iter().map(|(_, version)| version));
    }
    for version in group.drain(..) {
        if out.len() >= limit {
            break;
        }
        if let Some(item) = fetch(&version)? {
            out.push(item);
        }
    }
    Ok(())
}

/// Runs `query` at `view` over `index`, the index read lock's guard, on `reader`'s threads. Under
/// the lock it walks the index and finds and checks each candidate's record, filtering on
/// confidence, which the record's header holds; after releasing the lock it turns each into an
/// item with `finish`, which also applies the content filter (`None`: filtered out), on up to
/// `reader.threads` threads when there are many (`finish` gets each thread's scratch buffer). A
/// query with both a limit and a content filter reads its items under the lock: which candidates
/// fill the limit is known only once they are read. `walked` is told how many entries the walk
/// examined once it is done, before the items are read.
pub(crate) fn run_query<T: Send>(
    reader: &Reader<'_>,
    index: impl Deref<Target = Index>,
    view: &View<'_>,
    query: &ContextQuery,
    finish: &Finish<'_, Option<T>>,
    walked: impl FnOnce(u64),
) -> Result<(Vec<T>, QueryStats)> {
    if query.limit.is_some() && filters_content(query) {
        let result = read_under_lock(&index, view, query, finish)?;
        walked(result.1.examined);
        return Ok(result);
    }
    let (mut found, mut stats) = find_records(reader, &index, view, query)?;
    let mut held = Held::default();
    for located in &mut found {
        held.hold(&index, located);
    }
    drop(index);
    walked(stats.examined);
    let items = reader.in_runs(&mut found, &|scratch: &mut Vec<u8>, located| {
        Ok(located.finish(&held, |put| finish(scratch, put))?)
    })?;
    let items: Vec<T> = items.into_iter().flatten().collect();
    stats.returned = items.len() as u64;
    Ok((items, stats))
}

/// Runs `query`, reading each candidate's item with `finish` as the walk picks it, under the lock.
fn read_under_lock<T>(
    index: &Index,
    view: &View<'_>,
    query: &ContextQuery,
    finish: &Finish<'_, Option<T>>,
) -> Result<(Vec<T>, QueryStats)> {
    let scratch = std::cell::RefCell::new(Vec::new());
    let fetch = |version: &VersionEntry| {
        with_record(index, version, None, |put| {
            if confidence_passes(query, put.confidence) {
                finish(&mut scratch.borrow_mut(), put)
            } else {
                Ok(None)
            }
        })
        .map_err(Error::from)
    };
    run(index, query, view, &fetch)
}

/// Runs `query`, finding and checking the record of each candidate that passes its confidence
/// filter, under the lock: the records to read once it is released.
fn find_records(
    reader: &Reader<'_>,
    index: &Index,
    view: &View<'_>,
    query: &ContextQuery,
) -> Result<(Vec<Located>, QueryStats)> {
    if query.limit.is_some() && query.min_confidence.is_some() {
        // Which candidates fill the limit is known only once their records are read.
        let fetch = |version: &VersionEntry| -> Result<Option<Located>> {
            let located = Located::find(index, version, None)?;
            Ok(confidence_passes(query, located.confidence).then_some(located))
        };
        return run(index, query, view, &fetch);
    }
    // Every candidate the walk picks is read: the walk only collects them, and their records are
    // found and checked afterwards, still under the lock, on up to `reader.threads` threads.
    let (mut candidates, stats) = run(index, query, view, &|version| Ok(Some(*version)))?;
    let locations: Vec<Location> = candidates.iter().map(|version| version.location).collect();
    let found: Vec<Option<Located>> = reader.in_runs_at(&mut candidates, &|(): &mut (), at, version| {
        if at % TOUCH_AHEAD == 0 {
            touch_records(index, locations.get(at..).unwrap_or_default().iter().take(TOUCH_AHEAD));
        }
        let located = Located::find(index, version, None)?;
        Ok(confidence_passes(query, located.confidence).then_some(located))
    })?;
    Ok((found.into_iter().flatten().collect(), stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_orders_by_timestamp_both_ways() {
        let a = [(1, 0), (5, 1), (9, 2)];
        let b = [(2, 3), (5, 4), (10, 5)];
        let keys = |set: [(i64, u32); 3], reverse: bool| -> Peekable<Keys<'static>> {
            let keys: Keys<'static> = if reverse {
                Box::new(set.into_iter().rev())
            } else {
                Box::new(set.into_iter())
            };
            keys.peekable()
        };
        let forward: Vec<i64> = Merge {
            inputs: vec![keys(a, false), keys(b, false)],
            reverse: false,
        }
        .map(|(t, _)| t)
        .collect();
        assert_eq!(forward, vec![1, 2, 5, 5, 9, 10]);
        let backward: Vec<i64> = Merge {
            inputs: vec![keys(a, true), keys(b, true)],
            reverse: true,
        }
        .map(|(t, _)| t)
        .collect();
        assert_eq!(backward, vec![10, 9, 5, 5, 2, 1]);
    }
}
