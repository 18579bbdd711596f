#version 450
// Splits rows of n_head heads laid out [a | b] per head (2 * head_dim each) into a and b
// (Qwen3.5's gated query): one invocation per element of a.
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer AB { float ab[]; };
layout(std430, binding = 1) writeonly buffer A { float a[]; };
layout(std430, binding = 2) writeonly buffer B { float b[]; };
layout(std430, binding = 3) readonly buffer U3 { float unused3[]; };

layout(push_constant) uniform P {
    uint n_head;
    uint head_dim;
    uint n_tok;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * 65535u * 256u;
    const uint per = p.n_head * p.head_dim;
    if (i >= per * p.n_tok) return;
    const uint t = i / per, r = i % per, h = r / p.head_dim, e = r % p.head_dim;
    const uint src = t * 2u * per + h * 2u * p.head_dim + e;
    a[i] = ab[src];
    b[i] = ab[src + p.head_dim];
}
