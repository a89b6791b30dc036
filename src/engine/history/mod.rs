//! History: the change feed read from the log ([`feed`]), where it starts ([`start`]), the
//! [`Change`](change::Change) it delivers, and live subscriptions: which changes they want
//! ([`filter`]), the hub that hands them what the writer publishes ([`hub`]), and the
//! [`Subscription`](subscription::Subscription) a subscriber reads.

pub(crate) mod change;
pub(crate) mod expiry;
pub(crate) mod feed;
pub(crate) mod filter;
pub(crate) mod hub;
pub(crate) mod past;
pub(crate) mod start;
pub(crate) mod subscription;
