//! Error flags from C: the check policy and categories of a context, taking the
//! collected flags, and what one raised flag reports.

use super::handle::borrow;
use super::{boundary, boundary_value, error_into_raw, ndx_context_t, ndx_error_t};
use crate::checks::{self, Policy};
use crate::error::{Error, Result};

/// What a context does with checks (`ndx_context_set_checks`). Values are never
/// renumbered.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_check_policy_t {
    /// No check runs: the check operators pass their input through without looking
    /// at it, and kernels take their unchecked loops.
    NDX_CHECKS_OFF = 1,
    /// Computation continues; raised flags are reported at the end of
    /// `ndx_context_evaluate` and by `ndx_context_take_check_errors`.
    NDX_CHECKS_COLLECT = 2,
    /// The first flag an invocation raises fails that invocation (NDX_ERROR_CHECK).
    NDX_CHECKS_FAIL_FAST = 3,
}

/// Check categories, combined as a bit mask. Values are never renumbered.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_check_category_t {
    /// An operator produced NaN or an infinity from finite inputs.
    NDX_CHECK_NAN = 1,
    /// Integer or float division (`div`, `floordiv`, `mod`) by zero; an integer
    /// result is then 0 instead of an NDX_ERROR_VALUE failure.
    NDX_CHECK_DIV = 2,
    /// Out-of-range indices: a `slice` bound outside [-size, size] (still clamped).
    NDX_CHECK_INDEX = 4,
    /// The check operators: `check`, `check_finite`, `check_range`, `check_shape`.
    NDX_CHECK_USER = 8,
    /// Every category.
    NDX_CHECK_ALL = 15,
}

/// What one raised check flag reports (`ndx_error_check_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ndx_check_info_t {
    /// Set by the caller to `sizeof(ndx_check_info_t)`.
    pub struct_size: usize,
    /// One `ndx_check_category_t` bit.
    pub category: u32,
    /// Flat (row-major) index of the first failing element; for `check_shape`, the
    /// first mismatching axis; for a `slice` bound, the axis.
    pub first_index: u64,
    /// Failing elements, summed over occurrences.
    pub count: u64,
    /// How many invocations enqueued at this site raised it (a check in a loop is
    /// reported once, with its counts summed).
    pub occurrences: u64,
    /// Batch sample the flag was raised on, or -1 when the input was a tensor.
    pub sample: i64,
    /// Sequence number of the latest flagged invocation upstream of this one (its
    /// inputs were computed from flagged data, so this flag may be a consequence of
    /// that one), or 0 when this flag is a root cause. Sequence numbers are per
    /// context: only upstream invocations of this flag's context count.
    pub consequence_of: u64,
}

pub(crate) fn check_policy(raw: i32, arg: &str) -> Result<Policy> {
    Policy::from_raw(raw).ok_or_else(|| {
        Error::value(format!(
            "{arg} is {raw}, not an ndx_check_policy_t value (expected 1 to 3)"
        ))
    })
}

/// Check settings from C values: 0 categories means every one, 0 capacity the
/// default.
pub(crate) fn check_settings(
    policy: i32,
    categories: u32,
    capacity: u32,
    names: [&str; 2],
) -> Result<checks::Settings> {
    let policy = check_policy(policy, names[0])?;
    if categories & !checks::ALL != 0 {
        return Err(Error::value(format!(
            "{} is {categories:#x}: unknown bits {:#x} (NDX_CHECK_ALL is {:#x})",
            names[1],
            categories & !checks::ALL,
            checks::ALL
        )));
    }
    Ok(checks::Settings {
        policy,
        categories: if categories == 0 {
            checks::ALL
        } else {
            categories
        },
        capacity: if capacity == 0 {
            checks::DEFAULT_CAPACITY
        } else {
            capacity as usize
        },
    })
}

/// Sets the check policy (an `ndx_check_policy_t`), the categories (a mask of
/// `ndx_check_category_t`; 0: all) and the number of distinct flags kept between
/// reports (0: 1024; later flags are dropped and counted) for later invocations.
/// Flags already collected stay until reported. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_set_checks(
    ctx: *const ndx_context_t,
    policy: i32,
    categories: u32,
    capacity: u32,
) -> *mut ndx_error_t {
    boundary("ndx_context_set_checks", || {
        let names = ["argument 'policy'", "argument 'categories'"];
        let settings = check_settings(policy, categories, capacity, names)?;
        borrow(ctx, "ctx")?.set_checks(settings);
        Ok(())
    })
}

/// Takes the check flags collected so far (COLLECT) without waiting for running
/// work: NULL when none, else one owned NDX_ERROR_CHECK error whose related errors
/// are the flags in enqueue order, each an NDX_ERROR_CHECK error with its message,
/// op, sequence number and the site where it was enqueued (`ndx_error_check_info`
/// has the numbers). Flags are reported once. NULL `ctx` gives an NDX_ERROR_VALUE
/// error. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_context_take_check_errors(ctx: *const ndx_context_t) -> *mut ndx_error_t {
    boundary_value(
        "ndx_context_take_check_errors",
        error_into_raw,
        || match borrow(ctx, "ctx") {
            Ok(ctx) => ctx
                .take_check_errors()
                .map_or(std::ptr::null_mut(), error_into_raw),
            Err(e) => error_into_raw(e),
        },
    )
}

/// When `err` is one raised check flag (a related error of a check group, or the
/// error of an invocation failed by FAIL_FAST), fills `*out` (up to
/// `out->struct_size` bytes) and returns true; otherwise returns false and leaves
/// `*out` alone. NULL arguments return false. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_error_check_info(
    err: *const ndx_error_t,
    out: *mut ndx_check_info_t,
) -> bool {
    boundary_value(
        "ndx_error_check_info",
        |_| false,
        || {
            let Some(info) = super::error::error_ref(err).and_then(Error::check_info) else {
                return false;
            };
            if out.is_null() {
                return false;
            }
            // SAFETY: non-NULL out-param whose first field is its size (API contract).
            let size = unsafe { (*out).struct_size };
            let full = ndx_check_info_t {
                struct_size: size,
                category: info.category,
                first_index: info.first_index,
                count: info.count,
                occurrences: info.occurrences,
                sample: info.sample,
                consequence_of: info.consequence_of,
            };
            let n = size.min(std::mem::size_of::<ndx_check_info_t>());
            // SAFETY: `out` holds at least `struct_size` bytes (API contract); we write
            // no more than that, and no more than our own struct.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&full as *const ndx_check_info_t).cast::<u8>(),
                    out.cast::<u8>(),
                    n,
                )
            };
            true
        },
    )
}
