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
        unpack16<true>(load_stream((const uint4*)w + chunk), out);
    } else {
        uint4 a = load_stream((const uint4*)w + 2 * chunk), b = load_stream((const uint4*)w + 2 * chunk + 1);
        unpack16<false>(a, out);
        unpack16<false>(b, out + 4);
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
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base, nullptr};
    gemv_body<true, 3>(w, x, qkv, pairs, cols, n, round_x, &rs);
}

extern "C" __global__ void gemv_qkv_rope_f32(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ qkv,
                                             int pairs, int cols, int n, int round_x, const int* positions, const u64* kv_base,
                                             int layer, int n_layers, int q_dim, int kv_dim, int hd, float base) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base, nullptr};
    gemv_body<false, 3>(w, x, qkv, pairs, cols, n, round_x, &rs);
}

// ---- Streamed decode GEMV ----
// The same products (modes 0-3 above) for decode passes, with each lane's weight loads running ahead
// of its arithmetic through shared memory: a persistent grid (a few blocks per SM) in which every warp
// owns a contiguous range of output units (a row; a gate row and its up row, mode 2; a RoPE pair of
// rows, mode 3) and walks them a 16-byte chunk per lane at a time, as the one-warp-per-row kernel above.
// Each lane keeps D iterations of its own chunks in flight with cp.async into its own shared-memory
// slots (it reads back only what it copied, so no barrier is needed), and issues the first D before
// griddepcontrol.wait: with programmatic launch those weights arrive while the previous kernel is still
// running. The input rows are staged in shared memory once per block, through the RMSNorm when `norm_w`
// is given (statistics summed in rmsnorm_f32's order by as many threads, so the normalized rows are
// bit-identical to that kernel's output) and rounded to bf16 when `round_x`. A unit's sum is reduced
// the same way whatever n and the grid are.

#define STREAM_THREADS 256
#define STREAM_WARPS (STREAM_THREADS / 32)
// Input loads each thread keeps in flight while staging a row (gemv_stream_body).
#define STAGE_LOADS 16

// Unit u's output for token row t from its dot products s (and v: the up row, or the pair's second row).
// `res`: mode 1's residual for row t, loaded when the unit began.
__device__ __forceinline__ void stream_epilogue(int mode, float* y, int units, int u, int t, float s, float v, float res, const RopeStore* rs,
                                                const RopeRow& rr) {
    if (mode == 3) {
        rope_store_row(*rs, rr, y, t, 2 * u, s, v);
    } else {
        float* dst = y + (size_t)t * units + u;
        if (mode == 2) *dst = s / (1.0f + expf(-s)) * v;
        else *dst = mode == 1 ? res + s : s;
    }
}

// K rows per unit (1: modes 0, 1; 2: modes 2, 3), D (a power of two) iterations in flight per lane.
// Shared memory: the lanes' slots, then the n input rows, then the norm weight.
// MODE >= 0 and N > 0 fix the mode and the token rows at compile time (else `mode_arg`, `n_arg`);
// TABLE: mode 3 is always given RoPE's inverse-frequency table. PRE (< D; -1: D) of the D iterations
// are issued before the wait, the rest once the first input loads have left, so that a block starting
// after its release does not queue its input row behind all of its own weight copies.
template <bool BF16, int K, int D, int MODE = -1, int N = 0, bool TABLE = false, int PRE = -1>
__device__ __forceinline__ void gemv_stream_body(const void* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                                 const float* __restrict__ norm_w, float eps, int units, int cols, int n_arg,
                                                 int mode_arg, int round_x, const RopeStore* rs) {
    static_assert(D > 0 && (D & (D - 1)) == 0, "the ring's depth is a power of two (its slot index is masked)");
    const int mode = MODE >= 0 ? MODE : mode_arg, n = N > 0 ? N : n_arg;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float scratch[33];
    pdl_launch();
    const int kind = TRACE_STREAM + mode;
    trace_mark(kind, TRACE_START);
    const int E = BF16 ? 8 : 4;
    const int chunks = cols / E, per_unit = (chunks + 31) / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * STREAM_WARPS, gw = (long long)blockIdx.x * STREAM_WARPS + warp;
    const int ua = (int)(gw * units / warps), ub = (int)((gw + 1) * units / warps);
    // This thread's slot d, row r: ring[(d * K + r) * STREAM_THREADS + threadIdx.x].
    uint4* ring = (uint4*)smem;
    float* xs = (float*)(smem + (size_t)D * K * STREAM_THREADS * 16);
    float* gs = xs + (size_t)n * cols;
    const uint4* wc = (const uint4*)w;

    // The issue cursor walks the warp's units a chunk per lane at a time, D iterations ahead: `src` is
    // this lane's chunk of the unit's first row (row u, or 2u in mode 3; the second row `second`
    // chunks on: row u + units in mode 2, the next row in mode 3), moved by additions, and the copies
    // go to shared addresses from one base (this loop's instructions are a large part of the step).
    const size_t unit_stride = (size_t)(mode == 3 ? 2 : 1) * chunks, second = mode == 2 ? (size_t)units * chunks : (size_t)chunks;
    const uint4* src = wc + (size_t)ua * unit_stride + lane;
    const unsigned ring_s = smem_addr(ring) + threadIdx.x * 16;
    int iu = ua, ij = 0, issued = 0;
    auto issue_next = [&]() {
        if (iu < ub) {
            if (lane + 32 * ij < chunks) {
                const unsigned dst = ring_s + (unsigned)((issued & (D - 1)) * K) * (STREAM_THREADS * 16);
                cp_async16_shared(dst, src);
                if (K == 2) cp_async16_shared(dst + STREAM_THREADS * 16, src + second);
            }
            src += 32;
            if (++ij == per_unit) {
                ij = 0;
                iu++;
                src += unit_stride - 32 * (size_t)per_unit;
            }
        }
        issued++;
        cp_async_commit();  // empty groups too: one group per iteration
    };
    // Weights do not depend on the previous kernel: start them before waiting for it. The norm weight
    // goes first, in a group of its own (empty without a norm), so that the norm waits for it alone: a
    // block that starts only as the previous kernel's blocks leave issues its copies at its release,
    // and its first weight chunk from memory then queues behind every other block's (measured: most
    // of gate/up's and the LM head's staging).
    if (norm_w) {
        for (int i = 4 * threadIdx.x; i < cols; i += 4 * STREAM_THREADS) cp_async16(gs + i, norm_w + i);
    }
    cp_async_commit();
    // A loop, not unrolled: a block that starts only as the previous kernel's blocks leave runs this
    // before its wait with a cold instruction cache, so its length is latency.
    constexpr int pre = PRE < 0 || PRE > D ? D : PRE;
#pragma unroll 1
    for (int i = 0; i < pre; i++) issue_next();
    bool deferred = pre < D;  // iterations pre .. D - 1 still to issue
    auto issue_deferred = [&]() {
        if (deferred) {
#pragma unroll 1
            for (int i = pre; i < D; i++) issue_next();
            deferred = false;
        }
    };
    // Mode 3: lane t (< n) prepares token row t's rotation of the unit at hand (positions and cache
    // bases are written by the host before a pass, never by a kernel), and stores row t's outputs.
    RopeRow rr = {1.0f, 0.0f};
    auto prepare = [&](int u) {
        if (mode == 3 && lane < n && u < ub) rr = rope_row<TABLE>(*rs, lane, 2 * u);
    };
    prepare(ua);
    pdl_wait();
    trace_mark(kind, TRACE_WAITED);

    // The input rows into shared memory, normalized (rmsnorm_f32's sum and formula) and rounded as asked.
    for (int t = 0; t < n; t++) {
        const float* row = x + (size_t)t * cols;
        float* xr = xs + (size_t)t * cols;
        // The row's loads all leave before the first is used, STAGE_LOADS per thread at a time: this
        // is the kernel's first wait on the previous kernel's output, and each load waited for in turn
        // costs a round trip to L2 (a loop unrolled by the compiler runs its remainder, all of a
        // narrow row's columns, one load at a time). Loads past the row read its last column instead
        // of being predicated (predicates run out at 7, and the loads then go out in groups); only the
        // uses are skipped, so the sum keeps its order.
        float sum = 0.0f;
#pragma unroll 1
        for (int base = threadIdx.x; base < cols; base += STAGE_LOADS * STREAM_THREADS) {
            float v[STAGE_LOADS];
#pragma unroll
            for (int k = 0; k < STAGE_LOADS; k++) v[k] = row[min(base + k * STREAM_THREADS, cols - 1)];
            issue_deferred();
#pragma unroll
            for (int k = 0; k < STAGE_LOADS; k++) {
                const int i = base + k * STREAM_THREADS;
                if (i < cols) {
                    sum += v[k] * v[k];
                    xr[i] = v[k];
                }
            }
        }
        issue_deferred();  // before the norm's wait, which counts D groups after the norm weight's
        if (norm_w) {
            cp_async_wait<D>();  // the norm weight's group has landed (the D weight groups after it need not)
            float scale = 1.0f / sqrtf(block_sum(sum, scratch) / cols + eps);
            for (int i = threadIdx.x; i < cols; i += STREAM_THREADS) xr[i] = xr[i] * scale * gs[i];
        }
        if (round_x) {
            for (int i = threadIdx.x; i < cols; i += STREAM_THREADS) xr[i] = round_bf16(xr[i]);
        }
    }
    __syncthreads();
    trace_mark(kind, TRACE_STAGED);

    int step = 0;
    for (int u = ua; u < ub; u++) {
        // Mode 1: lane t (< n) loads row t's residual now, so that the unit's end does not wait on it.
        const float res = mode == 1 && lane < n ? y[(size_t)lane * units + u] : 0.0f;
        float acc[GEMV_MAX_N], acc2[GEMV_MAX_N];
#pragma unroll
        for (int t = 0; t < GEMV_MAX_N; t++) acc[t] = acc2[t] = 0.0f;
        for (int j = 0; j < per_unit; j++, step++) {
            cp_async_wait<D - 1>();  // this lane's iteration `step` has landed (and the norm weight's group before them)
            const int c = lane + 32 * j;
            if (c < chunks) {
                const int slot = (step & (D - 1)) * K;
                float wa[8], wb[8];
                unpack16<BF16>(ring[slot * STREAM_THREADS + threadIdx.x], wa);
                if (K == 2) unpack16<BF16>(ring[(slot + 1) * STREAM_THREADS + threadIdx.x], wb);
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
                        if (K == 2) acc2[t] += wb[e] * xv[e];
                    }
                }
            }
            // The slot just read is refilled only now, after the arithmetic that consumed it.
            issue_next();
        }
#pragma unroll
        for (int t = 0; t < GEMV_MAX_N; t++) {
            if (t >= n) break;
            float s = warp_sum(acc[t]), v = K == 2 ? warp_sum(acc2[t]) : 0.0f;
            if (lane == t) stream_epilogue(mode, y, units, u, t, s, v, res, rs, rr);
        }
        prepare(u + 1);
    }
    trace_end(kind, TRACE_END);
}

// Dispatch on the rows per unit (mode) and the bytes each lane keeps in flight (128 or 256).
template <bool BF16>
__device__ __forceinline__ void gemv_stream_dispatch(const void* w, const float* x, float* y, const float* norm_w, float eps, int units,
                                                     int cols, int n, int mode, int round_x, int lane_bytes, const RopeStore* rs) {
    bool deep = lane_bytes >= 256;
    if (mode >= 2) {
        if (deep) gemv_stream_body<BF16, 2, 8>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, rs);
        else gemv_stream_body<BF16, 2, 4>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, rs);
    } else {
        if (deep) gemv_stream_body<BF16, 1, 16>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, rs);
        else gemv_stream_body<BF16, 1, 8>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, rs);
    }
}

// units: output rows (modes 0, 1), gate/up pairs (2) or RoPE pairs (3); dynamic shared memory:
// lane_bytes per thread (128 or 256) + (n + 1) * cols floats. positions .. inv_freq: mode 3's RoPE and K/V
// store (inv_freq: RoPE's inverse frequencies from rope_inv_freq_table, or null).
#define GEMV_STREAM_PARAMS                                                                                                            \
    const float *__restrict__ x, float *__restrict__ y, const float *__restrict__ norm_w, float eps, int units, int cols, int n, int mode, \
        int round_x, int lane_bytes, const int *positions, const u64 *kv_base, int layer, int n_layers, int q_dim, int kv_dim, int hd,  \
        float base, const double *inv_freq

extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base, inv_freq};
    gemv_stream_dispatch<true>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, lane_bytes, &rs);
}

extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_f32(const float* __restrict__ w, GEMV_STREAM_PARAMS) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base, inv_freq};
    gemv_stream_dispatch<false>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, lane_bytes, &rs);
}

// Builds for one mode at 128 bytes per lane, any n or one row (Device::stream_plan picks them); mode 3's
// take RoPE's inverse-frequency table (launches without one run gemv_stream_bf16).
// For measurements (CTXSCOPE_CUDA_DEFINES, kernels/src/settings.rs), per mode: GEMV_RING_M<mode>, the
// iterations in flight (a power of two, at most the default: the host sizes shared memory for 128 B
// a lane), and GEMV_PRE_M<mode>, how many of them leave before the wait (default all).
#ifndef GEMV_RING_M0
#define GEMV_RING_M0 8
#endif
#ifndef GEMV_RING_M1
#define GEMV_RING_M1 8
#endif
#ifndef GEMV_RING_M2
#define GEMV_RING_M2 4
#endif
#ifndef GEMV_RING_M3
#define GEMV_RING_M3 4
#endif
#ifndef GEMV_PRE_M0
#define GEMV_PRE_M0 -1
#endif
#ifndef GEMV_PRE_M1
#define GEMV_PRE_M1 -1
#endif
#ifndef GEMV_PRE_M2
#define GEMV_PRE_M2 -1
#endif
#ifndef GEMV_PRE_M3
#define GEMV_PRE_M3 -1
#endif
static_assert(GEMV_RING_M0 <= 8 && GEMV_RING_M1 <= 8 && GEMV_RING_M2 <= 4 && GEMV_RING_M3 <= 4, "the host sizes the ring for 128 B a lane");
#define GEMV_STREAM_ARGS w, x, y, norm_w, eps, units, cols, n, mode, round_x, lane_bytes, positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base, inv_freq
// EARLY: one ring iteration before the wait whatever GEMV_PRE_M<mode> says (the `_p1` builds).
template <int MODE, int N, bool EARLY = false>
__device__ __forceinline__ void gemv_stream_special(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) {
    RopeStore rs = {positions, kv_base, layer, n_layers, q_dim, kv_dim, hd, base, inv_freq};
    constexpr int ring = MODE == 0 ? GEMV_RING_M0 : MODE == 1 ? GEMV_RING_M1 : MODE == 2 ? GEMV_RING_M2 : GEMV_RING_M3;
    constexpr int pre = EARLY ? 1 : MODE == 0 ? GEMV_PRE_M0 : MODE == 1 ? GEMV_PRE_M1 : MODE == 2 ? GEMV_PRE_M2 : GEMV_PRE_M3;
    gemv_stream_body<true, MODE >= 2 ? 2 : 1, ring, MODE, N, MODE == 3, pre>(w, x, y, norm_w, eps, units, cols, n, mode, round_x, &rs);
}
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m0(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<0, 0>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m1(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<1, 0>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m2(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<2, 0>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m3(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<3, 0>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m0_n1(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<0, 1>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m1_n1(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<1, 1>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m2_n1(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<2, 1>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m3_n1(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<3, 1>(GEMV_STREAM_ARGS); }
// QKV builds that issue one ring iteration before the wait (Device::stream_plan picks them where a
// warp's share of the weights exceeds its ring, so that its input row does not queue behind its ring).
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m3_p1(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<3, 0, true>(GEMV_STREAM_ARGS); }
extern "C" __global__ void __launch_bounds__(STREAM_THREADS, 4) gemv_stream_bf16_m3_n1_p1(const bf16_t* __restrict__ w, GEMV_STREAM_PARAMS) { gemv_stream_special<3, 1, true>(GEMV_STREAM_ARGS); }
