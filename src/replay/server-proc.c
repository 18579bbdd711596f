/* Server processes started by the harness (`tern replay --model`): fork/exec, wait for
 * /health, stop. No orphans: the child sits in its own process group (a Ctrl-C at the
 * terminal reaches only the harness, which then stops it in order) and asks the kernel
 * for SIGTERM should the harness die without stopping it (PR_SET_PDEATHSIG). */
#include "replay/replay.h"

#include "util/mem.h"
#include "util/timeutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum tern_status tern_server_free_port(uint16_t *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return tern_errorf(TERN_ERR_IO, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(fd);
        return tern_errorf(TERN_ERR_IO, "finding a free loopback port: %s", strerror(e));
    }
    *port = ntohs(a.sin_port);
    close(fd);
    return TERN_OK;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* The last lines of the server's log, for error messages. */
static void log_tail(const char *path, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[2048];
    long from = 0;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    }
    fseek(f, from, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
    /* Keep the last few lines. */
    int lines = 0;
    size_t start = n;
    while (start > 0) {
        if (buf[start - 1] == '\n' && ++lines == 6) break;
        start--;
    }
    size_t len = strlen(buf + start);
    if (len >= cap) len = cap - 1;
    memcpy(out, buf + start, len);
    out[len] = 0;
    for (char *p = out; *p; p++)
        if (*p == '\n') *p = '|';
}

static void describe_exit(int status, char *out, size_t cap) {
    if (WIFEXITED(status)) snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                                           strsignal(WTERMSIG(status)));
    else snprintf(out, cap, "stopped");
}

enum tern_status tern_server_start(const struct tern_server_spec *spec, uint16_t port, struct tern_server_proc *p) {
    memset(p, 0, sizeof *p);
    p->port = port;
    snprintf(p->url, sizeof p->url, "http://127.0.0.1:%u", (unsigned)port);
    snprintf(p->log_path, sizeof p->log_path, "%s", spec->log_path ? spec->log_path : "/dev/null");
    /* Everything the child needs is prepared before fork: after it, only
     * async-signal-safe calls. */
    size_t n_env = 0, n_add = 0;
    while (environ[n_env]) n_env++;
    while (spec->env_add && spec->env_add[n_add]) n_add++;
    char **envp = tern_calloc(n_env + n_add + 1, sizeof *envp);
    if (!envp) return tern_errorf(TERN_ERR_NOMEM, "out of memory for the server's environment");
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        bool overridden = false;
        for (size_t j = 0; j < n_add && !overridden; j++) {
            const char *eq = strchr(spec->env_add[j], '=');
            size_t nl = eq ? (size_t)(eq - spec->env_add[j]) : strlen(spec->env_add[j]);
            overridden = !strncmp(environ[i], spec->env_add[j], nl) && environ[i][nl] == '=';
        }
        if (!overridden) envp[k++] = environ[i];
    }
    for (size_t j = 0; j < n_add; j++) envp[k++] = spec->env_add[j];
    envp[k] = NULL;
    int logfd = open(p->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0) {
        int e = errno;
        free(envp);
        return tern_errorf(TERN_ERR_IO, "cannot open server log '%s': %s", p->log_path, strerror(e));
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(logfd);
        free(envp);
        return tern_errorf(TERN_ERR_IO, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        setpgid(0, 0);
        /* SIGKILL, not SIGTERM: the harness may have paused the server (SIGSTOP, see
         * tern_server_pause), and a stopped process leaves SIGTERM pending forever. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the harness died before prctl took effect */
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        /* Default signal handling in the server whatever the harness installed. */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        execve(spec->bin, spec->argv, envp);
        static const char msg[] = "tern replay: exec of the server failed\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    setpgid(pid, pid); /* also in the parent: no race with the child's own call */
    close(logfd);
    free(envp);
    p->pid = pid;

    struct tern_http_url url;
    enum tern_status st = tern_http_url_parse(p->url, &url);
    if (st != TERN_OK) {
        tern_server_stop(p);
        return st;
    }
    uint64_t t0 = tern_now_ns();
    double timeout = spec->start_timeout_s > 0 ? spec->start_timeout_s : 300.0;
    int last_status = 0;
    char last_err[256] = "no answer yet";
    for (;;) {
        int wst;
        pid_t w = waitpid(pid, &wst, WNOHANG);
        if (w == pid) {
            p->pid = 0;
            char how[96], tail[700];
            describe_exit(wst, how, sizeof how);
            log_tail(p->log_path, tail, sizeof tail);
            return tern_errorf(TERN_ERR_IO, "server '%s' on port %u %s before it was ready; its log (%s) ends: %s",
                               spec->bin, (unsigned)port, how, p->log_path, tail[0] ? tail : "(empty)");
        }
        if (spec->cancel && *spec->cancel) {
            tern_server_stop(p);
            return tern_errorf(TERN_ERR_CANCELLED, "cancelled while waiting for the server on port %u", (unsigned)port);
        }
        struct tern_http_response rs = TERN_HTTP_RESPONSE_INIT;
        struct tern_http_request rq = {.method = "GET", .url = &url, .path = "/health", .connect_timeout_s = 1.0,
                                       .idle_timeout_s = 5.0, .cancel = spec->cancel};
        st = tern_http_request(&rq, NULL, NULL, &rs);
        if (st == TERN_OK && rs.status == 200) {
            tern_http_response_free(&rs);
            return TERN_OK;
        }
        if (st == TERN_OK) {
            last_status = rs.status;
            snprintf(last_err, sizeof last_err, "GET /health answered %d", rs.status);
        } else {
            snprintf(last_err, sizeof last_err, "%s", tern_last_error());
        }
        tern_http_response_free(&rs);
        if ((double)(tern_now_ns() - t0) * 1e-9 > timeout) {
            char tail[700];
            log_tail(p->log_path, tail, sizeof tail);
            tern_server_stop(p);
            return tern_errorf(TERN_ERR_IO, "server on port %u not healthy after %.0f s (%s%s); its log (%s) ends: %s",
                               (unsigned)port, timeout, last_err, last_status == 503 ? ", still loading" : "",
                               p->log_path, tail[0] ? tail : "(empty)");
        }
        sleep_ms(50);
    }
}

void tern_server_stop(struct tern_server_proc *p) {
    if (!p || p->pid <= 0) return;
    pid_t pid = p->pid;
    int wst;
    if (waitpid(pid, &wst, WNOHANG) == pid) {
        p->pid = 0;
        return;
    }
    /* The whole group: the server and anything it started. SIGTERM after SIGCONT: a
     * paused server would only act on it once continued. */
    kill(-pid, SIGTERM);
    kill(pid, SIGTERM);
    kill(-pid, SIGCONT);
    kill(pid, SIGCONT);
    for (int i = 0; i < 200; i++) { /* 10 s */
        pid_t w = waitpid(pid, &wst, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD)) {
            p->pid = 0;
            return;
        }
        sleep_ms(50);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {}
    p->pid = 0;
}

void tern_server_pause(struct tern_server_proc *p, bool pause) {
    if (!p || p->pid <= 0 || p->paused == pause) return;
    kill(-p->pid, pause ? SIGSTOP : SIGCONT);
    p->paused = pause;
    if (!pause) return;
    /* A signal is delivered asynchronously: wait until the server has really stopped, so
     * that it computes nothing during the next request. (If it exited instead, this reaps
     * it; the next request to it fails and says so.) */
    int wst;
    pid_t w;
    while ((w = waitpid(p->pid, &wst, WUNTRACED)) < 0 && errno == EINTR) {}
    if (w == p->pid && (WIFEXITED(wst) || WIFSIGNALED(wst))) p->pid = 0;
}
