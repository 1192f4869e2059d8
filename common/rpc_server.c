/* rpc_server.c — the server half of the gRPC call layer (contract in rpc.h).
 *
 * One completion queue, one pump thread blocked in grpc_completion_queue_next. Each event's
 * tag points into a call object (struct rpc_call) whose tags are embedded in it; the event
 * is handled either on the pump thread (no notify) or queued for rpc_server_dispatch() on
 * the owner's thread. Only the dispatch thread touches call objects, so calls need no lock;
 * s->mu guards the event queue and orders batch starts against the completion queue's
 * shutdown (starting a batch on a shut-down queue is a gRPC assertion).
 *
 * Call life: an armed request (TAG_REQUEST) → RECV_CLOSE_ON_SERVER posted first, so that
 * cancellation is always observed (gRPC reports it only through that op and failed ops) →
 * the method's on_call → sends, receives and the status, each a batch counted in `pending` →
 * when nothing is pending the call is over (the close op completes only once the status went
 * out or the call was cancelled): on_done, unref, free. */
#include "common/rpc_internal.h"

#include "common/errors.h"
#include "common/log.h"
#include "proto/health.pb-c.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HEALTH_CHECK_PATH "/grpc.health.v1.Health/Check"
#define DEFAULT_ARMED 4
#define MAX_ARMED 256

enum tag_kind { TAG_REQUEST, TAG_CLOSE, TAG_SEND, TAG_RECV, TAG_SHUTDOWN };

struct rpc_tag {
  enum tag_kind kind;
  struct rpc_call *call;
};

struct method_entry {
  struct rpc_method m;
  void *reg; /* grpc registered-method handle */
  struct rpc_server *srv;
};

struct rpc_call {
  struct rpc_server *srv;
  struct method_entry *me; /* NULL: the catch-all (answers UNIMPLEMENTED) */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_call_details details;   /* catch-all only */
  grpc_byte_buffer *payload;   /* first message of unary / server-streaming calls */
  grpc_byte_buffer *recv_bb;   /* RECV_MESSAGE target */
  grpc_byte_buffer *send_bb;   /* message of the send batch in flight */
  grpc_slice status_details;
  int has_status_details;
  struct rpc_tag t_req, t_close, t_send, t_recv;
  int close_cancelled; /* written by RECV_CLOSE_ON_SERVER */
  int pending;         /* batches in flight (close, send, recv) */
  unsigned started : 1, md_sent : 1, status_started : 1, send_busy : 1, send_has_status : 1,
      reading : 1, closed : 1, fin_pending : 1, half_closed : 1;
  int fin_code;
  char *fin_msg;
  void *user;
};

struct health_entry {
  char *service;
  int serving;
};

struct ev {
  void *tag;
  int ok;
};

struct rpc_server {
  grpc_server *server;
  grpc_completion_queue *cq;
  pthread_t pump;
  struct method_entry *methods; /* n_methods user methods, then Health/Check */
  size_t n_methods;
  int armed;
  size_t max_msg;
  int port;
  void (*notify)(void *ud);
  void *notify_ud;
  struct rpc_tag t_shutdown;

  pthread_mutex_t mu; /* guards everything below */
  pthread_cond_t cv;
  struct ev *q;
  size_t q_len, q_cap;
  int stopping, cq_shut, shutdown_seen, pump_done;
  long live_calls; /* armed requests + calls in progress, for the leak check at stop */

  pthread_mutex_t health_mu;
  struct health_entry *health;
  size_t n_health;
};

/* ------------------------------------------------------------------------------------- */

static grpc_call_error start_batch(struct rpc_server *s, grpc_call *call, const grpc_op *ops,
                                   size_t n, void *tag) {
  pthread_mutex_lock(&s->mu);
  grpc_call_error e =
      s->cq_shut ? GRPC_CALL_ERROR_COMPLETION_QUEUE_SHUTDOWN
                 : grpc_call_start_batch(call, ops, n, tag, NULL);
  pthread_mutex_unlock(&s->mu);
  return e;
}

static void call_free(struct rpc_call *c) {
  struct rpc_server *s = c->srv;
  if (c->call) grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->md);
  if (!c->me) grpc_call_details_destroy(&c->details);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->has_status_details) grpc_slice_unref(c->status_details);
  free(c->fin_msg);
  free(c);
  pthread_mutex_lock(&s->mu);
  s->live_calls--;
  pthread_mutex_unlock(&s->mu);
}

/* Arm one request for method me (NULL: the catch-all). */
static void arm(struct rpc_server *s, struct method_entry *me) {
  struct rpc_call *c = calloc(1, sizeof *c);
  if (!c) {
    DPC_ERROR("rpc: out of memory arming a request for %s", me ? me->m.path : "catch-all");
    return;
  }
  c->srv = s;
  c->me = me;
  c->t_req = (struct rpc_tag){TAG_REQUEST, c};
  c->t_close = (struct rpc_tag){TAG_CLOSE, c};
  c->t_send = (struct rpc_tag){TAG_SEND, c};
  c->t_recv = (struct rpc_tag){TAG_RECV, c};
  grpc_metadata_array_init(&c->md);
  if (!me) grpc_call_details_init(&c->details);
  grpc_call_error e = GRPC_CALL_ERROR;
  pthread_mutex_lock(&s->mu);
  if (!s->stopping) {
    s->live_calls++;
    if (me)
      e = grpc_server_request_registered_call(
          s->server, me->reg, &c->call, &c->deadline, &c->md,
          me->m.kind == RPC_CLIENT_STREAM ? NULL : &c->payload, s->cq, s->cq, &c->t_req);
    else
      e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq,
                                   &c->t_req);
    if (e != GRPC_CALL_OK) s->live_calls--;
  }
  pthread_mutex_unlock(&s->mu);
  if (e != GRPC_CALL_OK) {
    grpc_metadata_array_destroy(&c->md);
    if (!me) grpc_call_details_destroy(&c->details);
    free(c);
  }
}

/* Start the status batch (with initial metadata if not yet sent and an optional last
 * message, whose ownership is taken). */
static int start_status(struct rpc_call *c, int code, const char *msg, grpc_byte_buffer *m) {
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (m) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = m;
  }
  if (c->has_status_details) grpc_slice_unref(c->status_details);
  c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
  c->has_status_details = 1;
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)code;
  ops[n++].data.send_status_from_server.status_details = msg ? &c->status_details : NULL;
  c->status_started = 1;
  if (start_batch(c->srv, c->call, ops, n, &c->t_send) != GRPC_CALL_OK) {
    if (m) grpc_byte_buffer_destroy(m);
    return dpc_err(DPC_ESTATE, "rpc %s: cannot send the status (server stopped)",
                   rpc_call_method(c));
  }
  c->md_sent = 1;
  c->send_busy = 1;
  c->send_has_status = 1;
  c->send_bb = m;
  c->pending++;
  return 0;
}

static int post_recv(struct rpc_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_bb;
  if (start_batch(c->srv, c->call, &op, 1, &c->t_recv) != GRPC_CALL_OK)
    return dpc_err(DPC_ESTATE, "rpc %s: cannot start a read", rpc_call_method(c));
  c->reading = 1;
  c->pending++;
  return 0;
}

static void maybe_end(struct rpc_call *c) {
  if (!c->started || c->pending > 0) return;
  if (c->me && c->me->m.on_done) c->me->m.on_done(c, c->close_cancelled != 0, c->me->m.ud);
  call_free(c);
}

static void on_request(struct rpc_server *s, struct rpc_call *c, int ok) {
  if (!ok) { /* the server is shutting down: the armed request comes back unused */
    call_free(c);
    return;
  }
  arm(s, c->me); /* keep the same number armed */
  c->started = 1;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  if (start_batch(s, c->call, &op, 1, &c->t_close) != GRPC_CALL_OK) {
    call_free(c);
    return;
  }
  c->pending++;
  if (!c->me) {
    char path[256];
    size_t n = GRPC_SLICE_LENGTH(c->details.method);
    if (n >= sizeof path) n = sizeof path - 1;
    memcpy(path, GRPC_SLICE_START_PTR(c->details.method), n);
    path[n] = '\0';
    for (size_t i = 0; i < n; i++)
      if (path[i] < 0x20 || path[i] > 0x7e) path[i] = '?';
    rpc_call_finish(c, RPC_UNIMPLEMENTED, "unknown method %s", path);
  } else if (c->me->m.kind == RPC_CLIENT_STREAM) {
    c->me->m.on_call(c, NULL, c->me->m.ud);
    if (!c->status_started && !c->reading) post_recv(c);
  } else if (!c->payload) {
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "%s: no request message", c->me->m.path);
  } else {
    c->me->m.on_call(c, c->payload, c->me->m.ud);
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
  }
  maybe_end(c);
}

static void on_send_done(struct rpc_call *c, int ok) {
  c->pending--;
  c->send_busy = 0;
  if (c->send_bb) {
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
  }
  if (c->send_has_status) {
    c->send_has_status = 0;
  } else if (c->fin_pending) {
    c->fin_pending = 0;
    if (ok) start_status(c, c->fin_code, c->fin_msg, NULL);
  } else if (c->me && c->me->m.on_sent) {
    c->me->m.on_sent(c, ok, c->me->m.ud);
  }
  maybe_end(c);
}

static void on_recv_done(struct rpc_call *c, int ok) {
  c->pending--;
  c->reading = 0;
  grpc_byte_buffer *bb = c->recv_bb;
  c->recv_bb = NULL;
  if (ok && !c->status_started) {
    if (!bb) c->half_closed = 1;
    int r = c->me->m.on_message(c, bb, c->me->m.ud);
    if (bb && r == 0 && !c->status_started && !c->reading) post_recv(c);
  }
  if (bb) grpc_byte_buffer_destroy(bb);
  maybe_end(c);
}

static void handle(struct rpc_server *s, void *tagp, int ok) {
  struct rpc_tag *t = tagp;
  if (t->kind == TAG_SHUTDOWN) {
    pthread_mutex_lock(&s->mu);
    s->shutdown_seen = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return;
  }
  struct rpc_call *c = t->call;
  switch (t->kind) {
  case TAG_REQUEST: on_request(s, c, ok); break;
  case TAG_CLOSE:
    c->pending--;
    c->closed = 1;
    maybe_end(c);
    break;
  case TAG_SEND: on_send_done(c, ok); break;
  case TAG_RECV: on_recv_done(c, ok); break;
  default: break;
  }
}

static void *pump_main(void *arg) {
  struct rpc_server *s = arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    if (!s->notify) {
      handle(s, ev.tag, ev.success);
      continue;
    }
    pthread_mutex_lock(&s->mu);
    while (s->q_len == s->q_cap) {
      size_t cap = s->q_cap ? 2 * s->q_cap : 64;
      struct ev *q = realloc(s->q, cap * sizeof *q);
      if (q) {
        s->q = q;
        s->q_cap = cap;
        break;
      }
      /* Dropping an event would leak its call: wait for memory instead. */
      pthread_mutex_unlock(&s->mu);
      DPC_ERROR("rpc: out of memory queueing an event; retrying");
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
      pthread_mutex_lock(&s->mu);
    }
    int was_empty = s->q_len == 0;
    s->q[s->q_len++] = (struct ev){ev.tag, ev.success};
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (was_empty) s->notify(s->notify_ud);
  }
  pthread_mutex_lock(&s->mu);
  s->pump_done = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int rpc_server_dispatch(struct rpc_server *s) {
  if (!s || !s->notify) return 0;
  pthread_mutex_lock(&s->mu);
  struct ev *q = s->q;
  size_t n = s->q_len;
  s->q = NULL;
  s->q_len = s->q_cap = 0;
  pthread_mutex_unlock(&s->mu);
  for (size_t i = 0; i < n; i++) handle(s, q[i].tag, q[i].ok);
  free(q);
  return (int)n;
}

/* ------------------------------------------------------------------------------------- */
/* Health. */

static int health_find(struct rpc_server *s, const char *service) {
  for (size_t i = 0; i < s->n_health; i++)
    if (strcmp(s->health[i].service, service) == 0) return (int)i;
  return -1;
}

int rpc_server_set_health(struct rpc_server *s, const char *service, int serving) {
  if (!s || !service) return dpc_err(DPC_EINVAL, "rpc_server_set_health: no service");
  if (strlen(service) > 200) return dpc_err(DPC_EINVAL, "health: service name too long");
  int rc = 0;
  pthread_mutex_lock(&s->health_mu);
  int i = health_find(s, service);
  if (serving < 0) {
    if (i >= 0) {
      free(s->health[i].service);
      s->health[i] = s->health[--s->n_health];
    }
  } else if (i >= 0) {
    s->health[i].serving = serving != 0;
  } else {
    struct health_entry *h = realloc(s->health, (s->n_health + 1) * sizeof *h);
    char *name = strdup(service);
    if (!h || !name) {
      if (h) s->health = h;
      free(name);
      rc = dpc_err(DPC_ENOMEM, "health: out of memory");
    } else {
      s->health = h;
      s->health[s->n_health++] = (struct health_entry){name, serving != 0};
    }
  }
  pthread_mutex_unlock(&s->health_mu);
  return rc;
}

static void health_check(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  struct rpc_server *s = ud;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &grpc__health__v1__health_check_request__descriptor, 1024, &pm)) {
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "%s", dpc_errmsg());
    return;
  }
  const char *service = ((Grpc__Health__V1__HealthCheckRequest *)pm)->service;
  pthread_mutex_lock(&s->health_mu);
  int i = health_find(s, service ? service : "");
  int serving = i >= 0 ? s->health[i].serving : -1;
  pthread_mutex_unlock(&s->health_mu);
  if (serving < 0) {
    char name[64];
    snprintf(name, sizeof name, "%s", service ? service : "");
    rpc_call_finish(c, RPC_NOT_FOUND, "unknown service \"%s\"", name);
  } else {
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                       : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    rpc_call_reply(c, &r.base);
  }
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* "/pkg.Service/Method" → "pkg.Service" into buf; 0 if the path is well formed. */
static int service_of(const char *path, char *buf, size_t cap) {
  if (path[0] != '/') return -1;
  const char *slash = strchr(path + 1, '/');
  if (!slash || slash == path + 1 || slash[1] == '\0' || strchr(slash + 1, '/')) return -1;
  size_t n = (size_t)(slash - path - 1);
  if (n >= cap) return -1;
  memcpy(buf, path + 1, n);
  buf[n] = '\0';
  return 0;
}

/* ------------------------------------------------------------------------------------- */
/* Start and stop. */

static void server_free_memory(struct rpc_server *s) {
  if (s->methods)
    for (size_t i = 0; i <= s->n_methods; i++) free((char *)s->methods[i].m.path);
  free(s->methods);
  for (size_t i = 0; i < s->n_health; i++) free(s->health[i].service);
  free(s->health);
  free(s->q);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->health_mu);
  free(s);
}

/* The configuration and the method table, checked before anything is allocated. */
static int check_start_args(const struct rpc_server_config *cfg, const struct rpc_method *methods, size_t n) {
  if (!cfg || !cfg->addr) return dpc_err(DPC_EINVAL, "rpc_server_start: no address");
  if (n > 0 && !methods) return dpc_err(DPC_EINVAL, "rpc_server_start: no methods");
  if (cfg->armed < 0 || cfg->armed > MAX_ARMED)
    return dpc_err(DPC_EINVAL, "rpc_server_start: armed = %d, expected 0..%d", cfg->armed,
                   MAX_ARMED);
  char svc[200];
  for (size_t i = 0; i < n; i++) {
    const struct rpc_method *m = &methods[i];
    if (!m->path || service_of(m->path, svc, sizeof svc))
      return dpc_err(DPC_EINVAL, "rpc method %zu: path \"%s\" is not /package.Service/Method", i,
                     m->path ? m->path : "(null)");
    if (!m->on_call || (m->kind == RPC_CLIENT_STREAM && !m->on_message) ||
        (m->kind != RPC_UNARY && m->kind != RPC_SERVER_STREAM && m->kind != RPC_CLIENT_STREAM))
      return dpc_err(DPC_EINVAL, "rpc method %s: missing callback or bad kind", m->path);
    if (strcmp(m->path, HEALTH_CHECK_PATH) == 0)
      return dpc_err(DPC_EINVAL, "rpc method %s is served by the layer", m->path);
    for (size_t j = 0; j < i; j++)
      if (strcmp(methods[j].path, m->path) == 0)
        return dpc_err(DPC_EINVAL, "rpc method %s registered twice", m->path);
  }
  return 0;
}

/* The server's memory: its settings, the method table (the caller's n methods plus the health
 * check, paths copied) and every service marked serving. Nothing of gRPC yet. */
static int server_alloc(const struct rpc_server_config *cfg, const struct rpc_method *methods, size_t n,
                        struct rpc_server **out) {
  struct rpc_server *s = calloc(1, sizeof *s);
  if (!s) return dpc_err(DPC_ENOMEM, "rpc_server_start: out of memory");
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_mutex_init(&s->health_mu, NULL);
  s->armed = cfg->armed ? cfg->armed : DEFAULT_ARMED;
  s->max_msg = cfg->max_msg_bytes ? cfg->max_msg_bytes : RPC_MAX_MSG_DEFAULT;
  s->notify = cfg->notify;
  s->notify_ud = cfg->notify_ud;
  s->t_shutdown = (struct rpc_tag){TAG_SHUTDOWN, NULL};
  s->n_methods = n;
  s->methods = calloc(n + 1, sizeof *s->methods);
  if (!s->methods) {
    server_free_memory(s);
    return dpc_err(DPC_ENOMEM, "rpc_server_start: out of memory");
  }
  for (size_t i = 0; i <= n; i++) {
    struct method_entry *me = &s->methods[i];
    if (i < n) {
      me->m = methods[i];
    } else {
      me->m = (struct rpc_method){.path = HEALTH_CHECK_PATH, .kind = RPC_UNARY,
                                  .on_call = health_check, .ud = s};
    }
    me->srv = s;
    me->m.path = strdup(me->m.path);
    if (!me->m.path) {
      server_free_memory(s);
      return dpc_err(DPC_ENOMEM, "rpc_server_start: out of memory");
    }
  }
  int rc = rpc_server_set_health(s, "", 1);
  char svc[200];
  for (size_t i = 0; i <= n && rc == 0; i++) {
    service_of(s->methods[i].m.path, svc, sizeof svc);
    rc = rpc_server_set_health(s, svc, 1);
  }
  if (rc) {
    server_free_memory(s);
    return rc;
  }
  *out = s;
  return 0;
}

/* Create the gRPC server and its completion queue with the layer's channel arguments, register
 * every method and bind cfg->addr (s->port). After grpc_init; on failure the caller destroys
 * the never-started server. */
static int server_listen(struct rpc_server *s, const struct rpc_server_config *cfg, grpc_server_credentials *creds) {
  struct rpc_args args;
  rpc_args_init(&args, s->max_msg, 0);
  grpc_arg sa[16];
  size_t na = 0;
  for (size_t i = 0; i < args.set.num_args; i++) sa[na++] = args.set.args[i];
#define INT_ARG(k, v) sa[na++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)(k), .value.integer = (v)}
  INT_ARG(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
          cfg->handshake_timeout_ms > 0 ? cfg->handshake_timeout_ms : RPC_HANDSHAKE_TIMEOUT_DEFAULT_MS);
  INT_ARG(GRPC_ARG_MAX_CONNECTION_IDLE_MS, cfg->idle_timeout_ms > 0 ? cfg->idle_timeout_ms : RPC_IDLE_TIMEOUT_DEFAULT_MS);
  INT_ARG(GRPC_ARG_MAX_CONCURRENT_STREAMS, cfg->max_streams > 0 ? cfg->max_streams : RPC_MAX_STREAMS_DEFAULT);
  INT_ARG(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  INT_ARG(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  INT_ARG(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  INT_ARG(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
#undef INT_ARG
  grpc_channel_args server_args = {.num_args = na, .args = sa};
  s->server = grpc_server_create(&server_args, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  for (size_t i = 0; i <= s->n_methods; i++) {
    struct method_entry *me = &s->methods[i];
    me->reg = grpc_server_register_method(
        s->server, me->m.path, NULL,
        me->m.kind == RPC_CLIENT_STREAM ? GRPC_SRM_PAYLOAD_NONE
                                        : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
        0);
    if (!me->reg) return dpc_err(DPC_EINVAL, "rpc: cannot register method %s", me->m.path);
  }
  s->port = grpc_server_add_http2_port(s->server, cfg->addr, creds);
  if (s->port <= 0) return dpc_err(DPC_EIO, "rpc: cannot listen on %s (address in use or invalid?)", cfg->addr);
  return 0;
}

int rpc_server_start(const struct rpc_server_config *cfg, const struct rpc_method *methods,
                     size_t n, struct rpc_server **out) {
  *out = NULL;
  struct rpc_server *s = NULL;
  int rc = check_start_args(cfg, methods, n);
  if (rc || (rc = server_alloc(cfg, methods, n, &s))) return rc;
  grpc_server_credentials *creds;
  if ((rc = rpc_creds_server(cfg->tls, &creds))) {
    server_free_memory(s);
    return rc;
  }
  grpc_init();
  rc = server_listen(s, cfg, creds);
  grpc_server_credentials_release(creds);
  if (rc) { /* never started: destroy directly */
    grpc_server_destroy(s->server);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    server_free_memory(s);
    grpc_shutdown();
    return rc;
  }
  grpc_server_start(s->server);
  if (pthread_create(&s->pump, NULL, pump_main, s) != 0) {
    /* No pump: shut down with nothing armed and drain by hand. */
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
    grpc_server_cancel_all_calls(s->server);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_server_destroy(s->server);
    grpc_completion_queue_destroy(s->cq);
    server_free_memory(s);
    grpc_shutdown();
    return dpc_err(DPC_EINTERNAL, "rpc: cannot start the pump thread");
  }
  for (size_t i = 0; i <= n; i++)
    for (int k = 0; k < s->armed; k++) arm(s, &s->methods[i]);
  for (int k = 0; k < s->armed; k++) arm(s, NULL);
  *out = s;
  return 0;
}

int rpc_server_port(const struct rpc_server *s) { return s ? s->port : 0; }

/* Wait until the shutdown tag has been seen, for at most ms (< 0: forever), dispatching
 * queued events on this thread meanwhile when the owner dispatches. 1 if seen. */
static int wait_shutdown(struct rpc_server *s, int ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  if (ms > 0) {
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
  }
  for (;;) {
    rpc_server_dispatch(s);
    pthread_mutex_lock(&s->mu);
    if (s->shutdown_seen) {
      pthread_mutex_unlock(&s->mu);
      return 1;
    }
    if (s->notify && s->q_len > 0) {
      pthread_mutex_unlock(&s->mu);
      continue;
    }
    int timed_out = 0;
    if (ms < 0)
      pthread_cond_wait(&s->cv, &s->mu);
    else
      timed_out = pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT;
    pthread_mutex_unlock(&s->mu);
    if (timed_out) {
      rpc_server_dispatch(s);
      pthread_mutex_lock(&s->mu);
      int seen = s->shutdown_seen;
      pthread_mutex_unlock(&s->mu);
      return seen;
    }
  }
}

void rpc_server_stop(struct rpc_server *s, int grace_ms) {
  if (!s) return;
  pthread_mutex_lock(&s->health_mu);
  for (size_t i = 0; i < s->n_health; i++) s->health[i].serving = 0;
  pthread_mutex_unlock(&s->health_mu);
  pthread_mutex_lock(&s->mu);
  s->stopping = 1; /* no more re-arming */
  pthread_mutex_unlock(&s->mu);
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
  if (!wait_shutdown(s, grace_ms < 0 ? 0 : grace_ms)) {
    grpc_server_cancel_all_calls(s->server);
    wait_shutdown(s, -1);
  }
  /* Every call has ended; what is left in the queue are their last completions and the
   * unused armed requests (ok = 0). */
  pthread_mutex_lock(&s->mu);
  s->cq_shut = 1;
  grpc_completion_queue_shutdown(s->cq);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->pump, NULL);
  rpc_server_dispatch(s);
  if (s->live_calls != 0) DPC_ERROR("rpc: %ld calls still alive at shutdown", s->live_calls);
  grpc_server_destroy(s->server);
  grpc_completion_queue_destroy(s->cq);
  server_free_memory(s);
  grpc_shutdown();
}

/* ------------------------------------------------------------------------------------- */
/* Calls. */

void rpc_call_set_data(struct rpc_call *c, void *data) { c->user = data; }
void *rpc_call_data(const struct rpc_call *c) { return c->user; }
const char *rpc_call_method(const struct rpc_call *c) {
  return c->me ? c->me->m.path : "(unknown method)";
}

int rpc_call_md(const struct rpc_call *c, const char *key, char *buf, size_t cap) {
  size_t klen = strlen(key);
  for (size_t i = 0; i < c->md.count; i++) {
    const grpc_metadata *m = &c->md.metadata[i];
    if (GRPC_SLICE_LENGTH(m->key) != klen ||
        memcmp(GRPC_SLICE_START_PTR(m->key), key, klen) != 0)
      continue;
    size_t vlen = GRPC_SLICE_LENGTH(m->value);
    const uint8_t *v = GRPC_SLICE_START_PTR(m->value);
    if (vlen >= cap || memchr(v, 0, vlen))
      return dpc_err(DPC_ERANGE, "rpc %s: metadata %s too long (%zu bytes) or not text",
                     rpc_call_method(c), key, vlen);
    memcpy(buf, v, vlen);
    buf[vlen] = '\0';
    return (int)vlen;
  }
  return dpc_err(DPC_ENOENT, "rpc %s: no metadata %s", rpc_call_method(c), key);
}

int64_t rpc_call_deadline_ms(const struct rpc_call *c) {
  gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
  if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0) return INT64_MAX;
  gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
  return (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
}

int rpc_call_cancelled(const struct rpc_call *c) { return c->closed && c->close_cancelled; }

int rpc_call_reply(struct rpc_call *c, const ProtobufCMessage *resp) {
  if (c->status_started || c->fin_pending || c->send_busy)
    return dpc_err(DPC_ESTATE, "rpc %s: reply after the call was answered", rpc_call_method(c));
  grpc_byte_buffer *bb = rpc_msg_pack(resp);
  if (!bb) return dpc_err(DPC_ENOMEM, "rpc %s: cannot pack the reply", rpc_call_method(c));
  if (rpc_msg_len(bb) > c->srv->max_msg) {
    grpc_byte_buffer_destroy(bb);
    int rc = dpc_err(DPC_ERANGE, "rpc %s: reply of %zu bytes exceeds the message limit",
                     rpc_call_method(c), protobuf_c_message_get_packed_size(resp));
    start_status(c, RPC_RESOURCE_EXHAUSTED, dpc_errmsg(), NULL);
    return rc;
  }
  return start_status(c, RPC_OK, NULL, bb);
}

int rpc_call_send(struct rpc_call *c, struct grpc_byte_buffer *m) {
  if (!m) return dpc_err(DPC_EINVAL, "rpc %s: send of no message", rpc_call_method(c));
  if (c->status_started || c->fin_pending || c->send_busy) {
    grpc_byte_buffer_destroy(m);
    return dpc_err(DPC_ESTATE, "rpc %s: send while %s", rpc_call_method(c),
                   c->send_busy ? "a send is in flight" : "the call is finished");
  }
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = m;
  if (start_batch(c->srv, c->call, ops, n, &c->t_send) != GRPC_CALL_OK) {
    grpc_byte_buffer_destroy(m);
    return dpc_err(DPC_ESTATE, "rpc %s: cannot send (server stopped)", rpc_call_method(c));
  }
  c->md_sent = 1;
  c->send_busy = 1;
  c->send_bb = m;
  c->pending++;
  return 0;
}

int rpc_call_send_msg(struct rpc_call *c, const ProtobufCMessage *m) {
  grpc_byte_buffer *bb = rpc_msg_pack(m);
  if (!bb) return dpc_err(DPC_ENOMEM, "rpc %s: cannot pack a message", rpc_call_method(c));
  return rpc_call_send(c, bb);
}

int rpc_call_finish(struct rpc_call *c, int code, const char *fmt, ...) {
  if (c->status_started || c->fin_pending)
    return dpc_err(DPC_ESTATE, "rpc %s: finished twice", rpc_call_method(c));
  if (code < 0 || code > RPC_UNAUTHENTICATED) code = RPC_INTERNAL;
  char msg[512];
  msg[0] = '\0';
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
  }
  if (c->send_busy) { /* the status follows the message in flight */
    c->fin_msg = strdup(msg);
    if (!c->fin_msg) return dpc_err(DPC_ENOMEM, "rpc: out of memory");
    c->fin_code = code;
    c->fin_pending = 1;
    return 0;
  }
  return start_status(c, code, fmt ? msg : NULL, NULL);
}

int rpc_call_fail(struct rpc_call *c, int dpc_rc) {
  const char *detail = dpc_errmsg();
  return rpc_call_finish(c, rpc_code_from_dpc(dpc_rc), "%s", detail[0] ? detail
                                                                          : dpc_strerror(dpc_rc));
}

int rpc_call_read(struct rpc_call *c) {
  if (!c->me || c->me->m.kind != RPC_CLIENT_STREAM || c->reading || c->half_closed ||
      c->status_started)
    return dpc_err(DPC_ESTATE, "rpc %s: read not possible now", rpc_call_method(c));
  return post_recv(c);
}
