/* Monotonic clock helpers. */
#ifndef TERN_UTIL_TIMEUTIL_H
#define TERN_UTIL_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

static inline uint64_t tern_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline double tern_now_s(void) { return (double)tern_now_ns() * 1e-9; }

#endif
