/* Pre-tokenizers of byte-level BPE vocabularies: the regex lists of llama.cpp, by
 * tokenizer.ggml.pre name, written for PCRE2 (UTF + UCP, JIT).
 *
 * llama.cpp runs these regexes in three ways (hand-written scanners for the gpt-2 and
 * llama3 regexes, std::regex over a "collapsed" text where every non-ASCII code point
 * is replaced by a byte standing for its category, std::wregex for patterns with
 * non-ASCII literals). The patterns below reproduce what those produce:
 *
 * - \s is the Unicode White_Space set (llama.cpp maps every non-ASCII White_Space code
 *   point to \v before matching), written out as the class WS. PCRE2's own \s differs
 *   (it has no U+0085).
 * - Each regex runs over one piece of the previous regex's output, so lookarounds and
 *   \z stop at the piece's end. Text between matches becomes pieces of its own.
 * - Literal ranges that include non-ASCII White_Space code points (U+3000 in the
 *   deepseek punctuation class, the U+0800..U+4E00 CJK range) cannot match them in
 *   llama.cpp (they were turned into \v); the ranges here exclude them likewise.
 * - `\s+$` becomes `(?<!WS)WS+\z`: the same leftmost match, without quadratic
 *   rescanning of long whitespace runs that are not at the end.
 * - Capturing groups became non-capturing (nothing reads them). */
#include "tokenizer/tok-internal.h"

#include "util/log.h"

#include <string.h>

#define WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define SP "[" WS "]"
#define NSP "[^" WS "]"
#define CONTR_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" SP "+(?!" NSP ")"

#define RE_LLAMA3_LIKE(NUM)                                                                         \
    CONTR_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" NUM "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|" SP "*[\\r\\n]+|" SP \
             "+(?!" NSP ")|" SP "+"
#define RE_LLAMA3 RE_LLAMA3_LIKE("\\p{N}{1,3}")
#define RE_QWEN2 RE_LLAMA3_LIKE("\\p{N}")

#define RE_QWEN35                                                                                   \
    CONTR_CI "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|" SP \
             "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"

#define RE_SEED_CODER                                                                               \
    CONTR_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^" WS "\\p{L}\\p{N}\\r\\n]+|" SP "*[\\r\\n]+|" SP \
             "+(?!" NSP ")|" SP "+"

#define RE_BAILINGMOE                                                                               \
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS          \
    "\\p{L}\\p{N}]+[\\r\\n]*|" SP "*[\\r\\n]|" SP "+(?!" NSP ")|" SP "+"

#define UPPERISH "(?:(?=\\p{L})[^a-z])"
#define LOWERISH "(?:(?=\\p{L})[^A-Z])"
#define RE_TEKKEN                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "+" LOWERISH     \
    "*|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"
#define RE_GPT4O                                                                                    \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+" CONTR_CI "?|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH     \
    "+" LOWERISH "*" CONTR_CI "?|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" SP "*[\\r\\n]+|" SP  \
    "+(?!" NSP ")|" SP "+"

#define RE_PORO " ?[^(" WS "|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"

/* deepseek-llm's letter class (Unicode cased letters), as in its tokenizer.json. */
#define DS_LETTERS                                                                                  \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"     \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}"               \
    "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}"     \
    "\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}"    \
    "\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"  \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}"   \
    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"   \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"  \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"    \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"             \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"             \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"    \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"  \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                  \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"              \
    "\\x{1E900}-\\x{1E943}"
#define DS_CJK "(?:(?!" SP ")[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}])+"

struct pre_def {
    const char *names; /* space-separated tokenizer.ggml.pre values */
    struct pre_info info;
    const char *re[TOK_MAX_REGEX];
};

static const struct pre_def pre_defs[] = {
    {"default", {0}, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
     {.ignore_merges = true, .add_bos = true},
     {RE_LLAMA3}},
    {"dbrx smaug-bpe", {0}, {RE_LLAMA3}},
    {"glm4 chatglm-bpe", {.bos_none = true}, {RE_LLAMA3}},
    {"deepseek-llm",
     {0},
     {"[\\r\\n]", SP "?[" DS_LETTERS "]+",
      SP "?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+",
      "(?<!" SP ")" SP "+\\z", DS_CJK, "\\p{N}+"}},
    {"deepseek-coder", {0}, {"[\\r\\n]", SP "?\\p{L}+", SP "?\\p{P}+", DS_CJK, "\\p{N}"}},
    {"falcon", {0}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"gpt-2 mpt phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert olmo jais "
     "trillion granite-docling exaone4 jina-v1-en jina-v2-code roberta-bpe",
     {0},
     {RE_GPT2}},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", {0}, {"\\p{N}", RE_GPT2}},
    {"qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2", {0}, {RE_QWEN2}},
    {"qwen35", {0}, {RE_QWEN35}},
    {"seed-coder", {0}, {RE_SEED_CODER}},
    {"bailingmoe bailingmoe2 llada-moe", {0}, {RE_BAILINGMOE}},
    {"tekken", {.ignore_merges = true, .add_bos = true}, {RE_TEKKEN}},
    {"gpt-4o llama4 kanana2 talkie minimax-m2", {0}, {RE_GPT4O}},
    {"viking", {0}, {RE_PORO, "\\p{N}"}},
    {"poro-chat bloom gpt3-finnish", {0}, {RE_PORO}},
};

static bool name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !memcmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

enum tern_status pretok_init(struct pretok *p, const char *name, struct pre_info *info) {
    memset(p, 0, sizeof *p);
    const struct pre_def *def = NULL;
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0] && !def; i++)
        if (name_in(pre_defs[i].names, name)) def = &pre_defs[i];
    if (!def)
        return tern_errorf(TERN_ERR_UNSUPPORTED,
                           "tokenizer.ggml.pre '%s' is not a supported pre-tokenizer (supported: qwen2, "
                           "qwen35, llama-bpe, gpt-2, mpt, deepseek-llm, deepseek-coder, falcon, starcoder, "
                           "refact, default and their aliases; see docs/tokenizer.md)",
                           name);
    *info = def->info;
    for (uint32_t i = 0; i < TOK_MAX_REGEX && def->re[i]; i++) {
        int err;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)def->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            pretok_free(p);
            return tern_errorf(TERN_ERR_INTERNAL, "pre-tokenizer '%s': regex %u does not compile at offset %zu: %s",
                               name, i, (size_t)off, (const char *)msg);
        }
        p->re[i] = re;
        p->jit[i] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
        if (!strcmp(def->re[i], RE_QWEN2))
            p->fast[i] = FAST_LLAMA3_N1;
        else if (!strcmp(def->re[i], RE_LLAMA3))
            p->fast[i] = FAST_LLAMA3_N3;
        else if (!strcmp(def->re[i], RE_GPT2))
            p->fast[i] = FAST_GPT2;
        if (!p->jit[i]) TERN_LOG_DEBUG("tokenizer: PCRE2 JIT unavailable for '%s' regex %u; interpreting", name, i);
        p->n_re = i + 1;
    }
    return TERN_OK;
}

void pretok_free(struct pretok *p) {
    for (uint32_t i = 0; i < TOK_MAX_REGEX; i++) {
        pcre2_code_free(p->re[i]);
        p->re[i] = NULL;
    }
    p->n_re = 0;
}

/* ---- ASCII scanners ----------------------------------------------------------------------
 *
 * PCRE2 spends most of its time per match, not per byte (a call costs about as much
 * as scanning a short word), so the regexes that nearly every model uses get a
 * scanner that decides ASCII-only matches itself. It follows the regex alternative by
 * alternative; wherever the outcome depends on a byte >= 0x80 (is it a letter? a
 * Unicode space?), it answers -1 and the caller runs PCRE2 at that position instead.
 * The unit tests and the fuzz target compare both paths on random text. */

enum { C_O = 0, C_L, C_N, C_W, C_H }; /* other, letter, digit, white space, non-ASCII byte */

#define X16(c) c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c
static const uint8_t ascii_class[256] = {
    C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_W, C_W, C_W, C_W, C_W, C_O, C_O, /* 0x00 */
    X16(C_O),                                                                       /* 0x10 */
    C_W, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, C_O, /* 0x20 */
    C_N, C_N, C_N, C_N, C_N, C_N, C_N, C_N, C_N, C_N, C_O, C_O, C_O, C_O, C_O, C_O, /* 0x30 */
    C_O, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, /* 0x40 */
    C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_O, C_O, C_O, C_O, C_O, /* 0x50 */
    C_O, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, /* 0x60 */
    C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_L, C_O, C_O, C_O, C_O, C_O, /* 0x70 */
    X16(C_H), X16(C_H), X16(C_H), X16(C_H), X16(C_H), X16(C_H), X16(C_H), X16(C_H),
};

static inline int cls(const uint8_t *s, size_t n, size_t i) { return i < n ? ascii_class[s[i]] : -1; }

/* The end of the run of class k starting at i (at least one byte), or -1 if the run
 * reaches a non-ASCII byte (which may or may not belong to the class). */
static long run_end(const uint8_t *s, size_t n, size_t i, int k) {
    size_t e = i + 1;
    while (e < n && ascii_class[s[e]] == k) e++;
    if (e < n && ascii_class[s[e]] == C_H) return -1;
    return (long)e;
}

/* (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,nmax}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+  (qwen2: nmax 1, llama3: nmax 3) */
static long scan_llama3(const uint8_t *s, size_t n, size_t pos, size_t nmax) {
    uint8_t c = s[pos];
    int k = ascii_class[c];
    if (k == C_H) return -1;
    if (c == '\'' && pos + 1 < n) {
        uint8_t a = s[pos + 1] | 0x20; /* lower case for letters; no other byte maps to these */
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return (long)pos + 2;
        if (pos + 2 < n) {
            uint8_t b = s[pos + 2] | 0x20;
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return (long)pos + 3;
        }
    }
    if (k == C_L) return run_end(s, n, pos, C_L);
    if (c != '\r' && c != '\n' && k != C_N) {
        int k1 = cls(s, n, pos + 1);
        if (k1 == C_H) return -1;
        if (k1 == C_L) return run_end(s, n, pos + 1, C_L);
    }
    if (k == C_N) {
        size_t e = pos + 1;
        while (e < n && e - pos < nmax && ascii_class[s[e]] == C_N) e++;
        if (e - pos < nmax && e < n && ascii_class[s[e]] == C_H) return -1;
        return (long)e;
    }
    size_t p = pos + (c == ' ');
    int kp = cls(s, n, p);
    if (kp == C_H) return -1;
    if (kp == C_O) {
        long e = run_end(s, n, p, C_O);
        if (e < 0) return -1;
        while ((size_t)e < n && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }
    /* c is white space here */
    size_t e = pos, last_nl = 0;
    while (e < n && ascii_class[s[e]] == C_W) {
        if (s[e] == '\r' || s[e] == '\n') last_nl = e + 1;
        e++;
    }
    if (e < n && ascii_class[s[e]] == C_H) return -1; /* a Unicode space may continue the run */
    if (last_nl) return (long)last_nl;
    if (e == n || e - pos == 1) return (long)e; /* \s+(?!\S) at the end, or \s+ */
    return (long)e - 1;                        /* \s+(?!\S) leaves the last space to the next word */
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
static long scan_gpt2(const uint8_t *s, size_t n, size_t pos) {
    uint8_t c = s[pos];
    if (ascii_class[c] == C_H) return -1;
    if (c == '\'' && pos + 1 < n) {
        uint8_t a = s[pos + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return (long)pos + 2;
        if (pos + 2 < n) {
            uint8_t b = s[pos + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return (long)pos + 3;
        }
    }
    size_t p = pos + (c == ' ');
    int kp = cls(s, n, p);
    if (kp == C_H) return -1;
    if (kp == C_L || kp == C_N || kp == C_O) return run_end(s, n, p, kp);
    /* c is white space here */
    size_t e = pos;
    while (e < n && ascii_class[s[e]] == C_W) e++;
    if (e < n && ascii_class[s[e]] == C_H) return -1;
    if (e == n) return (long)e;
    if (e - pos >= 2) return (long)e - 1;
    return 0; /* one space before a non-space: no alternative matches here */
}

long pretok_fast_match(int kind, const uint8_t *s, size_t n, size_t pos) {
    switch (kind) {
    case FAST_LLAMA3_N1: return scan_llama3(s, n, pos, 1);
    case FAST_LLAMA3_N3: return scan_llama3(s, n, pos, 3);
    case FAST_GPT2: return scan_gpt2(s, n, pos);
    default: return -1;
    }
}

void tok_set_fast_pretok(struct tern_tokenizer *t, bool on) { t->pre.fast_off = !on; }

uint32_t bytelevel_cp(uint8_t b) {
    /* GPT-2's map: printable Latin-1 bytes stand for themselves; the other 68 bytes
     * (0x00-0x20, 0x7F-0xA0, 0xAD) map, in order, to U+0100.. */
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 256u + 33 + (b - 0x7Fu);
    return 256u + 33 + 34; /* 0xAD */
}

int bytelevel_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 256 && cp <= 256 + 32) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66) return (int)(0x7F + cp - (256 + 33));
    if (cp == 256 + 67) return 0xAD;
    return -1;
}
