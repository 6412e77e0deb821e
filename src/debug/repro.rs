//! Repro documents: a failing invocation written as self-contained JSON (operator,
//! arguments, inputs' metadata and, within a size cap, their bytes, mode, backend, ndx
//! version, site and the error it ended with), and the replay of such a document.
//!
//! A document is made when an invocation fails (its input bytes must be taken then:
//! they may change later) but its site is symbolised only when someone reads it, like
//! every other site: a failure whose document nobody reads never pays for symbols.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::error::{Error, Result, Site};
use crate::exec::{ArgValue, Args, EvalMode};
use crate::tensor::{DType, MAX_NDIM, Tensor, validate_layout};

/// Default cap on the input bytes a repro document carries (1 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;

/// The document's format version.
const FORMAT: u64 = 1;

fn mode_name(m: EvalMode) -> &'static str {
    match m {
        EvalMode::SyncCpu => "sync_cpu",
        EvalMode::SyncFull => "sync_full",
        EvalMode::Deferred => "deferred",
        EvalMode::Eager => "eager",
    }
}

fn float_json(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else if v.is_nan() {
        json!("nan")
    } else if v > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

fn float_of(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => match s.as_str() {
            "nan" => Some(f64::NAN),
            "inf" => Some(f64::INFINITY),
            "-inf" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        v => v.as_f64(),
    }
}

fn arg_json(name: &str, v: &ArgValue) -> Value {
    let (ty, value) = match v {
        ArgValue::Int(i) => ("int", json!(i)),
        ArgValue::Float(f) => ("float", float_json(*f)),
        ArgValue::Bool(b) => ("bool", json!(b)),
        ArgValue::Str(s) => ("string", json!(s.to_string_lossy())),
        ArgValue::Ints(v) => ("ints", json!(v)),
        ArgValue::Floats(v) => (
            "floats",
            Value::Array(v.iter().map(|&f| float_json(f)).collect()),
        ),
        ArgValue::DType(d) => ("dtype", json!(d.name())),
    };
    json!({ "name": name, "type": ty, "value": value })
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// What a repro document records about the failing invocation.
pub struct Invocation<'a> {
    /// Operator name.
    pub op: &'a str,
    /// Its arguments.
    pub args: &'a Args,
    /// The inputs of the failing call (one sample's, for a batch invocation).
    pub inputs: &'a [Arc<Tensor>],
    /// The batch sample that failed, if any.
    pub sample: Option<usize>,
    /// Eval mode.
    pub mode: EvalMode,
    /// Backend name.
    pub backend: String,
    /// Enqueue site.
    pub site: &'a Arc<Site>,
}

/// A repro document: everything but the site's frames is taken when it is made; the
/// frames are symbolised, and the text written, the first time it is read.
pub struct Document {
    text: OnceLock<String>,
    /// What the document records, and the site to symbolise, until first read.
    pending: Mutex<Option<(Arc<Record>, Arc<Site>)>>,
}

impl Document {
    /// The document for `inv`, which failed with `error`; input bytes are included
    /// (copied now) when all of them together fit in `max_bytes`. Resolves no frames.
    pub fn new(inv: &Invocation<'_>, error: &Error, max_bytes: u64) -> Document {
        Document {
            text: OnceLock::new(),
            pending: Mutex::new(Some((
                Arc::new(Record::new(inv, error, max_bytes)),
                inv.site.clone(),
            ))),
        }
    }

    /// The JSON text; the first call symbolises the site and writes it.
    pub fn text(&self) -> &str {
        if let Some(text) = self.text.get() {
            return text;
        }
        // Written with neither lock held (the cell's initialisation only stores the
        // text): a child forked while a parent thread was writing it (symbolising the
        // site takes milliseconds) would otherwise find the cell, or the pending lock,
        // held by a thread it does not have, and wait for it forever. Two threads
        // reading at once may both write it; the first to store wins (the same text).
        // The pending record goes only once the text is stored, so a reader that finds
        // it gone finds the text.
        let pending = self.pending.lock().clone();
        let text = pending
            .map(|(record, site)| render(&mut record.unsited(), &site))
            .unwrap_or_default();
        let text = self.text.get_or_init(|| text);
        *self.pending.lock() = None;
        text
    }
}

/// A document already written.
impl From<String> for Document {
    fn from(text: String) -> Document {
        Document {
            text: OnceLock::from(text),
            pending: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for Document {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Document")
            .field("written", &self.text.get().is_some())
            .finish()
    }
}

/// Writes the document for `inv`, which failed with `error`; input bytes are
/// included when all of them together fit in `max_bytes`. (Symbolises the site now;
/// [`Document::new`] leaves that to the first read.)
pub fn document(inv: &Invocation<'_>, error: &Error, max_bytes: u64) -> String {
    Document::new(inv, error, max_bytes).text().to_owned()
}

/// Fills in the site's frames and writes the text.
fn render(doc: &mut Value, site: &Site) -> String {
    let frames: Vec<Value> = site
        .frames()
        .iter()
        .map(|f| json!({ "file": f.file(), "line": f.line(), "function": f.function() }))
        .collect();
    doc["site"] = Value::Array(frames);
    serde_json::to_string_pretty(doc).unwrap_or_default()
}

/// What a document records about one input.
struct InputRecord {
    dtype: DType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    layout: String,
    device: String,
    read_only: bool,
    /// Its bytes in hexadecimal, when included.
    bytes: Option<String>,
}

/// What a document records, taken when the invocation fails and written as JSON only
/// when read: a parsed JSON document costs several times this (about 5 KB for two
/// small inputs), and every unobserved failure keeps its document until evaluated.
struct Record {
    op: String,
    args: Args,
    inputs: Vec<InputRecord>,
    input_bytes: u64,
    bytes_included: bool,
    sample: Option<usize>,
    mode: EvalMode,
    backend: String,
    error_kind: &'static str,
    error_message: String,
}

impl Record {
    fn new(inv: &Invocation<'_>, error: &Error, max_bytes: u64) -> Record {
        let total: u64 = inv.inputs.iter().map(|t| t.nbytes() as u64).sum();
        let with_bytes =
            total <= max_bytes && inv.inputs.iter().all(|t| t.device().host_accessible());
        let inputs = inv
            .inputs
            .iter()
            .map(|t| InputRecord {
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                strides: t.strides().to_vec(),
                layout: t.layout().to_string(),
                device: t.device().to_string(),
                read_only: t.read_only(),
                bytes: with_bytes
                    .then(|| t.compact_bytes().ok().map(|b| hex(&b)))
                    .flatten(),
            })
            .collect();
        Record {
            op: inv.op.to_string(),
            args: inv.args.clone(),
            inputs,
            input_bytes: total,
            bytes_included: with_bytes,
            sample: inv.sample,
            mode: inv.mode,
            backend: inv.backend.clone(),
            error_kind: error.kind().name(),
            error_message: error.message().to_string(),
        }
    }

    /// The document with a null site, to be filled in by [`render`].
    fn unsited(&self) -> Value {
        let inputs: Vec<Value> = self
            .inputs
            .iter()
            .map(|t| {
                json!({
                    "dtype": t.dtype.name(),
                    "shape": t.shape,
                    "strides": t.strides,
                    "layout": t.layout,
                    "device": t.device,
                    "read_only": t.read_only,
                    "bytes": t.bytes,
                })
            })
            .collect();
        let args: Vec<Value> = self
            .args
            .entries()
            .iter()
            .map(|(n, v)| arg_json(n, v))
            .collect();
        json!({
            "ndx_repro": FORMAT,
            "ndx_version": env!("CARGO_PKG_VERSION"),
            "op": self.op,
            "args": args,
            "inputs": inputs,
            "input_bytes": self.input_bytes,
            "bytes_included": self.bytes_included,
            "sample": self.sample,
            "mode": mode_name(self.mode),
            "backend": self.backend,
            "site": Value::Null,
            "error": { "kind": self.error_kind, "message": self.error_message },
        })
    }
}

/// A parsed document, ready to be invoked again.
pub struct Replay {
    /// Operator name.
    pub op: String,
    /// Its arguments.
    pub args: Args,
    /// The inputs, rebuilt from their bytes (compact).
    pub inputs: Vec<Arc<Tensor>>,
    /// The recorded eval mode.
    pub mode: EvalMode,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::value(format!("repro document: {what}"))
}

fn field<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a Value> {
    v.get(key)
        .ok_or_else(|| bad(format!("{at} has no \"{key}\"")))
}

fn str_field<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a str> {
    field(v, key, at)?
        .as_str()
        .ok_or_else(|| bad(format!("{at}.{key} is not a string")))
}

fn ints_of(v: &Value, at: &str) -> Result<Vec<i64>> {
    v.as_array()
        .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| bad(format!("{at} is not an array of integers")))
}

fn arg_of(a: &Value, i: usize) -> Result<(String, ArgValue)> {
    let at = format!("args[{i}]");
    let name = str_field(a, "name", &at)?.to_string();
    let ty = str_field(a, "type", &at)?;
    let v = field(a, "value", &at)?;
    let wrong = || {
        let spelled = if ty.starts_with("float") {
            " (numbers, or \"nan\", \"inf\" and \"-inf\")"
        } else {
            ""
        };
        bad(format!(
            "{at} ('{name}') has a value that is not {ty}{spelled}"
        ))
    };
    let value = match ty {
        "int" => ArgValue::Int(v.as_i64().ok_or_else(wrong)?),
        "float" => ArgValue::Float(float_of(v).ok_or_else(wrong)?),
        "bool" => ArgValue::Bool(v.as_bool().ok_or_else(wrong)?),
        "string" => ArgValue::Str(crate::error::to_cstring(v.as_str().ok_or_else(wrong)?)),
        "ints" => ArgValue::Ints(ints_of(v, &at)?),
        "floats" => ArgValue::Floats(
            v.as_array()
                .and_then(|a| a.iter().map(float_of).collect::<Option<Vec<_>>>())
                .ok_or_else(wrong)?,
        ),
        "dtype" => {
            let n = v.as_str().ok_or_else(wrong)?;
            ArgValue::DType(
                DType::from_name(n).ok_or_else(|| bad(format!("{at}: unknown dtype '{n}'")))?,
            )
        }
        other => return Err(bad(format!("{at} has unknown type '{other}'"))),
    };
    Ok((name, value))
}

fn input_of(t: &Value, i: usize) -> Result<Arc<Tensor>> {
    let at = format!("inputs[{i}]");
    let name = str_field(t, "dtype", &at)?;
    let dtype =
        DType::from_name(name).ok_or_else(|| bad(format!("{at}: unknown dtype '{name}'")))?;
    let shape = ints_of(field(t, "shape", &at)?, &format!("{at}.shape"))?;
    // Checked here so that errors name the document's field, not an "output": the
    // same limits as a tensor imported from C (ndim, sizes, layout).
    if shape.len() > MAX_NDIM as usize {
        return Err(bad(format!(
            "{at}.shape has {} dimensions, expected at most {MAX_NDIM} (NDX_MAX_NDIM)",
            shape.len()
        )));
    }
    if let Some((k, d)) = shape.iter().enumerate().find(|(_, d)| **d < 0) {
        return Err(bad(format!(
            "{at}.shape[{k}] is {d}, expected a non-negative size (shape {})",
            crate::tensor::dims(&shape)
        )));
    }
    let geometry = crate::tensor::validate_geometry(
        &format!("repro document: {at}"),
        1,
        &shape,
        None,
        dtype.itemsize(),
        0,
    )?;
    let layout = match t.get("layout") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(bad(format!("{at}.layout is not a string"))),
    };
    let layout = validate_layout(layout, shape.len(), &format!("repro document: {at}"))?;
    let hexed = match field(t, "bytes", &at)? {
        Value::String(s) => s,
        Value::Null => {
            return Err(bad(format!(
                "{at} has no bytes: the context that wrote it capped them (repro_max_bytes); \
                 raise the cap and reproduce the failure again"
            )));
        }
        _ => {
            return Err(bad(format!(
                "{at}.bytes is not a string of hexadecimal digits"
            )));
        }
    };
    // The declared size is checked against the bytes given before anything is
    // allocated: a hostile document may declare terabytes and carry two digits.
    if !hexed.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad(format!("{at}.bytes is not hexadecimal")));
    }
    let need = geometry.numel * dtype.itemsize();
    if hexed.len() != need.saturating_mul(2) {
        return Err(bad(format!(
            "{at}.bytes has {} hexadecimal digits, expected {}: two per byte of its \
             {need}-byte data (dtype {}, shape {})",
            hexed.len(),
            need.saturating_mul(2),
            dtype.name(),
            crate::tensor::dims(&shape),
        )));
    }
    let bytes = unhex(hexed).ok_or_else(|| bad(format!("{at}.bytes is not hexadecimal")))?;
    let tensor = Tensor::new_host(dtype, &shape, layout, |out| {
        if out.len() != bytes.len() {
            return Err(bad(format!(
                "{at} has {} bytes, its dtype and shape need {}",
                bytes.len(),
                out.len()
            )));
        }
        out.copy_from_slice(&bytes);
        Ok(())
    })?;
    Ok(Arc::new(tensor))
}

/// A JSON value read as `serde_json::Value` is, except that an object naming a key
/// twice is refused: `Value` keeps the last silently, and a document arrives attached
/// to a bug report, so which of two "op"s or "inputs" it meant is not ours to guess.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "key \"{key}\" appears twice in one object"
                )));
            }
            let Strict(v) = map.next_value()?;
            object.insert(key, v);
        }
        Ok(Value::Object(object))
    }
}

/// Parses a document written by [`document`].
pub fn parse(text: &str) -> Result<Replay> {
    let Strict(doc) = serde_json::from_str(text).map_err(|e| match e.classify() {
        // Well-formed JSON that the strict reading refuses (a repeated key).
        serde_json::error::Category::Data => bad(e.to_string()),
        _ => bad(format!("not valid JSON ({e})")),
    })?;
    let format = field(&doc, "ndx_repro", "the document")?.as_u64();
    if format != Some(FORMAT) {
        return Err(bad(format!(
            "format {} is not supported (this ndx reads format {FORMAT})",
            field(&doc, "ndx_repro", "the document")?
        )));
    }
    let op = str_field(&doc, "op", "the document")?.to_string();
    let listed = field(&doc, "args", "the document")?
        .as_array()
        .ok_or_else(|| bad("args is not an array"))?;
    // Names are told apart with a set: a search per argument, as `Args::set` makes,
    // is quadratic in a hostile document's thousands of arguments.
    let mut seen = HashMap::with_capacity(listed.len());
    let mut entries = Vec::with_capacity(listed.len());
    for (i, a) in listed.iter().enumerate() {
        let (name, value) = arg_of(a, i)?;
        if let Some(first) = seen.insert(name.clone(), i) {
            return Err(bad(format!(
                "args[{i}] sets '{name}' again (args[{first}] set it first)"
            )));
        }
        entries.push((name, value));
    }
    let args = Args::from_distinct(entries);
    let inputs = field(&doc, "inputs", "the document")?
        .as_array()
        .ok_or_else(|| bad("inputs is not an array"))?
        .iter()
        .enumerate()
        .map(|(i, t)| input_of(t, i))
        .collect::<Result<Vec<_>>>()?;
    let mode_text = str_field(&doc, "mode", "the document")?;
    let mode = [
        EvalMode::SyncCpu,
        EvalMode::SyncFull,
        EvalMode::Deferred,
        EvalMode::Eager,
    ]
    .into_iter()
    .find(|m| mode_name(*m) == mode_text)
    .ok_or_else(|| bad(format!("unknown mode '{mode_text}'")))?;
    Ok(Replay {
        op,
        args,
        inputs,
        mode,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::error::Error;
    use crate::exec::{Args, CallSite, EvalMode, Input, Node, Settings, new_context};

    fn i32s(values: &[i32]) -> Input {
        Input::host(values, &[values.len() as i64]).unwrap()
    }

    fn failure(node: &Arc<Node>) -> Error {
        node.wait(None).unwrap();
        match node.result() {
            Some(Err(e)) => e.clone(),
            _ => panic!("did not fail"),
        }
    }

    /// A failing invocation builds its repro document on the worker, but symbolises its
    /// site only when the document is read, once, however often it is read.
    #[test]
    fn a_failure_symbolises_its_site_only_when_its_document_is_read() {
        let ctx = new_context(
            Settings {
                mode: EvalMode::Eager,
                ..Settings::default()
            },
            2,
        );
        let (a, b) = (i32s(&[7, 8]), i32s(&[1, 0]));
        let r = ctx.invoke(
            "floordiv",
            vec![a, b],
            Args::new(),
            None,
            CallSite::default(),
        );
        let e = failure(&r.unwrap());
        let site = e.site().expect("a site").clone();
        assert_eq!(
            site.resolutions(),
            0,
            "the failure symbolised its site before anyone read it"
        );
        // The error travels on (cloned, dropped) unread: still nothing resolved.
        drop(e.clone());
        assert_eq!(site.resolutions(), 0);

        let text = e.repro().expect("a document").to_owned();
        assert_eq!(site.resolutions(), 1);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["op"], "floordiv");
        assert_eq!(doc["inputs"][1]["bytes"], "0100000000000000");
        // (Inside ndx's own tests the test function is trimmed as one of ndx's frames:
        // the frames left are the test harness's.)
        let frames: Vec<serde_json::Value> = e
            .frames()
            .iter()
            .map(|f| {
                serde_json::json!({ "file": f.file(), "line": f.line(), "function": f.function() })
            })
            .collect();
        assert!(!frames.is_empty());
        assert_eq!(doc["site"], serde_json::Value::Array(frames));
        // Read again, from a clone: no new symbolisation, the same text.
        assert_eq!(e.clone().repro(), Some(text.as_str()));
        assert_eq!(site.resolutions(), 1);
    }
}
