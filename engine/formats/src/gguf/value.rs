//! GGUF metadata values: the thirteen value types of the format, typed arrays (nested arrays included)
//! and the ggml tensor types named by tensor infos. Pure data; parsing lives in `reader.rs`.
//! Arrays keep their element type in the variant so a 49k-entry vocabulary stays one `Vec<String>`.

use std::fmt;

/// Type ids of metadata values, as written in the file.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(GgufArray),
}

/// A metadata array; every element has the same type.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// An array of arrays; each inner array may have its own element type.
    Array(Vec<GgufArray>),
}

impl GgufValue {
    /// The format's name for this value's type, used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(a) => a.type_name(),
        }
    }

    /// The value as a signed 128-bit integer when it is any integer type.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    /// True when the array has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The format's name for this array type, used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "array of u8",
            GgufArray::I8(_) => "array of i8",
            GgufArray::U16(_) => "array of u16",
            GgufArray::I16(_) => "array of i16",
            GgufArray::U32(_) => "array of u32",
            GgufArray::I32(_) => "array of i32",
            GgufArray::U64(_) => "array of u64",
            GgufArray::I64(_) => "array of i64",
            GgufArray::F32(_) => "array of f32",
            GgufArray::F64(_) => "array of f64",
            GgufArray::Bool(_) => "array of bool",
            GgufArray::String(_) => "array of string",
            GgufArray::Array(_) => "array of array",
        }
    }

    /// Every element widened to i64 when this is an integer array whose values all fit.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn widen<T: Copy + TryInto<i64>>(v: &[T]) -> Option<Vec<i64>> {
            v.iter().map(|x| (*x).try_into().ok()).collect()
        }
        match self {
            GgufArray::U8(v) => widen(v),
            GgufArray::I8(v) => widen(v),
            GgufArray::U16(v) => widen(v),
            GgufArray::I16(v) => widen(v),
            GgufArray::U32(v) => widen(v),
            GgufArray::I32(v) => widen(v),
            GgufArray::U64(v) => widen(v),
            GgufArray::I64(v) => widen(v),
            _ => None,
        }
    }
}

/// A ggml tensor element type, by its id in the file. Unknown ids are kept, not rejected: the
/// metadata reader does not need them, and a newer file should still open for token counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// (name, elements per block, bytes per block) for the types this crate knows.
    fn layout(self) -> Option<(&'static str, u64, u64)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 36),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            30 => ("BF16", 1, 2),
            _ => return None,
        })
    }

    /// The ggml name ("Q4_1", "F32", ...), or None for an id this crate does not know.
    pub fn name(self) -> Option<&'static str> {
        self.layout().map(|l| l.0)
    }

    /// Bytes taken by `elements` elements, or None when the type is unknown or the count is not a
    /// whole number of blocks.
    pub fn byte_size(self, elements: u64) -> Option<u64> {
        let (_, block, bytes) = self.layout()?;
        if !elements.is_multiple_of(block) {
            return None;
        }
        (elements / block).checked_mul(bytes)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "ggml type {}", self.0),
        }
    }
}

/// Where one tensor lives: its name, shape (ggml order: innermost dimension first), element type
/// and byte offset relative to the start of the data section.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of the dimensions), or None on overflow.
    pub fn element_count(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |acc, d| acc.checked_mul(*d))
    }

    /// Bytes of tensor data, when the type's layout is known.
    pub fn byte_size(&self) -> Option<u64> {
        self.ggml_type.byte_size(self.element_count()?)
    }
}
