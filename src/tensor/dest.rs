//! Out tensors a running kernel allocates its outputs in: the engine lends an
//! invocation's compact out tensors to the thread that runs its kernel, and the first
//! allocation of a matching dtype and shape takes one instead of fresh memory, so the
//! kernel writes its result straight into the caller's buffer.

use std::cell::RefCell;
use std::sync::Arc;

use super::{DType, Tensor};

thread_local! {
    static LENT: RefCell<Vec<Arc<Tensor>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `dests` lent to allocations on this thread; whatever `f` does not take
/// is withdrawn afterwards. Nested calls (a stolen job of another invocation) see only
/// their own.
pub(crate) fn with_lent<R>(dests: Vec<Arc<Tensor>>, f: impl FnOnce() -> R) -> R {
    struct Restore(Vec<Arc<Tensor>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = std::mem::take(&mut self.0);
            let _ = LENT.try_with(|l| *l.borrow_mut() = prev);
        }
    }
    let prev = LENT.with(|l| std::mem::replace(&mut *l.borrow_mut(), dests));
    let _restore = Restore(prev);
    f()
}

/// Takes the lent out tensor of exactly `dtype` and `shape`, if there is one.
pub(crate) fn take(dtype: DType, shape: &[i64]) -> Option<Arc<Tensor>> {
    LENT.try_with(|l| {
        let mut l = l.borrow_mut();
        let i = l
            .iter()
            .position(|d| d.dtype() == dtype && d.shape() == shape)?;
        Some(l.swap_remove(i))
    })
    .ok()
    .flatten()
}
