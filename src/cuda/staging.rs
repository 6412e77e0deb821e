//! Pinned staging for host-to-device copies.
//!
//! From pageable host memory, `cuMemcpyHtoDAsync` is asynchronous in name only: the
//! driver may synchronise the stream before the copy starts (CUDA driver API,
//! "API synchronization behavior"), so an upload would wait for every kernel queued
//! before it — SYNC_CPU's "return once enqueued" and an EAGER pipeline's overlap of
//! the next upload with the current kernel would be lost. From page-locked memory the
//! copy is truly asynchronous. So ndx copies the host bytes into pinned blocks of its
//! own (a `memcpy`, which the driver would do into its staging buffers anyway) and
//! enqueues the DMA from there.
//!
//! A block is reused once the copy that last read it has completed (its event). A
//! copy is staged in pieces of at most [`PIECE`] bytes, and a device keeps at most
//! [`CAP`] bytes of pinned blocks: a larger upload cycles through its blocks, each
//! piece waiting for the copy that last read its block, so a 1 GiB upload runs with
//! eight pieces in flight rather than pinning 1 GiB. Where the driver refuses pinned
//! memory, the piece is copied from the caller's pageable memory as before.

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::device::{DeviceState, Event, check};
use crate::error::Result;

/// The largest piece of an upload staged at once.
pub const PIECE: usize = 8 << 20;
/// The smallest pinned block (smaller requests share blocks of this size).
const MIN_BLOCK: usize = 64 << 10;
/// Pinned bytes a device keeps at most.
pub const CAP: usize = 64 << 20;

/// A pinned host block and the copy that last read it.
struct Block {
    ptr: *mut u8,
    len: usize,
    last_read: Option<Arc<Event>>,
}

// SAFETY: the block is pinned host memory owned by the pool for the life of the
// process; one thread at a time holds it (taken out of the pool's list to be used).
unsafe impl Send for Block {}

/// One device's pinned blocks.
pub struct Staging {
    blocks: Mutex<Vec<Block>>,
    /// What the pool did, for tests and benchmarks.
    stats: Mutex<Stats>,
}

/// Counters of one device's staging.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Pinned blocks held (`cuMemHostAlloc`).
    pub blocks: usize,
    /// Their bytes.
    pub pinned: usize,
    /// Blocks ever allocated.
    pub allocated: u64,
    /// Pieces staged through a pinned block.
    pub staged: u64,
    /// Pieces that waited for a block's previous copy.
    pub waited: u64,
    /// Pieces copied from pageable memory (no pinned block to be had).
    pub pageable: u64,
}

/// The staging of `device`.
pub fn staging(device: &'static DeviceState) -> &'static Staging {
    static ALL: OnceLock<Vec<OnceLock<Staging>>> = OnceLock::new();
    super::per_device(&ALL, device, || Staging {
        blocks: Mutex::new(Vec::new()),
        stats: Mutex::new(Stats::default()),
    })
}

impl Staging {
    /// The counters so far.
    pub fn stats(&self) -> Stats {
        *self.stats.lock()
    }

    /// A block of at least `len` bytes no copy reads any more, else `None` (the
    /// caller copies from pageable memory).
    fn take(&self, device: &'static DeviceState, len: usize) -> Result<Option<Block>> {
        let idle = |b: &Block| {
            b.last_read
                .as_ref()
                .is_none_or(|e| e.is_complete().unwrap_or(false))
        };
        let busy = {
            let mut blocks = self.blocks.lock();
            // The smallest idle block that fits.
            let best = (blocks.iter().enumerate())
                .filter(|(_, b)| b.len >= len && idle(b))
                .min_by_key(|(_, b)| b.len)
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(Some(blocks.remove(i)));
            }
            // A new block, within the cap, after giving back idle blocks too small for
            // this piece if that makes room.
            let size = len.next_power_of_two().max(MIN_BLOCK);
            let mut stats = self.stats.lock();
            let mut i = 0;
            while stats.pinned + size > CAP && i < blocks.len() {
                if blocks[i].len < len && idle(&blocks[i]) {
                    let b = blocks.remove(i);
                    // SAFETY: pinned memory of this pool that no copy reads any more
                    // (idle), freed once: it has just left the pool's list.
                    let _ = unsafe { sys::cuMemFreeHost(b.ptr.cast()) };
                    stats.blocks -= 1;
                    stats.pinned -= b.len;
                } else {
                    i += 1;
                }
            }
            if stats.pinned + size <= CAP {
                return Ok(allocate(device, size, &mut stats));
            }
            drop(stats);
            // At the cap: the fitting block whose copy was enqueued first (the list
            // keeps the order blocks came back in).
            match blocks.iter().position(|b| b.len >= len) {
                Some(i) => blocks.remove(i),
                None => return Ok(None),
            }
        };
        if let Some(e) = &busy.last_read {
            self.stats.lock().waited += 1;
            if let Err(e) = e.synchronize() {
                self.put(busy);
                return Err(e);
            }
        }
        Ok(Some(busy))
    }

    fn put(&self, block: Block) {
        self.blocks.lock().push(block);
    }
}

/// A new pinned block of `size` bytes, or `None` when the driver refuses.
fn allocate(device: &'static DeviceState, size: usize, stats: &mut Stats) -> Option<Block> {
    device.bind().ok()?;
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a current context and a valid out-pointer. The block is kept by the pool
    // for the life of the process (freed only to make room for a larger one).
    let r = unsafe { sys::cuMemHostAlloc(&mut p, size, 0) };
    if check("cuMemHostAlloc", r).is_err() || p.is_null() {
        return None;
    }
    stats.blocks += 1;
    stats.pinned += size;
    stats.allocated += 1;
    Some(Block {
        ptr: p.cast(),
        len: size,
        last_read: None,
    })
}

/// Copies `src` to device memory at `dst` on ndx's stream of `device`, staged through
/// pinned blocks: the call returns once the bytes are staged (`src` may be reused at
/// once) without waiting for the work queued before the copy.
pub fn upload(device: &'static DeviceState, dst: u64, src: &[u8]) -> Result<()> {
    let pool = staging(device);
    device.bind()?;
    let stream = device.stream();
    for (k, piece) in src.chunks(PIECE).enumerate() {
        let at = dst + (k * PIECE) as u64;
        let Some(mut block) = pool.take(device, piece.len())? else {
            pool.stats.lock().pageable += 1;
            // SAFETY: `at` holds `piece.len()` bytes (the caller's block); the driver
            // stages the pageable source before it returns.
            check("cuMemcpyHtoDAsync", unsafe {
                sys::cuMemcpyHtoDAsync_v2(at, piece.as_ptr().cast(), piece.len(), stream as _)
            })?;
            continue;
        };
        // SAFETY: the block holds `block.len >= piece.len()` bytes of pinned memory that
        // no copy reads any more (its last copy completed) and that this thread alone
        // holds now.
        let staged = unsafe { std::slice::from_raw_parts_mut(block.ptr, piece.len()) };
        staged.copy_from_slice(piece);
        // SAFETY: `at` holds `piece.len()` bytes; the pinned source stays untouched
        // until the event recorded below completes (the block is reused only then).
        let r =
            unsafe { sys::cuMemcpyHtoDAsync_v2(at, block.ptr.cast(), piece.len(), stream as _) };
        let recorded = check("cuMemcpyHtoDAsync", r).and_then(|()| Event::record(device, stream));
        match recorded {
            Ok(event) => {
                block.last_read = Some(event);
                pool.stats.lock().staged += 1;
                pool.put(block);
            }
            Err(e) => {
                // The copy may still be queued: keep the block out of use for good
                // rather than let a later piece overwrite what it reads.
                std::mem::forget(block);
                return Err(e);
            }
        }
    }
    Ok(())
}
