//! A caching allocator for device memory, one pool per device: freed blocks are kept
//! by size class and handed out again, so a pipeline that repeats its shapes makes no
//! `cuMemAlloc` in steady state.
//!
//! Reuse is stream-ordered: all of ndx's work on a device runs on its one stream, so a
//! block freed after its last use was *enqueued* may go to work enqueued later — the
//! stream runs them in order. Memory ndx exported through DLPack to a consumer that
//! named its stream may still be read there after the consumer called the deleter
//! (its kernels may be queued): the deleter records an event on that stream, the
//! storage keeps it, and the block comes back with it (`give_back`'s `after`, one
//! event per consumer stream). Whoever takes the block makes ndx's stream wait for
//! those events first (`take`), like PyTorch's `record_stream`, with no host
//! synchronisation.
//!
//! On exhaustion the pool gives every cached block back to the driver and tries once
//! more; then it fails with `NDX_ERROR_MEMORY` naming the size asked for and what the
//! device had free.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::device::{DeviceState, Event, check};
use crate::error::{Error, ErrorKind, Result, human_bytes};

/// Where blocks come from: the driver, or a fake in the unit tests.
pub trait Backend {
    /// `bytes` of device memory, or `None` when the device is out of memory (other
    /// failures are errors).
    fn alloc(&mut self, bytes: usize) -> Result<Option<u64>>;
    /// Gives a block back.
    fn free(&mut self, ptr: u64, bytes: usize);
    /// `(free, total)` bytes of the device, for the out-of-memory message.
    fn mem_info(&self) -> (usize, usize);
}

/// A block of device memory handed out by a pool.
#[derive(Debug)]
pub struct Block<E> {
    /// The device pointer.
    pub ptr: u64,
    /// Its size (the request rounded up to its size class).
    pub bytes: usize,
    /// For a reused block last used on other streams (a DLPack consumer's): the events
    /// to order after before touching it (empty when there are none).
    pub after: Vec<E>,
}

/// Counters of one pool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Bytes handed out and not yet freed.
    pub in_use: usize,
    /// Bytes kept for reuse.
    pub cached: usize,
    /// The most bytes in use at once.
    pub peak: usize,
    /// Allocations served by the backend (the driver).
    pub backend_allocs: u64,
    /// Allocations served from the cache.
    pub reuses: u64,
}

/// One device's pool.
pub struct Pool<B: Backend, E> {
    backend: B,
    /// Free blocks by size class, each with its pending events.
    free: BTreeMap<usize, Vec<(u64, Vec<E>)>>,
    stats: Stats,
}

/// Requests are rounded up to a multiple of 512 bytes below 1 MiB and of 1 MiB
/// above, so similar sizes share blocks (at most 1/2 lost for sizes just over 1 MiB).
pub fn size_class(bytes: usize) -> usize {
    const SMALL: usize = 512;
    const LARGE: usize = 1 << 20;
    let step = if bytes < LARGE { SMALL } else { LARGE };
    bytes.max(1).div_ceil(step).saturating_mul(step)
}

impl<B: Backend, E> Pool<B, E> {
    /// An empty pool over `backend`.
    pub fn new(backend: B) -> Pool<B, E> {
        Pool {
            backend,
            free: BTreeMap::new(),
            stats: Stats::default(),
        }
    }

    /// A block of at least `bytes` (a cached one of the same class when there is one).
    /// `device` names the device in the out-of-memory error.
    pub fn alloc(&mut self, bytes: usize, device: &str) -> Result<Block<E>> {
        let class = size_class(bytes);
        if let Some((ptr, after)) = self.free.get_mut(&class).and_then(Vec::pop) {
            self.stats.cached -= class;
            self.stats.reuses += 1;
            self.note_in_use(class);
            return Ok(Block {
                ptr,
                bytes: class,
                after,
            });
        }
        let ptr = match self.backend.alloc(class)? {
            Some(p) => p,
            None => {
                // Out of memory: give the cache back and try once more.
                let held = self.stats.cached;
                self.trim();
                match self.backend.alloc(class)? {
                    Some(p) => p,
                    None => {
                        let (free, total) = self.backend.mem_info();
                        return Err(Error::new(
                            ErrorKind::Memory,
                            format!(
                                "CUDA out of memory on {device}: asked for {}, {} free of {}; ndx had {} in use and released {} it held cached",
                                human_bytes(bytes),
                                human_bytes(free),
                                human_bytes(total),
                                human_bytes(self.stats.in_use),
                                human_bytes(held)
                            ),
                        ));
                    }
                }
            }
        };
        self.stats.backend_allocs += 1;
        self.note_in_use(class);
        Ok(Block {
            ptr,
            bytes: class,
            after: Vec::new(),
        })
    }

    fn note_in_use(&mut self, class: usize) {
        self.stats.in_use += class;
        self.stats.peak = self.stats.peak.max(self.stats.in_use);
    }

    /// Takes a block back for reuse; `after` holds the events its last uses on other
    /// streams recorded (empty when there were none).
    pub fn free(&mut self, ptr: u64, bytes: usize, after: Vec<E>) {
        let class = size_class(bytes);
        self.stats.in_use = self.stats.in_use.saturating_sub(class);
        self.stats.cached += class;
        self.free.entry(class).or_default().push((ptr, after));
    }

    /// Gives every cached block back to the backend.
    pub fn trim(&mut self) {
        for (class, blocks) in std::mem::take(&mut self.free) {
            for (ptr, _) in blocks {
                self.backend.free(ptr, class);
            }
        }
        self.stats.cached = 0;
    }

    /// The pool's counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }
}

impl<B: Backend, E> Drop for Pool<B, E> {
    fn drop(&mut self) {
        self.trim();
    }
}

/// The driver's memory on one device (`cuMemAlloc` / `cuMemFree`).
pub struct DriverBackend {
    device: &'static DeviceState,
}

impl Backend for DriverBackend {
    fn alloc(&mut self, bytes: usize) -> Result<Option<u64>> {
        self.device.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a current context and a valid out-pointer.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Ok(None);
        }
        check(&format!("cuMemAlloc of {bytes} bytes"), r)?;
        Ok(Some(ptr))
    }

    fn free(&mut self, ptr: u64, _bytes: usize) {
        if self.device.bind().is_ok() {
            // SAFETY: a block this backend allocated, freed once (the pool holds the
            // only reference); the driver waits for work still using it.
            let _ = unsafe { sys::cuMemFree_v2(ptr) };
        }
    }

    fn mem_info(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        if self.device.bind().is_ok() {
            // SAFETY: a current context and valid out-pointers.
            let _ = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        }
        (free, total)
    }
}

/// A device's pool of driver memory, whose blocks may wait on events.
pub type DevicePool = Mutex<Pool<DriverBackend, Arc<Event>>>;

/// The pool of `device` (created on first use, kept for the process).
pub fn pool(device: &'static DeviceState) -> &'static DevicePool {
    static POOLS: OnceLock<Vec<OnceLock<DevicePool>>> = OnceLock::new();
    super::per_device(&POOLS, device, || {
        Mutex::new(Pool::new(DriverBackend { device }))
    })
}

/// A block of at least `bytes` on `device` for work on ndx's stream: a reused block
/// last used on other streams makes ndx's stream wait for those uses first (with
/// `cuStreamWaitEvent`, no host synchronisation).
pub fn take(device: &'static DeviceState, bytes: usize) -> Result<u64> {
    let name = format!("kDLCUDA:{}", device.id());
    let first = pool(device).lock().alloc(bytes, &name);
    let block = match first {
        // Invocations in flight hold their inputs until they complete: once they
        // have, what they released may be enough.
        Err(e) if e.kind() == ErrorKind::Memory && super::completion::drain(device) => {
            pool(device).lock().alloc(bytes, &name)?
        }
        r => r?,
    };
    for event in &block.after {
        if let Err(e) = event.wait_on(device.stream()) {
            // Back to the pool with all its events: the next taker waits for them.
            pool(device)
                .lock()
                .free(block.ptr, block.bytes, block.after);
            return Err(e);
        }
    }
    // The waits are enqueued; the events may go (the driver keeps what it needs).
    Ok(block.ptr)
}

/// Gives a block of [`take`] back once ndx's work on it has been enqueued: later work
/// on ndx's stream may reuse it (the stream runs them in order). `after` holds events
/// recorded on other streams that may still use it (a DLPack consumer's, recorded when
/// it called the deleter of an export): the block's next user waits for them.
pub fn give_back(device: &'static DeviceState, ptr: u64, bytes: usize, after: Vec<Arc<Event>>) {
    pool(device).lock().free(ptr, bytes, after);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `capacity` bytes that hands out increasing addresses.
    struct Fake {
        capacity: usize,
        used: usize,
        next: u64,
        live: std::collections::HashMap<u64, usize>,
    }

    impl Fake {
        fn new(capacity: usize) -> Fake {
            Fake {
                capacity,
                used: 0,
                next: 0x1000,
                live: Default::default(),
            }
        }
    }

    impl Backend for Fake {
        fn alloc(&mut self, bytes: usize) -> Result<Option<u64>> {
            if self.used + bytes > self.capacity {
                return Ok(None);
            }
            let p = self.next;
            self.next += bytes as u64;
            self.used += bytes;
            self.live.insert(p, bytes);
            Ok(Some(p))
        }
        fn free(&mut self, ptr: u64, bytes: usize) {
            assert_eq!(self.live.remove(&ptr), Some(bytes), "freed once, whole");
            self.used -= bytes;
        }
        fn mem_info(&self) -> (usize, usize) {
            (self.capacity - self.used, self.capacity)
        }
    }

    #[test]
    fn size_classes_round_up() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class((1 << 20) - 1), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class(5 << 20), 5 << 20);
    }

    #[test]
    fn a_repeated_pipeline_allocates_nothing_in_steady_state() {
        let mut pool: Pool<Fake, u32> = Pool::new(Fake::new(64 << 20));
        let sizes = [1000usize, 4 << 20, 3_000_000, 1000];
        for round in 0..5 {
            let blocks: Vec<_> = sizes
                .iter()
                .map(|&s| pool.alloc(s, "device 0").unwrap())
                .collect();
            for b in &blocks {
                assert!(b.after.is_empty());
            }
            for b in blocks {
                pool.free(b.ptr, b.bytes, Vec::new());
            }
            assert_eq!(pool.stats().backend_allocs, 4, "round {round}");
        }
        let s = pool.stats();
        assert_eq!(s.reuses, 16);
        assert_eq!(s.in_use, 0);
        assert_eq!(s.cached, 1024 + (4 << 20) + (3 << 20) + 1024);
        assert_eq!(s.peak, s.cached);
        pool.trim();
        assert_eq!(pool.stats().cached, 0);
        assert!(pool.backend.live.is_empty());
    }

    #[test]
    fn a_block_freed_with_events_hands_them_all_to_its_next_user() {
        let mut pool: Pool<Fake, &str> = Pool::new(Fake::new(1 << 20));
        let b = pool.alloc(100, "device 0").unwrap();
        pool.free(
            b.ptr,
            b.bytes,
            vec!["consumer A's event", "consumer B's event"],
        );
        let again = pool.alloc(200, "device 0").unwrap();
        assert_eq!(again.ptr, b.ptr);
        assert_eq!(again.after, ["consumer A's event", "consumer B's event"]);
        pool.free(again.ptr, again.bytes, Vec::new());
        assert!(pool.alloc(300, "device 0").unwrap().after.is_empty());
    }

    #[test]
    fn exhaustion_releases_the_cache_then_names_size_and_free_memory() {
        let mut pool: Pool<Fake, u32> = Pool::new(Fake::new(8 << 20));
        let a = pool.alloc(3 << 20, "device 0").unwrap();
        let b = pool.alloc(3 << 20, "device 0").unwrap();
        pool.free(a.ptr, a.bytes, Vec::new());
        // 6 MiB taken (3 cached): a 4 MiB request fits only once the cache is released.
        let c = pool.alloc(4 << 20, "device 0").unwrap();
        assert_eq!(pool.stats().cached, 0);
        assert_eq!(pool.stats().in_use, 7 << 20);
        let e = pool.alloc(2 << 20, "kDLCUDA:0").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Memory);
        assert_eq!(
            e.message(),
            "CUDA out of memory on kDLCUDA:0: asked for 2.00 MiB (2097152 bytes), 1.00 MiB (1048576 bytes) free of 8.00 MiB (8388608 bytes); ndx had 7.00 MiB (7340032 bytes) in use and released 0 bytes it held cached"
        );
        pool.free(b.ptr, b.bytes, Vec::new());
        pool.free(c.ptr, c.bytes, Vec::new());
        drop(pool); // gives every block back (the fake asserts each is freed once)
    }
}
