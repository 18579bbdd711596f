#version 450
// RoPE in place on rows of n_head heads of head_dim: the first n_rot elements of each
// head rotate by the angles cs[t][2i] = cos, cs[t][2i + 1] = sin (computed on the host
// as the CPU computes them). NEOX pairs i with i + n_rot / 2, else 2i with 2i + 1.
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer CS { float cs[]; };
layout(std430, binding = 2) readonly buffer U2 { float unused2[]; };
layout(std430, binding = 3) readonly buffer U3 { float unused3[]; };

layout(push_constant) uniform P {
    uint n_head;
    uint head_dim;
    uint n_rot;
    uint n_tok;
    uint neox;
    uint row_stride; // floats from one token's row to the next
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x; // the pair
    const uint h = gl_GlobalInvocationID.y;
    const uint t = gl_GlobalInvocationID.z;
    const uint half_rot = p.n_rot / 2u;
    if (i >= half_rot || h >= p.n_head || t >= p.n_tok) return;
    const uint base = t * p.row_stride + h * p.head_dim;
    const uint i0 = p.neox != 0u ? base + i : base + 2u * i;
    const uint i1 = p.neox != 0u ? base + i + half_rot : base + 2u * i + 1u;
    const float c = cs[t * p.n_rot + 2u * i], s = cs[t * p.n_rot + 2u * i + 1u];
    const float x0 = x[i0], x1 = x[i1];
    precise float y0 = x0 * c - x1 * s;
    precise float y1 = x0 * s + x1 * c;
    x[i0] = y0;
    x[i1] = y1;
}
