//! History: the change feed read from the log, live subscriptions, and the store's past.

pub(crate) mod change;
