/* The HTTP server's watcher thread (http-impl.h): parked jobs' sockets, header and
 * body deadlines, keep-alive comments. */
#include "server/http-impl.h"

/* ---- the watcher ------------------------------------------------------------------- */


/* Closes connections past their header deadline: a 408, then shutdown() — MHD sees the
 * end of the stream and closes the connection itself (the descriptor stays MHD's). */
static void watch_headers(struct srv_server *s, double now) {
    pthread_mutex_lock(&s->smu);
    for (struct sock *sk = s->socks; sk; sk = sk->next) {
        if (sk->deadline <= 0 || now < sk->deadline || sk->fd < 0) continue;
        sk->deadline = 0;
        bool body = sk->wait == W_BODY;
        ssize_t w = send(sk->fd, body ? http_body_timeout_reply : http_timeout_reply,
                         body ? http_body_timeout_reply_len : http_timeout_reply_len, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w; /* best effort: the client may not read, the close is what matters */
        shutdown(sk->fd, SHUT_RDWR);
        atomic_fetch_add(body ? &s->body_timeouts : &s->header_timeouts, 1);
    }
    pthread_mutex_unlock(&s->smu);
}

/* Polls the sockets of parked jobs: a hang-up cancels the job and resumes the
 * connection (which then closes); a stream quiet for KEEPALIVE_S is resumed for a
 * keep-alive comment. jmu keeps the jobs alive; a parked job's connection is
 * suspended, so MHD keeps its descriptor open. */
static void watch_jobs(struct srv_server *s, double now, struct pollfd **pfds, struct srv_job ***pjobs, size_t *cap) {
    pthread_mutex_lock(&s->jmu);
    if (*cap < s->n_live) {
        struct pollfd *p = tern_reallocarray(*pfds, s->n_live, sizeof *p);
        if (p) *pfds = p;
        struct srv_job **q = tern_reallocarray(*pjobs, s->n_live, sizeof *q);
        if (q) *pjobs = q;
        if (p && q) *cap = s->n_live;
    }
    size_t n = 0;
    for (size_t i = 0; i < s->n_live && n < *cap; i++) {
        struct srv_job *j = s->live[i];
        pthread_mutex_lock(&j->mu);
        if (j->parked && j->fd >= 0) {
            (*pfds)[n] = (struct pollfd){.fd = j->fd, .events = POLLIN | POLLRDHUP};
            (*pjobs)[n++] = j;
        }
        pthread_mutex_unlock(&j->mu);
    }
    if (n > 0 && poll(*pfds, n, 0) < 0) n = 0;
    for (size_t i = 0; i < n; i++) {
        struct srv_job *j = (*pjobs)[i];
        bool gone = http_peer_gone_revents((*pfds)[i].fd, (*pfds)[i].revents);
        pthread_mutex_lock(&j->mu);
        if (gone && !j->done) {
            atomic_store(&j->cancel, 1);
            atomic_fetch_add(&s->client_gone, 1);
            http_job_wake(j);
        } else if (j->parked && j->req.stream && now - j->t_out >= KEEPALIVE_S) {
            http_job_wake(j);
        }
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&s->jmu);
}

void *http_watch_main(void *arg) {
    struct srv_server *s = arg;
    struct pollfd *pfds = NULL;
    struct srv_job **jobs = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&s->smu);
    while (!atomic_load(&s->stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)WAIT_SLICE_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->scv, &s->smu, &ts);
        pthread_mutex_unlock(&s->smu);
        double now = tern_now_s();
        watch_headers(s, now);
        watch_jobs(s, now, &pfds, &jobs, &cap);
        pthread_mutex_lock(&s->smu);
    }
    pthread_mutex_unlock(&s->smu);
    free(pfds);
    free(jobs);
    return NULL;
}
