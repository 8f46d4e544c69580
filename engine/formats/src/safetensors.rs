//! Hugging Face safetensors files: an 8-byte little-endian header length, a JSON header naming each
//! tensor's dtype, shape and byte range, then the raw data. Read whole (one file or the shards an
//! `model.safetensors.index.json` lists) and converted to f32 on request (F32, F16, BF16). Also writes
//! F32 files, so tests and tools can build checkpoints without Python.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::gguf::{bf16_to_f32, f16_to_f32};

#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a safetensors file: {detail}")]
    Format { path: PathBuf, detail: String },
    #[error("no tensor {0} in the checkpoint")]
    Missing(String),
    #[error("tensor {name} has dtype {dtype}; supported: F32, F16, BF16")]
    Dtype { name: String, dtype: String },
    #[error("{dir}: no model.safetensors, model.safetensors.index.json or *.safetensors")]
    NoFiles { dir: PathBuf },
}

/// One tensor's place in its file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub dtype: String,
    pub shape: Vec<usize>,
    file: usize,
    start: usize,
    end: usize,
}

/// The tensors of a checkpoint (possibly sharded).
#[derive(Debug, Default)]
pub struct SafeTensors {
    files: Vec<Vec<u8>>,
    tensors: BTreeMap<String, TensorEntry>,
}

impl SafeTensors {
    /// Every tensor of the checkpoint in `dir`: the shards of `model.safetensors.index.json`, else
    /// `model.safetensors`, else every `*.safetensors` file.
    pub fn open_dir(dir: &Path) -> Result<SafeTensors, SafetensorsError> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|source| SafetensorsError::Io { path: index.clone(), source })?;
            let value: Value = serde_json::from_str(&text).map_err(|e| format_error(&index, e.to_string()))?;
            let map = value.get("weight_map").and_then(Value::as_object).ok_or_else(|| format_error(&index, "no weight_map".into()))?;
            let mut shards: Vec<String> = map.values().filter_map(Value::as_str).map(str::to_string).collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|source| SafetensorsError::Io { path: dir.to_path_buf(), source })?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                .collect();
            all.sort();
            all
        };
        if files.is_empty() {
            return Err(SafetensorsError::NoFiles { dir: dir.to_path_buf() });
        }
        let mut checkpoint = SafeTensors::default();
        for path in files {
            checkpoint.add_file(&path)?;
        }
        Ok(checkpoint)
    }

    /// Reads one file's header and data.
    pub fn add_file(&mut self, path: &Path) -> Result<(), SafetensorsError> {
        let bytes = std::fs::read(path).map_err(|source| SafetensorsError::Io { path: path.to_path_buf(), source })?;
        let bad = |detail: String| format_error(path, detail);
        let len = bytes
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize)
            .ok_or_else(|| bad("shorter than 8 bytes".into()))?;
        let header_end =
            8usize.checked_add(len).filter(|&e| e <= bytes.len()).ok_or_else(|| bad(format!("header of {len} bytes past the end")))?;
        let header: Map<String, Value> = serde_json::from_slice(&bytes[8..header_end]).map_err(|e| bad(format!("header: {e}")))?;
        let file = self.files.len();
        for (name, info) in header {
            if name == "__metadata__" {
                continue;
            }
            let dtype = info.get("dtype").and_then(Value::as_str).ok_or_else(|| bad(format!("{name}: no dtype")))?.to_string();
            let shape: Vec<usize> = info
                .get("shape")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).map(|d| d as usize).collect())
                .ok_or_else(|| bad(format!("{name}: no shape")))?;
            let offsets: Vec<usize> = info
                .get("data_offsets")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).map(|d| d as usize).collect())
                .filter(|o: &Vec<usize>| o.len() == 2 && o[0] <= o[1])
                .ok_or_else(|| bad(format!("{name}: bad data_offsets")))?;
            let (start, end) = (header_end + offsets[0], header_end + offsets[1]);
            if end > bytes.len() {
                return Err(bad(format!("{name}: data past the end of the file")));
            }
            self.tensors.insert(name, TensorEntry { dtype, shape, file, start, end });
        }
        self.files.push(bytes);
        Ok(())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// A tensor as f32, row-major in its shape.
    pub fn f32(&self, name: &str) -> Result<Vec<f32>, SafetensorsError> {
        let e = self.tensors.get(name).ok_or_else(|| SafetensorsError::Missing(name.into()))?;
        let data = &self.files[e.file][e.start..e.end];
        let elements: usize = e.shape.iter().product();
        let size = match e.dtype.as_str() {
            "F32" => 4,
            "F16" | "BF16" => 2,
            other => return Err(SafetensorsError::Dtype { name: name.into(), dtype: other.into() }),
        };
        if data.len() != elements * size {
            return Err(SafetensorsError::Dtype {
                name: name.into(),
                dtype: format!("{} with {} bytes for {elements} elements", e.dtype, data.len()),
            });
        }
        Ok(match e.dtype.as_str() {
            "F32" => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            "F16" => data.chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
            _ => data.chunks_exact(2).map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
        })
    }

    /// An integer tensor (I64 or I32) as i64, row-major in its shape (DeepSeek-V4's `tid2eid`).
    pub fn i64(&self, name: &str) -> Result<Vec<i64>, SafetensorsError> {
        let e = self.tensors.get(name).ok_or_else(|| SafetensorsError::Missing(name.into()))?;
        let data = &self.files[e.file][e.start..e.end];
        let elements: usize = e.shape.iter().product();
        let size = match e.dtype.as_str() {
            "I64" => 8,
            "I32" => 4,
            other => return Err(SafetensorsError::Dtype { name: name.into(), dtype: other.into() }),
        };
        if data.len() != elements * size {
            return Err(SafetensorsError::Dtype {
                name: name.into(),
                dtype: format!("{} with {} bytes for {elements} elements", e.dtype, data.len()),
            });
        }
        Ok(match size {
            8 => data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect(),
            _ => data.chunks_exact(4).map(|b| i64::from(i32::from_le_bytes(b.try_into().expect("4 bytes")))).collect(),
        })
    }
}

/// Writes F32 tensors as one safetensors file (names sorted, as the reference writer does).
pub fn write_f32(path: &Path, tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>) -> Result<(), SafetensorsError> {
    let le = |data: &Vec<f32>| data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    write(path, tensors.iter().map(|(name, (shape, data))| (name.as_str(), "F32", shape.as_slice(), le(data))))
}

/// Writes I64 tensors (index tables) as one safetensors file.
pub fn write_i64(path: &Path, tensors: &BTreeMap<String, (Vec<usize>, Vec<i64>)>) -> Result<(), SafetensorsError> {
    let le = |data: &Vec<i64>| data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    write(path, tensors.iter().map(|(name, (shape, data))| (name.as_str(), "I64", shape.as_slice(), le(data))))
}

/// Writes `(name, dtype, shape, little-endian bytes)` in the given order.
fn write<'a>(path: &Path, tensors: impl Iterator<Item = (&'a str, &'static str, &'a [usize], Vec<u8>)>) -> Result<(), SafetensorsError> {
    let mut header = Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let offset = data.len();
        data.extend_from_slice(&bytes);
        header.insert(name.to_string(), json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, data.len()]}));
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).map_err(|e| format_error(path, e.to_string()))?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + data.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    out.extend_from_slice(&data);
    std::fs::write(path, out).map_err(|source| SafetensorsError::Io { path: path.to_path_buf(), source })
}

fn format_error(path: &Path, detail: String) -> SafetensorsError {
    SafetensorsError::Format { path: path.to_path_buf(), detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_tables_write_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut tables = BTreeMap::new();
        tables.insert("t".to_string(), (vec![2, 2], vec![3i64, -1, 1 << 40, 0]));
        write_i64(&dir.path().join("tables.safetensors"), &tables).unwrap();
        let st = SafeTensors::open_dir(dir.path()).unwrap();
        assert_eq!(st.i64("t").unwrap(), vec![3, -1, 1 << 40, 0]);
        assert_eq!(st.entry("t").unwrap().shape, vec![2, 2]);
    }

    #[test]
    fn writes_and_reads_back_and_converts_half_types() {
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = BTreeMap::new();
        tensors.insert("b".to_string(), (vec![2, 3], vec![1.0, -2.0, 0.5, 3.25, 0.0, 7.0]));
        tensors.insert("a".to_string(), (vec![1], vec![42.0]));
        write_f32(&dir.path().join("model.safetensors"), &tensors).unwrap();
        let st = SafeTensors::open_dir(dir.path()).unwrap();
        assert_eq!(st.names().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(st.f32("b").unwrap(), vec![1.0, -2.0, 0.5, 3.25, 0.0, 7.0]);
        assert_eq!(st.entry("b").unwrap().shape, vec![2, 3]);
        assert!(matches!(st.f32("c"), Err(SafetensorsError::Missing(_))));
        // A BF16 file written by hand: 1.0 = 0x3f80, -2.0 = 0xc000.
        let header = br#"{"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0x80, 0x3f, 0x00, 0xc0]);
        let path = dir.path().join("half.safetensors");
        std::fs::write(&path, bytes).unwrap();
        let mut half = SafeTensors::default();
        half.add_file(&path).unwrap();
        assert_eq!(half.f32("x").unwrap(), vec![1.0, -2.0]);
    }

    #[test]
    fn corrupt_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.safetensors");
        std::fs::write(&path, [200, 0, 0, 0, 0, 0, 0, 0, b'{']).unwrap();
        let mut st = SafeTensors::default();
        assert!(matches!(st.add_file(&path), Err(SafetensorsError::Format { .. })));
        assert!(matches!(SafeTensors::open_dir(&dir.path().join("none")), Err(SafetensorsError::Io { .. })));
    }
}
