// Online-softmax attention over K/V tiles in shared memory, shared by decode attention in clusters
// (attention.cu) and the persistent decode step (decode.cu): a query's state (running max, sum,
// unnormalized output; lane d holds head dims d, d + 32, ...), a tile of up to CL_TILE positions
// folded into it, and a block's share of a row's visible positions when `size` blocks split them.

#define MAX_HD 128
#define HD_PER_LANE (MAX_HD / 32)

// Empty online-softmax states for the (up to 4) queries a warp owns.
__device__ __forceinline__ void reset_states(float (&m)[4], float (&l)[4], float (&acc)[4][HD_PER_LANE]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = NEG_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < HD_PER_LANE; k++) acc[i][k] = 0.0f;
    }
}

#define CL_TILE 32
// Rows of K (then as many of V) in a tile buffer: a span of at most 2 * CL_TILE positions is folded in
// as one tile, so that a block whose share is a tile and a bit (513 positions over 16 blocks: 33)
// does not pay for a second pass of barriers and warp reductions over one position.
#define CL_ROWS (2 * CL_TILE)

// Folds a tile of `count` (<= 64: a ClusterSpan's `tile`) positions into a query's online-softmax
// state: lane j scores keys j and j + 32 (the same products in the same order as attend_tile).
__device__ __forceinline__ void attend_ring(const float* qs, const float* ks, const float* vs, int stride, int count, int hd, float scale,
                                            float& m, float& l, float* acc) {
    const int lane = threadIdx.x & 31;
    float s[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int j = lane + 32 * h;
        s[h] = NEG_INF;
        if (j < count) {
            const float4* kr = (const float4*)(ks + j * stride);
            const float4* qr = (const float4*)qs;
            float dot = 0.0f;
#pragma unroll 4
            for (int c = 0; c < hd / 4; c++) {
                float4 k = kr[c], q = qr[c];
                dot += q.x * k.x;
                dot += q.y * k.y;
                dot += q.z * k.z;
                dot += q.w * k.w;
            }
            s[h] = dot * scale;
        }
    }
    const float m_new = fmaxf(m, warp_max(fmaxf(s[0], s[1])));
    if (m_new == NEG_INF) return;
    const float correction = expf(m - m_new);
    float p[2];
#pragma unroll
    for (int h = 0; h < 2; h++) p[h] = s[h] == NEG_INF ? 0.0f : expf(s[h] - m_new);
    l = l * correction + warp_sum(p[0] + p[1]);
#pragma unroll
    for (int k = 0; k < HD_PER_LANE; k++) acc[k] *= correction;
    // One loop over the tile's positions (lane j & 31 of p[j / 32] holds position j's weight), so that
    // the code is not doubled for a tile past 32 positions.
#pragma unroll 8
    for (int j = 0; j < count; j++) {
        const float pj = __shfl_sync(0xffffffff, j < 32 ? p[0] : p[1], j & 31);
        const float* vr = vs + j * stride;
#pragma unroll
        for (int k = 0; k < HD_PER_LANE; k++) {
            const int d = lane + 32 * k;
            if (d < hd) acc[k] += pj * vr[d];
        }
    }
    m = m_new;
}

// A cluster block's share of the visible positions of a row whose newest position is `len - 1`: one
// tile of all of them when they fit in CL_ROWS, else tiles of CL_TILE positions (`tile`, `tiles`).
struct ClusterSpan {
    int len, lo, hi, tile, tiles;
};

__device__ __forceinline__ ClusterSpan cluster_span(int len, int window, int size, int rank) {
    const int first = window > 0 ? max(0, len - window) : 0;
    const int span = (len - first + size - 1) / size;
    ClusterSpan c;
    c.len = len;
    c.lo = first + rank * span;
    c.hi = min(len, c.lo + span);
    const int n = max(0, c.hi - c.lo);
    c.tile = n <= CL_ROWS ? CL_ROWS : CL_TILE;
    c.tiles = n <= CL_ROWS ? (n > 0) : (n + CL_TILE - 1) / CL_TILE;
    return c;
}

