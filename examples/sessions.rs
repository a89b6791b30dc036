//! Sessions: each conversation (or user, or agent run) gets a `SessionView` that reads its own
//! session's items and the global ones, and never sees or writes another session's.
//!
//! Scopes: `Session(id)` is visible to that session only; `GlobalReadonly` to everyone, written by
//! the application through the `Store` itself; `GlobalWritable` to everyone, and sessions may write
//! it too.
//!
//! Run it with `cargo run --example sessions`; `cargo test` runs it as well.

use ctxlog::{ContextItem, ContextQuery, Error, Resolution, Scope, Store};
use serde_json::json;

/// 2024-05-10T10:00:00Z.
const NOW: i64 = 1_715_335_200;

fn message(id: &str, session: &str, text: &str) -> ContextItem {
    let content = json!({"role": "user", "text": text});
    ContextItem::new(
        id,
        "message",
        content,
        "chat_ui",
        NOW,
        "1",
        Scope::Session(session.into()),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path())?;

    // The application writes shared knowledge through the store: read-only for every session.
    let policy = json!({"text": "Refunds within 30 days."});
    store.add([ContextItem::new(
        "policy",
        "product_document",
        policy,
        "wiki",
        NOW,
        "1",
        Scope::GlobalReadonly,
    )])?;

    // Two sessions, each writing its own messages.
    let alice = store.session("alice");
    let bob = store.session("bob");
    alice.add([message("a1", "alice", "Can I get a refund?")])?;
    bob.add([
        message("b1", "bob", "My invoice is wrong."),
        message("b2", "bob", "It is #4411."),
    ])?;

    // Each session's get sees its own messages only.
    let messages = ContextQuery::new().types(["message"]);
    let ids = |items: Vec<ContextItem>| items.into_iter().map(|i| i.id).collect::<Vec<_>>();
    let (alice_sees, bob_sees) = (ids(alice.get(&messages)?), ids(bob.get(&messages)?));
    println!("alice sees {alice_sees:?}, bob sees {bob_sees:?}");
    assert_eq!(alice_sees, ["a1"]);
    assert_eq!(bob_sees, ["b1", "b2"]);

    // Resolving another session's id answers NotFound, exactly as for an id that was never written:
    // the answer does not even tell alice that b1 exists.
    let answers = alice.resolve(["b1", "never-written", "policy"])?;
    assert_eq!(answers[0], Resolution::NotFound { reference: "b1".into() });
    assert_eq!(
        answers[1],
        Resolution::NotFound {
            reference: "never-written".into()
        }
    );
    // Both see the global items.
    assert!(matches!(&answers[2], Resolution::Found(item) if item.id == "policy"));
    assert!(matches!(&bob.resolve(["policy"])?[..], [Resolution::Found(_)]));
    // The store itself (the application) sees every scope.
    assert!(matches!(&store.resolve(["b1"])?[..], [Resolution::Found(_)]));
    println!("alice resolves b1 -> NotFound; policy -> Found");

    // GlobalWritable: any session may write it, and every session sees it.
    let note = |version: &str, text: &str| {
        let content = json!({"text": text});
        ContextItem::new(
            "team-note",
            "message",
            content,
            "chat_ui",
            NOW,
            version,
            Scope::GlobalWritable,
        )
    };
    alice.add([note("1", "Refund desk closes at 5pm.")])?;
    bob.add([note("2", "Refund desk closes at 6pm today.")])?;
    assert!(matches!(&alice.resolve(["team-note"])?[..], [Resolution::Found(item)] if item.version == "2"));
    println!("team-note (global_writable): written by alice, revised by bob, alice sees v2");

    // Writing into another session's scope is refused with PermissionDenied, which names the
    // position of the refused item in its batch.
    let into_bob = alice.add([message("a2", "bob", "Hi bob, it's alice.")]);
    println!("alice writes into bob's scope -> {into_bob:?}");
    assert!(matches!(into_bob, Err(Error::PermissionDenied { index: Some(0), .. })));

    // So is writing GlobalReadonly, or a new version of a GlobalReadonly item, from a session.
    let readonly = ContextItem::new(
        "policy",
        "product_document",
        json!({"text": "Refunds always."}),
        "chat_ui",
        NOW,
        "2",
        Scope::GlobalReadonly,
    );
    assert!(matches!(alice.add([readonly]), Err(Error::PermissionDenied { .. })));

    // A batch is atomic: one refused item, and nothing of the batch is written.
    let batch = alice.add([message("a3", "alice", "Thanks!"), message("a4", "bob", "Psst.")]);
    assert!(matches!(batch, Err(Error::PermissionDenied { index: Some(1), .. })));
    assert_eq!(ids(alice.get(&messages)?), ["a1", "team-note"]);
    assert!(
        matches!(&store.resolve(["policy", "a3"])?[..], [Resolution::Found(p), Resolution::NotFound { .. }] if p.version == "1")
    );
    println!("writes to global_readonly and mixed batches refused; nothing of them was written");

    println!("sessions: all checks passed");
    Ok(())
}

// `cargo test` builds this example as a test (`test = true` in Cargo.toml) and runs `main` here.
#[cfg(test)]
#[test]
fn runs() {
    main().expect("the sessions example runs");
}
