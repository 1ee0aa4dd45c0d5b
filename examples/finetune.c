/* Learning-rate schedules, the metrics log and its SVG picture. */
#include "examples/finetune.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h" /* defines: zo_file_write_all */

/* ---- schedules -------------------------------------------------------------------- */

static const char *const SCHEDULE_NAMES[] = {"constant", "cosine", "linear"};

zo_status ft_schedule_parse(const char *s, const char *what, ft_schedule_kind *out)
{
    for (int k = 0; k < 3; k++)
        if (!strcmp(s, SCHEDULE_NAMES[k])) {
            *out = (ft_schedule_kind)k;
            return ZO_OK;
        }
    return zo_error(ZO_ERR_INVALID, "%s %s: expected constant, cosine or linear", what, s);
}

const char *ft_schedule_name(ft_schedule_kind k) { return SCHEDULE_NAMES[k]; }

double ft_lr_at(const ft_schedule *s, long k)
{
    if (k < s->warmup) return s->lr * (double)(k + 1) / (double)s->warmup;
    if (s->kind == FT_LR_CONSTANT) return s->lr;
    long span = s->steps - s->warmup;
    double p = span > 0 ? (double)(k - s->warmup) / (double)span : 1.0;
    if (p > 1.0) p = 1.0;
    if (s->kind == FT_LR_LINEAR) return s->lr + (s->min_lr - s->lr) * p;
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

/* ---- the log ------------------------------------------------------------------------ */

static const char *const TIER_NAMES[FT_TIERS] = {"gpu", "cpu", "nvme"};

zo_status ft_log_write(FILE *f, const char *path, const ft_record *r)
{
    fprintf(f, "{\"step\": %ld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens_per_s\": %.6g, "
               "\"peak_bytes\": {",
            r->step, r->loss, r->lr, r->grad_norm, r->tokens_per_s);
    for (int t = 0; t < FT_TIERS; t++)
        fprintf(f, "\"%s\": %llu%s", TIER_NAMES[t], (unsigned long long)r->peak[t], t + 1 < FT_TIERS ? ", " : "}");
    if (r->has_eval) fprintf(f, ", \"eval_loss\": %.9g, \"eval_ppl\": %.9g", r->eval_loss, r->eval_ppl);
    fprintf(f, "}\n");
    if (fflush(f) != 0 || ferror(f)) return zo_error(ZO_ERR_IO, "%s: cannot write the log", path);
    return ZO_OK;
}

typedef struct line_rec {
    ft_record r;
    size_t line;
} line_rec;

static int cmp_step_line(const void *a, const void *b)
{
    const line_rec *x = a, *y = b;
    if (x->r.step != y->r.step) return x->r.step < y->r.step ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

static int num(const cJSON *o, const char *k, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(it)) return 0;
    *v = it->valuedouble;
    return 1;
}

zo_status ft_log_read(const char *path, ft_record **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    FILE *f = fopen(path, "r");
    if (!f) return zo_error(ZO_ERR_NOT_FOUND, "%s: cannot open the log", path);
    line_rec *recs = NULL;
    size_t n = 0, cap = 0, lineno = 0, len = 0;
    char *line = NULL;
    zo_status st = ZO_OK;
    while (getline(&line, &len, f) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        cJSON *o = cJSON_Parse(line);
        double step, loss, lr, v;
        if (!o || !num(o, "step", &step) || !num(o, "loss", &loss) || !num(o, "lr", &lr)) {
            cJSON_Delete(o);
            st = zo_error(ZO_ERR_FORMAT, "%s:%zu: not a log record (needs step, loss and lr)", path, lineno);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            line_rec *nr = realloc(recs, cap * sizeof *nr);
            if (!nr) {
                cJSON_Delete(o);
                st = zo_error(ZO_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            recs = nr;
        }
        line_rec *lr_ = &recs[n++];
        memset(lr_, 0, sizeof *lr_);
        lr_->line = lineno;
        lr_->r.step = (long)step;
        lr_->r.loss = loss;
        lr_->r.lr = lr;
        if (num(o, "grad_norm", &v)) lr_->r.grad_norm = v;
        if (num(o, "tokens_per_s", &v)) lr_->r.tokens_per_s = v;
        const cJSON *pk = cJSON_GetObjectItemCaseSensitive(o, "peak_bytes");
        for (int t = 0; t < FT_TIERS; t++)
            if (num(pk, TIER_NAMES[t], &v)) lr_->r.peak[t] = (uint64_t)v;
        if (num(o, "eval_loss", &v)) {
            lr_->r.has_eval = 1;
            lr_->r.eval_loss = v;
            lr_->r.eval_ppl = num(o, "eval_ppl", &v) ? v : exp(lr_->r.eval_loss);
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    if (st != ZO_OK) {
        free(recs);
        return st;
    }
    qsort(recs, n, sizeof *recs, cmp_step_line);
    ft_record *r = malloc((n + 1) * sizeof *r);
    if (!r) {
        free(recs);
        return zo_error(ZO_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && r[k - 1].step == recs[i].r.step) k--; /* the later line wins */
        r[k++] = recs[i].r;
    }
    free(recs);
    *out = r;
    *n_out = k;
    return ZO_OK;
}

/* ---- the picture ------------------------------------------------------------------------ */

typedef struct svg_out {
    char *p;
    size_t len, cap;
    int oom;
} svg_out;

static void put(svg_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(svg_out *o, const char *fmt, ...)
{
    while (!o->oom) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) o->oom = 1;
        else if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        } else {
            size_t cap = o->cap * 2 + (size_t)n;
            char *np = realloc(o->p, cap);
            if (!np) o->oom = 1;
            else {
                o->p = np;
                o->cap = cap;
            }
        }
    }
}

#define SVG_W 900
#define SVG_L 90  /* left margin: the y labels */
#define SVG_R 30
#define PLOT_W (SVG_W - SVG_L - SVG_R)
#define MAX_POINTS 4000

/* A "nice" tick step (1, 2 or 5 times a power of ten) for about n ticks over span. */
static double tick_step(double span, int n)
{
    double raw = span / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

typedef struct panel {
    int y0, h;        /* top and height in pixels */
    double lo, hi;    /* the value range */
    long s0, s1;      /* the step range */
} panel;

static double px_x(const panel *p, long step)
{
    return SVG_L + (p->s1 > p->s0 ? (double)(step - p->s0) / (double)(p->s1 - p->s0) : 0.5) * PLOT_W;
}

static double px_y(const panel *p, double v) { return p->y0 + p->h - (v - p->lo) / (p->hi - p->lo) * p->h; }

/* The frame, the grid and the labels of a panel. */
static void draw_axes(svg_out *o, const panel *p, const char *ylabel, int x_labels)
{
    put(o, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fbfbfb\" stroke=\"#999\"/>\n", SVG_L, p->y0,
        PLOT_W, p->h);
    double ts = tick_step(p->hi - p->lo, 5);
    for (double v = ceil(p->lo / ts) * ts; v <= p->hi + ts * 1e-9; v += ts) {
        double y = px_y(p, v);
        put(o, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>"
               "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%.3g</text>\n",
            SVG_L, y, SVG_L + PLOT_W, y, SVG_L - 6, y + 4, fabs(v) < ts * 1e-6 ? 0.0 : v);
    }
    double span = (double)(p->s1 - p->s0);
    double xs = span > 0 ? tick_step(span, 8) : 1;
    if (xs < 1) xs = 1;
    for (double s = ceil((double)p->s0 / xs) * xs; s <= (double)p->s1; s += xs) {
        double x = px_x(p, (long)s);
        put(o, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e3e3e3\"/>\n", x, p->y0, x, p->y0 + p->h);
        if (x_labels)
            put(o, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\">%.0f</text>\n", x,
                p->y0 + p->h + 15, s);
    }
    put(o, "<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" text-anchor=\"middle\">%s</text>\n",
        p->y0 + p->h / 2, p->y0 + p->h / 2, ylabel);
}

/* A line through (step, value) of the records that have it. */
static void draw_series(svg_out *o, const panel *p, const ft_record *r, size_t n, int which, const char *color,
                        int dots)
{
    size_t stride = n > MAX_POINTS ? (n + MAX_POINTS - 1) / MAX_POINTS : 1;
    put(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"", color);
    for (size_t i = 0; i < n; i++) {
        if (which == 1 && !r[i].has_eval) continue;
        if (which != 1 && i % stride && i + 1 < n) continue;
        double v = which == 0 ? r[i].loss : which == 1 ? r[i].eval_loss : r[i].lr;
        put(o, "%.1f,%.1f ", px_x(p, r[i].step), px_y(p, v));
    }
    put(o, "\"/>\n");
    for (size_t i = 0; dots && i < n; i++)
        if (r[i].has_eval)
            put(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>step %ld: eval loss %.4f, "
                   "perplexity %.4g</title></circle>\n",
                px_x(p, r[i].step), px_y(p, r[i].eval_loss), color, r[i].step, r[i].eval_loss, r[i].eval_ppl);
}

static void put_escaped(svg_out *o, const char *s)
{
    for (; *s; s++) {
        if (*s == '&') put(o, "&amp;");
        else if (*s == '<') put(o, "&lt;");
        else if (*s == '>') put(o, "&gt;");
        else put(o, "%c", *s);
    }
}

char *ft_plot_svg(const ft_record *r, size_t n, const char *title)
{
    svg_out o = {malloc(16384), 0, 16384, 0};
    if (!o.p) return NULL;
    int H = 600;
    panel loss = {.y0 = 70, .h = 300}, lrp = {.y0 = 420, .h = 130};
    int any_eval = 0;
    double lo = INFINITY, hi = -INFINITY, lr_hi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = fmin(lo, r[i].loss);
        hi = fmax(hi, r[i].loss);
        if (r[i].has_eval) {
            any_eval = 1;
            lo = fmin(lo, r[i].eval_loss);
            hi = fmax(hi, r[i].eval_loss);
        }
        lr_hi = fmax(lr_hi, r[i].lr);
    }
    if (!n || !isfinite(lo) || !isfinite(hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-9) lo -= 0.5, hi += 0.5;
    double pad = (hi - lo) * 0.05;
    loss.lo = lo - pad;
    loss.hi = hi + pad;
    lrp.lo = 0;
    lrp.hi = lr_hi > 0 ? lr_hi * 1.08 : 1;
    loss.s0 = lrp.s0 = n ? r[0].step : 0;
    loss.s1 = lrp.s1 = n ? r[n - 1].step : 1;

    put(&o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    put(&o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"13\">\n",
        SVG_W, H, SVG_W, H);
    put(&o, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, H);
    put(&o, "<text x=\"%d\" y=\"28\" font-size=\"16\" font-weight=\"bold\">", SVG_L);
    put_escaped(&o, title && *title ? title : "training");
    put(&o, "</text>\n");
    if (n) {
        const ft_record *last = &r[n - 1];
        put(&o, "<text x=\"%d\" y=\"50\" font-size=\"12\">steps %ld-%ld; last loss %.4f", SVG_L, r[0].step,
            last->step, last->loss);
        for (size_t i = n; i-- > 0;)
            if (r[i].has_eval) {
                put(&o, ", eval loss %.4f (perplexity %.4g) at step %ld", r[i].eval_loss, r[i].eval_ppl, r[i].step);
                break;
            }
        put(&o, "</text>\n");
    }
    draw_axes(&o, &loss, "loss", 0);
    draw_axes(&o, &lrp, "learning rate", 1);
    put(&o, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", SVG_L + PLOT_W / 2, H - 12);
    if (n) {
        draw_series(&o, &loss, r, n, 0, "#4e79a7", 0);
        if (any_eval) draw_series(&o, &loss, r, n, 1, "#e15759", 1);
        draw_series(&o, &lrp, r, n, 2, "#59a14f", 0);
    }
    /* legend */
    int lx = SVG_L + PLOT_W - 250;
    put(&o, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"3\" fill=\"#4e79a7\"/><text x=\"%d\" y=\"%d\">"
            "training loss</text>\n", lx, loss.y0 + 14, lx + 20, loss.y0 + 19);
    if (any_eval)
        put(&o, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"3\" fill=\"#e15759\"/><text x=\"%d\" y=\"%d\">"
                "eval loss</text>\n", lx + 130, loss.y0 + 14, lx + 150, loss.y0 + 19);
    put(&o, "</svg>\n");
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    return o.p;
}

zo_status ft_plot_write(const char *path, const ft_record *r, size_t n, const char *title)
{
    char *svg = ft_plot_svg(r, n, title);
    if (!svg) return zo_error(ZO_ERR_NOMEM, "%s: out of memory for the picture", path);
    /* written whole or not at all, through a temporary no one can plant */
    zo_status st = zo_file_write_all(path, svg, strlen(svg));
    free(svg);
    return st;
}
