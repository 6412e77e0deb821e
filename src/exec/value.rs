//! Tensor and batch handles that may still be pending: the outputs of invocations are
//! usable as inputs at once, their metadata is answered without running them (when
//! the operator infers it), and reading their data forces evaluation.

use std::ffi::{CStr, CString};
use std::sync::{Arc, OnceLock};

use super::node::{Data, Node};
use crate::debug::explain::{Flush, Why};
use crate::error::{Error, Result};
use crate::ops::TMeta;
use crate::tensor::{Batch, DType, Device, Tensor, compact_nbytes, compact_strides};

/// Where a handle's data comes from.
enum Source<T> {
    /// Data that exists.
    Ready(Arc<T>),
    /// Output `index` of an invocation.
    Pending(Arc<Node>, usize),
}

impl<T> Source<T> {
    /// The data if it exists now, without forcing anything (`pick` takes this kind of
    /// output, a `kind`, out of the producer's). An internal lookup: a failure it finds
    /// does not count as observed by the user.
    fn ready(
        &self,
        kind: &str,
        pick: impl Fn(&Data) -> Option<&Arc<T>>,
    ) -> Option<Result<&Arc<T>>> {
        match self {
            Source::Ready(x) => Some(Ok(x)),
            Source::Pending(node, i) => Some(match node.outcome()? {
                Ok(outputs) => outputs.get(*i).and_then(pick).ok_or_else(|| {
                    Error::internal(format!(
                        "output {i} of '{}' is not a {kind}",
                        node.op_name()
                    ))
                }),
                Err(e) => Err(e.clone()),
            }),
        }
    }

    /// The output of a producer whose GPU work is enqueued but may still be running
    /// (see [`Node::launched_output`]); `None` before that, or for ready data.
    fn launched(&self) -> Option<&Data> {
        match self {
            Source::Ready(_) => None,
            Source::Pending(node, i) => node.launched_output(*i),
        }
    }
}

/// Metadata of a pending output, kept in the handle so accessors can lend it.
struct PendingMeta {
    meta: TMeta,
    strides: Vec<i64>,
    layout: CString,
}

impl PendingMeta {
    /// `None` when the shape has no compact strides (its size overflows): such metadata
    /// is not lent out (operators refuse those outputs at enqueue), never with empty
    /// strides.
    fn new(meta: TMeta) -> Option<PendingMeta> {
        Some(PendingMeta {
            strides: compact_strides(&meta.shape)?,
            layout: CString::new(meta.layout.clone()).unwrap_or_default(),
            meta,
        })
    }
}

/// A tensor handle (`ndx_tensor_t`): data, or a pending invocation's output.
pub struct TensorRef {
    source: Source<Tensor>,
    /// Inferred metadata of a pending output (`None` when only running tells).
    meta: Option<PendingMeta>,
    /// The dtype/shape/layout summary operators infer from, made once.
    summary: OnceLock<TMeta>,
}

impl TensorRef {
    /// A handle to existing data.
    pub fn ready(t: Arc<Tensor>) -> TensorRef {
        TensorRef {
            summary: OnceLock::from(TMeta::of(&t)),
            source: Source::Ready(t),
            meta: None,
        }
    }

    /// A handle to output `index` of `node`, with its inferred metadata if known.
    /// The strides are those of the invocation's out tensor for that output, if it has
    /// one, else compact.
    pub(crate) fn pending(node: Arc<Node>, index: usize, meta: Option<TMeta>) -> TensorRef {
        let strides = node.out_tensor(index).map(|t| t.strides().to_vec());
        let meta = meta.and_then(|m| {
            let mut p = PendingMeta::new(m)?;
            if let Some(s) = strides {
                p.strides = s;
            }
            Some(p)
        });
        TensorRef {
            summary: meta
                .as_ref()
                .map_or_else(OnceLock::new, |p| OnceLock::from(p.meta.clone())),
            source: Source::Pending(node, index),
            meta,
        }
    }

    /// The producing invocation while the data may not exist yet.
    pub(crate) fn producer(&self) -> Option<&Arc<Node>> {
        match &self.source {
            Source::Ready(_) => None,
            Source::Pending(node, _) => Some(node),
        }
    }

    /// The data, forcing (and waiting for) the producing invocation if needed. Fails
    /// with the producer's error when it failed.
    pub fn resolve(&self) -> Result<&Arc<Tensor>> {
        self.resolve_as(Flush::DataRead)
    }

    /// [`TensorRef::resolve`], recording a flush it causes as `reason`.
    pub fn resolve_as(&self, reason: Flush) -> Result<&Arc<Tensor>> {
        match &self.source {
            Source::Ready(t) => Ok(t),
            Source::Pending(node, i) => match node.force_as(Why::new(reason))?.get(*i) {
                Some(Data::Tensor(t)) => Ok(t),
                _ => Err(Error::internal(format!(
                    "output {i} of '{}' is not a tensor",
                    node.op_name()
                ))),
            },
        }
    }

    /// The data if it exists now, without forcing anything. An internal lookup: a
    /// failure it finds does not count as observed by the user.
    pub(crate) fn ready_data(&self) -> Option<Result<&Arc<Tensor>>> {
        self.source.ready("tensor", |d| match d {
            Data::Tensor(t) => Some(t),
            Data::Batch(_) => None,
        })
    }

    /// The output of a producer whose GPU work is enqueued but may still be running
    /// (see [`Node::launched_output`]); `None` before that, or for ready data.
    pub(crate) fn launched_data(&self) -> Option<&Arc<Tensor>> {
        match self.source.launched()? {
            Data::Tensor(t) => Some(t),
            Data::Batch(_) => None,
        }
    }

    /// Metadata when known without running anything.
    pub(crate) fn known_meta(&self) -> Option<&TMeta> {
        self.summary.get()
    }

    /// Metadata; forces evaluation only when the producer could not infer it.
    pub fn meta(&self) -> Result<&TMeta> {
        if let Some(m) = self.summary.get() {
            return Ok(m);
        }
        let m = TMeta::of(self.resolve_as(Flush::Metadata)?);
        Ok(self.summary.get_or_init(|| m))
    }

    /// The element type.
    pub fn dtype(&self) -> Result<DType> {
        match &self.meta {
            Some(m) => Ok(m.meta.dtype),
            None => Ok(self.resolve_as(Flush::Metadata)?.dtype()),
        }
    }
    /// The shape.
    pub fn shape(&self) -> Result<&[i64]> {
        match &self.meta {
            Some(m) => Ok(&m.meta.shape),
            None => Ok(self.resolve_as(Flush::Metadata)?.shape()),
        }
    }
    /// The strides in elements (outputs are compact).
    pub fn strides(&self) -> Result<&[i64]> {
        match &self.meta {
            Some(m) => Ok(&m.strides),
            None => Ok(self.resolve_as(Flush::Metadata)?.strides()),
        }
    }
    /// The layout.
    pub fn c_layout(&self) -> Result<&CStr> {
        match &self.meta {
            Some(m) => Ok(&m.layout),
            None => Ok(self.resolve_as(Flush::Metadata)?.c_layout()),
        }
    }
    /// Element count.
    pub fn numel(&self) -> Result<usize> {
        let shape = self.shape()?;
        compact_nbytes(shape, 1).ok_or_else(|| too_large(shape))
    }
    /// Compact byte size.
    pub fn nbytes(&self) -> Result<usize> {
        let shape = self.shape()?;
        compact_nbytes(shape, self.dtype()?.itemsize()).ok_or_else(|| too_large(shape))
    }
    /// The device: known at enqueue for most pending outputs (from their inputs'),
    /// else asked of the data.
    pub fn device(&self) -> Result<Device> {
        match (&self.meta, self.producer().and_then(|n| n.out_device())) {
            (Some(_), Some(d)) => Ok(d),
            _ => Ok(self.resolve_as(Flush::Metadata)?.device()),
        }
    }
    /// Whether the data is read-only (operator outputs are not).
    pub fn read_only(&self) -> Result<bool> {
        match &self.meta {
            Some(_) => Ok(false),
            None => Ok(self.resolve_as(Flush::Metadata)?.read_only()),
        }
    }
}

fn too_large(shape: &[i64]) -> Error {
    Error::value(format!(
        "tensor: shape {} is too large to address",
        crate::tensor::dims(shape)
    ))
}

/// A batch handle (`ndx_batch_t`): data, or a pending invocation's output.
pub struct BatchRef {
    source: Source<Batch>,
    meta: Option<Vec<TMeta>>,
    /// The number of samples of a pending output, known at enqueue even when the
    /// producer (a host operator) infers no metadata.
    len: Option<usize>,
    layout: CString,
}

impl BatchRef {
    /// A handle to existing data.
    pub fn ready(b: Arc<Batch>) -> BatchRef {
        BatchRef {
            source: Source::Ready(b),
            meta: None,
            len: None,
            layout: CString::default(),
        }
    }

    /// A handle to output `index` of `node`, with its per-sample metadata if known.
    pub(crate) fn pending(node: Arc<Node>, index: usize, meta: Option<Vec<TMeta>>) -> BatchRef {
        let layout = meta
            .as_ref()
            .and_then(|m| m.first())
            .map(|m| CString::new(m.layout.clone()).unwrap_or_default())
            .unwrap_or_default();
        let len = meta.as_ref().map(Vec::len).or_else(|| node.batch_len());
        BatchRef {
            source: Source::Pending(node, index),
            meta,
            len,
            layout,
        }
    }

    /// The producing invocation while the data may not exist yet.
    pub(crate) fn producer(&self) -> Option<&Arc<Node>> {
        match &self.source {
            Source::Ready(_) => None,
            Source::Pending(node, _) => Some(node),
        }
    }

    /// Per-sample metadata when known without running anything.
    pub(crate) fn known_sample_meta(&self) -> Option<Vec<TMeta>> {
        match &self.source {
            Source::Ready(b) => Some(b.samples().iter().map(|s| TMeta::of(s)).collect()),
            Source::Pending(..) => self.meta.clone(),
        }
    }

    /// The data, forcing the producer if needed.
    pub fn resolve(&self) -> Result<&Arc<Batch>> {
        self.resolve_as(Flush::DataRead)
    }

    /// [`BatchRef::resolve`], recording a flush it causes as `reason`.
    pub fn resolve_as(&self, reason: Flush) -> Result<&Arc<Batch>> {
        match &self.source {
            Source::Ready(b) => Ok(b),
            Source::Pending(node, i) => match node.force_as(Why::new(reason))?.get(*i) {
                Some(Data::Batch(b)) => Ok(b),
                _ => Err(Error::internal(format!(
                    "output {i} of '{}' is not a batch",
                    node.op_name()
                ))),
            },
        }
    }

    /// The data if it exists now, without forcing anything. An internal lookup: a
    /// failure it finds does not count as observed by the user.
    pub(crate) fn ready_data(&self) -> Option<Result<&Arc<Batch>>> {
        self.source.ready("batch", |d| match d {
            Data::Batch(b) => Some(b),
            Data::Tensor(_) => None,
        })
    }

    /// [`TensorRef::launched_data`] for a batch output: its samples' GPU work is
    /// enqueued but may still be running.
    pub(crate) fn launched_data(&self) -> Option<&Arc<Batch>> {
        match self.source.launched()? {
            Data::Batch(b) => Some(b),
            Data::Tensor(_) => None,
        }
    }

    /// Per-sample metadata; forces evaluation only when it could not be inferred.
    pub fn sample_meta(&self) -> Result<Vec<TMeta>> {
        match &self.meta {
            Some(m) => Ok(m.clone()),
            None => Ok(self
                .resolve_as(Flush::Metadata)?
                .samples()
                .iter()
                .map(|s| TMeta::of(s))
                .collect()),
        }
    }
    /// Number of samples: known without running anything for every pending output
    /// (a per-sample invocation makes as many as its input batches have).
    pub fn len(&self) -> Result<usize> {
        match self.len {
            Some(n) => Ok(n),
            None => Ok(self.resolve_as(Flush::Metadata)?.len()),
        }
    }
    /// Always false: batches have at least one sample.
    pub fn is_empty(&self) -> bool {
        false
    }
    fn first_meta(&self) -> Option<&TMeta> {
        self.meta.as_ref().and_then(|m| m.first())
    }
    /// The samples' dtype.
    pub fn dtype(&self) -> Result<DType> {
        match self.first_meta() {
            Some(m) => Ok(m.dtype),
            None => Ok(self.resolve_as(Flush::Metadata)?.dtype()),
        }
    }
    /// The samples' number of dimensions.
    pub fn ndim(&self) -> Result<usize> {
        match self.first_meta() {
            Some(m) => Ok(m.shape.len()),
            None => Ok(self.resolve_as(Flush::Metadata)?.ndim()),
        }
    }
    /// The samples' device (known at enqueue for most pending outputs).
    pub fn device(&self) -> Result<Device> {
        match (
            self.first_meta(),
            self.producer().and_then(|n| n.out_device()),
        ) {
            (Some(_), Some(d)) => Ok(d),
            _ => Ok(self.resolve_as(Flush::Metadata)?.device()),
        }
    }
    /// The samples' layout.
    pub fn c_layout(&self) -> Result<&CStr> {
        match self.first_meta() {
            Some(_) => Ok(&self.layout),
            None => Ok(self.resolve_as(Flush::Metadata)?.c_layout()),
        }
    }
    /// Whether every sample has the same shape.
    pub fn is_uniform(&self) -> Result<bool> {
        match &self.meta {
            Some(m) => Ok(m.iter().all(|s| s.shape == m[0].shape)),
            None => Ok(self.resolve_as(Flush::Metadata)?.is_uniform()),
        }
    }
}
