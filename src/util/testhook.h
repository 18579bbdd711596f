/* Test hooks: environment variables through which the test suite puts tern into states
 * it cannot reach otherwise in a test's time (a lost or full device, a slow disk write,
 * a step held back, an output dictated by the request). They exist only in a build
 * configured with -DTERN_TEST_HOOKS=ON (scripts/test.sh's builds); in any other build
 * every hook reads as unset, so a deployed binary cannot be steered by them. */
#ifndef TERN_UTIL_TESTHOOK_H
#define TERN_UTIL_TESTHOOK_H

#include <stdbool.h>
#include <stdlib.h>

/* The hook's value ($name), or NULL when unset or when this build has no hooks. */
static inline const char *tern_test_hook(const char *name) {
#ifdef TERN_TEST_HOOKS
    return getenv(name);
#else
    (void)name;
    return NULL;
#endif
}

/* Whether this build reads test hooks. */
static inline bool tern_test_hooks_built(void) {
#ifdef TERN_TEST_HOOKS
    return true;
#else
    return false;
#endif
}

#endif
