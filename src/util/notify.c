/* systemd's notify protocol (see notify.h). */
#include "util/notify.h"

#include "util/log.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

bool tern_sd_notify(const char *state) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path || !state) return false;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) {
        TERN_LOG_DEBUG("NOTIFY_SOCKET '%.80s' is not a socket path: not notified", path);
        return false;
    }
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') sa.sun_path[0] = 0; /* the abstract namespace */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
    close(fd);
    if (w < 0) TERN_LOG_DEBUG("NOTIFY_SOCKET %.80s: not notified", path);
    return w >= 0;
}
