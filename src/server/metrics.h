/* Prometheus text for /metrics from tables: every metric is a row {name, type, help,
 * value}, written with its # HELP and # TYPE lines, so none goes out without a help
 * text. Labelled series and histograms write their head with srv_metric_head and their
 * lines themselves. */
#ifndef TERN_SERVER_METRICS_H
#define TERN_SERVER_METRICS_H

#include "util/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct srv_metric {
    const char *name;
    const char *type; /* counter, gauge, summary, histogram */
    const char *help;
    uint64_t u;    /* the value, unless is_f */
    double f;      /* the value, written with 6 decimals */
    bool is_f;
};

/* A row's value: an integer or a float. */
#define SRV_U(x) .u = (uint64_t)(x)
#define SRV_F(x) .f = (double)(x), .is_f = true

/* "# HELP name help\n# TYPE name type\n". */
void srv_metric_head(struct tern_buf *b, const char *name, const char *type, const char *help);
/* Each row's head and its one sample line. */
void srv_metrics_put(struct tern_buf *b, const struct srv_metric *rows, size_t n);

#endif
