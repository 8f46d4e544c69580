//! GGUF reader (format versions 2 and 3): header, metadata key/values, tensor infos, alignment and
//! the start of the data section. It reads metadata through a `BufReader` and never touches tensor
//! data, so opening a 100 MB model for its tokenizer costs a few MB of reads. Dequantizing tensor
//! data is left to the engine; `TensorInfo` and `data_offset` say where each tensor's bytes are, and
//! `dequant` turns them into f32.

mod dequant;
mod error;
mod reader;
mod value;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

pub use dequant::{bf16_to_f32, dequantize, f16_to_f32, DequantError};
pub use error::{GgufError, Result};
pub use value::{GgmlType, GgufArray, GgufValue, TensorInfo};

use reader::Reader;

/// "GGUF" read as a little-endian u32.
const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGUF allows at most this many dimensions per tensor.
const MAX_DIMS: u32 = 4;

/// The parsed metadata of a GGUF file.
#[derive(Debug, Clone)]
pub struct Gguf {
    version: u32,
    /// Key/value pairs in file order.
    metadata: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
}

impl Gguf {
    /// Opens a GGUF file and reads its header, metadata and tensor infos (not the tensor data).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        Self::read_from(BufReader::with_capacity(1 << 16, file), len)
    }

    /// Reads a GGUF header from any reader; `source_len` is the total length of the source in bytes,
    /// used to reject lengths that cannot fit and to check that tensor data lies inside the file.
    pub fn read_from<R: Read>(reader: R, source_len: u64) -> Result<Self> {
        let mut r = Reader::new(reader, source_len);

        let mut magic = [0u8; 4];
        r.read_exact(&mut magic).map_err(|e| e.context(|| "magic".into()))?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = r.read_u32().map_err(|e| e.context(|| "version".into()))?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = r.read_u64().map_err(|e| e.context(|| "tensor count".into()))?;
        let kv_count = r.read_u64().map_err(|e| e.context(|| "metadata count".into()))?;

        let (metadata, index) = read_metadata(&mut r, kv_count)?;
        let mut gguf =
            Gguf { version, metadata, index, tensors: Vec::new(), alignment: DEFAULT_ALIGNMENT, data_offset: 0, file_len: source_len };
        gguf.alignment = match gguf.get_u64_opt("general.alignment")? {
            Some(a) if a == 0 || !a.is_power_of_two() => return Err(GgufError::BadAlignment(a)),
            Some(a) => a,
            None => DEFAULT_ALIGNMENT,
        };
        gguf.tensors = read_tensor_infos(&mut r, tensor_count)?;
        gguf.data_offset = r.position().div_ceil(gguf.alignment) * gguf.alignment;
        gguf.check_tensors()?;
        Ok(gguf)
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset where the data section starts; a tensor's bytes are at
    /// `data_offset() + tensor.offset`.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The bytes of `info`'s data inside `file` (the whole GGUF file, read or mapped).
    pub fn tensor_bytes<'a>(&self, file: &'a [u8], info: &TensorInfo) -> std::result::Result<&'a [u8], DequantError> {
        let size = info.byte_size().ok_or_else(|| DequantError::Unsupported { tensor: info.name.clone(), ggml_type: info.ggml_type })?;
        let start = self.data_offset.saturating_add(info.offset);
        let end = start.saturating_add(size);
        if end > file.len() as u64 {
            let actual = (file.len() as u64).saturating_sub(start);
            return Err(DequantError::Size {
                tensor: info.name.clone(),
                ggml_type: info.ggml_type,
                elements: info.element_count().unwrap_or(0),
                expected: size,
                actual,
            });
        }
        Ok(&file[start as usize..end as usize])
    }

    /// Dequantizes tensor `name` from `file` (the whole GGUF file) to f32.
    pub fn dequantize_tensor(&self, file: &[u8], name: &str) -> std::result::Result<Vec<f32>, DequantError> {
        let info = self.tensor(name).ok_or_else(|| DequantError::Missing { tensor: name.to_string() })?;
        let bytes = self.tensor_bytes(file, info)?;
        dequantize(&info.name, info.ggml_type, bytes, info.element_count().unwrap_or(0))
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Metadata key/values in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The raw value of a key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// True when the key is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn require(&self, key: &str) -> Result<&GgufValue> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, found: &GgufValue) -> GgufError {
        GgufError::WrongType { key: key.to_string(), expected, found: found.type_name() }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            GgufValue::String(s) => Ok(s),
            v => Err(Self::wrong(key, "string", v)),
        }
    }

    /// A string value, or None when the key is absent.
    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, target: &'static str) -> Result<T> {
        let v = self.require(key)?;
        let i = v.as_integer().ok_or_else(|| Self::wrong(key, target, v))?;
        T::try_from(i).map_err(|_| GgufError::OutOfRange { key: key.to_string(), value: i, target })
    }

    /// An integer value of any integer type that fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_int(key, "u32")
    }

    /// Like [`Gguf::get_u32`], or None when the key is absent.
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|_| self.get_u32(key)).transpose()
    }

    /// An integer value of any integer type that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_int(key, "u64")
    }

    /// Like [`Gguf::get_u64`], or None when the key is absent.
    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|_| self.get_u64(key)).transpose()
    }

    /// An integer value of any integer type that fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_int(key, "i64")
    }

    /// A float value (f32, or f64 narrowed to f32).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            GgufValue::F32(f) => Ok(*f),
            GgufValue::F64(f) => Ok(*f as f32),
            v => Err(Self::wrong(key, "f32", v)),
        }
    }

    /// A float value as f64 (f32 widened).
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        match self.require(key)? {
            GgufValue::F32(f) => Ok(f64::from(*f)),
            GgufValue::F64(f) => Ok(*f),
            v => Err(Self::wrong(key, "f64", v)),
        }
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }

    /// Like [`Gguf::get_bool`], or None when the key is absent.
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|_| self.get_bool(key)).transpose()
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<&GgufArray> {
        match self.require(key)? {
            GgufValue::Array(a) => Ok(a),
            v => Err(Self::wrong(key, "array", v)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        match self.require(key)? {
            GgufValue::Array(GgufArray::String(v)) => Ok(v),
            v => Err(Self::wrong(key, "array of string", v)),
        }
    }

    /// An array of any integer type, widened to i64.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        let v = self.require(key)?;
        match v {
            GgufValue::Array(a) => a.to_i64_vec().ok_or_else(|| Self::wrong(key, "array of integers", v)),
            _ => Err(Self::wrong(key, "array of integers", v)),
        }
    }

    /// An array of f32 (f64 elements narrowed).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        match self.require(key)? {
            GgufValue::Array(GgufArray::F32(v)) => Ok(v.clone()),
            GgufValue::Array(GgufArray::F64(v)) => Ok(v.iter().map(|f| *f as f32).collect()),
            v => Err(Self::wrong(key, "array of f32", v)),
        }
    }

    /// Checks that every tensor's data is aligned and, where its size is known, inside the file.
    fn check_tensors(&self) -> Result<()> {
        for t in &self.tensors {
            if t.offset % self.alignment != 0 {
                return Err(GgufError::MisalignedTensor { name: t.name.clone(), offset: t.offset, alignment: self.alignment });
            }
            if let Some(size) = t.byte_size() {
                let end = self.data_offset.checked_add(t.offset).and_then(|s| s.checked_add(size));
                if end.is_none_or(|end| end > self.file_len) {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        offset: self.data_offset.saturating_add(t.offset),
                        size,
                        file_len: self.file_len,
                    });
                }
            }
        }
        Ok(())
    }
}

type Metadata = (Vec<(String, GgufValue)>, HashMap<String, usize>);

fn read_metadata<R: Read>(r: &mut Reader<R>, kv_count: u64) -> Result<Metadata> {
    let mut metadata = Vec::new();
    let mut index = HashMap::new();
    for i in 0..kv_count {
        let key = r.read_string().map_err(|e| e.context(|| format!("key of metadata entry {i}")))?;
        let ty = r.read_type_id().map_err(|e| e.context(|| format!("value type of key '{key}'")))?;
        let value = r.read_value(ty).map_err(|e| e.context(|| format!("value of key '{key}'")))?;
        if index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey(key));
        }
        metadata.push((key, value));
    }
    Ok((metadata, index))
}

fn read_tensor_infos<R: Read>(r: &mut Reader<R>, tensor_count: u64) -> Result<Vec<TensorInfo>> {
    let mut tensors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for i in 0..tensor_count {
        let name = r.read_string().map_err(|e| e.context(|| format!("name of tensor info {i}")))?;
        let n_dims = r.read_u32().map_err(|e| e.context(|| format!("dimension count of tensor '{name}'")))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { name, n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(r.read_u64().map_err(|e| e.context(|| format!("dimension {d} of tensor '{name}'")))?);
        }
        let ggml_type = r.read_u32().map_err(|e| e.context(|| format!("type of tensor '{name}'")))?;
        let offset = r.read_u64().map_err(|e| e.context(|| format!("data offset of tensor '{name}'")))?;
        if !seen.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor(name));
        }
        tensors.push(TensorInfo { name, dims, ggml_type: GgmlType(ggml_type), offset });
    }
    Ok(tensors)
}
