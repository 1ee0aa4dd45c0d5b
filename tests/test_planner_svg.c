/* The plan's picture: plan_svg's document (tiers against capacity, the step
 * split, escaped text) and that it renders: rsvg-convert turns the SVG that
 * `memplan plan --svg` writes into a PNG of the declared size. Exits 77
 * (skipped) when rsvg-convert (Debian's librsvg2-bin) is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model_config.h"
#include "planner/cost.h"
#include "planner/svg.h"
#include "tests/support/run.h" /* defines: run_memplan_bin */
#include "tests/support/scratch.h" /* defines: scratch_path */

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void test_svg_document(void **state)
{
    (void)state;
    zo_model_config m;
    plan_hw hw;
    plan_train t;
    plan_estimate e;
    plan_time pt;
    assert_int_equal(zo_model_preset_find("llama-2-13b", &m), ZO_OK);
    assert_int_equal(plan_hw_find("h100-80gb", &hw), ZO_OK);
    plan_train_defaults(&t, &m);
    t.recompute = PLAN_RECOMPUTE_FULL;
    t.grads_on = PLAN_CPU;
    t.opt_frac[PLAN_GPU] = 0;
    t.opt_frac[PLAN_CPU] = 0.5;
    t.opt_frac[PLAN_NVME] = 0.5;
    snprintf(m.name, sizeof m.name, "a<b>&c");
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    assert_int_equal(plan_time_run(&m, &hw, &t, &e, &pt), ZO_OK);
    char *svg = plan_svg(&m, &hw, &t, &e, &pt);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(svg, "</svg>"));
    /* the name is escaped */
    assert_non_null(strstr(svg, "a&lt;b&gt;&amp;c"));
    assert_null(strstr(svg, "a<b>"));
    /* three tiers (GPU, CPU, NVMe), a capacity line each */
    assert_non_null(strstr(svg, "GPU per rank"));
    assert_non_null(strstr(svg, "CPU per rank"));
    assert_non_null(strstr(svg, "NVMe per rank"));
    assert_int_equal(count(svg, "<line "), 3);
    /* the optimizer appears on CPU and NVMe, and the step split has CPU AdamW */
    assert_true(count(svg, "<title>optimizer:") == 2);
    assert_non_null(strstr(svg, "<title>cpu_adam:"));
    free(svg);

    /* no time: no step bar; a tier over capacity is marked */
    t.opt_frac[PLAN_GPU] = 1;
    t.opt_frac[PLAN_CPU] = t.opt_frac[PLAN_NVME] = 0;
    assert_int_equal(plan_estimate_run(&m, &hw, &t, &e), ZO_OK);
    svg = plan_svg(&m, &hw, &t, &e, NULL);
    assert_non_null(svg);
    assert_null(strstr(svg, "step "));
    assert_non_null(strstr(svg, "OVER"));
    free(svg);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void test_svg_renders(void **state)
{
    (void)state;
    char dir[64], cmd[2048], path[512];
    scratch_path(dir, sizeof dir, "memplan-svg-XXXXXX");
    assert_non_null(mkdtemp(dir));
    const char *memplan = run_memplan_bin();
    snprintf(cmd, sizeof cmd,
             "%s plan --model llama-2-13b --hw h100-80gb --cpu-mem 96GiB --top 1 --svg %s/plan.svg "
             ">/dev/null && rsvg-convert -o %s/plan.png %s/plan.svg",
             memplan, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/plan.png", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char head[24];
    assert_int_equal(fread(head, 1, sizeof head, f), sizeof head);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    /* a PNG whose IHDR has the size the SVG declares */
    snprintf(path, sizeof path, "%s/plan.svg", dir);
    f = fopen(path, "r");
    assert_non_null(f);
    char svg[4096];
    size_t n = fread(svg, 1, sizeof svg - 1, f);
    svg[n] = '\0';
    fclose(f);
    unsigned w = 0, h = 0;
    const char *tag = strstr(svg, "<svg ");
    assert_non_null(tag);
    assert_int_equal(sscanf(strstr(tag, "width="), "width=\"%u\" height=\"%u\"", &w, &h), 2);
    assert_memory_equal(head, "\x89PNG\r\n\x1a\n", 8);
    assert_memory_equal(head + 12, "IHDR", 4);
    assert_int_equal(be32(head + 16), w);
    assert_int_equal(be32(head + 20), h);
    assert_true(w == 960 && h > 300);
    assert_true(size > 10000); /* bars and text, not a blank page */
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    if (system("command -v rsvg-convert >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_planner_svg: rsvg-convert not found (install librsvg2-bin); skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_svg_document),
        cmocka_unit_test(test_svg_renders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
