/* Replays a fuzz target over every file of a corpus directory (the committed seeds and
 * regression cases), so the normal test run checks them under the sanitizers. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if ((long)got != (n > 0 ? n : 0)) {
        free(buf);
        fprintf(stderr, "short read %s\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int n_files = 0, rc = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "no corpus at %s\n", argv[a]);
            return 1;
        }
        if (S_ISREG(st.st_mode)) {
            rc |= run_file(argv[a]);
            n_files++;
            continue;
        }
        struct dirent **ents;
        int n = scandir(argv[a], &ents, NULL, alphasort);
        for (int i = 0; i < n; i++) {
            if (ents[i]->d_name[0] != '.') {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", argv[a], ents[i]->d_name);
                rc |= run_file(path);
                n_files++;
            }
            free(ents[i]);
        }
        free(ents);
    }
    printf("replayed %d inputs\n", n_files);
    return rc || n_files == 0;
}
