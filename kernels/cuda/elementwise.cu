// Row-wise and element-wise kernels of the Llama forward pass. Activations are f32; statistics are f32
// (or, under the rmsnorm_bf16 patch, the CPU emulation's bf16 warp reduction, bit for bit in order).
// One block per row for the row-wise kernels.

// out[r] = x[src(r)] / rms(x[src(r)]) * w, src(r) = rows ? rows[r] : r. flags & 1: rmsnorm_bf16 (the
// squares rounded to bf16 and summed in 32 strided lanes, each add rounded, then a pairwise bf16 tree,
// as engine/src/forward/ops.rs `rmsnorm_rows_bf16`).
extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const int* __restrict__ rows, const float* __restrict__ w,
                                       float* __restrict__ out, int dim, float eps, int flags) {
    pdl_launch();
    pdl_wait();
    __shared__ float scratch[33];
    int r = blockIdx.x;
    const float* row = x + (size_t)(rows ? rows[r] : r) * dim;
    float* dst = out + (size_t)r * dim;
    float total;
    if (flags & 1) {
        if (threadIdx.x < 32) {
            float lane = 0.0f;
            for (int i = threadIdx.x; i < dim; i += 32) lane = round_bf16(lane + round_bf16(row[i] * row[i]));
            for (int width = 16; width > 0; width >>= 1) lane = round_bf16(lane + __shfl_down_sync(0xffffffff, lane, width));
            if (threadIdx.x == 0) scratch[32] = lane;
        }
        __syncthreads();
        total = scratch[32];
    } else {
        float sum = 0.0f;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) sum += row[i] * row[i];
        total = block_sum(sum, scratch);
    }
    float scale = 1.0f / sqrtf(total / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = row[i] * scale * w[i];
}

// Embedding gather: out[t] = table[ids[t]], rows of `dim`, from f32 or bf16 tables.
extern "C" __global__ void embed_f32(const float* __restrict__ table, const int* __restrict__ ids, float* __restrict__ out, int dim) {
    pdl_launch();
    pdl_wait();
    const float* row = table + (size_t)ids[blockIdx.x] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)blockIdx.x * dim + i] = row[i];
}

extern "C" __global__ void embed_bf16(const bf16_t* __restrict__ table, const int* __restrict__ ids, float* __restrict__ out, int dim) {
    pdl_launch();
    pdl_wait();
    const bf16_t* row = table + (size_t)ids[blockIdx.x] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)blockIdx.x * dim + i] = bf16_to_f32(row[i]);
}

// RoPE's inverse frequencies rope_inv_freq(base, j, hd), j < hd / 2, into `out` (one block): made once
// per model, so that the fused QKV launches read them instead of computing an f64 pow before their wait.
extern "C" __global__ void rope_inv_freq_table(float base, int hd, double* __restrict__ out) {
    for (int j = threadIdx.x; j < hd / 2; j += blockDim.x) out[j] = rope_inv_freq(base, j, hd);
}

// RoPE on adjacent pairs of the fused projection rows qkv = [tokens][q (heads*hd) | k (kv_heads*hd) |
// v (kv_heads*hd)]: rotates q in place, rotates k and stores k and v into the token's sequence cache at
// its position. Angle of pair j = position * base^(-2j/hd), the inverse frequency and the angle in f64
// as the CPU; the angle is reduced modulo 2 pi in f64 and its sine and cosine taken in f32 (within an
// f32 ulp of the CPU's f64 cos/sin rounded to f32). flags & 1: rope_bf16 (position, inverse frequency,
// angle, cos and sin rounded to bf16); flags & 2: kv_fp8 (K and V rounded to FP8 e4m3 with `kv_scale`
// before they are stored). hd <= 256.
extern "C" __global__ void rope_kv(float* __restrict__ qkv, const int* __restrict__ positions, const u64* __restrict__ kv_base,
                                   int layer, int n_layers, int heads, int kv_heads, int hd, float base, int flags, float kv_scale) {
    pdl_launch();
    pdl_wait();
    __shared__ double inv_freq[128];
    int t = blockIdx.x, pos = positions[t];
    int q_dim = heads * hd, kv_dim = kv_heads * hd;
    float* row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    float* k_dst = kv_row(kv_base[t], pos, layer, n_layers, 0, kv_dim);
    float* v_dst = kv_row(kv_base[t], pos, layer, n_layers, 1, kv_dim);
    int half = hd / 2, pairs = (q_dim + kv_dim) / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) inv_freq[j] = rope_inv_freq(base, j, hd);
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        double inv = inv_freq[p % half];
        float c, s;
        if (flags & 1) {
            float theta = round_bf16(round_bf16((float)pos) * round_bf16((float)inv));
            c = round_bf16((float)cos((double)theta));
            s = round_bf16((float)sin((double)theta));
        } else {
            rope_cos_sin(pos, inv, &c, &s);
        }
        float* v = row + 2 * p;
        float a = v[0], b = v[1];
        float ra = a * c - b * s, rb = a * s + b * c;
        if (2 * p < q_dim) {
            v[0] = ra;
            v[1] = rb;
        } else {
            if (flags & 2) {
                ra = round_fp8_e4m3(ra / kv_scale) * kv_scale;
                rb = round_fp8_e4m3(rb / kv_scale) * kv_scale;
            }
            int i = 2 * p - q_dim;
            k_dst[i] = ra;
            k_dst[i + 1] = rb;
        }
    }
    const float* vsrc = row + q_dim + kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        float v = vsrc[i];
        if (flags & 2) v = round_fp8_e4m3(v / kv_scale) * kv_scale;
        v_dst[i] = v;
    }
}

// SwiGLU of the fused gate|up rows: out[r][i] = silu(gu[r][i]) * gu[r][ffn + i].
extern "C" __global__ void swiglu_f32(const float* __restrict__ gu, float* __restrict__ out, int rows, int ffn) {
    pdl_launch();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * ffn) return;
    size_t r = i / ffn, c = i % ffn;
    float g = gu[r * 2 * ffn + c], u = gu[r * 2 * ffn + ffn + c];
    out[i] = g / (1.0f + expf(-g)) * u;
}

// Residual add, in place: x += y.
extern "C" __global__ void add_f32(float* __restrict__ x, const float* __restrict__ y, int n) {
    pdl_launch();
    pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// f32 -> bf16 (round to nearest even): the GEMM inputs of the bf16 path.
extern "C" __global__ void to_bf16(const float* __restrict__ x, bf16_t* __restrict__ out, int n) {
    pdl_launch();
    pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16(x[i]);
}

// The patches' roundings, in place: mode 0 bf16; mode 1 FP8 e4m3 with a per-tensor scale.
extern "C" __global__ void round_f32(float* __restrict__ x, int n, int mode, float scale) {
    pdl_launch();
    pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = mode == 0 ? round_bf16(x[i]) : round_fp8_e4m3(x[i] / scale) * scale;
}

// act_q8: llama.cpp's Q8_0 activation rounding, in place, one warp per block of 32 values of a row of
// `cols` (cols % 32 == 0): d = f16(amax / 127), q = round-half-even(x * 127 / amax), x = q * d.
extern "C" __global__ void q8_blocks(float* __restrict__ x, int blocks) {
    pdl_launch();
    pdl_wait();
    int b = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (b >= blocks) return;
    float v = x[(size_t)b * 32 + lane];
    float amax = warp_max(fabsf(v));
    float d = round_f16(amax / 127.0f);
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    x[(size_t)b * 32 + lane] = rintf(v * id) * d;
}
