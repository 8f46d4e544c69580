// Row-wise and element-wise kernels of the Llama forward pass, f32 in and out, statistics in f32.
// One block per row for the reductions; names carry the dtype (`_f32`).

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out, int dim, float eps) {
    const float* row = x + (size_t)blockIdx.x * dim;
    float* dst = out + (size_t)blockIdx.x * dim;
    __shared__ float partial[32];
    float sum = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        sum += row[i] * row[i];
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        sum += __shfl_down_sync(0xffffffff, sum, offset);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        sum = lane < (blockDim.x + 31) / 32 ? partial[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset /= 2) {
            sum += __shfl_down_sync(0xffffffff, sum, offset);
        }
        if (lane == 0) partial[0] = sum;
    }
    __syncthreads();
    float scale = rsqrtf(partial[0] / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        dst[i] = row[i] * scale * w[i];
    }
}

// RoPE on adjacent pairs (the GGUF layout), in place: x is [tokens][heads * head_dim]; token t sits at
// position positions[t]; angle of pair j = position * base^(-2j / head_dim), computed in f64 like the CPU.
extern "C" __global__ void rope_f32(float* x, const int* positions, int heads, int head_dim, double base) {
    int t = blockIdx.x;
    int pairs = heads * head_dim / 2;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int j = p % (head_dim / 2);
        double angle = (double)positions[t] * pow(base, -2.0 * j / head_dim);
        float c = (float)cos(angle), s = (float)sin(angle);
        float* v = x + (size_t)t * heads * head_dim + 2 * p;
        float a = v[0], b = v[1];
        v[0] = a * c - b * s;
        v[1] = a * s + b * c;
    }
}

// SwiGLU: out = silu(gate) * up.
extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// Residual add, in place: x += y.
extern "C" __global__ void add_f32(float* x, const float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}
