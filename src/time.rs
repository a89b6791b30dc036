//! Time ranges of queries, and RFC 3339 text for UTC seconds.

use ::time::format_description::BorrowedFormatItem;
use ::time::macros::format_description;
use ::time::{OffsetDateTime, PrimitiveDateTime};

use crate::error::{Error, Result};

/// The date and time part of an RFC 3339 UTC time, without fraction or zone.
const DATE_TIME: &[BorrowedFormatItem<'static>] = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");

/// What [`TimeRange::parse`] accepts, as said in error messages.
const ACCEPTED: &str =
    "must be an RFC 3339 time in UTC, YYYY-MM-DDTHH:MM:SS[.fraction]Z (T or t, Z or z), like 2024-05-10T00:00:00Z";

/// An inclusive range of UTC seconds since the Unix epoch: `start..=end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeRange {
    start: i64,
    end: i64,
}

impl TimeRange {
    /// The range `start..=end` (UTC seconds since the Unix epoch, both ends included).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with field `"time_range"` when `start > end`.
    pub fn new(start: i64, end: i64) -> Result<TimeRange> {
        if start > end {
            return Err(Error::invalid(
                "time_range",
                format!(
                    "start must not be after end; found start {} ({start}) after end {} ({end})",
                    format_rfc3339(start),
                    format_rfc3339(end)
                ),
            ));
        }
        Ok(TimeRange { start, end })
    }

    /// The range between two RFC 3339 times in UTC, both included, such as
    /// `TimeRange::parse("2024-05-10T00:00:00Z", "2024-05-12T23:59:59Z")`.
    ///
    /// Each time is `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, with `T` or `t` and `Z` or `z`; a fraction
    /// of a second is truncated (before `start > end` is judged).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with field `"time_range.start"` or `"time_range.end"` when a time is
    /// malformed, impossible (such as 2024-02-30 or 25:00), lacks its zone or carries an offset
    /// (even `+00:00`); with field `"time_range"` when start is after end.
    pub fn parse(start: &str, end: &str) -> Result<TimeRange> {
        let start = parse_utc("time_range.start", start)?;
        let end = parse_utc("time_range.end", end)?;
        TimeRange::new(start, end)
    }

    /// The first second of the range (included).
    #[must_use]
    pub fn start(&self) -> i64 {
        self.start
    }

    /// The last second of the range (included).
    #[must_use]
    pub fn end(&self) -> i64 {
        self.end
    }

    /// Whether `t` lies in the range, ends included.
    #[must_use]
    pub fn contains(&self, t: i64) -> bool {
        self.start <= t && t <= self.end
    }
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction]Z` into UTC seconds, truncating the fraction.
fn parse_utc(field: &str, text: &str) -> Result<i64> {
    let refuse = |why: String| Error::invalid(field, format!("{ACCEPTED}; {why}"));
    let shown = shorten(text);
    let Some(body) = text.strip_suffix(['Z', 'z']) else {
        let why = if has_offset(text) {
            format!("found {shown:?}, which has a UTC offset; write the time in UTC with a trailing Z")
        } else {
            format!("found {shown:?}, which does not end with the zone Z")
        };
        return Err(refuse(why));
    };
    let (date_time, fraction) = match body.split_once('.') {
        Some((date_time, fraction)) => (date_time, Some(fraction)),
        None => (body, None),
    };
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse(format!(
                "found {shown:?}, whose fraction of a second is not one or more digits"
            )));
        }
    }
    let bytes = date_time.as_bytes();
    let shape_ok = bytes.len() == 19
        && bytes.iter().enumerate().all(|(i, &b)| match i {
            4 | 7 => b == b'-',
            10 => b == b'T' || b == b't',
            13 | 16 => b == b':',
            _ => b.is_ascii_digit(),
        });
    if !shape_ok {
        return Err(refuse(format!("found {shown:?}")));
    }
    let normalized = date_time.replacen('t', "T", 1);
    PrimitiveDateTime::parse(&normalized, DATE_TIME)
        .map(|dt| dt.assume_utc().unix_timestamp())
        .map_err(|e| refuse(format!("found {shown:?}, which is not a real date and time ({e})")))
}

/// Whether a text ends with a numeric UTC offset such as `+08:00` or `-0500`.
fn has_offset(text: &str) -> bool {
    let tail = |n: usize| text.len().checked_sub(n).and_then(|at| text.get(at..));
    let is_offset = |t: &str, colon: bool| {
        let b = t.as_bytes();
        matches!(b.first(), Some(b'+' | b'-'))
            && b.iter()
                .enumerate()
                .skip(1)
                .all(|(i, &c)| if colon && i == 3 { c == b':' } else { c.is_ascii_digit() })
    };
    tail(6).is_some_and(|t| is_offset(t, true)) || tail(5).is_some_and(|t| is_offset(t, false))
}

/// The first 60 characters of a text, for error messages.
fn shorten(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(60).collect();
    if chars.next().is_some() {
        format!("{head}...")
    } else {
        head
    }
}

/// UTC seconds since the Unix epoch as RFC 3339, such as `"2024-05-10T00:00:00Z"`.
///
/// Times outside years 0000..=9999, which RFC 3339 cannot write, come out as `"@"` followed by
/// the seconds, such as `"@-9223372036854775808"`.
#[must_use]
pub fn format_rfc3339(t: i64) -> String {
    const FORMAT: &[BorrowedFormatItem<'static>] =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    OffsetDateTime::from_unix_timestamp(t)
        .ok()
        .filter(|dt| (0..=9999).contains(&dt.year()))
        .and_then(|dt| dt.format(FORMAT).ok())
        .unwrap_or_else(|| format!("@{t}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(result: Result<TimeRange>) -> String {
        match result {
            Err(Error::Invalid { field, index: None, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn one(text: &str) -> Result<i64> {
        TimeRange::parse(text, "9999-12-31T23:59:59Z").map(|r| r.start())
    }

    #[test]
    fn new_orders_ends() {
        let r = TimeRange::new(5, 10).expect("ordered");
        assert_eq!((r.start(), r.end()), (5, 10));
        assert!(TimeRange::new(7, 7).is_ok());
        assert!(TimeRange::new(i64::MIN, i64::MAX).is_ok());
        assert_eq!(field_of(TimeRange::new(11, 10)), "time_range");
    }

    #[test]
    fn contains_is_inclusive() {
        let r = TimeRange::new(5, 10).expect("ordered");
        assert!(r.contains(5) && r.contains(7) && r.contains(10));
        assert!(!r.contains(4) && !r.contains(11));
    }

    #[test]
    fn parses_utc() {
        let r = TimeRange::parse("2024-05-10T00:00:00Z", "2024-05-12T23:59:59Z").expect("valid");
        assert_eq!(r.start(), 1_715_299_200);
        assert_eq!(r.end(), 1_715_558_399);
        assert_eq!(one("1970-01-01T00:00:00Z").expect("epoch"), 0);
        assert_eq!(one("9999-12-31T23:59:59Z").expect("max"), crate::limits::TIMESTAMP_MAX);
        assert_eq!(one("1969-12-31T23:59:59Z").expect("before epoch"), -1);
        assert_eq!(one("2024-02-29T12:00:00Z").expect("leap day"), 1_709_208_000);
    }

    #[test]
    fn lowercase_t_and_z() {
        assert_eq!(one("2024-05-10t00:00:00z").expect("lowercase"), 1_715_299_200);
        assert_eq!(one("2024-05-10T00:00:00z").expect("lowercase z"), 1_715_299_200);
        assert_eq!(one("2024-05-10t00:00:00Z").expect("lowercase t"), 1_715_299_200);
    }

    #[test]
    fn fraction_is_truncated() {
        assert_eq!(one("2024-05-10T00:00:00.999999999Z").expect("fraction"), 1_715_299_200);
        assert_eq!(one("2024-05-10T00:00:00.5Z").expect("fraction"), 1_715_299_200);
        assert_eq!(one("1969-12-31T23:59:59.9Z").expect("fraction"), -1);
        assert_eq!(
            field_of(TimeRange::parse("2024-05-10T00:00:00.Z", "2024-05-10T00:00:00Z")),
            "time_range.start"
        );
        assert_eq!(
            field_of(TimeRange::parse("2024-05-10T00:00:00.5aZ", "2024-05-10T00:00:00Z")),
            "time_range.start"
        );
    }

    #[test]
    fn order_judged_after_truncation() {
        let r = TimeRange::parse("2024-05-10T00:00:00.9Z", "2024-05-10T00:00:00.1Z").expect("equal seconds");
        assert_eq!((r.start(), r.end()), (1_715_299_200, 1_715_299_200));
        assert_eq!(
            field_of(TimeRange::parse("2024-05-10T00:00:01Z", "2024-05-10T00:00:00.9Z")),
            "time_range"
        );
    }

    #[test]
    fn offsets_and_missing_zone_refused() {
        let good = "2024-05-10T00:00:00Z";
        for bad in [
            "2024-05-10T00:00:00+08:00",
            "2024-05-10T00:00:00+00:00",
            "2024-05-10T00:00:00-00:00",
            "2024-05-10T00:00:00",
            "2024-05-10T00:00:00.5",
            "2024-05-10T00:00:00+0000",
        ] {
            assert_eq!(field_of(TimeRange::parse(bad, good)), "time_range.start", "{bad}");
            assert_eq!(field_of(TimeRange::parse(good, bad)), "time_range.end", "{bad}");
        }
        match TimeRange::parse("2024-05-10T00:00:00+08:00", good) {
            Err(Error::Invalid { reason, .. }) => assert!(reason.contains("offset"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn impossible_or_malformed_refused() {
        let good = "2024-05-10T00:00:00Z";
        for bad in [
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-00-01T00:00:00Z",
            "2024-05-00T00:00:00Z",
            "2024-05-10T25:00:00Z",
            "2024-05-10T24:00:00Z",
            "2024-05-10T23:60:00Z",
            "2024-05-10T23:59:60Z",
            "2024-05-10 00:00:00Z",
            "2024-5-10T00:00:00Z",
            "24-05-10T00:00:00Z",
            "+2024-05-10T00:00:00Z",
            "2024-05-10T00:00Z",
            "2024-05-10Z",
            "Z",
            "",
            "now",
            "２０２４-05-10T00:00:00Z",
            "2024-05-10T00:00:00ZZ",
        ] {
            assert_eq!(field_of(TimeRange::parse(bad, good)), "time_range.start", "{bad:?}");
            assert_eq!(field_of(TimeRange::parse(good, bad)), "time_range.end", "{bad:?}");
        }
    }

    #[test]
    fn start_after_end_refused() {
        assert_eq!(
            field_of(TimeRange::parse("2024-05-12T00:00:00Z", "2024-05-10T00:00:00Z")),
            "time_range"
        );
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(format_rfc3339(1_715_299_200), "2024-05-10T00:00:00Z");
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(format_rfc3339(crate::limits::TIMESTAMP_MAX), "9999-12-31T23:59:59Z");
        assert_eq!(format_rfc3339(-62_167_219_200), "0000-01-01T00:00:00Z");
    }

    #[test]
    fn formats_out_of_range_sanely() {
        assert_eq!(format_rfc3339(crate::limits::TIMESTAMP_MAX + 1), "@253402300800");
        assert_eq!(format_rfc3339(-62_167_219_201), "@-62167219201");
        assert_eq!(format_rfc3339(i64::MAX), format!("@{}", i64::MAX));
        assert_eq!(format_rfc3339(i64::MIN), format!("@{}", i64::MIN));
    }

    #[test]
    fn format_then_parse_roundtrips() {
        for t in [
            0,
            1,
            1_715_299_200,
            crate::limits::TIMESTAMP_MAX,
            -62_167_219_200,
            951_782_400,
        ] {
            assert_eq!(one(&format_rfc3339(t)).expect("parses"), t, "{t}");
        }
    }
}
