use ctxlog::*;
use serde_json::json;
use std::sync::Arc;
fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ctxlog-csmoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let clock = Arc::new(ManualClock::new(1_700_000_000));
    let text = "x".repeat(1000);
    {
        let store = Options::new()
            .clock(clock.clone())
            .auto_compact(false)
            .segment_size(256 << 10)
            .open(&dir)?;
        let mut items = Vec::new();
        for i in 0..10_000 {
            let mut it = ContextItem::new(
                format!("i{i}"),
                "message",
                json!({"n": i, "text": text}),
                "src",
                1_700_000_000,
                "1",
                Scope::GlobalWritable,
            );
            if i % 2 == 0 {
                it = it.with_ttl(60);
            }
            items.push(it);
            if items.len() == 500 {
                store.add(std::mem::take(&mut items))?;
            }
        }
        let snap = store.snapshot();
        let pin = store.pin_snapshot("before")?;
        println!("pin {pin:?}");
        let d0 = snap.digest()?;
        let (r0, receipt) = snap.resolve_with_receipt(["i0", "i1", "i2"])?;
        clock.advance(120);
        println!("before {:?}", store.stats().bytes_on_disk);
        drop(snap);
        let rep = store.compact()?;
        println!("compact (pinned) {rep:?}");
        println!("snapshots {:?}", store.snapshots());
        let s2 = store.open_snapshot("before")?;
        println!("digest same {}", s2.digest()? == d0);
        println!("replay same {}", store.replay(&receipt)? == r0);
        drop(s2);
        store.unpin_snapshot("before")?;
        let rep = store.compact()?;
        println!("compact (unpinned) {rep:?}");
        println!(
            "after {:?} items {}",
            store.stats().bytes_on_disk,
            store.get(&ContextQuery::new())?.len()
        );
        println!(
            "resolve {:?}",
            store
                .resolve(["i0", "i1"])?
                .iter()
                .map(|r| format!("{r:?}").chars().take(60).collect::<String>())
                .collect::<Vec<_>>()
        );
        println!("replay after unpin {:?}", store.replay(&receipt).err());
        println!("verify {:?}", store.verify()?.is_ok());
        // re-add an old version with other content: must conflict (identity remembered)
        let bad = ContextItem::new(
            "i0",
            "message",
            json!({"other": 1}),
            "src",
            1_700_000_000,
            "1",
            Scope::GlobalWritable,
        );
        println!("conflict {:?}", store.add([bad.clone()]).err().map(|e| e.to_string()));
    }
    let store = Options::new().clock(clock.clone()).auto_compact(false).open(&dir)?;
    println!("reopen {:?}", store.stats());
    let bad = ContextItem::new(
        "i0",
        "message",
        json!({"other": 1}),
        "src",
        1_700_000_000,
        "1",
        Scope::GlobalWritable,
    );
    println!(
        "conflict after reopen {:?}",
        store.add([bad]).err().map(|e| e.to_string())
    );
    println!(
        "items {} verify {}",
        store.get(&ContextQuery::new())?.len(),
        store.verify()?.is_ok()
    );
    Ok(())
}
