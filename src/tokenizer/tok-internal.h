/* Tokenizer internals shared by the files of src/tokenizer/ (not a public API). */
#ifndef TERN_TOK_INTERNAL_H
#define TERN_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Token attributes, as llama.cpp keeps them (a bit set: a NORMAL token whose text marks
 * it as end-of-generation becomes NORMAL | CONTROL). */
enum {
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
    ATTR_LSTRIP = 1 << 7,
    ATTR_RSTRIP = 1 << 8,
};

/* How a token's piece renders. */
enum { PIECE_NONE = 0, PIECE_ALWAYS = 1, PIECE_SPECIAL = 2 };

/* Exact string -> token id, open addressing over the tokenizer's text pool. */
struct strslot {
    uint32_t id1; /* id + 1; 0 = empty */
    uint32_t tag; /* high 32 bits of the hash, to skip most string compares */
    uint32_t off, len; /* the text, copied here so that a probe touches one cache line */
};
struct strmap {
    struct strslot *slots;
    size_t mask;
};

/* (left id, right id) -> merge rank and result id. */
struct pairslot {
    uint64_t key;   /* ((left + 1) << 32) | (right + 1); 0 = empty */
    uint32_t rank;
    int32_t result; /* -1 when the merged text is not a token */
};
struct pairmap {
    struct pairslot *slots;
    size_t mask;
    size_t n;
};

#define TOK_MAX_REGEX 8

/* Hand-written scanners that reproduce a regex exactly on ASCII text and hand every
 * match that involves a non-ASCII byte to PCRE2 (pretok.c). */
enum pre_fast { FAST_NONE = 0, FAST_LLAMA3_N1, FAST_LLAMA3_N3, FAST_GPT2 };

struct pretok {
    uint32_t n_re;
    pcre2_code *re[TOK_MAX_REGEX];
    bool jit[TOK_MAX_REGEX];
    uint8_t fast[TOK_MAX_REGEX]; /* enum pre_fast */
    bool fast_off;               /* tests: PCRE2 only */
};

/* Trie over the texts of the special tokens (first-child / next-sibling). */
struct trie_node {
    int32_t child;
    int32_t sibling;
    int32_t special; /* index into specials[], -1 if no token ends here */
    uint8_t byte;
};

struct tern_tokenizer {
    enum tern_tok_model model;
    char *model_name;
    char *pre_name;
    uint32_t n_vocab;

    char *text_pool;      /* every token text, NUL-terminated */
    uint32_t *text_off;   /* [n_vocab] */
    uint32_t *text_len;   /* [n_vocab] */
    float *scores;        /* [n_vocab] */
    int8_t *types;        /* [n_vocab] file token types */
    uint16_t *attrs;      /* [n_vocab] ATTR_* */
    struct strmap vocab;  /* text -> id */

    char *piece_pool;     /* what each token renders (tern_token_piece) */
    uint32_t *piece_off;  /* [n_vocab] */
    uint32_t *piece_len;  /* [n_vocab] */
    uint8_t *piece_kind;  /* [n_vocab] PIECE_* */

    int32_t byte_tok[256]; /* BPE: the token of each byte's GPT-2 character; SPM: <0xNN> */
    struct pairmap merges; /* BPE only */
    uint8_t *spm_pairs; /* SPM: [65536 / 8] bit (x << 8 | y) set when some token contains bytes x y */
    struct pretok pre;     /* BPE only */
    bool ignore_merges;    /* a pre-token that is itself a token is emitted whole (llama3) */

    int32_t bos, eos, eot, eom, unk, sep, pad, mask;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    bool add_bos, add_eos, add_space_prefix;

    int32_t *eog;         /* ascending */
    size_t n_eog;
    uint8_t *eog_bits;    /* [n_vocab / 8 + 1] */

    int32_t *specials;    /* CONTROL | USER_DEFINED | UNKNOWN ids, longest text first */
    size_t n_specials;
    struct trie_node *trie; /* node 0 is the root */
    size_t n_trie;
    uint8_t special_first[32]; /* bitmap of the first bytes of special texts */
    uint32_t n_special_first;  /* bits set in it */
    uint8_t special_first_byte; /* the byte, when there is one */
};

/* ---- tok-map.c ------------------------------------------------------------------- */
enum tern_status strmap_init(struct strmap *m, size_t n);
void strmap_free(struct strmap *m);
/* Inserts id (its text is in t's pool, h its hash); returns the id already there for
 * that text, or -1. */
int32_t strmap_insert_h(struct strmap *m, const struct tern_tokenizer *t, int32_t id, uint64_t h);
int32_t strmap_find(const struct strmap *m, const struct tern_tokenizer *t, const char *s, size_t n);
/* The same in steps, for loops that prefetch ahead (loading the merges). */
uint64_t strmap_hash(const char *s, size_t n);
void strmap_prefetch(const struct strmap *m, uint64_t h);
const char *strmap_first_text(const struct strmap *m, const struct tern_tokenizer *t, uint64_t h);
int32_t strmap_find_h(const struct strmap *m, const struct tern_tokenizer *t, const char *s, size_t n, uint64_t h);

enum tern_status pairmap_init(struct pairmap *m, size_t n);
void pairmap_free(struct pairmap *m);
const struct pairslot *pairmap_find(const struct pairmap *m, int32_t l, int32_t r);
uint64_t pairmap_hash(int32_t l, int32_t r);
void pairmap_prefetch(const struct pairmap *m, uint64_t h);
/* Keeps the first rank inserted for a pair (llama.cpp's emplace); h = pairmap_hash(l, r). */
void pairmap_insert_h(struct pairmap *m, int32_t l, int32_t r, uint32_t rank, int32_t result, uint64_t h);

/* ---- pretok.c -------------------------------------------------------------------- */
struct pre_info {
    bool ignore_merges;
    bool add_bos;   /* the default when the file does not say */
    bool bos_none;  /* the pre-tokenizer's models have no BOS */
};
/* Compiles the regexes for pre-tokenizer `name`; TERN_ERR_UNSUPPORTED naming it if unknown. */
enum tern_status pretok_init(struct pretok *p, const char *name, struct pre_info *info);
void pretok_free(struct pretok *p);
/* The end of the match of fast scanner `kind` at s[pos] (pos < n): > pos for a match,
 * 0 when no match starts at pos (the byte is left between matches), -1 when the
 * decision depends on a non-ASCII character (ask PCRE2). */
long pretok_fast_match(int kind, const uint8_t *s, size_t n, size_t pos);
/* Tests: turn the scanners off (PCRE2 only) to compare both paths. */
void tok_set_fast_pretok(struct tern_tokenizer *t, bool on);

/* ---- per-call work state (tokenize.c, bpe.c, spm.c) ------------------------------ */
struct tok_out {
    int32_t **ids;
    size_t *n, *cap;
};

struct word_cache;

enum tern_status tok_grow(void **p, size_t *cap, size_t need, size_t elem);

struct tok_call {
    const struct tern_tokenizer *t;
    struct tok_out out;
    struct tern_tok_stats *stats;
    /* pre-tokenizer */
    pcre2_match_data *md[TOK_MAX_REGEX];
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    size_t jstack_size;
    /* BPE / SPM scratch, grown as needed */
    void *sym;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
    char *buf;
    size_t buf_cap;
    bool use_cache;
    struct word_cache *cache;
    /* tern_tokenize_plain: ranges of the text where control tokens are not matched */
    const struct tern_tok_range *plain;
    size_t n_plain;
};

enum tern_status tok_emit_slow(struct tok_call *c, const int32_t *ids, size_t n);
static inline enum tern_status tok_emit_n(struct tok_call *c, const int32_t *ids, size_t n) {
    size_t have = *c->out.n;
    if (*c->out.cap - have < n) return tok_emit_slow(c, ids, n);
    int32_t *d = *c->out.ids + have;
    for (size_t i = 0; i < n; i++) d[i] = ids[i];
    *c->out.n = have + n;
    return TERN_OK;
}
static inline enum tern_status tok_emit(struct tok_call *c, int32_t id) { return tok_emit_n(c, &id, 1); }

enum tern_status bpe_tokenize(struct tok_call *c, const char *text, size_t len);
enum tern_status spm_tokenize(struct tok_call *c, const char *text, size_t len, bool prefix_space);
void tok_call_release(struct tok_call *c);
/* The per-call cache of pieces of text -> ids (bpe.c). get: true when w was cached
 * (its ids are then emitted, *st says how that went); *h is the hash to pass to put. */
bool tok_cache_get(struct tok_call *c, const char *w, size_t n, uint64_t *h, enum tern_status *st);
void tok_cache_put(struct tok_call *c, const char *w, size_t n, uint64_t h, const int32_t *ids, size_t n_ids);

/* GPT-2 byte-level map: the code point standing for each byte, and back. */
uint32_t bytelevel_cp(uint8_t b);
int bytelevel_byte(uint32_t cp); /* -1 if cp stands for no byte */

#endif
