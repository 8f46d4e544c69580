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

// ---- Streamed decode GEMV ----
// The same products (modes 0-3 above) with the weights streamed through shared memory, for decode
// passes: a persistent grid (about one block per SM) where each block owns a contiguous range of
// stages. A stage is `ups` consecutive output units whose weight rows are contiguous in memory (a unit
// is a row, a gate row and its up row (mode 2), or a RoPE pair of rows (mode 3)); it is copied with
// 16-byte cp.async into a ring of STREAM_RING slots. The ring is filled before griddepcontrol.wait, so
// with programmatic launch a block's first stages arrive while the previous kernel is still running,
// and `l2_ahead` further stages per block are requested into the L2 ahead of the ring. The input rows
// are staged in shared memory once per block, through the RMSNorm when `norm_w` is given (statistics
// summed in rmsnorm_f32's order by as many threads, so the normalized rows are bit-identical to that
// kernel's output) and rounded to bf16 when `round_x`. Below 8 units per stage a unit's dot product is
// split over 8 / ups warps whose partial sums are added in a fixed order: the result depends on the
// matrix shape only, not on n or on the grid.

#define STREAM_THREADS 256
#define STREAM_WARPS (STREAM_THREADS / 32)
#define STREAM_RING 4
#define STREAM_MAX_TASKS 32

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most STREAM_RING - 1 copy groups of this thread are in flight.
__device__ __forceinline__ void cp_async_wait_ring() { asm volatile("cp.async.wait_group %0;" ::"n"(STREAM_RING - 1) : "memory"); }

// The weights of one launch: `units` units of `k` rows of `row_bytes` each (see mode above).
struct StreamShape {
    const unsigned char* w;
    size_t row_bytes;
    int units, ups, mode;
};

// Stage s as at most two contiguous byte ranges (mode 2: the gate rows, then the up rows `units` rows
// later); their offsets in a slot are 0 and ups * row_bytes.
__device__ __forceinline__ int stage_ranges(const StreamShape& sh, int s, const unsigned char** src, size_t* bytes) {
    int u0 = s * sh.ups, m = min(sh.ups, sh.units - u0);
    if (sh.mode == 2) {
        src[0] = sh.w + (size_t)u0 * sh.row_bytes;
        src[1] = sh.w + (size_t)(sh.units + u0) * sh.row_bytes;
        bytes[0] = bytes[1] = (size_t)m * sh.row_bytes;
        return 2;
    }
    int k = sh.mode == 3 ? 2 : 1;
    src[0] = sh.w + (size_t)k * u0 * sh.row_bytes;
    bytes[0] = (size_t)k * m * sh.row_bytes;
    return 1;
}

__device__ __forceinline__ void stage_issue(const StreamShape& sh, int s, unsigned char* slot) {
    const unsigned char* src[2];
    size_t bytes[2];
    int parts = stage_ranges(sh, s, src, bytes);
    for (int p = 0; p < parts; p++) {
        unsigned char* dst = slot + (size_t)p * sh.ups * sh.row_bytes;
        for (size_t i = (size_t)threadIdx.x * 16; i < bytes[p]; i += STREAM_THREADS * 16) cp_async16(dst + i, src[p] + i);
    }
}

// One thread asks the L2 for stage s (sm_90 bulk prefetch; no-op before).
__device__ __forceinline__ void stage_prefetch_l2(const StreamShape& sh, int s) {
#if __CUDA_ARCH__ >= 900
    const unsigned char* src[2];
    size_t bytes[2];
    int parts = stage_ranges(sh, s, src, bytes);
    for (int p = 0; p < parts; p++) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src[p]), "r"((unsigned)bytes[p]) : "memory");
#endif
}

// Eight (bf16) or four (f32) weights of a 16-byte chunk as f32.
template <bool BF16>
__device__ __forceinline__ void unpack16(uint4 u, float* out) {
    unsigned int words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (BF16) {
            out[2 * i] = __uint_as_float(words[i] << 16);
            out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        } else {
            out[i] = __uint_as_float(words[i]);
        }
    }
}

// Unit u's output(s) for token row t from its dot product(s) s (and v: the up row, or the pair's
// second row).
__device__ __forceinline__ void stream_epilogue(int mode, float* y, int units, int u, int t, float s, float v, const RopeStore* rs) {
    if (mode == 3) {
        rope_store(*rs, y, t, 2 * u, s, v);
    } else {
        float* dst = y + (size_t)t * units + u;
        if (mode == 2) *dst = s / (1.0f + expf(-s)) * v;
        else *dst = mode == 1 ? *dst + s : s;
    }
}

template <bool BF16>
__device__ __forceinline__ void gemv_stream_body(const void* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                                 const float* __restrict__ norm_w, float eps, int units, int cols, int n, int mode,
                                                 int round_x, int ups, int l2_ahead, const RopeStore* rs) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float scratch[33];
    __shared__ float part[STREAM_MAX_TASKS][GEMV_MAX_N][2];
    pdl_launch();
    const int E = BF16 ? 8 : 4, k = mode >= 2 ? 2 : 1;
    const size_t row_bytes = (size_t)cols * (BF16 ? 2 : 4), stage_bytes = (size_t)ups * k * row_bytes;
    const StreamShape sh = {(const unsigned char*)w, row_bytes, units, ups, mode};
    const int stages = (units + ups - 1) / ups;
    const int s0 = (int)((long long)blockIdx.x * stages / gridDim.x);
    const int count = (int)((long long)(blockIdx.x + 1) * stages / gridDim.x) - s0;
    float* xs = (float*)(smem + STREAM_RING * stage_bytes);

    // Weights do not depend on the previous kernel: fill the ring (one copy group per slot, empty
    // ones included, so the group count is uniform) and ask the L2 for what follows, then wait.
    for (int i = 0; i < STREAM_RING; i++) {
        if (i < count) stage_issue(sh, s0 + i, smem + i * stage_bytes);
        cp_async_commit();
    }
    if (threadIdx.x == 0) {
        for (int i = STREAM_RING; i < STREAM_RING + l2_ahead && i < count; i++) stage_prefetch_l2(sh, s0 + i);
    }
    pdl_wait();

    // The input rows into shared memory (normalized and rounded as asked).
    for (int t = 0; t < n; t++) {
        const float* row = x + (size_t)t * cols;
        float scale = 1.0f;
        if (norm_w) {
            float sum = 0.0f;
            for (int i = threadIdx.x; i < cols; i += STREAM_THREADS) sum += row[i] * row[i];
            float total = block_sum(sum, scratch);
            scale = 1.0f / sqrtf(total / cols + eps);
        }
        for (int i = threadIdx.x; i < cols; i += STREAM_THREADS) {
            float v = norm_w ? row[i] * scale * norm_w[i] : row[i];
            xs[(size_t)t * cols + i] = round_x ? round_bf16(v) : v;
        }
    }

    const int spw = ups >= STREAM_WARPS ? 1 : STREAM_WARPS / ups;
    const int chunks = (int)(row_bytes / 16);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = 0; i < count; i++) {
        cp_async_wait_ring();
        __syncthreads();  // stage i (and, the first time, xs) visible to every thread
        unsigned char* slot = smem + (i % STREAM_RING) * stage_bytes;
        const int u0 = (s0 + i) * ups, m = min(ups, units - u0);
        for (int task = warp; task < m * spw; task += STREAM_WARPS) {
            const int j = task / spw, seg = task % spw;
            const uint4* ra = (const uint4*)(slot + (size_t)(mode == 3 ? 2 * j : j) * row_bytes);
            const uint4* rb = mode == 2 ? (const uint4*)(slot + (size_t)(ups + j) * row_bytes) : ra + chunks;
            const int lo = seg * chunks / spw, hi = (seg + 1) * chunks / spw;
            float acc[GEMV_MAX_N], acc2[GEMV_MAX_N];
#pragma unroll
            for (int t = 0; t < GEMV_MAX_N; t++) acc[t] = acc2[t] = 0.0f;
            for (int c = lo + lane; c < hi; c += 32) {
                float wa[8], wb[8];
                unpack16<BF16>(ra[c], wa);
                if (k == 2) unpack16<BF16>(rb[c], wb);
#pragma unroll
                for (int t = 0; t < GEMV_MAX_N; t++) {
                    if (t >= n) break;
                    const float4* xp = (const float4*)(xs + (size_t)t * cols + (size_t)c * E);
                    float xv[8];
                    float4 a = xp[0];
                    xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                    if (BF16) {
                        float4 b = xp[1];
                        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
                    }
#pragma unroll
                    for (int e = 0; e < E; e++) {
                        acc[t] += wa[e] * xv[e];
                        if (k == 2) acc2[t] += wb[e] * xv[e];
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < GEMV_MAX_N; t++) {
                if (t >= n) break;
                float s = warp_sum(acc[t]), v = k == 2 ? warp_sum(acc2[t]) : 0.0f;
                if (lane == 0) {
                    part[task][t][0] = s;
                    part[task][t][1] = v;
                }
            }
        }
        __syncthreads();  // partial sums written; every warp is done with this slot
        if (threadIdx.x < m * n) {
            const int j = threadIdx.x / n, t = threadIdx.x % n;
            float s = 0.0f, v = 0.0f;
            for (int q = 0; q < spw; q++) {
                s += part[j * spw + q][t][0];
                v += part[j * spw + q][t][1];
            }
            stream_epilogue(mode, y, units, u0 + j, t, s, v, rs);
        }
        if (i + STREAM_RING < count) stage_issue(sh, s0 + i + STREAM_RING, slot);
        cp_async_commit();
        if (threadIdx.x == 0 && l2_ahead > 0 && i + STREAM_RING + l2_ahead < count) stage_prefetch_l2(sh, s0 + i + STREAM_RING + l2_ahead);
    }
}

// units: output rows (modes 0, 1), gate/up pairs (2) or RoPE pairs (3); ups: units per stage (a
// power of two <= STREAM_MAX_TASKS); dynamic shared memory: STREAM_RING stages + n * cols floats.
// positions .. base: mode 3's RoPE and K/V store (unused otherwise).
#define GEMV_STREAM_PARAMS                                                                                                           \
    const float *__restrict__ x, float *__restrict__ y, const float *__restrict__ norm_w, float eps, int units, int cols, int n, int mode, \
        int round_x, int ups, int l2_ahead, const int *positions, const u64 *kv_base, int layer, int n_layers, int q_dim, int kv_dim,  \
        int hd, float base

extern "C" __global__ void gemv_stream_bf16(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base};
    gemv_stream_body<true>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, ups, l2_ahead, &rs);
}

extern "C" __global__ void gemv_stream_f32(const float* __restrict__ w, GEMV_STREAM_PARAMS) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base};
    gemv_stream_body<false>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, ups, l2_ahead, &rs);
}
