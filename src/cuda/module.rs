//! The kernels' PTX (compiled ahead of time by `scripts/build_ptx.py`, committed under
//! `src/cuda/ptx/`, embedded here) and its loading into a device's context: each module
//! once per device, on first use; the driver JIT-compiles PTX for the GPU at hand.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::OnceLock;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::device::{DeviceState, check};
use crate::error::{Error, ErrorKind, Result};

/// The embedded modules, by name (`X.cu` → `X`), NUL-terminated for the driver.
pub const MODULES: [(&str, &str); 6] = [
    ("binary", concat!(include_str!("ptx/binary.ptx"), "\0")),
    ("cast", concat!(include_str!("ptx/cast.ptx"), "\0")),
    ("check", concat!(include_str!("ptx/check.ptx"), "\0")),
    (
        "normalize",
        concat!(include_str!("ptx/normalize.ptx"), "\0"),
    ),
    ("reduce", concat!(include_str!("ptx/reduce.ptx"), "\0")),
    ("resize", concat!(include_str!("ptx/resize.ptx"), "\0")),
];

/// A kernel of a loaded module.
#[derive(Clone, Copy, Debug)]
pub struct Function(sys::CUfunction);

// SAFETY: a function handle is an immutable driver object, usable from any thread with
// its context current.
unsafe impl Send for Function {}
// SAFETY: see `Send`.
unsafe impl Sync for Function {}

impl Function {
    /// The raw handle, for `cuLaunchKernel`.
    pub fn raw(self) -> sys::CUfunction {
        self.0
    }
}

/// The loaded modules and resolved functions of one device.
struct Loaded {
    modules: HashMap<&'static str, usize>,
    functions: HashMap<String, Function>,
}

fn loaded(device: &DeviceState) -> &'static Mutex<Loaded> {
    static ALL: OnceLock<Vec<Mutex<Loaded>>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        (0..super::device_count())
            .map(|_| {
                Mutex::new(Loaded {
                    modules: HashMap::new(),
                    functions: HashMap::new(),
                })
            })
            .collect()
    });
    &all[device.id() as usize]
}

/// Kernel `name` of module `module` on `device` (loading the module on first use).
pub fn function(device: &DeviceState, module: &'static str, name: &str) -> Result<Function> {
    let mut l = loaded(device).lock();
    if let Some(f) = l.functions.get(name) {
        return Ok(*f);
    }
    let raw_module = match l.modules.get(module) {
        Some(m) => *m as sys::CUmodule,
        None => {
            let (_, text) = MODULES
                .iter()
                .find(|(n, _)| *n == module)
                .ok_or_else(|| Error::internal(format!("no CUDA module named '{module}'")))?;
            device.bind()?;
            let mut m: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: a current context; `text` is NUL-terminated PTX that lives for the
            // process; `m` is a valid out-pointer.
            check(&format!("cuModuleLoadData ({module}.ptx)"), unsafe {
                sys::cuModuleLoadData(&mut m, text.as_ptr().cast())
            })?;
            l.modules.insert(module, m as usize);
            m
        }
    };
    let c_name = CString::new(name)
        .map_err(|_| Error::internal(format!("kernel name {name:?} holds a NUL")))?;
    device.bind()?;
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: a module loaded in this device's context; valid name and out-pointer.
    let r = unsafe { sys::cuModuleGetFunction(&mut f, raw_module, c_name.as_ptr()) };
    if r == sys::CUresult::CUDA_ERROR_NOT_FOUND {
        return Err(Error::new(
            ErrorKind::Internal,
            format!("kernel '{name}' is not in {module}.ptx"),
        ));
    }
    check(&format!("cuModuleGetFunction ({name})"), r)?;
    let f = Function(f);
    l.functions.insert(name.to_string(), f);
    Ok(f)
}

/// The `.entry` names of an embedded module's PTX.
pub fn entries(module: &str) -> Vec<&'static str> {
    MODULES
        .iter()
        .filter(|(n, _)| *n == module)
        .flat_map(|(_, text)| {
            text.lines().filter_map(|l| {
                let rest = l.trim_start().strip_prefix(".visible .entry ")?;
                Some(rest.split('(').next().unwrap_or(rest).trim())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_is_embedded_with_its_entries() {
        for (name, text) in MODULES {
            assert!(text.ends_with('\0'), "{name}");
            assert!(text.contains(".target sm_70"), "{name}");
            assert!(!entries(name).is_empty(), "{name} has no kernels");
        }
        assert!(entries("binary").contains(&"ndx_add_f32"));
        assert!(entries("binary").contains(&"ndx_div_i32_bcast"));
        assert!(entries("cast").contains(&"ndx_cast_u8_f32"));
        assert!(entries("reduce").contains(&"ndx_sum_f16_partial"));
        assert!(entries("check").contains(&"ndx_flags_reset"));
    }
}
