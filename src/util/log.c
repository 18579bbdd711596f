#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static tern_log_hook log_hook;
static void *log_user;
static int log_level = -1;  /* -1: read TERN_LOG on first use */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *level_name(enum tern_log_level l) {
    switch (l) {
    case TERN_LOG_ERROR: return "error";
    case TERN_LOG_WARN: return "warn";
    case TERN_LOG_INFO: return "info";
    case TERN_LOG_DEBUG: return "debug";
    }
    return "?";
}

static int current_level(void) {
    if (log_level < 0) {
        const char *e = getenv("TERN_LOG");
        int l = TERN_LOG_INFO;
        if (e) {
            if (!strcmp(e, "error")) l = TERN_LOG_ERROR;
            else if (!strcmp(e, "warn")) l = TERN_LOG_WARN;
            else if (!strcmp(e, "debug")) l = TERN_LOG_DEBUG;
        }
        log_level = l;
    }
    return log_level;
}

void tern_log_set_hook(tern_log_hook hook, void *user) {
    pthread_mutex_lock(&log_mu);
    log_hook = hook;
    log_user = user;
    pthread_mutex_unlock(&log_mu);
}

void tern_log_set_level(enum tern_log_level level) { log_level = (int)level; }

int tern_log_enabled(enum tern_log_level level) { return (int)level <= current_level(); }

void tern_log(enum tern_log_level level, const char *fmt, ...) {
    if (!tern_log_enabled(level)) return;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mu);
    if (log_hook) {
        log_hook(level, msg, log_user);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%02d:%02d:%02d.%03ld tern %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, level_name(level), msg);
    }
    pthread_mutex_unlock(&log_mu);
}
