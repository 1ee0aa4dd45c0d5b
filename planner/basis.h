/* What a report's figures rest on: the hardware preset (a whole machine, a
 * GPU in a host, a calibrated profile or a plan file) and every value a flag
 * replaced ("H100-80GB compute with 22.35 GiB of memory (--gpu-mem 24GB)").
 * The report prints it first; the JSON carries it as "hardware.basis"
 * (docs/memplan-json.md). */
#ifndef ZO_PLANNER_BASIS_H
#define ZO_PLANNER_BASIS_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "planner/hardware.h"

typedef enum plan_hw_source {
    PLAN_HW_PRESET = 0, /* --hw NAME (or the default) */
    PLAN_HW_GPU,        /* --gpu NAME [--host NAME] */
    PLAN_HW_PROFILE,    /* --hw FILE from memplan calibrate */
    PLAN_HW_PLAN,       /* estimate --plan FILE */
} plan_hw_source;

/* The hardware flags as given; NULL or 0 where not given. */
typedef struct plan_hw_flags {
    const char *hw, *gpu, *host, *pcie;
    const char *gpu_mem_arg, *cpu_mem_arg, *nvme_arg; /* the text given */
    uint64_t gpu_mem, cpu_mem, nvme;                  /* parsed */
    long gpus_per_node;
} plan_hw_flags;

typedef struct plan_hw_override {
    const char *flag;     /* "--gpu-mem" */
    char arg[48];         /* as given: "24GB" */
    const char *field;    /* the plan_hw field (JSON key): "gpu_mem" */
    double preset, value; /* before and after, in the field's unit */
    char text[300];       /* "H100-80GB compute with 22.35 GiB of memory (--gpu-mem 24GB; ...)" */
} plan_hw_override;

#define PLAN_HW_OVERRIDES 8

typedef struct plan_hw_basis {
    plan_hw_source source;
    char name[256];        /* the preset or GPU preset, or the file */
    char host[24];         /* with --gpu: the host preset */
    int host_given;        /* --host was given */
    int is_default;        /* neither --hw nor --gpu given */
    plan_hw base;          /* the machine before the overrides */
    int n;
    plan_hw_override ov[PLAN_HW_OVERRIDES];
} plan_hw_basis;

const char *plan_hw_source_name(plan_hw_source s); /* "preset", "gpu", "profile", "plan" */

/* --hw and --gpu exclude each other; --host needs --gpu. */
zo_status plan_hw_flags_check(const plan_hw_flags *f);

/* The machine of --gpu NAME [--host NAME], and its basis. */
zo_status plan_hw_from_gpu(const plan_hw_flags *f, plan_hw *hw, plan_hw_basis *b);

/* Start a basis for a machine that came from elsewhere (a preset or file). */
void plan_hw_basis_init(plan_hw_basis *b, plan_hw_source source, const char *name,
                        int is_default, const plan_hw *hw);

/* Apply --gpu-mem, --cpu-mem, --nvme, --pcie and --gpus-per-node to `hw`,
 * recording each value replaced in `b`. */
zo_status plan_hw_apply_flags(const plan_hw_flags *f, plan_hw *hw, plan_hw_basis *b);

/* The flags that rebuild this machine on another command line
 * ("--gpu rtx-4090 --cpu-mem 64GB"). */
void plan_hw_basis_flags(const plan_hw_basis *b, char *buf, size_t len);

/* The report's first lines ("hardware: ..."), each ending in '\n'. */
void plan_report_basis(FILE *out, const plan_hw *hw, const plan_hw_basis *b);

/* {"source", "name", "host", "default", "gpu": {...}, "node": {...},
 *  "overrides": [{"flag", "arg", "field", "preset", "value", "text"}], "lines"}
 * (docs/memplan-json.md, "hardware.basis"); the caller owns it. */
cJSON *plan_hw_basis_json(const plan_hw *hw, const plan_hw_basis *b);

#endif
