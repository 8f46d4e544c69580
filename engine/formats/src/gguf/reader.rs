//! Low-level little-endian reading of GGUF primitives (integers, strings, typed values, arrays)
//! from any `Read`, tracking the byte offset. Errors are raised without context and get the name of
//! what was being read attached by the caller, only on the error path (no allocation per element).

use std::io::{self, Read};

use super::error::GgufError;
use super::value::{type_id, GgufArray, GgufValue};

/// Nesting limit for arrays of arrays; real files use one level, a corrupt one could recurse forever.
const MAX_ARRAY_DEPTH: usize = 8;

/// What went wrong at the lowest level, before the caller says what it was reading.
#[derive(Debug)]
pub(crate) enum LowKind {
    Eof,
    Io(io::Error),
    Utf8,
    TooLong { len: u64, remaining: u64 },
    UnknownType(u32),
    BadBool(u8),
}

#[derive(Debug)]
pub(crate) struct LowError {
    kind: LowKind,
    offset: u64,
    /// Element indices inside (nested) arrays, outermost first, e.g. ", element 3, element 7".
    path: String,
}

impl LowError {
    fn new(kind: LowKind, offset: u64) -> Self {
        LowError { kind, offset, path: String::new() }
    }

    fn in_element(mut self, index: u64) -> Self {
        self.path = format!(", element {index}{}", self.path);
        self
    }

    /// Attaches what was being read and turns this into the public error.
    pub(crate) fn context(self, what: impl FnOnce() -> String) -> GgufError {
        let what = format!("{}{}", what(), self.path);
        let offset = self.offset;
        match self.kind {
            LowKind::Eof => GgufError::Truncated { what, offset },
            LowKind::Io(source) => GgufError::Read { what, offset, source },
            LowKind::Utf8 => GgufError::InvalidUtf8 { what, offset },
            LowKind::TooLong { len, remaining } => GgufError::LengthTooLarge { what, offset, len, remaining },
            LowKind::UnknownType(type_id) => GgufError::UnknownValueType { type_id, what, offset },
            LowKind::BadBool(byte) => GgufError::InvalidBool { what, offset, byte },
        }
    }
}

pub(crate) type LowResult<T> = Result<T, LowError>;

/// A reader that knows its position and the total length of its source.
pub(crate) struct Reader<R> {
    inner: R,
    pos: u64,
    len: u64,
}

macro_rules! read_le {
    ($name:ident, $t:ty) => {
        pub(crate) fn $name(&mut self) -> LowResult<$t> {
            let mut buf = [0u8; std::mem::size_of::<$t>()];
            self.read_exact(&mut buf)?;
            Ok(<$t>::from_le_bytes(buf))
        }
    };
}

impl<R: Read> Reader<R> {
    pub(crate) fn new(inner: R, len: u64) -> Self {
        Reader { inner, pos: 0, len }
    }

    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    pub(crate) fn read_exact(&mut self, buf: &mut [u8]) -> LowResult<()> {
        let start = self.pos;
        match self.inner.read_exact(buf) {
            Ok(()) => {
                self.pos += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(LowError::new(LowKind::Eof, start)),
            Err(e) => Err(LowError::new(LowKind::Io(e), start)),
        }
    }

    read_le!(read_u8, u8);
    read_le!(read_i8, i8);
    read_le!(read_u16, u16);
    read_le!(read_i16, i16);
    read_le!(read_u32, u32);
    read_le!(read_i32, i32);
    read_le!(read_u64, u64);
    read_le!(read_i64, i64);
    read_le!(read_f32, f32);
    read_le!(read_f64, f64);

    fn read_bool(&mut self) -> LowResult<bool> {
        let at = self.pos;
        match self.read_u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(LowError::new(LowKind::BadBool(b), at)),
        }
    }

    /// Checks that `count` items of at least `min_size` bytes each can still be in the file, so a
    /// corrupt length never turns into a huge allocation.
    fn check_len(&self, count: u64, min_size: u64, at: u64) -> LowResult<usize> {
        let remaining = self.remaining();
        let needed = count.saturating_mul(min_size);
        if needed > remaining {
            return Err(LowError::new(LowKind::TooLong { len: count, remaining }, at));
        }
        usize::try_from(count).map_err(|_| LowError::new(LowKind::TooLong { len: count, remaining }, at))
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes (no terminator).
    pub(crate) fn read_string(&mut self) -> LowResult<String> {
        let at = self.pos;
        let len = self.read_u64()?;
        let len = self.check_len(len, 1, at)?;
        let mut bytes = vec![0u8; len];
        self.read_exact(&mut bytes)?;
        String::from_utf8(bytes).map_err(|_| LowError::new(LowKind::Utf8, at))
    }

    pub(crate) fn read_type_id(&mut self) -> LowResult<u32> {
        self.read_u32()
    }

    /// A value of the given type id (the id itself already read).
    pub(crate) fn read_value(&mut self, ty: u32) -> LowResult<GgufValue> {
        let at = self.pos;
        Ok(match ty {
            type_id::U8 => GgufValue::U8(self.read_u8()?),
            type_id::I8 => GgufValue::I8(self.read_i8()?),
            type_id::U16 => GgufValue::U16(self.read_u16()?),
            type_id::I16 => GgufValue::I16(self.read_i16()?),
            type_id::U32 => GgufValue::U32(self.read_u32()?),
            type_id::I32 => GgufValue::I32(self.read_i32()?),
            type_id::U64 => GgufValue::U64(self.read_u64()?),
            type_id::I64 => GgufValue::I64(self.read_i64()?),
            type_id::F32 => GgufValue::F32(self.read_f32()?),
            type_id::F64 => GgufValue::F64(self.read_f64()?),
            type_id::BOOL => GgufValue::Bool(self.read_bool()?),
            type_id::STRING => GgufValue::String(self.read_string()?),
            type_id::ARRAY => GgufValue::Array(self.read_array(0)?),
            other => return Err(LowError::new(LowKind::UnknownType(other), at)),
        })
    }

    /// An array: element type id (u32), element count (u64), then the elements.
    fn read_array(&mut self, depth: usize) -> LowResult<GgufArray> {
        let at = self.pos;
        let elem_ty = self.read_type_id()?;
        let count_at = self.pos;
        let count = self.read_u64()?;
        let min_size = match elem_ty {
            type_id::U8 | type_id::I8 | type_id::BOOL => 1,
            type_id::U16 | type_id::I16 => 2,
            type_id::U32 | type_id::I32 | type_id::F32 => 4,
            type_id::U64 | type_id::I64 | type_id::F64 | type_id::STRING => 8,
            type_id::ARRAY => 12,
            other => return Err(LowError::new(LowKind::UnknownType(other), at)),
        };
        let n = self.check_len(count, min_size, count_at)?;

        fn many<T, R: Read>(r: &mut Reader<R>, n: usize, mut one: impl FnMut(&mut Reader<R>) -> LowResult<T>) -> LowResult<Vec<T>> {
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                out.push(one(r).map_err(|e| e.in_element(i as u64))?);
            }
            Ok(out)
        }

        Ok(match elem_ty {
            type_id::U8 => GgufArray::U8(many(self, n, |r| r.read_u8())?),
            type_id::I8 => GgufArray::I8(many(self, n, |r| r.read_i8())?),
            type_id::U16 => GgufArray::U16(many(self, n, |r| r.read_u16())?),
            type_id::I16 => GgufArray::I16(many(self, n, |r| r.read_i16())?),
            type_id::U32 => GgufArray::U32(many(self, n, |r| r.read_u32())?),
            type_id::I32 => GgufArray::I32(many(self, n, |r| r.read_i32())?),
            type_id::U64 => GgufArray::U64(many(self, n, |r| r.read_u64())?),
            type_id::I64 => GgufArray::I64(many(self, n, |r| r.read_i64())?),
            type_id::F32 => GgufArray::F32(many(self, n, |r| r.read_f32())?),
            type_id::F64 => GgufArray::F64(many(self, n, |r| r.read_f64())?),
            type_id::BOOL => GgufArray::Bool(many(self, n, |r| r.read_bool())?),
            type_id::STRING => GgufArray::String(many(self, n, |r| r.read_string())?),
            _ => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(LowError::new(LowKind::UnknownType(type_id::ARRAY), at));
                }
                GgufArray::Array(many(self, n, |r| r.read_array(depth + 1))?)
            }
        })
    }
}
