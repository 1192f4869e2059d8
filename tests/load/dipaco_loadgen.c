/* dipaco_loadgen.c — load generator: N lightweight simulated workers against one coordinator,
 * speaking the real dipaco.v1.Coordinator protocol (common/rpc.h) with tiny fragments.
 *
 * usage: dipaco_loadgen --coordinator ADDR --job ID --workers N --rounds R
 *          [--threads T (default 16)] [--timeout-s S (default 600)]
 *          [--token-file FILE] [--admin-token-file FILE]
 * Tokens: the join token from --token-file or $DIPACO_JOIN_TOKEN; the admin token (for the
 * final ledger check) from --admin-token-file or $DIPACO_ADMIN_TOKEN.
 *
 * The job must be a sync DiLoCo job with replicas = N and rounds = R. T threads each own one
 * channel and drive workers t, t+T, t+2T, ... round-robin until each hears LEASE_NO_WORK: per
 * step a timed Heartbeat (idle) and a Lease (short long-poll); when granted, PullFragment of
 * every fragment (CRC checked by rpc_pull), a timed Heartbeat on the lease, and PushDelta of a
 * tiny random finite delta (retried on transient errors: a retry may only answer DUPLICATE or
 * ACCEPTED). Which slot a worker gets is the coordinator's choice. Per push the tokens field
 * carries a unique tag (round · 10^6 + replica + 1) so that the coordinator's ledger can be
 * checked independently at the end: Admin GetMetrics "tokens" must hold exactly one row per
 * (round, replica) slot, GetJob must say DONE with round = R.
 * Prints the figures (heartbeat p50/p99, deltas/s, wall time) and one line "LOAD OK" or
 * "LOAD FAILED: ..."; exits 0 only when no delta was lost or doubled. */
#include "common/auth.h"
#include "common/errors.h"
#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SVC "/dipaco.v1.Coordinator/"
#define ADM "/dipaco.v1.Admin/"
#define MAX_FLOATS (1u << 20)
#define MAX_FRAGS 64
#define TAG_ROUND 1000000ull

struct sim {
  uint64_t id;
  char session[160];
  int done; /* heard LEASE_NO_WORK */
};

static struct {
  const char *target;
  uint64_t job;
  int n, rounds, threads;
  double deadline, t0;
  char bearer[DPC_TOKEN_MAX + 8];
  struct sim *w;
  atomic_int failed;
  atomic_long pushed, accepted, duplicate, retries;
  char why[256];
  pthread_mutex_t mu;
} G;

struct thr {
  int t;
  double *hb; /* heartbeat latencies, ms */
  double max_ms, max_at; /* the slowest heartbeat and when it started (s since start) */
  size_t nhb, cap;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fail(const char *what, const char *detail, int worker) {
  pthread_mutex_lock(&G.mu);
  if (!atomic_load(&G.failed)) snprintf(G.why, sizeof G.why, "%s%s (worker %d)", what, detail, worker);
  atomic_store(&G.failed, 1);
  pthread_mutex_unlock(&G.mu);
}

static int set_identity(struct rpc_client *c, const struct sim *s) {
  char id[32];
  snprintf(id, sizeof id, "%" PRIu64, s->id);
  int rc = rpc_client_set_md(c, RPC_MD_WORKER_ID, id);
  return rc ? rc : rpc_client_set_md(c, RPC_MD_SESSION, s->session);
}

static int do_register(struct rpc_client *c, struct sim *s, int idx) {
  Dipaco__V1__RegisterRequest req = DIPACO__V1__REGISTER_REQUEST__INIT;
  char host[32];
  snprintf(host, sizeof host, "sim-%d", idx);
  req.hostname = host;
  req.backend = "cpu";
  req.version = "loadgen";
  req.threads = 1;
  rpc_client_set_md(c, RPC_MD_WORKER_ID, NULL);
  rpc_client_set_md(c, RPC_MD_SESSION, NULL);
  if (G.bearer[0]) rpc_client_set_md(c, RPC_MD_AUTHORIZATION, G.bearer);
  ProtobufCMessage *pm = NULL;
  int rc = rpc_unary(c, SVC "Register", &req.base, &dipaco__v1__register_response__descriptor, &pm, 30000);
  rpc_client_set_md(c, RPC_MD_AUTHORIZATION, NULL);
  if (rc) return rc;
  Dipaco__V1__RegisterResponse *r = (Dipaco__V1__RegisterResponse *)pm;
  size_t tl = r->session_token ? strlen(r->session_token) : 0;
  if (!r->worker_id || !tl || tl >= sizeof s->session) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return dpc_err(DPC_EFORMAT, "Register: bad reply (worker id %" PRIu64 ", token %zu bytes)", r->worker_id, tl);
  }
  s->id = r->worker_id;
  memcpy(s->session, r->session_token, tl + 1);
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

static int heartbeat(struct rpc_client *c, struct thr *th, uint64_t lease, uint64_t step) {
  Dipaco__V1__HeartbeatRequest req = DIPACO__V1__HEARTBEAT_REQUEST__INIT;
  req.lease_id = lease;
  req.step = step;
  req.loss = 1.0f;
  req.steps_per_sec = 1.0f;
  ProtobufCMessage *pm = NULL;
  double t0 = now_s();
  int rc = rpc_unary(c, SVC "Heartbeat", &req.base, &dipaco__v1__heartbeat_response__descriptor, &pm, 30000);
  double ms = (now_s() - t0) * 1e3;
  if (rc) return rc;
  if (ms > th->max_ms) {
    th->max_ms = ms;
    th->max_at = t0 - G.t0;
  }
  Dipaco__V1__HeartbeatResponse *r = (Dipaco__V1__HeartbeatResponse *)pm;
  int cmd = r->command;
  protobuf_c_message_free_unpacked(pm, NULL);
  if (cmd != DIPACO__V1__COMMAND__COMMAND_CONTINUE)
    return dpc_err(DPC_ESTATE, "Heartbeat (lease %" PRIu64 "): command %d, expected CONTINUE", lease, cmd);
  if (th->nhb == th->cap) {
    size_t nc = th->cap ? th->cap * 2 : 1024;
    double *a = realloc(th->hb, nc * sizeof *a);
    if (!a) return DPC_ENOMEM;
    th->hb = a;
    th->cap = nc;
  }
  th->hb[th->nhb++] = ms;
  return 0;
}

/* One step of one simulated worker: a timed idle Heartbeat and a Lease; when granted, pull,
 * heartbeat on the lease and push. Returns 1 after a push, 0 when no slot is free now
 * (LEASE_WAIT), 2 when no job needs work (LEASE_NO_WORK), or a negative DPC_E* code. */
static int sim_step(struct rpc_client *c, struct thr *th, int idx, float *buf, unsigned *seed) {
  int rc;
  if ((rc = heartbeat(c, th, 0, 0))) return rc;
  Dipaco__V1__LeaseResponse *lr = NULL;
  {
    Dipaco__V1__LeaseRequest req = DIPACO__V1__LEASE_REQUEST__INIT;
    req.max_wait_ms = 0;
    req.job_id = G.job;
    ProtobufCMessage *pm = NULL;
    if ((rc = rpc_unary(c, SVC "Lease", &req.base, &dipaco__v1__lease_response__descriptor, &pm, 30000))) return rc;
    lr = (Dipaco__V1__LeaseResponse *)pm;
    if (lr->outcome != DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED || !lr->lease) {
      int outcome = lr->outcome;
      protobuf_c_message_free_unpacked(pm, NULL);
      if (outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_WAIT) return 0;
      if (outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_NO_WORK) return 2;
      return dpc_err(DPC_EFORMAT, "Lease: outcome %d without a lease", outcome);
    }
  }
  Dipaco__V1__Lease *L = lr->lease;
  uint64_t replica = L->slot ? L->slot->replica : UINT64_MAX;
  int round = (int)(L->round < (uint64_t)G.rounds ? L->round : 0);
  if (L->job_id != G.job || L->round >= (uint64_t)G.rounds || replica >= (uint64_t)G.n || L->n_fragments == 0 ||
      L->n_fragments > MAX_FRAGS) {
    rc = dpc_err(DPC_ESTATE, "Lease: worker %d got job %" PRIu64 " round %" PRIu64 " replica %" PRIu64 " with %zu "
                 "fragments (job %" PRIu64 ", %d rounds, %d replicas expected)", idx, L->job_id, L->round, replica,
                 L->n_fragments, G.job, G.rounds, G.n);
    goto out;
  }
  uint64_t lease = L->lease_id;
  size_t off[MAX_FRAGS + 1];
  off[0] = 0;
  for (size_t f = 0; f < L->n_fragments; f++) {
    uint64_t nf = L->fragments[f]->num_floats;
    if (nf == 0 || nf > MAX_FLOATS || off[f] + nf > MAX_FLOATS) {
      rc = dpc_err(DPC_ERANGE, "Lease: fragment of %" PRIu64 " floats exceeds the tool's bound", nf);
      goto out;
    }
    off[f + 1] = off[f] + nf;
    Dipaco__V1__PullFragmentRequest pr = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
    pr.lease_id = lease;
    pr.fragment_id = L->fragments[f]->fragment_id;
    pr.version = L->fragments[f]->version;
    pr.codec = DIPACO__V1__CODEC__CODEC_FP32;
    struct rpc_chunk h;
    memset(&h, 0, sizeof h);
    if ((rc = rpc_pull(c, SVC "PullFragment", &pr.base, 30000, 0, buf + off[f], nf * sizeof(float), &h, NULL))) goto out;
    if (h.total != nf * sizeof(float) || h.version != pr.version ||
        (L->fragments[f]->crc32c && h.crc32c != L->fragments[f]->crc32c)) {
      rc = dpc_err(DPC_EFORMAT, "PullFragment: stream disagrees with the lease (total %" PRIu64 ")", h.total);
      goto out;
    }
  }
  if ((rc = heartbeat(c, th, lease, L->first_step + L->inner_steps))) goto out;
  /* The delta: tiny finite values (replacing the pulled params in buf). */
  for (size_t i = 0; i < off[L->n_fragments]; i++) buf[i] = ((float)rand_r(seed) / (float)RAND_MAX - 0.5f) * 1e-4f;
  uint64_t tag = (uint64_t)round * TAG_ROUND + replica + 1;
  for (int attempt = 0;; attempt++) {
    struct rpc_stream *s = NULL;
    if ((rc = rpc_stream_open(c, SVC "PushDelta", NULL, 30000, &s))) goto out;
    for (size_t f = 0; f < L->n_fragments && !rc; f++) {
      struct rpc_chunk h;
      memset(&h, 0, sizeof h);
      h.lease_id = lease;
      h.fragment_id = L->fragments[f]->fragment_id;
      h.version = L->fragments[f]->version;
      h.codec = DIPACO__V1__CODEC__CODEC_FP32;
      h.num_floats = L->fragments[f]->num_floats;
      h.inner_steps = L->inner_steps;
      h.tokens = tag;
      h.payload = DIPACO__V1__PAYLOAD__PAYLOAD_DELTA;
      rc = rpc_stream_write_chunks(s, &h, buf + off[f], h.num_floats * sizeof(float), 0);
    }
    ProtobufCMessage *pm = NULL;
    int frc = rpc_stream_finish(s, &dipaco__v1__push_delta_response__descriptor, &pm);
    int code = rpc_last_code();
    rpc_stream_free(s);
    if (!frc && rc && pm) {
      protobuf_c_message_free_unpacked(pm, NULL);
      pm = NULL;
    }
    if (frc || rc) {
      int transient = code == RPC_UNAVAILABLE || code == RPC_DEADLINE_EXCEEDED || code == RPC_CANCELLED || !frc;
      if (transient && attempt < 3) {
        atomic_fetch_add(&G.retries, 1);
        continue;
      }
      rc = frc ? frc : rc;
      goto out;
    }
    atomic_fetch_add(&G.pushed, (long)L->n_fragments);
    Dipaco__V1__PushDeltaResponse *r = (Dipaco__V1__PushDeltaResponse *)pm;
    for (size_t f = 0; f < L->n_fragments && !rc; f++) {
      int res = -1;
      for (size_t a = 0; a < r->n_acks; a++)
        if (r->acks[a]->fragment_id == L->fragments[f]->fragment_id) res = r->acks[a]->result;
      if (res == DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED && attempt == 0) atomic_fetch_add(&G.accepted, 1);
      else if ((res == DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE || res == DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED) &&
               attempt > 0)
        atomic_fetch_add(res == DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE ? &G.duplicate : &G.accepted, 1);
      else
        rc = dpc_err(DPC_ESTATE, "PushDelta: worker %d round %d fragment %" PRIu64 ": ack %d (attempt %d), expected "
                     "ACCEPTED", idx, round, L->fragments[f]->fragment_id, res, attempt + 1);
    }
    protobuf_c_message_free_unpacked(pm, NULL);
    break;
  }
out:
  protobuf_c_message_free_unpacked(&lr->base, NULL);
  return rc ? rc : 1;
}

static void *thread_main(void *ud) {
  struct thr *th = ud;
  struct rpc_client_config cfg = {.target = G.target, .own_connection = 1};
  struct rpc_client *c = NULL;
  float *buf = NULL;
  unsigned seed = 12345u + (unsigned)th->t;
  char msg[200];
  if (rpc_client_open(&cfg, &c)) {
    snprintf(msg, sizeof msg, "%s", dpc_errmsg());
    fail("open: ", msg, -1);
    return NULL;
  }
  if (!(buf = malloc((size_t)MAX_FLOATS * sizeof(float)))) {
    fail("out of memory", "", -1);
    goto out;
  }
  for (int i = th->t; i < G.n && !atomic_load(&G.failed); i += G.threads)
    if (do_register(c, &G.w[i], i)) {
      snprintf(msg, sizeof msg, "%s", dpc_errmsg());
      fail("Register: ", msg, i);
    }
  /* Round-robin over this thread's workers until every one of them hears LEASE_NO_WORK. A
   * LEASE_WAIT (the round's slots are all taken; it closes when the last delta is in) ends the
   * pass: pause briefly and go on with the next worker (never retry the same one: a slot may
   * be reserved for a worker further on). */
  int m = (G.n - th->t + G.threads - 1) / G.threads, left = m, cur = 0;
  while (left > 0 && !atomic_load(&G.failed)) {
    for (int k = 0; k < m && left > 0 && !atomic_load(&G.failed); k++) {
      int i = th->t + cur * G.threads;
      cur = (cur + 1) % m;
      if (G.w[i].done) continue;
      int rc = set_identity(c, &G.w[i]);
      if (!rc) rc = sim_step(c, th, i, buf, &seed);
      if (rc < 0) {
        snprintf(msg, sizeof msg, "%s", dpc_errmsg());
        fail("", msg, i);
      } else if (rc == 2) {
        G.w[i].done = 1;
        left--;
      } else if (rc == 0) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        break;
      }
    }
    if (now_s() > G.deadline) fail("timed out: the job did not finish within --timeout-s", "", -1);
  }
out:
  free(buf);
  rpc_client_close(c);
  return NULL;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The coordinator's view: GetJob DONE with round = R (waits up to 60 s), and one "tokens"
 * metric row per (round, worker) with exactly the tags pushed. Returns 0 or sets G.why. */
static int check_ledger(const char *admin_bearer) {
  struct rpc_client_config cfg = {.target = G.target};
  struct rpc_client *c = NULL;
  char msg[200];
  int rc = rpc_client_open(&cfg, &c);
  if (!rc && admin_bearer[0]) rc = rpc_client_set_md(c, RPC_MD_AUTHORIZATION, admin_bearer);
  if (rc) goto err;
  int state = 0;
  uint64_t round = 0;
  for (int i = 0; i < 600; i++) {
    Dipaco__V1__JobRequest req = DIPACO__V1__JOB_REQUEST__INIT;
    req.job_id = G.job;
    ProtobufCMessage *pm = NULL;
    if ((rc = rpc_unary(c, ADM "GetJob", &req.base, &dipaco__v1__job__descriptor, &pm, 10000))) goto err;
    Dipaco__V1__Job *j = (Dipaco__V1__Job *)pm;
    state = j->summary ? j->summary->state : 0;
    round = j->summary ? j->summary->round : 0;
    protobuf_c_message_free_unpacked(pm, NULL);
    if (state == DIPACO__V1__JOB_STATE__JOB_DONE) break;
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  printf("coordinator: job %" PRIu64 " state %d (DONE = %d), round %" PRIu64 "\n", G.job, state,
         DIPACO__V1__JOB_STATE__JOB_DONE, round);
  if (state != DIPACO__V1__JOB_STATE__JOB_DONE || round != (uint64_t)G.rounds) {
    snprintf(G.why, sizeof G.why, "job %" PRIu64 " state %d round %" PRIu64 ", expected DONE with round %d", G.job,
             state, round, G.rounds);
    rpc_client_close(c);
    return -1;
  }
  Dipaco__V1__GetMetricsRequest mr = DIPACO__V1__GET_METRICS_REQUEST__INIT;
  char *names[2] = {"tokens", "outer_seconds"};
  mr.job_id = G.job;
  mr.names = names;
  mr.n_names = 2;
  mr.limit = 100000;
  ProtobufCMessage *pm = NULL;
  if ((rc = rpc_unary(c, ADM "GetMetrics", &mr.base, &dipaco__v1__get_metrics_response__descriptor, &pm, 30000)))
    goto err;
  Dipaco__V1__GetMetricsResponse *m = (Dipaco__V1__GetMetricsResponse *)pm;
  size_t want = (size_t)G.n * (size_t)G.rounds, got = 0;
  uint64_t *tags = calloc(m->n_points + 1, sizeof *tags);
  int bad = 0, nouter = 0;
  double outer_max = 0, outer_sum = 0;
  for (size_t i = 0; i < m->n_points && tags; i++) {
    const Dipaco__V1__MetricPoint *p = m->points[i];
    if (p->name && !strcmp(p->name, "outer_seconds")) {
      nouter++;
      outer_sum += p->value;
      if (p->value > outer_max) outer_max = p->value;
      continue;
    }
    if (!p->name || strcmp(p->name, "tokens")) continue;
    uint64_t t = (uint64_t)llround(p->value);
    tags[got++] = t;
    if (t / TAG_ROUND != p->round || t % TAG_ROUND == 0 || t % TAG_ROUND > (uint64_t)G.n) bad = 1;
  }
  if (nouter) printf("coordinator outer steps: %d, mean %.3f s, max %.3f s\n", nouter, outer_sum / nouter, outer_max);
  protobuf_c_message_free_unpacked(pm, NULL);
  if (!tags) {
    rpc_client_close(c);
    snprintf(G.why, sizeof G.why, "out of memory");
    return -1;
  }
  qsort(tags, got, sizeof *tags, cmp_u64);
  size_t dup = 0;
  for (size_t i = 1; i < got; i++) dup += tags[i] == tags[i - 1];
  free(tags);
  printf("coordinator ledger: %zu delta rows (expected %zu), %zu doubled, %s\n", got, want, dup,
         bad ? "SOME TAGS WRONG" : "tags match their rounds");
  rpc_client_close(c);
  if (got != want || dup || bad) {
    snprintf(G.why, sizeof G.why, "ledger has %zu rows (%zu doubled%s), expected %zu", got, dup,
             bad ? ", some with a wrong round tag" : "", want);
    return -1;
  }
  return 0;
err:
  snprintf(msg, sizeof msg, "%s", dpc_errmsg());
  snprintf(G.why, sizeof G.why, "ledger check: %s", msg);
  rpc_client_close(c);
  return -1;
}

static int load_token(const char *file, const char *env, char *bearer, size_t cap) {
  char tok[DPC_TOKEN_MAX + 1];
  if (file) {
    if (dpc_token_read_file(file, tok, sizeof tok)) return -1;
  } else if (getenv(env) && *getenv(env)) {
    snprintf(tok, sizeof tok, "%s", getenv(env));
  } else {
    bearer[0] = 0;
    return 0;
  }
  snprintf(bearer, cap, "Bearer %s", tok);
  return 0;
}

int main(int argc, char **argv) {
  const char *token_file = NULL, *admin_file = NULL;
  double timeout_s = 600;
  G.threads = 16;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "dipaco_loadgen: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--coordinator")) G.target = v;
    else if (!strcmp(a, "--job")) G.job = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--workers")) G.n = atoi(v);
    else if (!strcmp(a, "--rounds")) G.rounds = atoi(v);
    else if (!strcmp(a, "--threads")) G.threads = atoi(v);
    else if (!strcmp(a, "--timeout-s")) timeout_s = atof(v);
    else if (!strcmp(a, "--token-file")) token_file = v;
    else if (!strcmp(a, "--admin-token-file")) admin_file = v;
    else {
      fprintf(stderr, "dipaco_loadgen: unknown flag %s\n", a);
      return 2;
    }
    i++;
  }
  if (!G.target || !G.job || G.n < 1 || G.n > 100000 || G.rounds < 1 || G.rounds > 1000 || G.threads < 1 ||
      G.threads > 256) {
    fprintf(stderr, "usage: dipaco_loadgen --coordinator ADDR --job ID --workers N(1..100000) --rounds R(1..1000) "
                    "[--threads T(1..256)] [--timeout-s S] [--token-file F] [--admin-token-file F]\n");
    return 2;
  }
  if (G.threads > G.n) G.threads = G.n;
  char admin[DPC_TOKEN_MAX + 8];
  if (load_token(token_file, "DIPACO_JOIN_TOKEN", G.bearer, sizeof G.bearer) ||
      load_token(admin_file, "DIPACO_ADMIN_TOKEN", admin, sizeof admin)) {
    fprintf(stderr, "dipaco_loadgen: %s\n", dpc_errmsg());
    return 2;
  }
  pthread_mutex_init(&G.mu, NULL);
  G.w = calloc((size_t)G.n, sizeof *G.w);
  struct thr *th = calloc((size_t)G.threads, sizeof *th);
  pthread_t *tid = calloc((size_t)G.threads, sizeof *tid);
  if (!G.w || !th || !tid) return 1;
  double t0 = now_s();
  G.deadline = t0 + timeout_s;
  G.t0 = t0;
  int started = 0;
  for (int t = 0; t < G.threads; t++) {
    th[t].t = t;
    if (pthread_create(&tid[t], NULL, thread_main, &th[t])) {
      fail("pthread_create failed", "", -1);
      break;
    }
    started++;
  }
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  double wall = now_s() - t0;
  size_t nhb = 0;
  for (int t = 0; t < G.threads; t++) nhb += th[t].nhb;
  double *hb = malloc((nhb + 1) * sizeof *hb);
  size_t k = 0;
  for (int t = 0; t < G.threads; t++) {
    if (hb && th[t].nhb) memcpy(hb + k, th[t].hb, th[t].nhb * sizeof *hb);
    k += th[t].nhb;
    free(th[t].hb);
  }
  double p50 = 0, p99 = 0, mx = 0, mx_at = 0;
  for (int t = 0; t < G.threads; t++)
    if (th[t].max_ms >= mx) {
      mx = th[t].max_ms;
      mx_at = th[t].max_at;
    }
  if (hb && nhb) {
    qsort(hb, nhb, sizeof *hb, cmp_d);
    p50 = hb[(nhb - 1) / 2];
    p99 = hb[(size_t)((double)(nhb - 1) * 0.99)];
  }
  free(hb);
  long acc = atomic_load(&G.accepted), dup = atomic_load(&G.duplicate);
  printf("workers %d, threads %d, rounds %d, wall %.2f s\n", G.n, G.threads, G.rounds, wall);
  printf("heartbeat latency: %zu calls, p50 %.2f ms, p99 %.2f ms, max %.2f ms (sent at t = %.2f s)\n", nhb, p50, p99,
         mx, mx_at);
  printf("deltas: %ld pushed, %ld accepted, %ld duplicate (retries %ld), %.1f deltas/s\n", atomic_load(&G.pushed), acc,
         dup, atomic_load(&G.retries), (double)(acc + dup) / wall);
  int ok = !atomic_load(&G.failed) && acc + dup == (long)G.n * G.rounds;
  if (ok) ok = check_ledger(admin) == 0;
  else if (!G.why[0]) snprintf(G.why, sizeof G.why, "%ld deltas acknowledged, expected %ld", acc + dup, (long)G.n * G.rounds);
  if (ok) printf("LOAD OK: no delta lost or doubled\n");
  else printf("LOAD FAILED: %s\n", G.why);
  free(G.w);
  free(th);
  free(tid);
  return ok ? 0 : 1;
}
