/* The multi-token-prediction head of a model (Qwen3.5's nextn block; docs/spec.md, MTP)
 * as a draft source: it reads the main model's output-normed hidden state at position p
 * and the token at p + 1, and its logits guess the token at p + 2.
 *
 * The head keeps its own KV rows (one attention layer) in a session of its own over a
 * view of the model that holds just that layer, so paging, rewinding and chunk
 * invariance are the session code's. Its positions count from the first row it was fed
 * (the caller maps them: attention with RoPE sees only position differences). It is
 * never part of the main session's state, hash, checkpoints or parking. */
#ifndef TERN_MODEL_MTP_H
#define TERN_MODEL_MTP_H

#include "tern.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tern_mtp;

/* A head for the sessions of main's model, with main's context size and KV type.
 * TERN_ERR_UNSUPPORTED when the model has no MTP head (tern_model_info.has_mtp). */
enum tern_status tern_mtp_new(const struct tern_session *main, struct tern_mtp **out);
void tern_mtp_free(struct tern_mtp *h);

/* While buf is set, every eval of s writes the output-normed hidden state of the row at
 * each position p >= pos0 to buf + (p - pos0) * n_embd (the caller sizes buf for the
 * positions it evaluates); NULL stops it. Results do not depend on it. */
void tern_session_capture_hidden(struct tern_session *s, float *buf, uint32_t pos0);

/* Feeds n rows at the head's positions [n_past, n_past + n): row i from hidden[i]
 * (n_embd floats: the main model's hidden state) and toks[i] (the next token). After
 * it, tern_mtp_logits is the guess after the last row; logits_all ([n][n_vocab]) and
 * h_out ([n][n_embd], the head's own output-normed hidden state, the hidden input of a
 * chained guess) are filled when set. Errors as tern_session_eval's (nothing fed). */
enum tern_status tern_mtp_eval(struct tern_mtp *h, const float *hidden, const int32_t *toks, uint32_t n,
                               float *logits_all, float *h_out);
const float *tern_mtp_logits(const struct tern_mtp *h);
uint32_t tern_mtp_n_past(const struct tern_mtp *h);
/* Drops the rows at and above p (p <= n_past). */
enum tern_status tern_mtp_rewind(struct tern_mtp *h, uint32_t p);
/* The memory the head holds (its KV rows and its workspace). */
size_t tern_mtp_bytes(const struct tern_mtp *h);
/* The hash of the head's KV rows [0, n_past) and its tokens (tests). */
uint64_t tern_mtp_hash(const struct tern_mtp *h);

/* ---- storing a head (the disk tier keeps it with its conversation) ----
 * A head is its tokens (what each row was fed) and its KV rows, one attention layer's
 * worth per row, exported and imported like a session's (tern_session_kv_export). */
/* Bytes of one row of the heads of m's sessions with KV type kv; 0 without a head. */
size_t tern_mtp_kv_row_bytes(const struct tern_model *m, enum tern_kv_type kv);
const int32_t *tern_mtp_tokens(const struct tern_mtp *h);
enum tern_status tern_mtp_kv_export(const struct tern_mtp *h, uint32_t p0, uint32_t p1, void *buf);
/* A head for main's sessions that has consumed toks[0..n), its KV rows [0, n)
 * allocated for tern_mtp_kv_import to fill (as tern_session_import); no logits until
 * the next eval. On error *out is NULL. */
enum tern_status tern_mtp_import(const struct tern_session *main, const int32_t *toks, uint32_t n,
                                 struct tern_mtp **out);
enum tern_status tern_mtp_kv_import(struct tern_mtp *h, uint32_t p0, uint32_t p1, const void *buf, uint32_t buf_rows);

#endif
