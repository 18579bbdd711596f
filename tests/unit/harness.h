/* Shared helpers for unit tests (linked into every cmocka test binary). */
#ifndef TERN_TEST_HARNESS_H
#define TERN_TEST_HARNESS_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* The shared data kit: $TERN_SHARED_DIR as the test runs, else the configure-time path
 * (TERN_SHARED_DIR_DEFAULT, set by ctest), else ../shared. NULL when absent.
 *
 * With TERN_REQUIRE_SHARED=1 (scripts/test.sh sets it when the kit is present) every
 * one of these fails the test (exit 1, naming what is missing) where it would otherwise
 * report the kit or a file as absent: a complete kit is then part of passing. */
const char *th_shared_dir(void);
/* "<shared>/<rel>" in a static buffer (valid until the next call); NULL if no kit. */
const char *th_shared_path(const char *rel);
/* Whether the kit has <rel> (for a test that checks it only where it is there). */
bool th_have_shared(const char *rel);
/* Whether TERN_REQUIRE_SHARED is set. */
bool th_shared_required(void);
/* Exits the test binary with status 77 (ctest: skipped) and a clear message when the
 * shared kit (or the given file in it) is absent. */
void th_require_shared(const char *rel);
/* A fresh private temporary directory (removed at exit). */
const char *th_tmpdir(void);
/* Reads a whole file (caller frees); NULL on error. */
char *th_read_file(const char *path, size_t *len);
/* The built tern executable (TERN_BIN), for tests that drive the CLI. */
const char *th_tern_bin(void);
/* A one-layer random tiny-qwen3 (tern mkmodel's preset, its built-in vocabulary and
 * ChatML-style template) in th_tmpdir, written once per test binary; aborts on error. */
const char *th_tiny_model(void);

/* The Vulkan device a test runs on: $TERN_VK_DEVICE, else the one `--device auto` would
 * take, else device 0. Where this build has no Vulkan backend or the machine no device,
 * th_vulkan_find says why and returns -1, and th_vulkan_device exits 77 (ctest: skipped);
 * with TERN_REQUIRE_VULKAN=1 (the README's test command sets it) both fail the test
 * instead (exit 1, naming what is missing). */
int th_vulkan_find(void);
int th_vulkan_device(void);
/* tern_model_use_device(m, "vulkan:<dev>", n_chunk). */
struct tern_model;
int th_use_vulkan(struct tern_model *m, int dev, uint32_t n_chunk);

#endif
