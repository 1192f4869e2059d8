/* test_ctl_admin_fake.c — a small fake dipaco.v1.Admin server (common/rpc.h) with canned
 * answers, for testing dipacoctl's admin client without the real coordinator
 * (tests/integration/ctl_admin_fake.py drives it).
 *
 * usage: test_ctl_admin_fake DIR [--token TOKEN]
 * Writes DIR/served/{config.json,model.safetensors} (what ExportPath serves), prints
 * "PORT n" and serves until stdin closes. Records what clients sent: DIR/uploaded.safetensors
 * (UploadInitialModel), DIR/created_spec.json and DIR/created_upload_id (CreateJob).
 *
 * Canned state: jobs 1 "alpha" RUNNING, 2 "beta" DONE, 7 "gamma" (RUNNING for two GetJob
 * calls, then DONE), 8 "delta" FAILED, 9 "eps" RUNNING forever; ListJobs pages hold at most
 * 2 jobs (paging). ExportPath job 1: path 0 good, path 1 corrupted CRC-32C, path 2 ends
 * after config.json. Unknown jobs: NOT_FOUND "job N does not exist". With --token every call
 * needs "authorization: Bearer TOKEN" (PERMISSION_DENIED otherwise). */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "kernels/modeldir.h"
#include "common/rpc.h"
#include "coordinator/jobspec.h"
#include "kernels/gpt.h"
#include "proto/dipaco.pb-c.h"

#include <grpc/byte_buffer.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT_CHUNK (64u << 10)

static const char *g_dir, *g_token;
static uint8_t *g_cfg, *g_st;
static size_t g_cfg_len, g_st_len;
static char *g_spec; /* canonical spec served for every job */
static int g_wait7;  /* GetJob calls for job 7 */
static uint64_t g_next_id = 100;

typedef struct {
  uint64_t id;
  const char *name;
  int state;
  uint64_t round, rounds;
  float loss;
  const char *message;
} fake_job;

static fake_job g_jobs[] = {
    {1, "alpha", DIPACO__V1__JOB_STATE__JOB_RUNNING, 1, 3, 3.25f, ""},
    {2, "beta", DIPACO__V1__JOB_STATE__JOB_DONE, 3, 3, 2.5f, "finished"},
    {7, "gamma", DIPACO__V1__JOB_STATE__JOB_RUNNING, 0, 3, NAN, ""},
    {8, "delta", DIPACO__V1__JOB_STATE__JOB_FAILED, 1, 3, 4.0f, "worker exploded"},
    {9, "eps", DIPACO__V1__JOB_STATE__JOB_RUNNING, 0, 5, 5.0f, ""},
};
#define N_JOBS ((int)(sizeof g_jobs / sizeof g_jobs[0]))

static fake_job *find_job(uint64_t id) {
  for (int i = 0; i < N_JOBS; i++)
    if (g_jobs[i].id == id) return &g_jobs[i];
  return NULL;
}

static void fill_summary(Dipaco__V1__JobSummary *s, const fake_job *j) {
  dipaco__v1__job_summary__init(s);
  s->job_id = j->id;
  s->name = (char *)j->name;
  s->state = j->state;
  s->algorithm = DIPACO__V1__ALGORITHM__ALGORITHM_SYNC;
  s->round = j->round;
  s->rounds_total = j->rounds;
  s->paths = 1;
  s->replicas = 2;
  s->active_leases = j->state == DIPACO__V1__JOB_STATE__JOB_RUNNING ? 2 : 0;
  s->created_unix_ms = 1700000000000LL + (int64_t)j->id;
  s->updated_unix_ms = 1700000060000LL + (int64_t)j->id;
  s->last_loss = j->loss;
}

/* Every handler: check the token; 0 = go on. */
static int authorized(struct rpc_call *c) {
  if (!g_token) return 1;
  char got[256], want[256];
  snprintf(want, sizeof want, "Bearer %s", g_token);
  if (rpc_call_md(c, RPC_MD_AUTHORIZATION, got, sizeof got) < 0 || strcmp(got, want) != 0) {
    rpc_call_finish(c, RPC_PERMISSION_DENIED, "admin token required");
    return 0;
  }
  return 1;
}

static ProtobufCMessage *unpack(struct rpc_call *c, const struct grpc_byte_buffer *req,
                                const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *pm = NULL;
  if (rpc_msg_unpack(req, d, 1 << 20, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return NULL;
  }
  return pm;
}

static void reply_job(struct rpc_call *c, const fake_job *j, const char *spec) {
  Dipaco__V1__JobSummary s;
  fill_summary(&s, j);
  Dipaco__V1__Job job = DIPACO__V1__JOB__INIT;
  job.summary = &s;
  job.spec_json = (char *)spec;
  job.message = (char *)j->message;
  rpc_call_reply(c, &job.base);
}

static void list_jobs(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!authorized(c)) return;
  Dipaco__V1__ListJobsRequest *r = (Dipaco__V1__ListJobsRequest *)unpack(c, req, &dipaco__v1__list_jobs_request__descriptor);
  if (!r) return;
  Dipaco__V1__JobSummary s[2], *sp[2];
  size_t n = 0;
  for (int i = 0; i < N_JOBS && n < 2 && n < (r->limit ? r->limit : 100); i++) {
    if (g_jobs[i].id <= r->after_job_id) continue;
    if (r->state && (int)r->state != g_jobs[i].state) continue;
    fill_summary(&s[n], &g_jobs[i]);
    sp[n] = &s[n];
    n++;
  }
  Dipaco__V1__ListJobsResponse resp = DIPACO__V1__LIST_JOBS_RESPONSE__INIT;
  resp.n_jobs = n;
  resp.jobs = sp;
  rpc_call_reply(c, &resp.base);
  protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void job_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!authorized(c)) return;
  Dipaco__V1__JobRequest *r = (Dipaco__V1__JobRequest *)unpack(c, req, &dipaco__v1__job_request__descriptor);
  if (!r) return;
  const char *m = rpc_call_method(c);
  fake_job *j = find_job(r->job_id);
  if (!j) {
    rpc_call_finish(c, RPC_NOT_FOUND, "job %llu does not exist", (unsigned long long)r->job_id);
  } else if (strstr(m, "/GetJob")) {
    fake_job copy = *j;
    if (j->id == 7) {
      g_wait7++;
      copy.round = (uint64_t)(g_wait7 < 3 ? g_wait7 - 1 : 3);
      if (g_wait7 >= 3) copy.state = DIPACO__V1__JOB_STATE__JOB_DONE;
    }
    reply_job(c, &copy, g_spec);
  } else {
    int from = j->state, to;
    if (strstr(m, "/PauseJob")) to = DIPACO__V1__JOB_STATE__JOB_PAUSED;
    else if (strstr(m, "/ResumeJob")) to = DIPACO__V1__JOB_STATE__JOB_RUNNING;
    else to = DIPACO__V1__JOB_STATE__JOB_CANCELLED;
    if (from == DIPACO__V1__JOB_STATE__JOB_DONE || from == DIPACO__V1__JOB_STATE__JOB_FAILED) {
      rpc_call_finish(c, RPC_FAILED_PRECONDITION, "job %llu is finished", (unsigned long long)j->id);
    } else {
      j->state = to;
      fake_job copy = *j;
      copy.message = r->reason;
      reply_job(c, &copy, g_spec);
    }
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void create_job(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!authorized(c)) return;
  Dipaco__V1__CreateJobRequest *r = (Dipaco__V1__CreateJobRequest *)unpack(c, req, &dipaco__v1__create_job_request__descriptor);
  if (!r) return;
  char path[PATH_MAX], idbuf[64];
  snprintf(path, sizeof path, "%s/created_spec.json", g_dir);
  dpc_write_file_atomic(path, r->spec_json, strlen(r->spec_json));
  snprintf(path, sizeof path, "%s/created_upload_id", g_dir);
  int n = snprintf(idbuf, sizeof idbuf, "%llu\n", (unsigned long long)r->initial_upload_id);
  dpc_write_file_atomic(path, idbuf, (size_t)n);
  fake_job j = {g_next_id++, r->name, r->start_paused ? DIPACO__V1__JOB_STATE__JOB_PAUSED : DIPACO__V1__JOB_STATE__JOB_PENDING,
                0, 3, NAN, "created"};
  reply_job(c, &j, r->spec_json);
  protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void list_workers(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!authorized(c)) return;
  Dipaco__V1__ListWorkersRequest *r = (Dipaco__V1__ListWorkersRequest *)unpack(c, req, &dipaco__v1__list_workers_request__descriptor);
  if (!r) return;
  Dipaco__V1__WorkerInfo w[2], *wp[2];
  Dipaco__V1__Slot slot = DIPACO__V1__SLOT__INIT;
  slot.path = 0;
  slot.replica = 1;
  size_t n = 0;
  for (int i = 0; i < 2; i++) {
    int gone = i == 1;
    if (gone && !r->include_gone) continue;
    if (r->job_id && r->job_id != (gone ? 0u : 1u)) continue;
    dipaco__v1__worker_info__init(&w[n]);
    w[n].worker_id = (uint64_t)(11 + i);
    w[n].hostname = gone ? "node-b" : "node-a";
    w[n].backend = "cpu";
    w[n].device = gone ? "" : "x86 \"test\" cpu";
    w[n].state = gone ? DIPACO__V1__WORKER_STATE__WORKER_GONE : DIPACO__V1__WORKER_STATE__WORKER_TRAINING;
    if (!gone) {
      w[n].lease_id = 21;
      w[n].job_id = 1;
      w[n].slot = &slot;
      w[n].steps_per_sec = 1.5f;
    }
    w[n].last_heartbeat_unix_ms = 1700000100000LL;
    w[n].registered_unix_ms = 1700000000000LL;
    w[n].labels = "zone=a";
    wp[n] = &w[n];
    n++;
  }
  Dipaco__V1__ListWorkersResponse resp = DIPACO__V1__LIST_WORKERS_RESPONSE__INIT;
  resp.n_workers = n;
  resp.workers = wp;
  rpc_call_reply(c, &resp.base);
  protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void list_paths(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!authorized(c)) return;
  Dipaco__V1__ListPathsRequest *r = (Dipaco__V1__ListPathsRequest *)unpack(c, req, &dipaco__v1__list_paths_request__descriptor);
  if (!r) return;
  if (!find_job(r->job_id)) {
    rpc_call_finish(c, RPC_NOT_FOUND, "job %llu does not exist", (unsigned long long)r->job_id);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return;
  }
  Dipaco__V1__Slot sl[2] = {DIPACO__V1__SLOT__INIT, DIPACO__V1__SLOT__INIT};
  Dipaco__V1__SlotInfo si[2], *sp[2];
  for (int i = 0; i < 2; i++) {
    dipaco__v1__slot_info__init(&si[i]);
    sl[i].replica = (uint32_t)i;
    si[i].slot = &sl[i];
    si[i].worker_id = i == 1 ? 11 : 0;
    si[i].lease_id = i == 1 ? 21 : 0;
    si[i].step = 3 + (uint64_t)i;
    si[i].last_loss = i == 1 ? 3.5f : NAN;
    sp[i] = &si[i];
  }
  uint64_t mods[1] = {0};
  Dipaco__V1__PathInfo p = DIPACO__V1__PATH_INFO__INIT, *pp[1] = {&p};
  p.n_modules = 1;
  p.modules = mods;
  p.n_slots = 2;
  p.slots = sp;
  Dipaco__V1__ListPathsResponse resp = DIPACO__V1__LIST_PATHS_RESPONSE__INIT;
  resp.n_paths = 1;
  resp.paths = pp;
  rpc_call_reply(c, &resp.base);
  protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void list_modules(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!authorized(c)) return;
  Dipaco__V1__ListModulesRequest *r = (Dipaco__V1__ListModulesRequest *)unpack(c, req, &dipaco__v1__list_modules_request__descriptor);
  if (!r) return;
  if (!find_job(r->job_id)) {
    rpc_call_finish(c, RPC_NOT_FOUND, "job %llu does not exist", (unsigned long long)r->job_id);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return;
  }
  Dipaco__V1__FragmentInfo f = DIPACO__V1__FRAGMENT_INFO__INIT, *fp[1] = {&f};
  f.fragment_id = 0;
  f.module_id = 0;
  f.version = 1;
  f.num_floats = 12345;
  f.crc32c = 0xdeadbeefu;
  f.updated_unix_ms = 1700000200000ULL;
  Dipaco__V1__ModuleInfo m = DIPACO__V1__MODULE_INFO__INIT, *mp[1] = {&m};
  m.num_floats = 12345;
  m.n_fragments = 1;
  m.fragments = fp;
  Dipaco__V1__ListModulesResponse resp = DIPACO__V1__LIST_MODULES_RESPONSE__INIT;
  resp.n_modules = 1;
  resp.modules = mp;
  rpc_call_reply(c, &resp.base);
  protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* ---- UploadInitialModel (client-streaming) ---- */

typedef struct {
  uint8_t *buf;
  uint64_t total, got;
  uint32_t crc;
  int bad;
} upload_state;

static void upload_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  upload_state *st = calloc(1, sizeof *st);
  if (!authorized(c)) st->bad = 1; /* finished already; ignore its messages */
  rpc_call_set_data(c, st);
}

static int upload_message(struct rpc_call *c, const struct grpc_byte_buffer *m, void *ud) {
  (void)ud;
  upload_state *st = rpc_call_data(c);
  if (st->bad) return 0;
  if (!m) {
    if (st->got != st->total || st->total == 0 || dpc_crc32c(0, st->buf, st->total) != st->crc) {
      rpc_call_finish(c, RPC_DATA_LOSS, "upload incomplete or corrupted");
      return 0;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/uploaded.safetensors", g_dir);
    dpc_write_file_atomic(path, st->buf, st->total);
    Dipaco__V1__UploadInitialModelResponse r = DIPACO__V1__UPLOAD_INITIAL_MODEL_RESPONSE__INIT;
    r.upload_id = 55;
    r.bytes = st->total;
    r.crc32c = st->crc;
    rpc_call_reply(c, &r.base);
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(m, &ch) || ch.payload != DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS ||
      ch.offset != st->got || (st->buf && ch.total != st->total) || ch.total > (64u << 20)) {
    st->bad = 1;
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "bad chunk");
    return 0;
  }
  if (!st->buf) {
    st->total = ch.total;
    st->buf = malloc(ch.total ? ch.total : 1);
  }
  rpc_chunk_copy(m, &ch, st->buf + ch.offset);
  st->got += ch.len;
  if (st->got == st->total) st->crc = ch.crc32c;
  return 0;
}

static void upload_done(struct rpc_call *c, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  upload_state *st = rpc_call_data(c);
  if (st) free(st->buf);
  free(st);
}

/* ---- ExportPath (server-streaming) ---- */

typedef struct {
  int mode;          /* 0 good, 1 corrupt CRC, 2 truncated after config */
  int part;          /* 0 config, 1 weights, 2 finished */
  uint64_t off, version;
} export_state;

static void export_next(struct rpc_call *c) {
  export_state *st = rpc_call_data(c);
  if (st->part == 1 && st->mode == 2) st->part = 2;
  if (st->part == 2) {
    rpc_call_finish(c, RPC_OK, NULL);
    return;
  }
  const uint8_t *data = st->part == 0 ? g_cfg : g_st;
  size_t total = st->part == 0 ? g_cfg_len : g_st_len;
  struct rpc_chunk h;
  memset(&h, 0, sizeof h);
  h.payload = st->part == 0 ? DIPACO__V1__PAYLOAD__PAYLOAD_CONFIG_JSON : DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS;
  h.version = st->version;
  h.offset = st->off;
  h.total = total;
  h.len = total - st->off < EXPORT_CHUNK ? total - st->off : EXPORT_CHUNK;
  if (st->off + h.len == total) {
    h.crc32c = dpc_crc32c(0, data, total);
    if (st->part == 1 && st->mode == 1) h.crc32c ^= 0x10u;
    st->part++;
    st->off = 0;
  } else {
    st->off += h.len;
  }
  rpc_call_send(c, rpc_chunk_encode(&h, data + h.offset, NULL, NULL));
}

static void export_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!authorized(c)) return;
  Dipaco__V1__ExportPathRequest *r = (Dipaco__V1__ExportPathRequest *)unpack(c, req, &dipaco__v1__export_path_request__descriptor);
  if (!r) return;
  if (!find_job(r->job_id)) {
    rpc_call_finish(c, RPC_NOT_FOUND, "job %llu does not exist", (unsigned long long)r->job_id);
  } else if (r->path > 2) {
    rpc_call_finish(c, RPC_NOT_FOUND, "job %llu has no path %u", (unsigned long long)r->job_id, r->path);
  } else {
    export_state *st = calloc(1, sizeof *st);
    st->mode = (int)r->path;
    st->version = r->version ? r->version : 3;
    rpc_call_set_data(c, st);
    export_next(c);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void export_sent(struct rpc_call *c, int ok, void *ud) {
  (void)ud;
  if (ok) export_next(c);
}

static void export_done(struct rpc_call *c, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  free(rpc_call_data(c));
}

/* ---- setup ---- */

static int make_model(void) {
  gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 64, .n_positions = 32, .vocab_size = 96};
  gpt_layout *lay = malloc(sizeof *lay);
  if (!lay || gpt_layout_build(&cfg, lay)) return 1;
  float *p = malloc(lay->n_params * sizeof *p);
  gpt_init_params(lay, p, 5);
  char dir[PATH_MAX], f[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/served", g_dir);
  int rc = modeldir_save(dir, &cfg, p);
  free(p);
  free(lay);
  if (rc) return 1;
  snprintf(f, sizeof f, "%s/%s", dir, MODELDIR_CONFIG);
  if (dpc_read_file(f, 1 << 20, (void **)&g_cfg, &g_cfg_len)) return 1;
  snprintf(f, sizeof f, "%s/%s", dir, MODELDIR_WEIGHTS);
  if (dpc_read_file(f, 1 << 30, (void **)&g_st, &g_st_len)) return 1;
  static const char spec[] =
      "{\"name\":\"alpha\",\"model\":{\"n_layer\":2,\"n_head\":2,\"n_embd\":64,\"n_positions\":32,"
      "\"vocab_size\":96,\"seed\":4},\"data\":{\"train\":[\"train.bin\"]},\"algorithm\":\"diloco\","
      "\"replicas\":2,\"inner_steps\":3,\"rounds\":3,\"batch\":4,\"seq_len\":16,"
      "\"inner\":{\"lr\":0.00125,\"warmup\":2,\"weight_decay\":0.05},"
      "\"outer\":{\"lr\":0.65,\"momentum\":0.85}}";
  jobspec *js = malloc(sizeof *js);
  rc = jobspec_parse(spec, strlen(spec), js) || jobspec_to_json(js, &g_spec);
  if (rc) fprintf(stderr, "fake spec: %s\n", dpc_errmsg());
  free(js);
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_ctl_admin_fake DIR [--token TOKEN]\n");
    return 2;
  }
  g_dir = argv[1];
  if (argc == 4 && strcmp(argv[2], "--token") == 0) g_token = argv[3];
  if (make_model()) {
    fprintf(stderr, "test_ctl_admin_fake: cannot build the served model: %s\n", dpc_errmsg());
    return 1;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
#define A(name) "/dipaco.v1.Admin/" name
  struct rpc_method methods[] = {
      {A("ListJobs"), RPC_UNARY, list_jobs, NULL, NULL, NULL, NULL},
      {A("GetJob"), RPC_UNARY, job_call, NULL, NULL, NULL, NULL},
      {A("PauseJob"), RPC_UNARY, job_call, NULL, NULL, NULL, NULL},
      {A("ResumeJob"), RPC_UNARY, job_call, NULL, NULL, NULL, NULL},
      {A("CancelJob"), RPC_UNARY, job_call, NULL, NULL, NULL, NULL},
      {A("CreateJob"), RPC_UNARY, create_job, NULL, NULL, NULL, NULL},
      {A("ListWorkers"), RPC_UNARY, list_workers, NULL, NULL, NULL, NULL},
      {A("ListPaths"), RPC_UNARY, list_paths, NULL, NULL, NULL, NULL},
      {A("ListModules"), RPC_UNARY, list_modules, NULL, NULL, NULL, NULL},
      {A("UploadInitialModel"), RPC_CLIENT_STREAM, upload_call, upload_message, NULL, upload_done, NULL},
      {A("ExportPath"), RPC_SERVER_STREAM, export_call, NULL, export_sent, export_done, NULL},
  };
  struct rpc_server_config cfg = {.addr = "127.0.0.1:0"};
  struct rpc_server *srv = NULL;
  if (rpc_server_start(&cfg, methods, sizeof methods / sizeof methods[0], &srv)) {
    fprintf(stderr, "test_ctl_admin_fake: %s\n", dpc_errmsg());
    return 1;
  }
  printf("PORT %d\n", rpc_server_port(srv));
  fflush(stdout);
  char buf[256];
  while (read(0, buf, sizeof buf) > 0) {
  }
  rpc_server_stop(srv, 1000);
  free(g_cfg);
  free(g_st);
  free(g_spec);
  return 0;
}
