/* What binds stored state to a model and to tern's state layout (the disk tier,
 * DESIGN.md §9): a file written by another model, another KV type or another version of
 * the state code must never be imported, so both hashes go into every tier file's
 * header and are compared before anything else is read. */
#define XXH_STATIC_LINKING_ONLY
#include "model/model.h"

#include "util/hash.h"

#include <string.h>

/* Bumped whenever the meaning of stored state changes: the KV row order, the recurrent
 * buffers' contents, what a checkpoint holds. */
#define STATE_FORMAT_VERSION 1u

/* Bytes sampled from each tensor's data (start, middle, end): the metadata and tensor
 * table alone do not tell two fine-tunes of one base model apart, and reading every
 * weight would cost seconds at start. */
#define SAMPLE_BYTES 4096u

static void upd(XXH3_state_t *st, const void *p, size_t n) { XXH3_64bits_update(st, p, n); }

static void upd_u64(XXH3_state_t *st, uint64_t v) { upd(st, &v, sizeof v); }

static void upd_str(XXH3_state_t *st, const struct gguf_str *s) {
    upd_u64(st, s->len);
    upd(st, s->ptr, (size_t)s->len);
}

static size_t elem_size(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

uint64_t tern_model_identity(const struct tern_model *m) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    const struct gguf_file *f = m->f;
    const uint64_t n_kv = gguf_n_kv(f);
    upd_u64(&st, n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        upd_str(&st, &kv->key);
        upd_u64(&st, (uint64_t)kv->type);
        switch (kv->type) {
        case GGUF_TYPE_STRING: upd_str(&st, &kv->v.str); break;
        case GGUF_TYPE_ARRAY:
            upd_u64(&st, (uint64_t)kv->v.arr.type);
            upd_u64(&st, kv->v.arr.n);
            if (kv->v.arr.type == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; j < kv->v.arr.n; j++) upd_str(&st, &kv->v.arr.strs[j]);
            } else {
                upd(&st, kv->v.arr.data, (size_t)kv->v.arr.n * elem_size(kv->v.arr.type));
            }
            break;
        case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: upd(&st, &kv->v.f64, sizeof kv->v.f64); break;
        case GGUF_TYPE_BOOL: upd_u64(&st, kv->v.b); break;
        case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
            upd_u64(&st, (uint64_t)kv->v.i64);
            break;
        default: upd_u64(&st, kv->v.u64); break;
        }
    }
    const uint64_t n_t = gguf_n_tensors(f);
    upd_u64(&st, n_t);
    for (uint64_t i = 0; i < n_t; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        upd_str(&st, &t->name);
        upd_u64(&st, t->n_dims);
        upd(&st, t->ne, sizeof t->ne);
        upd_u64(&st, (uint64_t)t->type);
        upd_u64(&st, t->offset);
        upd_u64(&st, t->size);
        if (!t->data || !t->size) continue;
        const uint8_t *d = t->data;
        if (t->size <= 3 * SAMPLE_BYTES) {
            upd(&st, d, (size_t)t->size);
        } else {
            upd(&st, d, SAMPLE_BYTES);
            upd(&st, d + t->size / 2, SAMPLE_BYTES);
            upd(&st, d + t->size - SAMPLE_BYTES, SAMPLE_BYTES);
        }
    }
    return XXH3_64bits_digest(&st);
}

uint64_t tern_state_layout(const struct tern_model *m, enum tern_kv_type kv) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    upd_u64(&st, STATE_FORMAT_VERSION);
    upd_u64(&st, TERN_KV_PAGE);
    upd_u64(&st, (uint64_t)kv);
    upd_u64(&st, m->n_layer);
    upd_u64(&st, m->hp.n_vocab);
    upd_u64(&st, m->rec_bytes);
    const uint16_t endian = 0x0102;
    upd(&st, &endian, sizeof endian);
    for (uint32_t il = 0; il < m->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        upd_u64(&st, (uint64_t)L->kind);
        if (L->kind == LAYER_ATTN) {
            upd_u64(&st, L->n_kv_head);
            upd_u64(&st, L->head_dim_k);
            upd_u64(&st, L->head_dim_v);
        } else {
            upd_u64(&st, L->n_bufs);
            upd_u64(&st, L->rec_offset);
            for (uint32_t b = 0; b < L->n_bufs; b++) {
                upd(&st, L->bufs[b].name, strnlen(L->bufs[b].name, sizeof L->bufs[b].name));
                upd_u64(&st, L->bufs[b].bytes);
                upd_u64(&st, L->bufs[b].offset);
            }
        }
    }
    return XXH3_64bits_digest(&st);
}
