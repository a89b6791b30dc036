//! History: the change feed read from the log ([`feed`]), where it starts ([`start`]), and the
//! [`Change`](change::Change) it delivers.

pub(crate) mod change;
pub(crate) mod feed;
pub(crate) mod start;
