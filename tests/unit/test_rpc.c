/* test_rpc.c — the gRPC call layer (common/rpc*.c) end to end on loopback: hand-coded chunk
 * codec against protobuf-c, unary calls with metadata, Health/Check, server-streaming pulls
 * of a 64 MiB fragment in 4 MiB chunks with CRC-32C (and a resumed pull and a corrupted
 * one), client-streaming pushes, deadlines, client cancellation, UNIMPLEMENTED, and a clean
 * shutdown with calls in flight. The server half runs twice: callbacks on the pump thread,
 * and callbacks on an owner thread through notify + rpc_server_dispatch (the libuv shape). */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"
#include "proto/health.pb-c.h"
#include "tests/unit/test.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FRAG_LEN ((size_t)64 << 20)
#define CHUNK ((size_t)4 << 20)
#define TOKEN "s3cret-session"

static uint8_t *g_frag;
static atomic_long g_zc_out;        /* server zero-copy chunks not yet released by gRPC */
static atomic_int g_pull_done, g_pull_cancelled;
static atomic_int g_push_ok, g_push_paused, g_push_done;
static atomic_int g_lease_held, g_lease_done, g_lease_cancelled;
static _Atomic long long g_lease_deadline_ms; /* rpc_call_deadline_ms of the last Lease */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Wait up to ms for *v >= want. */
static int wait_for(atomic_int *v, int want, int ms) {
  for (int i = 0; i < ms; i += 5) {
    if (atomic_load(v) >= want) return 1;
    sleep_ms(5);
  }
  return atomic_load(v) >= want;
}

/* ---------------------------------------------------------------- server handlers ---- */

static void list_jobs(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  char tok[64];
  if (rpc_call_md(c, RPC_MD_SESSION, tok, sizeof tok) < 0 || strcmp(tok, TOKEN) != 0) {
    rpc_call_finish(c, RPC_UNAUTHENTICATED, "bad or missing %s", RPC_MD_SESSION);
    return;
  }
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__list_jobs_request__descriptor, 0, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__ListJobsRequest *r = (Dipaco__V1__ListJobsRequest *)pm;
  if (r->limit > 100) {
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "limit %u exceeds 100", r->limit);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  Dipaco__V1__ListJobsResponse resp = DIPACO__V1__LIST_JOBS_RESPONSE__INIT;
  Dipaco__V1__JobSummary js[100], *jp[100];
  char names[100][32];
  for (uint32_t i = 0; i < r->limit; i++) {
    dipaco__v1__job_summary__init(&js[i]);
    js[i].job_id = r->after_job_id + 1 + i;
    snprintf(names[i], sizeof names[i], "job-%llu", (unsigned long long)js[i].job_id);
    js[i].name = names[i];
    js[i].state = DIPACO__V1__JOB_STATE__JOB_RUNNING;
    jp[i] = &js[i];
  }
  resp.n_jobs = r->limit;
  resp.jobs = jp;
  rpc_call_reply(c, &resp.base);
  protobuf_c_message_free_unpacked(pm, NULL);
}

struct pull_state {
  uint64_t off, fragment_id;
  size_t chunk;
  int last_sent;
};

static void zc_release(void *ud) {
  (void)ud;
  atomic_fetch_sub(&g_zc_out, 1);
}

static void pull_send_next(struct rpc_call *c) {
  struct pull_state *st = rpc_call_data(c);
  struct rpc_chunk h;
  memset(&h, 0, sizeof h);
  h.fragment_id = st->fragment_id;
  h.version = 7;
  h.payload = DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS;
  if (st->fragment_id == 3) { /* endless stream, for the cancellation test */
    h.total = (uint64_t)1 << 40;
    h.offset = st->off;
    h.len = 65536;
    st->off += h.len;
    rpc_call_send(c, rpc_chunk_encode(&h, g_frag, NULL, NULL));
    return;
  }
  size_t n = FRAG_LEN - st->off < st->chunk ? FRAG_LEN - st->off : st->chunk;
  h.offset = st->off;
  h.total = FRAG_LEN;
  h.num_floats = FRAG_LEN / 4;
  h.len = n;
  if (st->off + n == FRAG_LEN) {
    h.crc32c = dpc_crc32c(0, g_frag, FRAG_LEN);
    if (st->fragment_id == 2) h.crc32c ^= 1; /* corrupted on purpose */
    st->last_sent = 1;
  }
  atomic_fetch_add(&g_zc_out, 1);
  rpc_call_send(c, rpc_chunk_encode(&h, g_frag + st->off, zc_release, NULL));
  st->off += n;
  if (st->last_sent) rpc_call_finish(c, RPC_OK, NULL); /* queued behind the last chunk */
}

static void pull_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__pull_fragment_request__descriptor, 1024, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__PullFragmentRequest *r = (Dipaco__V1__PullFragmentRequest *)pm;
  if (r->offset > FRAG_LEN) {
    rpc_call_finish(c, RPC_OUT_OF_RANGE, "offset %llu beyond the fragment",
                    (unsigned long long)r->offset);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  struct pull_state *st = calloc(1, sizeof *st);
  st->off = r->offset;
  st->fragment_id = r->fragment_id;
  st->chunk = r->max_chunk_bytes ? r->max_chunk_bytes : CHUNK;
  if (st->chunk < RPC_CHUNK_MIN) st->chunk = RPC_CHUNK_MIN;
  if (st->chunk > CHUNK) st->chunk = CHUNK;
  protobuf_c_message_free_unpacked(pm, NULL);
  rpc_call_set_data(c, st);
  pull_send_next(c);
}

static void pull_sent(struct rpc_call *c, int ok, void *ud) {
  (void)ud;
  if (ok) pull_send_next(c);
}

static void pull_done(struct rpc_call *c, int cancelled, void *ud) {
  (void)ud;
  free(rpc_call_data(c));
  atomic_fetch_add(&g_pull_done, 1);
  if (cancelled) atomic_fetch_add(&g_pull_cancelled, 1);
}

struct push_state {
  uint8_t *buf;
  uint64_t total, expect, fragment_id;
  uint32_t crc;
  int started;
};

static void push_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  rpc_call_set_data(c, calloc(1, sizeof(struct push_state)));
}

static int push_message(struct rpc_call *c, const struct grpc_byte_buffer *msg, void *ud) {
  (void)ud;
  struct push_state *st = rpc_call_data(c);
  if (!msg) { /* client done: verify and answer */
    if (!st->started || st->expect != st->total) {
      rpc_call_finish(c, RPC_INVALID_ARGUMENT, "incomplete stream");
      return 0;
    }
    if (dpc_crc32c(0, st->buf, st->total) != st->crc) {
      rpc_call_finish(c, RPC_DATA_LOSS, "checksum mismatch");
      return 0;
    }
    if (st->total == FRAG_LEN && memcmp(st->buf, g_frag, FRAG_LEN) == 0)
      atomic_fetch_add(&g_push_ok, 1);
    Dipaco__V1__FragmentAck ack = DIPACO__V1__FRAGMENT_ACK__INIT, *acks[1] = {&ack};
    ack.fragment_id = st->fragment_id;
    ack.result = DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED;
    ack.version = st->total;
    Dipaco__V1__PushDeltaResponse resp = DIPACO__V1__PUSH_DELTA_RESPONSE__INIT;
    resp.n_acks = 1;
    resp.acks = acks;
    rpc_call_reply(c, &resp.base);
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(msg, &ch)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return 0;
  }
  if (!st->started) {
    if (ch.total > FRAG_LEN) {
      rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "too large");
      return 0;
    }
    st->started = 1;
    st->total = ch.total;
    st->fragment_id = ch.fragment_id;
    st->buf = malloc(ch.total ? ch.total : 1);
  }
  if (ch.total != st->total || ch.offset != st->expect) {
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "chunk at %llu, expected %llu",
                    (unsigned long long)ch.offset, (unsigned long long)st->expect);
    return 0;
  }
  rpc_chunk_copy(msg, &ch, st->buf + ch.offset);
  st->expect += ch.len;
  if (st->expect == st->total) st->crc = ch.crc32c;
  if (ch.fragment_id == 9) { /* hold the stream: the shutdown test */
    atomic_fetch_add(&g_push_paused, 1);
    return 1;
  }
  return 0;
}

static void push_done(struct rpc_call *c, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  struct push_state *st = rpc_call_data(c);
  free(st->buf);
  free(st);
  atomic_fetch_add(&g_push_done, 1);
}

static void lease_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  atomic_store(&g_lease_deadline_ms, (long long)rpc_call_deadline_ms(c));
  atomic_fetch_add(&g_lease_held, 1); /* never answered: deadlines, shutdown */
}

static void lease_done(struct rpc_call *c, int cancelled, void *ud) {
  (void)c;
  (void)ud;
  atomic_fetch_add(&g_lease_done, 1);
  if (cancelled) atomic_fetch_add(&g_lease_cancelled, 1);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Admin/ListJobs", .kind = RPC_UNARY, .on_call = list_jobs},
    {.path = "/dipaco.v1.Coordinator/PullFragment", .kind = RPC_SERVER_STREAM,
     .on_call = pull_call, .on_sent = pull_sent, .on_done = pull_done},
    {.path = "/dipaco.v1.Coordinator/PushDelta", .kind = RPC_CLIENT_STREAM,
     .on_call = push_call, .on_message = push_message, .on_done = push_done},
    {.path = "/dipaco.v1.Coordinator/Lease", .kind = RPC_UNARY, .on_call = lease_call,
     .on_done = lease_done},
};

/* -------------------------------------------- owner thread for the dispatch mode ---- */

struct owner {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int woken, stop;
  struct rpc_server *srv;
  pthread_t th;
  long dispatched;
};

static void owner_notify(void *ud) {
  struct owner *o = ud;
  pthread_mutex_lock(&o->mu);
  o->woken = 1;
  pthread_cond_signal(&o->cv);
  pthread_mutex_unlock(&o->mu);
}

static void *owner_main(void *arg) {
  struct owner *o = arg;
  for (;;) {
    pthread_mutex_lock(&o->mu);
    while (!o->woken && !o->stop) pthread_cond_wait(&o->cv, &o->mu);
    int stop = o->stop;
    o->woken = 0;
    pthread_mutex_unlock(&o->mu);
    if (stop) {
      rpc_server_stop(o->srv, 300); /* on the dispatch thread, as rpc.h asks */
      return NULL;
    }
    o->dispatched += rpc_server_dispatch(o->srv);
  }
}

/* ------------------------------------------------------------------- client side ---- */

struct lease_thread {
  struct rpc_client *cli;
  int timeout_ms, rc, code;
  pthread_t th;
};

static void *lease_main(void *arg) {
  struct lease_thread *t = arg;
  Dipaco__V1__LeaseRequest req = DIPACO__V1__LEASE_REQUEST__INIT;
  ProtobufCMessage *resp;
  t->rc = rpc_unary(t->cli, "/dipaco.v1.Coordinator/Lease", &req.base,
                    &dipaco__v1__lease_response__descriptor, &resp, t->timeout_ms);
  t->code = rpc_last_code();
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return NULL;
}

struct many_thread {
  struct rpc_client *cli;
  uint64_t base;
  int ok;
  pthread_t th;
};

static void *many_main(void *arg) {
  struct many_thread *t = arg;
  for (int i = 0; i < 50; i++) {
    Dipaco__V1__ListJobsRequest req = DIPACO__V1__LIST_JOBS_REQUEST__INIT;
    req.limit = 1 + (uint32_t)(i % 5);
    req.after_job_id = t->base + (uint64_t)i;
    ProtobufCMessage *pm;
    if (rpc_unary(t->cli, "/dipaco.v1.Admin/ListJobs", &req.base,
                  &dipaco__v1__list_jobs_response__descriptor, &pm, 10000))
      continue;
    Dipaco__V1__ListJobsResponse *r = (Dipaco__V1__ListJobsResponse *)pm;
    if (r->n_jobs == req.limit && r->jobs[r->n_jobs - 1]->job_id == req.after_job_id + req.limit)
      t->ok++;
    protobuf_c_message_free_unpacked(pm, NULL);
  }
  return NULL;
}

static void test_chunk_codec(void) {
  /* Hand encoding → protobuf-c decoding. */
  uint8_t data[1000];
  for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 7);
  struct rpc_chunk h = {.lease_id = 1ull << 40, .fragment_id = 5, .version = 300, .offset = 1000,
                        .total = 5000, .codec = 2, .crc32c = 0xdeadbeef, .num_floats = 4000,
                        .block_floats = 256, .inner_steps = 500, .tokens = 123456789,
                        .payload = 1, .step = 77, .len = 1000};
  struct grpc_byte_buffer *bb = rpc_chunk_encode(&h, data, NULL, NULL);
  ProtobufCMessage *pm;
  CHECK_EQ_INT(rpc_msg_unpack(bb, &dipaco__v1__chunk__descriptor, 0, &pm), 0);
  Dipaco__V1__Chunk *m = (Dipaco__V1__Chunk *)pm;
  CHECK(m->lease_id == h.lease_id && m->fragment_id == 5 && m->version == 300);
  CHECK(m->offset == 1000 && m->total == 5000 && m->codec == 2 && m->crc32c == 0xdeadbeef);
  CHECK(m->num_floats == 4000 && m->block_floats == 256 && m->inner_steps == 500);
  CHECK(m->tokens == 123456789 && m->payload == 1 && m->step == 77);
  CHECK(m->data.len == 1000 && memcmp(m->data.data, data, 1000) == 0);
  /* protobuf-c encoding → hand decoding, from a buffer of many tiny slices. */
  size_t n = protobuf_c_message_get_packed_size(pm);
  uint8_t *raw = malloc(n);
  protobuf_c_message_pack(pm, raw);
  grpc_slice sl[64];
  size_t ns = 0, step = (n + 63) / 64;
  for (size_t off = 0; off < n; off += step, ns++)
    sl[ns] = grpc_slice_from_copied_buffer((char *)raw + off, off + step < n ? step : n - off);
  grpc_byte_buffer *many = grpc_raw_byte_buffer_create(sl, ns);
  for (size_t i = 0; i < ns; i++) grpc_slice_unref(sl[i]);
  struct rpc_chunk p;
  CHECK_EQ_INT(rpc_chunk_parse(many, &p), 0);
  CHECK(p.lease_id == h.lease_id && p.fragment_id == 5 && p.version == 300 && p.offset == 1000);
  CHECK(p.total == 5000 && p.codec == 2 && p.crc32c == 0xdeadbeef && p.num_floats == 4000);
  CHECK(p.block_floats == 256 && p.inner_steps == 500 && p.tokens == 123456789);
  CHECK(p.payload == 1 && p.step == 77 && p.len == 1000);
  uint8_t out[1000];
  CHECK_EQ_INT(rpc_chunk_copy(many, &p, out), 0);
  CHECK(memcmp(out, data, 1000) == 0);
  grpc_byte_buffer_destroy(many);
  /* Every truncation of the message is rejected (or parses as a shorter valid prefix whose
   * data range is consistent); none reads out of bounds. */
  int rejected = 0;
  for (size_t cut = 1; cut < n; cut++) {
    grpc_slice s1 = grpc_slice_from_copied_buffer((char *)raw, cut);
    grpc_byte_buffer *t = grpc_raw_byte_buffer_create(&s1, 1);
    grpc_slice_unref(s1);
    if (rpc_chunk_parse(t, &p) != 0) rejected++;
    grpc_byte_buffer_destroy(t);
  }
  CHECK(rejected > (int)n / 2);
  /* offset + len > total is rejected. */
  m->total = 1500;
  size_t n2 = protobuf_c_message_pack(pm, raw);
  grpc_slice s2 = grpc_slice_from_copied_buffer((char *)raw, n2);
  grpc_byte_buffer *bad = grpc_raw_byte_buffer_create(&s2, 1);
  grpc_slice_unref(s2);
  CHECK_EQ_INT(rpc_chunk_parse(bad, &p), DPC_EFORMAT);
  grpc_byte_buffer_destroy(bad);
  free(raw);
  protobuf_c_message_free_unpacked(pm, NULL);
  rpc_msg_free(bb);
  /* Status code mapping round trip for the codes the layer produces. */
  CHECK_EQ_INT(rpc_code_to_dpc(RPC_DEADLINE_EXCEEDED), DPC_ETIMEDOUT);
  CHECK_EQ_INT(rpc_code_from_dpc(DPC_ECHECKSUM), RPC_DATA_LOSS);
  CHECK_EQ_INT(rpc_code_to_dpc(rpc_code_from_dpc(DPC_EAUTH)), DPC_EAUTH);
}

static int health(struct rpc_client *cli, const char *service) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)service;
  ProtobufCMessage *pm;
  int rc = rpc_unary(cli, "/grpc.health.v1.Health/Check", &req.base,
                     &grpc__health__v1__health_check_response__descriptor, &pm, 5000);
  if (rc) return rc;
  int st = ((Grpc__Health__V1__HealthCheckResponse *)pm)->status;
  protobuf_c_message_free_unpacked(pm, NULL);
  return st;
}

static int pull(struct rpc_client *cli, uint64_t fragment_id, uint64_t offset, uint8_t *dst,
                struct rpc_chunk *hdr, size_t *got) {
  Dipaco__V1__PullFragmentRequest req = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
  req.fragment_id = fragment_id;
  req.offset = offset;
  return rpc_pull(cli, "/dipaco.v1.Coordinator/PullFragment", &req.base, 30000, offset, dst,
                  FRAG_LEN, hdr, got);
}

static void run_suite(int dispatch_mode) {
  fprintf(stderr, "--- suite: callbacks on the %s thread\n", dispatch_mode ? "owner" : "pump");
  atomic_store(&g_lease_held, 0);
  atomic_store(&g_lease_done, 0);
  atomic_store(&g_lease_cancelled, 0);
  atomic_store(&g_pull_done, 0);
  atomic_store(&g_pull_cancelled, 0);
  atomic_store(&g_push_ok, 0);
  atomic_store(&g_push_paused, 0);
  atomic_store(&g_push_done, 0);

  struct owner o;
  memset(&o, 0, sizeof o);
  pthread_mutex_init(&o.mu, NULL);
  pthread_cond_init(&o.cv, NULL);
  struct rpc_server_config cfg = {.addr = "127.0.0.1:0", .armed = 2};
  if (dispatch_mode) {
    cfg.notify = owner_notify;
    cfg.notify_ud = &o;
  }
  struct rpc_server *srv;
  int rc = rpc_server_start(&cfg, methods, sizeof methods / sizeof methods[0], &srv);
  CHECK_EQ_INT(rc, 0);
  if (rc) {
    fprintf(stderr, "server: %s\n", dpc_errmsg());
    return;
  }
  int port = rpc_server_port(srv);
  fprintf(stderr, "server bound to 127.0.0.1:%d\n", port);
  CHECK(port > 0);
  if (dispatch_mode) {
    o.srv = srv;
    pthread_create(&o.th, NULL, owner_main, &o);
  }

  /* A second server on the same port must fail (SO_REUSEPORT off). */
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  struct rpc_server *dup;
  struct rpc_server_config cfg2 = {.addr = addr};
  CHECK_EQ_INT(rpc_server_start(&cfg2, methods, 1, &dup), DPC_EIO);

  struct rpc_client *cli;
  struct rpc_client_config ccfg = {.target = addr};
  CHECK_EQ_INT(rpc_client_open(&ccfg, &cli), 0);

  /* Unary: missing token, then a good call, then a validation error. */
  Dipaco__V1__ListJobsRequest lj = DIPACO__V1__LIST_JOBS_REQUEST__INIT;
  lj.limit = 3;
  lj.after_job_id = 40;
  ProtobufCMessage *pm;
  rc = rpc_unary(cli, "/dipaco.v1.Admin/ListJobs", &lj.base,
                 &dipaco__v1__list_jobs_response__descriptor, &pm, 5000);
  CHECK_EQ_INT(rc, DPC_EAUTH);
  CHECK_EQ_INT(rpc_last_code(), RPC_UNAUTHENTICATED);
  CHECK(strstr(dpc_errmsg(), "dipaco-session") != NULL);
  CHECK_EQ_INT(rpc_client_set_md(cli, RPC_MD_SESSION, TOKEN), 0);
  CHECK_EQ_INT(rpc_client_set_md(cli, RPC_MD_WORKER_ID, "17"), 0);
  CHECK_EQ_INT(rpc_client_set_md(cli, "Bad Key", "x"), DPC_EINVAL);
  rc = rpc_unary(cli, "/dipaco.v1.Admin/ListJobs", &lj.base,
                 &dipaco__v1__list_jobs_response__descriptor, &pm, 5000);
  CHECK_EQ_INT(rc, 0);
  if (rc == 0) {
    Dipaco__V1__ListJobsResponse *r = (Dipaco__V1__ListJobsResponse *)pm;
    CHECK_EQ_INT(r->n_jobs, 3);
    if (r->n_jobs == 3) {
      CHECK_EQ_INT(r->jobs[0]->job_id, 41);
      CHECK_EQ_INT(r->jobs[2]->job_id, 43);
      CHECK(strcmp(r->jobs[2]->name, "job-43") == 0);
      CHECK_EQ_INT(r->jobs[1]->state, DIPACO__V1__JOB_STATE__JOB_RUNNING);
    }
    protobuf_c_message_free_unpacked(pm, NULL);
  }
  lj.limit = 1000;
  rc = rpc_unary(cli, "/dipaco.v1.Admin/ListJobs", &lj.base,
                 &dipaco__v1__list_jobs_response__descriptor, &pm, 5000);
  CHECK_EQ_INT(rc, DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "INVALID_ARGUMENT: limit 1000 exceeds 100") != NULL);

  /* Health. */
  CHECK_EQ_INT(health(cli, ""), GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  CHECK_EQ_INT(health(cli, "dipaco.v1.Coordinator"),
               GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  CHECK_EQ_INT(rpc_server_set_health(srv, "dipaco.v1.Coordinator", 0), 0);
  CHECK_EQ_INT(health(cli, "dipaco.v1.Coordinator"),
               GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
  CHECK_EQ_INT(health(cli, "no.such.Service"), DPC_ENOENT);
  CHECK_EQ_INT(rpc_last_code(), RPC_NOT_FOUND);

  /* Unknown method. */
  rc = rpc_unary(cli, "/dipaco.v1.Admin/NoSuchMethod", &lj.base,
                 &dipaco__v1__list_jobs_response__descriptor, &pm, 5000);
  CHECK_EQ_INT(rc, DPC_EUNSUPPORTED);
  CHECK_EQ_INT(rpc_last_code(), RPC_UNIMPLEMENTED);
  CHECK(strstr(dpc_errmsg(), "/dipaco.v1.Admin/NoSuchMethod") != NULL);

  /* Server-streaming pull of 64 MiB in 4 MiB chunks. */
  uint8_t *dst = malloc(FRAG_LEN);
  memset(dst, 0, FRAG_LEN);
  struct rpc_chunk hdr;
  size_t got = 0;
  rc = pull(cli, 1, 0, dst, &hdr, &got);
  CHECK_EQ_INT(rc, 0);
  if (rc) fprintf(stderr, "pull: %s\n", dpc_errmsg());
  CHECK_EQ_INT(got, FRAG_LEN);
  CHECK(memcmp(dst, g_frag, FRAG_LEN) == 0);
  CHECK_EQ_INT(hdr.crc32c, dpc_crc32c(0, g_frag, FRAG_LEN));
  CHECK_EQ_INT(hdr.version, 7);
  CHECK_EQ_INT(hdr.num_floats, FRAG_LEN / 4);
  /* Resume from an odd offset into a buffer that holds the first part. */
  memset(dst + 10 * 1000 * 1000 + 123, 0xab, FRAG_LEN - 10 * 1000 * 1000 - 123);
  rc = pull(cli, 1, 10 * 1000 * 1000 + 123, dst, &hdr, &got);
  CHECK_EQ_INT(rc, 0);
  CHECK(memcmp(dst, g_frag, FRAG_LEN) == 0);
  /* A corrupted stream is caught. */
  rc = pull(cli, 2, 0, dst, &hdr, &got);
  CHECK_EQ_INT(rc, DPC_ECHECKSUM);
  CHECK_EQ_INT(got, FRAG_LEN);
  /* The server saw three calls end normally. */
  CHECK(wait_for(&g_pull_done, 3, 5000));
  CHECK_EQ_INT(atomic_load(&g_pull_cancelled), 0);

  /* Client-streaming push of the same 64 MiB back. */
  struct rpc_chunk ph = {.lease_id = 9, .fragment_id = 1, .version = 7,
                         .payload = DIPACO__V1__PAYLOAD__PAYLOAD_DELTA};
  rc = rpc_push(cli, "/dipaco.v1.Coordinator/PushDelta", &ph, g_frag, FRAG_LEN, CHUNK, 30000,
                &dipaco__v1__push_delta_response__descriptor, &pm);
  CHECK_EQ_INT(rc, 0);
  if (rc) fprintf(stderr, "push: %s\n", dpc_errmsg());
  if (rc == 0) {
    Dipaco__V1__PushDeltaResponse *r = (Dipaco__V1__PushDeltaResponse *)pm;
    CHECK_EQ_INT(r->n_acks, 1);
    if (r->n_acks == 1) {
      CHECK_EQ_INT(r->acks[0]->fragment_id, 1);
      CHECK_EQ_INT(r->acks[0]->version, FRAG_LEN);
    }
    protobuf_c_message_free_unpacked(pm, NULL);
  }
  CHECK(wait_for(&g_push_ok, 1, 5000));
  /* Empty push: one empty chunk, CRC 0. */
  rc = rpc_push(cli, "/dipaco.v1.Coordinator/PushDelta", &ph, NULL, 0, 0, 5000,
                &dipaco__v1__push_delta_response__descriptor, &pm);
  CHECK_EQ_INT(rc, 0);
  if (rc == 0) protobuf_c_message_free_unpacked(pm, NULL);

  /* Deadline: Lease is never answered. */
  struct lease_thread lt = {.cli = cli, .timeout_ms = 200};
  lease_main(&lt);
  CHECK_EQ_INT(lt.rc, DPC_ETIMEDOUT);
  CHECK_EQ_INT(lt.code, RPC_DEADLINE_EXCEEDED);
  CHECK(wait_for(&g_lease_cancelled, 1, 5000)); /* the server's on_done saw it die */
  long long dl = atomic_load(&g_lease_deadline_ms);
  CHECK(dl > 0 && dl <= 200);

  /* Concurrency: 4 threads × 50 unary calls on one client. */
  struct many_thread mt[4];
  for (int i = 0; i < 4; i++) {
    mt[i] = (struct many_thread){.cli = cli, .base = (uint64_t)i * 1000};
    pthread_create(&mt[i].th, NULL, many_main, &mt[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(mt[i].th, NULL);
    CHECK_EQ_INT(mt[i].ok, 50);
  }

  /* Cancellation: an endless stream, cancelled by the client after two chunks. */
  Dipaco__V1__PullFragmentRequest er = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
  er.fragment_id = 3;
  struct rpc_stream *st;
  CHECK_EQ_INT(rpc_stream_open(cli, "/dipaco.v1.Coordinator/PullFragment", &er.base, 0, &st), 0);
  for (int i = 0; i < 2; i++) {
    struct grpc_byte_buffer *bb;
    CHECK_EQ_INT(rpc_stream_read(st, &bb), 1);
    rpc_msg_free(bb);
  }
  rpc_stream_cancel(st);
  struct grpc_byte_buffer *bb;
  CHECK_EQ_INT(rpc_stream_read(st, &bb), DPC_ECANCELED);
  rpc_stream_free(st);
  CHECK(wait_for(&g_pull_cancelled, 1, 5000));

  /* Shutdown with calls in flight: two Lease calls held by the server and a push stream
   * whose reading is paused. */
  struct lease_thread lt2[2] = {{.cli = cli, .timeout_ms = 0}, {.cli = cli, .timeout_ms = 0}};
  int held_before = atomic_load(&g_lease_held);
  for (int i = 0; i < 2; i++) pthread_create(&lt2[i].th, NULL, lease_main, &lt2[i]);
  struct rpc_stream *ps;
  CHECK_EQ_INT(rpc_stream_open(cli, "/dipaco.v1.Coordinator/PushDelta", NULL, 0, &ps), 0);
  struct rpc_chunk hold = {.fragment_id = 9, .total = 2 * CHUNK, .len = CHUNK};
  CHECK_EQ_INT(rpc_stream_write(ps, rpc_chunk_encode(&hold, g_frag, NULL, NULL)), 0);
  CHECK(wait_for(&g_lease_held, held_before + 2, 5000));
  CHECK(wait_for(&g_push_paused, 1, 5000));
  int lease_done_before = atomic_load(&g_lease_done);
  int push_done_before = atomic_load(&g_push_done);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (dispatch_mode) {
    pthread_mutex_lock(&o.mu);
    o.stop = 1;
    pthread_cond_signal(&o.cv);
    pthread_mutex_unlock(&o.mu);
    pthread_join(o.th, NULL);
  } else {
    rpc_server_stop(srv, 300);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double stop_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  fprintf(stderr, "stop with calls in flight took %.3f s\n", stop_s);
  CHECK(stop_s >= 0.25 && stop_s < 5.0);
  for (int i = 0; i < 2; i++) {
    pthread_join(lt2[i].th, NULL);
    CHECK(lt2[i].rc == DPC_EUNAVAILABLE || lt2[i].rc == DPC_ECANCELED);
  }
  CHECK_EQ_INT(atomic_load(&g_lease_done), lease_done_before + 2);
  CHECK_EQ_INT(atomic_load(&g_push_done), push_done_before + 1);
  rc = rpc_stream_finish(ps, &dipaco__v1__push_delta_response__descriptor, &pm);
  CHECK(rc == DPC_EUNAVAILABLE || rc == DPC_ECANCELED);
  rpc_stream_free(ps);
  /* Every zero-copy chunk the server sent has been released by gRPC. */
  CHECK_EQ_INT(atomic_load(&g_zc_out), 0);
  /* A call to the stopped server fails cleanly. */
  rc = rpc_unary(cli, "/dipaco.v1.Admin/ListJobs", &lj.base,
                 &dipaco__v1__list_jobs_response__descriptor, &pm, 1000);
  CHECK(rc == DPC_EUNAVAILABLE || rc == DPC_ETIMEDOUT);
  if (dispatch_mode) CHECK(o.dispatched > 0);
  rpc_client_close(cli);
  free(dst);
  pthread_mutex_destroy(&o.mu);
  pthread_cond_destroy(&o.cv);
}

int main(void) {
  /* Block the signals before gRPC starts its threads (so that they inherit the mask); SIGPIPE too. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  g_frag = malloc(FRAG_LEN);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < FRAG_LEN; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(g_frag + i, &x, 8);
  }
  grpc_init(); /* keeps the library up between the suites (and for the codec test) */
  test_chunk_codec();
  run_suite(0);
  run_suite(1);
  grpc_shutdown();
  free(g_frag);
  TEST_DONE();
}
