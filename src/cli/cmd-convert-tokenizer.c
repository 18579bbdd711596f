/* tern convert-tokenizer: Hugging Face tokenizer files -> a vocab-only GGUF. */
#include "cli/cli.h"

#include "gguf/gguf.h"
#include "tokenizer/hf-convert.h"
#include "tokenizer/tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern convert-tokenizer tokenizer.json [tokenizer_config.json] --out vocab.gguf\n"
            "                              [--pre NAME] [--vocab-size N] [--arch NAME] [--name NAME]\n"
            "\n"
            "Converts a Hugging Face byte-level BPE tokenizer (Qwen2/Qwen3, Llama 3, GPT-2, ...)\n"
            "into a GGUF file that holds only tokenizer metadata, as llama.cpp's converter\n"
            "writes it: tokens, token types (special added tokens are CONTROL, other added\n"
            "tokens USER_DEFINED), merges, the pre-tokenizer, and from tokenizer_config.json\n"
            "the BOS/EOS/PAD/UNK tokens, add_bos_token/add_eos_token and the chat template.\n"
            "The result is checked by loading it back.\n"
            "\n"
            "  -o, --out FILE      the GGUF file to write\n"
            "      --pre NAME      tokenizer.ggml.pre (default: detected from the regex:\n"
            "                      qwen2, llama-bpe or gpt-2)\n"
            "      --vocab-size N  pad the vocabulary with UNUSED [PAD<id>] tokens to N\n"
            "                      (the model's embedding size, e.g. 151936 for Qwen3)\n"
            "      --arch NAME     general.architecture (default: qwen2 for qwen2, llama\n"
            "                      for llama-bpe, gpt2 otherwise; a vocab file needs none,\n"
            "                      llama.cpp's tools want one)\n"
            "      --name NAME     general.name\n"
            "  -h, --help          this help\n");
}

static int convert_main(int argc, char **argv) {
    static const struct option opts[] = {{"out", required_argument, NULL, 'o'},
                                         {"pre", required_argument, NULL, 'p'},
                                         {"vocab-size", required_argument, NULL, 'v'},
                                         {"arch", required_argument, NULL, 'a'},
                                         {"name", required_argument, NULL, 'n'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *out = NULL, *arch = NULL, *name = NULL;
    struct tern_hf_convert_opts co = {0};
    int o;
    long v;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (o) {
        case 'o': out = optarg; break;
        case 'p': co.pre = optarg; break;
        case 'v':
            if (!cli_parse_int(optarg, 1, INT32_MAX - 1, &v))
                return cli_usage_error("convert-tokenizer", "--vocab-size must be 1..%d, got '%s'", INT32_MAX - 1,
                                       optarg);
            co.vocab_size = (uint32_t)v;
            break;
        case 'a': arch = optarg; break;
        case 'n': name = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return cli_usage_error("convert-tokenizer", "unknown option or missing value '%s'", argv[optind - 1]);
        }
    }
    if (!out) return cli_usage_error("convert-tokenizer", "missing --out FILE");
    int n_files = argc - optind;
    if (n_files < 1 || n_files > 2)
        return cli_usage_error("convert-tokenizer", "expected tokenizer.json and optionally tokenizer_config.json, got %d "
                                                    "file(s)",
                               n_files);
    const char *tok_json = argv[optind], *cfg_json = n_files == 2 ? argv[optind + 1] : NULL;

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
