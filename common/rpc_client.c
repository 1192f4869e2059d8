/* rpc_client.c — the client half of the gRPC call layer (contract in rpc.h): a channel,
 * blocking unary calls, server-streaming reads and client-streaming writes.
 *
 * Every call gets its own pluck completion queue, so calls on different threads never see
 * each other's events. A streaming call posts RECV_STATUS_ON_CLIENT right after it starts
 * (its own tag) and plucks it when the stream ends or fails, which gives the server's status
 * and message for every error. Chunked writes reference the caller's buffer (zero-copy);
 * the stream counts those references and waits for gRPC to drop them before it is freed. */
#include "common/rpc_internal.h"

#include "common/checksum.h"
#include "common/errors.h"
#include "common/log.h"

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_MD 16

struct md_kv {
  char *key, *value;
};

struct rpc_client {
  grpc_channel *ch;
  size_t max_msg;
  struct md_kv md[MAX_MD];
  size_t n_md;
};

struct rpc_stream {
  struct rpc_client *cli;
  grpc_completion_queue *cq;
  grpc_call *call;
  char method[160];
  int server_streaming;
  int md_received;   /* RECV_INITIAL_METADATA done */
  int status_done;   /* the status tag has been plucked */
  int half_closed;   /* SEND_CLOSE_FROM_CLIENT sent */
  int ended;         /* end of stream or error seen */
  int cancelled;
  grpc_metadata_array md_in, trailing;
  grpc_status_code status;
  grpc_slice details;
  int status_tag, op_tag;
  atomic_long zc_refs; /* zero-copy slices gRPC still holds */
};

static _Thread_local int last_code;

int rpc_last_code(void) { return last_code; }

int rpc_client_open(const struct rpc_client_config *cfg, struct rpc_client **out) {
  *out = NULL;
  if (!cfg || !cfg->target || !cfg->target[0])
    return dpc_err(DPC_EINVAL, "rpc_client_open: no target address");
  struct rpc_client *c = calloc(1, sizeof *c);
  if (!c) return dpc_err(DPC_ENOMEM, "rpc_client_open: out of memory");
  grpc_channel_credentials *creds;
  int rc = rpc_creds_channel(cfg->tls, &creds);
  if (rc) {
    free(c);
    return rc;
  }
  grpc_init();
  c->max_msg = cfg->max_msg_bytes ? cfg->max_msg_bytes : RPC_MAX_MSG_DEFAULT;
  struct rpc_args args;
  rpc_args_init(&args, c->max_msg, cfg->own_connection);
  c->ch = grpc_channel_create(cfg->target, creds, &args.set);
  grpc_channel_credentials_release(creds);
  if (!c->ch) {
    free(c);
    grpc_shutdown();
    return dpc_err(DPC_EINVAL, "rpc: cannot create a channel to %s", cfg->target);
  }
  *out = c;
  return 0;
}

void rpc_client_close(struct rpc_client *c) {
  if (!c) return;
  grpc_channel_destroy(c->ch);
  for (size_t i = 0; i < c->n_md; i++) {
    free(c->md[i].key);
    free(c->md[i].value);
  }
  free(c);
  grpc_shutdown();
}

int rpc_client_set_md(struct rpc_client *c, const char *key, const char *value) {
  if (!key || !key[0] || strlen(key) > 100)
    return dpc_err(DPC_EINVAL, "rpc metadata: bad key");
  for (const char *p = key; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
          *p == '.'))
      return dpc_err(DPC_EINVAL, "rpc metadata key \"%s\": lower-case letters, digits, -_. only",
                     key);
  if (value)
    for (const char *p = value; *p; p++)
      if (*p < 0x20 || *p > 0x7e)
        return dpc_err(DPC_EINVAL, "rpc metadata %s: value must be printable ASCII", key);
  size_t i = 0;
  while (i < c->n_md && strcmp(c->md[i].key, key) != 0) i++;
  if (!value) {
    if (i < c->n_md) {
      free(c->md[i].key);
      free(c->md[i].value);
      c->md[i] = c->md[--c->n_md];
    }
    return 0;
  }
  char *v = strdup(value);
  if (!v) return dpc_err(DPC_ENOMEM, "rpc metadata: out of memory");
  if (i < c->n_md) {
    free(c->md[i].value);
    c->md[i].value = v;
    return 0;
  }
  if (c->n_md == MAX_MD) {
    free(v);
    return dpc_err(DPC_ERANGE, "rpc metadata: more than %d keys", MAX_MD);
  }
  char *k = strdup(key);
  if (!k) {
    free(v);
    return dpc_err(DPC_ENOMEM, "rpc metadata: out of memory");
  }
  c->md[c->n_md++] = (struct md_kv){k, v};
  return 0;
}

/* The client's metadata as grpc_metadata (static slices over the client's strings). */
static size_t fill_md(const struct rpc_client *c, grpc_metadata *md) {
  for (size_t i = 0; i < c->n_md; i++) {
    memset(&md[i], 0, sizeof md[i]);
    md[i].key = grpc_slice_from_static_string(c->md[i].key);
    md[i].value = grpc_slice_from_static_string(c->md[i].value);
  }
  return c->n_md;
}

static grpc_call *create_call(struct rpc_client *c, grpc_completion_queue *cq,
                              const char *method, int timeout_ms) {
  return grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                  grpc_slice_from_static_string(method), NULL,
                                  rpc_deadline(timeout_ms), NULL);
}

static void destroy_cq(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

/* Record a finished call's status; returns 0 or the mapped DPC code with detail. */
static int status_result(const char *method, grpc_status_code st, grpc_slice details) {
  last_code = (int)st;
  if (st == GRPC_STATUS_OK) return 0;
  size_t n = GRPC_SLICE_LENGTH(details);
  if (n > 400) n = 400;
  return dpc_err(rpc_code_to_dpc((int)st), "%s: %s: %.*s", method, rpc_code_name((int)st),
                 (int)n, (const char *)GRPC_SLICE_START_PTR(details));
}

static int check_method(const char *method) {
  if (!method || method[0] != '/' || strlen(method) >= 160)
    return dpc_err(DPC_EINVAL, "rpc: bad method path \"%s\"", method ? method : "(null)");
  return 0;
}

int rpc_unary(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
              const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
              int timeout_ms) {
  return rpc_unary_stoppable(c, method, req, resp_desc, resp, timeout_ms, NULL, NULL);
}

int rpc_unary_stoppable(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp, int timeout_ms,
                        int (*stop)(void *ud), void *ud) {
  *resp = NULL;
  last_code = RPC_INTERNAL;
  int rc = check_method(method);
  if (rc) return rc;
  grpc_byte_buffer *send = rpc_msg_pack(req);
  if (!send) return dpc_err(DPC_ENOMEM, "%s: cannot pack the request", method);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_call *call = create_call(c, cq, method, timeout_ms);
  grpc_metadata md[MAX_MD];
  grpc_metadata_array md_in, trailing;
  grpc_metadata_array_init(&md_in);
  grpc_metadata_array_init(&trailing);
  grpc_byte_buffer *recv = NULL;
  grpc_status_code st = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = fill_md(c, md);
  ops[0].data.send_initial_metadata.metadata = md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_in;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
  ops[5].data.recv_status_on_client.status = &st;
  ops[5].data.recv_status_on_client.status_details = &details;
  int tag;
  if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
    rc = dpc_err(DPC_EINTERNAL, "%s: cannot start the call", method);
  } else {
    int cancelled = 0;
    for (;;) {
      gpr_timespec until = stop && !cancelled ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                             gpr_time_from_millis(50, GPR_TIMESPAN))
                                              : gpr_inf_future(GPR_CLOCK_REALTIME);
      grpc_event ev = grpc_completion_queue_pluck(cq, &tag, until, NULL);
      if (ev.type == GRPC_OP_COMPLETE) break;
      if (stop && !cancelled && stop(ud)) {
        grpc_call_cancel(call, NULL);
        cancelled = 1;
      }
    }
    if (cancelled && st == GRPC_STATUS_CANCELLED) {
      last_code = RPC_CANCELLED;
      rc = dpc_err(DPC_ECANCELED, "%s: cancelled by the client", method);
    } else {
      rc = status_result(method, st, details);
    }
    if (rc == 0) {
      if (!recv) {
        rc = dpc_err(DPC_EFORMAT, "%s: status OK without a reply message", method);
      } else {
        rc = rpc_msg_unpack(recv, resp_desc, c->max_msg, resp);
      }
    }
  }
  if (recv) grpc_byte_buffer_destroy(recv);
  grpc_byte_buffer_destroy(send);
  grpc_slice_unref(details);
  grpc_metadata_array_destroy(&md_in);
  grpc_metadata_array_destroy(&trailing);
  grpc_call_unref(call);
  destroy_cq(cq);
  return rc;
}

/* Run one batch on the stream and wait for it; returns the batch's success flag. */
static int stream_batch(struct rpc_stream *s, const grpc_op *ops, size_t n) {
  if (grpc_call_start_batch(s->call, ops, n, &s->op_tag, NULL) != GRPC_CALL_OK) return 0;
  grpc_event ev =
      grpc_completion_queue_pluck(s->cq, &s->op_tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.success;
}

/* Wait for the status (posted at open) and turn it into a result. */
static int stream_status(struct rpc_stream *s) {
  if (!s->status_done) {
    grpc_completion_queue_pluck(s->cq, &s->status_tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    s->status_done = 1;
  }
  s->ended = 1;
  if (s->cancelled && s->status == GRPC_STATUS_CANCELLED) {
    last_code = RPC_CANCELLED;
    return dpc_err(DPC_ECANCELED, "%s: cancelled by the client", s->method);
  }
  return status_result(s->method, s->status, s->details);
}

int rpc_stream_open(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                    int timeout_ms, struct rpc_stream **out) {
  *out = NULL;
  last_code = RPC_INTERNAL;
  int rc = check_method(method);
  if (rc) return rc;
  struct rpc_stream *s = calloc(1, sizeof *s);
  if (!s) return dpc_err(DPC_ENOMEM, "%s: out of memory", method);
  s->cli = c;
  snprintf(s->method, sizeof s->method, "%s", method);
  s->server_streaming = req != NULL;
  s->details = grpc_empty_slice();
  s->status = GRPC_STATUS_UNKNOWN;
  atomic_init(&s->zc_refs, 0);
  grpc_metadata_array_init(&s->md_in);
  grpc_metadata_array_init(&s->trailing);
  s->cq = grpc_completion_queue_create_for_pluck(NULL);
  s->call = create_call(c, s->cq, s->method, timeout_ms);

  grpc_op st;
  memset(&st, 0, sizeof st);
  st.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  st.data.recv_status_on_client.trailing_metadata = &s->trailing;
  st.data.recv_status_on_client.status = &s->status;
  st.data.recv_status_on_client.status_details = &s->details;
  if (grpc_call_start_batch(s->call, &st, 1, &s->status_tag, NULL) != GRPC_CALL_OK) {
    s->status_done = 1;
    rpc_stream_free(s);
    return dpc_err(DPC_EINTERNAL, "%s: cannot start the call", method);
  }

  grpc_metadata md[MAX_MD];
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].data.send_initial_metadata.count = fill_md(c, md);
  ops[n++].data.send_initial_metadata.metadata = md;
  grpc_byte_buffer *bb = NULL;
  if (req) {
    bb = rpc_msg_pack(req);
    if (!bb) {
      rpc_stream_free(s);
      return dpc_err(DPC_ENOMEM, "%s: cannot pack the request", method);
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    s->half_closed = 1;
  }
  int ok = stream_batch(s, ops, n);
  if (bb) grpc_byte_buffer_destroy(bb);
  if (!ok) {
    rc = stream_status(s);
    rpc_stream_free(s);
    return rc ? rc : dpc_err(DPC_EINTERNAL, "%s: cannot start the call", method);
  }
  *out = s;
  return 0;
}

int rpc_stream_read(struct rpc_stream *s, struct grpc_byte_buffer **msg) {
  *msg = NULL;
  if (s->cancelled) return dpc_err(DPC_ECANCELED, "%s: cancelled", s->method);
  if (s->ended) return dpc_err(DPC_ESTATE, "%s: read after the end of the stream", s->method);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!s->md_received) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->md_in;
    s->md_received = 1;
  }
  grpc_byte_buffer *bb = NULL;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &bb;
  int ok = stream_batch(s, ops, n);
  if (ok && bb) {
    *msg = bb;
    return 1;
  }
  if (bb) grpc_byte_buffer_destroy(bb);
  int rc = stream_status(s); /* end of stream (ok, NULL) or a failed call */
  if (rc == 0 && !ok) rc = dpc_err(DPC_EIO, "%s: read failed", s->method);
  return rc;
}

int rpc_stream_write(struct rpc_stream *s, struct grpc_byte_buffer *msg) {
  if (!msg) return dpc_err(DPC_EINVAL, "%s: write of no message", s->method);
  if (s->cancelled || s->ended || s->half_closed) {
    grpc_byte_buffer_destroy(msg);
    if (s->cancelled) return dpc_err(DPC_ECANCELED, "%s: cancelled", s->method);
    return dpc_err(DPC_ESTATE, "%s: write after the client side closed", s->method);
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = msg;
  int ok = stream_batch(s, &op, 1);
  grpc_byte_buffer_destroy(msg);
  if (ok) return 0;
  int rc = stream_status(s); /* the server ended the call early: its status says why */
  return rc ? rc : dpc_err(DPC_EIO, "%s: the server closed the stream early", s->method);
}

static void zc_release(void *ud) {
  struct rpc_stream *s = ud;
  atomic_fetch_sub(&s->zc_refs, 1);
}

int rpc_stream_write_chunks(struct rpc_stream *s, const struct rpc_chunk *hdr,
                            const void *data, size_t len, size_t chunk_bytes) {
  if (chunk_bytes == 0) chunk_bytes = RPC_CHUNK_DEFAULT;
  if (chunk_bytes + 1024 > s->cli->max_msg)
    return dpc_err(DPC_EINVAL, "%s: chunk of %zu bytes does not fit the %zu-byte message limit",
                   s->method, chunk_bytes, s->cli->max_msg);
  uint32_t crc = dpc_crc32c(0, data, len);
  const uint8_t *p = data;
  size_t off = 0;
  for (;;) {
    size_t n = len - off < chunk_bytes ? len - off : chunk_bytes;
    struct rpc_chunk c = *hdr;
    c.offset = off;
    c.total = len;
    c.len = n;
    c.crc32c = off + n == len ? crc : 0;
    if (n > 0) atomic_fetch_add(&s->zc_refs, 1);
    grpc_byte_buffer *bb = rpc_chunk_encode(&c, p + off, n > 0 ? zc_release : NULL, s);
    if (!bb) return dpc_err(DPC_ENOMEM, "%s: out of memory encoding a chunk", s->method);
    int rc = rpc_stream_write(s, bb);
    if (rc) return rc;
    off += n;
    if (off == len) return 0;
  }
}

/* Wait until gRPC dropped every zero-copy reference into the caller's buffers. */
static void wait_zero_copy(struct rpc_stream *s) {
  struct timespec ts = {0, 100 * 1000};
  for (long i = 0; atomic_load(&s->zc_refs) > 0; i++) {
    if (i == 100000) DPC_WARN("%s: gRPC still holds %ld chunk buffers after 10 s", s->method,
                              (long)atomic_load(&s->zc_refs));
    nanosleep(&ts, NULL);
  }
}

int rpc_stream_finish(struct rpc_stream *s, const ProtobufCMessageDescriptor *resp_desc,
                      ProtobufCMessage **resp) {
  if (resp) *resp = NULL;
  if (s->cancelled) return dpc_err(DPC_ECANCELED, "%s: cancelled", s->method);
  grpc_byte_buffer *bb = NULL;
  int rc;
  if (!s->ended) {
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!s->half_closed) {
      ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
      s->half_closed = 1;
    }
    if (!s->md_received) {
      ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
      ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->md_in;
      s->md_received = 1;
    }
    if (resp_desc) {
      ops[n].op = GRPC_OP_RECV_MESSAGE;
      ops[n++].data.recv_message.recv_message = &bb;
    }
    if (n > 0) stream_batch(s, ops, n);
  }
  rc = stream_status(s);
  if (rc == 0 && resp_desc) {
    if (!bb)
      rc = dpc_err(DPC_EFORMAT, "%s: status OK without a reply message", s->method);
    else
      rc = rpc_msg_unpack(bb, resp_desc, s->cli->max_msg, resp);
  }
  if (bb) grpc_byte_buffer_destroy(bb);
  wait_zero_copy(s);
  return rc;
}

void rpc_stream_cancel(struct rpc_stream *s) {
  if (!s || s->ended) return;
  s->cancelled = 1;
  grpc_call_cancel(s->call, NULL);
}

void rpc_stream_free(struct rpc_stream *s) {
  if (!s) return;
  if (!s->status_done) {
    grpc_call_cancel(s->call, NULL);
    grpc_completion_queue_pluck(s->cq, &s->status_tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  }
  grpc_call_unref(s->call);
  wait_zero_copy(s);
  destroy_cq(s->cq);
  grpc_slice_unref(s->details);
  grpc_metadata_array_destroy(&s->md_in);
  grpc_metadata_array_destroy(&s->trailing);
  free(s);
}

int rpc_pull(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
             int timeout_ms, uint64_t start, void *dst, size_t cap, struct rpc_chunk *hdr,
             size_t *got) {
  if (got) *got = (size_t)start;
  if (start > cap) return dpc_err(DPC_EINVAL, "%s: resume offset %llu beyond the buffer (%zu)",
                                  method, (unsigned long long)start, cap);
  struct rpc_stream *s;
  int rc = rpc_stream_open(c, method, req, timeout_ms, &s);
  if (rc) return rc;
  uint64_t expect = start;
  uint32_t crc = 0; /* of dst[0, expect) while each chunk is still in cache (start = 0) */
  int complete = 0, first = 1;
  struct rpc_chunk h0, ch;
  memset(&ch, 0, sizeof ch);
  for (;;) {
    struct grpc_byte_buffer *bb;
    rc = rpc_stream_read(s, &bb);
    if (rc <= 0) break;
    rc = rpc_chunk_parse(bb, &ch);
    if (rc == 0) {
      if (first) {
        h0 = ch;
        if (ch.total > cap)
          rc = dpc_err(DPC_ERANGE, "%s: stream of %llu bytes exceeds the buffer (%zu)", method,
                       (unsigned long long)ch.total, cap);
      } else if (ch.total != h0.total || ch.fragment_id != h0.fragment_id ||
                 ch.version != h0.version || ch.codec != h0.codec) {
        rc = dpc_err(DPC_EFORMAT, "%s: chunk at offset %llu changes total/fragment/version",
                     method, (unsigned long long)ch.offset);
      }
    }
    if (rc == 0 && (complete || ch.offset != expect))
      rc = dpc_err(DPC_EFORMAT, "%s: chunk at offset %llu, expected %llu%s", method,
                   (unsigned long long)ch.offset, (unsigned long long)expect,
                   complete ? " (after the last chunk)" : "");
    if (rc == 0 && ch.offset + ch.len < ch.total && ch.crc32c != 0)
      rc = dpc_err(DPC_EFORMAT, "%s: checksum on a chunk that is not the last", method);
    if (rc == 0) rc = rpc_chunk_copy(bb, &ch, (uint8_t *)dst + ch.offset);
    rpc_msg_free(bb);
    if (rc) break;
    if (start == 0) crc = dpc_crc32c(crc, (uint8_t *)dst + ch.offset, (size_t)ch.len);
    first = 0;
    expect += ch.len;
    if (got) *got = (size_t)expect;
    if (expect == ch.total) complete = 1;
  }
  if (rc == 0 && !complete)
    rc = dpc_err(DPC_EFORMAT, "%s: stream ended at byte %llu of %llu", method,
                 (unsigned long long)expect, first ? 0ull : (unsigned long long)h0.total);
  if (rc == 0) {
    if (start > 0) crc = dpc_crc32c(0, dst, (size_t)ch.total); /* resumed: whole buffer */
    if (crc != ch.crc32c)
      rc = dpc_err(DPC_ECHECKSUM, "%s: fragment %llu version %llu: CRC-32C %08x, sender says "
                   "%08x; pull again", method, (unsigned long long)ch.fragment_id,
                   (unsigned long long)ch.version, crc, ch.crc32c);
    if (hdr) *hdr = ch;
  }
  rpc_stream_free(s); /* cancels the call if it has not ended */
  return rc;
}

int rpc_push(struct rpc_client *c, const char *method, const struct rpc_chunk *hdr,
             const void *data, size_t len, size_t chunk_bytes, int timeout_ms,
             const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp) {
  if (resp) *resp = NULL;
  struct rpc_stream *s;
  int rc = rpc_stream_open(c, method, NULL, timeout_ms, &s);
  if (rc) return rc;
  rc = rpc_stream_write_chunks(s, hdr, data, len, chunk_bytes);
  if (rc == 0) rc = rpc_stream_finish(s, resp_desc, resp);
  rpc_stream_free(s);
  return rc;
}
