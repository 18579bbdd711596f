/* ttft.svg: time to first token against turn, one line per arm, prompt tokens as bars
 * on a second axis, turn kinds marked. Written directly as SVG text: no plotting
 * dependency, and the file opens in any browser. Colours are the Okabe-Ito palette
 * (distinguishable with the common colour-vision deficiencies). */
#include "replay/replay.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define W 980.0
#define H 560.0
#define PL 86.0  /* plot area */
#define PR 892.0
#define PT 112.0
#define PB 482.0

static const char *const series_colour[TERN_REPLAY_MAX_ARMS] = {"#0072B2", "#D55E00"};
static const char *const kind_colour[TERN_TURN_KIND_COUNT] = {"#555555", "#009E73", "#CC3311"};

size_t tern_plot_ticks(double lo, double hi, int target, double *ticks, size_t cap) {
    if (!isfinite(lo) || !isfinite(hi) || cap == 0) return 0;
    if (hi <= lo) hi = lo + 1.0;
    if (target < 1) target = 1;
    double raw = (hi - lo) / target;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    double step = (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
    double start = floor(lo / step + 1e-9) * step;
    size_t n = 0;
    for (double v = start; n < cap; v += step) {
        double vv = fabs(v) < step * 1e-9 ? 0.0 : v;
        ticks[n++] = vv;
        if (vv >= hi - step * 1e-9) break;
    }
    return n;
}

static enum tern_status esc(struct tern_buf *b, const char *s) {
    enum tern_status st = TERN_OK;
    for (; *s && st == TERN_OK; s++) {
        switch (*s) {
        case '&': st = tern_buf_puts(b, "&amp;"); break;
        case '<': st = tern_buf_puts(b, "&lt;"); break;
        case '>': st = tern_buf_puts(b, "&gt;"); break;
        case '"': st = tern_buf_puts(b, "&quot;"); break;
        case '\'': st = tern_buf_puts(b, "&apos;"); break;
        default:
            /* Control characters are not allowed in XML 1.0 text. */
            st = tern_buf_putc(b, (unsigned char)*s < 0x20 ? ' ' : *s);
        }
    }
    return st;
}

static void fmt_num(char *out, size_t cap, double v, double step) {
    if (fabs(v) >= 10000 && step >= 1000) snprintf(out, cap, "%.0fk", v / 1000.0);
    else if (step >= 1 || v == 0) snprintf(out, cap, "%.0f", v);
    else if (step >= 0.1) snprintf(out, cap, "%.1f", v);
    else if (step >= 0.01) snprintf(out, cap, "%.2f", v);
    else snprintf(out, cap, "%.3f", v);
}

static enum tern_status marker(struct tern_buf *b, enum tern_turn_kind k, double x, double y, const char *fill,
                               const char *stroke, double r) {
    switch (k) {
    case TERN_TURN_COLD:
        return tern_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                                  "stroke=\"%s\" stroke-width=\"1.2\"/>\n",
                               x - r, y - r, 2 * r, 2 * r, fill, stroke);
    case TERN_TURN_REWRITE:
        r *= 1.35;
        return tern_buf_printf(b, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\" stroke=\"%s\" "
                                  "stroke-width=\"1.2\"/>\n",
                               x, y - r, x + r, y, x, y + r, x - r, y, fill, stroke);
    default:
        return tern_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\" stroke=\"%s\" "
                                  "stroke-width=\"1.2\"/>\n",
                               x, y, r, fill, stroke);
    }
}

enum tern_status tern_plot_svg(const struct tern_plot *p, struct tern_buf *b) {
    if (p->n_series < 1 || p->n_series > TERN_REPLAY_MAX_ARMS)
        return tern_errorf(TERN_ERR_INVALID, "plot of %d series (1..%d)", p->n_series, TERN_REPLAY_MAX_ARMS);
    size_t n = p->n;
    /* Scales. */
    double ymax = 0, tmax = 0;
    for (int s = 0; s < p->n_series; s++)
        for (size_t i = 0; i < n; i++) {
            const struct tern_plot_series *se = &p->series[s];
            double v = se->y_hi && isfinite(se->y_hi[i]) ? se->y_hi[i] : se->y[i];
            if (isfinite(v) && v > ymax) ymax = v;
        }
    for (size_t i = 0; p->prompt_tokens && i < n; i++)
        if (isfinite(p->prompt_tokens[i]) && p->prompt_tokens[i] > tmax) tmax = p->prompt_tokens[i];
    bool ms = ymax < 1.0;
    double unit = ms ? 1000.0 : 1.0;
    double yt[32], tt[32];
    size_t n_yt = tern_plot_ticks(0, ymax > 0 ? ymax * unit : 1.0, 5, yt, 32);
    size_t n_tt = p->prompt_tokens ? tern_plot_ticks(0, tmax > 0 ? tmax : 1.0, 5, tt, 32) : 0;
    double ytop = n_yt ? yt[n_yt - 1] : 1.0, ttop = n_tt ? tt[n_tt - 1] : 1.0;
    double ystep = n_yt > 1 ? yt[1] - yt[0] : 1.0, tstep = n_tt > 1 ? tt[1] - tt[0] : 1.0;
    double slot = n ? (PR - PL) / (double)n : (PR - PL);
#define XOF(i) (PL + slot * ((double)(i) + 0.5))
#define YOF(v) (PB - (PB - PT) * ((v) * unit / ytop))
#define TOF(v) (PB - (PB - PT) * ((v) / ttop))

    enum tern_status st = tern_buf_printf(
        b,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
        "font-family=\"Helvetica, Arial, sans-serif\">\n"
        "<title>",
        W, H, W, H);
    if (st == TERN_OK) st = esc(b, p->title ? p->title : "time to first token per turn");
    if (st == TERN_OK) st = tern_buf_printf(b, "</title>\n<rect width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W, H);
    /* Title and subtitle. */
    if (st == TERN_OK) st = tern_buf_printf(b, "<text x=\"%.0f\" y=\"30\" font-size=\"19\" font-weight=\"bold\" "
                                               "fill=\"#222\">", PL);
    if (st == TERN_OK) st = esc(b, p->title ? p->title : "Time to first token per turn");
    if (st == TERN_OK) st = tern_buf_puts(b, "</text>\n");
    if (st == TERN_OK && p->subtitle) {
        st = tern_buf_printf(b, "<text x=\"%.0f\" y=\"50\" font-size=\"12\" fill=\"#666\">", PL);
        if (st == TERN_OK) st = esc(b, p->subtitle);
        if (st == TERN_OK) st = tern_buf_puts(b, "</text>\n");
    }
    /* Rewrite turns: a faint band behind everything. */
    for (size_t i = 0; i < n && st == TERN_OK; i++)
        if (p->kinds[i] == TERN_TURN_REWRITE)
            st = tern_buf_printf(b, "<rect x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"#CC3311\" "
                                    "fill-opacity=\"0.07\"/>\n",
                                 XOF(i) - slot / 2, PT, slot, PB - PT);
    /* Grid at the left axis's ticks. */
    for (size_t i = 0; i < n_yt && st == TERN_OK; i++) {
        double y = PB - (PB - PT) * (yt[i] / ytop);
        st = tern_buf_printf(b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#e6e6e6\" "
                                "stroke-width=\"1\"/>\n",
                             PL, y, PR, y);
    }
    /* Prompt tokens (and tokens read by the first arm) as bars on the right axis. */
    if (p->prompt_tokens) {
        double bw = slot * 0.56;
        for (size_t i = 0; i < n && st == TERN_OK; i++) {
            double v = p->prompt_tokens[i];
            if (!isfinite(v) || v <= 0) continue;
            st = tern_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#d9dde3\"/>\n",
                                 XOF(i) - bw / 2, TOF(v), bw, PB - TOF(v));
            if (st == TERN_OK && p->read_tokens && isfinite(p->read_tokens[i]) && p->read_tokens[i] > 0) {
                double r = p->read_tokens[i] < v ? p->read_tokens[i] : v;
                st = tern_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                                        "fill=\"#9aa5b1\"/>\n",
                                     XOF(i) - bw / 2, TOF(r), bw, PB - TOF(r));
            }
        }
    }
    /* Axes. */
    if (st == TERN_OK)
        st = tern_buf_printf(b, "<path d=\"M%.0f %.0fV%.0fH%.0f\" fill=\"none\" stroke=\"#333\" stroke-width=\"1.2\"/>\n",
                             PL, PT, PB, PR);
    if (st == TERN_OK && p->prompt_tokens)
        st = tern_buf_printf(b, "<path d=\"M%.0f %.0fV%.0f\" fill=\"none\" stroke=\"#8a939c\" stroke-width=\"1.2\"/>\n",
                             PR, PT, PB);
    char lab[32];
    for (size_t i = 0; i < n_yt && st == TERN_OK; i++) {
        double y = PB - (PB - PT) * (yt[i] / ytop);
        fmt_num(lab, sizeof lab, yt[i], ystep);
        st = tern_buf_printf(b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#333\"/>\n"
                                "<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\" fill=\"#333\">%s</text>\n",
                             PL - 5, y, PL, y, PL - 8, y + 4, lab);
    }
    for (size_t i = 0; i < n_tt && st == TERN_OK; i++) {
        double y = TOF(tt[i]);
        fmt_num(lab, sizeof lab, tt[i], tstep);
        st = tern_buf_printf(b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#8a939c\"/>\n"
                                "<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\" fill=\"#6b7580\">%s</text>\n",
                             PR, y, PR + 5, y, PR + 8, y + 4, lab);
    }
    /* Turn ticks: every turn up to 30, else a stride. */
    size_t stride = n <= 30 ? 1 : (n + 29) / 30;
    for (size_t i = 0; i < n && st == TERN_OK; i++) {
        if (i % stride) continue;
        st = tern_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#333\"/>\n"
                                "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\" fill=\"#333\">%zu</text>\n",
                             XOF(i), PB, XOF(i), PB + 5, XOF(i), PB + 18, i);
    }
    /* The kinds row under the turn numbers. */
    for (size_t i = 0; i < n && st == TERN_OK; i++) {
        if (i % stride && p->kinds[i] != TERN_TURN_REWRITE) continue;
        st = tern_buf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" font-weight=\"bold\" "
                                "text-anchor=\"middle\" fill=\"%s\">%c</text>\n",
                             XOF(i), PB + 33, kind_colour[p->kinds[i]], tern_turn_kind_letter(p->kinds[i]));
    }
    /* Axis titles. */
    if (st == TERN_OK)
        st = tern_buf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"13\" text-anchor=\"middle\" fill=\"#222\">"
                                "turn (kind: C cold, e extension, R rewrite)</text>\n",
                             (PL + PR) / 2, PB + 56);
    if (st == TERN_OK)
        st = tern_buf_printf(b, "<text transform=\"translate(%.0f %.0f) rotate(-90)\" font-size=\"13\" "
                                "text-anchor=\"middle\" fill=\"#222\">time to first token (%s)</text>\n",
                             PL - 56, (PT + PB) / 2, ms ? "ms" : "s");
    if (st == TERN_OK && p->prompt_tokens)
        st = tern_buf_printf(b, "<text transform=\"translate(%.0f %.0f) rotate(90)\" font-size=\"13\" "
                                "text-anchor=\"middle\" fill=\"#6b7580\">prompt tokens</text>\n",
                             PR + 66, (PT + PB) / 2);
    /* The series: whiskers (range over repetitions), the line of medians, markers. */
    for (int s = 0; s < p->n_series && st == TERN_OK; s++) {
        const struct tern_plot_series *se = &p->series[s];
        const char *c = series_colour[s];
        for (size_t i = 0; se->y_lo && se->y_hi && i < n && st == TERN_OK; i++) {
            if (!isfinite(se->y_lo[i]) || !isfinite(se->y_hi[i]) || se->y_hi[i] <= se->y_lo[i]) continue;
            st = tern_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                                    "stroke-opacity=\"0.45\" stroke-width=\"2\"/>\n",
                                 XOF(i), YOF(se->y_lo[i]), XOF(i), YOF(se->y_hi[i]), c);
        }
        bool open = false;
        for (size_t i = 0; i < n && st == TERN_OK; i++) {
            if (!isfinite(se->y[i])) {
                if (open) st = tern_buf_puts(b, "\"/>\n");
                open = false;
                continue;
            }
            if (!open)
                st = tern_buf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2.4\" "
                                        "stroke-linejoin=\"round\" points=\"",
                                     c);
            open = true;
            if (st == TERN_OK) st = tern_buf_printf(b, "%.1f,%.1f ", XOF(i), YOF(se->y[i]));
        }
        if (open && st == TERN_OK) st = tern_buf_puts(b, "\"/>\n");
        for (size_t i = 0; i < n && st == TERN_OK; i++)
            if (isfinite(se->y[i])) st = marker(b, p->kinds[i], XOF(i), YOF(se->y[i]), c, "#ffffff", 4.2);
    }
    /* Legend, above the plot. */
    double lx = PL, ly = 80;
    for (int s = 0; s < p->n_series && st == TERN_OK; s++) {
        st = tern_buf_printf(b, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
                                "stroke-width=\"2.4\"/>\n<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#222\">",
                             lx, ly, lx + 22, ly, series_colour[s], lx + 28, ly + 4);
        if (st == TERN_OK) st = esc(b, p->series[s].label ? p->series[s].label : "");
        if (st == TERN_OK) st = tern_buf_puts(b, "</text>\n");
        lx += 44 + 6.6 * (double)strlen(p->series[s].label ? p->series[s].label : "");
    }
    if (p->prompt_tokens && st == TERN_OK) {
        st = tern_buf_printf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"10\" fill=\"#d9dde3\"/>\n"
                                "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#222\">prompt tokens</text>\n",
                             lx, ly - 5, lx + 20, ly + 4);
        lx += 112;
        if (p->read_tokens && st == TERN_OK) {
            st = tern_buf_printf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"10\" fill=\"#9aa5b1\"/>\n"
                                    "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#222\">",
                                 lx, ly - 5, lx + 20, ly + 4);
            if (st == TERN_OK) st = esc(b, p->read_label ? p->read_label : "tokens read");
            if (st == TERN_OK) st = tern_buf_puts(b, "</text>\n");
            lx += 32 + 6.6 * (double)strlen(p->read_label ? p->read_label : "tokens read");
        }
    }
    static const enum tern_turn_kind order[3] = {TERN_TURN_COLD, TERN_TURN_EXTENSION, TERN_TURN_REWRITE};
    for (int k = 0; k < 3 && st == TERN_OK; k++) {
        st = marker(b, order[k], lx + 6, ly, "#ffffff", "#333333", 4.2);
        if (st == TERN_OK)
            st = tern_buf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#222\">%s</text>\n", lx + 15,
                                 ly + 4, tern_turn_kind_name(order[k]));
        lx += 26 + 6.6 * (double)strlen(tern_turn_kind_name(order[k]));
    }
    if (st == TERN_OK) st = tern_buf_puts(b, "</svg>\n");
#undef XOF
#undef YOF
#undef TOF
    return st;
}
