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

/// Test hook faults of `ndx_test_cuda_fault`: how a run on CUDA tensors misbehaves.
/// Compiled only with the cargo feature `test-hooks` (CMake option `NDX_TEST_HOOKS`).
#[cfg(feature = "test-hooks")]
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ndx_test_cuda_fault_t {
    /// Disarms.
    NDX_TEST_CUDA_FAULT_NONE = 0,
    /// After its kernels, it writes into the first byte of input 0 on ndx's stream.
    NDX_TEST_CUDA_FAULT_WRITES_INPUT = 1,
    /// Output 0 is a view of input 0's memory (which must be compact and hold at least
    /// as many bytes) with the inferred metadata.
    NDX_TEST_CUDA_FAULT_ALIASES_INPUT = 2,
    /// Output 0 has another dtype of the same item size than inferred.
    NDX_TEST_CUDA_FAULT_WRONG_DTYPE = 3,
    /// Output 0 has another shape than inferred (flattened, or 1-d given a leading 1).
    NDX_TEST_CUDA_FAULT_WRONG_SHAPE = 4,
    /// Output 0 has another layout than inferred.
    NDX_TEST_CUDA_FAULT_WRONG_LAYOUT = 5,
}

/// Test hook: the next run on CUDA tensors of operator `op` (in any context; not
/// `to_host`) misbehaves once like a faulty kernel, as `fault` (an
/// `ndx_test_cuda_fault_t`) says, so that tests can provoke on the device what the
/// `debug` backend checks; `NDX_TEST_CUDA_FAULT_NONE` disarms. Arming replaces what was
/// armed. An unknown `fault` is NDX_ERROR_VALUE. Thread-safe (one process-wide slot).
/// Compiled only with the cargo feature `test-hooks` (CMake option `NDX_TEST_HOOKS`).
#[cfg(feature = "test-hooks")]
#[unsafe(no_mangle)]
pub extern "C" fn ndx_test_cuda_fault(op: *const std::ffi::c_char, fault: i32) -> *mut ndx_error_t {
    use crate::cuda::ops::test_fault::{Fault, arm};
    boundary("ndx_test_cuda_fault", || {
        let op = super::host_str(op, "op")?;
        let fault = match fault {
            0 => None,
            1 => Some(Fault::WritesInput),
            2 => Some(Fault::AliasesInput),
            3 => Some(Fault::WrongDtype),
            4 => Some(Fault::WrongShape),
            5 => Some(Fault::WrongLayout),
            _ => {
                return Err(crate::error::Error::value(format!(
                    "fault {fault} is not an ndx_test_cuda_fault_t (0 to 5)"
                )));
            }
        };
        arm(&op, fault);
        Ok(())
    })
}
