//! Named arguments of an invocation.

use std::ffi::CString;

use crate::error::{Error, Result};
use crate::tensor::DType;

/// One argument value.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(CString),
    /// An array of integers.
    Ints(Vec<i64>),
    /// An array of floats.
    Floats(Vec<f64>),
    /// A dtype.
    DType(DType),
}

/// A numeric argument as given: an integer kept exact (an `int64` beyond 2^53 is not
/// a double), or a float. Integer bounds (`clamp`, `check_range`) compare exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// An integer argument.
    Int(i64),
    /// A float argument.
    Float(f64),
}

impl Num {
    /// The value as a double (an integer beyond 2^53 rounds).
    pub fn to_f64(self) -> f64 {
        match self {
            Num::Int(v) => v as f64,
            Num::Float(v) => v,
        }
    }

    /// Whether the value is NaN.
    pub fn is_nan(self) -> bool {
        matches!(self, Num::Float(v) if v.is_nan())
    }

    /// The least integer not below the value (saturating to the `i128` range; -inf
    /// gives `i128::MIN`, NaN 0): the least integer a lower bound admits.
    pub fn ceil_int(self) -> i128 {
        match self {
            Num::Int(v) => i128::from(v),
            Num::Float(v) => v.ceil() as i128,
        }
    }

    /// The greatest integer not above the value (saturating; +inf gives `i128::MAX`):
    /// the greatest integer an upper bound admits.
    pub fn floor_int(self) -> i128 {
        match self {
            Num::Int(v) => i128::from(v),
            Num::Float(v) => v.floor() as i128,
        }
    }

    /// Exactly `self > other` (false when either is NaN).
    pub fn gt(self, other: Num) -> bool {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a > b,
            (Num::Float(a), Num::Float(b)) => a > b,
            // An integer is above x exactly when it is above floor(x), and x is above
            // an integer exactly when ceil(x) is.
            (Num::Int(a), Num::Float(b)) => !b.is_nan() && i128::from(a) > other.floor_int(),
            (Num::Float(a), Num::Int(b)) => !a.is_nan() && self.ceil_int() > i128::from(b),
        }
    }
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Num::Int(v) => write!(f, "{v}"),
            Num::Float(v) => write!(f, "{v}"),
        }
    }
}

/// The kinds of argument values, as schemas name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ArgType {
    /// `ArgValue::Int`.
    Int = 1,
    /// `ArgValue::Float` (an integer is accepted and converted).
    Float = 2,
    /// `ArgValue::Bool`.
    Bool = 3,
    /// `ArgValue::Str`.
    Str = 4,
    /// `ArgValue::Ints`.
    Ints = 5,
    /// `ArgValue::Floats` (a float, an int or an int array is accepted and converted).
    Floats = 6,
    /// `ArgValue::DType`.
    DType = 7,
}

impl ArgType {
    /// The type with ABI value `raw`.
    pub fn from_raw(raw: i32) -> Option<ArgType> {
        use ArgType::*;
        [Int, Float, Bool, Str, Ints, Floats, DType]
            .into_iter()
            .find(|t| *t as i32 == raw)
    }

    /// The name with its article, for messages: "an int", "a float array".
    pub fn a(self) -> String {
        let name = self.name();
        let article = if matches!(self, ArgType::Int | ArgType::Ints) {
            "an"
        } else {
            "a"
        };
        format!("{article} {name}")
    }

    /// What a value of this type may be given as, for messages: [`ArgType::a`] with
    /// the other forms accepted and converted ("a float or an int").
    pub fn accepted(self) -> String {
        match self {
            ArgType::Float => "a float or an int".to_string(),
            ArgType::Ints => "an int array or an int".to_string(),
            ArgType::Floats => "a float array (or a float, an int or an int array)".to_string(),
            other => other.a(),
        }
    }

    /// A name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ArgType::Int => "int",
            ArgType::Float => "float",
            ArgType::Bool => "bool",
            ArgType::Str => "string",
            ArgType::Ints => "int array",
            ArgType::Floats => "float array",
            ArgType::DType => "dtype",
        }
    }
}

impl ArgValue {
    /// The value's type.
    pub fn arg_type(&self) -> ArgType {
        match self {
            ArgValue::Int(_) => ArgType::Int,
            ArgValue::Float(_) => ArgType::Float,
            ArgValue::Bool(_) => ArgType::Bool,
            ArgValue::Str(_) => ArgType::Str,
            ArgValue::Ints(_) => ArgType::Ints,
            ArgValue::Floats(_) => ArgType::Floats,
            ArgValue::DType(_) => ArgType::DType,
        }
    }
}

/// Named arguments, in the order they were set (a later set replaces an earlier one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Args {
    entries: Vec<(String, ArgValue)>,
}

impl Args {
    /// No arguments.
    pub fn new() -> Args {
        Args::default()
    }

    /// Sets `name` to `value`.
    pub fn set(&mut self, name: &str, value: ArgValue) {
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((name.to_string(), value)),
        }
    }

    /// Arguments from entries whose names are distinct, in their order: no search per
    /// entry, as [`Args::set`] makes (a parsed document may list many).
    pub(crate) fn from_distinct(entries: Vec<(String, ArgValue)>) -> Args {
        Args { entries }
    }

    /// The entries, consumed.
    pub(crate) fn into_entries(self) -> Vec<(String, ArgValue)> {
        self.entries
    }

    /// Builder form of [`Args::set`].
    pub fn with(mut self, name: &str, value: ArgValue) -> Args {
        self.set(name, value);
        self
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&ArgValue> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// All entries.
    pub fn entries(&self) -> &[(String, ArgValue)] {
        &self.entries
    }

    fn wrong(name: &str, want: ArgType, got: &ArgValue) -> Error {
        Error::type_error(format!(
            "argument '{name}' is {}, expected {}",
            got.arg_type().a(),
            want.a()
        ))
    }

    /// `name` as an integer, `default` when absent.
    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        match self.get(name) {
            None => Ok(default),
            Some(ArgValue::Int(v)) => Ok(*v),
            Some(v) => Err(Args::wrong(name, ArgType::Int, v)),
        }
    }

    /// `name` as a bool, `default` when absent.
    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None => Ok(default),
            Some(ArgValue::Bool(v)) => Ok(*v),
            Some(v) => Err(Args::wrong(name, ArgType::Bool, v)),
        }
    }

    /// `name` as a float, if present (an integer converts).
    pub fn float(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(ArgValue::Float(v)) => Ok(Some(*v)),
            Some(ArgValue::Int(v)) => Ok(Some(*v as f64)),
            Some(v) => Err(Args::wrong(name, ArgType::Float, v)),
        }
    }

    /// `name` as a number, if present: an integer stays exact (see [`Num`]).
    pub fn number(&self, name: &str) -> Result<Option<Num>> {
        match self.get(name) {
            None => Ok(None),
            Some(ArgValue::Float(v)) => Ok(Some(Num::Float(*v))),
            Some(ArgValue::Int(v)) => Ok(Some(Num::Int(*v))),
            Some(v) => Err(Args::wrong(name, ArgType::Float, v)),
        }
    }

    /// `name` as a string, if present (invalid UTF-8 replaced).
    pub fn string(&self, name: &str) -> Result<Option<String>> {
        match self.get(name) {
            None => Ok(None),
            Some(ArgValue::Str(s)) => Ok(Some(s.to_string_lossy().into_owned())),
            Some(v) => Err(Args::wrong(name, ArgType::Str, v)),
        }
    }

    /// `name` as a dtype, if present.
    pub fn dtype(&self, name: &str) -> Result<Option<DType>> {
        match self.get(name) {
            None => Ok(None),
            Some(ArgValue::DType(d)) => Ok(Some(*d)),
            Some(v) => Err(Args::wrong(name, ArgType::DType, v)),
        }
    }

    /// `name` as an integer array, if present (a single integer counts as one).
    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.get(name) {
            None => Ok(None),
            Some(ArgValue::Ints(v)) => Ok(Some(v.clone())),
            Some(ArgValue::Int(v)) => Ok(Some(vec![*v])),
            Some(v) => Err(Args::wrong(name, ArgType::Ints, v)),
        }
    }
}
