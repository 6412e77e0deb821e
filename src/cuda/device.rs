//! Per-device state (the device's primary context and ndx's stream on it) and events,
//! on the driver API. Only reached once [`super::require_device`] has found a driver.

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use super::describe;
use crate::error::{Error, ErrorKind, Result};

/// `Ok` for `CUDA_SUCCESS`, else an `NDX_ERROR_CUDA` error "`what` failed: NAME (text)".
pub(crate) fn check(what: &str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Cuda,
            format!("{what} failed: {}", describe(r)),
        ))
    }
}

/// One device as ndx uses it: its primary context (shared with the runtime API and
/// with frameworks such as PyTorch and CuPy, so their pointers are valid here) and a
/// non-blocking stream of ndx's own on which all of ndx's work for it is ordered.
pub struct DeviceState {
    id: i32,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
}

// SAFETY: driver handles may be used from any thread once the context is made current
// on it (`bind` does so before every use).
unsafe impl Send for DeviceState {}
// SAFETY: see `Send`; the handles are never changed after creation.
unsafe impl Sync for DeviceState {}

/// The state of device `id` (created on first use, then kept for the process).
pub fn device(id: i32) -> Result<&'static DeviceState> {
    super::require_device(i64::from(id))?;
    static DEVICES: OnceLock<Vec<OnceLock<std::result::Result<DeviceState, Error>>>> =
        OnceLock::new();
    let all = DEVICES.get_or_init(|| {
        (0..super::device_count())
            .map(|_| OnceLock::new())
            .collect()
    });
    match all[id as usize].get_or_init(|| DeviceState::open(id)) {
        Ok(d) => Ok(d),
        Err(e) => Err(e.clone()),
    }
}

impl DeviceState {
    fn open(id: i32) -> Result<DeviceState> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: the driver is initialised (require_device); `dev` is a valid out-pointer.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, id) })?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid device handle and out-pointer. The primary context is retained
        // for the life of the process (never released: ndx's work may run until exit).
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        // SAFETY: a context just retained.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a current context and a valid out-pointer; non-blocking, so ndx's
        // stream does not synchronise with the legacy default stream.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint,
            )
        })?;
        Ok(DeviceState { id, ctx, stream })
    }

    /// The device ordinal.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// ndx's stream on this device (a raw `CUstream`).
    pub fn stream(&self) -> usize {
        self.stream as usize
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: a retained context, valid for the life of the process.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// Blocks until all work on this device's context, on every stream, has completed
    /// (`cuCtxSynchronize`): only for fallbacks where no event can be had.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current; the call takes no pointers.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }
}

/// A CUDA event (no timing) recorded on some stream of a device: work ordered after it
/// (`wait_on`) starts only once everything enqueued on that stream before it is done.
pub struct Event {
    raw: sys::CUevent,
    device: &'static DeviceState,
}

// SAFETY: an event handle may be used from any thread with its context current
// (every method binds it first).
unsafe impl Send for Event {}
// SAFETY: see `Send`; record happens once, at creation.
unsafe impl Sync for Event {}

impl Event {
    /// Records a new event on `stream` (a raw `CUstream` of device `device`, which may
    /// be a producer's stream, the legacy default stream 0, or the per-thread one).
    pub fn record(device: &'static DeviceState, stream: usize) -> Result<Arc<Event>> {
        device.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: a current context and a valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut raw,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as std::ffi::c_uint,
            )
        })?;
        let event = Event { raw, device };
        // SAFETY: a live event; the stream handle is the caller's (an invalid one makes
        // the driver return an error, which is reported).
        check(&format!("cuEventRecord on stream {stream:#x}"), unsafe {
            sys::cuEventRecord(event.raw, stream as sys::CUstream)
        })?;
        Ok(Arc::new(event))
    }

    /// Makes `stream` wait for this event (no host synchronisation).
    pub fn wait_on(&self, stream: usize) -> Result<()> {
        self.device.bind()?;
        // SAFETY: a live event and the caller's stream handle (errors are reported).
        check(
            &format!("cuStreamWaitEvent on stream {stream:#x}"),
            unsafe { sys::cuStreamWaitEvent(stream as sys::CUstream, self.raw, 0) },
        )
    }

    /// Whether the work before the event has completed (never blocks).
    pub fn is_complete(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: a live event.
        let r = unsafe { sys::cuEventQuery(self.raw) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", r).map(|()| true)
    }

    /// Blocks until the work before the event has completed (a CUDA error that
    /// happened in that work, or before it on the context, is returned).
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: a live event.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }

    /// The device the event belongs to.
    pub fn device(&self) -> &'static DeviceState {
        self.device
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:p} on device {})", self.raw, self.device.id)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: a live event, destroyed once; the driver defers the release until
            // the recorded work completes.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}
