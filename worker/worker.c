/* worker.c — the dipaco-worker lease loop (see worker.h).
 *
 * Protocol assumptions, where proto/dipaco.proto leaves a choice open (to reconcile with
 * coordinator/service.c):
 *  - Identity: after Register, every call carries dipaco-worker-id / dipaco-session. A
 *    re-registration (UNAUTHENTICATED, or COMMAND_REREGISTER) sends previous_worker_id /
 *    previous_session.
 *  - Lease: long-poll with max_wait_ms = 5000 (job_id 0 = any job). LEASE_WAIT: ask again
 *    after wait_ms (clamped to [10 ms, 30 s]). LEASE_NO_WORK: ask again after wait_ms (2 s
 *    when 0), or exit 0 with --exit-when-done once some job was seen running (a lease was
 *    granted or LEASE_WAIT answered): a worker started before any job exists waits for one.
 *  - Placement: a lease lists every fragment of the path; a path's modules, one per level,
 *    concatenated level 0 first, are the canonical layout. FragmentInfo.offset_floats is read
 *    as relative to its module (the proto's wording) or, when that does not tile the path, as
 *    the offset in the whole canonical layout (coordinator/service.c's reading); the two
 *    readings coincide for plain DiLoCo and cannot both fit otherwise.
 *  - Pull: PullFragment(lease_id, fragment_id, version = the lease's base version,
 *    latest = false, codec fp32); the served version, size and (when non-zero) the lease's
 *    crc32c must match. Transient failures resume from the last byte received.
 *  - Train: steps first_step .. first_step + inner_steps − 1; the data batch of step s is s
 *    (DataWindow.first_batch must equal first_step); LR schedule over hyper.total_steps.
 *    Unsupported and refused with Release(RELEASE_ERROR): grad_accum > 1, shuffle,
 *    path_index (DiPaCo routing), streaming fragments, delta codecs other than fp32.
 *  - Inner state: KEEP keeps AdamW moments per (job, slot) in this worker (fresh state, with a
 *    warning, for a slot it never trained; stale state, with a warning, when another worker
 *    trained the slot in between); a lease that is abandoned restores the state it started
 *    with. RESET starts every lease fresh. CHECKPOINT: after training, the AdamW state of
 *    every fragment (m, v, step) goes up with PushInnerState BEFORE the delta is pushed (so a
 *    finished round always has its state durable); a lease with has_inner_checkpoint pulls
 *    the slot's state of the previous round (PullInnerState) and resumes it exactly, whoever
 *    trained the slot; without one it behaves as KEEP.
 *  - Push: one PushDelta stream carrying every fragment (Chunk: lease_id, fragment_id,
 *    version = base version, inner_steps, tokens = B·T·steps, payload DELTA, crc32c of the
 *    fp32 bytes). PUSH_ACCEPTED / PUSH_DUPLICATE are success; PUSH_LATE / PUSH_STALE are
 *    logged and dropped. After the push the worker sends Release(RELEASE_DONE, step) and
 *    ignores its errors: the coordinator may equally end the lease on a complete push.
 *  - Steps on the wire: HeartbeatRequest.step and ReleaseRequest.step are the global step
 *    the slot has reached, first_step + inner steps done (one past the last completed step,
 *    so that "nothing done" is first_step rather than first_step − 1).
 *  - Heartbeat: a thread sends HeartbeatRequest(lease_id, step = global step reached,
 *    steps_per_sec EWMA, loss, tokens) every heartbeat_interval_ms during a lease (pull,
 *    train and push), and an idle one (lease_id 0) before a Lease call when a heartbeat
 *    interval has passed since the last one. COMMAND_STOP: stop the lease now, push nothing,
 *    Release(RELEASE_PREEMPTED, "stopped by the coordinator") and keep leasing (the proto
 *    calls it a lease-level command; the coordinator drains a worker with COMMAND_DRAIN,
 *    which may also answer an idle heartbeat). COMMAND_DRAIN: finish the round, push, then
 *    exit 0. COMMAND_REREGISTER: drop the lease, register again.
 *  - Errors: UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED / DATA_LOSS are retried with
 *    jittered exponential backoff (100 ms doubling, cap 5 s; from the second UNAVAILABLE on
 *    the retry uses a fresh channel, see wc_reconnect; a pull or push gives up after 10
 *    tries and the worker registers again). UNAUTHENTICATED re-registers. ABORTED /
 *    NOT_FOUND on a lease call, any refused heartbeat, or no heartbeat getting through for
 *    lease_ttl_ms drop the lease without Release. Any other failure of a lease (bad lease,
 *    missing data, refused push) releases it with RELEASE_ERROR and the error message.
 *  - SIGTERM (worker_stop): training stops after the current step. Sync: the lease is
 *    released with RELEASE_PREEMPTED (no partial delta: a sync round averages whole rounds).
 *    Async (Lease.algorithm not SYNC): the delta of the inner steps completed so far is pushed
 *    (Chunk.inner_steps = those steps; the coordinator counts the lease as that many steps), as
 *    is the inner state first with inner.state checkpoint. A round already trained is pushed
 *    in both modes; pushes go on being retried on transient errors while stopping (the grace
 *    period of main.c bounds them). A Lease long-poll in flight is cancelled at once.
 *    worker_run then returns 0. */
#include "worker/worker.h"
#include "common/errors.h"
#include "common/log.h"
#include "worker/client.h"
#include "worker/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define TRANSFER_ATTEMPTS 10
#define MAX_FRAGMENTS 4096
#define MAX_SLOT_STATES 16
#define MAX_DATA_FILES 4096

/* ------------------------------------------------------------------ time, stop control */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct worker_ctl {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  atomic_int stop;
};

int worker_ctl_create(worker_ctl **out) {
  worker_ctl *c = calloc(1, sizeof *c);
  if (!c) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  *out = c;
  return 0;
}

void worker_ctl_free(worker_ctl *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

void worker_stop(worker_ctl *c) {
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->stop, 1);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int worker_stopping(worker_ctl *c) { return atomic_load(&c->stop); }

static void abs_deadline(struct timespec *ts, int64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Sleep ms, not woken by stop (a retry that must go on while stopping). */
static void plain_sleep(int64_t ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int stop_requested(void *ud) { return worker_stopping(ud); }

/* Sleep ms, waking early on stop; returns 1 if stopping. */
static int ctl_sleep(worker_ctl *c, int64_t ms) {
  struct timespec ts;
  abs_deadline(&ts, ms);
  pthread_mutex_lock(&c->mu);
  while (!atomic_load(&c->stop))
    if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0) break;
  pthread_mutex_unlock(&c->mu);
  return atomic_load(&c->stop);
}

/* Jittered exponential backoff: the n-th consecutive failure waits about 100·2^n ms, capped
 * at 5 s, uniformly jittered in [½, 1] of that. */
static int64_t backoff_ms(int n, unsigned *seed) {
  int64_t ms = BACKOFF_MIN_MS;
  for (int i = 0; i < n && ms < BACKOFF_MAX_MS; i++) ms *= 2;
  if (ms > BACKOFF_MAX_MS) ms = BACKOFF_MAX_MS;
  return ms / 2 + (int64_t)(rand_r(seed) % (unsigned)(ms / 2 + 1));
}

/* ------------------------------------------------------------------------ data files */

void worker_free_paths(char **paths, int n) {
  if (!paths) return;
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

static int check_rel(const char *p) {
  if (!p[0]) return dpc_err(DPC_EINVAL, "job data: empty path");
  if (strlen(p) > 1024) return dpc_err(DPC_EINVAL, "job data: path longer than 1024 bytes");
  if (p[0] == '/') return dpc_err(DPC_EINVAL, "job data \"%s\": absolute paths are refused (paths are relative "
                                  "to --data-dir)", p);
  for (const char *s = p; *s; s++) {
    if ((unsigned char)*s < 0x20)
      return dpc_err(DPC_EINVAL, "job data \"%s\": control character in the path", p);
    if ((s == p || s[-1] == '/') && s[0] == '.' && s[1] == '.' && (s[2] == '/' || s[2] == 0))
      return dpc_err(DPC_EINVAL, "job data \"%s\": \"..\" may not leave --data-dir", p);
  }
  return 0;
}

static int add_matches(const char *data_dir, const char *pat, char ***paths, int *n) {
  int rc = check_rel(pat);
  if (rc) return rc;
  size_t L = strlen(data_dir) + strlen(pat) + 2;
  char *full = malloc(L);
  if (!full) return dpc_err(DPC_ENOMEM, "job data: out of memory");
  snprintf(full, L, "%s/%s", data_dir, pat);
  glob_t g;
  memset(&g, 0, sizeof g);
  int grc = glob(full, 0, NULL, &g); /* results come sorted; unreadable dirs match nothing */
  if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
    rc = dpc_err(DPC_ENOENT, "job data \"%s\": matches no file under --data-dir %s (looked for %s)", pat, data_dir,
                 full);
  } else if (grc != 0) {
    rc = dpc_err(DPC_EIO, "job data \"%s\": cannot read %s (glob error %d)", pat, full, grc);
  } else if (*n + (long)g.gl_pathc > MAX_DATA_FILES) {
    rc = dpc_err(DPC_ERANGE, "job data: more than %d files", MAX_DATA_FILES);
  } else {
    char **np = realloc(*paths, (size_t)(*n + (int)g.gl_pathc) * sizeof *np);
    if (!np) rc = dpc_err(DPC_ENOMEM, "job data: out of memory");
    else {
      *paths = np;
      for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
        if (!(np[*n] = strdup(g.gl_pathv[i]))) rc = dpc_err(DPC_ENOMEM, "job data: out of memory");
        else (*n)++;
      }
    }
  }
  globfree(&g);
  free(full);
  return rc;
}

int worker_resolve_data(const char *data_dir, const char *spec_json, const char *fallback, char ***paths,
                        int *n) {
  *paths = NULL;
  *n = 0;
  int rc = 0, found = 0;
  cJSON *root = spec_json && spec_json[0] ? cJSON_Parse(spec_json) : NULL;
  if (spec_json && spec_json[0] && !root) return dpc_err(DPC_EFORMAT, "lease spec_json is not valid JSON");
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
  const cJSON *train = cJSON_GetObjectItemCaseSensitive(data, "train");
  if (train) {
    if (!cJSON_IsArray(train)) rc = dpc_err(DPC_EFORMAT, "lease spec_json: \"data.train\" is not an array");
    const cJSON *it;
    cJSON_ArrayForEach(it, train) {
      if (rc) break;
      if (!cJSON_IsString(it)) rc = dpc_err(DPC_EFORMAT, "lease spec_json: \"data.train\" holds a non-string");
      else {
        rc = add_matches(data_dir, it->valuestring, paths, n);
        found = 1;
      }
    }
  }
  cJSON_Delete(root);
  if (!rc && !found) {
    if (fallback && fallback[0]) {
      /* DataWindow.dataset: the spec's data.train entries joined with ','. */
      char *copy = strdup(fallback), *save = NULL;
      if (!copy) rc = dpc_err(DPC_ENOMEM, "job data: out of memory");
      for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && !rc; tok = strtok_r(NULL, ",", &save))
        rc = add_matches(data_dir, tok, paths, n);
      if (!rc && *n == 0) rc = dpc_err(DPC_EINVAL, "lease: data.dataset \"%s\" names no path", fallback);
      free(copy);
    } else
      rc = dpc_err(DPC_EINVAL, "lease names no training data (spec_json data.train and data.dataset are empty)");
  }
  if (rc) {
    worker_free_paths(*paths, *n);
    *paths = NULL;
    *n = 0;
  }
  return rc;
}

/* ------------------------------------------------------------------------- placement */

/* FragmentInfo.offset_floats relative to the fragment's module (the proto's wording). */
static int place_module_relative(size_t n, const uint32_t *level, const uint64_t *module, const uint64_t *off,
                                 const uint64_t *len, size_t n_params, const size_t *ord, size_t *abs_off) {
  uint64_t base = 0, expect = 0; /* module base in the path buffer; next offset in the module */
  for (size_t q = 0; q < n; q++) {
    size_t i = ord[q];
    if (q > 0 && level[i] != level[ord[q - 1]]) {
      base += expect;
      expect = 0;
    } else if (q > 0 && module[i] != module[ord[q - 1]]) {
      return dpc_err(DPC_EFORMAT, "lease: modules %" PRIu64 " and %" PRIu64 " both at level %u (a path has one "
                     "module per level)", module[ord[q - 1]], module[i], level[i]);
    }
    if (len[i] == 0 || off[i] != expect || len[i] > n_params || base + expect + len[i] > n_params)
      return dpc_err(DPC_EFORMAT, "lease: fragment %zu (module %" PRIu64 ", level %u) covers [%" PRIu64 ", +%" PRIu64
                     ") of its module, expected it to start at %" PRIu64 "; the path has %zu parameters", i,
                     module[i], level[i], off[i], len[i], expect, n_params);
    abs_off[i] = (size_t)(base + expect);
    expect += len[i];
  }
  if (base + expect != n_params)
    return dpc_err(DPC_EFORMAT, "lease: fragments cover %" PRIu64 " of the path's %zu parameters", base + expect,
                   n_params);
  return 0;
}

/* offset_floats as an offset in the whole canonical layout (= the path buffer). */
static int place_absolute(size_t n, const uint32_t *level, const uint64_t *off, const uint64_t *len,
                          size_t n_params, const size_t *ord, size_t *abs_off) {
  uint64_t expect = 0;
  for (size_t q = 0; q < n; q++) {
    size_t i = ord[q];
    if (len[i] == 0 || off[i] != expect || len[i] > n_params || expect + len[i] > n_params ||
        (q > 0 && level[i] < level[ord[q - 1]]))
      return dpc_err(DPC_EFORMAT, "lease: fragment %zu covers [%" PRIu64 ", +%" PRIu64 ") of the path buffer, "
                     "expected it to start at %" PRIu64, i, off[i], len[i], expect);
    abs_off[i] = (size_t)off[i];
    expect += len[i];
  }
  if (expect != n_params)
    return dpc_err(DPC_EFORMAT, "lease: fragments cover %" PRIu64 " of the path's %zu parameters", expect, n_params);
  return 0;
}

int worker_place_fragments(size_t n, const uint32_t *level, const uint64_t *module, const uint64_t *off,
                           const uint64_t *len, size_t n_params, size_t *abs_off) {
  if (n == 0) return dpc_err(DPC_EFORMAT, "lease has no fragments");
  size_t *ord = malloc(n * sizeof *ord);
  if (!ord) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  /* Module-relative: insertion sort by (level, offset); n is small. */
  for (size_t i = 0; i < n; i++) ord[i] = i;
  for (size_t i = 1; i < n; i++) {
    size_t k = ord[i], j = i;
    while (j > 0 && (level[ord[j - 1]] > level[k] || (level[ord[j - 1]] == level[k] && off[ord[j - 1]] > off[k]))) {
      ord[j] = ord[j - 1];
      j--;
    }
    ord[j] = k;
  }
  int rc = place_module_relative(n, level, module, off, len, n_params, ord, abs_off);
  if (rc == DPC_EFORMAT) {
    /* Absolute offsets tile [0, n_params) by offset alone. The two readings never both fit
     * unless they agree: with two or more levels, module-relative offsets repeat 0. */
    char first[512];
    snprintf(first, sizeof first, "%s", dpc_errmsg());
    for (size_t i = 0; i < n; i++) ord[i] = i;
    for (size_t i = 1; i < n; i++) {
      size_t k = ord[i], j = i;
      while (j > 0 && off[ord[j - 1]] > off[k]) {
        ord[j] = ord[j - 1];
        j--;
      }
      ord[j] = k;
    }
    if (place_absolute(n, level, off, len, n_params, ord, abs_off) == 0) rc = 0;
    else rc = dpc_err(DPC_EFORMAT, "%s (nor do the offsets tile the path as absolute offsets)", first);
  }
  free(ord);
  return rc;
}

/* -------------------------------------------------------------------- trainer cache */

typedef struct {
  uint64_t job;
  gpt_config cfg;
  trainer_opts opts;
  char **paths;
  int n_paths;
} trainer_key;

typedef struct {
  int used;
  uint64_t job;
  uint32_t path, replica;
  float *m, *v; /* (n_params) AdamW moments */
  size_t n;
  long adam_step;
  int64_t last_used;
} slot_state;

/* Progress shared between the owner thread (trainer callback) and the heartbeat thread. */
enum { AB_NONE = 0, AB_STOP, AB_LOST, AB_REREG };

typedef struct {
  wclient *wc;
  worker_ctl *ctl;
  pthread_t th;
  int running;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  int quit;
  uint64_t lease_id;
  uint64_t step, tokens;
  float loss, sps;
  uint64_t tok_per_step; /* B·T */
  int64_t last_step_ms, last_print_ms;
  atomic_int abort;
  atomic_int drain;
  atomic_uint interval_ms;
  /* display */
  int progress;
  uint64_t job, round;
  uint32_t path, replica;
  long first_step, end_step;
  /* --slowdown: end of the previous step's sleep (CLOCK_MONOTONIC ns) */
  double slowdown;
  int64_t mark_ns;
} heartbeat;

typedef struct {
  struct worker_opts o;
  worker_ctl *ctl;
  wclient wc;
  int registered;
  int draining;
  int worked;   /* a lease was completed */
  int saw_job;  /* a lease was granted or LEASE_WAIT seen: some job was running */
  int64_t last_hb_ms;
  unsigned seed;
  trainer *tr;
  trainer_key key;
  int have_slot; /* the trainer's moments belong to cur_path/cur_replica of key.job */
  uint32_t cur_path, cur_replica;
  slot_state states[MAX_SLOT_STATES];
  float *theta, *delta; /* (n_params) */
  size_t n_params;
  int local_failures;
  float sps; /* steps/s EWMA, carried from lease to lease */
  char device[96];      /* RegisterRequest.device: what the backend runs on */
  uint64_t device_mem;  /* RegisterRequest.device_memory_bytes */
} worker;

static void key_free(trainer_key *k) {
  worker_free_paths(k->paths, k->n_paths);
  memset(k, 0, sizeof *k);
}

static int key_equal(const trainer_key *a, const trainer_key *b) {
  if (a->job != b->job || memcmp(&a->cfg, &b->cfg, sizeof a->cfg) != 0 || a->n_paths != b->n_paths) return 0;
  const trainer_opts *x = &a->opts, *y = &b->opts;
  if (x->B != y->B || x->T != y->T || x->total_steps != y->total_steps || x->lr != y->lr ||
      x->lr_min_frac != y->lr_min_frac || x->warmup != y->warmup || x->hp.beta1 != y->hp.beta1 ||
      x->hp.beta2 != y->hp.beta2 || x->hp.eps != y->hp.eps || x->hp.weight_decay != y->hp.weight_decay ||
      x->hp.grad_clip != y->hp.grad_clip || x->replica != y->replica || x->n_replicas != y->n_replicas)
    return 0;
  for (int i = 0; i < a->n_paths; i++)
    if (strcmp(a->paths[i], b->paths[i]) != 0) return 0;
  return 1;
}

static slot_state *find_state(worker *w, uint64_t job, uint32_t path, uint32_t replica) {
  for (int i = 0; i < MAX_SLOT_STATES; i++)
    if (w->states[i].used && w->states[i].job == job && w->states[i].path == path &&
        w->states[i].replica == replica)
      return &w->states[i];
  return NULL;
}

static void drop_state(slot_state *s) {
  free(s->m);
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* A state entry for (job, path, replica) sized n, evicting the least recently used one. */
static slot_state *get_state_slot(worker *w, uint64_t job, uint32_t path, uint32_t replica, size_t n) {
  slot_state *s = find_state(w, job, path, replica);
  if (!s) {
    for (int i = 0; i < MAX_SLOT_STATES && !s; i++)
      if (!w->states[i].used) s = &w->states[i];
    if (!s) {
      s = &w->states[0];
      for (int i = 1; i < MAX_SLOT_STATES; i++)
        if (w->states[i].last_used < s->last_used) s = &w->states[i];
      DPC_WARN("dropping the AdamW state of job %" PRIu64 " slot (%u,%u) to make room", s->job, s->path, s->replica);
      drop_state(s);
    }
  }
  if (s->used && s->n != n) drop_state(s);
  if (!s->used) {
    s->m = malloc(n * sizeof(float));
    s->v = malloc(n * sizeof(float));
    if (!s->m || !s->v) {
      drop_state(s);
      dpc_err(DPC_ENOMEM, "worker: out of memory for AdamW state (%zu floats)", n);
      return NULL;
    }
    s->used = 1;
    s->n = n;
    s->job = job;
    s->path = path;
    s->replica = replica;
  }
  s->last_used = now_ms();
  return s;
}

/* Move the trainer's moments into the state store (the slot it holds them for). */
static int stash_current(worker *w) {
  if (!w->tr || !w->have_slot) return 0;
  slot_state *s = get_state_slot(w, w->key.job, w->cur_path, w->cur_replica, w->n_params);
  if (!s) return DPC_ENOMEM;
  int rc = trainer_get_state(w->tr, s->m, s->v, &s->adam_step);
  w->have_slot = 0;
  return rc;
}

/* ------------------------------------------------------------------- lease validation */

typedef struct {
  gpt_config cfg;
  trainer_opts opts;
  size_t *abs_off; /* (n_fragments) */
  size_t n_params;
} lease_plan;

static int finite_pos(float x) { return isfinite(x) && x > 0; }

static int validate_lease(worker *w, const Dipaco__V1__Lease *L, lease_plan *p) {
  (void)w;
  const Dipaco__V1__ModelShape *m = L->model;
  const Dipaco__V1__Hyper *h = L->hyper;
  const Dipaco__V1__DataWindow *d = L->data;
  if (!m || !h || !d || !L->slot) return dpc_err(DPC_EFORMAT, "lease: model, hyper, data or slot missing");
  if (m->num_layers > 256 || m->num_heads > 4096 || m->channels > 65536 || m->max_seq_len > 1048576 ||
      m->vocab_size > 16777216)
    return dpc_err(DPC_ERANGE, "lease: model shape out of range (L=%u NH=%u C=%u maxT=%u V=%u)", m->num_layers,
                   m->num_heads, m->channels, m->max_seq_len, m->vocab_size);
  p->cfg = (gpt_config){.n_layer = (int)m->num_layers, .n_head = (int)m->num_heads, .n_embd = (int)m->channels,
                        .n_positions = (int)m->max_seq_len, .vocab_size = (int)m->vocab_size};
  int rc = gpt_config_validate(&p->cfg);
  if (rc) return rc;
  if (h->batch_size < 1 || h->batch_size > 65536 || h->seq_len < 1 || h->seq_len > m->max_seq_len)
    return dpc_err(DPC_EINVAL, "lease: batch_size %u / seq_len %u invalid (seq_len ≤ max_seq_len %u)", h->batch_size,
                   h->seq_len, m->max_seq_len);
  if (h->grad_accum > 1)
    return dpc_err(DPC_EUNSUPPORTED, "lease: grad_accum %u is not supported by this worker", h->grad_accum);
  if (!finite_pos(h->lr) || !isfinite(h->lr_min_frac) || h->lr_min_frac < 0 || h->lr_min_frac > 1 ||
      !isfinite(h->weight_decay) || h->weight_decay < 0 || !isfinite(h->beta1) || h->beta1 < 0 || h->beta1 >= 1 ||
      !isfinite(h->beta2) || h->beta2 < 0 || h->beta2 >= 1 || !finite_pos(h->eps) || !isfinite(h->grad_clip) ||
      h->grad_clip < 0)
    return dpc_err(DPC_EINVAL, "lease: hyperparameters out of range (lr %g, lr_min_frac %g, wd %g, betas %g %g, "
                   "eps %g, clip %g)", h->lr, h->lr_min_frac, h->weight_decay, h->beta1, h->beta2, h->eps,
                   h->grad_clip);
  uint64_t total_steps = h->total_steps;
  if (total_steps == 0) { /* not filled in: the job spec's rounds × inner_steps */
    cJSON *root = L->spec_json ? cJSON_Parse(L->spec_json) : NULL;
    const cJSON *ro = cJSON_GetObjectItemCaseSensitive(root, "rounds");
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(root, "inner_steps");
    if (cJSON_IsNumber(ro) && cJSON_IsNumber(hs) && ro->valuedouble >= 1 && hs->valuedouble >= 1 &&
        ro->valuedouble * hs->valuedouble <= INT32_MAX) {
      total_steps = (uint64_t)ro->valuedouble * (uint64_t)hs->valuedouble;
      DPC_WARN("lease %" PRIu64 ": hyper.total_steps is 0; using the spec's rounds x inner_steps = %" PRIu64,
               L->lease_id, total_steps);
    }
    cJSON_Delete(root);
  }
  if (total_steps < 1 || total_steps > INT32_MAX || h->warmup_steps > total_steps)
    return dpc_err(DPC_EINVAL, "lease: total_steps %" PRIu64 " / warmup_steps %" PRIu64 " invalid", total_steps,
                   h->warmup_steps);
  if (L->inner_steps < 1 || L->inner_steps > 10000000 || L->first_step > INT32_MAX)
    return dpc_err(DPC_EINVAL, "lease: inner_steps %u / first_step %" PRIu64 " invalid", L->inner_steps,
                   L->first_step);
  if (d->replicas < 1 || d->replica >= d->replicas || d->replicas > 1000000)
    return dpc_err(DPC_EINVAL, "lease: data replica %u of %u invalid", d->replica, d->replicas);
  if (d->first_batch != L->first_step)
    return dpc_err(DPC_EUNSUPPORTED, "lease: data.first_batch %" PRIu64 " differs from first_step %" PRIu64
                   " (not supported: the batch index is the slot's step)", d->first_batch, L->first_step);
  if (d->shuffle) return dpc_err(DPC_EUNSUPPORTED, "lease: shuffled data order is not supported by this worker");
  if (d->path_index && d->path_index[0])
    return dpc_err(DPC_EUNSUPPORTED, "lease: DiPaCo routing index \"%s\" is not supported by this worker",
                   d->path_index);
  if (L->delta_codec != DIPACO__V1__CODEC__CODEC_FP32)
    return dpc_err(DPC_EUNSUPPORTED, "lease: delta codec %d is not supported (fp32 only)", L->delta_codec);
  if (L->n_fragments < 1 || L->n_fragments > MAX_FRAGMENTS)
    return dpc_err(DPC_ERANGE, "lease: %zu fragments (need 1..%d)", L->n_fragments, MAX_FRAGMENTS);
  p->opts = (trainer_opts){.B = (int)h->batch_size, .T = (int)h->seq_len, .total_steps = (long)total_steps,
                           .lr = h->lr, .lr_min_frac = h->lr_min_frac, .warmup = (int)h->warmup_steps,
                           .hp = {.beta1 = h->beta1, .beta2 = h->beta2, .eps = h->eps,
                                  .weight_decay = h->weight_decay, .grad_clip = h->grad_clip},
                           .replica = (int)d->replica, .n_replicas = (int)d->replicas};
  gpt_layout *lay = malloc(sizeof *lay);
  if (!lay) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  rc = gpt_layout_build(&p->cfg, lay);
  p->n_params = lay->n_params;
  free(lay);
  if (rc) return rc;
  size_t n = L->n_fragments;
  uint32_t *lv = malloc(n * sizeof *lv);
  uint64_t *mo = malloc(n * sizeof *mo), *of = malloc(n * sizeof *of), *ln = malloc(n * sizeof *ln);
  p->abs_off = malloc(n * sizeof *p->abs_off);
  if (!lv || !mo || !of || !ln || !p->abs_off) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
  for (size_t i = 0; i < n && !rc; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    if (f->sync_offset || f->overlap_steps)
      rc = dpc_err(DPC_EUNSUPPORTED, "lease: fragment %" PRIu64 " is a streaming fragment (not supported)",
                   f->fragment_id);
    for (size_t j = 0; j < i && !rc; j++)
      if (L->fragments[j]->fragment_id == f->fragment_id)
        rc = dpc_err(DPC_EFORMAT, "lease: fragment id %" PRIu64 " listed twice", f->fragment_id);
    lv[i] = f->level;
    mo[i] = f->module_id;
    of[i] = f->offset_floats;
    ln[i] = f->num_floats;
  }
  if (!rc) rc = worker_place_fragments(n, lv, mo, of, ln, p->n_params, p->abs_off);
  free(lv);
  free(mo);
  free(of);
  free(ln);
  return rc;
}

/* inner.state checkpoint: pull the slot's AdamW state (every fragment of the lease) from the
 * coordinator and load it into the trainer. A few retries on transient failures. */
static int pull_inner_state(worker *w, const Dipaco__V1__Lease *L, const lease_plan *p) {
  float *m = calloc(p->n_params, sizeof(float)), *v = calloc(p->n_params, sizeof(float));
  uint64_t step = 0, step0 = 0;
  int rc = m && v ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory for the inner state");
  for (size_t i = 0; i < L->n_fragments && !rc; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    for (int attempt = 0;; attempt++) {
      int code = RPC_OK;
      rc = wc_pull_inner(&w->wc, L->lease_id, f, m + p->abs_off[i], v + p->abs_off[i], &step, &code);
      if (rc == 0 || wc_classify(rc, code) != WC_RETRY || attempt >= 3 || worker_stopping(w->ctl)) break;
      DPC_WARN("lease %" PRIu64 ": pulling the inner state: %s; retrying", L->lease_id, dpc_errmsg());
      if (ctl_sleep(w->ctl, backoff_ms(attempt, &w->seed))) break;
    }
    if (!rc && i > 0 && step != step0)
      rc = dpc_err(DPC_EFORMAT, "lease %" PRIu64 ": inner state fragments disagree on the AdamW step (%" PRIu64
                   " vs %" PRIu64 ")", L->lease_id, step, step0);
    step0 = step;
  }
  if (!rc && step > (uint64_t)LONG_MAX) rc = dpc_err(DPC_EFORMAT, "inner state step %" PRIu64 " out of range", step);
  if (!rc) rc = trainer_set_state(w->tr, m, v, (long)step);
  if (!rc)
    DPC_INFO("lease %" PRIu64 ": resumed the slot's AdamW state from the coordinator (step %" PRIu64 ", lease starts at %"
             PRIu64 ")", L->lease_id, step, L->first_step);
  free(m);
  free(v);
  return rc;
}

/* inner.state checkpoint: upload the trainer's AdamW state for every fragment of the lease. */
static int push_inner_state(worker *w, const Dipaco__V1__Lease *L, const lease_plan *p, int *code) {
  size_t nf = L->n_fragments;
  float *m = malloc(w->n_params * sizeof(float)), *v = malloc(w->n_params * sizeof(float));
  const float **mp = malloc(nf * sizeof *mp), **vp = malloc(nf * sizeof *vp);
  long step = 0;
  int rc = m && v && mp && vp ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory for the inner state");
  if (!rc) rc = trainer_get_state(w->tr, m, v, &step);
  for (size_t i = 0; i < nf && !rc; i++) {
    mp[i] = m + p->abs_off[i];
    vp[i] = v + p->abs_off[i];
  }
  if (!rc) rc = wc_push_inner(&w->wc, L->lease_id, L->fragments, nf, mp, vp, (uint64_t)step, code);
  free(m);
  free(v);
  free(mp);
  free(vp);
  return rc;
}

/* Make the trainer fit the lease and hold the right AdamW state. */
static int prepare_trainer(worker *w, const Dipaco__V1__Lease *L, const lease_plan *p) {
  trainer_key k = {.job = L->job_id, .cfg = p->cfg, .opts = p->opts};
  int rc = worker_resolve_data(w->o.data_dir, L->spec_json, L->data->dataset, &k.paths, &k.n_paths);
  if (rc) return rc;
  if (w->tr && !key_equal(&w->key, &k)) {
    rc = stash_current(w);
    trainer_free(w->tr);
    w->tr = NULL;
    key_free(&w->key);
    if (rc) {
      key_free(&k);
      return rc;
    }
  }
  if (!w->tr) {
    gpt_backend_opts bo = {.kind = w->o.backend, .threads = w->o.threads, .device = w->o.device,
                            .precision = w->o.precision};
    rc = trainer_open(&w->tr, &p->cfg, &bo, (const char *const *)k.paths, k.n_paths, &p->opts);
    if (rc) {
      key_free(&k);
      return rc;
    }
    w->key = k;
    w->have_slot = 0;
    DPC_INFO("trainer for job %" PRIu64 ": L=%d NH=%d C=%d V=%d B=%d T=%d replica %d of %d, %d data file%s", L->job_id,
             p->cfg.n_layer, p->cfg.n_head, p->cfg.n_embd, p->cfg.vocab_size, p->opts.B, p->opts.T, p->opts.replica,
             p->opts.n_replicas, k.n_paths, k.n_paths == 1 ? "" : "s");
  } else {
    key_free(&k);
  }
  if (trainer_num_params(w->tr) != p->n_params)
    return dpc_err(DPC_EINTERNAL, "trainer has %zu parameters, the lease's model %zu", trainer_num_params(w->tr),
                   p->n_params);
  if (w->n_params != p->n_params) {
    free(w->theta);
    free(w->delta);
    w->theta = malloc(p->n_params * sizeof(float));
    w->delta = malloc(p->n_params * sizeof(float));
    w->n_params = w->theta && w->delta ? p->n_params : 0;
    if (!w->n_params) return dpc_err(DPC_ENOMEM, "worker: out of memory for %zu parameters", p->n_params);
  }
  uint32_t path = L->slot->path, rep = L->slot->replica;
  if (L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_RESET) {
    w->have_slot = 0;
    slot_state *old = find_state(w, L->job_id, path, rep);
    if (old) drop_state(old);
    return trainer_reset_state(w->tr);
  }
  if (L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_CHECKPOINT && L->has_inner_checkpoint) {
    /* The slot's AdamW state of the round before this one, whoever trained it. */
    if ((rc = stash_current(w))) return rc;
    slot_state *old = find_state(w, L->job_id, path, rep);
    if (old) drop_state(old);
    rc = pull_inner_state(w, L, p);
    if (rc) return rc;
    w->have_slot = 1;
    w->cur_path = path;
    w->cur_replica = rep;
    return 0;
  }
  if (w->have_slot && w->cur_path == path && w->cur_replica == rep) return 0;
  if ((rc = stash_current(w))) return rc;
  slot_state *s = find_state(w, L->job_id, path, rep);
  if (s) {
    rc = trainer_set_state(w->tr, s->m, s->v, s->adam_step);
    if (!rc && (uint64_t)s->adam_step != L->first_step)
      DPC_WARN("job %" PRIu64 " slot (%u,%u): AdamW state is from step %ld but the lease starts at step %" PRIu64
               " (another worker trained the slot in between); using it anyway", L->job_id, path, rep, s->adam_step,
               L->first_step);
    drop_state(s);
  } else {
    rc = trainer_reset_state(w->tr);
    if (L->first_step > 0)
      DPC_WARN("job %" PRIu64 " slot (%u,%u): no AdamW state for this slot here (first step %" PRIu64
               "); starting fresh", L->job_id, path, rep, L->first_step);
  }
  if (rc) return rc;
  w->have_slot = 1;
  w->cur_path = path;
  w->cur_replica = rep;
  return 0;
}

/* ------------------------------------------------------------------- heartbeat thread */

static void handle_command(heartbeat *hb, int cmd) {
  switch (cmd) {
  case DIPACO__V1__COMMAND__COMMAND_STOP:
    if (atomic_load(&hb->abort) == AB_NONE) DPC_INFO("lease %" PRIu64 ": coordinator says STOP", hb->lease_id);
    atomic_store(&hb->abort, AB_STOP);
    break;
  case DIPACO__V1__COMMAND__COMMAND_DRAIN:
    if (!atomic_exchange(&hb->drain, 1)) DPC_INFO("coordinator says DRAIN: finishing this lease, then exiting");
    break;
  case DIPACO__V1__COMMAND__COMMAND_REREGISTER:
    atomic_store(&hb->abort, AB_REREG);
    break;
  default:
    break;
  }
}

static void *hb_main(void *arg) {
  heartbeat *hb = arg;
  int64_t last_ok = now_ms();
  pthread_mutex_lock(&hb->mu);
  for (;;) {
    struct timespec ts;
    abs_deadline(&ts, atomic_load(&hb->interval_ms));
    while (!hb->quit)
      if (pthread_cond_timedwait(&hb->cv, &hb->mu, &ts) != 0) break;
    if (hb->quit) break;
    Dipaco__V1__HeartbeatRequest req = DIPACO__V1__HEARTBEAT_REQUEST__INIT;
    req.lease_id = hb->lease_id;
    req.step = hb->step;
    req.steps_per_sec = hb->sps;
    req.loss = hb->loss;
    req.tokens = hb->tokens;
    pthread_mutex_unlock(&hb->mu);
    Dipaco__V1__HeartbeatResponse *r = NULL;
    int code, rc = wc_heartbeat(hb->wc, &req, &r, &code);
    if (rc == 0) {
      last_ok = now_ms();
      if (r->heartbeat_interval_ms >= 50 && r->heartbeat_interval_ms <= 60000)
        atomic_store(&hb->interval_ms, r->heartbeat_interval_ms);
      handle_command(hb, r->command);
      protobuf_c_message_free_unpacked(&r->base, NULL);
    } else {
      enum wc_class cl = wc_classify(rc, code);
      uint32_t ttl = hb->wc->lease_ttl_ms ? hb->wc->lease_ttl_ms : 15000;
      if (cl == WC_REREGISTER) {
        atomic_store(&hb->abort, AB_REREG);
      } else if (cl == WC_LEASE_GONE || cl == WC_FATAL) {
        DPC_WARN("lease %" PRIu64 ": heartbeat refused (%s): dropping the lease", hb->lease_id, dpc_errmsg());
        atomic_store(&hb->abort, AB_LOST);
      } else if (now_ms() - last_ok > (int64_t)ttl && atomic_load(&hb->abort) == AB_NONE) {
        DPC_WARN("lease %" PRIu64 ": no heartbeat got through for %u ms (%s): the lease has expired", hb->lease_id,
                 ttl, dpc_errmsg());
        atomic_store(&hb->abort, AB_LOST);
      } else {
        DPC_DEBUG("lease %" PRIu64 ": heartbeat failed (%s); retrying", hb->lease_id, dpc_errmsg());
      }
    }
    pthread_mutex_lock(&hb->mu);
  }
  pthread_mutex_unlock(&hb->mu);
  return NULL;
}

static int hb_start(heartbeat *hb) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&hb->mu, NULL);
  pthread_cond_init(&hb->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&hb->th, NULL, hb_main, hb) != 0) {
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    return dpc_err(DPC_EINTERNAL, "worker: cannot start the heartbeat thread");
  }
  hb->running = 1;
  return 0;
}

static void hb_stop(heartbeat *hb) {
  if (!hb->running) return;
  pthread_mutex_lock(&hb->mu);
  hb->quit = 1;
  pthread_cond_signal(&hb->cv);
  pthread_mutex_unlock(&hb->mu);
  pthread_join(hb->th, NULL);
  pthread_mutex_destroy(&hb->mu);
  pthread_cond_destroy(&hb->cv);
  hb->running = 0;
}

/* Trainer step callback: progress for the heartbeat and the display; stop when asked. */
static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int on_step(void *ctx, long step, int h, float loss, float lr) {
  (void)lr;
  heartbeat *hb = ctx;
  if (hb->slowdown > 1.0) {
    /* The step took (now − mark); make it take slowdown times as long. */
    int64_t t1 = mono_ns();
    int64_t extra = (int64_t)((hb->slowdown - 1.0) * (double)(t1 - hb->mark_ns));
    if (extra > 0) {
      struct timespec ts = {.tv_sec = extra / 1000000000, .tv_nsec = extra % 1000000000};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
      }
    }
    hb->mark_ns = mono_ns();
  }
  int64_t t = now_ms();
  pthread_mutex_lock(&hb->mu);
  if (hb->last_step_ms && t > hb->last_step_ms) {
    float rate = 1000.0f / (float)(t - hb->last_step_ms);
    hb->sps = hb->sps > 0 ? 0.8f * hb->sps + 0.2f * rate : rate;
  }
  hb->last_step_ms = t;
  hb->step = (uint64_t)step + 1;
  hb->loss = loss;
  hb->tokens = (uint64_t)(h + 1) * hb->tok_per_step;
  pthread_mutex_unlock(&hb->mu);
  if (hb->progress && (t - hb->last_print_ms >= 100 || step + 1 == hb->end_step)) {
    hb->last_print_ms = t;
    fprintf(stderr, "\r\033[Kjob %" PRIu64 " round %" PRIu64 " slot (%u,%u) step %ld/%ld (%d) loss %.4f %.0f tok/s",
            hb->job, hb->round, hb->path, hb->replica, step + 1, hb->end_step, h + 1, loss,
            (double)hb->sps * (double)hb->tok_per_step);
  }
  return worker_stopping(hb->ctl) || atomic_load(&hb->abort) != AB_NONE;
}

/* --------------------------------------------------------------------- one lease */

static const char *push_result_name(int r) {
  switch (r) {
  case DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED: return "accepted";
  case DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE: return "duplicate";
  case DIPACO__V1__PUSH_RESULT__PUSH_LATE: return "late";
  case DIPACO__V1__PUSH_RESULT__PUSH_STALE: return "stale";
  default: return "no ack";
  }
}

static void release(worker *w, uint64_t lease_id, int reason, uint64_t step, const char *msg) {
  int code, rc = wc_release(&w->wc, lease_id, reason, step, msg, &code);
  if (rc && reason != DIPACO__V1__RELEASE_REASON__RELEASE_DONE)
    DPC_WARN("lease %" PRIu64 ": release failed: %s", lease_id, dpc_errmsg());
  else if (rc)
    DPC_DEBUG("lease %" PRIu64 ": release after push: %s", lease_id, dpc_errmsg());
}

/* A fresh channel in the middle of a lease (see wc_reconnect): the heartbeat thread is the
 * only other user of the client, so it pauses meanwhile. */
static void lease_reconnect(worker *w, heartbeat *hb) {
  hb_stop(hb);
  hb->quit = 0;
  if (wc_reconnect(&w->wc, w->o.coordinator)) DPC_WARN("reconnect: %s", dpc_errmsg());
  if (hb_start(hb)) DPC_WARN("lease %" PRIu64 ": %s", hb->lease_id, dpc_errmsg());
}

/* Retry a transfer step while it fails transiently; returns the final rc, with *cls set. A
 * stop (SIGTERM) ends the retries unless on_stop is set (pushing work already done). */
#define XFER_RETRY(w, hb, call, cls_out, on_stop)                                                   \
  do {                                                                                              \
    for (int attempt_ = 0;; attempt_++) {                                                           \
      int code_ = RPC_OK;                                                                           \
      rc = (call);                                                                                  \
      cls_out = wc_classify(rc, code_);                                                             \
      if (cls_out != WC_RETRY || attempt_ + 1 >= TRANSFER_ATTEMPTS) break;                         \
      if ((!(on_stop) && worker_stopping((w)->ctl)) || atomic_load(&(hb)->abort) != AB_NONE) break; \
      DPC_WARN("lease %" PRIu64 ": %s; retrying", L->lease_id, dpc_errmsg());                       \
      if (code_ == RPC_UNAVAILABLE && attempt_ >= 1) lease_reconnect((w), (hb));                   \
      if (!worker_stopping((w)->ctl)) {                                                             \
        if (ctl_sleep((w)->ctl, backoff_ms(attempt_, &(w)->seed)) && !(on_stop)) break;             \
      } else {                                                                                      \
        plain_sleep(backoff_ms(attempt_, &(w)->seed));                                              \
      }                                                                                             \
    }                                                                                               \
  } while (0)

static void run_lease(worker *w, const Dipaco__V1__Lease *L) {
  const uint32_t path = L->slot ? L->slot->path : 0, rep = L->slot ? L->slot->replica : 0;
  DPC_INFO("lease %" PRIu64 " granted: job %" PRIu64 " round %" PRIu64 " slot (%u,%u) steps %" PRIu64 "..%" PRIu64
           " fragments %zu", L->lease_id, L->job_id, L->round, path, rep, L->first_step,
           L->first_step + L->inner_steps, L->n_fragments);
  lease_plan p;
  memset(&p, 0, sizeof p);
  heartbeat hb;
  memset(&hb, 0, sizeof hb);
  hb.wc = &w->wc;
  hb.ctl = w->ctl;
  hb.lease_id = L->lease_id;
  hb.step = L->first_step;
  hb.loss = NAN;
  hb.progress = w->o.progress;
  hb.job = L->job_id;
  hb.round = L->round;
  hb.path = path;
  hb.replica = rep;
  hb.first_step = (long)L->first_step;
  hb.end_step = (long)(L->first_step + L->inner_steps);
  hb.sps = w->sps;
  hb.slowdown = w->o.slowdown;
  atomic_store(&hb.interval_ms, w->wc.heartbeat_ms);
  char msg[512] = "";
  int rc = validate_lease(w, L, &p);
  if (!rc) rc = prepare_trainer(w, L, &p);
  hb.tok_per_step = (uint64_t)p.opts.B * (uint64_t)p.opts.T;
  if (!rc) rc = hb_start(&hb);
  if (rc) {
    snprintf(msg, sizeof msg, "%s", dpc_errmsg()[0] ? dpc_errmsg() : dpc_strerror(rc));
    DPC_ERROR("lease %" PRIu64 ": cannot run it: %s", L->lease_id, msg);
    release(w, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_ERROR, L->first_step, msg);
    free(p.abs_off);
    w->local_failures++;
    ctl_sleep(w->ctl, backoff_ms(w->local_failures + 3, &w->seed));
    return;
  }
  enum wc_class cls = WC_OK;
  int keep = L->inner_state != DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_RESET;
  slot_state *snap = NULL;
  trainer_stats st;
  memset(&st, 0, sizeof st);
  /* Pull. */
  int64_t t0 = now_ms();
  size_t bytes = 0;
  for (size_t i = 0; i < L->n_fragments && !rc; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    size_t got = 0;
    XFER_RETRY(w, &hb, wc_pull(&w->wc, L->lease_id, f, w->theta + p.abs_off[i], &got, &code_), cls, 0);
    bytes += (size_t)f->num_floats * 4;
    if (worker_stopping(w->ctl) || atomic_load(&hb.abort) != AB_NONE) break;
  }
  if (!rc && !worker_stopping(w->ctl) && atomic_load(&hb.abort) == AB_NONE) {
    int64_t ms = now_ms() - t0;
    DPC_INFO("lease %" PRIu64 " pulled %zu bytes in %" PRId64 " ms (%.1f MB/s)", L->lease_id, bytes, ms,
             ms > 0 ? (double)bytes / 1000.0 / (double)ms : 0.0);
    /* Train, keeping the state it started from in case the lease is abandoned. */
    if (keep) {
      snap = get_state_slot(w, L->job_id, path, rep, w->n_params);
      if (!snap) rc = DPC_ENOMEM;
      else rc = trainer_get_state(w->tr, snap->m, snap->v, &snap->adam_step);
    }
    hb.mark_ns = mono_ns();
    if (!rc) rc = trainer_round(w->tr, w->theta, (long)L->first_step, (int)L->inner_steps, w->delta, &st, on_step, &hb);
    if (w->o.progress) fputc('\n', stderr);
    cls = rc ? WC_FATAL : WC_OK;
    /* Async: a SIGTERM mid-round pushes the steps done so far (the coordinator counts them). */
    int partial = !rc && L->algorithm != DIPACO__V1__ALGORITHM__ALGORITHM_SYNC && worker_stopping(w->ctl) &&
                  atomic_load(&hb.abort) == AB_NONE && st.steps_done > 0 && st.steps_done < (int)L->inner_steps;
    if (!rc && (st.steps_done == (int)L->inner_steps || partial)) {
      DPC_INFO("lease %" PRIu64 " trained %d steps in %.2f s: loss %.4f -> %.4f (mean %.4f), %.0f tok/s", L->lease_id,
               st.steps_done, st.seconds, st.first_loss, st.last_loss, st.mean_loss,
               st.seconds > 0 ? (double)st.tokens / st.seconds : 0.0);
      if (partial)
        DPC_INFO("lease %" PRIu64 ": stopping: pushing the partial delta of %d of %u inner steps (async)", L->lease_id,
                 st.steps_done, L->inner_steps);
      /* Push. */
      size_t nf = L->n_fragments;
      const float **dp = malloc(nf * sizeof *dp);
      int *res = malloc(nf * sizeof *res);
      if (!dp || !res) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
      for (size_t i = 0; i < nf && !rc; i++) dp[i] = w->delta + p.abs_off[i];
      t0 = now_ms();
      if (!rc && L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_CHECKPOINT) {
        /* Inner state first, then the delta: once the delta is durable (the slot's round is
         * done) the state the next lease of the slot resumes from is durable too. */
        XFER_RETRY(w, &hb, push_inner_state(w, L, &p, &code_), cls, 1);
        if (rc) DPC_WARN("lease %" PRIu64 ": pushing the inner state failed: %s", L->lease_id, dpc_errmsg());
      }
      if (!rc) {
        pthread_mutex_lock(&hb.mu);
        hb.tokens = (uint64_t)st.tokens;
        pthread_mutex_unlock(&hb.mu);
        XFER_RETRY(w, &hb, wc_push(&w->wc, L->lease_id, L->fragments, nf, dp, (uint64_t)st.steps_done,
                                   (uint64_t)st.tokens, res, &code_), cls, 1);
      }
      if (!rc) {
        int64_t ms = now_ms() - t0;
        int ok = 1;
        for (size_t i = 0; i < nf; i++) {
          if (res[i] != DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED && res[i] != DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE) {
            ok = 0;
            DPC_WARN("lease %" PRIu64 ": delta of fragment %" PRIu64 " was %s; dropped", L->lease_id,
                     L->fragments[i]->fragment_id, push_result_name(res[i]));
          }
        }
        DPC_INFO("lease %" PRIu64 " pushed %zu bytes in %" PRId64 " ms: %s", L->lease_id, bytes, ms,
                 ok ? "accepted" : "not all accepted");
        w->worked = 1;
        w->local_failures = 0;
        release(w, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_DONE, L->first_step + (uint64_t)st.steps_done,
                "");
        snap = NULL; /* the trainer's moments are now the slot's */
        if (keep) {
          slot_state *s = find_state(w, L->job_id, path, rep);
          if (s) drop_state(s);
        }
      }
      free(dp);
      free(res);
      if (!rc) {
        hb_stop(&hb);
        w->sps = hb.sps;
        if (atomic_load(&hb.drain)) w->draining = 1;
        free(p.abs_off);
        return;
      }
    }
  }
  /* The lease was not completed: stopped, lost, or failed. */
  hb_stop(&hb);
  w->sps = hb.sps;
  if (atomic_load(&hb.drain)) w->draining = 1;
  if (snap) {
    if (trainer_set_state(w->tr, snap->m, snap->v, snap->adam_step)) w->have_slot = 0;
    drop_state(snap);
  }
  uint64_t step = L->first_step + (uint64_t)st.steps_done;
  int ab = atomic_load(&hb.abort);
  if (ab == AB_REREG || cls == WC_REREGISTER) {
    DPC_WARN("lease %" PRIu64 ": the coordinator forgot this worker's session; registering again", L->lease_id);
    w->registered = 0;
  } else if (ab == AB_LOST || cls == WC_LEASE_GONE) {
    DPC_WARN("lease %" PRIu64 ": lease expired or revoked%s%s; dropping the work", L->lease_id, rc ? ": " : "",
             rc ? dpc_errmsg() : "");
  } else if (worker_stopping(w->ctl)) {
    DPC_INFO("lease %" PRIu64 ": stopping: releasing it at step %" PRIu64, L->lease_id, step);
    release(w, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_PREEMPTED, step, "worker shutting down");
  } else if (ab == AB_STOP) {
    DPC_INFO("lease %" PRIu64 ": stopped by the coordinator: releasing it at step %" PRIu64, L->lease_id, step);
    release(w, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_PREEMPTED, step, "stopped by the coordinator");
  } else {
    snprintf(msg, sizeof msg, "%s", dpc_errmsg()[0] ? dpc_errmsg() : dpc_strerror(rc));
    DPC_ERROR("lease %" PRIu64 " failed: %s", L->lease_id, msg);
    if (cls == WC_RETRY) w->registered = 0; /* the coordinator is unreachable: start over */
    else release(w, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_ERROR, step, msg);
    w->local_failures++;
    ctl_sleep(w->ctl, backoff_ms(w->local_failures + 3, &w->seed));
  }
  free(p.abs_off);
}

/* --------------------------------------------------------------------- the loop */

static int do_register(worker *w, int *code) {
  char host[256] = "";
  if (w->o.name) snprintf(host, sizeof host, "%s", w->o.name);
  else if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
  Dipaco__V1__RegisterRequest req = DIPACO__V1__REGISTER_REQUEST__INIT;
  Dipaco__V1__Codec codecs[1] = {DIPACO__V1__CODEC__CODEC_FP32};
  req.hostname = host;
  req.backend = w->o.backend == GPT_BACKEND_CUDA ? "cuda" : "cpu";
  req.device = w->device;
  req.device_memory_bytes = w->device_mem;
  long nc = sysconf(_SC_NPROCESSORS_ONLN);
  req.threads = (uint32_t)(w->o.threads > 0 ? w->o.threads : (nc > 0 ? nc : 1));
  req.version = "dipaco-worker 0.1";
  req.n_codecs = 1;
  req.codecs = codecs;
  req.labels = (char *)(w->o.labels ? w->o.labels : "");
  uint64_t prev = w->wc.worker_id;
  int rc = wc_register(&w->wc, &req, code);
  if (rc) return rc;
  w->registered = 1;
  w->last_hb_ms = now_ms();
  DPC_INFO("registered with %s as worker %" PRIu64 "%s (heartbeat %u ms, lease ttl %u ms, chunk %u bytes)",
           w->o.coordinator, w->wc.worker_id, prev && prev != w->wc.worker_id ? " (new id)" : "", w->wc.heartbeat_ms,
           w->wc.lease_ttl_ms, w->wc.max_chunk_bytes);
  return 0;
}

/* An idle heartbeat; returns 1 if the worker should exit (DRAIN). */
static int idle_heartbeat(worker *w, int *code) {
  Dipaco__V1__HeartbeatRequest req = DIPACO__V1__HEARTBEAT_REQUEST__INIT;
  req.loss = NAN;
  Dipaco__V1__HeartbeatResponse *r = NULL;
  int rc = wc_heartbeat(&w->wc, &req, &r, code);
  w->last_hb_ms = now_ms();
  if (rc) return rc;
  int cmd = r->command;
  if (r->heartbeat_interval_ms >= 50 && r->heartbeat_interval_ms <= 60000) w->wc.heartbeat_ms = r->heartbeat_interval_ms;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  if (cmd == DIPACO__V1__COMMAND__COMMAND_DRAIN) {
    DPC_INFO("coordinator says DRAIN: exiting");
    w->draining = 1;
  } else if (cmd == DIPACO__V1__COMMAND__COMMAND_REREGISTER) {
    w->registered = 0;
  }
  return 0;
}

/* Probe the backend once so that a worker that cannot compute fails at start, not per lease;
 * keep its description (device name and memory) for Register. */
static int check_backend(worker *w) {
  const struct worker_opts *o = &w->o;
  gpt_config cfg = {.n_layer = 1, .n_head = 1, .n_embd = 8, .n_positions = 4, .vocab_size = 8};
  gpt_backend_opts bo = {.kind = o->backend, .threads = o->threads, .device = o->device, .precision = o->precision};
  gpt_model *m = NULL;
  int rc = gpt_create(&m, &cfg, &bo, 1, 4);
  if (!rc && gpt_describe(m, w->device, sizeof w->device, &w->device_mem) != 0) {
    snprintf(w->device, sizeof w->device, "%s", o->backend == GPT_BACKEND_CUDA ? "cuda" : "cpu");
    w->device_mem = 0;
  }
  /* The coordinator accepts printable text only. */
  for (char *p = w->device; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
  gpt_free(m);
  if (!rc) DPC_INFO("backend %s: %s", o->backend == GPT_BACKEND_CUDA ? "cuda" : "cpu", w->device);
  return rc;
}

int worker_run(const struct worker_opts *o, worker_ctl *ctl) {
  worker *w = calloc(1, sizeof *w);
  if (!w) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  w->o = *o;
  int rc = check_backend(w);
  if (rc) {
    free(w);
    return rc;
  }
  if (!w->o.poll_ms) w->o.poll_ms = 5000;
  w->ctl = ctl;
  w->seed = (unsigned)getpid() ^ (unsigned)now_ms();
  if ((rc = wc_open(&w->wc, o->coordinator, o->max_chunk_bytes))) {
    free(w);
    return rc;
  }
  int failures = 0;
  while (!worker_stopping(ctl) && !w->draining) {
    int code = RPC_OK;
    enum wc_class cl = WC_OK;
    if (!w->registered) {
      rc = do_register(w, &code);
      if (rc && (code == RPC_UNAUTHENTICATED || code == RPC_PERMISSION_DENIED)) {
        /* A refused join token will be refused again: retrying would only hide a
         * configuration error from the operator (or the container runtime). */
        DPC_ERROR("register with %s refused: %s (check --token-file / $DIPACO_JOIN_TOKEN: it must hold the "
                  "coordinator's STATE/join.token)", o->coordinator, dpc_errmsg());
        return rc;
      }
      if (rc) {
        DPC_WARN("register with %s failed: %s", o->coordinator, dpc_errmsg());
        if (code == RPC_UNAVAILABLE && failures >= 1) wc_reconnect(&w->wc, o->coordinator);
        ctl_sleep(ctl, backoff_ms(failures++, &w->seed));
        continue;
      }
    }
    if (now_ms() - w->last_hb_ms >= (int64_t)w->wc.heartbeat_ms) {
      /* Only its commands matter; the Lease call below tells whether the coordinator is up. */
      rc = idle_heartbeat(w, &code);
      cl = wc_classify(rc, code);
      if (cl == WC_REREGISTER) w->registered = 0;
      else if (rc) DPC_DEBUG("idle heartbeat failed: %s", dpc_errmsg());
      if (!w->registered || w->draining) continue;
    }
    Dipaco__V1__LeaseResponse *resp = NULL;
    rc = wc_lease(&w->wc, w->o.poll_ms, &resp, &code, stop_requested, ctl);
    if (rc && worker_stopping(ctl)) break; /* the long-poll was cancelled (or failed) on SIGTERM */
    if (rc) {
      cl = wc_classify(rc, code);
      if (cl == WC_REREGISTER) {
        DPC_WARN("lease: %s; registering again", dpc_errmsg());
        w->registered = 0;
      } else {
        DPC_WARN("lease request failed: %s", dpc_errmsg());
        if (code == RPC_UNAVAILABLE && failures >= 1) wc_reconnect(&w->wc, o->coordinator);
        ctl_sleep(ctl, backoff_ms(failures++, &w->seed));
      }
      continue;
    }
    failures = 0;
    w->last_hb_ms = now_ms(); /* a Lease call shows the worker is alive, too */
    if (resp->outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED) {
      w->saw_job = 1;
      run_lease(w, resp->lease);
    } else if (resp->outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_WAIT) {
      w->saw_job = 1;
      uint32_t ms = resp->wait_ms < 10 ? 10 : resp->wait_ms > 30000 ? 30000 : resp->wait_ms;
      DPC_DEBUG("lease: wait %u ms", ms);
      ctl_sleep(ctl, ms);
    } else {
      /* A worker that joined late may never have seen the job it was meant for (it may have
       * ended while the worker reconnected): jobs_ended says so. */
      if (o->exit_when_done && (w->worked || w->saw_job || resp->jobs_ended)) {
        DPC_INFO("no work left: exiting (--exit-when-done)");
        protobuf_c_message_free_unpacked(&resp->base, NULL);
        break;
      }
      uint32_t ms = resp->wait_ms ? resp->wait_ms : 2000;
      if (ms > 30000) ms = 30000;
      DPC_DEBUG("lease: no work; asking again in %u ms", ms);
      ctl_sleep(ctl, ms);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
  }
  if (w->draining) DPC_INFO("drained: exiting");
  else if (worker_stopping(ctl)) DPC_INFO("stopped");
  trainer_free(w->tr);
  key_free(&w->key);
  for (int i = 0; i < MAX_SLOT_STATES; i++) drop_state(&w->states[i]);
  free(w->theta);
  free(w->delta);
  wc_close(&w->wc);
  free(w);
  return 0;
}
