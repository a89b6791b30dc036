//! Temporary: profile a bulk load with 1,000 id subscribers.
use ctxlog::{ChangeFilter, ContextItem};
use ctxlog_bench::w1;
use std::time::Instant;
fn main() {
    let with: bool = std::env::args().nth(1).is_some_and(|a| a == "subs");
    let items: Vec<ContextItem> = (0..200_000).map(w1::item).collect();
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let store = w1::open_durable(dir.path()).unwrap();
        let mut subs = Vec::new();
        if with {
            for s in 0..1000u64 {
                let ids: Vec<String> = (0..3).map(|k| w1::item(s * 3 + k).id).collect();
                subs.push(store.subscribe(ChangeFilter::new().ids(ids)).unwrap());
            }
        }
        let batches: Vec<Vec<ContextItem>> = items.chunks(5000).map(<[ContextItem]>::to_vec).collect();
        let t = Instant::now();
        for b in batches {
            store.add(b).unwrap();
        }
        println!("{:.0} items/s", 200_000.0 / t.elapsed().as_secs_f64());
    }
}
