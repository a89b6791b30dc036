//! Splitting one call's work over scoped helper threads: the validation of a large `add`
//! (`Options::add_threads`) and the reading of a large query's or resolve's items once the index
//! lock is released (`Options::read_threads`).

use crate::error::Result;

/// Maps `f` over `items`, in order, on up to `threads` threads: the calling one and scoped helpers
/// named `name` that live for this call only, each taking a contiguous run of at least `min_run`
/// items (fewer items than twice that stay on the calling thread). Each run has its own `S`
/// (scratch space that `f` reuses from one item to the next).
///
/// Returns the mapped items in order, or the error of the first position that failed: the same
/// answer as mapping them one by one. A run whose helper could not be started is mapped on the
/// calling thread afterwards; `f` takes its item as `&mut X`, so a run's items are where they were
/// until `f` sees them.
pub(crate) fn map_in_runs<X, Y, S, F>(
    items: &mut [X],
    threads: usize,
    min_run: usize,
    name: &str,
    f: &F,
) -> Result<Vec<Y>>
where
    X: Send,
    Y: Send,
    S: Default,
    F: Fn(&mut S, usize, &mut X) -> Result<Y> + Sync,
{
    // Each run's output is allocated once, with room for `capacity` items: the first run's for
    // the whole output, which the other runs' are appended to.
    let run = |base: usize, run_items: &mut [X], capacity: usize| -> Result<Vec<Y>> {
        let mut scratch = S::default();
        let mut out = Vec::with_capacity(capacity.max(run_items.len()));
        for (offset, item) in run_items.iter_mut().enumerate() {
            out.push(f(&mut scratch, base + offset, item)?);
        }
        Ok(out)
    };
    let threads = threads.min(items.len() / min_run.max(1)).max(1);
    if threads == 1 {
        return run(0, items, items.len());
    }
    let len = items.len();
    let per_thread = len.div_ceil(threads);
    let mut parts: Vec<Option<Result<Vec<Y>>>> = Vec::with_capacity(threads);
    std::thread::scope(|scope| {
        let mut runs = items.chunks_mut(per_thread).enumerate();
        let first = runs.next();
        let helpers: Vec<_> = runs
            .map(|(k, run_items)| {
                std::thread::Builder::new()
                    .name(name.to_owned())
                    .spawn_scoped(scope, move || run(k * per_thread, run_items, 0))
                    .ok()
            })
            .collect();
        parts.push(first.map(|(_, run_items)| run(0, run_items, len)));
        for helper in helpers {
            parts.push(helper.map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))));
        }
    });
    // The first run's items stay where they were mapped (no copy of half the output or more): the
    // others are appended to them.
    let mut mapped: Option<Vec<Y>> = None;
    for (k, part) in parts.into_iter().enumerate() {
        let base = k * per_thread;
        let part = match part {
            Some(part) => part,
            None => {
                let end = len.min(base + per_thread);
                run(
                    base,
                    items.get_mut(base..end).unwrap_or_default(),
                    if k == 0 { len } else { 0 },
                )
            }
        }?;
        match &mut mapped {
            None => mapped = Some(part),
            Some(mapped) => mapped.extend(part),
        }
    }
    Ok(mapped.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::map_in_runs;
    use crate::error::Error;

    #[test]
    fn runs_map_in_order_on_as_many_threads_as_asked_and_no_more_than_the_items_allow() {
        for (len, threads, min_run, expect_threads) in [
            (0, 4, 8, 1),
            (15, 4, 8, 1),
            (16, 4, 8, 2),
            (100, 4, 8, 4),
            (100, 1, 8, 1),
            (7, 3, 1, 3),
        ] {
            let mut items: Vec<usize> = (0..len).collect();
            let names = std::sync::Mutex::new(std::collections::HashSet::new());
            let mapped = map_in_runs(
                &mut items,
                threads,
                min_run,
                "ctxlog-test-run",
                &|seen: &mut Vec<usize>, at, x: &mut usize| {
                    assert_eq!(at, *x, "a run's positions are the items' own");
                    seen.push(at);
                    names.lock().expect("names").insert(std::thread::current().id());
                    Ok(*x * 1000 + seen.len())
                },
            )
            .expect("no item fails");
            assert_eq!(mapped.len(), len);
            assert!(mapped.iter().enumerate().all(|(at, y)| y / 1000 == at), "{mapped:?}");
            let threads_seen = names.into_inner().expect("names").len();
            assert_eq!(
                threads_seen,
                if len == 0 { 0 } else { expect_threads },
                "len {len} threads {threads}"
            );
        }
    }

    #[test]
    fn the_first_failing_position_decides_the_error_whichever_run_fails_first() {
        let mut items: Vec<usize> = (0..1000).collect();
        // Positions 900 and 300 fail; the later run's failure comes sooner in its own run.
        let result: Result<Vec<usize>, Error> = map_in_runs(
            &mut items,
            4,
            10,
            "ctxlog-test-run",
            &|_: &mut (), at, _x: &mut usize| {
                if at == 300 || at == 900 {
                    Err(Error::invalid("item", format!("position {at}")))
                } else {
                    Ok(at)
                }
            },
        );
        let message = result.expect_err("two positions fail").to_string();
        assert!(message.contains("position 300"), "{message}");
    }
}
