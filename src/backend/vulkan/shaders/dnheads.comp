#version 450
// Gated DeltaNet's recurrence (kernels/deltanet.h, step 2): one workgroup per v-head,
// tokens in order; invocation lid owns value columns lid and lid + 128 of the state
// S[d_k][d_v], walking the key index in order (the CPU's lanes, no fused multiply-add).
// The l2 and RMS norms reduce with a tree whose shape depends on the head sizes alone.
// The tokens are rows row0.. of qkv, z, beta, alpha and o (one sequence of a step). With
// a trail (tr = 1), the state after token t goes to slot tr_slot + t of T,
// [slot][n_v][d_k][d_v] (speculative verification; the arithmetic is the same).
layout(local_size_x = 128) in;

layout(std430, binding = 0) buffer S_ { float S[]; };            // [n_v][d_k][d_v]
layout(std430, binding = 1) readonly buffer QKV { float qkv[]; }; // rows of C
layout(std430, binding = 2) readonly buffer Z { float z[]; };     // rows of n_v * d_v
layout(std430, binding = 3) readonly buffer B { float beta[]; };  // rows of n_v
layout(std430, binding = 4) readonly buffer A { float alpha[]; }; // rows of n_v
layout(std430, binding = 5) writeonly buffer O { float o[]; };    // rows of n_v * d_v
layout(std430, binding = 6) readonly buffer Pm { float prm[]; };  // ssm_a[n_v] | dt_bias[n_v] | norm_w[d_v]
layout(std430, binding = 7) writeonly buffer T_ { float T[]; };   // the trail (bound to S when tr = 0)

layout(push_constant) uniform P {
    uint n_k;
    uint n_v;
    uint d_k;
    uint d_v;
    float eps;
    uint n_tok;
    uint row0;
    uint tr;
    uint tr_slot;
    uint k_grouped; // v-head h reads k-head h / (n_v / n_k) (qwen3next), else h % n_k
} p;

shared float qn[256], kn[256], red[128], ov[256];

// A fixed-tree sum of the 128 partials in red (all invocations call it).
float tree_sum() {
    barrier();
    for (uint w = 64u; w > 0u; w >>= 1) {
        if (gl_LocalInvocationID.x < w) {
            precise float v = red[gl_LocalInvocationID.x] + red[gl_LocalInvocationID.x + w];
            red[gl_LocalInvocationID.x] = v;
        }
        barrier();
    }
    const float s = red[0];
    barrier();
    return s;
}

void main() {
    const uint h = gl_WorkGroupID.x, lid = gl_LocalInvocationID.x;
    const uint dk = p.d_k, dv = p.d_v, hk = p.k_grouped != 0u ? h / (p.n_v / p.n_k) : h % p.n_k;
    const uint C = 2u * p.n_k * dk + p.n_v * dv;
    const uint sb = h * dk * dv;
    const float q_scale = 1.0 / sqrt(float(dk));
    for (uint t0 = 0u; t0 < p.n_tok; t0++) {
        const uint t = p.row0 + t0;
        const uint row = t * C;
        precise float sq = 0.0, sk = 0.0;
        for (uint i = lid; i < dk; i += 128u) {
            const float qi = qkv[row + hk * dk + i], ki = qkv[row + (p.n_k + hk) * dk + i];
            qn[i] = qi;
            kn[i] = ki;
            sq += qi * qi;
            sk += ki * ki;
        }
        red[lid] = sq;
        const float qinv = 1.0 / max(sqrt(tree_sum()), p.eps);
        red[lid] = sk;
        const float kinv = 1.0 / max(sqrt(tree_sum()), p.eps);
        for (uint i = lid; i < dk; i += 128u) {
            precise float a = qn[i] * qinv;
            qn[i] = a * q_scale;
            precise float b = kn[i] * kinv;
            kn[i] = b;
        }
        barrier();
        const float ain = alpha[t * p.n_v + h] + prm[p.n_v + h];
        const float sp = ain > 20.0 ? ain : log(1.0 + exp(ain));
        const float decay = exp(prm[h] * sp);
        const float bt = 1.0 / (1.0 + exp(-beta[t * p.n_v + h]));
        for (uint j = lid; j < dv; j += 128u) {
            precise float kv = 0.0;
            for (uint i = 0u; i < dk; i++) {
                precise float sv = S[sb + i * dv + j] * decay;
                S[sb + i * dv + j] = sv;
                kv += sv * kn[i];
            }
            precise float delta = (qkv[row + 2u * p.n_k * dk + h * dv + j] - kv) * bt;
            precise float acc = 0.0;
            for (uint i = 0u; i < dk; i++) {
                precise float sv = S[sb + i * dv + j] + kn[i] * delta;
                S[sb + i * dv + j] = sv;
                if (p.tr != 0u) T[(p.tr_slot + t0) * p.n_v * dk * dv + sb + i * dv + j] = sv;
                acc += sv * qn[i];
            }
            ov[j] = acc;
        }
        barrier();
        precise float so = 0.0;
        for (uint j = lid; j < dv; j += 128u) so += ov[j] * ov[j];
        red[lid] = so;
        const float r = 1.0 / sqrt(tree_sum() / float(dv) + p.eps);
        for (uint j = lid; j < dv; j += 128u) {
            const float zj = z[t * p.n_v * dv + h * dv + j];
            precise float v = ((ov[j] * r) * prm[2u * p.n_v + j]) * (zj / (1.0 + exp(-zj)));
            o[t * p.n_v * dv + h * dv + j] = v;
        }
        barrier();
    }
}
