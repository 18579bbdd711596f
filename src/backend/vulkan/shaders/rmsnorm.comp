#version 450
// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w   (w optional: has_w = 0 means none)
// One workgroup per row: each invocation sums the squares of elements lid, lid + 256, ...
// in order, then a fixed tree over the 256 partial sums. The order depends on n alone,
// never on the number of rows dispatched, so a row's bits do not depend on its batch.
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer U { float unused[]; };

layout(push_constant) uniform P {
    uint n;
    uint n_tok;
    float eps;
    uint has_w;
} p;

shared float part[256];

void main() {
    const uint t = gl_WorkGroupID.x;
    const uint lid = gl_LocalInvocationID.x;
    const uint o = t * p.n;
    precise float s = 0.0;
    for (uint i = lid; i < p.n; i += 256u) s += x[o + i] * x[o + i];
    part[lid] = s;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (lid < h) {
            precise float v = part[lid] + part[lid + h];
            part[lid] = v;
        }
        barrier();
    }
    const float scale = 1.0 / sqrt(part[0] / float(p.n) + p.eps);
    for (uint i = lid; i < p.n; i += 256u) {
        precise float v = x[o + i] * scale;
        if (p.has_w != 0u) v = v * w[i];
        y[o + i] = v;
    }
}
