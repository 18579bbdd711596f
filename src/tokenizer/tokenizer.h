/* Tokenizers built from a GGUF file's tokenizer.* metadata, behaving as llama.cpp's:
 *
 * - byte-level BPE (tokenizer.ggml.model = "gpt2"), pre-tokenized by the regexes that
 *   tokenizer.ggml.pre names (qwen2, llama-bpe, gpt-2, deepseek-llm, deepseek-coder,
 *   falcon, starcoder, refact, mpt, default, ...; run through PCRE2 with JIT);
 * - SentencePiece BPE (tokenizer.ggml.model = "llama"): score-ordered merges over
 *   UTF-8 characters, '▁' for spaces, a dummy leading space, <0xNN> byte fallback.
 *
 * Special tokens (CONTROL and UNKNOWN) are recognised in text only with
 * TERN_TOK_PARSE_SPECIAL; USER_DEFINED tokens are always split out before the
 * pre-tokenizer runs, as llama.cpp (and HF tokenizers) do. End-of-generation tokens
 * are determined as llama.cpp determines them (eos, eot, eom, and tokens by text:
 * <|im_end|>, <|endoftext|>, <|eot_id|>, <|end|>, ...).
 *
 * Invalid UTF-8 input never fails: byte-level BPE encodes every byte (decode gives the
 * input back byte for byte, unlike llama.cpp, which replaces invalid bytes by U+FFFD);
 * SPM falls back to byte tokens.
 *
 * A loaded tokenizer is immutable: every function here may be called from any number
 * of threads at once. Details and deviations from llama.cpp: docs/tokenizer.md. */
#ifndef TERN_TOKENIZER_H
#define TERN_TOKENIZER_H

#include "gguf/gguf.h"
#include "tern.h"
#include "util/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GGUF tokenizer.ggml.token_type values. */
enum tern_token_type {
    TERN_TOKEN_TYPE_UNDEFINED = 0,
    TERN_TOKEN_TYPE_NORMAL = 1,
    TERN_TOKEN_TYPE_UNKNOWN = 2,
    TERN_TOKEN_TYPE_CONTROL = 3,
    TERN_TOKEN_TYPE_USER_DEFINED = 4,
    TERN_TOKEN_TYPE_UNUSED = 5,
    TERN_TOKEN_TYPE_BYTE = 6,
};

enum tern_tok_model {
    TERN_TOK_MODEL_BPE = 1, /* "gpt2": byte-level BPE */
    TERN_TOK_MODEL_SPM = 2, /* "llama": SentencePiece BPE with byte fallback */
};

/* Loads the tokenizer described by f's tokenizer.* keys. Copies everything it needs:
 * f may be closed afterwards. On error *out is NULL and the message names the key and
 * the problem (unknown model or pre-tokenizer, counts that disagree, bad ids ...). */
enum tern_status tern_tokenizer_load(const struct gguf_file *f, struct tern_tokenizer **out);
/* Convenience: opens path (metadata only) and loads its tokenizer. */
enum tern_status tern_tokenizer_load_file(const char *path, struct tern_tokenizer **out);
void tern_tokenizer_free(struct tern_tokenizer *t);

uint32_t tern_tokenizer_n_vocab(const struct tern_tokenizer *t);
enum tern_tok_model tern_tokenizer_model(const struct tern_tokenizer *t);
const char *tern_tokenizer_model_name(const struct tern_tokenizer *t); /* "gpt2", "llama" */
const char *tern_tokenizer_pre(const struct tern_tokenizer *t);        /* tokenizer.ggml.pre, or "default" */

/* Special token ids; -1 if none. */
int32_t tern_token_bos(const struct tern_tokenizer *t);
int32_t tern_token_eos(const struct tern_tokenizer *t);
int32_t tern_token_eot(const struct tern_tokenizer *t);
int32_t tern_token_pad(const struct tern_tokenizer *t);
int32_t tern_token_unk(const struct tern_tokenizer *t);
/* tokenizer.ggml.add_bos_token / add_eos_token, defaulting per model type as llama.cpp
 * does (SPM and llama3-style BPE add BOS, others do not). */
bool tern_tokenizer_add_bos(const struct tern_tokenizer *t);
bool tern_tokenizer_add_eos(const struct tern_tokenizer *t);
/* SPM: a space is put before the text (tokenizer.ggml.add_space_prefix, default true). */
bool tern_tokenizer_add_space_prefix(const struct tern_tokenizer *t);

/* The token predicates are false for ids outside the vocabulary. */
bool tern_token_is_eog(const struct tern_tokenizer *t, int32_t id);
bool tern_token_is_control(const struct tern_tokenizer *t, int32_t id); /* CONTROL (also forced, e.g. eog texts) */
/* The type stored in the file (tokenizer.ggml.token_type; NORMAL when absent); -1 for
 * an id outside the vocabulary. */
int32_t tern_token_type(const struct tern_tokenizer *t, int32_t id);
float tern_token_score(const struct tern_tokenizer *t, int32_t id);
/* The raw vocabulary string (NUL-terminated; *len may be NULL); NULL if out of range. */
const char *tern_token_text(const struct tern_tokenizer *t, int32_t id, size_t *len);
/* Exact vocabulary lookup of a raw string; -1 if none. */
int32_t tern_token_find(const struct tern_tokenizer *t, const char *text, size_t len);
/* The tokens that can be matched in text as a whole (CONTROL, USER_DEFINED, UNKNOWN),
 * longest text first. Returns their count; *ids stays valid while t lives. */
size_t tern_tokenizer_special_tokens(const struct tern_tokenizer *t, const int32_t **ids);
/* End-of-generation ids, ascending. */
size_t tern_tokenizer_eog_tokens(const struct tern_tokenizer *t, const int32_t **ids);

enum tern_tokenize_flags {
    TERN_TOK_ADD_SPECIAL = 1,   /* tokenize: add BOS/EOS as the metadata says; detokenize: drop them */
    TERN_TOK_PARSE_SPECIAL = 2, /* tokenize: match CONTROL token text; pieces: render CONTROL tokens */
};

/* Work counters of one call (for tests and benchmarks). */
struct tern_tok_stats {
    uint64_t n_words;        /* pre-tokens (BPE) or fragments (SPM) */
    uint64_t n_cache_hits;   /* pre-tokens answered from the per-call cache */
    uint64_t n_bpe_words;    /* pre-tokens merged from their bytes */
    uint64_t n_pair_lookups; /* merge / bigram table lookups */
    uint64_t n_merges;       /* merges applied */
    uint64_t n_heap_ops;     /* priority-queue pushes and pops */
};

/* Tokenizes text[0..len) and appends the ids to *ids (growable: *ids may be NULL, *n
 * and *cap track it; the caller frees *ids). Any bytes are accepted. On error the ids
 * appended so far are dropped (*n is restored) and *ids stays valid. */
enum tern_status tern_tokenize(const struct tern_tokenizer *t, const char *text, size_t len, int flags,
                               int32_t **ids, size_t *n, size_t *cap);
/* A byte range [start, end) of a text. */
struct tern_tok_range {
    size_t start, end;
};

/* As tern_tokenize, except that with TERN_TOK_PARSE_SPECIAL control (and unknown) token
 * text is matched only where it lies wholly outside every plain range (sorted,
 * disjoint, offsets into text): inside one it is ordinary text, tokenized together with
 * its neighbours. The text is split at the control tokens matched, and nowhere else (not
 * at range edges), so a text whose plain ranges hold no control token text gives exactly
 * the ids of tern_tokenize with the same flags. USER_DEFINED tokens are split out
 * everywhere, as always. For a chat prompt: plain = the bytes that came from the
 * request (tern_template_render_spans), so that only the template's own literals can
 * produce control tokens. */
enum tern_status tern_tokenize_plain(const struct tern_tokenizer *t, const char *text, size_t len, int flags,
                                     const struct tern_tok_range *plain, size_t n_plain, int32_t **ids, size_t *n,
                                     size_t *cap);

/* Same, accumulating work counters into *stats (may be NULL). */
enum tern_status tern_tokenize_ex(const struct tern_tokenizer *t, const char *text, size_t len, int flags,
                                  int32_t **ids, size_t *n, size_t *cap, struct tern_tok_stats *stats);

/* Appends the bytes token id stands for: byte-level BPE decoded, SPM '▁' -> ' ',
 * <0xNN> -> the byte; USER_DEFINED tokens give their text; CONTROL and UNKNOWN tokens
 * give their text only with TERN_TOK_PARSE_SPECIAL, otherwise nothing; UNUSED tokens
 * give nothing. A piece may be an incomplete part of a UTF-8 sequence.
 * TERN_ERR_RANGE for an id outside the vocabulary (out unchanged). */
enum tern_status tern_token_piece(const struct tern_tokenizer *t, int32_t id, int flags, struct tern_buf *out);
/* The piece without copying: a pointer into the tokenizer (not NUL-terminated) and its
 * length, honouring flags as tern_token_piece does; NULL for an id out of range. */
const char *tern_token_piece_ref(const struct tern_tokenizer *t, int32_t id, int flags, size_t *len);

/* Appends the text of ids[0..n). With a space prefix (SPM), the leading space of the
 * first piece that renders anything is removed, so decode(encode(x)) == x for text
 * that does not start with a special token. With TERN_TOK_ADD_SPECIAL a leading BOS and
 * a trailing EOS that tokenize would have added are skipped. Bytes are passed through
 * as they are (the result may be invalid UTF-8 if the ids are). No clean-up of spaces
 * around punctuation is done (llama.cpp's clean_spaces), so BPE decoding is lossless.
 * TERN_ERR_RANGE for an id outside the vocabulary (out unchanged). */
enum tern_status tern_detokenize(const struct tern_tokenizer *t, const int32_t *ids, size_t n, int flags,
                                 struct tern_buf *out);

/* Streaming detokenizer: push ids one by one and get back only complete, valid UTF-8
 * (a character split across tokens is held back until it is complete; ill-formed
 * bytes become U+FFFD). flush emits what is held back (an incomplete sequence as one
 * U+FFFD) and resets. flags as for tern_token_piece. No leading space is removed. */
struct tern_detok;
enum tern_status tern_detok_new(const struct tern_tokenizer *t, int flags, struct tern_detok **out);
/* On error (bad id, TERN_ERR_RANGE; no memory) out and the held-back bytes are unchanged. */
enum tern_status tern_detok_push(struct tern_detok *d, int32_t id, struct tern_buf *out);
enum tern_status tern_detok_flush(struct tern_detok *d, struct tern_buf *out);
/* Bytes currently held back (0..3). */
size_t tern_detok_pending(const struct tern_detok *d);
void tern_detok_free(struct tern_detok *d);

#endif
