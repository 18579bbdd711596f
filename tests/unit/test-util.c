/* util: status messages, buffers, checked arithmetic, dtype table, fp16/bf16, UTF-8. */
#include "harness.h"

#include "util/buf.h"
#include "util/dtype.h"
#include "util/fp16.h"
#include "util/mem.h"
#include "util/status.h"
#include "util/utf8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_errorf_keeps_message(void **state) {
    (void)state;
    enum tern_status st = tern_errorf(TERN_ERR_RANGE, "n_ctx %u exceeds %u", 5000u, 4096u);
    assert_int_equal(st, TERN_ERR_RANGE);
    assert_string_equal(tern_last_error(), "n_ctx 5000 exceeds 4096");
    tern_error_prefix(st, "session");
    assert_string_equal(tern_last_error(), "session: n_ctx 5000 exceeds 4096");
    assert_string_equal(tern_status_str(TERN_ERR_STATE), "invalid state");
}

static void test_buf_append_and_limit(void **state) {
    (void)state;
    struct tern_buf b = TERN_BUF_INIT;
    for (int i = 0; i < 1000; i++) assert_int_equal(tern_buf_printf(&b, "%d,", i), TERN_OK);
    assert_true(b.len > 3000);
    assert_int_equal(b.data[b.len], 0);
    assert_memory_equal(b.data, "0,1,2,", 6);
    tern_buf_free(&b);
    b.limit = 4;
    assert_int_equal(tern_buf_puts(&b, "abcd"), TERN_OK);
    assert_int_equal(tern_buf_puts(&b, "e"), TERN_ERR_LIMIT);
    assert_int_equal(b.len, 4); /* unchanged on error */
    tern_buf_free(&b);
}

static void test_alloc_fault_injection(void **state) {
    (void)state;
    unsigned long failed0 = tern_alloc_failures();
    tern_alloc_fail_after(1);
    void *a = tern_malloc(16);
    void *b = tern_malloc(16);
    tern_alloc_fail_after(-1);
    assert_non_null(a);
    assert_null(b);
    assert_int_equal(tern_alloc_failures(), failed0 + 1); /* the failure is counted */
    free(a);
    size_t out;
    assert_true(tern_mul_overflow(SIZE_MAX / 2, 3, &out));
    assert_false(tern_mul_overflow(1000, 1000, &out));
    assert_null(tern_calloc(SIZE_MAX / 2, 3));
}

static void test_dtype_table(void **state) {
    (void)state;
    uint64_t bytes;
    assert_true(tern_dtype_row_size(TERN_DTYPE_Q4_K, 512, &bytes));
    assert_int_equal(bytes, 288);
    assert_false(tern_dtype_row_size(TERN_DTYPE_Q4_K, 100, &bytes)); /* not a block multiple */
    assert_true(tern_dtype_row_size(TERN_DTYPE_Q8_0, 64, &bytes));
    assert_int_equal(bytes, 68);
    assert_null(tern_dtype_info(4)); /* removed Q4_2 */
    assert_null(tern_dtype_info(1000));
    enum tern_dtype t;
    assert_true(tern_dtype_from_name("q6_k", &t));
    assert_int_equal(t, TERN_DTYPE_Q6_K);
    assert_false(tern_dtype_from_name("q9_9", &t));
}

static void test_fp16_roundtrip_all(void **state) {
    (void)state;
    /* Every finite half converts to float and back unchanged. */
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t x = (uint16_t)h;
        if ((x & 0x7c00) == 0x7c00 && (x & 0x03ff)) continue; /* NaN payloads */
        float f = tern_fp16_to_f32(x);
        assert_int_equal(tern_f32_to_fp16(f), x);
    }
    assert_true(tern_fp16_to_f32(0x3c00) == 1.0f);
    assert_true(tern_fp16_to_f32(0x0001) == 0x1p-24f);
    assert_int_equal(tern_f32_to_fp16(65520.0f), 0x7c00); /* rounds to inf */
    assert_true(isnan(tern_fp16_to_f32(tern_f32_to_fp16(NAN))));
    assert_int_equal(tern_f32_to_bf16(1.0f), 0x3f80);
    assert_true(tern_bf16_to_f32(0x3f80) == 1.0f);
    /* round to nearest even */
    assert_int_equal(tern_f32_to_bf16(tern_bits_f32(0x3f808000)), 0x3f80);
    assert_int_equal(tern_f32_to_bf16(tern_bits_f32(0x3f818000)), 0x3f82);
}

/* The one validator (util/utf8.h): Table 3-7 of the Unicode standard. */
static void test_utf8_validator(void **state) {
    (void)state;
    assert_true(tern_utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    assert_true(tern_utf8_valid("\xf4\x8f\xbf\xbf", 4));  /* U+10FFFF */
    assert_true(tern_utf8_valid("\xed\x9f\xbf", 3));      /* U+D7FF */
    assert_false(tern_utf8_valid("\xc0\xaf", 2));         /* overlong */
    assert_false(tern_utf8_valid("\xe0\x80\xaf", 3));     /* overlong */
    assert_false(tern_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    assert_false(tern_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    assert_false(tern_utf8_valid("\xe2\x82", 2));         /* truncated */
    assert_false(tern_utf8_valid("\x80", 1));
    assert_false(tern_utf8_valid("\xff", 1));
    assert_int_equal(tern_utf8_valid_prefix("ab\xe2\x82\xac" "c\xe2\x82", 8), 6);
    assert_int_equal(tern_utf8_valid_prefix("\xc3", 1), 0);
}

static void assert_sanitized_n(const char *in, size_t n, const char *want, size_t want_n) {
    struct tern_buf b = TERN_BUF_INIT;
    assert_int_equal(tern_utf8_sanitize(&b, in, n), TERN_OK);
    assert_int_equal(b.len, want_n);
    assert_memory_equal(b.data, want, b.len);
    assert_true(tern_utf8_valid(b.data, b.len));
    tern_buf_free(&b);
}
#define assert_sanitized(in, n, want) assert_sanitized_n(in, n, want, sizeof(want) - 1)

/* The one sanitiser: one U+FFFD per maximal subpart of an ill-formed sequence. */
static void test_utf8_sanitizer(void **state) {
    (void)state;
#define R TERN_UTF8_REPLACEMENT
    assert_sanitized("plain", 5, "plain");
    assert_sanitized("a\xe2\x82" "b", 4, "a" R "b");        /* E2 82: one maximal subpart */
    assert_sanitized("a\xe2\x82", 3, "a" R);                /* a truncated tail */
    assert_sanitized("\xc0\xaf", 2, R R);                   /* C0 is never valid, nor a lone AF */
    assert_sanitized("\xed\xa0\x80", 3, R R R);             /* a surrogate: each byte */
    assert_sanitized("\xf0\x9f\x98\x80\xff", 5, "\xf0\x9f\x98\x80" R);
    assert_sanitized("x\0y", 3, "x\0y");                    /* NUL is valid UTF-8 */
    /* a stream holds a truncated tail back instead of replacing it */
    struct tern_buf st = TERN_BUF_INIT;
    size_t held = 9;
    assert_int_equal(tern_utf8_sanitize_stream(&st, "ab\xe2\x82", 4, &held), TERN_OK);
    assert_int_equal(held, 2);
    assert_int_equal(st.len, 2);
    assert_memory_equal(st.data, "ab", 2);
    tern_buf_clear(&st);
    assert_int_equal(tern_utf8_sanitize_stream(&st, "\xe2\x82x\xf0", 4, &held), TERN_OK);
    assert_int_equal(held, 1);
    assert_int_equal(st.len, 4);
    assert_memory_equal(st.data, R "x", 4);
    tern_buf_free(&st);
#undef R
    /* A long valid text with a long ill-formed tail costs one pass. The old callers
     * backed off one byte at a time and validated the whole text again: with 1 MiB of
     * each that is 2^40 steps. The prefix scan and the sanitiser look at each byte a
     * bounded number of times, so this ends in linear work (or at ctest's timeout,
     * never by a clock read here). */
    const size_t half = (size_t)1 << 20;
    char *s = malloc(2 * half);
    assert_non_null(s);
    memset(s, 'a', half);
    memset(s + half, 0xff, half);
    assert_int_equal(tern_utf8_valid_prefix(s, 2 * half), half);
    struct tern_buf b = TERN_BUF_INIT;
    assert_int_equal(tern_utf8_sanitize(&b, s, 2 * half), TERN_OK);
    assert_int_equal(b.len, half + 3 * half);
    assert_memory_equal(b.data + half, TERN_UTF8_REPLACEMENT, 3);
    assert_memory_equal(b.data + b.len - 3, TERN_UTF8_REPLACEMENT, 3);
    assert_true(tern_utf8_valid(b.data, b.len));
    tern_buf_free(&b);
    /* a valid text whose last character is cut: only the cut goes */
    memcpy(s + half - 2, "\xe2\x82", 2);
    assert_int_equal(tern_utf8_valid_prefix(s, half), half - 2);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errorf_keeps_message), cmocka_unit_test(test_buf_append_and_limit),
        cmocka_unit_test(test_alloc_fault_injection), cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_fp16_roundtrip_all), cmocka_unit_test(test_utf8_validator),
        cmocka_unit_test(test_utf8_sanitizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
