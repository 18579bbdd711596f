/* /metrics rows (metrics.h). */
#include "server/metrics.h"

void srv_metric_head(struct tern_buf *b, const char *name, const char *type, const char *help) {
    tern_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void srv_metrics_put(struct tern_buf *b, const struct srv_metric *rows, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const struct srv_metric *m = &rows[i];
        srv_metric_head(b, m->name, m->type, m->help);
        if (m->is_f) tern_buf_printf(b, "%s %.6f\n", m->name, m->f);
        else tern_buf_printf(b, "%s %llu\n", m->name, (unsigned long long)m->u);
    }
}
