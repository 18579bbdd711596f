/* Fuzz target for the disk tier's file reader (cache/disk.c): arbitrary bytes as an
 * entry file of a directory, read the way `tern cache ls` and the index do (header,
 * sizes, token block and its checksum). Whatever it reports must be consistent: a file
 * called valid has counts that fit its size. Nothing it reads may crash it. */
#include "cache/disk.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void cleanup(void) {
    if (dir[0]) rmdir(dir);
}

static void seen(void *user, const struct disk_file_info *fi) {
    size_t *n = user;
    (*n)++;
    if (fi->valid && (uint64_t)fi->n_tokens * 4 > fi->bytes) {
        fprintf(stderr, "fuzz-disk: %u tokens in a %llu-byte file called valid\n", fi->n_tokens,
                (unsigned long long)fi->bytes);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/tern-fuzz-disk-XXXXXX");
        if (!mkdtemp(dir)) abort();
        atexit(cleanup);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/0123456789abcdef0123456789abcdef%s", dir, DISK_FILE_SUFFIX);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    size_t n = 0;
    if (disk_scan_dir(dir, seen, &n) != TERN_OK || n != 1) abort();
    unlink(path);
    return 0;
}
