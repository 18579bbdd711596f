/* tern convert-tokenizer: Hugging Face tokenizer files -> a vocab-only GGUF. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "gguf/gguf.h"
#include "tokenizer/hf-convert.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>

static const struct cli_spec convert_cli = {
    "convert-tokenizer",
    "usage: tern convert-tokenizer tokenizer.json [tokenizer_config.json] --out vocab.gguf\n"
    "                              [--pre NAME] [--vocab-size N] [--arch NAME] [--name NAME]\n"
    "\n"
    "Converts a Hugging Face byte-level BPE tokenizer (Qwen2/Qwen3, Llama 3, GPT-2, ...)\n"
    "into a GGUF file that holds only tokenizer metadata, as llama.cpp's converter\n"
    "writes it: tokens, token types (special added tokens are CONTROL, other added\n"
    "tokens USER_DEFINED), merges, the pre-tokenizer, and from tokenizer_config.json\n"
    "the BOS/EOS/PAD/UNK tokens, add_bos_token/add_eos_token and the chat template.\n"
    "The result is checked by loading it back.\n"
    "\n",
    NULL,
};

static int convert_main(int argc, char **argv) {
    const char *out = NULL, *arch = NULL, *name = NULL;
    struct tern_hf_convert_opts co = {0};
    const struct cli_opt opts[] = {
        CLI_STR1("o|out", &out, "FILE", "the GGUF file to write"),
        CLI_STR1("pre", &co.pre, "NAME", "tokenizer.ggml.pre (default: detected from the regex: qwen2, llama-bpe or gpt-2)"),
        CLI_INT("vocab-size", &co.vocab_size, 1, INT32_MAX - 1, "N",
                "pad the vocabulary with UNUSED [PAD<id>] tokens to N (the model's embedding size, e.g. 151936 for "
                "Qwen3)"),
        CLI_STR1("arch", &arch, "NAME",
                 "general.architecture (default: qwen2 for qwen2, llama for llama-bpe, gpt2 otherwise; a vocab file "
                 "needs none, llama.cpp's tools want one)"),
        CLI_STR1("name", &name, "NAME", "general.name"),
        CLI_END,
    };
    int files;
    int o = cli_parse(&convert_cli, opts, argc, argv, &files);
    if (o >= 0) return o;
    if (!out) return cli_usage_error("convert-tokenizer", "missing --out FILE");
    int n_files = argc - files;
    if (n_files < 1 || n_files > 2)
        return cli_usage_error("convert-tokenizer", "expected tokenizer.json and optionally tokenizer_config.json, got %d "
                                                    "file(s)",
                               n_files);
    const char *tok_json = argv[files], *cfg_json = n_files == 2 ? argv[files + 1] : NULL;

    struct gguf_writer *w;
    if (gguf_writer_new(&w)) return cli_fail("convert-tokenizer", "%s", tern_last_error());
    enum tern_status st = tern_hf_tokenizer_to_gguf(w, tok_json, cfg_json, &co);
    if (!st && !arch) {
        const char *pre = co.pre_used;
        arch = !strcmp(pre, "qwen2") ? "qwen2" : !strcmp(pre, "llama-bpe") ? "llama" : "gpt2";
    }
    if (!st) st = gguf_writer_set_str(w, "general.architecture", arch);
    if (!st && name) st = gguf_writer_set_str(w, "general.name", name);
    if (!st) st = gguf_writer_write(w, out);
    gguf_writer_free(w);
    if (st) return cli_fail("convert-tokenizer", "%s", tern_last_error());

    struct tern_tokenizer *t;
    if (tern_tokenizer_load_file(out, &t))
        return cli_fail("convert-tokenizer", "wrote %s, but it does not load: %s", out, tern_last_error());
    printf("wrote %s: %s/%s, %u tokens, %zu special, eos %d\n", out, tern_tokenizer_model_name(t),
           tern_tokenizer_pre(t), tern_tokenizer_n_vocab(t), tern_tokenizer_special_tokens(t, NULL),
           tern_token_eos(t));
    tern_tokenizer_free(t);
    return 0;
}

TERN_COMMAND("convert-tokenizer", "convert a Hugging Face tokenizer.json to a vocab-only GGUF", convert_main)
