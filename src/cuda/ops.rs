//! The operators on CUDA tensors: which ones have kernels ([`supported`]), and their
//! launchers ([`run`]), which enqueue the kernels of `src/cuda/kernels` on ndx's stream
//! of the device following `ABI.md`, then (unless told not to) wait for that work and
//! read its check flags.
//!
//! All tensors of one invocation live on one device. Inputs are ordered after the
//! event of their last writer (a producer's stream at import, or ndx's own work), and
//! the outputs carry the event recorded after this invocation's work.

use std::ffi::CString;
use std::sync::Arc;

use super::device::{DeviceState, Event};
use super::launch::{self, Arg, Bcast2, Flag, ResizeGeom};
use super::module;
use crate::checks;
use crate::error::Site;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::args::Args;
use crate::ops::TMeta;
use crate::tensor::{DType, Device, DeviceKind, Geometry, Storage, Tensor};

/// What the launchers need to know of the invocation they run.
pub struct Invocation<'a> {
    /// Operator name.
    pub op: &'a str,
    /// Its sequence number in its context.
    pub seq: u64,
    /// Its enqueue site (a fault found later is reported with it).
    pub site: &'a Arc<Site>,
    /// Whether to wait for the device work before returning (all modes but
    /// SYNC_CPU). Work whose flags must be read waits regardless.
    pub wait: bool,
    /// Whether to wait for everything on ndx's stream (SYNC_FULL), not only this work.
    pub whole_stream: bool,
    /// Whether the caller takes the wait as a [`Pending`] to finish elsewhere (EAGER
    /// and DEFERRED: ndx's completion thread does), instead of waiting here.
    pub defer: bool,
    /// Whether to add 1 to every output (the `inject_accuracy_error:OP` backend), as
    /// the host kernels' `add_one` does.
    pub perturb: bool,
}

/// The outputs of a launch, and the wait still to do when the caller deferred it.
pub struct Launched {
    /// The outputs (their memory is written once the work completes).
    pub outs: Vec<Arc<Tensor>>,
    /// The wait and the flags still to read (`None`: nothing left).
    pub pending: Option<Pending>,
}

/// Launched work not yet waited for: its event, and the flag records to read after.
pub struct Pending {
    job: Job,
    event: Arc<Event>,
    n_outs: usize,
}

impl Pending {
    /// The device the work runs on.
    pub fn device(&self) -> &'static DeviceState {
        self.job.device
    }

    /// Waits for the work (a blocking wait on its event, so only ndx's completion
    /// thread calls it), then raises its flags in the check scope of the calling
    /// thread. A sticky fault is attributed to the invocation whose work faulted.
    pub fn finish(self) -> Result<()> {
        let device = self.job.device;
        self.event
            .synchronize()
            .map_err(|e| attributed(device, e))?;
        super::progress::progress(device).retire();
        settle(&self.job, self.n_outs)
    }
}

/// The dtypes the kernels are compiled for, by their suffix in kernel names.
fn suffix(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::U8 => "u8",
        DType::I32 => "i32",
        _ => return None,
    })
}

/// `suffix`, with bool read as its bytes (`u8`).
fn suffix_or_bool(dtype: DType) -> Option<&'static str> {
    if dtype == DType::Bool {
        Some("u8")
    } else {
        suffix(dtype)
    }
}

fn not_implemented(dtype: DType, device: Device, why: &str) -> Error {
    Error::new(
        ErrorKind::NotImplemented,
        format!("no CUDA kernel for {} on {device}{why}", dtype.name()),
    )
}

/// Whether operator `op` can run on CUDA `device` with inputs `inputs` (metadata):
/// `NDX_ERROR_NOT_IMPLEMENTED` naming the op, the dtype and the device otherwise.
pub fn supported(op: &str, inputs: &[&TMeta], args: &Args, device: Device) -> Result<()> {
    let dtype = inputs.first().map_or(DType::F32, |m| m.dtype);
    let refuse = |d: DType, why: &str| Err(not_implemented(d, device, why));
    match op {
        "to_host" | "to_device" | "check_shape" => Ok(()),
        "add" | "sub" | "mul" | "div" => {
            let (a, b) = (inputs[0].dtype, inputs[1].dtype);
            let common = crate::ops::elementwise::promote(a, b);
            if suffix(common).is_none() {
                let why = if (a, b) == (common, common) {
                    String::new()
                } else {
                    format!(" ({} and {} promote to it)", a.name(), b.name())
                };
                return refuse(common, &why);
            }
            let ndim = inputs[0].shape.len().max(inputs[1].shape.len());
            if ndim > 8 {
                return refuse(common, &format!(" with {ndim} dimensions (at most 8)"));
            }
            Ok(())
        }
        "cast" => {
            let to = args.dtype("dtype")?.unwrap_or(dtype);
            if suffix_or_bool(dtype).is_none() {
                return refuse(dtype, "");
            }
            if suffix_or_bool(to).is_none() {
                return refuse(to, " (as the target dtype)");
            }
            Ok(())
        }
        "sum" | "mean" | "max" => {
            if suffix_or_bool(dtype).is_none() {
                return refuse(dtype, "");
            }
            let (axes, _) = crate::ops::reduce::axes_arg(&inputs[0].shape, args)?;
            let ndim = inputs[0].shape.len();
            if axes.windows(2).any(|w| w[1] != w[0] + 1) && ndim > 8 {
                // Non-adjacent axes are gathered by a strided copy of at most 8 dims.
                return refuse(
                    dtype,
                    &format!(
                        " over the non-adjacent axes {axes:?} of {ndim} dimensions (at most 8)"
                    ),
                );
            }
            Ok(())
        }
        "normalize" | "resize" | "check_range" => {
            if suffix(dtype).is_some() || (op == "check_range" && dtype == DType::Bool) {
                Ok(())
            } else {
                refuse(dtype, "")
            }
        }
        "check" => Ok(()),
        "check_finite" => {
            if suffix_or_bool(dtype).is_some() {
                Ok(())
            } else {
                refuse(dtype, "")
            }
        }
        _ => refuse(dtype, ""),
    }
}

/// The one CUDA device of an invocation's inputs, given where each lives (`None`: not
/// known yet): `(index of the first input on it, device)`, or `None` when no input is
/// in CUDA memory. An error when they are spread over several devices, or mix host
/// and device memory (only `to_device` takes host memory).
pub fn common_device(op: &str, devices: &[Option<Device>]) -> Result<Option<(usize, Device)>> {
    let Some(first) = devices
        .iter()
        .position(|d| d.is_some_and(|d| d.kind == DeviceKind::Cuda))
    else {
        return Ok(None);
    };
    let device = devices[first].unwrap_or(Device::CPU);
    for (i, d) in devices.iter().enumerate() {
        match d {
            Some(d) if d.kind == DeviceKind::Cuda && *d != device => {
                return Err(Error::value(format!(
                    "input {i} is on {d} but input {first} is on {device}; all inputs of an invocation must be on one device"
                )));
            }
            Some(d) if d.kind != DeviceKind::Cuda && op != "to_device" => {
                let memory = match d.kind {
                    DeviceKind::CudaManaged => "managed memory",
                    DeviceKind::CudaHost => "pinned host memory",
                    _ => "host memory",
                };
                return Err(Error::value(format!(
                    "input {i} is in {memory} ({d}) but input {first} is on {device}; move it with 'to_device' first"
                )));
            }
            _ => {}
        }
    }
    Ok(Some((first, device)))
}

/// [`common_device`] of tensors whose data exists.
pub fn device_of(op: &str, inputs: &[&Tensor]) -> Result<Option<Device>> {
    let devices: Vec<Option<Device>> = inputs.iter().map(|t| Some(t.device())).collect();
    Ok(common_device(op, &devices)?.map(|(_, d)| d))
}

/// The device address of a tensor's element 0.
fn addr(t: &Tensor) -> u64 {
    (t.storage().data_ptr() as u64).wrapping_add(t.byte_offset())
}

/// A new compact tensor on `device` (contents written by the work enqueued next).
fn empty(
    device: &'static DeviceState,
    dtype: DType,
    shape: &[i64],
    layout: &str,
) -> Result<Tensor> {
    let geometry = crate::tensor::validate_geometry("output", 1, shape, None, dtype.itemsize(), 0)?;
    let nbytes = geometry.numel * dtype.itemsize();
    let storage = Storage::cuda(device, nbytes)?;
    Ok(Tensor::from_parts(
        Arc::new(storage),
        dtype,
        shape.to_vec(),
        Geometry {
            lo: 0,
            len: nbytes,
            ..geometry
        },
        0,
        CString::new(layout).unwrap_or_default(),
        false,
    ))
}

/// Scratch device memory for one invocation, returned to the pool on drop (after the
/// work using it was enqueued: the stream keeps the order).
struct Scratch {
    device: &'static DeviceState,
    ptr: u64,
    bytes: usize,
}

impl Scratch {
    fn new(device: &'static DeviceState, bytes: usize) -> Result<Scratch> {
        let ptr = if bytes == 0 {
            0
        } else {
            super::alloc::take(device, bytes)?
        };
        Ok(Scratch { device, ptr, bytes })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.bytes > 0 {
            super::alloc::give_back(self.device, self.ptr, self.bytes, Vec::new());
        }
    }
}

/// The flag records of one invocation: one device array, cleared at the start, read
/// once after its work completed.
struct Flags {
    scratch: Option<Scratch>,
    n: usize,
}

impl Flags {
    /// `n` cleared records (nothing for 0).
    fn new(device: &'static DeviceState, n: usize) -> Result<Flags> {
        if n == 0 {
            return Ok(Flags { scratch: None, n });
        }
        let s = Scratch::new(device, n * std::mem::size_of::<Flag>())?;
        let f = module::function(device, "check", "ndx_flags_reset")?;
        launch::launch(device, f, n as u64, &[Arg::Ptr(s.ptr), Arg::U64(n as u64)])?;
        Ok(Flags {
            scratch: Some(s),
            n,
        })
    }

    /// The device address of record `i`.
    fn at(&self, i: usize) -> u64 {
        self.scratch
            .as_ref()
            .map_or(0, |s| s.ptr + (i * std::mem::size_of::<Flag>()) as u64)
    }

    /// The records, once the work writing them has completed.
    fn read(&self, device: &DeviceState) -> Result<Vec<Flag>> {
        let mut bytes = vec![0u8; self.n * std::mem::size_of::<Flag>()];
        if let Some(s) = &self.scratch {
            launch::read_now(device, &mut bytes, s.ptr)?;
        }
        Ok(bytes
            .chunks_exact(16)
            .map(|c| Flag {
                count: u64::from_le_bytes(c[..8].try_into().unwrap_or_default()),
                first_index: u64::from_le_bytes(c[8..].try_into().unwrap_or_default()),
            })
            .collect())
    }
}

/// What to do with a flag record once read.
enum Watch {
    /// A user check: raise its message in the USER category.
    User(String),
    /// Integer division by zero: an error, or the DIV flag when DIV is checked.
    Div { checked: bool },
    /// Float division by zero watched for the DIV category.
    DivFloat,
    /// NaN made from finite inputs, watched in the kernel's loop.
    Nan,
    /// The NAN pass over output `k` (paired with the inputs' record that follows).
    NanOut(usize),
    /// The NAN pass over the float inputs: the output's flag counts only when this
    /// stayed clear.
    NanIn,
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The launches of one invocation: the device, what the flags watch.
struct Job {
    device: &'static DeviceState,
    watches: Vec<Watch>,
    flags: Flags,
}

impl Job {
    fn launch(&self, module: &'static str, name: &str, work: u64, args: &[Arg]) -> Result<()> {
        let f = module::function(self.device, module, name)?;
        launch::launch(self.device, f, work, args)
    }

    /// The device address of the record of the first watch `which` selects (0, the
    /// kernels' "not watched", when none does).
    fn flag(&self, which: impl Fn(&Watch) -> bool) -> u64 {
        self.watches
            .iter()
            .position(which)
            .map_or(0, |i| self.flags.at(i))
    }
}

/// Runs operator `inv.op` on CUDA inputs (checked with [`device_of`]) and returns its
/// outputs, whose metadata `metas` the operator inferred.
pub fn run(
    inv: &Invocation,
    inputs: &[Arc<Tensor>],
    args: &Args,
    metas: &[TMeta],
) -> Result<Launched> {
    let prefixed =
        |e: Error| Error::new(e.kind(), format!("operator '{}': {}", inv.op, e.message()));
    let refs: Vec<&Tensor> = inputs.iter().map(|t| t.as_ref()).collect();
    let dev = match device_of(inv.op, &refs).map_err(prefixed)? {
        _ if inv.op == "to_device" => {
            let target = Device {
                kind: DeviceKind::Cuda,
                id: crate::ops::device::target_device(args).map_err(prefixed)?,
            };
            let d = refs[0].device();
            if d.kind == DeviceKind::Cuda && d != target {
                return Err(prefixed(Error::new(
                    ErrorKind::NotImplemented,
                    format!(
                        "copies between CUDA devices ({d} to {target}) are not supported; go through 'to_host'"
                    ),
                )));
            }
            target
        }
        Some(d) => d,
        None => {
            return Err(Error::internal(format!(
                "operator '{}' reached the CUDA launchers without CUDA inputs",
                inv.op
            )));
        }
    };
    let device = super::device(dev.id).map_err(|e| {
        Error::new(
            ErrorKind::Cuda,
            format!("operator '{}': {}", inv.op, e.message()),
        )
    })?;
    if inv.op != "to_device" {
        let in_metas: Vec<TMeta> = refs.iter().map(|t| TMeta::of(t)).collect();
        let in_refs: Vec<&TMeta> = in_metas.iter().collect();
        supported(inv.op, &in_refs, args, dev).map_err(prefixed)?;
    }
    enqueue(inv, device, inputs, &refs, args, metas).map_err(|e| attributed(device, e))
}

/// The bytes the view `t` (in CUDA device memory) touches, copied to the host once
/// the work enqueued on ndx's stream before this call, and the producer's write its
/// *ready* event marks, have run: what the `debug` backend hashes before and after an
/// invocation to check that it left its inputs unchanged. Blocks until the copy has
/// completed (a debugging backend may wait).
pub fn view_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let device = super::device(t.device().id)?;
    let read = || -> Result<Vec<u8>> {
        device.bind()?;
        if let Some(ev) = t.storage().ready_event() {
            ev.wait_on(device.stream())?;
        }
        let (start, len) = t.byte_range();
        let mut bytes = crate::tensor::try_host_vec(len, 0u8)?;
        if len > 0 {
            let span =
                (t.storage().data_ptr() as u64).wrapping_add(t.storage().span_start() as u64);
            launch::copy_to_host(device, &mut bytes, span.wrapping_add(start as u64))?;
        }
        Ok(bytes)
    };
    read().map_err(|e| attributed(device, e))
}

/// `e`, when it is a sticky fault of `device`, with the invocation whose work faulted
/// as its cause.
fn attributed(device: &'static DeviceState, e: Error) -> Error {
    if super::progress::is_sticky(&e) {
        super::progress::progress(device).attribute(device, e)
    } else {
        e
    }
}

/// [`run`] once the device is known: the launches, the wait and the flags.
fn enqueue(
    inv: &Invocation,
    device: &'static DeviceState,
    inputs: &[Arc<Tensor>],
    refs: &[&Tensor],
    args: &Args,
    metas: &[TMeta],
) -> Result<Launched> {
    device.bind()?;
    let progress = super::progress::progress(device);
    // Declared before the turn, so that on an error it records its event after the
    // turn's tag too.
    let mut guard = InputsInUse {
        device,
        inputs,
        armed: false,
    };
    // `to_host` takes no turn: it enqueues no tag, and its copy into pageable memory
    // blocks until the stream reaches it, which must not stop other invocations from
    // enqueueing meanwhile.
    let mut turn = (inv.op != "to_host").then(|| progress.turn(device, inv.op, inv.seq, inv.site));
    for t in inputs {
        if t.device().kind == DeviceKind::Cuda
            && let Some(ev) = t.storage().ready_event()
        {
            ev.wait_on(device.stream())?;
        }
    }
    // From here on kernels may read the inputs: should enqueueing fail part way, the
    // release of imported inputs still waits for what was enqueued. (`to_host` has
    // nothing left to wait for: its copy has completed when it returns.)
    guard.armed = inv.op != "to_host";
    // Flags every invocation may watch.
    let watches = plan_watches(inv.op, refs, args, metas);
    let job = Job {
        device,
        flags: Flags::new(device, watches.len())?,
        watches,
    };
    checks::nan_handled();
    let outs = match inv.op {
        "to_device" => vec![to_device(device, refs[0], &metas[0])?],
        "to_host" => {
            // Reading into host memory waits for the stream: nothing is left pending.
            let out = to_host(device, refs[0])?;
            let out = if inv.perturb {
                crate::ops::kernels::add_one(&out)?
            } else {
                out
            };
            return Ok(Launched {
                outs: vec![Arc::new(out)],
                pending: None,
            });
        }
        "add" | "sub" | "mul" | "div" => vec![binary(&job, inv.op, refs[0], refs[1], &metas[0])?],
        "cast" => vec![cast(&job, refs[0], metas[0].dtype)?.with_layout(layout(&metas[0]))],
        "sum" | "mean" | "max" => vec![reduce(&job, inv.op, refs[0], args, &metas[0])?],
        "normalize" => vec![normalize(&job, refs[0], args, &metas[0])?],
        "resize" => vec![resize(&job, refs[0], args, &metas[0])?],
        "check" | "check_finite" | "check_range" | "check_shape" => {
            vec![check(&job, inv.op, refs[0], args)?]
        }
        _ => {
            return Err(not_implemented(metas[0].dtype, refs[0].device(), ""));
        }
    };
    nan_pass(&job, refs, &outs)?;
    let outs = if inv.perturb {
        outs.iter()
            .map(|t| perturb(device, t))
            .collect::<Result<Vec<_>>>()?
    } else {
        outs
    };
    #[cfg(feature = "test-hooks")]
    let outs = match test_fault::take(inv.op) {
        Some(fault) => test_fault::apply(fault, device, refs, outs)?,
        None => outs,
    };
    if let Some(t) = turn.as_mut() {
        t.mark();
    }
    let event = Event::record(device, device.stream())?;
    for t in &outs {
        t.storage().set_ready_event(Some(event.clone()));
    }
    mark_last_use(inputs, &event);
    guard.armed = false;
    drop(turn);
    let n_outs = outs.len();
    let outs = outs.into_iter().map(Arc::new).collect();
    if !inv.wait && job.flags.n == 0 {
        return Ok(Launched {
            outs,
            pending: None,
        });
    }
    if inv.defer && !inv.whole_stream {
        let pending = Pending { job, event, n_outs };
        return Ok(Launched {
            outs,
            pending: Some(pending),
        });
    }
    if inv.whole_stream {
        launch::synchronize(device)
    } else {
        event.synchronize()
    }?;
    progress.retire();
    settle(&job, n_outs)?;
    Ok(Launched {
        outs,
        pending: None,
    })
}

/// `t` plus 1 (the `inject_accuracy_error:OP` backend): the host's `add_one` on a copy,
/// uploaded again, so every dtype is perturbed exactly as on the host. A debugging
/// backend, so it may wait for the stream.
fn perturb(device: &'static DeviceState, t: &Tensor) -> Result<Tensor> {
    let host = crate::ops::kernels::add_one(&to_host(device, t)?)?;
    to_device(device, &host, &TMeta::of(t))
}

/// Records `event` (after ndx's work reading them) as the last use of the CUDA inputs:
/// the deleter of imported memory waits for it.
fn mark_last_use(inputs: &[Arc<Tensor>], event: &Arc<Event>) {
    for t in inputs {
        if t.device().kind == DeviceKind::Cuda {
            t.storage().set_last_use(event.clone());
        }
    }
}

/// While armed, an invocation's inputs may be read by work it enqueued: on drop (an
/// error part way through enqueueing) an event recorded after that work becomes their
/// last use, so a producer's deleter does not free memory a queued kernel still reads.
struct InputsInUse<'a> {
    device: &'static DeviceState,
    inputs: &'a [Arc<Tensor>],
    armed: bool,
}

impl Drop for InputsInUse<'_> {
    fn drop(&mut self) {
        if self.armed {
            // A driver that cannot record an event (a sticky fault) runs nothing more
            // anyway: the inputs are then released as before.
            if let Ok(event) = Event::record(self.device, self.device.stream()) {
                mark_last_use(self.inputs, &event);
            }
        }
    }
}

fn layout(m: &TMeta) -> CString {
    CString::new(m.layout.as_str()).unwrap_or_default()
}

/// The flag records operator `op` needs with the categories checked on this thread.
fn plan_watches(op: &str, inputs: &[&Tensor], args: &Args, metas: &[TMeta]) -> Vec<Watch> {
    let mut w = Vec::new();
    let is_float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    match op {
        "add" | "sub" | "mul" | "div" => {
            let common = metas[0].dtype;
            if op == "div" {
                if is_float(common) {
                    if checks::enabled(checks::DIV) {
                        w.push(Watch::DivFloat);
                    }
                } else {
                    w.push(Watch::Div {
                        checked: checks::enabled(checks::DIV),
                    });
                }
            }
            if is_float(common) && checks::enabled(checks::NAN) {
                w.push(Watch::Nan);
            }
        }
        "check" | "check_finite" | "check_range" if checks::enabled(checks::USER) => {
            let t = inputs[0];
            let n = t.numel();
            let message = match op {
                "check" => {
                    let what = args
                        .string("message")
                        .ok()
                        .flatten()
                        .unwrap_or_else(|| "check".into());
                    format!("{what}: {{n}} of {n} element{} false", plural(n as u64))
                }
                "check_finite" => format!("{{n}} of {n} element{} not finite", plural(n as u64)),
                _ => {
                    // As the host kernel writes them (an int bound exactly).
                    let bound = |name, default| {
                        args.number(name)
                            .ok()
                            .flatten()
                            .unwrap_or(crate::exec::Num::Float(default))
                    };
                    let (lo, hi) = (bound("lo", f64::NEG_INFINITY), bound("hi", f64::INFINITY));
                    format!(
                        "{{n}} of {n} element{} outside [{lo}, {hi}]",
                        plural(n as u64)
                    )
                }
            };
            if op != "check_finite" || is_float(t.dtype()) {
                w.push(Watch::User(message));
            }
        }
        "cast" | "sum" | "mean" | "max" | "normalize" | "resize"
            if checks::enabled(checks::NAN) && metas.iter().any(|m| is_float(m.dtype)) =>
        {
            w.push(Watch::NanOut(0));
            w.push(Watch::NanIn);
        }
        _ => {}
    }
    w
}

/// The NAN pass of kernels that do not watch NaN themselves: the output's non-finite
/// elements count only when every float input is finite.
fn nan_pass(job: &Job, inputs: &[&Tensor], outs: &[Tensor]) -> Result<()> {
    let out_flag = job.flag(|w| matches!(w, Watch::NanOut(_)));
    if out_flag == 0 {
        return Ok(());
    }
    let in_flag = job.flag(|w| matches!(w, Watch::NanIn));
    for out in outs {
        finite_into(job, out, out_flag)?;
    }
    for t in inputs {
        finite_into(job, t, in_flag)?;
    }
    Ok(())
}

/// Counts the non-finite elements of a float tensor into the record at `flag`.
fn finite_into(job: &Job, t: &Tensor, flag: u64) -> Result<()> {
    let Some(sfx) = suffix(t.dtype()).filter(|s| s.starts_with('f') || *s == "bf16") else {
        return Ok(());
    };
    let c = compacted(job, t)?;
    let n = c.numel() as u64;
    job.launch(
        "check",
        &format!("ndx_check_finite_{sfx}"),
        n,
        &[Arg::Ptr(addr(&c)), Arg::U64(n), Arg::Ptr(flag)],
    )
}

/// Reads the flag records after the work completed and raises or fails.
fn settle(job: &Job, n_outs: usize) -> Result<()> {
    if job.flags.n == 0 {
        return Ok(());
    }
    let records = job.flags.read(job.device)?;
    let raised = |i: usize| (records[i].count > 0).then_some(records[i]);
    for (i, w) in job.watches.iter().enumerate() {
        let Some(f) = raised(i) else { continue };
        // The record as a host tally of the flag's category.
        let raise = |category: u32, message: &dyn Fn(u64) -> String| {
            let tally = checks::Tally::new();
            tally.add(f.first_index, f.count);
            checks::raise_tally(category, &tally, message);
        };
        let nan = |k: usize| {
            move |n: u64| {
                format!(
                    "output {k} has {n} NaN or infinite element{} from finite inputs",
                    plural(n)
                )
            }
        };
        match w {
            Watch::User(message) => {
                raise(checks::USER, &|n| message.replace("{n}", &n.to_string()));
            }
            Watch::Div { checked: false } => {
                return Err(Error::value(format!(
                    "integer division by zero (output element {})",
                    f.first_index
                )));
            }
            Watch::Div { checked: true } | Watch::DivFloat => {
                raise(checks::DIV, &|n| {
                    format!("{n} division{} by zero", plural(n))
                });
            }
            Watch::Nan => raise(checks::NAN, &nan(0)),
            Watch::NanOut(k) => {
                let inputs_clear = job
                    .watches
                    .iter()
                    .position(|x| matches!(x, Watch::NanIn))
                    .is_some_and(|j| records[j].count == 0);
                if inputs_clear && *k < n_outs {
                    raise(checks::NAN, &nan(*k));
                }
            }
            Watch::NanIn => {}
        }
    }
    Ok(())
}

/// `t` itself when compact, else a compact copy made on the device (a broadcasting
/// multiplication by one, exact for every dtype).
fn compacted(job: &Job, t: &Tensor) -> Result<Tensor> {
    if t.is_compact() {
        return Ok(t.clone());
    }
    let dtype = t.dtype();
    let sfx = suffix_or_bool(dtype)
        .ok_or_else(|| not_implemented(dtype, t.device(), " (a strided view)"))?;
    if t.ndim() > 8 {
        return Err(not_implemented(
            dtype,
            t.device(),
            &format!(" (a strided view with {} dimensions)", t.ndim()),
        ));
    }
    let out = empty(job.device, dtype, t.shape(), t.layout())?;
    let one = one_of(job, sfx)?;
    let mut p = Bcast2 {
        ndim: t.ndim() as u32,
        ..Bcast2::default()
    };
    p.shape[..t.ndim()].copy_from_slice(t.shape());
    p.a_strides[..t.ndim()].copy_from_slice(t.strides());
    job.launch(
        "binary",
        &format!("ndx_mul_{sfx}_bcast"),
        out.numel() as u64,
        &[
            Arg::Ptr(addr(&out)),
            Arg::Ptr(addr(t)),
            Arg::Ptr(one.ptr),
            Arg::U64(out.numel() as u64),
            Arg::Bcast2(p),
            Arg::Ptr(0),
            Arg::Ptr(0),
        ],
    )?;
    Ok(out)
}

/// A device scalar 1 of the kernels' dtype `sfx`.
fn one_of(job: &Job, sfx: &str) -> Result<Scratch> {
    let bytes: Vec<u8> = match sfx {
        "f32" => 1f32.to_le_bytes().to_vec(),
        "f16" => half::f16::ONE.to_le_bytes().to_vec(),
        "bf16" => half::bf16::ONE.to_le_bytes().to_vec(),
        "u8" => vec![1],
        _ => 1i32.to_le_bytes().to_vec(),
    };
    let s = Scratch::new(job.device, bytes.len())?;
    launch::copy_to_device(job.device, s.ptr, &bytes)?;
    Ok(s)
}

fn to_device(device: &'static DeviceState, t: &Tensor, meta: &TMeta) -> Result<Tensor> {
    if t.device().kind == DeviceKind::Cuda {
        return Ok(t.clone());
    }
    let bytes = t.compact_bytes()?;
    let out = empty(device, t.dtype(), t.shape(), &meta.layout)?;
    if !bytes.is_empty() {
        launch::copy_to_device(device, addr(&out), &bytes)?;
    }
    Ok(out)
}

fn to_host(device: &'static DeviceState, t: &Tensor) -> Result<Tensor> {
    // The span the view touches is copied whole, then viewed with the same strides.
    let storage = t.storage();
    let span = storage.span_len();
    let mut host = Storage::owned_stale(span)?;
    if span > 0
        && let Some(bytes) = host.owned_bytes_mut()
    {
        let src = (storage.data_ptr() as u64).wrapping_add(storage.span_start() as u64);
        launch::copy_to_host(device, bytes, src)?;
    }
    let byte_offset = (t.byte_offset() as i64 - storage.span_start() as i64) as u64;
    let view = Tensor::from_parts(
        Arc::new(host),
        t.dtype(),
        t.shape().to_vec(),
        Geometry {
            strides: t.strides().to_vec(),
            numel: t.numel(),
            lo: 0,
            len: span,
        },
        byte_offset,
        t.c_layout().to_owned(),
        false,
    );
    if view.is_compact() {
        Ok(view)
    } else {
        view.to_compact()
    }
}

fn binary(job: &Job, op: &str, a: &Tensor, b: &Tensor, meta: &TMeta) -> Result<Tensor> {
    let common = meta.dtype;
    let sfx = suffix(common).ok_or_else(|| not_implemented(common, a.device(), ""))?;
    let a = if a.dtype() == common {
        a.clone()
    } else {
        cast(job, a, common)?
    };
    let b = if b.dtype() == common {
        b.clone()
    } else {
        cast(job, b, common)?
    };
    let out = empty(job.device, common, &meta.shape, &meta.layout)?;
    let n = out.numel() as u64;
    let nan = job.flag(|w| matches!(w, Watch::Nan));
    let div = job.flag(|w| matches!(w, Watch::Div { .. } | Watch::DivFloat));
    let same = a.shape() == meta.shape.as_slice()
        && b.shape() == meta.shape.as_slice()
        && a.is_compact()
        && b.is_compact();
    // The compact kernel, or the broadcasting one with the inputs' element strides.
    let geometry = (!same).then(|| {
        let nd = meta.shape.len();
        let mut p = Bcast2 {
            ndim: nd as u32,
            ..Bcast2::default()
        };
        p.shape[..nd].copy_from_slice(&meta.shape);
        for (t, strides) in [(&a, &mut p.a_strides), (&b, &mut p.b_strides)] {
            let off = nd - t.ndim();
            for k in 0..t.ndim() {
                strides[off + k] = if t.shape()[k] == 1 { 0 } else { t.strides()[k] };
            }
        }
        p
    });
    let mut params = vec![
        Arg::Ptr(addr(&out)),
        Arg::Ptr(addr(&a)),
        Arg::Ptr(addr(&b)),
        Arg::U64(n),
    ];
    params.extend(geometry.map(Arg::Bcast2));
    params.extend([Arg::Ptr(nan), Arg::Ptr(div)]);
    let suffix = if same { "" } else { "_bcast" };
    job.launch("binary", &format!("ndx_{op}_{sfx}{suffix}"), n, &params)?;
    Ok(out)
}

fn cast(job: &Job, t: &Tensor, to: DType) -> Result<Tensor> {
    let t = compacted(job, t)?;
    let from = t.dtype();
    let src = suffix_or_bool(from).ok_or_else(|| not_implemented(from, t.device(), ""))?;
    let dst = if to == DType::Bool {
        "bool"
    } else {
        suffix(to).ok_or_else(|| not_implemented(to, t.device(), " (as the target dtype)"))?
    };
    let out = empty(job.device, to, t.shape(), t.layout())?;
    let n = out.numel() as u64;
    if from == to || (from == DType::Bool && to == DType::U8) {
        launch::copy_on_device(job.device, addr(&out), addr(&t), out.nbytes())?;
    } else {
        job.launch(
            "cast",
            &format!("ndx_cast_{src}_{dst}"),
            n,
            &[Arg::Ptr(addr(&out)), Arg::Ptr(addr(&t)), Arg::U64(n)],
        )?;
    }
    Ok(out)
}

fn reduce(job: &Job, op: &str, t: &Tensor, args: &Args, meta: &TMeta) -> Result<Tensor> {
    let (mut axes, _) = crate::ops::reduce::axes_arg(t.shape(), args)?;
    // What the caller reduces, for the error of a `max` over nothing.
    let asked = (
        t.shape().to_vec(),
        crate::ops::reduce::axes_named(&axes, t.ndim()),
    );
    let t = if axes.windows(2).any(|w| w[1] != w[0] + 1) {
        // Gather: a view with the kept axes first (in order) and the reduced ones
        // last, made compact. Its elements are in the output's order, each followed by
        // the run it reduces, so the kernels see [outer, r, 1].
        let kept = (0..t.ndim()).filter(|a| !axes.contains(a));
        let order: Vec<usize> = kept.chain(axes.iter().copied()).collect();
        let shape = order.iter().map(|&a| t.shape()[a]).collect();
        let strides = order.iter().map(|&a| t.strides()[a]).collect();
        let first = t.ndim() - axes.len();
        axes = (first..t.ndim()).collect();
        compacted(job, &t.restride(shape, strides, 0))?
    } else {
        compacted(job, t)?
    };
    let sfx =
        suffix_or_bool(t.dtype()).ok_or_else(|| not_implemented(t.dtype(), t.device(), ""))?;
    let shape = t.shape();
    let (lo, hi) = match (axes.first(), axes.last()) {
        (Some(&f), Some(&l)) => (f, l + 1),
        _ => (shape.len(), shape.len()),
    };
    let prod = |s: &[i64]| s.iter().map(|&d| d as u64).product::<u64>();
    let (outer, r, inner) = (prod(&shape[..lo]), prod(&shape[lo..hi]), prod(&shape[hi..]));
    if op == "max" && r == 0 && outer * inner > 0 {
        return Err(crate::ops::reduce::empty_reduction(op, &asked.0, &asked.1));
    }
    let out = empty(job.device, meta.dtype, &meta.shape, &meta.layout)?;
    if outer * inner == 0 {
        return Ok(out);
    }
    let nchunks = if r == 0 {
        0
    } else if inner == 1 {
        8192u64.div_ceil(outer).clamp(1, r.div_ceil(1024).max(1))
    } else {
        65536u64
            .div_ceil(outer * inner)
            .clamp(1, r.div_ceil(16).max(1))
    };
    let chunk = if nchunks == 0 { 1 } else { r.div_ceil(nchunks) };
    let nchunks = if r == 0 { 0 } else { r.div_ceil(chunk) };
    let partial_elem = if op == "max" { t.dtype().itemsize() } else { 8 };
    let partial = Scratch::new(
        job.device,
        (outer * nchunks * inner) as usize * partial_elem,
    )?;
    let geometry = [
        Arg::U64(outer),
        Arg::U64(r),
        Arg::U64(inner),
        Arg::U64(chunk),
    ];
    let first = if op == "max" { "max" } else { "sum" };
    if r > 0 {
        let work = if inner == 1 && chunk >= 32 {
            32 * outer * nchunks
        } else {
            outer * nchunks * inner
        };
        let mut a = vec![Arg::Ptr(partial.ptr), Arg::Ptr(addr(&t))];
        a.extend(geometry);
        job.launch("reduce", &format!("ndx_{first}_{sfx}_partial"), work, &a)?;
    }
    let mut a = vec![Arg::Ptr(addr(&out)), Arg::Ptr(partial.ptr)];
    a.extend(geometry);
    job.launch(
        "reduce",
        &format!("ndx_{op}_{sfx}_final"),
        32 * outer * inner,
        &a,
    )?;
    Ok(out)
}

fn normalize(job: &Job, t: &Tensor, args: &Args, meta: &TMeta) -> Result<Tensor> {
    let t = compacted(job, t)?;
    let sfx = suffix(t.dtype()).ok_or_else(|| not_implemented(t.dtype(), t.device(), ""))?;
    let (c_ax, mean, std) = crate::ops::image::normalize_params(&TMeta::of(&t), args)?;
    let c = t.shape()[c_ax] as usize;
    let inner: u64 = t.shape()[c_ax + 1..].iter().map(|&d| d as u64).product();
    let params: Vec<u8> = mean
        .iter()
        .chain(&std)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let p = Scratch::new(job.device, params.len())?;
    launch::copy_to_device(job.device, p.ptr, &params)?;
    let out = empty(job.device, DType::F32, t.shape(), &meta.layout)?;
    let n = out.numel() as u64;
    job.launch(
        "normalize",
        &format!("ndx_normalize_{sfx}"),
        n,
        &[
            Arg::Ptr(addr(&out)),
            Arg::Ptr(addr(&t)),
            Arg::U64(n),
            Arg::U64(c as u64),
            Arg::U64(inner),
            Arg::Ptr(p.ptr),
            Arg::Ptr(p.ptr + 8 * mean.len() as u64),
            Arg::U64(u64::from(mean.len() > 1)),
        ],
    )?;
    Ok(out)
}

fn resize(job: &Job, t: &Tensor, args: &Args, meta: &TMeta) -> Result<Tensor> {
    let t = compacted(job, t)?;
    let dtype = t.dtype();
    let sfx = suffix(dtype).ok_or_else(|| not_implemented(dtype, t.device(), ""))?;
    let plan = crate::ops::resize::plan(&TMeta::of(&t), args)?;
    let (h_ax, w_ax, c_ax) = plan.axes;
    let s = t.shape();
    let out = empty(job.device, dtype, &meta.shape, &meta.layout)?;
    let g = ResizeGeom {
        planes: if c_ax < h_ax { s[c_ax] as u64 } else { 1 },
        in_h: s[h_ax] as u64,
        in_w: s[w_ax] as u64,
        c: if c_ax < h_ax { 1 } else { s[c_ax] as u64 },
        out_h: plan.out_h as u64,
        out_w: plan.out_w as u64,
    };
    if g.planes * g.c == 0 || out.numel() == 0 {
        return Ok(out);
    }
    if (g.out_h, g.out_w) == (g.in_h, g.in_w) {
        launch::copy_on_device(job.device, addr(&out), addr(&t), out.nbytes())?;
        return Ok(out);
    }
    let name = match plan.interp {
        crate::ops::resize::Interp::Nearest => format!("ndx_resize_nearest_{sfx}"),
        crate::ops::resize::Interp::Linear if plan.halves_by_area(s, dtype) => {
            "ndx_resize_area2_u8".to_string()
        }
        crate::ops::resize::Interp::Linear => format!("ndx_resize_linear_{sfx}"),
    };
    job.launch(
        "resize",
        &name,
        out.numel() as u64,
        &[Arg::Ptr(addr(&out)), Arg::Ptr(addr(&t)), Arg::Geom(g)],
    )?;
    Ok(out)
}

fn check(job: &Job, op: &str, t: &Tensor, args: &Args) -> Result<Tensor> {
    let out = compacted(job, t)?;
    if op == "check_shape" {
        let def = crate::ops::builtin("check_shape")
            .ok_or_else(|| Error::internal("check_shape is not registered"))?;
        if let crate::ops::Kernel::Builtin(f) = &def.kernel {
            // Reads only the shape; passes a compact input through unchanged.
            f(&[&out], args)?;
        }
        return Ok(out);
    }
    let flag = job.flag(|w| matches!(w, Watch::User(_)));
    if flag == 0 {
        return Ok(out);
    }
    let n = out.numel() as u64;
    let x = Arg::Ptr(addr(&out));
    match op {
        "check" => job.launch(
            "check",
            "ndx_check_bool",
            n,
            &[x, Arg::U64(n), Arg::Ptr(flag)],
        )?,
        "check_finite" => finite_into(job, &out, flag)?,
        _ => {
            let sfx = suffix_or_bool(out.dtype()).unwrap_or("u8");
            let lo = args.float("lo")?.unwrap_or(f64::NEG_INFINITY);
            let hi = args.float("hi")?.unwrap_or(f64::INFINITY);
            job.launch(
                "check",
                &format!("ndx_check_range_{sfx}"),
                n,
                &[x, Arg::U64(n), Arg::F64(lo), Arg::F64(hi), Arg::Ptr(flag)],
            )?;
        }
    }
    Ok(out)
}

/// Test hook (cargo feature `test-hooks`): the next run on CUDA tensors of one
/// operator misbehaves like a faulty kernel, so that the tests of the `debug` backend
/// can provoke on the device the violations it looks for (the built-in kernels commit
/// none).
#[cfg(feature = "test-hooks")]
pub mod test_fault {
    use super::*;

    /// How the run misbehaves.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Fault {
        /// After its kernels, it writes into the first byte of input 0 (in CUDA
        /// memory) on ndx's stream.
        WritesInput,
        /// Output 0 is a view of input 0's memory (compact, and holding at least as
        /// many bytes) with the inferred metadata.
        AliasesInput,
        /// Output 0 has another dtype of the same item size than inferred.
        WrongDtype,
        /// Output 0 has another shape (its elements flattened, or given a leading 1)
        /// than inferred.
        WrongShape,
        /// Output 0 has another layout than inferred.
        WrongLayout,
    }

    static ARMED: std::sync::Mutex<Option<(String, Fault)>> = std::sync::Mutex::new(None);
    /// Whether `ARMED` may hold a fault: runs read only this while none is armed.
    static ANY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Arms `fault` for the next CUDA run of operator `op` (any context; `to_host`
    /// excepted), replacing what was armed; `None` disarms.
    pub fn arm(op: &str, fault: Option<Fault>) {
        let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
        *armed = fault.map(|f| (op.to_string(), f));
        ANY.store(armed.is_some(), std::sync::atomic::Ordering::Release);
    }

    /// The fault armed for operator `op`, disarmed as it is taken.
    pub(super) fn take(op: &str) -> Option<Fault> {
        if !ANY.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
        match armed.as_ref() {
            Some((o, f)) if o == op => {
                let f = *f;
                *armed = None;
                ANY.store(false, std::sync::atomic::Ordering::Release);
                Some(f)
            }
            _ => None,
        }
    }

    /// `outs`, the launched outputs of a run on `inputs`, after `fault`.
    pub(super) fn apply(
        fault: Fault,
        device: &'static DeviceState,
        inputs: &[&Tensor],
        mut outs: Vec<Tensor>,
    ) -> Result<Vec<Tensor>> {
        let refuse = |why: &str| Error::internal(format!("test fault {fault:?}: {why}"));
        let input = inputs.first().copied();
        let Some(out) = outs.first() else {
            return Err(refuse("no output"));
        };
        let changed = match fault {
            Fault::WritesInput => {
                let t = input
                    .filter(|t| t.device().kind == DeviceKind::Cuda && t.numel() > 0)
                    .ok_or_else(|| refuse("input 0 is not a non-empty CUDA tensor"))?;
                // Waits for the kernels enqueued before (a test hook may).
                let first = (to_host(device, t)?.compact_bytes()?.first().copied()).unwrap_or(0);
                launch::copy_to_device(device, addr(t), &[!first])?;
                return Ok(outs);
            }
            Fault::AliasesInput => {
                let t = input
                    .filter(|t| t.is_compact() && t.nbytes() >= out.nbytes())
                    .ok_or_else(|| refuse("input 0 cannot hold output 0"))?;
                Tensor::from_parts(
                    t.storage().clone(),
                    out.dtype(),
                    out.shape().to_vec(),
                    Geometry {
                        strides: out.strides().to_vec(),
                        numel: out.numel(),
                        lo: t.storage().span_start(),
                        len: t.storage().span_len(),
                    },
                    t.byte_offset(),
                    out.c_layout().to_owned(),
                    false,
                )
            }
            Fault::WrongDtype => {
                let other = (DType::ALL.into_iter())
                    .find(|d| *d != out.dtype() && d.itemsize() == out.dtype().itemsize())
                    .ok_or_else(|| refuse("no other dtype of that size"))?;
                out.clone().with_dtype_of_same_size(other)
            }
            Fault::WrongShape => {
                let n = out.numel() as i64;
                let shape = if out.ndim() == 1 { vec![1, n] } else { vec![n] };
                let strides = crate::tensor::compact_strides(&shape)
                    .ok_or_else(|| refuse("no compact strides"))?;
                out.restride(shape, strides, 0)
                    .with_layout(out.c_layout().to_owned())
            }
            Fault::WrongLayout => {
                let layout = if out.layout().is_empty() {
                    "W".repeat(out.ndim().max(1))
                } else {
                    String::new()
                };
                out.clone()
                    .with_layout(CString::new(layout).unwrap_or_default())
            }
        };
        outs[0] = changed;
        Ok(outs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host-accessible input beside a device input is refused, naming its kind of
    /// memory: managed and pinned memory are not "host memory" to their owner.
    #[test]
    fn mixing_memory_names_the_kind_of_the_host_accessible_input() {
        let gpu = Device {
            kind: DeviceKind::Cuda,
            id: 0,
        };
        for (kind, memory, dl) in [
            (DeviceKind::Cpu, "host memory", "kDLCPU:0"),
            (DeviceKind::CudaHost, "pinned host memory", "kDLCUDAHost:0"),
            (
                DeviceKind::CudaManaged,
                "managed memory",
                "kDLCUDAManaged:0",
            ),
        ] {
            let other = Device { kind, id: 0 };
            let e = common_device("add", &[Some(gpu), Some(other)]).unwrap_err();
            assert_eq!(
                e.message(),
                format!(
                    "input 1 is in {memory} ({dl}) but input 0 is on kDLCUDA:0; move it with 'to_device' first"
                )
            );
            assert_eq!(
                common_device("to_device", &[Some(gpu), Some(other)]).unwrap(),
                Some((0, gpu))
            );
        }
    }
}
