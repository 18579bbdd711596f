/* tern serve under a service manager: systemd's notify protocol (READY=1 once the
 * model is loaded, STOPPING=1 at the first signal) on a path socket and an abstract
 * one, exit 0 after SIGTERM, and a second signal that exits at once while the stop
 * is still under way (TERN_TEST_STOP_DELAY_MS holds the stop back). */
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A datagram socket at name: a path, or "@..." for the abstract namespace. */
static int notify_socket(const char *name) {
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(name);
    assert_true(n < sizeof sa.sun_path);
    memcpy(sa.sun_path, name, n);
    if (name[0] == '@') sa.sun_path[0] = 0;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (name[0] == '/'));
    if (name[0] == '/') unlink(name);
    if (bind(fd, (struct sockaddr *)&sa, len)) fail_msg("bind %s: %s", name, strerror(errno));
    return fd;
}

/* The next datagram within timeout_ms (false: none). */
static bool next_msg(int fd, int timeout_ms, char *buf, size_t cap) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1) return false;
    ssize_t n = recv(fd, buf, cap - 1, 0);
    if (n < 0) return false;
    buf[n] = 0;
    return true;
}

static pid_t serve(const char *notify, const char *stop_delay_ms, const char *log) {
    const char *model = th_tiny_model(); /* made here, not in each child */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("NOTIFY_SOCKET", notify, 1);
        if (stop_delay_ms) setenv("TERN_TEST_STOP_DELAY_MS", stop_delay_ms, 1);
        FILE *f = freopen(log, "w", stdout);
        if (f) dup2(fileno(stdout), 2);
        execl(th_tern_bin(), th_tern_bin(), "serve", "--model", model, "--port", "0", "--threads", "1",
              "--ctx-size", "256", "--predict", "off", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The exit status within timeout_s (-1: still running, then killed). */
static int wait_exit(pid_t pid, double timeout_s) {
    double t0 = now_s();
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (now_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(20000);
    }
}

static void expect_ready(int fd, pid_t pid, const char *log) {
    char msg[600];
    if (!next_msg(fd, 120000, msg, sizeof msg)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        size_t n = 0;
        char *l = th_read_file(log, &n);
        fail_msg("no READY=1 within 120 s; log:\n%s", l ? l : "");
    }
    assert_non_null(strstr(msg, "READY=1"));
    assert_non_null(strstr(msg, "STATUS=serving "));
}

static void test_ready_and_stop(void **state) {
    (void)state;
    char sock[512], log[512];
    snprintf(sock, sizeof sock, "%s/notify", th_tmpdir());
    snprintf(log, sizeof log, "%s/serve1.log", th_tmpdir());
    int fd = notify_socket(sock);
    pid_t pid = serve(sock, NULL, log);
    expect_ready(fd, pid, log);
    assert_int_equal(kill(pid, SIGTERM), 0);
    char msg[600];
    assert_true(next_msg(fd, 30000, msg, sizeof msg));
    assert_string_equal(msg, "STOPPING=1");
    assert_int_equal(wait_exit(pid, 60), 0);
    close(fd);
    unlink(sock);
}

static void test_second_signal(void **state) {
    (void)state;
    char sock[128], log[512];
    snprintf(sock, sizeof sock, "@tern-test-notify-%ld", (long)getpid());
    snprintf(log, sizeof log, "%s/serve2.log", th_tmpdir());
    int fd = notify_socket(sock);
    pid_t pid = serve(sock, "60000", log); /* the stop waits a minute first */
    expect_ready(fd, pid, log);
    assert_int_equal(kill(pid, SIGTERM), 0);
    char msg[600];
    assert_true(next_msg(fd, 30000, msg, sizeof msg));
    assert_string_equal(msg, "STOPPING=1");
    double t0 = now_s();
    assert_int_equal(kill(pid, SIGINT), 0);
    assert_int_equal(wait_exit(pid, 20), 128 + SIGINT);
    assert_true(now_s() - t0 < 20);
    size_t n = 0;
    char *l = th_read_file(log, &n);
    assert_non_null(l);
    assert_non_null(strstr(l, "a second signal: exiting now"));
    free(l);
    close(fd);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_and_stop),
        cmocka_unit_test(test_second_signal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
