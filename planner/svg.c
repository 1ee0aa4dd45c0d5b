#include "svg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"

typedef struct out {
    char *p;
    size_t len, cap;
    int oom;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...)
{
    if (o->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->oom = 1;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)n;
        char *np = realloc(o->p, cap);
        if (!np) {
            o->oom = 1;
            return;
        }
        o->p = np;
        o->cap = cap;
    }
}

/* Text content with &, <, > escaped. */
static void put_text(out *o, const char *s)
{
    for (; *s; s++) {
        if (*s == '&') put(o, "&amp;");
        else if (*s == '<') put(o, "&lt;");
        else if (*s == '>') put(o, "&gt;");
        else put(o, "%c", *s);
    }
}

static const char *kind_color[PLAN_KINDS] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#b07aa1"};
static const char *part_color[PLAN_TIME_PARTS] = {
    "#4e79a7", "#2f5a87", "#a0cbe8", "#f28e2b", "#bab0ac", "#9d7660",
    "#e15759", "#59a14f", "#8cd17d", "#b6992d", "#f1ce63", "#d37295", "#79706e", "#ff9d9a",
};

#define W 960
#define BAR_X 170
#define BAR_W 600

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* The title, the configuration and the legend of the kinds. */
static void svg_head(out *o, const zo_model_config *m, const plan_hw *hw, const plan_train *t,
                     const plan_estimate *e)
{
    char cnt[32];
    put(o, "<text x=\"20\" y=\"28\" font-size=\"17\" font-weight=\"bold\">");
    put_text(o, m->name);
    put(o, " (%s params) on %d x ", zo_format_count(e->params, cnt, sizeof cnt), hw->gpus);
    put_text(o, hw->gpu);
    put(o, "</text>\n");
    char method[96] = "";
    if (t->method != ZO_PLAN_FULL) {
        char tg[64];
        snprintf(method, sizeof method, "%s r %d on %s; ",
                 t->method == ZO_PLAN_QLORA ? "QLoRA" : "LoRA", t->lora.r,
                 zo_lora_targets_str(t->lora.targets, tg, sizeof tg));
    }
    put(o, "<text x=\"20\" y=\"50\">%sDP %d, TP %d%s, PP %d%s, ZeRO-%d, micro-batch %d x %d, "
           "seq %d, recompute %s; %s on %s, grads on %s, checkpoints on %s</text>\n",
        method, t->dp, t->tp, t->sp ? "+SP" : "", t->pp, t->vpp > 1 ? " interleaved" : "", t->zero,
        t->micro_batch, t->grad_accum, t->seq, zo_plan_recompute_name(t->recompute),
        t->method == ZO_PLAN_FULL ? "weights" : "base", zo_plan_tier_name(t->params_on),
        zo_plan_tier_name(t->grads_on), zo_plan_tier_name(t->checkpoints_on));
    for (int k = 0; k < PLAN_KINDS; k++) {
        int x = BAR_X + k * 120;
        put(o, "<rect x=\"%d\" y=\"66\" width=\"12\" height=\"12\" fill=\"%s\"/>"
               "<text x=\"%d\" y=\"77\">%s</text>\n",
            x, kind_color[k], x + 16, plan_kind_name((plan_kind)k));
    }
}

/* One tier's bar at `y`: the frame is the capacity (or the total when over). */
static void svg_tier(out *o, const plan_estimate *e, int tier, int y)
{
    static const char *tier_title[ZO_PLAN_TIERS] = {"GPU", "CPU", "NVMe"};
    double cap = (double)e->capacity[tier], tot = (double)e->total[tier];
    double full = tot > cap ? tot : cap;
    if (full <= 0) full = 1;
    double scale = BAR_W / full;
    put(o, "<text x=\"20\" y=\"%d\" font-weight=\"bold\">%s per rank</text>\n", y + 20,
        tier_title[tier]);
    put(o, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"30\" fill=\"#f4f4f4\" "
           "stroke=\"#999\"/>\n", BAR_X, y, BAR_W);
    double x = BAR_X;
    for (int k = 0; k < PLAN_KINDS; k++) {
        double w = (double)e->bytes[tier][k] * scale;
        if (w <= 0) continue;
        put(o, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"30\" fill=\"%s\">"
               "<title>%s: %.2f GiB</title></rect>\n",
            x, y, w, kind_color[k], plan_kind_name((plan_kind)k), gib(e->bytes[tier][k]));
        x += w;
    }
    double cx = BAR_X + cap * scale;
    put(o, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" "
           "stroke-width=\"2\"/>\n", cx, y - 5, cx, y + 35, tot > cap ? "#d00" : "#333");
    put(o, "<text x=\"%d\" y=\"%d\">%.1f of %.1f GiB</text>\n", BAR_X + BAR_W + 12, y + 13,
        gib(e->total[tier]), gib(e->capacity[tier]));
    put(o, "<text x=\"%d\" y=\"%d\" fill=\"%s\">%.0f%%%s</text>\n", BAR_X + BAR_W + 12,
        y + 29, tot > cap ? "#d00" : "#333", cap > 0 ? 100 * tot / cap : 0,
        tot > cap ? " OVER" : "");
}

/* An overlapped schedule's lane under the step: the CPU optimizer's time,
 * ending with the step, the part beside GPU work light, the exposed part
 * (in the bar above) solid. */
static void svg_optimizer_lane(out *o, const plan_time *pt, int y_time, double scale)
{
    int ly = y_time + 36;
    double w_all = pt->opt_s * scale, w_exp = pt->opt_exposed * scale;
    if (w_all > BAR_W) w_all = BAR_W;
    double x0 = BAR_X + BAR_W - w_all;
    put(o, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"12\" fill=\"#f1ce63\" "
           "fill-opacity=\"0.4\" stroke=\"#b6992d\"><title>CPU optimizer beside GPU work: "
           "%.4g s</title></rect>\n",
        x0, ly, w_all - w_exp, pt->opt_hidden);
    put(o, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"12\" fill=\"#f1ce63\">"
           "<title>CPU optimizer exposed: %.4g s</title></rect>\n",
        x0 + w_all - w_exp, ly, w_exp, pt->opt_exposed);
    put(o, "<text x=\"%d\" y=\"%d\" font-size=\"12\">CPU optimizer</text>\n", BAR_X + BAR_W + 12,
        ly + 11);
}

/* The step at `y_time`: its parts in one bar, with `lane` the optimizer's
 * lane under it, and the parts' legend. */
static void svg_step(out *o, const plan_time *pt, int y_time, int lane)
{
    put(o, "<text x=\"20\" y=\"%d\" font-weight=\"bold\">step %.3f s</text>\n", y_time + 20,
        pt->step);
    put(o, "<text x=\"20\" y=\"%d\" font-size=\"12\">%.4g tokens/s</text>\n", y_time + 40,
        pt->tokens_per_s);
    put(o, "<text x=\"20\" y=\"%d\" font-size=\"12\">MFU %.1f%%</text>\n", y_time + 56,
        100 * pt->mfu);
    double scale = BAR_W / pt->step, x = BAR_X;
    for (int i = 0; i < PLAN_TIME_PARTS; i++) {
        double v = plan_time_part(pt, i), w = v * scale;
        if (w <= 0) continue;
        put(o, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"30\" fill=\"%s\">"
               "<title>%s: %.4g s</title></rect>\n",
            x, y_time, w, part_color[i], plan_time_part_name(i), v);
        x += w;
    }
    if (lane) svg_optimizer_lane(o, pt, y_time, scale);
    int row = 0;
    for (int i = 0; i < PLAN_TIME_PARTS; i++) {
        double v = plan_time_part(pt, i);
        if (v <= 0) continue;
        int lx = BAR_X + (row % 3) * 200, ly = y_time + 52 + (lane ? 20 : 0) + (row / 3) * 20;
        put(o, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
               "<text x=\"%d\" y=\"%d\">%s %.1f%%</text>\n",
            lx, ly, part_color[i], lx + 16, ly + 11, plan_time_part_name(i), 100 * v / pt->step);
        row++;
    }
    if (lane) {
        int ly = y_time + 72 + 20 * ((row + 2) / 3) + 11;
        put(o, "<text x=\"%d\" y=\"%d\" font-size=\"12\">optimizer schedule %s: %.3g s of "
               "the CPU optimizer's %.3g s beside GPU work (light), %.3g s exposed; serial: "
               "%.3g s</text>\n",
            BAR_X, ly, zo_plan_schedule_name(pt->schedule), pt->opt_hidden, pt->opt_s,
            pt->opt_exposed, pt->serial_step);
    }
}

char *plan_svg(const zo_model_config *m, const plan_hw *hw, const plan_train *t,
               const plan_estimate *e, const plan_time *pt)
{
    out o = {malloc(8192), 0, 8192, 0};
    if (!o.p) return NULL;
    int tiers[ZO_PLAN_TIERS], n_tiers = 0;
    for (int i = 0; i < ZO_PLAN_TIERS; i++)
        if (i == ZO_PLAN_GPU || e->total[i] > 0) tiers[n_tiers++] = i;
    int y_time = 110 + n_tiers * 70;
    /* an overlapped optimizer schedule: one more lane under the step */
    int lane = pt && pt->schedule != ZO_PLAN_SCHED_SERIAL && pt->opt_s > 0;
    int height = y_time + (pt ? 150 : 20) + (lane ? 50 : 0);
    put(&o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    put(&o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"13\">\n",
        W, height, W, height);
    put(&o, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, height);
    svg_head(&o, m, hw, t, e);
    for (int i = 0; i < n_tiers; i++) svg_tier(&o, e, tiers[i], 100 + i * 70);
    if (pt && pt->step > 0) svg_step(&o, pt, y_time, lane);
    put(&o, "</svg>\n");
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    return o.p;
}
