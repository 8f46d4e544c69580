//! Errors of the GGUF reader and of its typed getters. Each parse error names what was being read
//! (for example "value of key 'tokenizer.ggml.tokens', element 512") and the byte offset, so a
//! corrupt or truncated model file can be diagnosed without a hex editor.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("I/O error while reading {what} at byte {offset}: {source}")]
    Read {
        what: String,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("GGUF file is truncated: it ended while reading {what} at byte {offset}; fetch the file again")]
    Truncated { what: String, offset: u64 },
    #[error("not a GGUF file: magic is {found:?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (this reader knows versions 2 and 3; a byte-swapped version means a big-endian file)")]
    UnsupportedVersion(u32),
    #[error("unknown GGUF value type {type_id} while reading {what} at byte {offset}")]
    UnknownValueType { type_id: u32, what: String, offset: u64 },
    #[error("invalid UTF-8 in {what} at byte {offset}")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("{what} at byte {offset} claims length {len}, more than the {remaining} bytes left in the file")]
    LengthTooLarge { what: String, offset: u64, len: u64, remaining: u64 },
    #[error("invalid bool byte {byte} in {what} at byte {offset}")]
    InvalidBool { what: String, offset: u64, byte: u8 },
    #[error("metadata key '{0}' appears twice")]
    DuplicateKey(String),
    #[error("tensor '{0}' appears twice")]
    DuplicateTensor(String),
    #[error("general.alignment is {0}; it must be a non-zero power of two")]
    BadAlignment(u64),
    #[error("tensor '{name}' has {n_dims} dimensions; GGUF allows at most 4")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor '{name}' data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor { name: String, offset: u64, alignment: u64 },
    #[error("tensor '{name}' data ({size} bytes at offset {offset}) extends past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds { name: String, offset: u64, size: u64, file_len: u64 },
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    #[error("metadata key '{key}' holds {found}, expected {expected}")]
    WrongType { key: String, expected: &'static str, found: &'static str },
    #[error("metadata key '{key}' value {value} does not fit in {target}")]
    OutOfRange { key: String, value: i128, target: &'static str },
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
