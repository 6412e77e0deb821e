//! A DLPack producer for tests: heap tensors whose deleter counts its calls.
#![allow(dead_code)]

use std::ffi::{CStr, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlpark::DlpackFlags;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion, DLTensor,
};
use ndx::ffi::*;

/// Counts deleter calls of one produced tensor.
pub type Count = Arc<AtomicUsize>;

pub fn calls(c: &Count) -> usize {
    c.load(Ordering::SeqCst)
}

struct Backing {
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    data: Vec<u8>,
    count: Count,
}

#[repr(C)]
struct ProducedV {
    managed: DLManagedTensorVersioned,
    backing: Backing,
}

#[repr(C)]
struct ProducedL {
    managed: DLManagedTensor,
    backing: Backing,
}

pub fn f32_dtype() -> DLDataType {
    DLDataType {
        code: DLDataTypeCode::FLOAT,
        bits: 32,
        lanes: 1,
    }
}

pub fn i32_dtype() -> DLDataType {
    DLDataType {
        code: DLDataTypeCode::INT,
        bits: 32,
        lanes: 1,
    }
}

pub fn cpu() -> DLDevice {
    DLDevice {
        device_type: DLDeviceType::CPU,
        device_id: 0,
    }
}

/// What a producer tensor looks like; tests mutate it to make it invalid.
#[derive(Clone)]
pub struct Spec {
    pub data: Vec<u8>,
    pub dtype: DLDataType,
    pub device: DLDevice,
    pub shape: Vec<i64>,
    pub strides: Option<Vec<i64>>,
    pub byte_offset: u64,
    pub ndim: Option<i32>,
    pub null_data: bool,
    pub null_shape: bool,
    pub flags: DlpackFlags,
    pub major: u32,
}

impl Spec {
    pub fn f32s(values: &[f32], shape: &[i64]) -> Spec {
        Spec {
            data: values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
            dtype: f32_dtype(),
            device: cpu(),
            shape: shape.to_vec(),
            strides: None,
            byte_offset: 0,
            ndim: None,
            null_data: false,
            null_shape: false,
            flags: DlpackFlags::empty(),
            major: 1,
        }
    }

    fn backing(&self) -> (Backing, Count) {
        let count = Count::default();
        let b = Backing {
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            data: self.data.clone(),
            count: count.clone(),
        };
        (b, count)
    }

    fn dl_tensor(&self, b: &mut Backing) -> DLTensor {
        DLTensor {
            data: if self.null_data {
                std::ptr::null_mut()
            } else {
                b.data.as_mut_ptr().cast()
            },
            device: self.device,
            ndim: self.ndim.unwrap_or(self.shape.len() as i32),
            dtype: self.dtype,
            shape: if self.null_shape {
                std::ptr::null_mut()
            } else {
                b.shape.as_mut_ptr()
            },
            strides: b
                .strides
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: self.byte_offset,
        }
    }

    pub fn versioned(&self) -> (*mut DLManagedTensorVersioned, Count) {
        let (backing, count) = self.backing();
        let mut p = Box::new(ProducedV {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: self.major,
                    minor: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_v),
                flags: self.flags,
                dl_tensor: DLTensor {
                    data: std::ptr::null_mut(),
                    device: cpu(),
                    ndim: 0,
                    dtype: f32_dtype(),
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
            },
            backing,
        });
        p.managed.dl_tensor = self.dl_tensor(&mut p.backing);
        let raw = Box::into_raw(p);
        // SAFETY: fresh box; the managed struct is its first field.
        unsafe {
            (*raw).managed.manager_ctx = raw.cast();
            (&raw mut (*raw).managed, count)
        }
    }

    pub fn legacy(&self) -> (*mut DLManagedTensor, Count) {
        let (backing, count) = self.backing();
        let mut p = Box::new(ProducedL {
            managed: DLManagedTensor {
                dl_tensor: DLTensor {
                    data: std::ptr::null_mut(),
                    device: cpu(),
                    ndim: 0,
                    dtype: f32_dtype(),
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_l),
            },
            backing,
        });
        p.managed.dl_tensor = self.dl_tensor(&mut p.backing);
        let raw = Box::into_raw(p);
        // SAFETY: fresh box; the managed struct is its first field.
        unsafe {
            (*raw).managed.manager_ctx = raw.cast();
            (&raw mut (*raw).managed, count)
        }
    }
}

unsafe extern "C" fn delete_v(m: *mut DLManagedTensorVersioned) {
    // SAFETY: made by `Spec::versioned`; called once.
    let b = unsafe { Box::from_raw((*m).manager_ctx.cast::<ProducedV>()) };
    b.backing.count.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn delete_l(m: *mut DLManagedTensor) {
    // SAFETY: made by `Spec::legacy`; called once.
    let b = unsafe { Box::from_raw((*m).manager_ctx.cast::<ProducedL>()) };
    b.backing.count.fetch_add(1, Ordering::SeqCst);
}

/// Calls a versioned tensor's deleter the way its owner would.
pub fn drop_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: a live tensor made by `Spec::versioned` that the test still owns.
    unsafe { ((*m).deleter.expect("deleter"))(m) }
}

/// Calls a legacy tensor's deleter the way its owner would.
pub fn drop_legacy(m: *mut DLManagedTensor) {
    // SAFETY: a live tensor made by `Spec::legacy` that the test still owns.
    unsafe { ((*m).deleter.expect("deleter"))(m) }
}

/// A C string ndx returned (non-NULL, borrowed from a live handle or error), copied.
pub fn cstr(p: *const std::ffi::c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: non-NULL C strings returned by ndx, borrowed from a live owner.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Frame `i` of `e` (which must have it).
pub fn frame(e: *const ndx_error_t, i: usize) -> ndx_frame_t {
    let mut f = ndx_frame_t {
        struct_size: std::mem::size_of::<ndx_frame_t>(),
        function: std::ptr::null(),
        file: std::ptr::null(),
        line: 0,
        column: 0,
        ip: 0,
        origin: ndx_frame_origin_t::NDX_FRAME_NATIVE,
    };
    ok(ndx_error_frame(e, i, &mut f));
    f
}

/// Takes an error returned by the C API: `(kind, message)`, freeing it.
pub fn take_error(e: *mut ndx_error_t) -> Option<(i32, String)> {
    if e.is_null() {
        return None;
    }
    let kind = ndx_error_kind(e);
    // SAFETY: a live error's message is a valid C string.
    let msg = unsafe { CStr::from_ptr(ndx_error_message(e)) }
        .to_string_lossy()
        .into_owned();
    ndx_error_free(e);
    Some((kind, msg))
}

/// Panics unless `e` is NULL (printing the error).
pub fn ok(e: *mut ndx_error_t) {
    if let Some((kind, msg)) = take_error(e) {
        panic!("unexpected error kind {kind}: {msg}");
    }
}

/// Asserts `e` has `kind` and a message containing `fragment`; frees it.
pub fn expect_err(e: *mut ndx_error_t, kind: ndx_error_kind_t, fragment: &str) {
    let (k, msg) = take_error(e).expect("an error");
    assert_eq!(k, kind as i32, "kind of {msg:?}");
    assert!(
        msg.contains(fragment),
        "{msg:?} does not contain {fragment:?}"
    );
}

/// The compact f32 values of a tensor.
pub fn values_f32(t: *const ndx_tensor_t) -> Vec<f32> {
    let mut n = 0usize;
    ok(ndx_tensor_numel(t, &mut n));
    let mut out = vec![0f32; n];
    ok(ndx_tensor_copy_to(
        t,
        out.as_mut_ptr().cast::<c_void>(),
        n * 4,
    ));
    out
}

pub fn shape_of(t: *const ndx_tensor_t) -> Vec<i64> {
    let (mut nd, mut p) = (0i32, std::ptr::null());
    ok(ndx_tensor_ndim(t, &mut nd));
    ok(ndx_tensor_shape(t, &mut p));
    // SAFETY: `nd` entries borrowed from the live tensor.
    unsafe { std::slice::from_raw_parts(p, nd as usize) }.to_vec()
}

pub fn strides_of(t: *const ndx_tensor_t) -> Vec<i64> {
    let (mut nd, mut p) = (0i32, std::ptr::null());
    ok(ndx_tensor_ndim(t, &mut nd));
    ok(ndx_tensor_strides(t, &mut p));
    // SAFETY: `nd` entries borrowed from the live tensor.
    unsafe { std::slice::from_raw_parts(p, nd as usize) }.to_vec()
}

/// `ndx_invoke` of `op` on `inputs` with `args` (may be NULL) and `opts`: the future,
/// or the call-time error.
pub fn invoke_with(
    ctx: &Ctx,
    op: &std::ffi::CStr,
    inputs: &[ndx_input_t],
    args: *const ndx_args_t,
    opts: &ndx_invoke_options_t,
) -> Result<*mut ndx_future_t, *mut ndx_error_t> {
    let mut f = std::ptr::null_mut();
    let e = ndx_invoke(
        ctx.0,
        op.as_ptr(),
        inputs.as_ptr(),
        inputs.len(),
        args,
        opts,
        &mut f,
    );
    if e.is_null() { Ok(f) } else { Err(e) }
}

/// Owns a context handle: `eval_mode` (0: the default) and 2 worker threads.
pub struct Ctx(pub *mut ndx_context_t);

impl Ctx {
    pub fn new(mode: i32) -> Ctx {
        let opts = ndx_context_options_t {
            eval_mode: mode,
            num_threads: 2,
            ..Default::default()
        };
        let mut ctx = std::ptr::null_mut();
        ok(ndx_context_new(&opts, &mut ctx));
        assert!(!ctx.is_null());
        Ctx(ctx)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        ndx_context_release(self.0);
    }
}

/// A batch of f32 samples imported through DLPack, with the producer's deleter counts.
pub fn f32_batch(samples: &[(&[f32], &[i64])]) -> (*mut ndx_batch_t, Vec<Count>) {
    let (managed, counts): (Vec<_>, Vec<_>) = samples
        .iter()
        .map(|(v, s)| Spec::f32s(v, s).versioned())
        .unzip();
    (import_batch(&managed, std::ptr::null()), counts)
}

/// The batch `ndx_batch_from_dlpack_versioned` imports from `managed` with `opts`
/// (may be NULL); panics on an error.
pub fn import_batch(
    managed: &[*mut DLManagedTensorVersioned],
    opts: *const ndx_import_options_t,
) -> *mut ndx_batch_t {
    let mut b = std::ptr::null_mut();
    ok(ndx_batch_from_dlpack_versioned(
        managed.as_ptr(),
        managed.len(),
        opts,
        &mut b,
    ));
    b
}

/// Invoke options in `mode` (0: the context's) writing into `outputs` (none: new
/// tensors).
pub fn invoke_options(mode: i32, outputs: &[ndx_output_t]) -> ndx_invoke_options_t {
    ndx_invoke_options_t {
        mode,
        outputs: if outputs.is_empty() {
            std::ptr::null()
        } else {
            outputs.as_ptr()
        },
        n_outputs: outputs.len(),
        ..Default::default()
    }
}

/// A view of caller memory at `data` through `ndx_tensor_wrap_host` (no copy, no
/// deleter; the test keeps the memory alive and in bounds), maybe strided or
/// read-only; panics on an error.
pub fn wrap_host(
    data: *mut c_void,
    dtype: i32,
    shape: &[i64],
    strides: Option<&[i64]>,
    read_only: bool,
) -> *mut ndx_tensor_t {
    let opts = import_options(None, read_only);
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_wrap_host(
        data,
        dtype,
        shape.len() as i32,
        shape.as_ptr(),
        strides.map_or(std::ptr::null(), <[i64]>::as_ptr),
        None,
        std::ptr::null_mut(),
        &opts,
        &mut t,
    ));
    t
}

/// Host import options: `layout` (None: none), `read_only`, no stream.
pub fn import_options(layout: Option<&CStr>, read_only: bool) -> ndx_import_options_t {
    ndx_import_options_t {
        struct_size: std::mem::size_of::<ndx_import_options_t>(),
        layout: layout.map_or(std::ptr::null(), CStr::as_ptr),
        read_only,
        stream: std::ptr::null_mut(),
    }
}

/// A tensor handle, released on drop.
pub struct T(pub *mut ndx_tensor_t);

impl Drop for T {
    fn drop(&mut self) {
        ndx_tensor_release(self.0);
    }
}

/// A host operator schema of `n_inputs` and `n_outputs`, no arguments, no declared
/// output metadata, no flags.
pub fn schema(n_inputs: usize, n_outputs: usize) -> ndx_op_schema_t {
    ndx_op_schema_t {
        struct_size: std::mem::size_of::<ndx_op_schema_t>(),
        n_inputs,
        n_outputs,
        n_args: 0,
        arg_names: std::ptr::null(),
        arg_types: std::ptr::null(),
        output_dtypes: std::ptr::null(),
        output_ndims: std::ptr::null(),
        output_layouts: std::ptr::null(),
        flags: 0,
    }
}

/// The check info of flag `r` (asserted to have some).
pub fn check_info(r: *const ndx_error_t) -> ndx_check_info_t {
    let mut info = ndx_check_info_t {
        struct_size: std::mem::size_of::<ndx_check_info_t>(),
        category: 0,
        first_index: 0,
        count: 0,
        occurrences: 0,
        sample: 0,
        consequence_of: 0,
    };
    assert!(ndx_error_check_info(r, &mut info), "no check info");
    info
}

/// A compact copy of `data` as a new tensor (`ndx_tensor_from_host`; to release).
pub fn host_tensor<E: Copy>(data: &[E], dtype: ndx_dtype_t, shape: &[i64]) -> *mut ndx_tensor_t {
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_host(
        data.as_ptr().cast(),
        dtype as i32,
        shape.len() as i32,
        shape.as_ptr(),
        std::ptr::null(),
        std::ptr::null(),
        &mut t,
    ));
    t
}

impl T {
    /// A compact copy of `data`.
    pub fn copy<E: Copy>(data: &[E], dtype: i32, shape: &[i64]) -> T {
        let mut t = std::ptr::null_mut();
        ok(ndx_tensor_from_host(
            data.as_ptr().cast(),
            dtype,
            shape.len() as i32,
            shape.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            &mut t,
        ));
        T(t)
    }

    /// This tensor as an invocation input.
    pub fn input(&self) -> ndx_input_t {
        ndx_input_t {
            tensor: self.0,
            batch: std::ptr::null(),
        }
    }
}

/// Owns an argument builder (`ndx_args_t`), filled by chained setters.
pub struct Args(pub *mut ndx_args_t);

impl Drop for Args {
    fn drop(&mut self) {
        ndx_args_free(self.0);
    }
}

impl Args {
    pub fn new() -> Args {
        let mut a = std::ptr::null_mut();
        ok(ndx_args_new(&mut a));
        Args(a)
    }

    pub fn int(self, name: &CStr, v: i64) -> Args {
        ok(ndx_args_set_int(self.0, name.as_ptr(), v));
        self
    }

    pub fn string(self, name: &CStr, v: &CStr) -> Args {
        ok(ndx_args_set_string(self.0, name.as_ptr(), v.as_ptr()));
        self
    }

    pub fn ints(self, name: &CStr, v: &[i64]) -> Args {
        ok(ndx_args_set_int_array(
            self.0,
            name.as_ptr(),
            v.as_ptr(),
            v.len(),
        ));
        self
    }

    pub fn floats(self, name: &CStr, v: &[f64]) -> Args {
        ok(ndx_args_set_float_array(
            self.0,
            name.as_ptr(),
            v.as_ptr(),
            v.len(),
        ));
        self
    }
}
