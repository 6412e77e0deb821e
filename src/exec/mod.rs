//! Execution: contexts, invocations (nodes), futures and the worker pool.

pub mod args;
mod context;
pub(crate) mod fork;
mod node;
pub(crate) mod pool;
mod value;

pub use args::{ArgType, ArgValue, Args, Num};
pub use context::{
    Backend, CallSite, CapturePolicy, Context, ContextInner, EvalMode, FrameProvider, Settings,
    new_context, output_batch, output_tensor,
};
pub(crate) use node::in_kernel_scope;
pub use node::{Callback, Data, Input, Node, OutMeta, Phase, Status};
pub use pool::on_worker;
pub use value::{BatchRef, TensorRef};
