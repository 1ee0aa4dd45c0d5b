/* generate: text from a GPT-2 or LLaMA-family model on the offload runtime,
 * its weights resident on the device, streamed from pinned host memory or
 * read from NVMe block by block; a key/value cache on the device; greedy or
 * sampled (temperature, top-k, top-p), with PEFT LoRA adapters over a
 * 16-bit or NF4 base. See --help and docs/generate.md.
 *
 * The program's parts: args.c (the flags, --help), run.c (the inputs, the
 * set-up, a token at a time, what it prints), sample.c (the next token from
 * the logits). */
#include "examples/generate/args.h" /* defines: gen_args, gen_args_parse */
#include "examples/generate/run.h"  /* defines: gen_run, gen_read_inputs, gen_first, gen_next, ... */

int main(int argc, char **argv)
{
    /* the flags: a plan (--plan) first, then every flag over it */
    gen_args a;
    int rc = gen_args_parse(argc, argv, &a);
    if (rc >= 0) return rc; /* --help, or bad flags */

    gen_run r;
    /* read the config, the tokenizer, the prompts and the adapter's settings */
    zo_status st = gen_read_inputs(&r, &a);
    if (st != ZO_OK) goto out;
    /* the device, the model with its key/value cache, the runtime, the weights */
    if ((st = gen_setup(&r)) != ZO_OK) goto out;
    gen_report_start(&r);

    /* the prompts in one forward, then one token at a time until the count or
     * every sequence's end-of-sequence token */
    if ((st = gen_first(&r)) != ZO_OK) goto out;
    for (int more = 1; more;)
        if ((st = gen_next(&r, &more)) != ZO_OK) goto out;

    /* the text, tokens/s, time to first token, the peaks per tier */
    st = gen_report_end(&r);
out:
    return gen_finish(&r, st);
}
