/* Mixture-of-experts hyperparameters and tensors from the GGUF (moe.h): what every
 * backend's expert feed-forward reads. The CPU's forward is backend/cpu/moe.c. */
#include "model/moe.h"

#include "util/mem.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- load ------------------------------------------------------------------------- */

static enum tern_status arch_u32(struct tern_model *m, const char *suffix, bool required, uint32_t def,
                                 uint32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    if (!gguf_find_kv(m->f, key)) {
        if (required) return tern_errorf(TERN_ERR_FORMAT, "model: metadata key '%s' is missing", key);
        *out = def;
        return TERN_OK;
    }
    return gguf_get_u32(m->f, key, out);
}

enum tern_status moe_hparams_load(struct tern_model *m, bool norm_topk, bool shared, struct moe_hparams *hp) {
    enum tern_status st;
    memset(hp, 0, sizeof *hp);
    hp->norm_topk = norm_topk;
    hp->softmax_weight = hp->swiglu_oai = !strcmp(m->arch->name, "gpt-oss");
    if ((st = arch_u32(m, "expert_count", true, 0, &hp->n_expert)) ||
        (st = arch_u32(m, "expert_used_count", true, 0, &hp->n_used)) ||
        (st = arch_u32(m, "expert_feed_forward_length", true, 0, &hp->n_ff_exp)) ||
        (st = arch_u32(m, "expert_shared_feed_forward_length", shared, 0, &hp->n_ff_shexp)))
        return st;
    const char *a = m->arch->name;
    if (hp->n_expert < 1 || hp->n_expert > MOE_MAX_EXPERTS)
        return tern_errorf(TERN_ERR_FORMAT, "model: %s.expert_count %u is out of range [1, %u]", a, hp->n_expert,
                           MOE_MAX_EXPERTS);
    if (hp->n_used < 1 || hp->n_used > hp->n_expert || hp->n_used > MOE_MAX_USED)
        return tern_errorf(TERN_ERR_FORMAT, "model: %s.expert_used_count %u is out of range [1, %u]", a, hp->n_used,
                           TERN_MIN(hp->n_expert, MOE_MAX_USED));
    if (hp->n_ff_exp < 1 || hp->n_ff_exp > (1u << 22))
        return tern_errorf(TERN_ERR_FORMAT, "model: %s.expert_feed_forward_length %u is out of range [1, %u]", a,
                           hp->n_ff_exp, 1u << 22);
    if (shared && (hp->n_ff_shexp < 1 || hp->n_ff_shexp > (1u << 22)))
        return tern_errorf(TERN_ERR_FORMAT, "model: %s.expert_shared_feed_forward_length %u is out of range [1, %u]",
                           a, hp->n_ff_shexp, 1u << 22);
    if (!shared) hp->n_ff_shexp = 0;

    char key[128];
    snprintf(key, sizeof key, "%s.expert_gating_func", a);
    if (gguf_find_kv(m->f, key)) {
        uint32_t fn;
        if ((st = gguf_get_u32(m->f, key, &fn))) return st;
        /* llama.cpp numbers softmax 1, sigmoid 2, softmax_weight 3 (gpt-oss's, its default) */
        if (fn != (hp->softmax_weight ? 3u : 1u))
            return tern_errorf(TERN_ERR_UNSUPPORTED, "model: %s = %u: only the %s gate (%u) is supported", key, fn,
                               hp->softmax_weight ? "softmax_weight" : "softmax", hp->softmax_weight ? 3u : 1u);
    }
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    if (gguf_find_kv(m->f, key) && (st = gguf_get_bool(m->f, key, &hp->norm_topk))) return st;
    snprintf(key, sizeof key, "%s.expert_weights_scale", a);
    if ((st = gguf_get_f32_or(m->f, key, 1.0f, &hp->scale))) return st;
    if (!(hp->scale > 0.0f) || !isfinite(hp->scale))
        return tern_errorf(TERN_ERR_FORMAT, "model: %s = %g must be positive", key, (double)hp->scale);
    return TERN_OK;
}

/* gpt-oss's stacked expert biases: an F32 tensor [n, n_mat] (one row of n per expert). */
static enum tern_status bias_rows(struct tern_model *m, const float **out, uint32_t n, uint32_t n_mat, const char *fmt,
                                  uint32_t il) {
    char name[128];
    snprintf(name, sizeof name, fmt, il);
    *out = NULL;
    const struct gguf_tensor *t = gguf_find_tensor(m->f, name);
    if (!t) return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' is missing (expected shape [%u, %u])", name, n, n_mat);
    if (t->n_dims != 2 || t->ne[0] != n || t->ne[1] != n_mat)
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' has %u dims [%llu, %llu], expected [%u, %u]", name,
                           t->n_dims, (unsigned long long)t->ne[0], (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1),
                           n, n_mat);
    if (t->type != TERN_DTYPE_F32)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "model: tensor '%s' has type %s, expected F32", name,
                           tern_dtype_name(t->type));
    *out = t->data;
    return TERN_OK;
}

enum tern_status moe_layer_load(struct tern_model *m, const struct moe_hparams *hp, uint32_t il,
                                struct moe_layer *L) {
    enum tern_status st;
    memset(L, 0, sizeof *L);
    const uint32_t E = m->hp.n_embd, F = hp->n_ff_exp, X = hp->n_expert;
    if ((st = model_get_mat(m, &L->router, E, X, "blk.%u.ffn_gate_inp.weight", il)) ||
        (st = model_get_mats(m, &L->gate, &L->gate_stride, E, F, X, "blk.%u.ffn_gate_exps.weight", il)) ||
        (st = model_get_mats(m, &L->up, &L->up_stride, E, F, X, "blk.%u.ffn_up_exps.weight", il)) ||
        (st = model_get_mats(m, &L->down, &L->down_stride, F, E, X, "blk.%u.ffn_down_exps.weight", il)))
        return st;
    if (hp->n_ff_shexp) {
        const uint32_t S = hp->n_ff_shexp;
        if ((st = model_get_mat(m, &L->sh_gate_inp, E, 1, "blk.%u.ffn_gate_inp_shexp.weight", il)) ||
            (st = model_get_mat(m, &L->sh_gate, E, S, "blk.%u.ffn_gate_shexp.weight", il)) ||
            (st = model_get_mat(m, &L->sh_up, E, S, "blk.%u.ffn_up_shexp.weight", il)) ||
            (st = model_get_mat(m, &L->sh_down, S, E, "blk.%u.ffn_down_shexp.weight", il)))
            return st;
    }
    if (hp->swiglu_oai &&
        ((st = model_get_vec(m, &L->router_b, X, true, "blk.%u.ffn_gate_inp.bias", il)) ||
         (st = bias_rows(m, &L->gate_b, F, X, "blk.%u.ffn_gate_exps.bias", il)) ||
         (st = bias_rows(m, &L->up_b, F, X, "blk.%u.ffn_up_exps.bias", il)) ||
         (st = bias_rows(m, &L->down_b, E, X, "blk.%u.ffn_down_exps.bias", il))))
        return st;
    return TERN_OK;
}

/* ---- state ------------------------------------------------------------------------ */
