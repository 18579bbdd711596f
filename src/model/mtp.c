/* The MTP head's session (mtp.h). */
#include "model/mtp.h"

#include "backend/backend.h"
#include "model/arch-qwen35.h"
#include "model/model.h"

#include "util/mem.h"
#include "util/status.h"

#include <stdlib.h>
#include <string.h>

struct tern_mtp {
    /* The head's view of the model: the same weights, tokenizer and thread pool, one
     * attention layer, its own workspace and lock. Never loaded or unloaded: the main
     * model owns everything it points at (on a device, m.gpu too: the head's tern_gpu,
     * kept with the main one's). */
    struct tern_model m;
    struct model_layer layer;
    struct tern_session *s;
};

void tern_session_capture_hidden(struct tern_session *s, float *buf, uint32_t pos0) {
    s->hidden_out = buf;
    s->hidden_pos0 = pos0;
}

/* The head's one attention layer: the main model's attention geometry. */
static struct model_layer mtp_layer(const struct tern_model *mm) {
    return (struct model_layer){.kind = LAYER_ATTN, .n_kv_head = mm->hp.n_head_kv,
                                .head_dim_k = mm->hp.head_dim_k, .head_dim_v = mm->hp.head_dim_v};
}

/* A head over an empty session, or (import) one that has consumed toks[0..n). */
static enum tern_status mtp_make(const struct tern_session *main, bool import, const int32_t *toks, uint32_t n,
                                 struct tern_mtp **out);

enum tern_status tern_mtp_new(const struct tern_session *main, struct tern_mtp **out) {
    return mtp_make(main, false, NULL, 0, out);
}

enum tern_status tern_mtp_import(const struct tern_session *main, const int32_t *toks, uint32_t n,
                                 struct tern_mtp **out) {
    return mtp_make(main, true, toks, n, out);
}

static enum tern_status mtp_make(const struct tern_session *main, bool import, const int32_t *toks, uint32_t n,
                                 struct tern_mtp **out) {
    *out = NULL;
    const struct tern_model *mm = main->m;
    if (!mm->info.has_mtp)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "mtp: model '%s' (%s) has no MTP block (nextn_predict_layers and blk.N.nextn.* tensors)",
                           mm->info.name ? mm->info.name : "?", mm->info.arch ? mm->info.arch : "?");
    struct tern_mtp *h = tern_calloc(1, sizeof *h);
    if (!h) return tern_errorf(TERN_ERR_NOMEM, "mtp: out of memory");
    h->m = *mm;
    memset(&h->m.ws, 0, sizeof h->m.ws);
    pthread_mutex_init(&h->m.eval_mu, NULL);
    h->m.arch = &tern_arch_qwen35_mtp;
    h->layer = mtp_layer(mm);
    h->m.n_layer = 1;
    h->m.layers = &h->layer;
    h->m.rec_bytes = 0;
    h->m.info.n_layer = 1;
    h->m.info.n_attn_layers = 1;
    h->m.info.n_recurrent_layers = 0;
    h->m.info.hybrid = false;
    h->m.info.recurrent_bytes = 0;
    /* none of the main model's checkpoints kept in device memory are the head's */
    pthread_mutex_init(&h->m.ckpt_mu, NULL);
    h->m.ckpt_vram_budget = h->m.ckpt_vram_bytes = 0;
    h->m.ckpt_vram_n = 0;
    h->m.ckpt_oldest = h->m.ckpt_newest = NULL;
    /* on the main model's backend: a device holds the head's own weights beside the
     * main's, once for the model (kept with the main model's context) */
    h->m.backend = &tern_backend_cpu;
    h->m.backend_ctx = NULL;
    if (mm->backend->head) {
        enum tern_status st = mm->backend->head(mm, &h->m, 64);
        if (st) {
            tern_mtp_free(h);
            return tern_error_prefix(st, "mtp: the head on %s", mm->device);
        }
    }
    const struct tern_session_params p = {.n_ctx = main->n_ctx, .kv_type = main->kv_type, .n_chunk = 64};
    enum tern_status st =
        import ? tern_session_import(&h->m, &p, toks, n, NULL, &h->s) : tern_session_new(&h->m, &p, &h->s);
    if (st) {
        tern_mtp_free(h);
        return st;
    }
    *out = h;
    return TERN_OK;
}

void tern_mtp_free(struct tern_mtp *h) {
    if (!h) return;
    tern_session_free(h->s);
    tern_backend_cpu.close(&h->m); /* its workspace on the CPU (a device's head is the main model's) */
    pthread_mutex_destroy(&h->m.eval_mu);
    pthread_mutex_destroy(&h->m.ckpt_mu);
    free(h);
}

enum tern_status tern_mtp_eval(struct tern_mtp *h, const float *hidden, const int32_t *toks, uint32_t n,
                               float *logits_all, float *h_out) {
    struct tern_session *s = h->s;
    s->hidden_in = hidden;
    s->hidden_out = h_out;
    s->hidden_pos0 = s->n_past;
    const struct tern_eval_opts eo = {.logits_all = logits_all};
    enum tern_status st = tern_session_eval(s, toks, n, &eo);
    s->hidden_in = NULL;
    s->hidden_out = NULL;
    return st;
}

const float *tern_mtp_logits(const struct tern_mtp *h) { return tern_session_logits(h->s); }
uint32_t tern_mtp_n_past(const struct tern_mtp *h) { return tern_session_n_past(h->s); }
enum tern_status tern_mtp_rewind(struct tern_mtp *h, uint32_t p) { return tern_session_rewind(h->s, p); }
uint64_t tern_mtp_hash(const struct tern_mtp *h) { return tern_session_hash(h->s); }
size_t tern_mtp_bytes(const struct tern_mtp *h) { return sizeof *h + tern_session_bytes(h->s) + h->m.ws.bytes; }

size_t tern_mtp_kv_row_bytes(const struct tern_model *m, enum tern_kv_type kv) {
    if (!m->info.has_mtp) return 0;
    const struct model_layer L = mtp_layer(m);
    return model_layer_kv_row_bytes(&L, kv);
}

const int32_t *tern_mtp_tokens(const struct tern_mtp *h) { return tern_session_tokens(h->s); }

enum tern_status tern_mtp_kv_export(const struct tern_mtp *h, uint32_t p0, uint32_t p1, void *buf) {
    return tern_session_kv_export(h->s, p0, p1, buf);
}

enum tern_status tern_mtp_kv_import(struct tern_mtp *h, uint32_t p0, uint32_t p1, const void *buf, uint32_t buf_rows) {
    return tern_session_kv_import(h->s, p0, p1, buf, buf_rows);
}
