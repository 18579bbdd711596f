/* The context size a session gets when its parameters say 0 (tern.h's
 * tern_session_params.n_ctx): the model's training context, capped, because KV memory
 * grows with use but the server sizes its checks (prompt + reply < n_ctx) from it.
 * One definition for the session (session.c) and the server (engine.c), which needs
 * the figure before any session exists. */
#ifndef TERN_MODEL_CTX_DEFAULT_H
#define TERN_MODEL_CTX_DEFAULT_H

#include <stdint.h>

/* The cap on the default context (tokens); a larger one must be asked for. */
#define TERN_N_CTX_DEFAULT_CAP 32768u

/* n_ctx_train: the model's training context (0 = unknown). */
static inline uint32_t tern_n_ctx_default(uint32_t n_ctx_train) {
    return n_ctx_train && n_ctx_train < TERN_N_CTX_DEFAULT_CAP ? n_ctx_train : TERN_N_CTX_DEFAULT_CAP;
}

#endif
