//! CUDA discovery entry points.

use super::{boundary, boundary_value, ndx_error_t};

/// The number of CUDA devices ndx can use: 0 where no CUDA driver can be loaded
/// (libcuda is looked for at run time, once; ndx never requires it), where `cuInit`
/// fails, or where the environment variable `NDX_CUDA_DISABLE=1` was set when CUDA
/// was first asked about. `ndx_cuda_device_check` says why a device is unusable.
///
/// Thread-safe; never fails.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_cuda_device_count() -> i32 {
    boundary_value(
        "ndx_cuda_device_count",
        |_| 0,
        || i32::try_from(crate::cuda::device_count()).unwrap_or(i32::MAX),
    )
}

/// NULL when CUDA device `device_id` can be used; otherwise an NDX_ERROR_CUDA error
/// that says why, e.g. "no CUDA driver found: libcuda.so could not be loaded" or
/// "device 3 does not exist, 1 device present". Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_cuda_device_check(device_id: i32) -> *mut ndx_error_t {
    boundary("ndx_cuda_device_check", || {
        crate::cuda::require_device(i64::from(device_id))
    })
}
