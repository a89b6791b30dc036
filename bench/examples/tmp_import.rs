//! Temporary: write W1 items as JSON lines, and time the library's bulk load of the same items.
use ctxlog::ContextItem;
use ctxlog_bench::w1;
use std::io::{BufRead, Write};
use std::time::Instant;
fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap();
    let path = args.next().unwrap();
    if mode == "write" {
        let n: u64 = args.next().unwrap().parse().unwrap();
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 0..n {
            writeln!(out, "{}", serde_json::to_string(&w1::item(i)).unwrap()).unwrap();
        }
    } else {
        let dir = args.next().unwrap();
        let reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
        let items: Vec<ContextItem> = reader
            .lines()
            .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
            .collect();
        let store = ctxlog::Options::new().auto_compact(false).open(&dir).unwrap();
        let t = Instant::now();
        let n = items.len();
        let mut items = items.into_iter();
        loop {
            let batch: Vec<ContextItem> = items.by_ref().take(1000).collect();
            if batch.is_empty() {
                break;
            }
            store.add(batch).unwrap();
        }
        let s = t.elapsed().as_secs_f64();
        println!("library bulk load: {n} items in {s:.2} s = {:.0} items/s", n as f64 / s);
    }
}
