#version 450
// Writes n_tok rows of n_head kv heads (row_stride floats apart) into the cache rows
// pos0.. of pages of 256 positions, [page][n_head][256][head_dim] (the CPU's pages, end
// to end): F32, or (F16 = 1) rounded to halves packed two per uint (head_dim is even),
// as the CPU's F16 cache stores them. The rows are x's rows row0.. (one sequence of a
// step over several).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint F16 = 0;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer C { uint c[]; };
layout(std430, binding = 2) readonly buffer U2 { float unused2[]; };
layout(std430, binding = 3) readonly buffer U3 { float unused3[]; };

layout(push_constant) uniform P {
    uint head_dim;
    uint unused;
    uint row_stride;
    uint pos0;
    uint n_head;
    uint n_tok;
    uint row0;
} p;

void main() {
    const uint e = gl_GlobalInvocationID.x, g = gl_GlobalInvocationID.y, t = gl_GlobalInvocationID.z;
    const uint width = F16 != 0u ? p.head_dim / 2u : p.head_dim;
    if (e >= width || g >= p.n_head || t >= p.n_tok) return;
    const uint src = (p.row0 + t) * p.row_stride + g * p.head_dim;
    const uint pos = p.pos0 + t;
    const uint dst = (((pos >> 8) * p.n_head + g) * 256u + (pos & 255u)) * width;
    if (F16 != 0u) c[dst + e] = packHalf2x16(vec2(x[src + 2u * e], x[src + 2u * e + 1u]));
    else c[dst + e] = floatBitsToUint(x[src + e]);
}
