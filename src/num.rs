//! Conversions between integer widths, in one place: the widening ones cannot fail on the targets
//! ctxlog builds for, and the narrowing ones either return an error naming the value or, where a
//! bound in [`crate::limits`] already keeps the value in range, assert it. Nothing is clamped.

use crate::error::{Error, Result};

// Offsets and lengths in the store's files are u64 and counts read from them u32; both are used as
// indexes into memory, which needs a usize at least as wide.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("ctxlog supports 64-bit targets only: file offsets (u64) are used as memory indexes (usize)");

/// A u32 read from disk or held in the index, as a usize (lossless on every supported target).
#[inline]
pub(crate) const fn usize_from_u32(value: u32) -> usize {
    value as usize
}

/// A u64 offset or length, as a usize (lossless on every supported target).
#[inline]
// Lossless: the `compile_error!` above keeps usize 64 bits wide.
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn usize_from_u64(value: u64) -> usize {
    value as usize
}

/// A usize length or count, as a u64 (lossless on every supported target).
#[inline]
pub(crate) const fn u64_from_usize(value: usize) -> u64 {
    value as u64
}

/// The low 16 bits of `value`: a field packed in a wider word, or a hash cut short on purpose.
#[inline]
// Dropping the high bits is the point.
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn low_u16(value: u64) -> u16 {
    value as u16
}

/// The low 32 bits of `value`: the low half of a word kept in two.
#[inline]
// Dropping the high bits is the point.
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn low_u32(value: u64) -> u32 {
    value as u32
}

/// `value` as a u64, saturating at `u64::MAX`: for a statistic only (milliseconds elapsed, which
/// would take 584 million years to saturate), never for a value bound for the disk or the index.
#[inline]
pub(crate) fn saturating_u64(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// `value` as a `T`, or [`Error::Invalid`] naming `field` and saying it does not fit: for a value
/// that no earlier check bounds.
// No caller outside its test yet.
#[allow(dead_code)]
pub(crate) fn checked<T, U>(value: U, field: &str) -> Result<T>
where
    U: Copy + std::fmt::Display,
    T: TryFrom<U>,
{
    T::try_from(value)
        .map_err(|_| Error::invalid(field, format!("{value} does not fit in {}", std::any::type_name::<T>())))
}

/// `value` as a `T`, where a bound in [`crate::limits`] (or the code path's own check) already keeps
/// it in range. A value out of range is a bug in ctxlog, never input: it stops here with a panic
/// naming `what`, rather than reach the disk or the index clamped.
#[inline]
#[track_caller]
pub(crate) fn bounded<T, U>(value: U, what: &str) -> T
where
    U: Copy + std::fmt::Display,
    T: TryFrom<U>,
{
    match T::try_from(value) {
        Ok(v) => v,
        Err(_) => panic!(
            "{what} = {value} does not fit in {}: a bound was not enforced",
            std::any::type_name::<T>()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_lossless() {
        assert_eq!(usize_from_u32(u32::MAX), 4_294_967_295);
        assert_eq!(usize_from_u64(u64::MAX), usize::MAX);
        assert_eq!(u64_from_usize(usize::MAX), u64::MAX);
    }

    #[test]
    fn low_bits_are_cut_and_saturation_is_explicit() {
        assert_eq!(low_u16(0x1234_5678_9abc_def0), 0xdef0);
        assert_eq!(low_u32(0x1234_5678_9abc_def0), 0x9abc_def0);
        assert_eq!(saturating_u64(12), 12);
        assert_eq!(saturating_u64(u128::from(u64::MAX) + 1), u64::MAX);
    }

    #[test]
    fn checked_names_the_field() {
        assert_eq!(checked::<u8, usize>(255, "x").unwrap(), 255);
        let err = checked::<u8, usize>(256, "name length").unwrap_err().to_string();
        assert!(
            err.contains("name length") && err.contains("256") && err.contains("u8"),
            "{err}"
        );
    }

    #[test]
    fn bounded_passes_values_in_range() {
        assert_eq!(bounded::<u16, usize>(65_535, "x"), 65_535);
    }

    #[test]
    #[should_panic(expected = "slot = 4294967296 does not fit in u32")]
    fn bounded_refuses_to_clamp() {
        let _: u32 = bounded(1usize << 32, "slot");
    }
}
