//! The memory behind tensors: buffers ndx owns, and memory borrowed from a DLPack
//! producer or a C caller, released through the producer's deleter exactly once.
//!
//! This is the DLPack/host-memory boundary of the crate, so raw pointers live here;
//! everything above it sees byte slices.

use std::alloc::Layout;
use std::ffi::c_void;

use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned};

use super::dtype::Device;
use crate::error::{Error, ErrorKind, Result, human_bytes};
use crate::exec::fork::ForkLock;

/// Alignment of buffers ndx allocates (a cache line; enough for any SIMD load).
pub const ALIGNMENT: usize = 64;

/// A C deleter for host memory wrapped with `ndx_tensor_wrap_host`:
/// `deleter(data, user)`.
pub type HostDeleter = unsafe extern "C" fn(data: *mut c_void, user: *mut c_void);

enum Owner {
    /// An aligned buffer allocated by ndx (`None` when empty).
    Owned(Option<Layout>),
    /// A DLPack ≥ 1.0 producer's tensor; its deleter runs on drop.
    Versioned(*mut DLManagedTensorVersioned),
    /// A legacy DLPack producer's tensor; its deleter runs on drop.
    Legacy(*mut DLManagedTensor),
    /// Host memory lent by a C caller, with an optional deleter.
    Host {
        deleter: Option<HostDeleter>,
        user: *mut c_void,
    },
    /// A block of ndx's caching allocator on a CUDA device (`len` is the block size).
    Pool(&'static crate::cuda::DeviceState),
}

/// A block of memory and who releases it.
pub struct Storage {
    /// The DLPack `data` pointer (the base the byte offsets count from).
    ptr: *mut u8,
    /// The bytes views of this storage may touch: `[ptr + lo, ptr + lo + len)`.
    lo: isize,
    len: usize,
    device: Device,
    read_only: bool,
    is_copied: bool,
    owner: Owner,
    /// For CUDA memory: the event after which its contents are valid (a producer's
    /// stream at import, or ndx's last write); `None` when nothing is pending.
    ready: parking_lot::Mutex<Option<std::sync::Arc<crate::cuda::Event>>>,
    /// For CUDA memory: the event after ndx's last enqueued work that reads it; the
    /// producer's deleter waits for it (DLPack: the deleter may free the memory).
    last_use: parking_lot::Mutex<Option<std::sync::Arc<crate::cuda::Event>>>,
    /// For CUDA memory exported through DLPack: per consumer stream (a raw `CUstream`),
    /// the event its deleter recorded there, after the consumer's work that may still
    /// read the memory. A pool block goes back to the pool with them, so its next
    /// user's stream waits for them; imported memory waits for them on the host before
    /// the producer's deleter runs.
    consumers: parking_lot::Mutex<Vec<(usize, std::sync::Arc<crate::cuda::Event>)>>,
}

// SAFETY: a Storage is a pointer to memory plus the right to release it. ndx writes
// through a shared Storage only into an out tensor the caller lent to one running
// invocation (`write_span`), whose bytes nothing else may touch until it completes;
// owned buffers are otherwise filled through `&mut` before they are shared, and
// imported memory is never written, so shared reads from many threads are sound. The release (`Drop`) happens once, on whichever thread drops the
// last reference; the C API documents that producers' deleters may run on any thread.
unsafe impl Send for Storage {}
// SAFETY: see `Send`: all access through `&Storage` is read-only.
unsafe impl Sync for Storage {}

/// Buffers at least this large are kept for reuse when freed.
pub const CACHE_MIN_BYTES: usize = 64 << 10;

/// Freed buffers kept for reuse, by size: a pipeline that runs the same shapes again
/// takes its outputs from here instead of from the system (whose fresh pages cost a
/// page fault each on first touch). Bounded by `NDX_CACHE_BYTES` (default 256 MiB;
/// 0 turns the cache off); the least recently freed size class goes first.
pub(crate) struct Cache {
    by_len: std::collections::HashMap<usize, Vec<CachedPtr>>,
    /// Lengths in the order their buffers were freed, oldest first.
    order: std::collections::VecDeque<usize>,
    bytes: usize,
    limit: usize,
}

/// A cached buffer: nothing else refers to it.
struct CachedPtr(*mut u8);
// SAFETY: a cached buffer is unreferenced memory owned by the cache alone.
unsafe impl Send for CachedPtr {}

/// The host buffer cache's lock (taken around a fork too: `ffi::fork`).
pub(crate) fn cache_lock() -> &'static ForkLock<Cache> {
    static CACHE: std::sync::OnceLock<ForkLock<Cache>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| {
        let limit = std::env::var("NDX_CACHE_BYTES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(256 << 20);
        ForkLock::new(Cache {
            by_len: Default::default(),
            order: Default::default(),
            bytes: 0,
            limit,
        })
    })
}

impl Cache {
    /// A cached buffer of `len` bytes, if one is kept (its entry in `order` is the
    /// caller's to remove).
    fn pop(&mut self, len: usize) -> Option<CachedPtr> {
        let kept = self.by_len.get_mut(&len)?;
        let ptr = kept.pop()?;
        if kept.is_empty() {
            // A size class with no buffer goes: sizes that come and go (crops of every
            // size, say) must not grow the map for the life of the process.
            self.by_len.remove(&len);
        }
        self.bytes -= len;
        Some(ptr)
    }

    /// A cached buffer of `len` bytes for reuse, if one is kept: the most recently
    /// freed entry of that size leaves `order`.
    fn take(&mut self, len: usize) -> Option<CachedPtr> {
        let ptr = self.pop(len)?;
        if let Some(i) = self.order.iter().rposition(|&l| l == len) {
            self.order.remove(i);
        }
        Some(ptr)
    }

    /// Keeps a freed buffer of `len` bytes, evicting the least recently freed ones it
    /// needs room for, which it returns for freeing; or gives the buffer back
    /// (`Err`) when it is larger than the whole cache.
    fn put(
        &mut self,
        ptr: CachedPtr,
        len: usize,
    ) -> std::result::Result<Vec<(CachedPtr, usize)>, CachedPtr> {
        if len > self.limit {
            return Err(ptr);
        }
        let mut evicted = Vec::new();
        while self.bytes + len > self.limit {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(p) = self.pop(old) {
                evicted.push((p, old));
            }
        }
        self.by_len.entry(len).or_default().push(ptr);
        self.order.push_back(len);
        self.bytes += len;
        Ok(evicted)
    }
}

fn cache_take(len: usize) -> Option<*mut u8> {
    cache_lock().lock().take(len).map(|p| p.0)
}

/// Keeps a freed buffer, or gives it back (returns it) when it does not fit.
fn cache_put(ptr: *mut u8, len: usize) -> Option<*mut u8> {
    // The lock is released at the end of this statement, before anything is freed.
    let evicted = match cache_lock().lock().put(CachedPtr(ptr), len) {
        Ok(evicted) => evicted,
        Err(back) => return Some(back.0),
    };
    for (p, l) in evicted {
        free_cached(p, l);
    }
    None
}

/// Frees a buffer the cache held (and no longer holds) of `len` bytes.
fn free_cached(p: CachedPtr, len: usize) {
    // SAFETY: a cached buffer was allocated in `owned` with this length and alignment,
    // and the cache held the only pointer to it.
    unsafe { std::alloc::dealloc(p.0, Layout::from_size_align_unchecked(len, ALIGNMENT)) };
}

/// Frees every cached buffer; returns the bytes released.
fn cache_release_all() -> usize {
    let mut c = cache_lock().lock();
    let buffers = std::mem::take(&mut c.by_len);
    c.order.clear();
    let released = std::mem::replace(&mut c.bytes, 0);
    drop(c);
    for (len, ptrs) in buffers {
        for p in ptrs {
            free_cached(p, len);
        }
    }
    released
}

/// The `NDX_ERROR_MEMORY` of a host allocation the system refused: the size asked
/// for, what the system reports available (Linux: `MemAvailable` of
/// `/proc/meminfo`) and what ndx gave back from its cache before the last try.
fn host_out_of_memory(len: usize, released: usize) -> Error {
    let available = match available_host_memory() {
        Some(bytes) => format!("{} available", human_bytes(bytes)),
        None => "the memory available is unknown".to_string(),
    };
    Error::new(
        ErrorKind::Memory,
        format!(
            "cannot allocate {} of host memory: {available}; ndx released {} it held cached",
            human_bytes(len),
            human_bytes(released)
        ),
    )
}

/// A vector of `n` copies of `value`, or `NDX_ERROR_MEMORY` where the system refuses
/// the memory (`vec![value; n]` would abort the process): for kernel buffers whose size
/// follows the data, such as the compact copy of a broadcast input.
pub fn try_host_vec<T: Clone>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        let released = cache_release_all();
        if released == 0 || v.try_reserve_exact(n).is_err() {
            let bytes = n.saturating_mul(std::mem::size_of::<T>());
            return Err(host_out_of_memory(bytes, released));
        }
    }
    v.resize(n, value);
    Ok(v)
}

/// `MemAvailable` of `/proc/meminfo` in bytes, where there is one.
fn available_host_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

impl Storage {
    /// A new zeroed host buffer of `len` bytes, aligned to [`ALIGNMENT`].
    pub fn owned(len: usize) -> Result<Storage> {
        let (mut s, reused) = Storage::alloc(len)?;
        if reused && let Some(b) = s.owned_bytes_mut() {
            b.fill(0);
        }
        Ok(s)
    }

    /// A host buffer of `len` bytes, aligned to [`ALIGNMENT`], for a caller that
    /// writes every byte: a reused one holds the bytes of its previous life.
    pub fn owned_stale(len: usize) -> Result<Storage> {
        Storage::alloc(len).map(|(s, _)| s)
    }

    /// A buffer from the cache (`true`) or a new zeroed one (`false`).
    fn alloc(len: usize) -> Result<(Storage, bool)> {
        let (ptr, layout, reused) = if len >= CACHE_MIN_BYTES
            && let Some(ptr) = cache_take(len)
        {
            (ptr, Layout::from_size_align(len, ALIGNMENT).ok(), true)
        } else if len == 0 {
            (std::ptr::null_mut(), None, false)
        } else {
            let layout = Layout::from_size_align(len, ALIGNMENT).map_err(|_| {
                Error::new(
                    ErrorKind::Memory,
                    format!("cannot allocate {len} bytes: size too large"),
                )
            })?;
            // SAFETY: `layout` has a non-zero size.
            let mut ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                // Out of memory: give the cached buffers back and try once more.
                let released = cache_release_all();
                if released > 0 {
                    // SAFETY: as above.
                    ptr = unsafe { std::alloc::alloc_zeroed(layout) };
                }
                if ptr.is_null() {
                    return Err(host_out_of_memory(len, released));
                }
            }
            (ptr, Some(layout), false)
        };
        let storage = Storage::new(ptr, 0, len, Device::CPU, false, false, Owner::Owned(layout));
        Ok((storage, reused))
    }

    /// A storage with nothing pending on it.
    fn new(
        ptr: *mut u8,
        lo: isize,
        len: usize,
        device: Device,
        read_only: bool,
        is_copied: bool,
        owner: Owner,
    ) -> Storage {
        Storage {
            ptr,
            lo,
            len,
            device,
            read_only,
            is_copied,
            owner,
            ready: Default::default(),
            last_use: Default::default(),
            consumers: Default::default(),
        }
    }

    /// `len` bytes of device memory on CUDA device `device` from ndx's caching
    /// allocator, ordered on ndx's stream (its contents are stale).
    pub fn cuda(device: &'static crate::cuda::DeviceState, len: usize) -> Result<Storage> {
        let mut ptr = std::ptr::null_mut();
        if len > 0 {
            let block = crate::cuda::alloc::take(device, len)?;
            ptr = block as *mut u8;
        }
        let dev = Device {
            kind: super::dtype::DeviceKind::Cuda,
            id: device.id(),
        };
        Ok(Storage::new(
            ptr,
            0,
            len,
            dev,
            false,
            false,
            Owner::Pool(device),
        ))
    }

    /// Takes ownership of a versioned DLPack tensor whose metadata has been validated;
    /// `[lo, lo + len)` is the byte span its view covers, relative to `data`.
    ///
    /// # Safety
    /// `managed` must be a valid, validated producer tensor that nothing else will
    /// release, and the span must lie inside the producer's allocation.
    pub(crate) unsafe fn from_versioned(
        managed: *mut DLManagedTensorVersioned,
        lo: isize,
        len: usize,
        device: Device,
        read_only: bool,
        is_copied: bool,
    ) -> Storage {
        // SAFETY: the caller guarantees `managed` is valid.
        let ptr = unsafe { (*managed).dl_tensor.data.cast::<u8>() };
        Storage::new(
            ptr,
            lo,
            len,
            device,
            read_only,
            is_copied,
            Owner::Versioned(managed),
        )
    }

    /// Like [`Storage::from_versioned`], for a legacy tensor.
    ///
    /// # Safety
    /// As for [`Storage::from_versioned`].
    pub(crate) unsafe fn from_legacy(
        managed: *mut DLManagedTensor,
        lo: isize,
        len: usize,
        device: Device,
        read_only: bool,
    ) -> Storage {
        // SAFETY: the caller guarantees `managed` is valid.
        let ptr = unsafe { (*managed).dl_tensor.data.cast::<u8>() };
        Storage::new(
            ptr,
            lo,
            len,
            device,
            read_only,
            false,
            Owner::Legacy(managed),
        )
    }

    /// Borrows host memory from a C caller; `deleter(data, user)` runs once on drop.
    ///
    /// # Safety
    /// `[data + lo, data + lo + len)` must stay readable until the deleter runs.
    pub(crate) unsafe fn from_host(
        data: *mut c_void,
        lo: isize,
        len: usize,
        read_only: bool,
        deleter: Option<HostDeleter>,
        user: *mut c_void,
    ) -> Storage {
        Storage::new(
            data.cast(),
            lo,
            len,
            Device::CPU,
            read_only,
            false,
            Owner::Host { deleter, user },
        )
    }

    /// The DLPack `data` pointer.
    pub fn data_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.device
    }
    /// Whether ndx must never write into this memory.
    pub fn read_only(&self) -> bool {
        self.read_only
    }
    /// The event after which CUDA memory is valid, if any is pending.
    pub fn ready_event(&self) -> Option<std::sync::Arc<crate::cuda::Event>> {
        // Plain host memory never has one: not locked, as every export and every kernel
        // run asks (in a child forked while a parent thread held the lock, no one would
        // let go of it, and they all hung there).
        if self.device.kind == crate::tensor::DeviceKind::Cpu {
            return None;
        }
        self.ready.lock().clone()
    }

    /// Holds its event lock (for tests of a fork while another thread holds it).
    #[cfg(test)]
    pub(crate) fn hold_event_lock(&self) -> impl Sized + '_ {
        self.ready.lock()
    }

    /// Blocks until the host may read this memory: for host-accessible CUDA memory
    /// (kDLCUDAManaged) imported with a producer's stream, until the producer's work
    /// before the import's event has completed. Nothing to wait for elsewhere: device
    /// memory (kDLCUDA) is read only by work ordered on a stream, and host memory
    /// carries no event.
    pub fn wait_host_readable(&self) -> Result<()> {
        if !self.device.host_accessible() {
            return Ok(());
        }
        match self.ready_event() {
            Some(event) => event.synchronize(),
            None => Ok(()),
        }
    }

    /// Sets the event after which CUDA memory is valid.
    pub fn set_ready_event(&self, event: Option<std::sync::Arc<crate::cuda::Event>>) {
        *self.ready.lock() = event;
    }
    /// Records that ndx's work enqueued up to `event` reads this memory: the release
    /// of imported memory waits for it.
    pub fn set_last_use(&self, event: std::sync::Arc<crate::cuda::Event>) {
        if !matches!(self.owner, Owner::Pool(_) | Owner::Owned(_)) {
            *self.last_use.lock() = Some(event);
        }
    }
    /// Records that a DLPack consumer's work on `stream`, enqueued up to `event`, may
    /// still read this memory (the deleter of an export records it): the memory is
    /// reused (a pool block) or given back to its producer (an import) only after it.
    /// An earlier event of the same stream is replaced (the stream runs in order;
    /// except on the per-thread default stream, which is a different stream on each
    /// thread) and completed events are dropped, so a storage exported again and
    /// again keeps at most one event per busy stream.
    pub fn add_consumer_event(&self, stream: usize, event: std::sync::Arc<crate::cuda::Event>) {
        /// `CU_STREAM_PER_THREAD`.
        const PER_THREAD: usize = 2;
        let mut consumers = self.consumers.lock();
        consumers.retain(|(s, e)| {
            let superseded = *s == stream && stream != PER_THREAD;
            let done = matches!(e.is_complete(), Ok(true));
            !superseded && !done
        });
        consumers.push((stream, event));
    }
    /// Whether the producer marked the memory as a private copy (DLPack IS_COPIED).
    pub fn is_copied(&self) -> bool {
        self.is_copied
    }
    /// The start of the span views may touch, in bytes relative to the data pointer.
    pub fn span_start(&self) -> isize {
        self.lo
    }

    /// The length in bytes of the span views may touch.
    pub fn span_len(&self) -> usize {
        self.len
    }

    /// The span as bytes, when the host can read this memory.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        if !self.device.host_accessible() {
            return None;
        }
        if self.len == 0 {
            return Some(&[]);
        }
        // SAFETY: the span was validated (or allocated) when the storage was made and
        // the memory stays valid until `Drop`; it is only read through `&self`.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.offset(self.lo), self.len) })
    }

    /// Runs `write` on bytes `[start, start + len)` of the span (counted from the span
    /// start) as mutable memory: how a kernel fills an out tensor the caller lent for
    /// writing. `None` when the memory is read-only, not host-accessible, or the range
    /// leaves the span.
    ///
    /// Only the engine calls this, for the out tensors of a running invocation, after
    /// checking that none of that invocation's inputs shares a byte with them; the C API
    /// forbids reading or writing an out tensor until its invocation completes.
    pub(crate) fn write_span<R>(
        &self,
        start: usize,
        len: usize,
        write: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        if self.read_only || !self.device.host_accessible() {
            return None;
        }
        if len == 0 {
            return Some(write(&mut []));
        }
        if start.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: the range lies inside the span, which was validated (or allocated)
        // when the storage was made and stays valid until `Drop`; it is writable host
        // memory (checked above), and per this function's contract nothing else reads
        // or writes those bytes while `write` runs.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.offset(self.lo).add(start), len) };
        Some(write(bytes))
    }

    /// The span as mutable bytes: only for buffers ndx owns (and so never read-only).
    pub fn owned_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self.owner {
            Owner::Owned(None) => Some(&mut []),
            // SAFETY: ndx allocated these `len` bytes and `&mut self` is unique.
            Owner::Owned(Some(_)) => {
                Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
            }
            _ => None,
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(event) = self.last_use.get_mut().take() {
            // Imported CUDA memory: the producer may free it in its deleter, so ndx's
            // reads of it must be done first. An error here (a faulted context) leaves
            // nothing better to do than to release it anyway.
            let _ = event.synchronize();
        }
        let consumers = std::mem::take(self.consumers.get_mut());
        if !matches!(self.owner, Owner::Pool(_)) {
            // Imported CUDA memory exported on: the producer's deleter may free or
            // reuse it, so the work of the consumers that may still read it must be
            // done first (ndx cannot hand the producer an event). A pool block instead
            // keeps the events for its next user, below, without waiting.
            for (_, event) in &consumers {
                let _ = event.synchronize();
            }
        }
        match self.owner {
            Owner::Pool(device) => {
                if self.len > 0 {
                    // Consumers of an export may still read it: its next user waits.
                    let after = consumers.into_iter().map(|(_, e)| e).collect();
                    crate::cuda::alloc::give_back(device, self.ptr as u64, self.len, after);
                }
            }
            Owner::Owned(None) => {}
            Owner::Owned(Some(layout)) => {
                if layout.size() >= CACHE_MIN_BYTES {
                    if let Some(ptr) = cache_put(self.ptr, layout.size()) {
                        // SAFETY: allocated in `owned` with exactly this layout.
                        unsafe { std::alloc::dealloc(ptr, layout) }
                    }
                } else {
                    // SAFETY: allocated in `owned` with exactly this layout.
                    unsafe { std::alloc::dealloc(self.ptr, layout) }
                }
            }
            Owner::Versioned(managed) => {
                // SAFETY: we own `managed` and release it exactly once, here.
                if let Some(deleter) = unsafe { (*managed).deleter } {
                    // SAFETY: the producer's deleter, called once with its own tensor.
                    unsafe { deleter(managed) }
                }
            }
            Owner::Legacy(managed) => {
                // SAFETY: we own `managed` and release it exactly once, here.
                if let Some(deleter) = unsafe { (*managed).deleter } {
                    // SAFETY: the producer's deleter, called once with its own tensor.
                    unsafe { deleter(managed) }
                }
            }
            Owner::Host { deleter, user } => {
                if let Some(deleter) = deleter {
                    // SAFETY: the caller's deleter, called once with its own pointers.
                    unsafe { deleter(self.ptr.cast(), user) }
                }
            }
        }
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("device", &self.device)
            .field("len", &self.len)
            .field("read_only", &self.read_only)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_host_allocation_is_a_memory_error_saying_what_was_available() {
        // 4 EiB: more than any address space, so every system refuses it.
        let Err(e) = Storage::owned(1 << 62) else {
            panic!("a 4 EiB allocation succeeded");
        };
        assert_eq!(e.kind(), ErrorKind::Memory);
        assert!(
            e.message().starts_with(
                "cannot allocate 4194304.00 TiB (4611686018427387904 bytes) of host memory: "
            ),
            "{}",
            e.message()
        );
        if cfg!(target_os = "linux") {
            let available = available_host_memory().expect("MemAvailable on Linux");
            assert!(available > 0);
            assert!(
                e.message().contains(" available; ndx released "),
                "{}",
                e.message()
            );
        }
        let e = host_out_of_memory(3 << 40, 5 << 20);
        assert!(
            e.message()
                .ends_with("; ndx released 5.00 MiB (5242880 bytes) it held cached"),
            "{}",
            e.message()
        );
    }

    /// The cache's bookkeeping, on fake pointers it never dereferences: the least
    /// recently freed buffers are evicted first, bytes stay counted exactly, a buffer
    /// larger than the cache is given back, and a size class that empties leaves the
    /// map (sizes that come and go must not grow it for the life of the process).
    #[test]
    fn the_cache_evicts_the_least_recently_freed_and_forgets_empty_sizes() {
        let mut c = Cache {
            by_len: Default::default(),
            order: Default::default(),
            bytes: 0,
            limit: 100,
        };
        let fake = |n: usize| CachedPtr(n as *mut u8);
        let addrs = |v: Vec<(CachedPtr, usize)>| -> Vec<(usize, usize)> {
            v.into_iter().map(|(p, l)| (p.0 as usize, l)).collect()
        };
        // Freed in the order a (40), b (30), a' (40): 110 bytes do not fit in 100, so
        // the oldest (a) goes when a' comes.
        assert!(addrs(c.put(fake(0xa0), 40).ok().unwrap()).is_empty());
        assert!(addrs(c.put(fake(0xb0), 30).ok().unwrap()).is_empty());
        assert_eq!(addrs(c.put(fake(0xa1), 40).ok().unwrap()), [(0xa0, 40)]);
        assert_eq!(c.bytes, 70);
        // The next to go is b, then a': the order of freeing, not of size.
        assert_eq!(
            addrs(c.put(fake(0xc0), 70).ok().unwrap()),
            [(0xb0, 30), (0xa1, 40)]
        );
        assert_eq!((c.bytes, c.by_len.len(), c.order.len()), (70, 1, 1));
        // Reuse empties the size class: nothing of it is left behind.
        assert_eq!(c.take(70).map(|p| p.0 as usize), Some(0xc0));
        assert!(c.take(70).is_none());
        assert_eq!((c.bytes, c.by_len.len(), c.order.len()), (0, 0, 0));
        // Larger than the whole cache: given back at once.
        assert_eq!(
            c.put(fake(0xd0), 101).err().map(|p| p.0 as usize),
            Some(0xd0)
        );
        assert_eq!(c.bytes, 0);
        // A buffer taken for reuse leaves the most recent entry of its size, so the
        // older one of that size is still the first to go.
        for (p, l) in [(0xe0, 20), (0xf0, 30), (0xe1, 20)] {
            assert!(c.put(fake(p), l).ok().unwrap().is_empty());
        }
        assert!(c.take(20).is_some());
        assert_eq!(c.order.iter().copied().collect::<Vec<_>>(), [20, 30]);
        // Nothing here may be freed: the pointers are fake.
        std::mem::forget(c);
    }
}
