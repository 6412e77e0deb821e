//! Splitting one large kernel across the worker pool.
//!
//! A kernel over more than [`MIN_WORK`] element-operations is cut into pieces of
//! [`PIECE_WORK`] each, which the pool's workers run with work stealing (the caller
//! runs pieces too, so no worker ever blocks on another). Piece boundaries depend only
//! on the sizes, never on the thread count, so every result (a reduction's rounding
//! included) is the same on any machine and any pool size.

use rayon::prelude::*;

use crate::error::Result;

/// Work (about one element-operation each) below which a kernel stays on one thread.
pub const MIN_WORK: usize = 1 << 18;

/// Work per piece of a split kernel.
pub const PIECE_WORK: usize = 1 << 16;

/// Pieces of whole units (`unit` elements each, `work_per_unit` element-operations
/// each): `(units per piece, pieces)`, or `None` when the work is too small to split.
pub fn pieces(units: usize, work_per_unit: usize) -> Option<(usize, usize)> {
    let work_per_unit = work_per_unit.max(1);
    if units < 2 || units.saturating_mul(work_per_unit) < MIN_WORK {
        return None;
    }
    let per = (PIECE_WORK / work_per_unit).max(1);
    Some((per, units.div_ceil(per)))
}

/// Splits `out` into pieces of whole units (`unit` elements, `work_per_unit`
/// element-operations each) and calls `f(first_unit, piece)` on each, in parallel when
/// the work is large enough. When pieces fail, the error of the first one is returned.
pub fn chunks_mut<T: Send>(
    out: &mut [T],
    unit: usize,
    work_per_unit: usize,
    f: impl Fn(usize, &mut [T]) -> Result<()> + Sync + Send,
) -> Result<()> {
    let units = out.len().checked_div(unit).unwrap_or(0);
    let Some((per, _)) = pieces(units, work_per_unit) else {
        return f(0, out);
    };
    split_chunks_mut(out, unit, per, &f)
}

/// The parallel part of [`chunks_mut`], through `dyn`: the pool's machinery is
/// compiled once per element type rather than once per kernel closure (one call
/// through a pointer per piece of 2^16 element-operations costs nothing measurable;
/// the closures' names nested in the pool's generic types made most of the debug
/// information of a test binary).
fn split_chunks_mut<T: Send>(
    out: &mut [T],
    unit: usize,
    per: usize,
    f: &(dyn Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let first_error = crate::exec::pool::install(|| {
        out.par_chunks_mut(per * unit)
            .enumerate()
            .filter_map(|(i, piece)| f(i * per, piece).err().map(|e| (i, e)))
            .min_by_key(|(i, _)| *i)
    });
    first_error.map_or(Ok(()), |(_, e)| Err(e))
}

/// Maps each piece of `0..units` (as [`chunks_mut`] cuts it) to a value, in parallel
/// when the work is large enough, and returns the values in order.
pub fn map_pieces<R: Send>(
    units: usize,
    work_per_unit: usize,
    f: impl Fn(std::ops::Range<usize>) -> R + Sync + Send,
) -> Vec<R> {
    let Some((per, n)) = pieces(units, work_per_unit) else {
        return vec![f(0..units)];
    };
    split_map(units, per, n, &f)
}

/// The parallel part of [`map_pieces`], through `dyn` (as [`split_chunks_mut`]).
fn split_map<R: Send>(
    units: usize,
    per: usize,
    n: usize,
    f: &(dyn Fn(std::ops::Range<usize>) -> R + Sync),
) -> Vec<R> {
    crate::exec::pool::install(|| {
        (0..n)
            .into_par_iter()
            .map(|i| f(i * per..((i + 1) * per).min(units)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_visited_once_with_its_index() {
        let mut v = vec![0usize; 3 * MIN_WORK + 7];
        chunks_mut(&mut v, 1, 1, |first, piece| {
            for (i, x) in piece.iter_mut().enumerate() {
                *x += first + i + 1;
            }
            Ok(())
        })
        .unwrap();
        assert!(v.iter().enumerate().all(|(i, &x)| x == i + 1));
        let e = chunks_mut(&mut v, 1, 1, |first, _| {
            if first > 0 {
                Err(crate::error::Error::value("late piece"))
            } else {
                Ok(())
            }
        });
        assert_eq!(e.unwrap_err().message(), "late piece");
        let sums = map_pieces(v.len(), 1, |r| r.len());
        assert_eq!(sums.len(), v.len().div_ceil(PIECE_WORK));
        assert_eq!(sums.iter().sum::<usize>(), v.len());
    }
}
