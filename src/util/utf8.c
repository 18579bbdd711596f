#include "util/utf8.h"

size_t tern_utf8_seq(const uint8_t *s, size_t n, size_t *bad) {
    *bad = 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;      /* no overlongs */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;      /* no overlongs */
        else if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        *bad = 1; /* a continuation byte, C0/C1 or F5..FF: never valid */
        return 0;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) return 0; /* a valid prefix so far: more bytes needed */
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = i; /* the maximal subpart is what was valid so far */
            return 0;
        }
    }
    return need;
}

uint32_t tern_utf8_decode(const uint8_t *s, size_t k) {
    switch (k) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

size_t tern_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tern_utf8_valid_prefix(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad, k = tern_utf8_seq(p + i, n - i, &bad);
        if (!k) break;
        i += k;
    }
    return i;
}

/* The sanitiser; held = NULL: a truncated sequence at the end is replaced too. */
static enum tern_status sanitize(struct tern_buf *out, const char *s, size_t n, size_t *held) {
    const uint8_t *p = (const uint8_t *)s;
    size_t len0 = out->len, i = 0, run = 0; /* run: start of pending valid bytes */
    enum tern_status st;
    if (held) *held = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad, k = tern_utf8_seq(p + i, n - i, &bad);
        if (k) {
            i += k;
            continue;
        }
        if (!bad && held) { /* a proper prefix at the end: the next bytes may complete it */
            *held = n - i;
            n = i;
            break;
        }
        if (!bad) bad = n - i; /* truncated at the end: one replacement */
        if ((st = tern_buf_append(out, s + run, i - run)) != TERN_OK ||
            (st = tern_buf_append(out, TERN_UTF8_REPLACEMENT, 3)) != TERN_OK)
            goto fail;
        i += bad;
        run = i;
    }
    if ((st = tern_buf_append(out, s + run, n - run)) != TERN_OK) goto fail;
    return TERN_OK;
fail:
    out->len = len0;
    if (out->data) out->data[len0] = 0;
    if (held) *held = 0;
    return st;
}

enum tern_status tern_utf8_sanitize(struct tern_buf *out, const char *s, size_t n) { return sanitize(out, s, n, NULL); }

enum tern_status tern_utf8_sanitize_stream(struct tern_buf *out, const char *s, size_t n, size_t *held) {
    return sanitize(out, s, n, held);
}
