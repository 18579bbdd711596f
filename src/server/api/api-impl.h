/* The adapters' internals, shared by api.c, messages.c and responses.c (api.h has the
 * overview). */
#ifndef TERN_SERVER_API_IMPL_H
#define TERN_SERVER_API_IMPL_H

#include "server/api/api.h"

/* A string of s[0..n), cut to its valid UTF-8 prefix when the tail is broken. */
json_t *api_str_n(const char *s, size_t n);

/* messages.c */
enum tern_status msg_stream_start(struct api_out *a, const struct srv_usage *u, struct tern_buf *out);
enum tern_status msg_stream_delta(struct api_out *a, const struct reply_delta *d, const struct reply_parser *p,
                                  struct tern_buf *out);
enum tern_status msg_stream_end(struct api_out *a, const struct reply_parser *p, const char *finish,
                                const char *stop_seq, const struct srv_usage *u, struct tern_buf *out);
enum tern_status msg_stream_error(struct api_out *a, const struct srv_error *e, struct tern_buf *out);
json_t *msg_response(struct api_out *a, const struct reply_parser *p, const char *finish, const char *stop_seq,
                     const struct srv_usage *u);
json_t *msg_error_object(const struct srv_error *e);

/* responses.c */
enum tern_status rsp_stream_start(struct api_out *a, struct tern_buf *out);
enum tern_status rsp_stream_delta(struct api_out *a, const struct reply_delta *d, const struct reply_parser *p,
                                  struct tern_buf *out);
enum tern_status rsp_stream_end(struct api_out *a, const struct reply_parser *p, const char *finish,
                                const struct srv_usage *u, struct tern_buf *out);
enum tern_status rsp_stream_error(struct api_out *a, const struct srv_error *e, struct tern_buf *out);
json_t *rsp_response(struct api_out *a, const struct reply_parser *p, const char *finish, const struct srv_usage *u);

#endif
