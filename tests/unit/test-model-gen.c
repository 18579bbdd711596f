#include "test-model-gen.h"

#include "harness.h"

#include "gguf/gguf.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tgen_defaults(struct tgen *g, const char *arch, enum tern_dtype wtype) {
    memset(g, 0, sizeof *g);
    g->arch = arch;
    g->n_vocab = 256;
    g->n_embd = 256;
    g->n_layer = 2;
    g->n_ff = 256;
    g->n_head = 4;
    g->n_head_kv = 2;
    g->head_dim = 64;
    g->n_ctx = 4096;
    g->wtype = wtype;
    g->freq_base = 10000.0f;
    g->seed = 1234;
}

const char *tgen_path(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", th_tmpdir(), name);
    return path;
}

static uint64_t rng_state;

static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1.0p-53;
}

static float nrand(float sd) {
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)) * sd;
}

static int add(struct gguf_writer *w, const struct tgen *g, const char *name, enum tern_dtype type, uint64_t k,
               uint64_t n, float sd, float mean) {
    if (g->skip_tensor && !strcmp(g->skip_tensor, name)) return 0;
    if (g->bad_tensor && !strcmp(g->bad_tensor, name)) n += 1;
    float *src = malloc(sizeof(float) * k * n);
    for (uint64_t i = 0; i < k * n; i++) src[i] = mean + nrand(sd);
    uint64_t rb;
    if (!tern_dtype_row_size(type, k, &rb)) {
        fprintf(stderr, "tgen: %s: rows of %llu do not fit %s\n", name, (unsigned long long)k, tern_dtype_name(type));
        free(src);
        return -1;
    }
    char *dst = malloc(rb * n);
    for (uint64_t r = 0; r < n; r++) {
        if (!tern_quantize_row(type, src + r * k, dst + r * rb, k)) {
            fprintf(stderr, "tgen: cannot quantize to %s\n", tern_dtype_name(type));
            free(src);
            free(dst);
            return -1;
        }
    }
    const uint64_t ne[2] = {k, n};
    enum tern_status st = gguf_writer_add_tensor(w, name, type, n == 1 ? 1 : 2, ne, dst, rb * n);
    free(src);
    free(dst);
    return st ? -1 : 0;
}

int tgen_write(const struct tgen *g, const char *path) {
    rng_state = g->seed * 2654435761u + 88172645463325252ull;
    struct gguf_writer *w;
    if (gguf_writer_new(&w)) return -1;
    char key[128];
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", g->arch, s), key)
    int bad = 0;
    bad |= gguf_writer_set_str(w, "general.architecture", g->arch) != 0;
    bad |= gguf_writer_set_str(w, "general.name", "tgen") != 0;
    bad |= gguf_writer_set_u32(w, KEY("context_length"), g->n_ctx) != 0;
    bad |= gguf_writer_set_u32(w, KEY("embedding_length"), g->n_embd) != 0;
    bad |= gguf_writer_set_u32(w, KEY("block_count"), g->n_layer) != 0;
    bad |= gguf_writer_set_u32(w, KEY("feed_forward_length"), g->n_ff) != 0;
    bad |= gguf_writer_set_u32(w, KEY("attention.head_count"), g->n_head) != 0;
    bad |= gguf_writer_set_u32(w, KEY("attention.head_count_kv"), g->n_head_kv) != 0;
    bad |= gguf_writer_set_u32(w, KEY("attention.key_length"), g->head_dim) != 0;
    bad |= gguf_writer_set_u32(w, KEY("attention.value_length"), g->head_dim) != 0;
    bad |= gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f) != 0;
    bad |= gguf_writer_set_f32(w, KEY("rope.freq_base"), g->freq_base) != 0;
    if (g->rope_scaling) {
        bad |= gguf_writer_set_str(w, KEY("rope.scaling.type"), g->rope_scaling) != 0;
        bad |= gguf_writer_set_f32(w, KEY("rope.scaling.factor"), g->rope_factor) != 0;
        bad |= gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), g->n_ctx / 4) != 0;
    }
    const uint32_t E = g->n_embd, hd = g->head_dim, nq = g->n_head * hd, nkv = g->n_head_kv * hd, F = g->n_ff;
    const enum tern_dtype wt = g->wtype, ot = g->out_type ? g->out_type : g->wtype;
    const float sd = 0.08f;
    bad |= add(w, g, "token_embd.weight", wt, E, g->n_vocab, 0.5f, 0.0f);
    bad |= add(w, g, "output_norm.weight", TERN_DTYPE_F32, E, 1, 0.05f, 1.0f);
    if (!g->tied) bad |= add(w, g, "output.weight", ot, E, g->n_vocab, sd, 0.0f);
    const bool qwen2 = !strcmp(g->arch, "qwen2"), qwen3 = !strcmp(g->arch, "qwen3");
    for (uint32_t il = 0; il < g->n_layer && !bad; il++) {
        char n[96];
#define T(s) (snprintf(n, sizeof n, "blk.%u.%s", il, s), n)
        bad |= add(w, g, T("attn_norm.weight"), TERN_DTYPE_F32, E, 1, 0.05f, 1.0f);
        bad |= add(w, g, T("attn_q.weight"), wt, E, nq, sd, 0.0f);
        bad |= add(w, g, T("attn_k.weight"), wt, E, nkv, sd, 0.0f);
        bad |= add(w, g, T("attn_v.weight"), wt, E, nkv, sd, 0.0f);
        bad |= add(w, g, T("attn_output.weight"), wt, nq, E, sd, 0.0f);
        if (qwen2) {
            bad |= add(w, g, T("attn_q.bias"), TERN_DTYPE_F32, nq, 1, 0.1f, 0.0f);
            bad |= add(w, g, T("attn_k.bias"), TERN_DTYPE_F32, nkv, 1, 0.1f, 0.0f);
            bad |= add(w, g, T("attn_v.bias"), TERN_DTYPE_F32, nkv, 1, 0.1f, 0.0f);
        }
        if (qwen3) {
            bad |= add(w, g, T("attn_q_norm.weight"), TERN_DTYPE_F32, hd, 1, 0.05f, 1.0f);
            bad |= add(w, g, T("attn_k_norm.weight"), TERN_DTYPE_F32, hd, 1, 0.05f, 1.0f);
        }
        bad |= add(w, g, T("ffn_norm.weight"), TERN_DTYPE_F32, E, 1, 0.05f, 1.0f);
        bad |= add(w, g, T("ffn_gate.weight"), wt, E, F, sd, 0.0f);
        bad |= add(w, g, T("ffn_up.weight"), wt, E, F, sd, 0.0f);
        bad |= add(w, g, T("ffn_down.weight"), wt, F, E, sd, 0.0f);
#undef T
    }
#undef KEY
    if (!bad && gguf_writer_write(w, path)) {
        fprintf(stderr, "tgen: %s\n", tern_last_error());
        bad = 1;
    }
    gguf_writer_free(w);
    return bad ? -1 : 0;
}
