/* Speculative decoding (DESIGN.md §8: speculative drafts are rows too; docs/spec.md).
 *
 * A decoder stands between a decode loop and its session: the loop asks it for the next
 * token (spec_next) and tells it which token to continue after (spec_accept), exactly as
 * a plain loop samples from the session's logits and then evaluates the token. With a
 * draft source the decoder guesses the tokens that follow, evaluates the token and the
 * guesses as one chunk with logits for every position, and keeps the longest prefix the
 * target model itself picks (the sampler decides each position; a drafted token only
 * saves the forward that would have produced it). Chunk invariance (DESIGN.md §5) makes
 * every logit the same as in a plain run, so greedy output is bit-identical, and with
 * sampling the speculative-sampling rule keeps the distribution exactly the target's.
 *
 * The session may run ahead of what the loop has accepted (rejected guesses, or
 * accepted ones the loop has not consumed yet); spec_finish brings it back to exactly
 * the accepted tokens: an attention-only model rewinds its KV rows, a hybrid one
 * rewinds too, taking the recurrent state that the verify chunk recorded after each
 * position (tern_eval_opts.rec_trail; or, with refeed, restores a checkpoint taken
 * before the chunk and re-reads the accepted tokens). Nothing is parked or
 * checkpointed in between: the caller's checkpoints are never taken during decoding,
 * and the session is committed only after spec_finish. */
#ifndef TERN_SERVER_SPEC_H
#define TERN_SERVER_SPEC_H

#include "tern.h"

struct tern_gmatch;

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPEC_MAX_DRAFT 32    /* the longest draft (--spec-max) */
#define SPEC_DEFAULT_MAX 8   /* the default --spec-max */
/* The default bound of a hybrid request's state trail (--spec-trail): max + 1 recurrent
 * states would be 174 MiB for Qwen3.5-0.8B's 19.3 MiB at --spec-max 8. */
#define SPEC_TRAIL_DEFAULT_MIB 128

enum spec_mode {
    SPEC_OFF = 0,
    SPEC_NGRAM,  /* prompt lookup: the last 3..1 tokens matched against the context */
    SPEC_ORACLE, /* tests and benchmarks: drafts from a known continuation */
    SPEC_MTP,    /* the model's multi-token-prediction head (Qwen3.5 nextn), greedy, chained */
};

const char *spec_mode_name(enum spec_mode m);
/* "off", "ngram" or "mtp" (the oracle is not a user-facing mode); false when unknown. */
bool spec_mode_parse(const char *s, enum spec_mode *out);

/* Drafts from a continuation known in advance: toks[i] is proposed as the i-th
 * generated token. Each proposed token is replaced by a wrong one ((t + 1) mod n_vocab)
 * with probability reject_pct / 100, decided by a hash of (seed, i), so a run is
 * reproducible. */
struct spec_oracle {
    const int32_t *toks;
    size_t n;
    uint32_t reject_pct;
    uint64_t seed;
};

struct spec_params {
    enum spec_mode mode;
    uint32_t max;                     /* tokens per draft, 1..SPEC_MAX_DRAFT; 0 = default */
    const struct spec_oracle *oracle; /* SPEC_ORACLE: borrowed for the decoder's life */
    /* Hybrid models: bring the recurrent state back by a checkpoint before each verify
     * chunk and a re-read of the accepted tokens, instead of the state trail (the
     * alternative docs/spec.md measures; tests and benchmarks). */
    bool refeed;
    /* Hybrid models: the most bytes the state trail may take (0: SPEC_TRAIL_DEFAULT_MIB).
     * A trail holds one recurrent state per token of a verify chunk, so max shrinks to
     * what it holds; where it would not hold two, refeed is used (one state). */
    size_t trail_bytes;
    /* SPEC_MTP: the main model's hidden states of the session's positions
     * [prompt_hidden_pos0, n_past) at init, as tern_session_capture_hidden wrote them
     * while the prompt was read (borrowed for spec_dec_init only). The head is fed those
     * rows first, so that it attends over the prompt too; NULL: its rows start with the
     * first generated token (docs/spec.md). */
    const float *prompt_hidden;
    uint32_t prompt_hidden_pos0;
    /* SPEC_MTP: a head the conversation's previous request left (spec_take_head; the
     * decoder takes it over, and frees it when it is not used), with its rows for main
     * positions [head_base, head_base + its n_past); rows at or above head_upto are
     * dropped (the resume point r - 1: the row of p holds the token at p + 1). The head
     * then attends over the conversation's earlier rows too, not only this prompt's. */
    struct tern_mtp *head;
    uint32_t head_base, head_upto;
};

struct spec_stats {
    uint64_t drafted;  /* tokens proposed and verified */
    uint64_t accepted; /* of those, the ones the target model picked */
    uint64_t rounds;   /* verify chunks */
    uint64_t refed;    /* tokens read again to bring a hybrid state back after a rejection */
    double t_ckpt;     /* seconds saving the recurrent state before verify chunks (refeed) */
    double t_settle;   /* seconds bringing the session back (restore + re-read, rewind) */
    double t_draft;    /* seconds drafting (the MTP head's rows) */
};

struct spec_dec {
    struct tern_session *s;
    struct tern_sampler *smp;
    enum spec_mode mode;
    uint32_t max;
    uint32_t cur;                /* prompt lookup: the current cap, adapted to what is accepted */
    const struct spec_oracle *oracle;
    const atomic_int *cancel;
    uint32_t n_vocab;
    bool hybrid;
    uint32_t n_commit;           /* the session's position holding exactly the accepted tokens */
    size_t n_gen;                /* tokens spec_next has returned */
    int32_t q[SPEC_MAX_DRAFT + 1]; /* tokens decided ahead: accepted drafts (consumed), then the next one */
    uint32_t nq, iq;
    int32_t buf[SPEC_MAX_DRAFT + 1]; /* the verify chunk: the token, then the draft */
    uint32_t v0;                 /* the position of the last verify chunk's first token */
    float *logits;               /* (max + 1, n_vocab) the verify chunk's logits */
    struct tern_checkpoint *ck;  /* hybrid, refeed: the state before the last verify chunk */
    bool refeed;
    uint8_t *trail;              /* hybrid: (max + 1, recurrent_bytes) the states after each verified position */
    /* A grammar (spec_set_grammar): every token is decided under its mask and taken into
     * the matcher as it is decided, so the matcher runs through exactly the states a plain
     * constrained loop would, and q holds only tokens it took. */
    struct tern_gmatch *gm;
    uint32_t *gmask;             /* (n_vocab / 32 words) the caller's */
    double *t_mask;              /* seconds computing masks are added here (may be NULL) */
    enum tern_status gst;        /* why the grammar stopped (TERN_OK: no token allowed) */
    /* SPEC_MTP (docs/spec.md): the head, and the main model's hidden states that it has
     * not been fed yet: those of positions [hid_pos0, hid_pos0 + hid_n), captured by the
     * last verify chunk (its accepted rows). The head's position q is the main
     * position mtp_base + q; its rows cover main positions [mtp_base, n_commit - 1). */
    struct tern_mtp *mtp;
    float *hid;                  /* (max + 1, n_embd) */
    uint32_t hid_pos0, hid_n;
    uint32_t mtp_base;
    bool took_head;              /* the head came with spec_params.head */
    float *mtp_h;                /* (n_embd) the head's own hidden state: a chained guess's input */
    uint32_t n_embd;
    struct spec_stats st;
};

/* Binds a decoder to a session whose logits are valid (after priming) and a sampler;
 * both stay owned by the caller. cancel (may be NULL) is checked before each chunk. */
enum tern_status spec_dec_init(struct spec_dec *d, struct tern_session *s, struct tern_sampler *smp,
                               const struct spec_params *p, const atomic_int *cancel);
/* After spec_finish: the MTP head (NULL: none), for the conversation's next request
 * (spec_params.head); *base is the main position of its row 0. The caller owns it. */
struct tern_mtp *spec_take_head(struct spec_dec *d, uint32_t *base);
void spec_dec_free(struct spec_dec *d);

/* The next token the target model produces, as tern_sampler_sample would pick it after
 * the accepted tokens (an end-of-generation token included: the caller decides). With a
 * grammar: as tern_sampler_sample_masked under the matcher's mask, already taken into
 * the matcher; -1 when the grammar allows no token (d->gst says why when it failed). */
int32_t spec_next(struct spec_dec *d);
/* Holds every later decision to grammar matcher gm (in its current state; gmask is the
 * caller's buffer for masks), e.g. when a tool call opens. Tokens decided ahead without
 * it are dropped (the session is brought back at the next spec_prepare), so the output
 * is what a plain loop that took the grammar at this point gives. */
void spec_set_grammar(struct spec_dec *d, struct tern_gmatch *gm, uint32_t *gmask, double *t_mask);
/* Continues after tok, the token spec_next just returned (what a plain loop does by
 * evaluating it). want: how many more tokens the caller may still ask for (drafts
 * beyond it would be wasted). Errors as tern_session_eval's; TERN_ERR_CANCELLED leaves
 * the accepted tokens without tok, consistent. */
enum tern_status spec_accept(struct spec_dec *d, int32_t tok, size_t want);
/* spec_accept in two halves, for a caller that evaluates the rows itself (the step
 * scheduler batches them with other requests' rows: DESIGN.md §8, drafts are rows too):
 * spec_prepare decides what to evaluate after tok — out->n == 0: nothing (tok was an
 * accepted draft the session holds already); else out->toks[0..n) (tok and the draft)
 * with every position's logits into out->logits_all and the recurrent states into
 * out->rec_trail when they are set (n > 1), else as a plain token. After that
 * evaluation, spec_commit decides the accepted tokens; after a failed one, spec_abort
 * brings the session back. */
struct spec_rows {
    const int32_t *toks;
    uint32_t n;
    float *logits_all;
    void *rec_trail;
};
enum tern_status spec_prepare(struct spec_dec *d, int32_t tok, size_t want, struct spec_rows *out);
void spec_commit(struct spec_dec *d, const struct spec_rows *r);
void spec_abort(struct spec_dec *d);
/* The position of the accepted tokens (the session's n_past once finished). */
uint32_t spec_n_past(const struct spec_dec *d);
/* Brings the session to exactly the accepted tokens (idempotent) and detaches it from
 * the decoder's buffers. Before the session is hashed, parked or checkpointed, and before
 * spec_dec_free. */
enum tern_status spec_finish(struct spec_dec *d);

/* Prompt lookup: matches the last n tokens of ctx + last (n = 3, 2, 1) against earlier
 * positions, the most recent match first, and copies up to max tokens that followed it
 * into out. Returns how many (0: no match). */
size_t spec_ngram_draft(const int32_t *ctx, size_t n_ctx, int32_t last, uint32_t max, int32_t *out);

#endif
