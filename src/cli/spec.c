/* --spec off|ngram|mtp for tern run, serve and chat: one parser behind the option
 * table's CLI_SPEC entry (cli.h), so the three commands take the same words. */
#include "cli/cli.h"

#include "server/spec.h"

bool cli_parse_spec_mode(const char *v, void *dst) { return spec_mode_parse(v, (enum spec_mode *)dst); }
