// Matrix-vector products for decode (n <= 8 token rows): y[t][r] = sum_c W[r][c] * x[t][c], one warp per
// output row, weights streamed once with 16-byte loads that skip L1 (several in flight per lane), the
// token rows read through L1. Weights f32 or bf16 (raw bits); x f32, optionally rounded to bf16 on
// load (the bf16 path rounds GEMM inputs, as its cuBLAS prefill does); f32 accumulation.
// mode 0: y = Wx; mode 1: y += Wx (the residual add, fused); mode 2: SwiGLU, W holds `rows` gate rows
// then `rows` up rows and y[t][r] = silu(gate_r . x_t) * (up_r . x_t). cols % 8 == 0.

#define GEMV_MAX_N 8
#define GEMV_UNROLL 4

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// Eight weights of row-chunk `chunk` (8 columns) as f32.
template <bool BF16>
__device__ __forceinline__ void load_w8(const void* w, size_t chunk, float* out) {
    if (BF16) {
        uint4 u = load_stream((const uint4*)w + chunk);
        unsigned int words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out[2 * i] = __uint_as_float(words[i] << 16);
            out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        }
    } else {
        uint4 a = load_stream((const uint4*)w + 2 * chunk), b = load_stream((const uint4*)w + 2 * chunk + 1);
        out[0] = __uint_as_float(a.x); out[1] = __uint_as_float(a.y); out[2] = __uint_as_float(a.z); out[3] = __uint_as_float(a.w);
        out[4] = __uint_as_float(b.x); out[5] = __uint_as_float(b.y); out[6] = __uint_as_float(b.z); out[7] = __uint_as_float(b.w);
    }
}

// Mode 3 (decode QKV): warp p computes the adjacent output rows 2p and 2p + 1 of the fused QKV matrix,
// a RoPE pair, and stores them where rope_kv would: q rotated into qkv, k rotated and v as is into each
// token's sequence cache (and into qkv). Same angles as rope_kv (prelude rope_cos_sin: f64 frequency and angle, reduced
// modulo 2 pi, f32 sine and cosine); no patch rounding (patched passes use the separate kernels).
struct RopeStore {
    const int* positions;
    const u64* kv_base;
    int layer, n_layers, q_dim, kv_dim, hd;
    float base;
};

__device__ __forceinline__ void rope_store(const RopeStore& rs, float* qkv, int t, int r, float a, float b) {
    int stride = rs.q_dim + 2 * rs.kv_dim, pos = rs.positions[t];
    if (r < rs.q_dim + rs.kv_dim) {
        int j = (r % rs.hd) / 2;
        float c, s;
        rope_cos_sin(pos, rope_inv_freq(rs.base, j, rs.hd), &c, &s);
        float ra = a * c - b * s, rb = a * s + b * c;
        qkv[(size_t)t * stride + r] = ra;
        qkv[(size_t)t * stride + r + 1] = rb;
        if (r >= rs.q_dim) {
            float* k = kv_row(rs.kv_base[t], pos, rs.layer, rs.n_layers, 0, rs.kv_dim) + (r - rs.q_dim);
            k[0] = ra;
            k[1] = rb;
        }
    } else {
        qkv[(size_t)t * stride + r] = a;
        qkv[(size_t)t * stride + r + 1] = b;
        float* v = kv_row(rs.kv_base[t], pos, rs.layer, rs.n_layers, 1, rs.kv_dim) + (r - rs.q_dim - rs.kv_dim);
        v[0] = a;
        v[1] = b;
    }
}

template <bool BF16, int MODE>
__device__ __forceinline__ void gemv_body(const void* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                          int rows, int cols, int n, int round_x, const RopeStore* rs = nullptr) {
    pdl_launch();
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    // Mode 2 pairs row r with r + rows (gate, up); mode 3 computes rows 2p and 2p + 1 (`rows` pairs).
    int first = MODE == 3 ? 2 * row : row, second = MODE == 3 ? 2 * row + 1 : row + rows;
    if (row >= rows) {
        pdl_wait();
        return;
    }
    const int chunks = cols >> 3;
    float acc[GEMV_MAX_N], acc2[GEMV_MAX_N];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_N; t++) acc[t] = acc2[t] = 0.0f;
    float wv[GEMV_UNROLL][8], wu[GEMV_UNROLL][8];
    // The first batch of weights is loaded before waiting for the previous kernel (weights do not
    // depend on it): with programmatic launch this overlaps the previous kernel's tail.
    bool waited = false;
    for (int c0 = lane; c0 < chunks; c0 += 32 * GEMV_UNROLL) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + 32 * u;
            if (c < chunks) {
                load_w8<BF16>(w, (size_t)first * chunks + c, wv[u]);
                if (MODE >= 2) load_w8<BF16>(w, (size_t)second * chunks + c, wu[u]);
            }
        }
        if (!waited) {
            pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + 32 * u;
            if (c >= chunks) break;
#pragma unroll
            for (int t = 0; t < GEMV_MAX_N; t++) {
                if (t >= n) break;
                const float4* xp = (const float4*)(x + (size_t)t * cols) + 2 * c;
                float4 a = xp[0], b = xp[1];
                float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                if (round_x) {
#pragma unroll
                    for (int i = 0; i < 8; i++) xv[i] = round_bf16(xv[i]);
                }
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    acc[t] += wv[u][i] * xv[i];
                    if (MODE >= 2) acc2[t] += wu[u][i] * xv[i];
                }
            }
        }
    }
    if (!waited) pdl_wait();
#pragma unroll
    for (int t = 0; t < GEMV_MAX_N; t++) {
        if (t >= n) break;
        float s = warp_sum(acc[t]);
        if (MODE == 3) {
            float u = warp_sum(acc2[t]);
            if (lane == 0) rope_store(*rs, y, t, first, s, u);
        } else if (MODE == 2) {
            float u = warp_sum(acc2[t]);
            if (lane == 0) y[(size_t)t * rows + row] = s / (1.0f + expf(-s)) * u;
        } else if (lane == 0) {
            float* dst = y + (size_t)t * rows + row;
            *dst = MODE == 1 ? *dst + s : s;
        }
    }
}

extern "C" __global__ void gemv_bf16(const bf16_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                     int rows, int cols, int n, int mode, int round_x) {
    if (mode == 0) gemv_body<true, 0>(w, x, y, rows, cols, n, round_x);
    else if (mode == 1) gemv_body<true, 1>(w, x, y, rows, cols, n, round_x);
    else gemv_body<true, 2>(w, x, y, rows, cols, n, round_x);
}

extern "C" __global__ void gemv_f32(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                    int rows, int cols, int n, int mode, int round_x) {
    if (mode == 0) gemv_body<false, 0>(w, x, y, rows, cols, n, round_x);
    else if (mode == 1) gemv_body<false, 1>(w, x, y, rows, cols, n, round_x);
    else gemv_body<false, 2>(w, x, y, rows, cols, n, round_x);
}

// Decode QKV with RoPE and the K/V store fused (mode 3 above): `pairs` = (q_dim + 2 kv_dim) / 2.
extern "C" __global__ void gemv_qkv_rope_bf16(const bf16_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ qkv,
                                              int pairs, int cols, int n, int round_x, const int* positions, const u64* kv_base,
                                              int layer, int n_layers, int q_dim, int kv_dim, int hd, float base) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base};
    gemv_body<true, 3>(w, x, qkv, pairs, cols, n, round_x, &rs);
}

extern "C" __global__ void gemv_qkv_rope_f32(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ qkv,
                                             int pairs, int cols, int n, int round_x, const int* positions, const u64* kv_base,
                                             int layer, int n_layers, int q_dim, int kv_dim, int hd, float base) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base};
    gemv_body<false, 3>(w, x, qkv, pairs, cols, n, round_x, &rs);
}
