//! One compiled kernel module as a self-checking byte string: what it was compiled from (a key over the
//! source's hash, the architecture, the compiler's version and the options) and its machine code with a
//! checksum. Both the on-disk cache (`cache`) and the modules built ahead of time (`build.rs`) hold
//! entries, and an entry is used only when its key is the one asked for and its checksum holds: a
//! stale, truncated, corrupt or foreign entry is rejected, never trusted. Needs only `sha2` and std, so
//! the build script shares this file.

use sha2::{Digest, Sha256};

/// Bytes every entry starts with.
const MAGIC: &[u8; 8] = b"CTXCUBIN";
/// The layout below; a change to it makes older entries `Reject::Version`.
const FORMAT: u32 = 1;
/// Magic, format, key digest, payload length, payload digest.
const HEADER: usize = 8 + 4 + 32 + 8 + 32;

/// What a module's machine code depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// The module's name (in the file name, so a cache folder reads well).
    pub module: String,
    /// SHA-256 of the whole source NVRTC compiles (prelude included).
    pub source: [u8; 32],
    /// A real architecture, such as `sm_90`.
    pub arch: String,
    /// The compiler and its version, such as `nvrtc 13.0`.
    pub compiler: String,
    /// The NVRTC options past the architecture, in order.
    pub options: Vec<String>,
}

impl Key {
    pub fn new(module: &str, source: &str, arch: &str, compiler: &str, options: &[String]) -> Key {
        Key {
            module: module.to_string(),
            source: Sha256::digest(source.as_bytes()).into(),
            arch: arch.to_string(),
            compiler: compiler.to_string(),
            options: options.to_vec(),
        }
    }

    /// SHA-256 over every field, each length-prefixed (so no two keys share an encoding).
    pub fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"ctxscope kernel key 1");
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(self.module.as_bytes());
        field(&self.source);
        field(self.arch.as_bytes());
        field(self.compiler.as_bytes());
        field(&(self.options.len() as u64).to_le_bytes());
        for option in &self.options {
            field(option.as_bytes());
        }
        h.finalize().into()
    }

    /// `<module>-<arch>-<first 16 bytes of the digest in hex>.cubin`: names the key, not its contents.
    pub fn file_name(&self) -> String {
        let hex: String = self.digest()[..16].iter().map(|b| format!("{b:02x}")).collect();
        let safe = |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect::<String>();
        format!("{}-{}-{hex}.cubin", safe(&self.module), safe(&self.arch))
    }
}

/// Why an entry was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("shorter than its header ({0} bytes)")]
    Short(usize),
    #[error("not a kernel cache entry (bad magic)")]
    Magic,
    #[error("entry format {0}, this build reads {FORMAT}")]
    Format(u32),
    #[error("compiled from another source, architecture, compiler or options")]
    Key,
    #[error("payload of {actual} bytes where the header says {expected}")]
    Length { expected: u64, actual: u64 },
    #[error("payload checksum does not match")]
    Checksum,
}

/// The entry for `payload` compiled as `key` says.
pub fn encode(key: &Key, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&key.digest());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

/// The payload of `entry` if it was made for `key` and is whole.
pub fn decode<'a>(key: &Key, entry: &'a [u8]) -> Result<&'a [u8], Reject> {
    if entry.len() < HEADER {
        return Err(Reject::Short(entry.len()));
    }
    let (header, payload) = entry.split_at(HEADER);
    if &header[..8] != MAGIC {
        return Err(Reject::Magic);
    }
    let format = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if format != FORMAT {
        return Err(Reject::Format(format));
    }
    if header[12..44] != key.digest() {
        return Err(Reject::Key);
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[44..52]);
    let expected = u64::from_le_bytes(len);
    if expected != payload.len() as u64 {
        return Err(Reject::Length { expected, actual: payload.len() as u64 });
    }
    if header[52..84] != Sha256::digest(payload)[..] {
        return Err(Reject::Checksum);
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("gemv", "extern \"C\" __global__ void k() {}", "sm_90", "nvrtc 13.0", &[])
    }

    #[test]
    fn every_field_of_the_key_changes_its_digest() {
        let base = key();
        let variants = [
            Key::new("gemv2", "extern \"C\" __global__ void k() {}", "sm_90", "nvrtc 13.0", &[]),
            Key::new("gemv", "extern \"C\" __global__ void k() { }", "sm_90", "nvrtc 13.0", &[]),
            Key::new("gemv", "extern \"C\" __global__ void k() {}", "sm_89", "nvrtc 13.0", &[]),
            Key::new("gemv", "extern \"C\" __global__ void k() {}", "sm_90", "nvrtc 13.5", &[]),
            Key::new("gemv", "extern \"C\" __global__ void k() {}", "sm_90", "nvrtc 13.0", &["-DCTX_TRACE".into()]),
        ];
        for v in &variants {
            assert_ne!(v.digest(), base.digest(), "{v:?}");
            assert_ne!(v.file_name(), base.file_name(), "{v:?}");
        }
        // Derivation is deterministic, and names the module and architecture.
        assert_eq!(key().digest(), base.digest());
        assert!(base.file_name().starts_with("gemv-sm_90-") && base.file_name().ends_with(".cubin"));
        assert_eq!(base.file_name().len(), "gemv-sm_90-".len() + 32 + ".cubin".len());
    }

    #[test]
    fn fields_cannot_run_into_each_other() {
        // Without length prefixes these would hash the same bytes.
        let a = Key::new("m", "s", "sm_9", "0nvrtc", &[]);
        let b = Key::new("m", "s", "sm_90", "nvrtc", &[]);
        assert_ne!(a.digest(), b.digest());
        let c = Key::new("m", "s", "sm_90", "nvrtc", &["-DA".into(), "-DB".into()]);
        let d = Key::new("m", "s", "sm_90", "nvrtc", &["-DA-DB".into()]);
        let e = Key::new("m", "s", "sm_90", "nvrtc", &["-DB".into(), "-DA".into()]);
        assert_ne!(c.digest(), d.digest());
        assert_ne!(c.digest(), e.digest());
    }

    #[test]
    fn an_entry_reads_back_for_its_own_key_only() {
        let payload = b"\x7fELF machine code".to_vec();
        let entry = encode(&key(), &payload);
        assert_eq!(decode(&key(), &entry), Ok(&payload[..]));
        let other = Key::new("gemv", "another source", "sm_90", "nvrtc 13.0", &[]);
        assert_eq!(decode(&other, &entry), Err(Reject::Key));
        assert_eq!(decode(&key(), &encode(&key(), &[])), Ok(&[][..]));
    }

    #[test]
    fn damage_anywhere_is_rejected() {
        let entry = encode(&key(), &[7u8; 300]);
        // Every single-byte flip is caught (by the magic, format, key, length or checksum).
        for at in 0..entry.len() {
            let mut bad = entry.clone();
            bad[at] ^= 0x40;
            assert!(decode(&key(), &bad).is_err(), "flip at {at} accepted");
        }
        // Every truncation and an extension are caught.
        for cut in 0..entry.len() {
            assert!(decode(&key(), &entry[..cut]).is_err(), "cut at {cut} accepted");
        }
        let mut long = entry.clone();
        long.push(0);
        assert_eq!(decode(&key(), &long), Err(Reject::Length { expected: 300, actual: 301 }));
        assert_eq!(decode(&key(), b"short"), Err(Reject::Short(5)));
        let mut payload_flip = entry.clone();
        *payload_flip.last_mut().unwrap() ^= 1;
        assert_eq!(decode(&key(), &payload_flip), Err(Reject::Checksum));
        let mut format = entry;
        format[8] = 9;
        assert_eq!(decode(&key(), &format), Err(Reject::Format(9)));
    }
}
