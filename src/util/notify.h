/* Readiness for service managers: systemd's notify protocol (sd_notify(3)), without
 * libsystemd. With NOTIFY_SOCKET in the environment (a unit with Type=notify), each
 * call sends one datagram of "KEY=value" lines to that socket ("READY=1", "STOPPING=1",
 * "STATUS=..."); without it, nothing happens. Best effort: a failure is logged once at
 * debug level and never stops the server. */
#ifndef TERN_UTIL_NOTIFY_H
#define TERN_UTIL_NOTIFY_H

#include <stdbool.h>

/* True when the datagram was sent; false when there is no NOTIFY_SOCKET or it failed. */
bool tern_sd_notify(const char *state);

#endif
