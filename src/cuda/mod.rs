//! CUDA, found at run time: ndx links no CUDA library. `libcuda` is looked for once,
//! on the first CUDA question; where it is absent (or `NDX_CUDA_DISABLE=1`) every CUDA
//! operation fails with an `NDX_ERROR_CUDA` error that says so, and cudarc is never
//! called (its loader panics when the library is missing).

pub mod alloc;
pub mod completion;
pub mod device;
pub mod launch;
pub mod module;
pub mod ops;
pub mod progress;
pub mod staging;

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

pub use device::{DeviceState, Event, device};

use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{Device, DeviceKind};

/// The raw stream value that means "do not order" (`NDX_STREAM_NO_SYNC`).
pub const STREAM_NO_SYNC: usize = usize::MAX;

/// Orders ndx's later work on imported memory of `dev` after the producer's `stream`
/// (a raw `CUstream`; 0 is the legacy default stream): records an event there, which
/// ndx's stream waits on before touching the memory — no device-wide sync. `None`
/// where there is nothing to order: host memory (kDLCPU, kDLCUDAHost), `STREAM_NO_SYNC`,
/// or no driver (then no CUDA work can be pending in this process).
pub fn order_after_producer(dev: Device, stream: usize) -> Result<Option<Arc<Event>>> {
    if !matches!(dev.kind, DeviceKind::Cuda | DeviceKind::CudaManaged)
        || stream == STREAM_NO_SYNC
        || driver_absent_reason().is_some()
    {
        return Ok(None);
    }
    let state = device::device(dev.id)?;
    Event::record(state, stream).map(Some)
}

/// Makes the consumer's `stream` (a raw `CUstream`) wait for what is pending on
/// memory whose last write is `ready` (DLPack's exchange protocol at export).
pub fn order_consumer(ready: Option<&Arc<Event>>, stream: usize) -> Result<()> {
    match ready {
        Some(ev) if stream != STREAM_NO_SYNC => ev.wait_on(stream),
        _ => Ok(()),
    }
}

/// What the deleter of a DLPack export of memory of `dev` leaves behind for a consumer
/// that named `stream` (a raw `CUstream`; 0 the legacy default stream): an event
/// recorded on that stream now, so after the consumer's work enqueued there so far,
/// which may still read the memory (PyTorch's `record_stream`). `None` where there is
/// nothing to wait for: host memory (kDLCPU, kDLCUDAHost), `STREAM_NO_SYNC` (the
/// consumer synchronises itself and calls the deleter once its work is done), or no
/// driver. Where the event cannot be recorded (the consumer destroyed its stream, or it
/// belongs to another context), the device's context is synchronised instead, once,
/// so the consumer's work is done on return (`None`); where even that fails the
/// context has faulted and runs nothing more, so there is nothing left to wait for.
pub fn after_consumer(dev: Device, stream: usize) -> Option<Arc<Event>> {
    if !matches!(dev.kind, DeviceKind::Cuda | DeviceKind::CudaManaged)
        || stream == STREAM_NO_SYNC
        || driver_absent_reason().is_some()
    {
        return None;
    }
    let state = device::device(dev.id).ok()?;
    match Event::record(state, stream) {
        Ok(event) => Some(event),
        Err(_) => {
            let _ = state.synchronize();
            None
        }
    }
}

/// What the one look for the driver found.
enum Driver {
    /// `libcuda` loaded and `cuInit` succeeded with this many devices.
    Ready { count: usize },
    /// No usable driver, and why.
    Absent(String),
}

/// The driver, looked for once per process. In a child forked after the parent set
/// the driver up, none: CUDA does not support a fork after `cuInit`, and the parent's
/// streams, memory and completion threads are not the child's.
fn driver() -> &'static Driver {
    static DRIVER: OnceLock<(u64, Driver)> = OnceLock::new();
    static FORKED: OnceLock<Driver> = OnceLock::new();
    let (generation, driver) = DRIVER.get_or_init(|| {
        crate::exec::fork::watch();
        (crate::exec::fork::generation(), find_driver())
    });
    match driver {
        Driver::Ready { .. } if *generation != crate::exec::fork::generation() => FORKED
            .get_or_init(|| {
                Driver::Absent(
                    "CUDA was initialised before this process forked, and the CUDA driver \
                     cannot be used in a forked child: start the child with spawn or \
                     forkserver, or use CUDA only after the fork"
                        .into(),
                )
            }),
        _ => driver,
    }
}

fn find_driver() -> Driver {
    if std::env::var("NDX_CUDA_DISABLE").is_ok_and(|v| v.trim() == "1") {
        return Driver::Absent("CUDA is disabled by NDX_CUDA_DISABLE=1".into());
    }
    // SAFETY: `is_culib_present` only tries to open the library by its usual names and
    // closes it again; it runs no code of the library and never panics.
    if !unsafe { sys::is_culib_present() } {
        return Driver::Absent("no CUDA driver found: libcuda.so could not be loaded".into());
    }
    // SAFETY: the library is present, so cudarc's loader (which panics only when it is
    // missing) succeeds; cuInit takes no pointers.
    if let Err(e) = unsafe { sys::cuInit(0) }.result() {
        return Driver::Absent(format!(
            "the CUDA driver was found but cuInit failed: {}",
            describe(e.0)
        ));
    }
    let mut count: std::ffi::c_int = 0;
    // SAFETY: cuInit succeeded; `count` is a valid out-pointer.
    match unsafe { sys::cuDeviceGetCount(&mut count) }.result() {
        Ok(()) => Driver::Ready {
            count: usize::try_from(count).unwrap_or(0),
        },
        Err(e) => Driver::Absent(format!(
            "the CUDA driver was found but cuDeviceGetCount failed: {}",
            describe(e.0)
        )),
    }
}

/// `CUDA_ERROR_NAME (description)` of a driver result code.
pub(crate) fn describe(code: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only called once the library is loaded (a result code exists only then);
    // both out-pointers are valid, and the driver returns static strings or leaves
    // them NULL for an unknown code.
    unsafe {
        let _ = sys::cuGetErrorName(code, &mut name);
        let _ = sys::cuGetErrorString(code, &mut text);
    }
    let read = |p: *const std::ffi::c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: non-NULL pointers from the driver are static NUL-terminated strings.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    match (read(name), read(text)) {
        (Some(n), Some(t)) => format!("{n} ({t})"),
        (Some(n), None) => n,
        _ => format!("CUresult {}", code as u32),
    }
}

/// One `T` per device in `all` (a caller's static), made by `make` on first use and
/// kept for the process.
pub(crate) fn per_device<T>(
    all: &'static OnceLock<Vec<OnceLock<T>>>,
    device: &DeviceState,
    make: impl FnOnce() -> T,
) -> &'static T {
    let all = all.get_or_init(|| (0..device_count()).map(|_| OnceLock::new()).collect());
    all[device.id() as usize].get_or_init(make)
}

/// The number of CUDA devices: 0 where there is no usable driver.
pub fn device_count() -> usize {
    match driver() {
        Driver::Ready { count } => *count,
        Driver::Absent(_) => 0,
    }
}

/// Why there is no usable driver, or `None` where there is one.
pub fn driver_absent_reason() -> Option<&'static str> {
    match driver() {
        Driver::Ready { .. } => None,
        Driver::Absent(why) => Some(why),
    }
}

/// Succeeds when device `id` can be used; otherwise an `NDX_ERROR_CUDA` error that
/// says why: no driver, or no such device (with how many there are).
pub fn require_device(id: i64) -> Result<()> {
    match driver() {
        Driver::Absent(why) => Err(Error::new(ErrorKind::Cuda, why.clone())),
        Driver::Ready { count } => {
            if id < 0 || id as u64 >= *count as u64 {
                Err(Error::new(
                    ErrorKind::Cuda,
                    format!(
                        "device {id} does not exist, {count} device{} present",
                        if *count == 1 { "" } else { "s" }
                    ),
                ))
            } else {
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_every_device_is_refused_with_the_reason() {
        // Runs on any machine: the answers must agree with each other.
        match driver_absent_reason() {
            Some(why) => {
                assert_eq!(device_count(), 0);
                let e = require_device(0).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Cuda);
                assert_eq!(e.message(), why);
                assert!(
                    why.contains("libcuda.so could not be loaded")
                        || why.contains("NDX_CUDA_DISABLE")
                        || why.contains("cuInit failed"),
                    "{why}"
                );
            }
            None => {
                let n = device_count();
                assert!(n > 0);
                assert!(require_device(0).is_ok());
                let e = require_device(n as i64).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Cuda);
                assert!(e.message().contains(&format!("device {n} does not exist")));
            }
        }
        let e = require_device(-1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cuda);
    }
}
