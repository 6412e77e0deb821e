//! Reading inputs in place: a [`View`] sees a tensor's elements through its own
//! strides (negative and broadcast ones included) without compacting it first, and
//! [`for_each_in`] walks a range of output elements row by row, giving each view's
//! element index.

use super::kernels::{Elem, Elems, broadcast_strides, typed};
use crate::error::Result;
use crate::tensor::Tensor;

/// A tensor's elements as an output shape sees them: element `index` of the output
/// reads `data[origin + Σ index[d] · strides[d]]`.
pub(crate) struct View<'a, T: Elem> {
    data: Elems<'a, T>,
    origin: isize,
    strides: Vec<isize>,
}

impl<'a, T: Elem> View<'a, T> {
    /// `t` broadcast to `shape`, read in place through its strides when its memory is
    /// host memory aligned for `T`; else (rarely: a misaligned DLPack buffer) a compact
    /// copy.
    pub(crate) fn new(t: &'a Tensor, shape: &[i64]) -> Result<View<'a, T>> {
        let item = std::mem::size_of::<T>() as isize;
        if let Some((span, origin)) = t.host_span()
            && let Ok(data) = bytemuck::try_cast_slice::<u8, T>(span)
            && origin % item == 0
        {
            let lead = shape.len() - t.ndim();
            let mut strides = vec![0isize; shape.len()];
            for (k, (&d, &s)) in t.shape().iter().zip(t.strides()).enumerate() {
                if d != 1 {
                    strides[lead + k] = s as isize;
                }
            }
            return Ok(View {
                data: Elems::Borrowed(data),
                origin: origin / item,
                strides,
            });
        }
        let strides = broadcast_strides(t.shape(), shape)
            .into_iter()
            .map(|s| s as isize)
            .collect();
        Ok(View {
            data: typed::<T>(t)?,
            origin: 0,
            strides,
        })
    }

    /// Where element 0 is and how the output's indices step through the data, for
    /// [`for_each_in`].
    pub(crate) fn walk(&self) -> Walk<'_> {
        Walk {
            origin: self.origin,
            strides: &self.strides,
        }
    }

    /// The element at index `i` of the data (an offset [`for_each_in`] gave).
    #[inline(always)]
    pub(crate) fn get(&self, i: isize) -> T {
        self.data[i as usize]
    }

    /// The `n` consecutive elements from index `i` of the data (a row of step 1 that
    /// [`for_each_row`] gave).
    #[inline(always)]
    pub(crate) fn run(&self, i: isize, n: usize) -> &[T] {
        &self.data[i as usize..i as usize + n]
    }
}

impl<'a, T: Elem> View<'a, T> {
    /// The `n` elements from index `i` of the data stepping by `step` (at least 1): a
    /// row [`for_each_row`] gave, bounds-checked once rather than per element.
    #[inline(always)]
    pub(crate) fn stepped(&self, i: isize, n: usize, step: usize) -> impl Iterator<Item = &T> {
        let end = if n == 0 {
            i as usize
        } else {
            i as usize + (n - 1) * step + 1
        };
        self.data[i as usize..end].iter().step_by(step)
    }
}

/// How a [`View`]'s offsets follow the output index.
#[derive(Clone, Copy)]
pub(crate) struct Walk<'a> {
    origin: isize,
    strides: &'a [isize],
}

/// Calls `f(i, offsets)` for output elements `first..first + n` of `shape` in
/// row-major order, with each view's element offset for element `i`.
pub(crate) fn for_each_in<const N: usize>(
    shape: &[i64],
    first: usize,
    n: usize,
    views: [Walk<'_>; N],
    mut f: impl FnMut(usize, [isize; N]) -> Result<()>,
) -> Result<()> {
    for_each_row(shape, first, n, views, |i, len, offs, steps| {
        let mut o = offs;
        for j in i..i + len {
            f(j, o)?;
            for (o, s) in o.iter_mut().zip(&steps) {
                *o += s;
            }
        }
        Ok(())
    })
}

/// Calls `f(i, len, offsets, steps)` for each run of output elements `i..i + len`
/// (a piece of one innermost row) that covers `first..first + n` of `shape` in
/// row-major order: element `i + k` reads each view at `offsets + k * steps`. A
/// kernel can loop over a run whose steps are 1 or 0 as plain slices.
pub(crate) fn for_each_row<const N: usize>(
    shape: &[i64],
    first: usize,
    n: usize,
    views: [Walk<'_>; N],
    mut f: impl FnMut(usize, usize, [isize; N], [isize; N]) -> Result<()>,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let nd = shape.len();
    if nd == 0 {
        return f(0, 1, views.map(|v| v.origin), [0; N]);
    }
    // The multi-index of `first` and each view's offset there.
    let mut index = vec![0i64; nd];
    let mut rest = first as i64;
    for d in (0..nd).rev() {
        index[d] = rest % shape[d];
        rest /= shape[d];
    }
    let mut offs = views.map(|v| {
        v.origin
            + index
                .iter()
                .zip(v.strides)
                .map(|(&i, &s)| i as isize * s)
                .sum::<isize>()
    });
    let inner = shape[nd - 1];
    let steps = views.map(|v| v.strides[nd - 1]);
    let (mut i, end) = (first, first + n);
    while i < end {
        let row = ((inner - index[nd - 1]) as usize).min(end - i);
        f(i, row, offs, steps)?;
        i += row;
        if i == end {
            break;
        }
        // Next row: the inner index wrapped; carry into the outer dimensions.
        for (o, v) in offs.iter_mut().zip(views) {
            *o -= index[nd - 1] as isize * v.strides[nd - 1];
        }
        index[nd - 1] = 0;
        let mut d = nd - 1;
        loop {
            d -= 1;
            index[d] += 1;
            for (o, v) in offs.iter_mut().zip(views) {
                *o += v.strides[d];
            }
            if index[d] < shape[d] {
                break;
            }
            for (o, v) in offs.iter_mut().zip(views) {
                *o -= shape[d] as isize * v.strides[d];
            }
            index[d] = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    /// A [3, 4] i32 tensor holding 0..12, viewed through `shape`/`strides` from
    /// element `origin`.
    fn view_of(shape: Vec<i64>, strides: Vec<i64>, origin: i64) -> Tensor {
        let base = Tensor::new_host(DType::I32, &[3, 4], Default::default(), |b| {
            for (i, c) in b.chunks_mut(4).enumerate() {
                c.copy_from_slice(&(i as i32).to_ne_bytes());
            }
            Ok(())
        })
        .unwrap();
        base.restride(shape, strides, origin)
    }

    /// Every element `first..first + n` of `t` broadcast to `shape`, through a View.
    fn read(t: &Tensor, shape: &[i64], first: usize, n: usize) -> Vec<i32> {
        let v = View::<i32>::new(t, shape).unwrap();
        let mut got = Vec::new();
        for_each_in(shape, first, n, [v.walk()], |i, [x]| {
            assert_eq!(i, first + got.len());
            got.push(v.get(x));
            Ok(())
        })
        .unwrap();
        got
    }

    #[test]
    fn views_read_transposed_reversed_and_broadcast_elements_in_place() {
        // The transpose [4, 3] of 0..12.
        let t = view_of(vec![4, 3], vec![1, 4], 0);
        assert_eq!(
            read(&t, &[4, 3], 0, 12),
            [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
        );
        // A piece starting mid-row and crossing rows.
        assert_eq!(read(&t, &[4, 3], 2, 5), [8, 1, 5, 9, 2]);
        // Rows reversed (negative stride from the last row).
        let r = view_of(vec![3, 4], vec![-4, 1], 8);
        assert_eq!(read(&r, &[3, 4], 3, 3), [11, 4, 5]);
        // Column 1 broadcast over 2 leading rows of a [2, 3, 1] output.
        let c = view_of(vec![3, 1], vec![4, 1], 1);
        assert_eq!(read(&c, &[2, 3, 1], 0, 6), [1, 5, 9, 1, 5, 9]);
        // A 0-d output.
        let s = view_of(vec![], vec![], 6);
        assert_eq!(read(&s, &[], 0, 1), [6]);
    }
}
