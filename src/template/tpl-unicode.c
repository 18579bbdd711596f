/* UTF-8 and the Unicode character classes Python's str methods use (isspace,
 * isprintable for repr(), upper/lower/title case mappings ...). The tables are
 * generated from Python's unicodedata by gen-unicode.py. */
#include "template/tpl.h"

#include <string.h>

struct uc_range {
    uint32_t lo, hi;
};
struct uc_map {
    uint32_t lo, hi;
    int32_t delta;
    uint32_t stride;
};
struct uc_special {
    uint32_t cp;
    uint32_t out[3];
};

#include "template/tpl-unicode-tables.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

static bool in_ranges(const struct uc_range *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

static int map_cp(const struct uc_map *m, size_t n, const struct uc_special *sp, size_t n_sp, uint32_t cp,
                  uint32_t out[3]) {
    for (size_t i = 0; i < n_sp; i++) {
        if (sp[i].cp == cp && sp[i].out[0]) {
            int k = 0;
            while (k < 3 && sp[i].out[k]) {
                out[k] = sp[i].out[k];
                k++;
            }
            return k;
        }
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < m[mid].lo) hi = mid;
        else if (cp > m[mid].hi) lo = mid + 1;
        else {
            if ((cp - m[mid].lo) % m[mid].stride == 0) {
                out[0] = (uint32_t)((int64_t)cp + m[mid].delta);
                return 1;
            }
            break;
        }
    }
    out[0] = cp;
    return 1;
}

uint32_t utf8_decode(const char *p, size_t n, size_t *len) {
    const unsigned char *s = (const unsigned char *)p;
    unsigned char c = s[0];
    if (c < 0x80 || n < 2) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (c < 0xF0 || n < 4) {
        if (n < 3) {
            *len = n;
            return 0xFFFD;
        }
        *len = 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

size_t utf8_count(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t utf8_clip(const char *p, size_t n, size_t max) {
    if (n <= max) return n;
    size_t k = max;
    while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
    return k;
}

void utf8_trim_partial(char *s) {
    size_t n = strlen(s), k = n;
    while (k > 0 && ((unsigned char)s[k - 1] & 0xC0) == 0x80) k--;
    if (k > 0 && (unsigned char)s[k - 1] >= 0xC0 && k - 1 + utf8_seqlen((unsigned char)s[k - 1]) > n) s[k - 1] = 0;
}

bool uc_isspace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool uc_isprintable(uint32_t cp) {
    if (cp >= 0x20 && cp < 0x7F) return true;
    return !in_ranges(uc_nonprint, N(uc_nonprint), cp);
}
bool uc_isalpha(uint32_t cp) {
    if (cp < 0x80) return ((cp | 32) - 'a') < 26u;
    return in_ranges(uc_alpha, N(uc_alpha), cp);
}
bool uc_isdecimal(uint32_t cp) {
    if (cp < 0x80) return cp - '0' < 10u;
    return in_ranges(uc_decimal, N(uc_decimal), cp);
}
bool uc_isdigit(uint32_t cp) {
    if (cp < 0x80) return cp - '0' < 10u;
    return in_ranges(uc_digit, N(uc_digit), cp);
}
bool uc_isnumeric(uint32_t cp) {
    if (cp < 0x80) return cp - '0' < 10u;
    return in_ranges(uc_numeric, N(uc_numeric), cp);
}
bool uc_islower(uint32_t cp) {
    if (cp < 0x80) return cp - 'a' < 26u;
    return in_ranges(uc_lower, N(uc_lower), cp);
}
bool uc_isupper(uint32_t cp) {
    if (cp < 0x80) return cp - 'A' < 26u;
    return in_ranges(uc_upper, N(uc_upper), cp);
}
bool uc_iscased(uint32_t cp) {
    if (cp < 0x80) return ((cp | 32) - 'a') < 26u;
    return in_ranges(uc_cased, N(uc_cased), cp);
}
bool uc_is_case_ignorable(uint32_t cp) { return in_ranges(uc_case_ignorable, N(uc_case_ignorable), cp); }

int uc_toupper(uint32_t cp, uint32_t out[3]) {
    if (cp < 0x80) {
        out[0] = cp - 'a' < 26u ? cp - 32 : cp;
        return 1;
    }
    return map_cp(uc_toupper_map, N(uc_toupper_map), uc_toupper_special, N(uc_toupper_special), cp, out);
}
int uc_tolower(uint32_t cp, uint32_t out[3]) {
    if (cp < 0x80) {
        out[0] = cp - 'A' < 26u ? cp + 32 : cp;
        return 1;
    }
    return map_cp(uc_tolower_map, N(uc_tolower_map), uc_tolower_special, N(uc_tolower_special), cp, out);
}
int uc_totitle(uint32_t cp, uint32_t out[3]) {
    if (cp < 0x80) {
        out[0] = cp - 'a' < 26u ? cp - 32 : cp;
        return 1;
    }
    return map_cp(uc_totitle_map, N(uc_totitle_map), uc_totitle_special, N(uc_totitle_special), cp, out);
}
