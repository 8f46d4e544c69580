// Prepended to every module (NVRTC has no include path for our files and no standard headers): the
// number formats the kernels convert through, by their PTX conversions (bf16 and f16 round to nearest
// even; FP8 e4m3 saturates at +-448, sm_89+), and a warp sum.

typedef unsigned short bf16_t;
typedef unsigned long long u64;
// -infinity by its bits (no math headers).
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf16_to_f32(bf16_t b) { return __uint_as_float(((unsigned)b) << 16); }

__device__ __forceinline__ bf16_t f32_to_bf16(float x) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

__device__ __forceinline__ float round_f16(float x) {
    unsigned short h;
    float r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
}

// FP8 e4m3 (the `fn` variant, no infinities): x goes to the low byte of the pair.
__device__ __forceinline__ float round_fp8_e4m3(float x) {
    unsigned short pair;
    unsigned int halves;
    float r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(pair));
    unsigned short low = (unsigned short)(halves & 0xffff);
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(low));
    return r;
}

// Programmatic dependent launch (sm_90): `pdl_launch` lets the next kernel on the stream start its
// blocks (they run up to their own pdl_wait); `pdl_wait` blocks until the previous kernel has finished
// and its writes are visible. Every kernel waits before it reads or writes activations; only immutable
// data (weights) may be read before. Without the launch attribute both are no-ops.
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Asynchronous 16-byte copies global -> shared (cp.async, sm_80+), committed in groups per thread.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// The same to a shared-space address (smem_addr), for loops that step the address themselves.
__device__ __forceinline__ void cp_async16_shared(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most N of this thread's copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

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

// Thread-block clusters (sm_90): this block's rank in its cluster, a barrier of every thread of the
// cluster (release/acquire: shared-memory writes before it, remote ones included, are visible to the
// cluster's reads after it), and a store into the shared memory of block `rank` of the cluster at the
// address `p` has here.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The same barrier in two halves: arrive early, wait later (a block must not touch another block's
// shared memory before that block has started: arrive at the start, wait before the first remote access).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

__device__ __forceinline__ void st_cluster(float* p, unsigned rank, float v) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}

// Timeline tracing, a diagnostic (kernels/src/device/trace.rs), compiled in only with CTX_TRACE
// (CTXSCOPE_CUDA_TRACE=1: even unused, the marks cost the streamed GEMV registers): while `ctx_trace`
// points at a buffer ([0] record slots reserved, [1] capacity in records, then (time, tag) pairs), each
// block's first thread records at the marks its kernel makes the global timer in ns and kernel kind << 56
// | event << 48 | blocks in the grid << 24 | block. A block's start mark reserves TRACE_EVENTS slots
// (one atomic, before the block waits for the previous kernel) and its other marks store into their
// event's slot of that reservation: a plain store, so a mark does not hold its warp back (with an
// atomic per mark, thread 0 waited for each one's round trip). Unused slots stay zero. A mark at a
// block's end waits for its other warps first (only when tracing: the barrier is uniform).
__device__ u64* ctx_trace;
// Kinds (gemv_stream: TRACE_STREAM + its mode) and events, as trace.rs names them.
#define TRACE_ATTN_DECODE 1
#define TRACE_ARGMAX 2
#define TRACE_ATTN_CLUSTER 3
#define TRACE_STREAM 16
#define TRACE_START 0
#define TRACE_WAITED 1
#define TRACE_STAGED 2
#define TRACE_END 3
// Milestones inside decode attention (trace.rs reports each from the last release to the last block's):
// the query, the newest K/V row and the first tile in shared memory; the block's span attended.
#define TRACE_READY 4
#define TRACE_ATTENDED 5
#define TRACE_EVENTS 6

#ifdef CTX_TRACE
// The block's reservation: the first slot, or ~0 (no trace, or it did not fit). Written by the start
// mark, read by the others; thread 0 only.
__shared__ u64 ctx_trace_slot;

// One opaque PTX block with its own scratch registers (a C++ version or an out-of-line call made the
// streamed GEMV spill): only thread 0 records. The timer is read first.
__device__ __forceinline__ void trace_mark(int kind, int event) {
    asm volatile(
        "{\n\t"
        ".reg .u64 tr_t, tr_i, tr_cap, tr_now, tr_tag, tr_x, tr_a;\n\t"
        ".reg .u32 tr_u, tr_v;\n\t"
        ".reg .pred tr_p, tr_q, tr_s, tr_r, tr_f;\n\t"
        "mov.u64 tr_now, %%globaltimer;\n\t"
        "mov.u64 tr_t, %0;\n\t"
        "mov.u32 tr_u, %%tid.x;\n\t"
        "setp.eq.u32 tr_q, tr_u, 0;\n\t"
        "setp.eq.u32 tr_s, %2, 0;\n\t"
        "setp.ne.and.u64 tr_p, tr_t, 0, tr_q;\n\t"
        // The start mark: reserve (tracing), keep the first slot if the reservation fits, else ~0.
        "mov.u64 tr_i, 0xffffffffffffffff;\n\t"
        "and.pred tr_r, tr_p, tr_s;\n\t"
        "@tr_r atom.global.add.u64 tr_x, [tr_t], %4;\n\t"
        "@tr_r ld.global.u64 tr_cap, [tr_t+8];\n\t"
        "add.u64 tr_a, tr_x, %4;\n\t"
        "setp.le.and.u64 tr_f, tr_a, tr_cap, tr_r;\n\t"
        "@tr_f mov.u64 tr_i, tr_x;\n\t"
        "and.pred tr_r, tr_q, tr_s;\n\t"
        "@tr_r st.u64 [%3], tr_i;\n\t"
        // Any other mark: the block's reservation.
        "not.pred tr_r, tr_s;\n\t"
        "and.pred tr_r, tr_r, tr_p;\n\t"
        "@tr_r ld.u64 tr_i, [%3];\n\t"
        "setp.ne.and.u64 tr_p, tr_i, 0xffffffffffffffff, tr_p;\n\t"
        "mov.u32 tr_u, %%nctaid.x;\n\t"
        "mov.u32 tr_v, %%nctaid.y;\n\t"
        "mul.lo.u32 tr_u, tr_u, tr_v;\n\t"
        "mov.u32 tr_v, %%nctaid.z;\n\t"
        "mul.lo.u32 tr_u, tr_u, tr_v;\n\t"
        "cvt.u64.u32 tr_tag, tr_u;\n\t"
        "shl.b64 tr_tag, tr_tag, 24;\n\t"
        "mov.u32 tr_u, %%ctaid.z;\n\t"
        "mov.u32 tr_v, %%nctaid.y;\n\t"
        "mul.lo.u32 tr_u, tr_u, tr_v;\n\t"
        "mov.u32 tr_v, %%ctaid.y;\n\t"
        "add.u32 tr_u, tr_u, tr_v;\n\t"
        "mov.u32 tr_v, %%nctaid.x;\n\t"
        "mul.lo.u32 tr_u, tr_u, tr_v;\n\t"
        "mov.u32 tr_v, %%ctaid.x;\n\t"
        "add.u32 tr_u, tr_u, tr_v;\n\t"
        "cvt.u64.u32 tr_x, tr_u;\n\t"
        "or.b64 tr_tag, tr_tag, tr_x;\n\t"
        "cvt.u64.u32 tr_x, %1;\n\t"
        "shl.b64 tr_x, tr_x, 56;\n\t"
        "or.b64 tr_tag, tr_tag, tr_x;\n\t"
        "cvt.u64.u32 tr_x, %2;\n\t"
        "shl.b64 tr_x, tr_x, 48;\n\t"
        "or.b64 tr_tag, tr_tag, tr_x;\n\t"
        // Slot tr_i + event: record (time, tag) at byte 16 + 16 * slot.
        "cvt.u64.u32 tr_x, %2;\n\t"
        "add.u64 tr_a, tr_i, tr_x;\n\t"
        "shl.b64 tr_a, tr_a, 4;\n\t"
        "add.u64 tr_a, tr_a, tr_t;\n\t"
        "@tr_p st.global.v2.u64 [tr_a+16], {tr_now, tr_tag};\n\t"
        "}\n" ::"l"(ctx_trace), "r"(kind), "r"(event), "l"(&ctx_trace_slot), "n"(TRACE_EVENTS) : "memory");
}

__device__ __forceinline__ void trace_end(int kind, int event) {
    if (ctx_trace == nullptr) return;
    __syncthreads();
    trace_mark(kind, event);
}
#else
__device__ __forceinline__ void trace_mark(int, int) {}
__device__ __forceinline__ void trace_end(int, int) {}
#endif

// RoPE's inverse frequency of pair j (f64, as the CPU), and cos/sin of the angle pos * inv: the angle
// in f64, reduced modulo 2 pi in f64 (the turns counted by a multiply with 1 / (2 pi), not a division:
// the fused QKV runs this before its wait, cold, in blocks that start late; where the count could round
// the other way the reduced angle is +pi or -pi to within an ulp, and the two give the same cos and a
// sin of ~1e-7 of either sign, as close to the true value as the angle's f32 cast allows), its sine and
// cosine in f32 (within an f32 ulp of the CPU's f64 cos/sin rounded to f32). Shared by rope_kv and the
// fused QKV GEMV.
__device__ __forceinline__ double rope_inv_freq(float base, int j, int hd) { return pow((double)base, -2.0 * j / hd); }

__device__ __forceinline__ void rope_cos_sin(int pos, double inv, float* c, float* s) {
    const double two_pi = 6.283185307179586, inv_two_pi = 0.15915494309189535;
    double theta = (double)pos * inv;
    sincosf((float)(theta - two_pi * rint(theta * inv_two_pi)), s, c);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch /* [33] shared */) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps ? scratch[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

// A sequence's KV cache is one buffer, position-major: [capacity][n_layers][2 (K, V)][kv_dim] floats,
// so a prefix is one contiguous copy. Row `pos` of K (kind 0) or V (kind 1) of `layer`:
__device__ __forceinline__ float* kv_row(u64 base, int pos, int layer, int n_layers, int kind, int kv_dim) {
    return (float*)base + (((size_t)pos * n_layers + layer) * 2 + kind) * kv_dim;
}
