//! Launching the PTX kernels on ndx's stream of a device, and host↔device copies on
//! that stream. The argument structs mirror `src/cuda/kernels/ABI.md` field for field
//! (their sizes and offsets are asserted at compile time).

use std::ffi::c_void;

use cudarc::driver::sys;

use super::device::{DeviceState, Event, check};
use super::module::Function;
use crate::error::Result;

/// `struct ndx_bcast2` (binary.cu): a broadcasting binary operation's geometry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bcast2 {
    /// Output rank, 0 to 8.
    pub ndim: u32,
    /// Set to 0.
    pub reserved: u32,
    /// Output shape.
    pub shape: [i64; 8],
    /// `a`'s strides in elements (0 to broadcast, negative allowed).
    pub a_strides: [i64; 8],
    /// `b`'s strides in elements.
    pub b_strides: [i64; 8],
}

/// `struct ndx_resize_geom` (resize.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResizeGeom {
    pub planes: u64,
    pub in_h: u64,
    pub in_w: u64,
    pub c: u64,
    pub out_h: u64,
    pub out_w: u64,
}

/// `struct ndx_flag`: a device-side check record (`first_index` starts at `u64::MAX`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag {
    /// Elements that raised.
    pub count: u64,
    /// The lowest index that raised, or `u64::MAX`.
    pub first_index: u64,
}

impl Flag {
    /// A record nothing has raised.
    pub const CLEAR: Flag = Flag {
        count: 0,
        first_index: u64::MAX,
    };
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Bcast2>() == 200 && align_of::<Bcast2>() == 8);
    assert!(offset_of!(Bcast2, reserved) == 4 && offset_of!(Bcast2, shape) == 8);
    assert!(offset_of!(Bcast2, a_strides) == 72 && offset_of!(Bcast2, b_strides) == 136);
    assert!(size_of::<ResizeGeom>() == 48 && offset_of!(ResizeGeom, out_w) == 40);
    assert!(size_of::<Flag>() == 16 && offset_of!(Flag, first_index) == 8);
};

/// One kernel argument, in the C type the ABI names.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device pointer (NULL is 0).
    Ptr(u64),
    /// `u64`.
    U64(u64),
    /// `double`.
    F64(f64),
    /// `ndx_bcast2`, by value.
    Bcast2(Bcast2),
    /// `ndx_resize_geom`, by value.
    Geom(ResizeGeom),
}

/// Threads per block (the ABI's recommendation).
pub const BLOCK: u32 = 256;

/// Blocks for `work` items: one thread each, at most 65535 blocks (the kernels loop).
pub fn grid_for(work: u64) -> u32 {
    work.div_ceil(u64::from(BLOCK)).clamp(1, 65535) as u32
}

/// Enqueues `f` on `device`'s stream over `work` items (nothing for 0).
pub fn launch(device: &DeviceState, f: Function, work: u64, args: &[Arg]) -> Result<()> {
    launch_grid(device, f, grid_for(work), work, args)
}

/// Like [`launch`] with an explicit grid size (the kernels' results do not depend on it).
pub fn launch_grid(
    device: &DeviceState,
    f: Function,
    grid: u32,
    work: u64,
    args: &[Arg],
) -> Result<()> {
    if work == 0 {
        return Ok(());
    }
    let mut values: Vec<Arg> = args.to_vec();
    let mut params: Vec<*mut c_void> = values
        .iter_mut()
        .map(|a| match a {
            Arg::Ptr(v) | Arg::U64(v) => (v as *mut u64).cast(),
            Arg::F64(v) => (v as *mut f64).cast(),
            Arg::Bcast2(v) => (v as *mut Bcast2).cast(),
            Arg::Geom(v) => (v as *mut ResizeGeom).cast(),
        })
        .collect();
    device.bind()?;
    // SAFETY: a function of a module loaded in this device's context; `params` holds
    // one pointer per kernel parameter, each to a live value of the parameter's C type
    // (the caller follows ABI.md), valid until the call returns (the driver copies
    // them at launch); no dynamic shared memory; ndx's stream of this device.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f.raw(),
            grid.max(1),
            1,
            1,
            BLOCK,
            1,
            1,
            0,
            device.stream() as sys::CUstream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// Copies `src` to device memory at `dst` on ndx's stream, staged through pinned
/// memory (`staging`): `src` may be reused at once, and the call does not wait for the
/// work queued before it.
pub fn copy_to_device(device: &'static DeviceState, dst: u64, src: &[u8]) -> Result<()> {
    super::staging::upload(device, dst, src)
}

/// Copies device memory at `src` into `dst` after the work enqueued before it on ndx's
/// stream, and waits for the copy (the host reads `dst` next) — not for the work other
/// threads enqueue meanwhile, which a wait for the whole stream would include.
pub fn copy_to_host(device: &'static DeviceState, dst: &mut [u8], src: u64) -> Result<()> {
    device.bind()?;
    // SAFETY: `src` holds at least `dst.len()` bytes; `dst` is a live, exclusive slice
    // that stays borrowed until the copy has completed (below).
    check("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            dst.as_mut_ptr().cast(),
            src,
            dst.len(),
            device.stream() as sys::CUstream,
        )
    })?;
    // Into pageable memory the call returns once the copy has completed ("API
    // synchronization behavior" in the driver API docs): an event recorded now would
    // also wait for what other threads enqueued during the call. Into page-locked
    // memory (registered by someone else) the copy may still be queued: wait for it.
    if is_page_locked(dst.as_ptr()) {
        Event::record(device, device.stream())?.synchronize()?;
    }
    Ok(())
}

/// Whether the driver knows `p` as page-locked host memory (`cuMemHostAlloc`,
/// `cuMemHostRegister`). Pageable memory is unknown to it (`CUDA_ERROR_INVALID_VALUE`);
/// any other answer counts as page-locked, which only costs a wait.
fn is_page_locked(p: *const u8) -> bool {
    let mut kind: std::ffi::c_uint = 0;
    // SAFETY: a query about an address (never dereferenced) into a live out-value of
    // the attribute's type (an unsigned int).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut std::ffi::c_uint).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            p as u64,
        )
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32,
        sys::CUresult::CUDA_ERROR_INVALID_VALUE => false,
        _ => true,
    }
}

/// Copies `bytes` of device memory from `src` to `dst` on ndx's stream.
pub fn copy_on_device(device: &DeviceState, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    device.bind()?;
    // SAFETY: both ranges hold `bytes` bytes of device memory of this context (the
    // caller's blocks and views).
    check("cuMemcpyDtoDAsync", unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, device.stream() as sys::CUstream)
    })
}

/// Copies device memory at `src` into `dst` now, ordered after nothing on ndx's stream:
/// for memory whose writers the caller has already waited for (flag records).
pub fn read_now(device: &DeviceState, dst: &mut [u8], src: u64) -> Result<()> {
    device.bind()?;
    // SAFETY: `src` holds at least `dst.len()` bytes; `dst` is a live exclusive slice;
    // the synchronous copy has finished writing it when the call returns.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// Waits for everything enqueued on ndx's stream of `device` (SYNC_FULL's wait).
pub fn synchronize(device: &DeviceState) -> Result<()> {
    device.bind()?;
    // SAFETY: ndx's live stream of this device.
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(device.stream() as sys::CUstream)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_the_work_within_the_limit() {
        assert_eq!(grid_for(1), 1);
        assert_eq!(grid_for(256), 1);
        assert_eq!(grid_for(257), 2);
        assert_eq!(grid_for(1 << 40), 65535);
        assert_eq!(Flag::CLEAR.first_index, u64::MAX);
    }
}
