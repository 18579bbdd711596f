/* The interactive terminal chat (cmd-chat.c): `tern chat`, and `tern run --chat`, which
 * hands its arguments over unchanged (--chat is accepted and ignored here). */
#ifndef TERN_CLI_CMD_CHAT_H
#define TERN_CLI_CMD_CHAT_H

int cli_chat_main(int argc, char **argv);

#endif
