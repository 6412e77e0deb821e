//! Operators: schemas (inputs, outputs, named arguments), metadata inference at
//! enqueue, and kernels; the registry of built-ins and host operators.

pub mod check;
pub mod device;
pub mod elementwise;
pub mod image;
pub mod kernels;
pub mod par;
pub mod reduce;
pub mod resize;
pub mod shape;
pub(crate) mod strided;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::exec::args::{ArgType, ArgValue, Args};
use crate::tensor::{DType, Tensor, compact_nbytes, dims};

/// Metadata of one tensor (or one sample of a batch), known before the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TMeta {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<i64>,
    /// Layout string ("" when none).
    pub layout: String,
}

impl TMeta {
    /// The metadata of a tensor.
    pub fn of(t: &Tensor) -> TMeta {
        TMeta {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            layout: t.layout().to_string(),
        }
    }
}

/// Infers output metadata from input metadata at enqueue.
pub type InferFn = Arc<dyn Fn(&[&TMeta], &Args) -> Result<Vec<TMeta>> + Send + Sync>;
/// A built-in CPU kernel: inputs to outputs.
pub type KernelFn = Arc<dyn Fn(&[&Tensor], &Args) -> Result<Vec<Tensor>> + Send + Sync>;

/// A kernel implemented by the host (a C callback).
pub trait HostKernel: Send + Sync {
    /// Runs the callback on `inputs`; returns exactly `n_outputs` tensors.
    fn run(
        &self,
        inputs: &[Arc<Tensor>],
        args: &Args,
        n_outputs: usize,
    ) -> Result<Vec<Arc<Tensor>>>;
    /// Releases what the host gave with the kernel (its `user` pointer), once no call
    /// is running; later calls fail. Called when the owning context goes away.
    fn release(&self) {}
    /// What the schema promises about the outputs, which the `debug` backend checks.
    fn contract(&self) -> Contract {
        Contract::default()
    }
}

/// A host operator's promises about its outputs (from `ndx_op_schema_t`).
#[derive(Clone, Debug, Default)]
pub struct Contract {
    /// Per output: the dtype, rank and layout it will have (`None`: not declared).
    pub outputs: Vec<OutDecl>,
    /// Whether outputs may share memory with inputs (`NDX_OP_FLAG_OUTPUTS_MAY_ALIAS`).
    pub may_alias: bool,
}

/// One output's declared metadata.
#[derive(Clone, Debug, Default)]
pub struct OutDecl {
    pub dtype: Option<DType>,
    pub ndim: Option<usize>,
    pub layout: Option<String>,
}

/// How an operator computes.
#[derive(Clone)]
pub enum Kernel {
    /// A built-in kernel.
    Builtin(KernelFn),
    /// A host callback.
    Host(Arc<dyn HostKernel>),
}

/// One named argument of a schema.
#[derive(Debug, Clone)]
pub struct ArgSpec {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: ArgType,
    /// Whether it must be given.
    pub required: bool,
}

/// `OpDef::n_inputs` of operators that take one or more inputs (`concat`, `stack`).
pub const VARIADIC: usize = usize::MAX;

/// `OpDef::n_inputs` of operators that take the samples of one batch at once (not
/// per sample), or one or more tensors as those samples (`batch_to_tensor`).
pub const SAMPLES: usize = usize::MAX - 1;

/// An operator.
#[derive(Clone)]
pub struct OpDef {
    /// Its name.
    pub name: String,
    /// Exact number of inputs, [`VARIADIC`] for one or more, or [`SAMPLES`].
    pub n_inputs: usize,
    /// Exact number of outputs.
    pub n_outputs: usize,
    /// Named arguments it takes.
    pub args: Vec<ArgSpec>,
    /// Metadata inference; `None` when outputs are known only after running.
    pub infer: Option<InferFn>,
    /// The kernel.
    pub kernel: Kernel,
}

impl OpDef {
    /// `args` with each value that its schema type accepts in another form (an int for
    /// a float, a single int or float for an array, an int array for a float array)
    /// converted to that type, so that
    /// kernels see the declared type: a host kernel reads an NDX_ARG_INT_ARRAY argument
    /// given as one int with `ndx_args_get_int_array`. Unknown names and wrong types are
    /// left for [`OpDef::validate_args`] to refuse.
    pub fn conform_args(&self, args: Args) -> Args {
        let entries = args
            .into_entries()
            .into_iter()
            .map(|(name, value)| {
                let ty = self.args.iter().find(|s| s.name == name).map(|s| s.ty);
                let value = match (ty, value) {
                    (Some(ArgType::Float), ArgValue::Int(v)) => ArgValue::Float(v as f64),
                    (Some(ArgType::Ints), ArgValue::Int(v)) => ArgValue::Ints(vec![v]),
                    (Some(ArgType::Floats), ArgValue::Float(v)) => ArgValue::Floats(vec![v]),
                    (Some(ArgType::Floats), ArgValue::Int(v)) => ArgValue::Floats(vec![v as f64]),
                    (Some(ArgType::Floats), ArgValue::Ints(v)) => {
                        ArgValue::Floats(v.into_iter().map(|x| x as f64).collect())
                    }
                    (_, v) => v,
                };
                (name, value)
            })
            .collect();
        Args::from_distinct(entries)
    }

    /// Checks `args` against the schema: no unknown names, right types, required ones
    /// present.
    pub fn validate_args(&self, args: &Args) -> Result<()> {
        for (name, value) in args.entries() {
            let Some(spec) = self.args.iter().find(|s| &s.name == name) else {
                let known: Vec<&str> = self.args.iter().map(|s| s.name.as_str()).collect();
                return Err(Error::value(format!(
                    "operator '{}' has no argument '{name}' (it takes: {})",
                    self.name,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            };
            let ok = value.arg_type() == spec.ty
                || (spec.ty == ArgType::Float && matches!(value, ArgValue::Int(_)))
                || (spec.ty == ArgType::Ints && matches!(value, ArgValue::Int(_)))
                || (spec.ty == ArgType::Floats
                    && matches!(
                        value,
                        ArgValue::Float(_) | ArgValue::Int(_) | ArgValue::Ints(_)
                    ));
            if !ok {
                return Err(Error::type_error(format!(
                    "operator '{}': argument '{name}' is {}, expected {}",
                    self.name,
                    value.arg_type().a(),
                    spec.ty.accepted()
                )));
            }
        }
        for spec in &self.args {
            if spec.required && args.get(&spec.name).is_none() {
                return Err(Error::value(format!(
                    "operator '{}' needs argument '{}' ({})",
                    self.name,
                    spec.name,
                    spec.ty.name()
                )));
            }
        }
        Ok(())
    }
}

/// Operators by name.
#[derive(Default)]
pub struct Registry {
    ops: RwLock<HashMap<String, Arc<OpDef>>>,
    any: std::sync::atomic::AtomicBool,
}

impl Registry {
    /// A registry holding only host operators (built-ins are found through
    /// [`builtin`]).
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The operator `name`: a host operator of this registry, else a built-in.
    pub fn get(&self, name: &str) -> Option<Arc<OpDef>> {
        if self.any.load(std::sync::atomic::Ordering::Acquire)
            && let Some(op) = self.ops.read().get(name)
        {
            return Some(op.clone());
        }
        builtin(name)
    }

    /// The closest operator name to `name`, host or built-in, when one is near enough
    /// to be a misspelling of it: for "did you mean" hints.
    pub fn suggest(&self, name: &str) -> Option<String> {
        let host = self.ops.read();
        let names = host
            .keys()
            .map(String::as_str)
            .chain(builtins().list.iter().map(|op| op.name.as_str()));
        closest(name, names).map(str::to_string)
    }

    /// Releases every host operator's host data (context teardown, after its work).
    pub fn release_host_data(&self) {
        for op in self.ops.read().values() {
            if let Kernel::Host(h) = &op.kernel {
                h.release();
            }
        }
    }

    /// Registers a host operator; its name must not be taken.
    pub fn register(&self, op: OpDef) -> Result<()> {
        if builtin(&op.name).is_some() {
            return Err(Error::value(format!(
                "operator '{}' is a built-in and cannot be replaced",
                op.name
            )));
        }
        let mut ops = self.ops.write();
        if ops.contains_key(&op.name) {
            return Err(Error::value(format!(
                "operator '{}' is already registered in this context",
                op.name
            )));
        }
        ops.insert(op.name.clone(), Arc::new(op));
        self.any.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

fn arg(name: &str, ty: ArgType, required: bool) -> ArgSpec {
    ArgSpec {
        name: name.to_string(),
        ty,
        required,
    }
}

/// The built-in operator `name`.
pub fn builtin(name: &str) -> Option<Arc<OpDef>> {
    let b = builtins();
    b.index.get(name).map(|&i| b.list[i].clone())
}

/// The candidate in `names` nearest to `name` (edit distance) when it is near enough
/// to be a misspelling: at most one edit for names of up to four characters, else at
/// most a third of the name. Ties go to the first candidate.
fn closest<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    names
        .filter(|c| *c != name)
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The built-in operators, in a fixed order, with an index by name (a linear search
/// cost the last of them about 90 ns per invocation, SipHash about 75 ns for any).
struct Builtins {
    list: Vec<Arc<OpDef>>,
    index: HashMap<String, usize, BuildHasherDefault<Fnv1a>>,
}

/// FNV-1a: a fast hash for the short, fixed set of built-in names (no untrusted keys
/// are inserted, so a hash-flooding-resistant hasher buys nothing here).
#[derive(Default)]
struct Fnv1a(u64);

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Every built-in operator.
fn builtins() -> &'static Builtins {
    static BUILTINS: OnceLock<Builtins> = OnceLock::new();
    BUILTINS.get_or_init(|| {
        let mut ops = elementwise::ops();
        ops.extend(reduce::ops());
        ops.extend(shape::ops());
        ops.extend(image::ops());
        ops.extend(check::ops());
        ops.extend(device::ops());
        ops.extend([OpDef {
            name: "cast".into(),
            n_inputs: 1,
            n_outputs: 1,
            args: vec![arg("dtype", ArgType::DType, true)],
            infer: Some(Arc::new(infer_cast)),
            kernel: Kernel::Builtin(Arc::new(kernel_cast)),
        }]);
        let list: Vec<Arc<OpDef>> = ops
            .into_iter()
            .map(|mut op| {
                op.infer = op.infer.map(addressable_outputs);
                Arc::new(op)
            })
            .collect();
        let index = list
            .iter()
            .enumerate()
            .map(|(i, op)| (op.name.clone(), i))
            .collect();
        Builtins { list, index }
    })
}

/// Wraps an operator's metadata inference so that it refuses outputs that could not be
/// addressed (their byte size overflows), whatever the operator: the one check behind
/// every built-in, so that a pending output's metadata (strides, numel, nbytes) is always
/// representable.
fn addressable_outputs(infer: InferFn) -> InferFn {
    Arc::new(move |inputs: &[&TMeta], args: &Args| {
        let outs = infer(inputs, args)?;
        for (i, m) in outs.iter().enumerate() {
            if compact_nbytes(&m.shape, m.dtype.itemsize()).is_none() {
                return Err(Error::value(format!(
                    "output {i}: shape {} of {} (itemsize {}) is too large to address",
                    dims(&m.shape),
                    m.dtype.name(),
                    m.dtype.itemsize()
                )));
            }
        }
        Ok(outs)
    })
}

fn infer_cast(inputs: &[&TMeta], args: &Args) -> Result<Vec<TMeta>> {
    let dtype = args
        .dtype("dtype")?
        .ok_or_else(|| Error::value("cast needs argument 'dtype'"))?;
    Ok(vec![TMeta {
        dtype,
        ..inputs[0].clone()
    }])
}

fn kernel_cast(inputs: &[&Tensor], args: &Args) -> Result<Vec<Tensor>> {
    let dtype = args
        .dtype("dtype")?
        .ok_or_else(|| Error::value("cast needs argument 'dtype'"))?;
    Ok(vec![kernels::cast(inputs[0], dtype)?])
}

/// A call-time error `e` of operator `op`, its message starting with "operator 'op'"
/// once: messages of the schema and of some operators' inference already name it,
/// and kernels' own messages begin "op: ", which the prefix replaces.
pub fn of_operator(op: &str, e: &Error) -> Error {
    let named = format!("operator '{op}'");
    let message = e.message();
    let message = if message.starts_with(&named) {
        message.to_string()
    } else {
        let rest = message
            .strip_prefix(op)
            .and_then(|m| m.strip_prefix(": "))
            .unwrap_or(message);
        format!("{named}: {rest}")
    };
    Error::new(e.kind(), message)
}

/// Describes a shape mismatch between a kernel's declared and actual output.
pub fn describe_meta(m: &TMeta) -> String {
    format!("{} {}", m.dtype.name(), dims(&m.shape))
}
