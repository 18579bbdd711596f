/* What session.c and the backends' state operations (backend/backend.h) share: a
 * checkpoint's layout and the row size of a KV head. */
#ifndef TERN_MODEL_SESSION_IMPL_H
#define TERN_MODEL_SESSION_IMPL_H

#include "model/model.h"
#include "backend/backend.h"

struct tern_vk_buf;

struct tern_checkpoint {
    const struct tern_model *m;
    uint32_t pos;
    uint64_t tok_hash; /* xxh3 of T[0..pos) */
    size_t n_bytes;
    /* Where the bytes are (under m->ckpt_mu when m is on a device): data, the recurrent
     * buffers layer by layer in host memory (n_bytes), and/or dev, the same bytes in a
     * device buffer. A device checkpoint gets data when something reads its bytes
     * (tern_checkpoint_data: a host copy, the device one kept) or when it is spilled (dev
     * freed). Once in host memory the bytes stay there until the checkpoint is freed. */
    uint8_t *data;
    struct tern_vk_buf *dev;
    struct tern_checkpoint *older, *newer; /* m's list of checkpoints with a dev */
};


/* Bytes of one row of one KV head of layer L (v: the V cache). */
static inline size_t session_head_row_bytes(const struct tern_session *s, const struct model_layer *L, bool v) {
    return (size_t)(v ? L->head_dim_v : L->head_dim_k) * (s->kv_type == TERN_KV_F16 ? 2 : 4);
}

#endif
