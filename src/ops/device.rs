//! Moving tensors between host memory and a CUDA device: `to_device` and `to_host`.
//! Their copies run on ndx's stream of the device (`src/cuda/ops.rs`); here are their
//! schemas, and `to_host` of memory the host can already read.

use std::sync::Arc;

use super::{ArgSpec, Kernel, OpDef, TMeta};
use crate::error::{Error, Result};
use crate::exec::args::{ArgType, Args};
use crate::tensor::Tensor;

/// The device id `to_device` names (default 0), checked against the devices present.
pub fn target_device(args: &Args) -> Result<i32> {
    let id = args.int_or("device", 0)?;
    if id < 0 || id > i64::from(i32::MAX) {
        return Err(Error::value(format!(
            "'device' must be a CUDA device id (0 or more), got {id}"
        )));
    }
    crate::cuda::require_device(id)?;
    Ok(id as i32)
}

/// The device operators.
pub fn ops() -> Vec<OpDef> {
    vec![
        OpDef {
            name: "to_device".into(),
            n_inputs: 1,
            n_outputs: 1,
            args: vec![ArgSpec {
                name: "device".into(),
                ty: ArgType::Int,
                required: false,
            }],
            infer: Some(Arc::new(|i: &[&TMeta], a: &Args| {
                target_device(a)?;
                Ok(vec![i[0].clone()])
            })),
            // The engine sends every `to_device` to the CUDA launchers, which copy.
            kernel: Kernel::Builtin(Arc::new(|_: &[&Tensor], _: &Args| {
                Err(Error::internal(
                    "to_device must run through the CUDA launchers",
                ))
            })),
        },
        OpDef {
            name: "to_host".into(),
            n_inputs: 1,
            n_outputs: 1,
            args: vec![],
            infer: Some(Arc::new(|i: &[&TMeta], _: &Args| Ok(vec![i[0].clone()]))),
            // Reached for memory the host can read: it is passed through (compacted).
            kernel: Kernel::Builtin(Arc::new(|i: &[&Tensor], _: &Args| {
                let t = i[0];
                Ok(vec![if t.is_compact() {
                    t.clone()
                } else {
                    t.to_compact()?
                }])
            })),
        },
    ]
}
