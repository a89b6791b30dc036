//! Helpers shared by the item's unit tests: a valid item to start from, and the parts of an
//! [`Error::Invalid`] the tests look at.

use serde_json::json;

use super::{ContextItem, Scope};
use crate::error::{Error, Result};

/// A valid item of a built-in type, in the global read-only scope.
pub(crate) fn item() -> ContextItem {
    ContextItem::new(
        "ch3",
        "document_chunk",
        json!({"text": "hello"}),
        "crm_export",
        1_715_299_200,
        "20240510.1",
        Scope::GlobalReadonly,
    )
}

/// The field of an [`Error::Invalid`] without a batch index; panics on anything else.
pub(super) fn invalid_field(result: Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(Error::Invalid { field, index: None, .. }) => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// The reason of an [`Error::Invalid`]; panics on anything else.
pub(super) fn reason(result: Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(Error::Invalid { reason, .. }) => reason,
        other => panic!("expected Invalid, got {other:?}"),
    }
}
