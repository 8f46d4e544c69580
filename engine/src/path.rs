//! The computation path of a request: golden (the f32 reference) or fast (llama.cpp's quantized scheme).

/// How weight matmuls are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Path {
    /// f32 weights (dequantized once at load), f32 products, f32 accumulation in a fixed order.
    /// The reference: what the empty patch set means.
    #[default]
    Golden,
    /// Quantized weights kept quantized, activations quantized to 8 bits per block of 32, integer dot
    /// products (llama.cpp's scheme), SIMD where the CPU has it.
    Fast,
}

impl Path {
    pub fn parse(text: &str) -> Option<Path> {
        match text {
            "golden" => Some(Path::Golden),
            "fast" => Some(Path::Fast),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Path::Golden => "golden",
            Path::Fast => "fast",
        }
    }
}
