#version 450
// Element-wise row operations on n_tok * n floats (OP, a specialization constant):
//   0: a += b          (the residual add)
//   1: a = silu(a) * b (SwiGLU)
//   2: a *= sigmoid(b) (Qwen3.5's attention output gate)
//   3: a += b[i % n]   (a bias row added to every row: qwen2's q/k/v biases)
//   4: gpt-oss's clamped SwiGLU on the (biased) gate a and up b, as the CPU's swiglu_oai:
//      x = min(a, 7), y = clamp(b, -7, 7), a = x / (1 + exp(1.702 * -x)) * (y + 1)
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint OP = 0;

layout(std430, binding = 0) buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) readonly buffer U2 { float unused2[]; };
layout(std430, binding = 3) readonly buffer U3 { float unused3[]; };

layout(push_constant) uniform P {
    uint count;
    uint n; // OP 3: the row length
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * 65535u * 256u;
    if (i >= p.count) return;
    if (OP == 0) {
        precise float v = a[i] + b[i];
        a[i] = v;
    } else if (OP == 1) {
        const float g = a[i];
        precise float v = g / (1.0 + exp(-g)) * b[i];
        a[i] = v;
    } else if (OP == 2) {
        precise float v = a[i] * (1.0 / (1.0 + exp(-b[i])));
        a[i] = v;
    } else if (OP == 3) {
        precise float v = a[i] + b[i % p.n];
        a[i] = v;
    } else {
        const float x = a[i] < 7.0 ? a[i] : 7.0, u = b[i], y = u < 7.0 ? (u > -7.0 ? u : -7.0) : 7.0;
        precise float glu = x / (1.0 + exp(1.702 * -x));
        precise float v = glu * (y + 1.0);
        a[i] = v;
    }
}
