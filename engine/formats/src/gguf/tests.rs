//! Unit tests of the GGUF reader on small files written here by a minimal GGUF writer: every value
//! type, nested arrays, tensor infos, alignment, and the typed errors for truncation, bad magic,
//! unknown value types and out-of-bounds tensors.

use super::value::type_id as t;
use super::*;

/// A minimal GGUF writer, enough to produce the files these tests read.
#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn header(&mut self, version: u32, tensors: u64, kvs: u64) -> &mut Self {
        self.bytes(b"GGUF").u32(version).u64(tensors).u64(kvs)
    }
    fn kv(&mut self, key: &str, ty: u32, payload: impl FnOnce(&mut Self)) -> &mut Self {
        self.string(key).u32(ty);
        payload(self);
        self
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> &mut Self {
        self.string(name).u32(dims.len() as u32);
        for d in dims {
            self.u64(*d);
        }
        self.u32(ggml_type).u64(offset)
    }
    fn pad_to(&mut self, alignment: usize) -> &mut Self {
        while !self.buf.len().is_multiple_of(alignment) {
            self.buf.push(0);
        }
        self
    }
}

fn parse(buf: &[u8]) -> Result<Gguf> {
    Gguf::read_from(buf, buf.len() as u64)
}

/// A file with one key of every type, a nested array, two tensors and their (zeroed) data.
fn sample(version: u32, alignment: Option<u32>) -> Vec<u8> {
    let mut w = Writer::default();
    let kvs = 16 + u64::from(alignment.is_some());
    w.header(version, 2, kvs);
    w.kv("a.u8", t::U8, |w| {
        w.bytes(&[200]);
    });
    w.kv("a.i8", t::I8, |w| {
        w.bytes(&[(-5i8) as u8]);
    });
    w.kv("a.u16", t::U16, |w| {
        w.bytes(&60000u16.to_le_bytes());
    });
    w.kv("a.i16", t::I16, |w| {
        w.bytes(&(-300i16).to_le_bytes());
    });
    w.kv("a.u32", t::U32, |w| {
        w.u32(4_000_000_000);
    });
    w.kv("a.i32", t::I32, |w| {
        w.bytes(&(-7i32).to_le_bytes());
    });
    w.kv("a.u64", t::U64, |w| {
        w.u64(1 << 40);
    });
    w.kv("a.i64", t::I64, |w| {
        w.bytes(&(-(1i64 << 40)).to_le_bytes());
    });
    w.kv("a.f32", t::F32, |w| {
        w.bytes(&1.5f32.to_le_bytes());
    });
    w.kv("a.f64", t::F64, |w| {
        w.bytes(&(-2.25f64).to_le_bytes());
    });
    w.kv("a.bool", t::BOOL, |w| {
        w.bytes(&[1]);
    });
    w.kv("a.str", t::STRING, |w| {
        w.string("héllo ✓");
    });
    w.kv("a.strs", t::ARRAY, |w| {
        w.u32(t::STRING).u64(3).string("x").string("").string("<|im_start|>");
    });
    w.kv("a.ints", t::ARRAY, |w| {
        w.u32(t::I32).u64(3);
        for v in [1i32, -2, 3] {
            w.bytes(&v.to_le_bytes());
        }
    });
    w.kv("a.floats", t::ARRAY, |w| {
        w.u32(t::F32).u64(2).bytes(&0.5f32.to_le_bytes()).bytes(&(-1.0f32).to_le_bytes());
    });
    w.kv("a.nested", t::ARRAY, |w| {
        w.u32(t::ARRAY).u64(2);
        w.u32(t::U8).u64(2).bytes(&[1, 2]);
        w.u32(t::STRING).u64(1).string("in");
    });
    if let Some(a) = alignment {
        w.kv("general.alignment", t::U32, |w| {
            w.u32(a);
        });
    }
    let align = alignment.unwrap_or(32) as u64;
    // Tensor 0: 4x2 F32 = 32 bytes at 0; tensor 1: 64 elements Q4_1 = 2 blocks = 40 bytes, aligned.
    w.tensor("tok_embd.weight", &[4, 2], 0, 0);
    w.tensor("blk.0.attn_q.weight", &[64], 3, 32u64.div_ceil(align) * align);
    w.pad_to(align as usize);
    let data_len = 32u64.div_ceil(align) * align + 40;
    w.bytes(&vec![0u8; data_len as usize]);
    w.buf
}

#[test]
fn reads_every_value_type_and_tensor_info() {
    let buf = sample(3, None);
    let g = parse(&buf).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get("a.u8"), Some(&GgufValue::U8(200)));
    assert_eq!(g.get_i64("a.i8").unwrap(), -5);
    assert_eq!(g.get_u32("a.u16").unwrap(), 60000);
    assert_eq!(g.get_i64("a.i16").unwrap(), -300);
    assert_eq!(g.get_u32("a.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.get_i64("a.i32").unwrap(), -7);
    assert_eq!(g.get_u64("a.u64").unwrap(), 1 << 40);
    assert_eq!(g.get_i64("a.i64").unwrap(), -(1 << 40));
    assert_eq!(g.get_f32("a.f32").unwrap(), 1.5);
    assert_eq!(g.get_f64("a.f64").unwrap(), -2.25);
    assert!(g.get_bool("a.bool").unwrap());
    assert_eq!(g.get_str("a.str").unwrap(), "héllo ✓");
    assert_eq!(g.get_str_array("a.strs").unwrap(), ["x", "", "<|im_start|>"]);
    assert_eq!(g.get_i64_array("a.ints").unwrap(), vec![1, -2, 3]);
    assert_eq!(g.get_f32_array("a.floats").unwrap(), vec![0.5, -1.0]);
    assert_eq!(g.get_array("a.nested").unwrap(), &GgufArray::Array(vec![GgufArray::U8(vec![1, 2]), GgufArray::String(vec!["in".into()])]));
    let keys: Vec<&str> = g.metadata().map(|(k, _)| k).collect();
    assert_eq!(keys.first(), Some(&"a.u8"));
    assert_eq!(keys.len(), 16);

    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset() % 32, 0);
    assert_eq!(g.tensors().len(), 2);
    let t0 = &g.tensors()[0];
    assert_eq!((t0.name.as_str(), t0.dims.as_slice(), t0.offset), ("tok_embd.weight", &[4u64, 2][..], 0));
    assert_eq!(t0.ggml_type.name(), Some("F32"));
    assert_eq!(t0.byte_size(), Some(32));
    let t1 = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(t1.ggml_type.to_string(), "Q4_1");
    assert_eq!(t1.byte_size(), Some(40));
    assert_eq!(t1.offset, 32);
    assert_eq!(g.data_offset() + t1.offset + 40, buf.len() as u64);
}

#[test]
fn reads_version_2_and_custom_alignment() {
    let buf = sample(2, Some(64));
    let g = parse(&buf).unwrap();
    assert_eq!(g.version(), 2);
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    assert_eq!(g.tensors()[1].offset, 64);
}

#[test]
fn typed_getters_report_missing_and_wrong_types() {
    let g = parse(&sample(3, None)).unwrap();
    assert!(matches!(g.get_str("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert!(matches!(g.get_str("a.u32"), Err(GgufError::WrongType { expected: "string", found: "u32", .. })));
    assert!(matches!(g.get_u32("a.i32"), Err(GgufError::OutOfRange { value: -7, .. })));
    assert!(matches!(g.get_u32("a.u64"), Err(GgufError::OutOfRange { .. })));
    assert!(matches!(g.get_str_array("a.ints"), Err(GgufError::WrongType { found: "array of i32", .. })));
    assert_eq!(g.get_u32_opt("nope").unwrap(), None);
    assert_eq!(g.get_str_opt("a.str").unwrap(), Some("héllo ✓"));
}

#[test]
fn every_truncation_is_a_typed_error_naming_what_was_read() {
    let buf = sample(3, None);
    let g = parse(&buf).unwrap();
    // Cutting anywhere inside the header, metadata or tensor infos must fail cleanly.
    let header_end = g.data_offset() as usize;
    for cut in 0..header_end {
        let short = &buf[..cut];
        match parse(short) {
            Err(GgufError::Truncated { what, offset }) => {
                assert!(!what.is_empty());
                assert!(offset <= cut as u64, "offset {offset} past cut {cut}");
            }
            // A length prefix that no longer fits is caught before reading it.
            Err(GgufError::LengthTooLarge { .. }) => {}
            // Cut inside the padding or the data: the header parsed, the data does not fit.
            Err(GgufError::TensorOutOfBounds { .. }) => {}
            other => panic!("cut at {cut}: expected a truncation error, got {other:?}"),
        }
    }
    // The messages name the field.
    let at_magic = parse(&buf[..2]).unwrap_err().to_string();
    assert!(at_magic.contains("magic"), "{at_magic}");
    // Inside the bytes of element 2 ("<|im_start|>"): its length no longer fits.
    let cut = buf.windows(6).position(|w| w == b"a.strs").unwrap() + 6 + 4 + 4 + 8 + 9 + 8 + 8 + 5;
    let msg = parse(&buf[..cut]).unwrap_err().to_string();
    assert!(msg.contains("a.strs") && msg.contains("element 2"), "{msg}");
}

#[test]
fn data_section_must_fit_in_the_file() {
    let buf = sample(3, None);
    let err = parse(&buf[..buf.len() - 1]).unwrap_err();
    assert!(matches!(&err, GgufError::TensorOutOfBounds { name, .. } if name == "blk.0.attn_q.weight"), "{err:?}");
}

#[test]
fn rejects_bad_magic_version_and_value_type() {
    let mut buf = sample(3, None);
    buf[0] = b'X';
    assert!(matches!(parse(&buf), Err(GgufError::BadMagic { found }) if &found == b"XGUF"));

    let mut w = Writer::default();
    w.header(1, 0, 0);
    assert!(matches!(parse(&w.buf), Err(GgufError::UnsupportedVersion(1))));

    let mut w = Writer::default();
    w.header(3, 0, 1).string("weird").u32(99).u32(0);
    match parse(&w.buf) {
        Err(GgufError::UnknownValueType { type_id: 99, what, .. }) => assert!(what.contains("weird")),
        other => panic!("expected unknown value type, got {other:?}"),
    }

    let mut w = Writer::default();
    w.header(3, 0, 1).string("arr").u32(t::ARRAY).u32(42).u64(1);
    assert!(matches!(parse(&w.buf), Err(GgufError::UnknownValueType { type_id: 42, .. })));
}

#[test]
fn rejects_absurd_lengths_duplicates_and_bad_alignment() {
    let mut w = Writer::default();
    w.header(3, 0, 1).string("s").u32(t::STRING).u64(u64::MAX);
    assert!(matches!(parse(&w.buf), Err(GgufError::LengthTooLarge { .. })));

    let mut w = Writer::default();
    w.header(3, 0, 1).string("a").u32(t::ARRAY).u32(t::U64).u64(1 << 60);
    assert!(matches!(parse(&w.buf), Err(GgufError::LengthTooLarge { .. })));

    let mut w = Writer::default();
    w.header(3, 0, 2).string("k").u32(t::U8).bytes(&[1]).string("k").u32(t::U8).bytes(&[2]);
    assert!(matches!(parse(&w.buf), Err(GgufError::DuplicateKey(k)) if k == "k"));

    let mut w = Writer::default();
    w.header(3, 0, 1).string("general.alignment").u32(t::U32).u32(48);
    assert!(matches!(parse(&w.buf), Err(GgufError::BadAlignment(48))));

    let mut w = Writer::default();
    w.header(3, 0, 1).string("b").u32(t::BOOL).bytes(&[7]);
    assert!(matches!(parse(&w.buf), Err(GgufError::InvalidBool { byte: 7, .. })));

    let mut w = Writer::default();
    w.header(3, 1, 0).tensor("t", &[1, 1, 1, 1, 1], 0, 0);
    assert!(matches!(parse(&w.buf), Err(GgufError::TooManyDims { n_dims: 5, .. })));

    let mut w = Writer::default();
    w.header(3, 1, 0).tensor("t", &[1], 0, 4);
    assert!(matches!(parse(&w.buf), Err(GgufError::MisalignedTensor { offset: 4, .. })));
}

#[test]
fn opens_a_file_from_disk_without_reading_tensor_data() {
    let dir = std::env::temp_dir().join(format!("ctxscope-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, sample(3, None)).unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.tensors().len(), 2);
    let missing = Gguf::open(dir.join("missing.gguf")).unwrap_err();
    assert!(matches!(missing, GgufError::Io { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}
