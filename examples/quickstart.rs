//! Quick start: open a store, add a few items, query them by type and time, resolve references, and
//! delete one.
//!
//! Run it with `cargo run --example quickstart`. `cargo test` runs it too (see `runs` at the bottom),
//! and every `assert!` in it states behaviour the store guarantees.

use ctxlog::{AddOutcome, ContextItem, ContextQuery, Resolution, Scope, Store, TimeRange};
use serde_json::json;

/// 2024-05-10T09:00:00Z, in UTC seconds since the Unix epoch: the items' timestamps.
const NINE_AM: i64 = 1_715_331_600;
const HOUR: i64 = 3_600;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A store is a directory. Here a scratch one that is removed at the end; in your code, any path.
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path())?;

    // Items of the built-in types (document_chunk, message, tool_result, user_profile, ...). Every
    // item has an id, a type, JSON content, a source, a timestamp, a version and a scope.
    let chunk = |id: &str, hours: i64, version: &str, text: &str| {
        ContextItem::new(
            id,
            "document_chunk",
            json!({"doc": "msa_acme_2024", "text": text}),
            "contracts",
            NINE_AM + hours * HOUR,
            version,
            Scope::GlobalReadonly,
        )
    };
    let outcomes = store.add([
        chunk("ch1", 0, "1", "Either party may terminate on 90 days' notice."),
        chunk("ch2", 1, "1", "Liability is capped at twelve months of fees."),
        chunk("ch3", 30, "1", "Disputes go to arbitration."),
        ContextItem::new(
            "msg1",
            "message",
            json!({"role": "user", "text": "What is the notice period?"}),
            "chat_ui",
            NINE_AM,
            "1",
            Scope::GlobalWritable,
        ),
    ])?;
    // One batch is one atomic write: one outcome per item, in order.
    assert_eq!(outcomes.len(), 4);
    assert!(outcomes.iter().all(|o| matches!(o, AddOutcome::Added { .. })));

    // A new version of ch1 becomes its latest; adding the same (id, version, content) again is a no-op.
    store.add([chunk("ch1", 0, "2", "Either party may terminate on 30 days' notice.")])?;
    let again = store.add([chunk("ch1", 0, "2", "Either party may terminate on 30 days' notice.")])?;
    assert!(matches!(&again[..], [AddOutcome::Unchanged { .. }]));

    // A typed time-range query: document chunks of 2024-05-10, oldest first. ch3 (a day later) and
    // msg1 (another type) are left out; ch1 comes back at its latest version.
    let may_10 = ContextQuery::new()
        .types(["document_chunk"])
        .time_range(TimeRange::parse("2024-05-10T00:00:00Z", "2024-05-10T23:59:59Z")?);
    let items = store.get(&may_10)?;
    let found: Vec<(&str, &str)> = items.iter().map(|i| (i.id.as_str(), i.version.as_str())).collect();
    println!("document chunks on 2024-05-10: {found:?}");
    assert_eq!(found, [("ch1", "2"), ("ch2", "1")]);
    // The store fills in each item's SHA-256 content hash.
    assert!(items
        .iter()
        .all(|i| i.hash.as_deref().is_some_and(|h| h.starts_with("sha256:"))));

    // Resolve references, `id` or `id@version`: one answer per reference, in order.
    let answers = store.resolve(["ch2", "ch1@1", "ch9"])?;
    for answer in &answers {
        println!("resolve -> {}", describe(answer));
    }
    // The latest version of ch2 is here.
    assert!(matches!(&answers[0], Resolution::Found(item) if item.id == "ch2" && item.version == "1"));
    // ch1@1 was replaced: the answer says so and carries the latest version.
    assert!(matches!(
        &answers[1],
        Resolution::Superseded { id, requested_version, latest }
            if id == "ch1" && requested_version == "1" && latest.version == "2"
    ));
    // No such id.
    assert!(matches!(&answers[2], Resolution::NotFound { reference } if reference == "ch9"));

    // Delete an id: every later read leaves it out.
    assert!(store.delete("ch2")?, "ch2 existed");
    assert!(matches!(&store.resolve(["ch2"])?[..], [Resolution::NotFound { .. }]));
    let ids: Vec<String> = store.get(&may_10)?.into_iter().map(|i| i.id).collect();
    println!("after deleting ch2: {ids:?}");
    assert_eq!(ids, ["ch1"]);

    println!("quickstart: all checks passed");
    Ok(())
}

/// A resolution in a few words, for printing.
fn describe(answer: &Resolution) -> String {
    match answer {
        Resolution::Found(item) => format!("Found {}@{}", item.id, item.version),
        Resolution::NotFound { reference } => format!("NotFound {reference}"),
        Resolution::Superseded {
            id,
            requested_version,
            latest,
        } => {
            format!("Superseded {id}@{requested_version} (latest @{})", latest.version)
        }
        other => format!("{other:?}"),
    }
}

// `cargo test` builds this example as a test (`test = true` in Cargo.toml) and runs `main` here, so
// that the example fails the build's tests as soon as the behaviour it shows changes.
#[cfg(test)]
#[test]
fn runs() {
    main().expect("the quickstart example runs");
}
