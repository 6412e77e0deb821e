//! Error flags: checks that do not interrupt the computation.
//!
//! A kernel asks [`enabled`] whether a category is on for the invocation it runs (a
//! thread-local scope the node opens around the kernel, only when the context's
//! policy is not OFF) and [`raise`]s what it found. The node turns raised flags into
//! [`Flag`]s (with its op, sequence number, site and the upstream flag it descends
//! from) and either fails (FAIL_FAST) or hands them to the context's [`Collector`]
//! (COLLECT), which reports them in enqueue order as one `NDX_ERROR_CHECK` error.
//!
//! With the cargo feature `no-checks` every entry point here compiles to nothing.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, ErrorKind, Site};

/// An op produced NaN or an infinity from finite inputs.
pub const NAN: u32 = 1;
/// Integer or float division by zero.
pub const DIV: u32 = 2;
/// Out-of-range indices and slices.
pub const INDEX: u32 = 4;
/// The check operators (`check`, `check_finite`, `check_range`, `check_shape`).
pub const USER: u32 = 8;
/// Every category.
pub const ALL: u32 = NAN | DIV | INDEX | USER;

/// The name of one category bit, for messages and JSON.
pub fn category_name(category: u32) -> &'static str {
    match category {
        NAN => "NAN",
        DIV => "DIV",
        INDEX => "INDEX",
        USER => "USER",
        _ => "MIXED",
    }
}

/// What a context does with checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Policy {
    /// No check runs; kernels take their unchecked paths.
    Off = 1,
    /// Computation continues; flags are reported at the end of an evaluation and by
    /// `take_check_errors`.
    Collect = 2,
    /// The first flag an invocation raises fails that invocation.
    FailFast = 3,
}

impl Policy {
    /// The policy with ABI value `raw`.
    pub fn from_raw(raw: i32) -> Option<Policy> {
        [Policy::Off, Policy::Collect, Policy::FailFast]
            .into_iter()
            .find(|p| *p as i32 == raw)
    }
}

/// Default bound on the distinct flags a context keeps between reports.
pub const DEFAULT_CAPACITY: usize = 1024;

/// A context's check settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The policy.
    pub policy: Policy,
    /// Enabled categories (a mask of [`NAN`], [`DIV`], [`INDEX`], [`USER`]).
    pub categories: u32,
    /// Distinct flags kept between reports; later ones are counted as dropped.
    pub capacity: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            policy: Policy::Off,
            categories: ALL,
            capacity: DEFAULT_CAPACITY,
        }
    }
}

impl Settings {
    /// The categories an invocation runs with (none when OFF or compiled out).
    pub fn active(&self) -> u32 {
        if cfg!(feature = "no-checks") || self.policy == Policy::Off {
            0
        } else {
            self.categories & ALL
        }
    }
}

/// A flag as a kernel raises it: before it is tied to its invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Raised {
    /// One category bit.
    pub category: u32,
    /// What failed ("3 elements are not finite").
    pub message: String,
    /// Flat index of the first failing element (in the sample for batches).
    pub first_index: u64,
    /// Failing elements.
    pub count: u64,
    /// Batch sample the flag was raised on, if any.
    pub sample: Option<usize>,
    /// Whether `first_index` is an axis (shape and slice checks), not an element.
    pub axis: bool,
}

struct Scope {
    categories: u32,
    raised: Vec<Raised>,
    nan_handled: bool,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// Whether `category` is checked by the invocation running on this thread.
#[inline]
pub fn enabled(category: u32) -> bool {
    if cfg!(feature = "no-checks") {
        return false;
    }
    SCOPE.with(|s| {
        s.borrow()
            .as_ref()
            .is_some_and(|s| s.categories & category != 0)
    })
}

/// Raises a flag in the running invocation (ignored outside a scope or when its
/// category is off).
pub fn raise(flag: Raised) {
    if cfg!(feature = "no-checks") {
        return;
    }
    SCOPE.with(|s| {
        if let Some(s) = s.borrow_mut().as_mut()
            && s.categories & flag.category != 0
        {
            s.raised.push(flag);
        }
    });
}

/// Raises a flag from a [`Tally`] when it counted anything.
pub fn raise_tally(category: u32, tally: &Tally, message: impl FnOnce(u64) -> String) {
    if let Some((first_index, count)) = tally.get() {
        raise(Raised {
            category,
            message: message(count),
            first_index,
            count,
            sample: None,
            axis: false,
        });
    }
}

/// Tells the node that the running kernel checked NAN itself (in its loop), so no
/// separate pass over its output is needed.
pub fn nan_handled() {
    SCOPE.with(|s| {
        if let Some(s) = s.borrow_mut().as_mut() {
            s.nan_handled = true;
        }
    });
}

/// Whether NAN is checked and the kernel that just ran did not check it itself.
pub fn nan_unhandled() -> bool {
    if cfg!(feature = "no-checks") {
        return false;
    }
    SCOPE.with(|s| {
        s.borrow()
            .as_ref()
            .is_some_and(|s| s.categories & NAN != 0 && !s.nan_handled)
    })
}

/// What a scoped run raised.
pub struct Outcome {
    /// Flags, in the order raised.
    pub raised: Vec<Raised>,
}

/// Runs `f` with `categories` enabled on this thread (scopes nest: the previous one is
/// restored after).
pub fn run_scoped<R>(categories: u32, f: impl FnOnce() -> R) -> (R, Outcome) {
    let previous = SCOPE.with(|s| {
        s.borrow_mut().replace(Scope {
            categories,
            raised: Vec::new(),
            nan_handled: false,
        })
    });
    let r = f();
    let scope = SCOPE.with(|s| std::mem::replace(&mut *s.borrow_mut(), previous));
    let scope = scope.unwrap_or(Scope {
        categories,
        raised: Vec::new(),
        nan_handled: false,
    });
    (
        r,
        Outcome {
            raised: scope.raised,
        },
    )
}

/// Runs `f` outside any scope, restoring the one it was called in after: the kernels
/// of an invocation without checks check nothing and raise nothing, also when it runs
/// inside a checked one's kernel (a SYNC invocation from a host operator, whose flags
/// were taken for the host operator's and whose division by zero did not fail).
pub fn run_unscoped<R>(f: impl FnOnce() -> R) -> R {
    let Some(previous) = SCOPE.with(|s| s.borrow_mut().take()) else {
        return f();
    };
    struct Restore(Option<Scope>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            SCOPE.with(|s| *s.borrow_mut() = previous);
        }
    }
    let _restore = Restore(Some(previous));
    f()
}

/// Counts failing elements across the pieces of a parallel kernel: how many, and the
/// smallest index.
pub struct Tally {
    count: AtomicU64,
    first: AtomicU64,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally::new()
    }
}

impl Tally {
    /// Nothing counted.
    pub fn new() -> Tally {
        Tally {
            count: AtomicU64::new(0),
            first: AtomicU64::new(u64::MAX),
        }
    }
    /// Adds `count` failures whose first is at `first`.
    pub fn add(&self, first: u64, count: u64) {
        if count > 0 {
            self.count.fetch_add(count, Ordering::Relaxed);
            self.first.fetch_min(first, Ordering::Relaxed);
        }
    }
    /// Counts the elements of `0..n` (offset by `base`) for which `bad` holds.
    pub fn scan(&self, base: usize, n: usize, bad: impl Fn(usize) -> bool) {
        let mut first = None;
        let mut count = 0;
        for i in 0..n {
            if bad(i) {
                first.get_or_insert(i);
                count += 1;
            }
        }
        if let Some(f) = first {
            self.add((base + f) as u64, count);
        }
    }
    /// `(first index, count)` when anything was counted.
    pub fn get(&self) -> Option<(u64, u64)> {
        let count = self.count.load(Ordering::Relaxed);
        (count > 0).then(|| (self.first.load(Ordering::Relaxed), count))
    }
}

/// A raised flag tied to its invocation.
#[derive(Debug, Clone)]
pub struct Flag {
    /// Sequence number of the invocation that raised it (the first, when folded).
    pub seq: u64,
    /// Operator name.
    pub op: String,
    /// Enqueue site.
    pub site: Arc<Site>,
    /// The flag as raised (counts summed when folded).
    pub raised: Raised,
    /// How many invocations raised it at this site (1 unless folded).
    pub occurrences: u64,
    /// How many raised flags were folded into this one (1 unless folded): more than
    /// `occurrences` when an invocation raised several, one per failing sample of a
    /// batch or per output.
    pub folded: u64,
    /// The latest invocation folded into this flag (flags of several samples of one
    /// invocation are one occurrence).
    pub last_seq: u64,
    /// The latest flagged invocation upstream of this one (0: none): this flag may be
    /// a consequence of that one.
    pub consequence_of: u64,
}

/// What `ndx_error_check_info` reports about one flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    /// One category bit.
    pub category: u32,
    /// Flat index of the first failing element.
    pub first_index: u64,
    /// Failing elements (summed over occurrences).
    pub count: u64,
    /// Invocations that raised it at this site.
    pub occurrences: u64,
    /// Batch sample (-1: not a batch).
    pub sample: i64,
    /// Sequence number of the upstream flag this one may be a consequence of (0: none).
    pub consequence_of: u64,
}

impl Flag {
    /// The flag as one `NDX_ERROR_CHECK` error with its op, sequence number and site.
    pub fn to_error(&self) -> Error {
        let r = &self.raised;
        let mut msg = format!("{} check failed: {}", category_name(r.category), r.message);
        if let Some(s) = r.sample {
            msg.push_str(&format!(" in sample {s}"));
        }
        let at = if r.axis { "axis" } else { "flat index" };
        msg.push_str(&format!(" (first at {at} {})", r.first_index));
        if self.occurrences > 1 {
            msg.push_str(&format!(
                "; raised {} times at this site (first by #{}): {} failing elements in all",
                self.occurrences, self.seq, r.count
            ));
        } else if self.folded > 1 {
            // One invocation, several flags (samples, outputs): the text above is the
            // first one's; say that there is more.
            msg.push_str(&format!(
                "; raised {} times by this invocation (per sample or output): {} failing \
                 elements in all",
                self.folded, r.count
            ));
        }
        if self.consequence_of != 0 {
            msg.push_str(&format!(
                "; a consequence of the flag raised by #{}",
                self.consequence_of
            ));
        }
        let e = Error::new(ErrorKind::Check, msg)
            .with_op(&self.op, self.seq)
            .with_site(self.site.clone());
        let e = match r.sample {
            Some(s) => e.with_sample(s),
            None => e,
        };
        e.with_check(Info {
            category: r.category,
            first_index: r.first_index,
            count: r.count,
            occurrences: self.occurrences,
            sample: r.sample.map_or(-1, |s| s as i64),
            consequence_of: self.consequence_of,
        })
    }
}

/// A context's raised flags between reports: folded per site, op and category;
/// bounded, with an exact count of what did not fit.
pub struct Collector {
    flags: Vec<Flag>,
    index: HashMap<(u64, String, u32), usize>,
    capacity: usize,
    dropped: u64,
    raised_total: u64,
}

impl Collector {
    /// An empty collector keeping up to `capacity` distinct flags.
    pub fn new(capacity: usize) -> Collector {
        Collector {
            flags: Vec::new(),
            index: HashMap::new(),
            capacity,
            dropped: 0,
            raised_total: 0,
        }
    }

    /// Changes the bound (for flags collected from now on).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Flags raised since the context was made (folded or not, dropped or not).
    pub fn raised_total(&self) -> u64 {
        self.raised_total
    }

    /// Adds a flag, folding it into an earlier one from the same site.
    pub fn add(&mut self, flag: Flag) {
        self.raised_total += 1;
        let key = (flag.site.key(), flag.op.clone(), flag.raised.category);
        if let Some(&i) = self.index.get(&key) {
            let kept = &mut self.flags[i];
            if kept.last_seq != flag.seq {
                kept.occurrences += 1;
                kept.last_seq = flag.seq;
            }
            kept.raised.count += flag.raised.count;
            kept.folded += 1;
            if flag.seq < kept.seq {
                let (occurrences, count, last, folded) = (
                    kept.occurrences,
                    kept.raised.count,
                    kept.last_seq,
                    kept.folded,
                );
                *kept = flag;
                kept.occurrences = occurrences;
                kept.raised.count = count;
                kept.last_seq = last;
                kept.folded = folded;
            }
            return;
        }
        if self.flags.len() >= self.capacity {
            self.dropped += 1;
            return;
        }
        self.index.insert(key, self.flags.len());
        self.flags.push(flag);
    }

    /// Whether nothing is waiting to be reported.
    pub fn is_empty(&self) -> bool {
        self.flags.is_empty() && self.dropped == 0
    }

    /// Takes every flag as one `NDX_ERROR_CHECK` error (related errors in enqueue
    /// order), or `None` when there is none.
    pub fn take(&mut self) -> Option<Error> {
        if self.is_empty() {
            return None;
        }
        let mut flags = std::mem::take(&mut self.flags);
        self.index.clear();
        let dropped = std::mem::take(&mut self.dropped);
        flags.sort_by_key(|f| f.seq);
        let n = flags.len();
        let mut msg = format!(
            "{n} check{} failed (in enqueue order)",
            if n == 1 { "" } else { "s" }
        );
        if dropped > 0 {
            msg.push_str(&format!(
                "; {dropped} more flag{} dropped: the context keeps {} distinct flags (check_capacity)",
                if dropped == 1 { " was" } else { "s were" },
                self.capacity
            ));
        }
        Some(Error::new(ErrorKind::Check, msg).with_related(flags.iter().map(Flag::to_error)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(seq: u64, site: &Arc<Site>, count: u64) -> Flag {
        Flag {
            seq,
            op: "check".into(),
            site: site.clone(),
            raised: Raised {
                category: USER,
                message: "x".into(),
                first_index: seq,
                count,
                sample: None,
                axis: false,
            },
            occurrences: 1,
            folded: 1,
            last_seq: seq,
            consequence_of: 0,
        }
    }

    #[test]
    fn scopes_collect_only_enabled_categories_and_nest() {
        assert!(!enabled(NAN));
        let (_, out) = run_scoped(NAN | USER, || {
            assert!(enabled(NAN) && !enabled(DIV));
            raise(Raised {
                category: DIV,
                message: "ignored".into(),
                first_index: 0,
                count: 1,
                sample: None,
                axis: false,
            });
            let (_, inner) = run_scoped(DIV, || {
                raise(Raised {
                    category: DIV,
                    message: "inner".into(),
                    first_index: 3,
                    count: 2,
                    sample: None,
                    axis: false,
                })
            });
            assert_eq!(inner.raised.len(), 1);
            assert!(enabled(USER), "the outer scope is restored");
        });
        assert!(out.raised.is_empty());
        assert!(!enabled(USER));
    }

    #[test]
    fn tally_counts_and_keeps_the_smallest_index() {
        let t = Tally::new();
        assert_eq!(t.get(), None);
        t.scan(100, 10, |i| i % 4 == 1);
        t.add(7, 2);
        assert_eq!(t.get(), Some((7, 5)));
    }

    #[test]
    fn collector_folds_per_site_sorts_by_seq_and_counts_drops() {
        let a = Arc::new(Site::from_ips(vec![1]));
        let b = Arc::new(Site::from_ips(vec![2]));
        let c = Arc::new(Site::from_ips(vec![3]));
        let mut col = Collector::new(2);
        col.add(flag(5, &b, 1));
        col.add(flag(3, &a, 2));
        col.add(flag(9, &a, 4));
        col.add(flag(11, &c, 1));
        col.add(flag(12, &c, 1));
        let e = col.take().expect("flags");
        assert_eq!(e.kind(), ErrorKind::Check);
        assert!(
            e.message().contains("2 more flags were dropped"),
            "{}",
            e.message()
        );
        let seqs: Vec<_> = e.related().iter().map(|r| r.sequence()).collect();
        assert_eq!(seqs, [Some(3), Some(5)]);
        let info = e.related()[0].check_info().expect("info");
        assert_eq!((info.occurrences, info.count), (2, 6));
        assert!(col.take().is_none());
        assert_eq!(col.raised_total(), 5);
    }

    /// EAGER invocations of one site may complete out of order: a flag of an earlier
    /// invocation arriving after a later one's becomes the one reported (its sequence
    /// number and first index), with the counts of both; a second flag of the same
    /// invocation (another sample) is not another occurrence.
    #[test]
    fn an_earlier_invocations_flag_arriving_later_is_the_one_reported() {
        let site = Arc::new(Site::from_ips(vec![1]));
        let mut col = Collector::new(4);
        col.add(flag(9, &site, 4));
        col.add(flag(3, &site, 2));
        col.add(flag(3, &site, 1));
        let e = col.take().expect("flags");
        assert_eq!(e.related().len(), 1);
        let r = &e.related()[0];
        assert_eq!(r.sequence(), Some(3));
        let info = r.check_info().expect("info");
        assert_eq!((info.first_index, info.count, info.occurrences), (3, 7, 2));
        assert!(
            r.message()
                .contains("raised 2 times at this site (first by #3): 7 failing elements"),
            "{}",
            r.message()
        );
    }
}
