//! `get` and `resolve`: queries and references, answered as JSON lines.

use std::path::Path;

use ctxlog::{ContextQuery, Scope, TimeRange};

use crate::error::{CliError, CliResult};
use crate::open::open_read;
use crate::out::Out;

/// The latest moment an item's timestamp may be: 9999-12-31T23:59:59Z.
const END_OF_TIME: &str = "9999-12-31T23:59:59Z";
/// The earliest moment: 1970-01-01T00:00:00Z.
const START_OF_TIME: &str = "1970-01-01T00:00:00Z";

/// Parses a scope as the command line writes it: `session:ID`, `global_readonly`,
/// `global_writable`.
pub(crate) fn parse_scope(text: &str) -> Result<Scope, String> {
    match text {
        "global_readonly" => Ok(Scope::GlobalReadonly),
        "global_writable" => Ok(Scope::GlobalWritable),
        _ => match text.strip_prefix("session:") {
            Some(id) if !id.is_empty() => Ok(Scope::Session(id.to_owned())),
            _ => Err(format!(
                "{text:?} is not a scope; use session:ID, global_readonly or global_writable"
            )),
        },
    }
}

/// Parses a confidence: a number in 0.0..=1.0.
pub(crate) fn parse_confidence(text: &str) -> Result<f64, String> {
    let c: f64 = text.parse().map_err(|e| format!("{text:?} is not a number: {e}"))?;
    if c.is_finite() && (0.0..=1.0).contains(&c) {
        Ok(c)
    } else {
        Err(format!("{text} is not between 0.0 and 1.0"))
    }
}

/// The filters of `ctxlog get`, as parsed from the command line.
#[derive(clap::Args)]
pub(crate) struct GetArgs {
    /// Keep items of this type (repeat for several).
    #[arg(long = "type", value_name = "TYPE")]
    pub(crate) types: Vec<String>,
    /// Keep items of this scope (repeat for several): session:ID, global_readonly or
    /// global_writable.
    #[arg(long = "scope", value_name = "SCOPE", value_parser = parse_scope)]
    pub(crate) scopes: Vec<Scope>,
    /// Query as session S sees the store: its own session's items and the global scopes only.
    #[arg(long, value_name = "S")]
    pub(crate) session: Option<String>,
    /// Items with a timestamp at or after this RFC 3339 UTC time (2024-05-10T00:00:00Z).
    /// Without --to: up to the end of time.
    #[arg(long, value_name = "TIME")]
    pub(crate) from: Option<String>,
    /// Items with a timestamp at or before this RFC 3339 UTC time. Without --from: from the
    /// epoch on.
    #[arg(long, value_name = "TIME")]
    pub(crate) to: Option<String>,
    /// Keep items from this source (repeat for several).
    #[arg(long = "source", value_name = "SOURCE")]
    pub(crate) sources: Vec<String>,
    /// Leave out items whose confidence is below C (0.0..=1.0); items without one pass.
    #[arg(long, value_name = "C", value_parser = parse_confidence)]
    pub(crate) min_confidence: Option<f64>,
    /// Newest first: the exact reverse of the default order.
    #[arg(long)]
    pub(crate) newest_first: bool,
    /// At most N items.
    #[arg(long, value_name = "N")]
    pub(crate) limit: Option<usize>,
}

/// The query the arguments describe. A bad time range is a usage error.
fn build_query(args: &GetArgs) -> CliResult<ContextQuery> {
    let mut query = ContextQuery::new();
    if !args.types.is_empty() {
        query = query.types(args.types.iter().cloned());
    }
    if !args.scopes.is_empty() {
        query = query.scopes(args.scopes.iter().cloned());
    }
    if !args.sources.is_empty() {
        query = query.sources(args.sources.iter().cloned());
    }
    if args.from.is_some() || args.to.is_some() {
        let from = args.from.as_deref().unwrap_or(START_OF_TIME);
        let to = args.to.as_deref().unwrap_or(END_OF_TIME);
        let range = TimeRange::parse(from, to).map_err(|e| {
            CliError::usage(format!(
                "{e}; --from and --to take RFC 3339 times in UTC, such as 2024-05-10T00:00:00Z"
            ))
        })?;
        query = query.time_range(range);
    }
    if let Some(min) = args.min_confidence {
        query = query.min_confidence(min);
    }
    if args.newest_first {
        query = query.newest_first();
    }
    if let Some(limit) = args.limit {
        query = query.limit(limit);
    }
    Ok(query)
}

/// `ctxlog get DIR ...`: the query's items, one JSON object per line.
pub(crate) fn get(dir: &Path, args: &GetArgs) -> CliResult<()> {
    let query = build_query(args)?;
    let store = open_read(dir)?;
    let items = match &args.session {
        Some(session) => store.session(session).get(&query),
        None => store.get(&query),
    }
    .map_err(query_error)?;
    let mut out = Out::stdout();
    for item in &items {
        let line = serde_json::to_string(item).map_err(|e| CliError::failure(format!("writing an item: {e}")))?;
        out.line(&line)?;
    }
    out.flush()
}

/// `ctxlog resolve DIR REF...`: one resolution per reference, as JSON lines, in order.
pub(crate) fn resolve(dir: &Path, refs: &[String], session: Option<&str>) -> CliResult<()> {
    let store = open_read(dir)?;
    let resolutions = match session {
        Some(session) => store.session(session).resolve(refs),
        None => store.resolve(refs),
    }
    .map_err(query_error)?;
    let mut out = Out::stdout();
    for resolution in &resolutions {
        let line =
            serde_json::to_string(resolution).map_err(|e| CliError::failure(format!("writing a resolution: {e}")))?;
        out.line(&line)?;
    }
    out.flush()
}

/// A query's or resolve's error: a malformed argument (`Invalid`) is bad usage.
fn query_error(err: ctxlog::Error) -> CliError {
    match err {
        ctxlog::Error::Invalid { .. } => CliError::usage(err.to_string()),
        other => CliError::from(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse() {
        assert_eq!(parse_scope("session:s1"), Ok(Scope::Session("s1".into())));
        assert_eq!(parse_scope("global_readonly"), Ok(Scope::GlobalReadonly));
        assert_eq!(parse_scope("global_writable"), Ok(Scope::GlobalWritable));
        for bad in ["session:", "session", "global", "Session:s1"] {
            assert!(parse_scope(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn confidences_parse() {
        assert_eq!(parse_confidence("0.5"), Ok(0.5));
        for bad in ["1.5", "-0.1", "NaN", "x"] {
            assert!(parse_confidence(bad).is_err(), "{bad}");
        }
    }
}
