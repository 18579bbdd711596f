/* Models: loading (arch registry, hyperparameters, weight binding and validation),
 * the public model API. */
#include "model/model.h"

#include "backend/backend.h"

#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tern_model_params_default(struct tern_model_params *p) {
    memset(p, 0, sizeof *p);
}

/* ---- hyperparameters ------------------------------------------------------------- */

static enum tern_status get_u32_key(struct tern_model *m, const char *suffix, bool required, uint32_t def,
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

static enum tern_status get_f32_key(struct tern_model *m, const char *suffix, float def, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    return gguf_get_f32_or(m->f, key, def, out);
}

enum tern_status model_hparams_load(struct tern_model *m, struct model_hparams *hp) {
    enum tern_status st;
    memset(hp, 0, sizeof *hp);
    if ((st = get_u32_key(m, "context_length", true, 0, &hp->n_ctx_train)) ||
        (st = get_u32_key(m, "embedding_length", true, 0, &hp->n_embd)) ||
        (st = get_u32_key(m, "block_count", true, 0, &hp->n_layer)) ||
        (st = get_u32_key(m, "attention.head_count", true, 0, &hp->n_head)))
        return st;
    /* Dense feed-forward width; MoE architectures size their experts by their own keys
     * and may have none (qwen35moe), so the dense ones check it (model_require_ff). */
    if ((st = get_u32_key(m, "feed_forward_length", false, 0, &hp->n_ff))) return st;
    if ((st = get_u32_key(m, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv))) return st;
    if (hp->n_embd == 0 || hp->n_embd > (1u << 20))
        return tern_errorf(TERN_ERR_FORMAT, "model: embedding_length %u is out of range [1, %u]", hp->n_embd, 1u << 20);
    if (hp->n_layer == 0 || hp->n_layer > 4096)
        return tern_errorf(TERN_ERR_FORMAT, "model: block_count %u is out of range [1, 4096]", hp->n_layer);
    if (hp->n_ff > (1u << 22))
        return tern_errorf(TERN_ERR_FORMAT, "model: feed_forward_length %u exceeds %u", hp->n_ff, 1u << 22);
    if (hp->n_head == 0 || hp->n_head > 4096)
        return tern_errorf(TERN_ERR_FORMAT, "model: attention.head_count %u is out of range [1, 4096]", hp->n_head);
    if (hp->n_head_kv == 0 || hp->n_head_kv > hp->n_head || hp->n_head % hp->n_head_kv != 0)
        return tern_errorf(TERN_ERR_FORMAT,
                           "model: attention.head_count_kv %u must divide attention.head_count %u",
                           hp->n_head_kv, hp->n_head);
    const uint32_t def_hd = hp->n_embd / hp->n_head;
    if ((st = get_u32_key(m, "attention.key_length", false, def_hd, &hp->head_dim_k)) ||
        (st = get_u32_key(m, "attention.value_length", false, def_hd, &hp->head_dim_v)))
        return st;
    if (hp->head_dim_k == 0 || hp->head_dim_k > 1024 || hp->head_dim_v == 0 || hp->head_dim_v > 1024)
        return tern_errorf(TERN_ERR_FORMAT, "model: head dimensions %u/%u are out of range [1, 1024]",
                           hp->head_dim_k, hp->head_dim_v);
    if ((st = get_f32_key(m, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps))) return st;

    struct tern_rope_params *r = &hp->rope;
    if ((st = get_u32_key(m, "rope.dimension_count", false, hp->head_dim_k, &r->n_rot))) return st;
    if (r->n_rot > hp->head_dim_k || r->n_rot % 2 != 0)
        return tern_errorf(TERN_ERR_FORMAT, "model: rope.dimension_count %u must be even and at most the head size %u",
                           r->n_rot, hp->head_dim_k);
    if ((st = get_f32_key(m, "rope.freq_base", 10000.0f, &r->freq_base))) return st;
    if (!(r->freq_base > 0.0f))
        return tern_errorf(TERN_ERR_FORMAT, "model: rope.freq_base %g must be positive", (double)r->freq_base);
    r->freq_scale = 1.0f;
    r->ext_factor = 0.0f;
    r->attn_factor = 1.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->n_ctx_orig = hp->n_ctx_train;

    /* Scaling: rope.scaling.type = none | linear | yarn, with rope.scaling.factor (older
     * files have only rope.scale_linear). */
    char key[128];
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scale_linear", m->arch->name);
    if ((st = gguf_get_f32_or(m->f, key, 0.0f, &factor))) return st;
    const char *type = factor > 0.0f ? "linear" : "none";
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch->name);
    const struct gguf_str *ts = NULL;
    if (gguf_find_kv(m->f, key)) {
        if ((st = gguf_get_str(m->f, key, &ts))) return st;
        type = ts->ptr;
    }
    if ((st = get_f32_key(m, "rope.scaling.factor", factor, &factor))) return st;
    if (strcmp(type, "none") != 0 && factor != 0.0f && factor != 1.0f) {
        if (!(factor > 0.0f))
            return tern_errorf(TERN_ERR_FORMAT, "model: rope.scaling.factor %g must be positive", (double)factor);
        if (!strcmp(type, "linear")) {
            r->freq_scale = 1.0f / factor;
        } else if (!strcmp(type, "yarn")) {
            r->freq_scale = 1.0f / factor;
            r->ext_factor = 1.0f;
            if ((st = get_u32_key(m, "rope.scaling.original_context_length", false, hp->n_ctx_train, &r->n_ctx_orig)))
                return st;
            if ((st = get_f32_key(m, "rope.scaling.yarn_ext_factor", 1.0f, &r->ext_factor)) ||
                (st = get_f32_key(m, "rope.scaling.attn_factor", 1.0f, &r->attn_factor)) ||
                (st = get_f32_key(m, "rope.scaling.yarn_beta_fast", 32.0f, &r->beta_fast)) ||
                (st = get_f32_key(m, "rope.scaling.yarn_beta_slow", 1.0f, &r->beta_slow)))
                return st;
            if (r->ext_factor < 0.0f) r->ext_factor = 1.0f;
            if (r->n_ctx_orig == 0)
                return tern_errorf(TERN_ERR_FORMAT, "model: rope.scaling.original_context_length is 0");
        } else {
            return tern_errorf(TERN_ERR_UNSUPPORTED, "model: rope.scaling.type '%s' is not supported (none, linear, yarn)",
                               type);
        }
    }

    const struct gguf_tensor *te = gguf_find_tensor(m->f, "token_embd.weight");
    if (!te) return tern_errorf(TERN_ERR_FORMAT, "model: tensor 'token_embd.weight' is missing");
    if (te->n_dims != 2 || te->ne[1] == 0 || te->ne[1] > (1u << 24))
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor 'token_embd.weight' has %u dims and %llu rows; expected 2 dims, [1, %u] rows",
                           te->n_dims, (unsigned long long)te->ne[1], 1u << 24);
    hp->n_vocab = (uint32_t)te->ne[1];
    return TERN_OK;
}

enum tern_status model_require_ff(struct tern_model *m) {
    if (m->hp.n_ff == 0) {
        char key[128];
        snprintf(key, sizeof key, "%s.feed_forward_length", m->arch->name);
        if (!gguf_find_kv(m->f, key)) return tern_errorf(TERN_ERR_FORMAT, "model: metadata key '%s' is missing", key);
        return tern_errorf(TERN_ERR_FORMAT, "model: %s is 0", key);
    }
    return TERN_OK;
}

/* ---- weight binding ------------------------------------------------------------- */

static void shape_str(char *buf, size_t cap, const struct gguf_tensor *t) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < t->n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%llu", d ? ", " : "", (unsigned long long)t->ne[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static bool shape_is(const struct gguf_tensor *t, uint64_t a, uint64_t b) {
    /* A 1-D vector may be stored with trailing unit dims. */
    for (uint32_t d = 2; d < GGUF_MAX_DIMS; d++)
        if (t->ne[d] != 1) return false;
    return t->ne[0] == a && t->ne[1] == b;
}

static enum tern_status bind_tensor(struct tern_model *m, struct mat *out, uint32_t k, uint32_t n,
                                    const struct gguf_tensor *t) {
    const char *name = t->name.ptr;
    if (!shape_is(t, k, n) || t->n_dims > 2) {
        char got[96];
        shape_str(got, sizeof got, t);
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' has shape %s, expected [%u, %u]", name, got, k, n);
    }
    if (!tern_matmul_supported(t->type))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "model: tensor '%s' has type %s, which the kernels cannot multiply",
                           name, tern_dtype_name(t->type));
    const uint32_t km = tern_matmul_k_multiple(t->type);
    if (km && k % km != 0)
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' of type %s has rows of %u, not a multiple of %u",
                           name, tern_dtype_name(t->type), k, km);
    uint64_t rb;
    if (!tern_dtype_row_size(t->type, k, &rb))
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s': bad row size", name);
    out->name = t->name.ptr;
    out->data = t->data;
    out->type = t->type;
    out->k = k;
    out->n = n;
    out->row_bytes = (size_t)rb;
    const size_t arb = tern_act_row_bytes(t->type, k);
    if (arb > m->max_act_row_bytes) m->max_act_row_bytes = arb;
    const enum tern_dtype at = tern_act_type(t->type);
    uint32_t ki = 0;
    while (ki < m->n_act_kinds && m->act_kinds[ki] != at) ki++;
    if (ki == m->n_act_kinds && ki < TERN_ARRAY_LEN(m->act_kinds)) m->act_kinds[m->n_act_kinds++] = at;
    if (n > m->max_mat_n) m->max_mat_n = n;
    return TERN_OK;
}

static enum tern_status bind_mat(struct tern_model *m, struct mat *out, uint32_t k, uint32_t n, bool required,
                                 const char *name) {
    memset(out, 0, sizeof *out);
    const struct gguf_tensor *t = gguf_find_tensor(m->f, name);
    if (!t) {
        if (!required) return TERN_OK;
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' is missing (expected shape [%u, %u])", name, k, n);
    }
    return bind_tensor(m, out, k, n, t);
}

enum tern_status model_get_mat(struct tern_model *m, struct mat *out, uint32_t k, uint32_t n, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return bind_mat(m, out, k, n, true, name);
}

enum tern_status model_get_mat_opt(struct tern_model *m, struct mat *out, uint32_t k, uint32_t n, const char *fmt,
                                   ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return bind_mat(m, out, k, n, false, name);
}

enum tern_status model_get_mats(struct tern_model *m, struct mat *out, size_t *stride, uint32_t k, uint32_t n,
                                uint32_t n_mat, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    memset(out, 0, sizeof *out);
    *stride = 0;
    const struct gguf_tensor *t = gguf_find_tensor(m->f, name);
    if (!t)
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' is missing (expected shape [%u, %u, %u])", name, k, n,
                           n_mat);
    if (t->ne[0] != k || t->ne[1] != n || t->ne[2] != n_mat || t->ne[3] != 1) {
        char got[96];
        shape_str(got, sizeof got, t);
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' has shape %s, expected [%u, %u, %u]", name, got, k, n,
                           n_mat);
    }
    /* Bind the first matrix as a 2-D view (type, row checks, activation sizes), then
     * step to the others by the bytes of one. */
    struct gguf_tensor first = *t;
    first.ne[2] = 1;
    first.n_dims = 2;
    enum tern_status st = bind_tensor(m, out, k, n, &first);
    if (st) return st;
    *stride = (size_t)n * out->row_bytes;
    return TERN_OK;
}

enum tern_status model_get_vec(struct tern_model *m, const float **out, uint32_t n, bool required, const char *fmt,
                               ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    *out = NULL;
    const struct gguf_tensor *t = gguf_find_tensor(m->f, name);
    if (!t) {
        if (!required) return TERN_OK;
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' is missing (expected shape [%u])", name, n);
    }
    if (t->n_elements != n || t->ne[0] != n) {
        char got[96];
        shape_str(got, sizeof got, t);
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' has shape %s, expected [%u]", name, got, n);
    }
    if (t->type != TERN_DTYPE_F32)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "model: tensor '%s' has type %s, expected F32", name,
                           tern_dtype_name(t->type));
    *out = t->data;
    return TERN_OK;
}

enum tern_status model_get_embd(struct tern_model *m, struct mat *out, uint32_t n_embd, const char *name) {
    memset(out, 0, sizeof *out);
    const struct gguf_tensor *t = gguf_find_tensor(m->f, name);
    if (!t) return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' is missing", name);
    if (!shape_is(t, n_embd, m->hp.n_vocab) || t->n_dims > 2) {
        char got[96];
        shape_str(got, sizeof got, t);
        return tern_errorf(TERN_ERR_FORMAT, "model: tensor '%s' has shape %s, expected [%u, %u]", name, got, n_embd,
                           m->hp.n_vocab);
    }
    uint64_t rb;
    if (!tern_matmul_supported(t->type) || !tern_dtype_row_size(t->type, n_embd, &rb))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "model: tensor '%s' has type %s, which tern cannot decode", name,
                           tern_dtype_name(t->type));
    out->name = t->name.ptr;
    out->data = t->data;
    out->type = t->type;
    out->k = n_embd;
    out->n = m->hp.n_vocab;
    out->row_bytes = (size_t)rb;
    return TERN_OK;
}

/* ---- layers ----------------------------------------------------------------------- */

enum tern_status model_layers_init(struct tern_model *m, uint32_t n_layer) {
    m->layers = tern_calloc(n_layer, sizeof *m->layers);
    if (!m->layers) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory for %u layers", n_layer);
    m->n_layer = n_layer;
    for (uint32_t il = 0; il < n_layer; il++)
        model_layer_attn(m, il, m->hp.n_head_kv, m->hp.head_dim_k, m->hp.head_dim_v);
    return TERN_OK;
}

void model_layer_attn(struct tern_model *m, uint32_t il, uint32_t n_kv_head, uint32_t head_dim_k,
                      uint32_t head_dim_v) {
    struct model_layer *L = &m->layers[il];
    memset(L, 0, sizeof *L);
    L->kind = LAYER_ATTN;
    L->n_kv_head = n_kv_head;
    L->head_dim_k = head_dim_k;
    L->head_dim_v = head_dim_v;
}

enum tern_status model_layer_recurrent(struct tern_model *m, uint32_t il, const char *const *names,
                                       const size_t *bytes, uint32_t n) {
    if (n > MODEL_MAX_REC_BUFS)
        return tern_errorf(TERN_ERR_INTERNAL, "model: layer %u declares %u recurrent buffers (max %d)", il, n,
                           MODEL_MAX_REC_BUFS);
    struct model_layer *L = &m->layers[il];
    memset(L, 0, sizeof *L);
    L->kind = LAYER_RECURRENT;
    L->n_bufs = n;
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        snprintf(L->bufs[i].name, sizeof L->bufs[i].name, "%s", names[i]);
        L->bufs[i].bytes = bytes[i];
        /* 64-byte aligned buffers: the arch may use aligned vector loads. */
        L->bufs[i].offset = off;
        off += (bytes[i] + 63) & ~(size_t)63;
    }
    L->rec_bytes = off;
    return TERN_OK;
}

/* After load: offsets of recurrent blocks and the info numbers. */
static enum tern_status finish_layers(struct tern_model *m) {
    size_t off = 0;
    uint32_t n_attn = 0, n_rec = 0;
    size_t kv_tok = 0;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        struct model_layer *L = &m->layers[il];
        if (L->kind == LAYER_RECURRENT) {
            L->rec_offset = off;
            if (tern_add_overflow(off, L->rec_bytes, &off))
                return tern_errorf(TERN_ERR_FORMAT, "model: recurrent state size overflows");
            n_rec++;
        } else {
            if (L->n_kv_head == 0 || L->head_dim_k == 0 || L->head_dim_v == 0)
                return tern_errorf(TERN_ERR_INTERNAL, "model: attention layer %u has no KV geometry", il);
            kv_tok += (size_t)L->n_kv_head * (L->head_dim_k + L->head_dim_v) * 2;
            n_attn++;
        }
    }
    m->rec_bytes = off;
    m->info.n_attn_layers = n_attn;
    m->info.n_recurrent_layers = n_rec;
    m->info.hybrid = n_rec > 0;
    m->info.kv_bytes_per_token_f16 = kv_tok;
    m->info.recurrent_bytes = off;
    return TERN_OK;
}

/* ---- model API -------------------------------------------------------------------- */

enum tern_status tern_model_load(const struct tern_model_params *p, struct tern_model **out) {
    *out = NULL;
    if (!p || !p->path) return tern_errorf(TERN_ERR_INVALID, "model: no path given");
    struct tern_model *m = tern_calloc(1, sizeof *m);
    if (!m) return tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
    pthread_mutex_init(&m->eval_mu, NULL);
    pthread_mutex_init(&m->ckpt_mu, NULL);
    m->backend = &tern_backend_cpu;
    enum tern_status st;
    struct gguf_open_opts oo = {.no_mmap = p->no_mmap, .mlock = p->mlock};
    if ((st = gguf_open(p->path, &oo, &m->f))) goto fail;

    const struct gguf_str *arch = NULL;
    if (!gguf_find_kv(m->f, "general.architecture")) {
        st = tern_errorf(TERN_ERR_FORMAT, "model: %s has no general.architecture", p->path);
        goto fail;
    }
    if ((st = gguf_get_str(m->f, "general.architecture", &arch))) goto fail;
    m->arch = tern_arch_find(arch->ptr);
    if (!m->arch) {
        st = tern_errorf(TERN_ERR_UNSUPPORTED, "model: architecture '%s' is not supported (supported: %s)", arch->ptr,
                         tern_arch_names());
        goto fail;
    }
    tern_kernels_init();
    if ((st = m->arch->load(m))) goto fail;
    if ((st = finish_layers(m))) goto fail;

    const struct gguf_str *name = NULL;
    if (gguf_find_kv(m->f, "general.name") && gguf_get_str(m->f, "general.name", &name) == TERN_OK && name->len)
        m->name = tern_strdup(name->ptr);
    else {
        const char *slash = strrchr(p->path, '/');
        m->name = tern_strdup(slash ? slash + 1 : p->path);
    }
    if (!m->name) {
        st = tern_errorf(TERN_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    const struct gguf_str *tmpl = NULL;
    if (gguf_find_kv(m->f, "tokenizer.chat_template") &&
        gguf_get_str(m->f, "tokenizer.chat_template", &tmpl) == TERN_OK)
        m->chat_template = tmpl->ptr;

    /* The tokenizer, when the file has one (generated test models may not). */
    if (gguf_find_kv(m->f, "tokenizer.ggml.model")) {
        if ((st = tern_tokenizer_load(m->f, &m->tok))) {
            tern_error_prefix(st, "model: tokenizer");
            goto fail;
        }
        if (tern_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
            st = tern_errorf(TERN_ERR_FORMAT, "model: the tokenizer has %u tokens but token_embd.weight only %u rows",
                             tern_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
            goto fail;
        }
    }
    if ((st = tern_threadpool_new(p->n_threads, &m->pool))) goto fail;

    struct tern_model_info *in = &m->info;
    in->arch = m->arch->name;
    in->name = m->name;
    in->n_vocab = m->hp.n_vocab;
    in->n_ctx_train = m->hp.n_ctx_train;
    in->n_embd = m->hp.n_embd;
    in->n_layer = m->n_layer;
    in->n_threads = tern_threadpool_n_threads(m->pool);
    for (uint64_t i = 0; i < gguf_n_tensors(m->f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->f, i);
        in->n_params += t->n_elements;
        in->weight_bytes += t->size;
    }
    TERN_LOG_DEBUG("model: %s (%s), %u layers, n_embd %u, vocab %u, %d threads", m->name, in->arch, m->n_layer,
                   in->n_embd, in->n_vocab, in->n_threads);
    *out = m;
    return TERN_OK;
fail:
    tern_model_free(m);
    return st;
}

void tern_model_free(struct tern_model *m) {
    if (!m) return;
    model_device_free(m);      /* a device's context */
    tern_backend_cpu.close(m); /* the CPU's workspace */
    if (m->arch && m->arch->unload) m->arch->unload(m);
    tern_threadpool_free(m->pool);
    tern_tokenizer_free(m->tok);
    free(m->layers);
    free(m->name);
    gguf_close(m->f);
    pthread_mutex_destroy(&m->eval_mu);
    pthread_mutex_destroy(&m->ckpt_mu);
    free(m);
}

const struct tern_model_info *tern_model_info(const struct tern_model *m) { return &m->info; }

const struct tern_tokenizer *tern_model_tokenizer(const struct tern_model *m) { return m->tok; }

const char *tern_model_chat_template(const struct tern_model *m) { return m->chat_template; }
