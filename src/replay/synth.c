/* Synthetic agent sessions in the transcript format, so that the benchmark runs on a
 * machine without ../shared (`tern replay --make-transcript`). A coding agent works
 * through a few user requests on a small C project: each request is followed by
 * tool-calling turns (grep, read, edit, shell) and a final answer; every reply carries
 * reasoning. Deterministic: the same options give the same bytes.
 *
 * Kinds follow from the shape, as in bench/README.md: a turn that appends tool results
 * extends the previous one; a turn that opens with a new user message is a template
 * rewrite (a Qwen3-style template drops the reasoning of the assistant turns since the
 * previous user message); with --strip every turn is a client rewrite; compaction
 * replaces early turns with a summary (a client rewrite). The kinds written are derived
 * by tern_transcript_classify from the messages, never assumed. */
#include "replay/replay.h"

#include "util/mem.h"
#include "util/rng.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rng {
    uint64_t s;
};

static uint64_t next(struct rng *r) { return tern_splitmix64(&r->s); }
static size_t pick(struct rng *r, size_t n) { return (size_t)(next(r) % n); }
#define PICK(r, arr) (arr)[pick((r), TERN_ARRAY_LEN(arr))]

static const char *const modules[] = {"parser", "store", "index", "cache", "wal", "net", "config", "cli"};
static const char *const verbs[] = {"open", "close", "read", "write", "flush", "grow", "lookup", "insert",
                                    "remove", "scan", "parse", "encode", "decode", "reset", "check", "merge"};
static const char *const nouns[] = {"entry", "block", "page", "record", "header", "buffer", "slot", "key",
                                    "range", "batch", "segment", "frame", "token", "bucket", "node", "field"};
static const char *const fields[] = {"len", "cap", "count", "offset", "flags", "crc", "next", "size", "used", "head"};
static const char *const errors[] = {"-EINVAL", "-ENOMEM", "-EIO", "-ERANGE", "-ENOSPC", "-EAGAIN"};

static const char *const system_prompt =
    "You are a coding agent working in the user's repository through a terminal. You help with software "
    "engineering tasks: fixing bugs, adding features, refactoring, explaining code, running builds and tests.\n\n"
    "# How to work\n"
    "- Understand before you change. Search and read the relevant code first; check how the project builds, "
    "tests and formats its code, and follow its conventions.\n"
    "- Make the smallest change that solves the problem. Do not reformat unrelated code.\n"
    "- Verify. After a change, build and run the tests that cover it. When you fix a bug, add a test that fails "
    "without the fix. When the user asks for a performance change, measure before and after.\n"
    "- Use absolute paths in tool calls. Prefer the dedicated tools over shell commands for reading, searching "
    "and editing files; use the shell for builds, tests, git and benchmarks.\n"
    "- Never commit, push or delete files unless the user asks. Never revert changes you did not make.\n"
    "- If a request is ambiguous, or a change would break something the user did not ask about, stop and ask.\n\n"
    "# Tools\n"
    "- read_file reads a file, optionally a range of lines (offset is 0-based).\n"
    "- grep_search searches file contents with a regular expression and returns path:line:text matches.\n"
    "- edit replaces one exact occurrence of old_string with new_string in a file.\n"
    "- run_shell_command runs a bash command in the project directory and returns its output and exit code.\n\n"
    "# Answering\n"
    "Be brief. Say what you changed and how you verified it. Quote file paths and function names exactly.";

static json_t *tools_json(void) {
    return json_pack(
        "[{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s,s:s},s:{s:s,s:s},s:{s:s,s:s}},s:[s]}}},"
        "{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s,s:s},s:{s:s,s:s}},s:[s]}}},"
        "{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s,s:s},s:{s:s,s:s},s:{s:s,s:s}},s:[s,s,s]}}},"
        "{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s,s:s},s:{s:s,s:s}},s:[s]}}}]",
        "type", "function", "function", "name", "read_file", "description",
        "Reads a file from the local filesystem. Use offset and limit to read part of a large file.", "parameters",
        "type", "object", "properties", "absolute_path", "type", "string", "description",
        "The absolute path of the file to read.", "offset", "type", "number", "description",
        "The 0-based line number to start reading from.", "limit", "type", "number", "description",
        "The number of lines to read.", "required", "absolute_path",
        /* grep */
        "type", "function", "function", "name", "grep_search", "description",
        "Searches file contents for a regular expression and returns matching lines with their paths and line "
        "numbers.",
        "parameters", "type", "object", "properties", "pattern", "type", "string", "description",
        "The regular expression to search for.", "path", "type", "string", "description",
        "The directory or file to search in (absolute).", "required", "pattern",
        /* edit */
        "type", "function", "function", "name", "edit", "description",
        "Replaces one exact occurrence of old_string with new_string in a file. old_string must match the file "
        "exactly, including whitespace.",
        "parameters", "type", "object", "properties", "file_path", "type", "string", "description",
        "The absolute path of the file to modify.", "old_string", "type", "string", "description",
        "The exact text to replace.", "new_string", "type", "string", "description", "The replacement text.",
        "required", "file_path", "old_string", "new_string",
        /* shell */
        "type", "function", "function", "name", "run_shell_command", "description",
        "Runs a bash command in the project directory and returns stdout, stderr and the exit code.",
        "parameters", "type", "object", "properties", "command", "type", "string", "description",
        "The command to run.", "description", "type", "string", "description",
        "A short description of what the command does.", "required", "command");
}

#define ROOT "/home/dev/src/ledger"

struct session {
    struct rng rng;
    const char *module;  /* the module the current task is about */
    const char *verb, *noun;
    int task;            /* 0-based task number */
    int step;            /* tool steps done in the current task */
    int n_steps;         /* tool steps this task takes before the answer */
    unsigned call_seq;
};

static json_t *text_parts(const char *text) { return json_pack("[{s:s,s:s}]", "type", "text", "text", text); }

static void call_id(struct session *s, char out[32]) {
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++) out[5 + i] = alnum[pick(&s->rng, sizeof alnum - 1)];
    out[29] = 0;
}

/* A function of the synthetic project, as source text. */
static void gen_function(struct session *s, struct tern_buf *b, const char *module, const char *verb,
                         const char *noun) {
    const char *f1 = PICK(&s->rng, fields), *f2 = PICK(&s->rng, fields);
    int lim = 4 + (int)pick(&s->rng, 60);
    tern_buf_printf(b,
                    "/* %s_%s_%s: %s the %s at position i; returns 0 or a negative errno. */\n"
                    "int %s_%s_%s(struct %s *m, size_t i)\n{\n"
                    "    if (!m || i >= m->%s)\n        return %s;\n"
                    "    struct %s_%s *e = &m->%ss[i];\n"
                    "    if (e->%s > %d) {\n        e->%s = 0;\n        return %s;\n    }\n"
                    "    e->%s += 1;\n    m->%s = i;\n    return 0;\n}\n\n",
                    module, verb, noun, verb, noun, module, verb, noun, module, f1, PICK(&s->rng, errors), module,
                    noun, noun, f2, lim, f2, PICK(&s->rng, errors), f1, PICK(&s->rng, fields));
}

static char *tool_result(struct session *s, const char *tool, const char *arg) {
    struct tern_buf b = TERN_BUF_INIT;
    const char *m = s->module;
    if (!strcmp(tool, "grep_search")) {
        int n = 3 + (int)pick(&s->rng, 6);
        tern_buf_printf(&b, "Found %d matches for pattern \"%s\" in path \"" ROOT "\":\n", n, arg);
        for (int i = 0; i < n; i++) {
            const char *mod = i % 3 == 0 ? m : PICK(&s->rng, modules);
            tern_buf_printf(&b, "%s/%s.c:%zu:    rc = %s_%s_%s(%s, %s);\n", i % 4 == 3 ? "tests" : "src", mod,
                            20 + pick(&s->rng, 400), m, s->verb, s->noun, mod, PICK(&s->rng, fields));
        }
    } else if (!strcmp(tool, "read_file")) {
        size_t line = 1 + pick(&s->rng, 200);
        tern_buf_printf(&b, "Showing lines %zu-%zu of %zu from %s\n", line, line + 39, line + 120 + pick(&s->rng, 300),
                        arg);
        int n = 2 + (int)pick(&s->rng, 3);
        for (int i = 0; i < n; i++) gen_function(s, &b, m, i == 0 ? s->verb : PICK(&s->rng, verbs), i == 0 ? s->noun : PICK(&s->rng, nouns));
    } else if (!strcmp(tool, "edit")) {
        tern_buf_printf(&b, "The file: %s has been updated. Showing lines %zu-%zu of the edited file:\n", arg,
                        40 + pick(&s->rng, 100), 60 + pick(&s->rng, 100));
        gen_function(s, &b, m, s->verb, s->noun);
    } else {
        int n_tests = 6 + (int)pick(&s->rng, 30);
        tern_buf_printf(&b, "Command: %s\nDirectory: (root)\nOutput: ", arg);
        tern_buf_printf(&b, "[1/%d] Building C object src/CMakeFiles/ledger.dir/%s.c.o\n", 3 + n_tests / 4, m);
        tern_buf_printf(&b, "[%d/%d] Linking C executable tests/test_%s\n", 3 + n_tests / 4, 3 + n_tests / 4, m);
        tern_buf_printf(&b, "Test project " ROOT "/build\n");
        for (int i = 0; i < n_tests && i < 8; i++)
            tern_buf_printf(&b, "    Start %2d: %s_%s\n%2d/%d Test #%2d: %s_%s ....   Passed    0.%02zu sec\n", i + 1,
                            PICK(&s->rng, modules), PICK(&s->rng, nouns), i + 1, n_tests, i + 1,
                            PICK(&s->rng, modules), PICK(&s->rng, nouns), pick(&s->rng, 90));
        tern_buf_printf(&b, "\n100%% tests passed, 0 tests failed out of %d\n\nTotal Test time (real) =   %zu.%02zu sec\n"
                            "Error: (none)\nExit Code: 0",
                        n_tests, pick(&s->rng, 9), pick(&s->rng, 100));
    }
    return tern_buf_detach(&b, NULL);
}

static const char *const think_open[] = {"Let me", "I should", "First I'll", "Next I need to", "Now I can"};
static const char *const think_mid[] = {
    "look at how %s_%s_%s handles the bounds check, because the failure only shows up with an empty %s",
    "check every caller of %s_%s_%s before changing its contract for the %s case",
    "confirm that %s_%s_%s is the only place that touches the %s counter",
    "build and run the %s tests to see whether the %s change breaks anything else"};

static char *reasoning(struct session *s) {
    struct tern_buf b = TERN_BUF_INIT;
    int n = 1 + (int)pick(&s->rng, 3);
    for (int i = 0; i < n; i++) {
        const char *mid = PICK(&s->rng, think_mid);
        tern_buf_printf(&b, "%s%s ", i ? " " : "", PICK(&s->rng, think_open));
        if (strstr(mid, "build"))
            tern_buf_printf(&b, mid, s->module, s->noun);
        else
            tern_buf_printf(&b, mid, s->module, s->verb, s->noun, PICK(&s->rng, nouns));
        tern_buf_puts(&b, ".");
    }
    return tern_buf_detach(&b, NULL);
}

static const char *const task_text[] = {
    "The test test_%s_%s fails about one run in twenty on CI with 'assertion failed: rc == 0'. Find the cause and "
    "fix it, and add a test that reproduces it.",
    "%s_%s_%s is slow when the table holds more than a million entries. Measure it, make it faster, and tell me "
    "the numbers before and after.",
    "Add a --dry-run option to the %s command that prints what %s_%s would change without writing anything. Keep "
    "the current behaviour the default.",
    "Rename the %s field of struct %s to something clearer and update every use, the tests and the docs.",
    "Write unit tests for %s_%s_%s: an empty table, a full table, and an index one past the end.",
    "Explain how the %s module reports errors from %s_%s, and whether anything leaks when it fails halfway."};

static char *user_message(struct session *s) {
    struct tern_buf b = TERN_BUF_INIT;
    size_t k = pick(&s->rng, TERN_ARRAY_LEN(task_text));
    const char *f = task_text[k];
    switch (k) {
    case 0: tern_buf_printf(&b, f, s->module, s->noun); break;
    case 1: tern_buf_printf(&b, f, s->module, s->verb, s->noun); break;
    case 2: tern_buf_printf(&b, f, s->module, s->module, s->verb); break;
    case 3: tern_buf_printf(&b, f, PICK(&s->rng, fields), s->module); break;
    case 4: tern_buf_printf(&b, f, s->module, s->verb, s->noun); break;
    default: tern_buf_printf(&b, f, s->module, s->module, s->verb); break;
    }
    return tern_buf_detach(&b, NULL);
}

static void new_task(struct session *s, size_t turns_left) {
    s->module = PICK(&s->rng, modules);
    s->verb = PICK(&s->rng, verbs);
    s->noun = PICK(&s->rng, nouns);
    s->step = 0;
    s->n_steps = 2 + (int)pick(&s->rng, 3); /* 2..4 tool turns, then the answer */
    /* Leave room for at least one new user message in short sessions: that is the
     * template rewrite the benchmark must contain. */
    if (turns_left >= 2 && (size_t)s->n_steps + 1 >= turns_left) s->n_steps = (int)turns_left - 2;
    s->task++;
}

/* The reply for the current step: tool calls, or the final answer. *calls gets the
 * calls' (tool, arg) for the results. */
static json_t *make_reply(struct session *s, const char *tool_out[2], char *arg_out[2], char ids[2][32], int *n_calls) {
    char *rc = reasoning(s);
    json_t *reply;
    *n_calls = 0;
    if (s->step < s->n_steps) {
        int n = s->step == 0 ? 1 + (int)pick(&s->rng, 2) : 1;
        json_t *calls = json_array();
        for (int i = 0; i < n; i++) {
            const char *tool;
            char path[256], arg[512];
            if (i == 1) snprintf(path, sizeof path, ROOT "/tests/test_%s.c", s->module);
            else snprintf(path, sizeof path, ROOT "/src/%s.c", s->module);
            json_t *args;
            if (s->step == 0 && i == 0) {
                tool = "grep_search";
                snprintf(arg, sizeof arg, "%s_%s_%s", s->module, s->verb, s->noun);
                args = json_pack("{s:s,s:s}", "pattern", arg, "path", ROOT);
            } else if (s->step == s->n_steps - 1) {
                tool = "run_shell_command";
                snprintf(arg, sizeof arg, "cmake --build build && ctest --test-dir build -R %s --output-on-failure",
                         s->module);
                args = json_pack("{s:s,s:s}", "command", arg, "description", "Build and run the affected tests");
            } else if (s->step % 2 == 1 || i == 1) {
                tool = "read_file";
                snprintf(arg, sizeof arg, "%s", path);
                args = json_pack("{s:s,s:i,s:i}", "absolute_path", path, "offset", (int)(10 * pick(&s->rng, 30)),
                                 "limit", 60);
            } else {
                tool = "edit";
                snprintf(arg, sizeof arg, "%s", path);
                char olds[128], news[128];
                snprintf(olds, sizeof olds, "if (!m || i >= m->%s)", PICK(&s->rng, fields));
                snprintf(news, sizeof news, "if (!m || i >= m->%s || m->%ss == NULL)", PICK(&s->rng, fields), s->noun);
                args = json_pack("{s:s,s:s,s:s}", "file_path", path, "old_string", olds, "new_string", news);
            }
            char *args_s = json_dumps(args, JSON_COMPACT);
            json_decref(args);
            call_id(s, ids[i]);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", ids[i], "type", "function",
                                                   "function", "name", tool, "arguments", args_s));
            free(args_s);
            tool_out[i] = tool;
            arg_out[i] = tern_strdup(arg);
        }
        *n_calls = n;
        reply = json_pack("{s:s,s:s,s:o,s:s}", "role", "assistant", "content", "", "tool_calls", calls,
                          "reasoning_content", rc);
        s->step++;
    } else {
        char text[1024];
        snprintf(text, sizeof text,
                 "Done. The problem was in %s_%s_%s: it did not check the %s before using it. I changed %s/src/%s.c, "
                 "added a test to tests/test_%s.c, and the %s tests pass (%zu of %zu).",
                 s->module, s->verb, s->noun, PICK(&s->rng, fields), ROOT, s->module, s->module, s->module,
                 8 + pick(&s->rng, 20), 8 + pick(&s->rng, 20));
        reply = json_pack("{s:s,s:s,s:s}", "role", "assistant", "content", text, "reasoning_content", rc);
        s->step = -1; /* answered */
    }
    free(rc);
    return reply;
}

static json_t *strip_reasoning(json_t *msgs) {
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_copy(m);
        if (!strcmp(json_string_value(json_object_get(c, "role")), "assistant")) json_object_del(c, "reasoning_content");
        json_array_append_new(out, c);
    }
    return out;
}

static const char *summary_text =
    "<state_snapshot>\n<overall_goal>\nKeep the ledger store correct and fast while the user works through their "
    "requests.\n</overall_goal>\n<key_knowledge>\n- Build: cmake --build build; tests: ctest --test-dir build.\n- "
    "Every public function returns 0 or a negative errno; bounds are checked against the table's count.\n"
    "</key_knowledge>\n<file_system_state>\n- CWD: " ROOT "\n- MODIFIED: src/ files of the earlier requests, with "
    "tests added for each fix.\n</file_system_state>\n<recent_actions>\n- Fixed and tested the earlier requests; all "
    "tests pass.\n</recent_actions>\n<current_plan>\n1. [DONE] Earlier requests.\n2. [IN PROGRESS] The current "
    "request.\n</current_plan>\n</state_snapshot>\n\nThe conversation so far was compressed into the snapshot above. "
    "Continue with the current request.";

enum tern_status tern_synth_transcript(const struct tern_synth_opts *o, struct tern_buf *out) {
    if (o->n_turns < 2 || o->n_turns > 1000)
        return tern_errorf(TERN_ERR_INVALID, "--turns %zu out of range (2..1000)", o->n_turns);
    if (o->kind == TERN_SYNTH_COMPACTION && o->n_turns < 5)
        return tern_errorf(TERN_ERR_INVALID, "a compaction transcript needs --turns >= 5 (got %zu)", o->n_turns);
    struct session s = {.rng = {o->seed * 0x2545F4914F6CDD1Dull + 0x1234567ull}, .task = -1};
    json_t *tools = tools_json();
    json_t *msgs = json_array();
    json_t *lines = json_array();
    if (!tools || !msgs || !lines) {
        json_decref(tools), json_decref(msgs), json_decref(lines);
        return tern_errorf(TERN_ERR_NOMEM, "out of memory generating a transcript");
    }
    new_task(&s, o->n_turns);
    char *um = user_message(&s);
    char env[512];
    snprintf(env, sizeof env,
             "This is the ledger project at " ROOT " (C11, CMake, cmocka tests). Today's date is 2026-01-15. The "
             "working tree is clean.");
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system_prompt));
    json_array_append_new(msgs, json_pack("{s:s,s:[{s:s,s:s},{s:s,s:s}]}", "role", "user", "content", "type", "text",
                                          "text", env, "type", "text", "text", um));
    free(um);
    /* Compaction: from about two thirds of the session on, at the first turn in the
     * middle of a later request (the previous turn made tool calls), as a client
     * compacts between steps of a task; at the last turn whatever its shape. */
    size_t compact_from = (o->n_turns * 2 + 2) / 3;
    bool compacted = o->kind != TERN_SYNTH_COMPACTION;
    enum tern_status st = TERN_OK;
    for (size_t t = 0; t < o->n_turns; t++) {
        bool mid_task = false;
        if (!compacted) {
            size_t n = json_array_size(msgs);
            const char *last_role = json_string_value(json_object_get(json_array_get(msgs, n - 1), "role"));
            bool later_user = false;
            for (size_t i = 2; i < n; i++)
                later_user |= !strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "user");
            mid_task = !strcmp(last_role, "tool") && later_user;
        }
        if (!compacted && t >= 2 && ((t >= compact_from && mid_task) || t == o->n_turns - 1)) {
            compacted = true;
            /* Replace everything from message 2 through the latest user message (the
             * earlier requests, their tool traffic and the current request) by one
             * summary; keep the system prompt, the first user message and what came
             * after the latest user message. */
            size_t n = json_array_size(msgs), last_user = 1;
            for (size_t i = 2; i < n; i++)
                if (!strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "user")) last_user = i;
            size_t cut_end = last_user >= 2 ? last_user + 1 : (n > 4 ? n - 2 : 3);
            json_t *nm = json_array();
            json_array_append(nm, json_array_get(msgs, 0));
            json_array_append(nm, json_array_get(msgs, 1));
            json_array_append_new(nm, json_pack("{s:s,s:o}", "role", "user", "content", text_parts(summary_text)));
            for (size_t i = cut_end; i < n; i++) json_array_append(nm, json_array_get(msgs, i));
            json_decref(msgs);
            msgs = nm;
        }
        json_t *sent = o->strip ? strip_reasoning(msgs) : json_deep_copy(msgs);
        json_t *req = json_pack("{s:s,s:o,s:i,s:i,s:b,s:{s:b},s:O}", "model", "default", "messages", sent,
                                "max_tokens", 16, "temperature", 0, "stream", 1, "stream_options", "include_usage", 1,
                                "tools", tools);
        const char *tool_out[2] = {0};
        char *arg_out[2] = {0};
        char ids[2][32];
        int n_calls = 0;
        json_t *reply = make_reply(&s, tool_out, arg_out, ids, &n_calls);
        if (!req || !reply) {
            json_decref(req), json_decref(reply);
            st = tern_errorf(TERN_ERR_NOMEM, "out of memory generating turn %zu", t);
            break;
        }
        json_array_append_new(lines, json_pack("{s:i,s:o,s:O}", "turn", (int)t, "request", req, "reply", reply));
        json_array_append(msgs, reply);
        if (n_calls > 0) {
            for (int i = 0; i < n_calls; i++) {
                char *res = tool_result(&s, tool_out[i], arg_out[i]);
                json_array_append_new(msgs, json_pack("{s:s,s:s,s:o}", "role", "tool", "tool_call_id", ids[i],
                                                      "content", text_parts(res ? res : "")));
                free(res);
                free(arg_out[i]);
            }
        } else {
            new_task(&s, o->n_turns - t - 1);
            um = user_message(&s);
            json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "user", "content", text_parts(um)));
            free(um);
        }
        json_decref(reply);
    }
    json_decref(msgs);
    json_decref(tools);
    /* Serialize without kinds, let the classifier derive them, then write the lines in
     * the bench format with the derived annotations. */
    struct tern_buf raw = TERN_BUF_INIT;
    size_t i;
    json_t *ln;
    json_array_foreach(lines, i, ln) {
        if (st != TERN_OK) break;
        char *s1 = json_dumps(ln, JSON_COMPACT);
        if (!s1) st = tern_errorf(TERN_ERR_NOMEM, "out of memory serializing turn %zu", i);
        else {
            st = tern_buf_puts(&raw, s1);
            if (st == TERN_OK) st = tern_buf_putc(&raw, '\n');
            free(s1);
        }
    }
    struct tern_replay_transcript *tr = NULL;
    if (st == TERN_OK) st = tern_transcript_parse(raw.data, raw.len, "(synthetic)", &tr);
    tern_buf_free(&raw);
    json_array_foreach(lines, i, ln) {
        if (st != TERN_OK) break;
        struct tern_turn_class c;
        st = tern_transcript_classify(tr, i, &c);
        if (st != TERN_OK) break;
        json_t *req = json_object_get(ln, "request");
        char *body = json_dumps(req, JSON_COMPACT);
        size_t body_bytes = body ? strlen(body) : 0;
        free(body);
        char reason[128];
        if (i == 0) snprintf(reason, sizeof reason, "first request");
        else if (c.kind == TERN_TURN_EXTENSION) snprintf(reason, sizeof reason, "appends the recorded reply and tool results");
        else if (!strcmp(c.rewrite_by, "template"))
            snprintf(reason, sizeof reason, "new user message: the template drops earlier reasoning (diverges in message %ld)",
                     c.diverge_msg);
        else
            snprintf(reason, sizeof reason, "client rewrote history from message %ld", c.diverge_msg);
        json_t *o2 = json_pack("{s:i,s:s,s:s?,s:o,s:s,s:I,s:I,s:I,s:O,s:O}", "turn", (int)i, "kind",
                               tern_turn_kind_name(c.kind), "rewrite_by", c.rewrite_by,
                               "diverge_msg", c.diverge_msg >= 0 && c.kind == TERN_TURN_REWRITE ? json_integer(c.diverge_msg) : json_null(),
                               "reason", reason, "prompt_chars", (json_int_t)c.prompt_chars, "shared_prefix_chars",
                               (json_int_t)c.shared_prefix_chars, "body_bytes", (json_int_t)body_bytes, "request", req,
                               "reply", json_object_get(ln, "reply"));
        char *s2 = o2 ? json_dumps(o2, JSON_COMPACT) : NULL;
        json_decref(o2);
        if (!s2) {
            st = tern_errorf(TERN_ERR_NOMEM, "out of memory serializing turn %zu", i);
            break;
        }
        st = tern_buf_puts(out, s2);
        if (st == TERN_OK) st = tern_buf_putc(out, '\n');
        free(s2);
    }
    tern_transcript_free(tr);
    json_decref(lines);
    return st;
}
