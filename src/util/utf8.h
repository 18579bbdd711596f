/* UTF-8 helpers: well-formedness per the Unicode standard (Table 3-7: no overlongs,
 * no surrogates, nothing above U+10FFFF) and replacement of ill-formed input with
 * U+FFFD, one replacement per maximal subpart (the W3C/WHATWG practice), so that
 * every consumer that sanitizes text does it the same way. */
#ifndef TERN_UTIL_UTF8_H
#define TERN_UTIL_UTF8_H

#include "util/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TERN_UTF8_REPLACEMENT "\xEF\xBF\xBD"

/* Classifies the bytes at s[0..n), n > 0:
 *   returns k in 1..4 : s starts with a well-formed sequence of k bytes;
 *   returns 0, *bad > 0 : s starts with an ill-formed maximal subpart of *bad bytes
 *                         (to be replaced by one U+FFFD);
 *   returns 0, *bad = 0 : all of s[0..n) is a proper prefix of a well-formed
 *                         sequence (more bytes are needed to decide). */
size_t tern_utf8_seq(const uint8_t *s, size_t n, size_t *bad);
/* Decodes the well-formed sequence at s (as tern_utf8_seq returned k > 0). */
uint32_t tern_utf8_decode(const uint8_t *s, size_t k);
/* Encodes a code point (<= U+10FFFF) into out; returns the byte count. */
size_t tern_utf8_encode(uint32_t cp, char out[4]);
/* Length in bytes of the longest well-formed prefix of s[0..n). */
size_t tern_utf8_valid_prefix(const char *s, size_t n);
static inline bool tern_utf8_valid(const char *s, size_t n) { return tern_utf8_valid_prefix(s, n) == n; }
/* Appends s[0..n) to out with every ill-formed maximal subpart (including a truncated
 * sequence at the end) replaced by U+FFFD. On error out is unchanged. */
enum tern_status tern_utf8_sanitize(struct tern_buf *out, const char *s, size_t n);
/* The same for a stream: a proper prefix of a well-formed sequence at the very end (the
 * next bytes may complete it) is left out instead of replaced; *held gets its length
 * (0 to 3), the bytes s[n - *held .. n). On error out is unchanged and *held = 0. */
enum tern_status tern_utf8_sanitize_stream(struct tern_buf *out, const char *s, size_t n, size_t *held);

#endif
