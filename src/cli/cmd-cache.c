/* `tern cache ls|rm`: inspects and clears a disk tier directory (--cache-dir) without a
 * model. ls reads every file's header and token block (checksums verified); the model
 * binding is checked by the server that uses the files. rm takes the directory's lock,
 * so that serving replicas pick the change up at their next request. */
#include "cli/cli.h"
#include "cli/opts.h"

#include "cache/disk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct cli_spec cache_cli = {
    "cache",
    "usage: tern cache ls --cache-dir DIR [--json]\n"
    "       tern cache rm --cache-dir DIR (NAME... | --all | --invalid | --key KEY [--tenant T])\n"
    "\n"
    "Inspects and clears the disk tier of `tern serve --cache-dir DIR`.\n"
    "\n"
    "  ls      one line per parked conversation: file name, bytes, tokens, checkpoints,\n"
    "          last use, tenant and session key (\"-\" = unnamed); invalid files with why\n"
    "  rm      deletes the named files, all of them, the invalid ones, or those of a key\n"
    "          (in a tenant; default: the default tenant \"\")\n"
    "\n",
    NULL,
};

struct ls_ctx {
    bool json;
    size_t n;
    uint64_t bytes;
};

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void ls_one(void *user, const struct disk_file_info *fi) {
    struct ls_ctx *x = user;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double age = ((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9) - (double)fi->last_used * 1e-9;
    if (age < 0) age = 0;
    if (x->json) {
        printf("%s{\"name\":\"%s\",\"valid\":%s,\"bytes\":%llu,\"last_used_s_ago\":%.0f", x->n ? ",\n " : "[",
               fi->name, fi->valid ? "true" : "false", (unsigned long long)fi->bytes, age);
        if (fi->valid) {
            printf(",\"tokens\":%u,\"checkpoints\":%u,\"model\":\"%016llx\",\"tenant\":", fi->n_tokens, fi->n_ckpt,
                   (unsigned long long)fi->model_id);
            json_str(fi->tenant);
            printf(",\"key\":");
            if (fi->named) json_str(fi->key);
            else printf("null");
        } else {
            printf(",\"why\":");
            json_str(fi->why);
        }
        printf("}");
    } else {
        if (!x->n) printf("%-32s %12s %8s %5s %10s  %s\n", "NAME", "BYTES", "TOKENS", "CKPTS", "USED", "TENANT / KEY");
        char used[32];
        if (age < 120) snprintf(used, sizeof used, "%.0fs ago", age);
        else if (age < 7200) snprintf(used, sizeof used, "%.0fm ago", age / 60);
        else snprintf(used, sizeof used, "%.0fh ago", age / 3600);
        if (fi->valid)
            printf("%-32s %12llu %8u %5u %10s  %s / %s\n", fi->name, (unsigned long long)fi->bytes, fi->n_tokens,
                   fi->n_ckpt, used, fi->tenant[0] ? fi->tenant : "\"\"", fi->named ? fi->key : "-");
        else
            printf("%-32s %12llu %8s %5s %10s  INVALID: %s\n", fi->name, (unsigned long long)fi->bytes, "-", "-", used,
                   fi->why);
    }
    x->n++;
    x->bytes += fi->bytes;
}

struct rm_ctx {
    bool all, invalid;
    const char *key, *tenant;
    char (*names)[DISK_NAME_LEN + 1];
    size_t n, cap;
    bool nomem;
};

static void rm_pick(void *user, const struct disk_file_info *fi) {
    struct rm_ctx *x = user;
    bool pick = x->all || (x->invalid && !fi->valid) ||
                (x->key && fi->valid && fi->named && !strcmp(fi->key, x->key) && !strcmp(fi->tenant, x->tenant));
    if (!pick) return;
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        void *p = realloc(x->names, cap * sizeof *x->names);
        if (!p) {
            x->nomem = true;
            return;
        }
        x->names = p;
        x->cap = cap;
    }
    memcpy(x->names[x->n++], fi->name, DISK_NAME_LEN + 1);
}

static int cache_main(int argc, char **argv) {
    const char *dir = NULL;
    struct rm_ctx rm = {.tenant = ""};
    bool json = false;
    const struct cli_opt opts[] = {
        CLI_STR1("cache-dir", &dir, "DIR", "the disk tier's directory"),
        CLI_FLAG("json", &json, "ls as a JSON array"),
        CLI_FLAG("all", &rm.all, "rm: every file"),
        CLI_FLAG("invalid", &rm.invalid, "rm: the files that do not read as the format says"),
        CLI_STR1("key", &rm.key, "KEY", "rm: the conversations of this session key"),
        CLI_STR("tenant", &rm.tenant, "T", "with --key: the tenant (default: the default tenant \"\")"),
        CLI_END,
    };
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        cli_help(argc < 2 ? stderr : stdout, &cache_cli, opts);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "ls") && strcmp(sub, "rm")) return cli_usage_error("cache", "unknown subcommand '%s' (ls or rm)", sub);
    int first; /* the options after the subcommand */
    int c = cli_parse(&cache_cli, opts, argc - 1, argv + 1, &first);
    if (c >= 0) return c;
    const int names = first + 1; /* NAME... in argv */
    if (!dir) return cli_usage_error("cache", "%s needs --cache-dir DIR", sub);
    if (!strcmp(sub, "ls")) {
        if (names < argc) return cli_usage_error("cache", "unexpected argument '%s'", argv[names]);
        if (rm.all || rm.invalid || rm.key) return cli_usage_error("cache", "--all, --invalid and --key are for rm");
        struct ls_ctx x = {.json = json};
        enum tern_status st = disk_scan_dir(dir, ls_one, &x);
        if (st) return cli_fail("cache", "%s", tern_last_error());
        if (json) printf("%s\n", x.n ? "]" : "[]");
        else printf("%zu conversations, %.1f MiB\n", x.n, (double)x.bytes / (1 << 20));
        return 0;
    }
    int modes = rm.all + rm.invalid + (rm.key != NULL) + (names < argc);
    if (modes != 1) return cli_usage_error("cache", "rm needs exactly one of NAME..., --all, --invalid, --key KEY");
    if (json) return cli_usage_error("cache", "--json is for ls");
    size_t removed = 0;
    int rc = 0;
    if (names < argc) {
        for (int i = names; i < argc; i++) {
            enum tern_status st = disk_unlink(dir, argv[i]);
            if (st) rc = cli_fail("cache", "%s", tern_last_error());
            else removed++;
        }
    } else {
        enum tern_status st = disk_scan_dir(dir, rm_pick, &rm);
        if (st) return cli_fail("cache", "%s", tern_last_error());
        if (rm.nomem) return cli_fail("cache", "out of memory");
        for (size_t i = 0; i < rm.n; i++) {
            if ((st = disk_unlink(dir, rm.names[i]))) rc = cli_fail("cache", "%s", tern_last_error());
            else removed++;
        }
        free(rm.names);
    }
    printf("removed %zu file%s\n", removed, removed == 1 ? "" : "s");
    return rc;
}

TERN_COMMAND("cache", "inspect and clear a disk tier directory (ls, rm)", cache_main)
