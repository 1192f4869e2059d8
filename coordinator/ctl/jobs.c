/* ctl_admin.c — dipacoctl's admin commands: a gRPC client of dipaco.v1.Admin (and
 * grpc.health.v1.Health) for job create/list/show/pause/resume/cancel/wait/export, workers,
 * paths, modules and status. Output is a human table by default and one JSON document on
 * stdout with --json; errors go to stderr as "dipacoctl CMD: CODE: server message".
 *
 * Exit status: 0 ok, 1 runtime or server error, 2 usage error, 3 `job wait` timed out.
 * The coordinator address comes from --coordinator (before or after the command),
 * $DIPACO_COORDINATOR, or 127.0.0.1:7070. The admin token (--token-file FILE, else
 * $DIPACO_ADMIN_TOKEN) is sent as "authorization: Bearer TOKEN" on every call. TLS:
 * --tls-ca FILE verifies the coordinator's certificate; --tls-cert/--tls-key add a client
 * certificate (mutual TLS). These flags go before or after the command.
 * $DIPACO_CTL_TIMEOUT_MS bounds each unary call
 * (default 30000).
 *
 * Job specs are validated here with coordinator/jobspec.h before anything is sent. A spec
 * with "model": {"init": DIR} (DIR relative to the spec file's directory, or absolute) is
 * resolved against DIR/config.json, so the spec sent to CreateJob is the canonical form
 * carrying both "init" (made absolute) and the shape; DIR is loaded with modeldir_load,
 * re-serialised as a canonical F32 safetensors file and uploaded with UploadInitialModel. */
#include "common/auth.h"
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "kernels/modeldir.h"
#include "common/rpc.h"
#include "coordinator/ctl/ctl.h"
#include "coordinator/jobspec.h"
#include "proto/dipaco.pb-c.h"
#include "proto/health.pb-c.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ADMIN "/dipaco.v1.Admin/"
#define HEALTH_CHECK "/grpc.health.v1.Health/Check"
#define DEFAULT_COORDINATOR "127.0.0.1:7070"
#define DEFAULT_TIMEOUT_MS 30000
#define SPEC_MAX_BYTES (1u << 20)
#define MODEL_MAX_BYTES ((size_t)1 << 36)          /* 64 GiB: upload / export bound */
#define STREAM_TIMEOUT_MS (24 * 3600 * 1000)       /* bulk transfers: effectively none */
#define LIST_PAGE 100
#define LIST_MAX_PAGES 10000

typedef struct {
  char cmd[32];      /* "job show", for messages */
  const char *addr;
  struct rpc_client *cli;
  int json;
  int timeout_ms;    /* per unary call */
} actx;

/* ------------------------------------------------------------------ small helpers ---- */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Print an RPC or local failure as "dipacoctl CMD: CODE: message" and return 1. */
static int fail(const actx *a, const char *method, int rc) {
  const char *msg = dpc_errmsg();
  size_t ml = method ? strlen(method) : 0;
  if (method && strncmp(msg, method, ml) == 0 && msg[ml] == ':' && msg[ml + 1] == ' ') msg += ml + 2;
  if (!msg[0]) msg = dpc_strerror(rc);
  fprintf(stderr, "dipacoctl %s: %s", a->cmd, msg);
  if (method && rpc_last_code() == RPC_UNAVAILABLE)
    fprintf(stderr, " (is a coordinator listening on %s?)", a->addr);
  fputc('\n', stderr);
  return 1;
}

static int usage(const actx *a, const char *fmt, const char *arg) {
  fprintf(stderr, "dipacoctl %s: ", a->cmd);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see 'dipacoctl --help')\n");
  return 2;
}

/* Strict positive decimal id. */
static int parse_id(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v == 0) return -1;
  *out = v;
  return 0;
}

static void jstr(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (*p < 0x20) fprintf(f, "\\u%04x", *p);
      else fputc(*p, f);
    }
  }
  fputc('"', f);
}

/* A float as JSON: non-finite values (NaN = "unknown" loss) become null. */
static void jnum(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.9g", v);
  else fputs("null", f);
}

static const char *fmt_loss(double v, char *buf, size_t cap) {
  if (!isfinite(v) || v == 0) snprintf(buf, cap, "-");
  else snprintf(buf, cap, "%.4f", v);
  return buf;
}

static const char *fmt_time(int64_t unix_ms, char *buf, size_t cap) {
  if (unix_ms <= 0) {
    snprintf(buf, cap, "-");
    return buf;
  }
  time_t t = (time_t)(unix_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

static const char *job_state_name(int s) {
  switch (s) {
  case DIPACO__V1__JOB_STATE__JOB_PENDING: return "PENDING";
  case DIPACO__V1__JOB_STATE__JOB_RUNNING: return "RUNNING";
  case DIPACO__V1__JOB_STATE__JOB_PAUSED: return "PAUSED";
  case DIPACO__V1__JOB_STATE__JOB_DONE: return "DONE";
  case DIPACO__V1__JOB_STATE__JOB_CANCELLED: return "CANCELLED";
  case DIPACO__V1__JOB_STATE__JOB_FAILED: return "FAILED";
  case DIPACO__V1__JOB_STATE__JOB_STATE_UNSPECIFIED: return "UNSPECIFIED";
  default: return "UNKNOWN";
  }
}

static int job_state_parse(const char *s) {
  static const char *const names[] = {"pending", "running", "paused", "done", "cancelled", "failed"};
  for (int i = 0; i < 6; i++)
    if (strcasecmp(s, names[i]) == 0) return i + 1;
  return -1;
}

static const char *algorithm_name(int a) {
  switch (a) {
  case DIPACO__V1__ALGORITHM__ALGORITHM_SYNC: return "sync";
  case DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_DELAYED: return "async-delayed";
  case DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_NESTEROV: return "async-nesterov";
  default: return "unknown";
  }
}

static const char *worker_state_name(int s) {
  switch (s) {
  case DIPACO__V1__WORKER_STATE__WORKER_IDLE: return "IDLE";
  case DIPACO__V1__WORKER_STATE__WORKER_TRAINING: return "TRAINING";
  case DIPACO__V1__WORKER_STATE__WORKER_DRAINING: return "DRAINING";
  case DIPACO__V1__WORKER_STATE__WORKER_GONE: return "GONE";
  case DIPACO__V1__WORKER_STATE__WORKER_STATE_UNSPECIFIED: return "UNSPECIFIED";
  default: return "UNKNOWN";
  }
}

static int unary(actx *a, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp, int timeout_ms) {
  return rpc_unary(a->cli, method, req, desc, resp, timeout_ms > 0 ? timeout_ms : a->timeout_ms);
}

/* ------------------------------------------------------------------ JSON / text views ---- */

static void json_summary_fields(FILE *f, const Dipaco__V1__JobSummary *s) {
  fprintf(f, "\"job_id\":%llu,\"name\":", (unsigned long long)s->job_id);
  jstr(f, s->name);
  fprintf(f, ",\"state\":\"%s\",\"algorithm\":\"%s\",\"round\":%llu,\"rounds_total\":%llu,"
             "\"paths\":%u,\"replicas\":%u,\"active_leases\":%u,\"created_unix_ms\":%lld,"
             "\"updated_unix_ms\":%lld,\"last_loss\":",
          job_state_name(s->state), algorithm_name(s->algorithm), (unsigned long long)s->round,
          (unsigned long long)s->rounds_total, s->paths, s->replicas, s->active_leases,
          (long long)s->created_unix_ms, (long long)s->updated_unix_ms);
  jnum(f, s->last_loss);
}

static const Dipaco__V1__JobSummary *job_summary(const Dipaco__V1__Job *j) {
  static const Dipaco__V1__JobSummary empty = DIPACO__V1__JOB_SUMMARY__INIT;
  return j->summary ? j->summary : &empty;
}

/* One Job as a JSON object: summary fields, message, the spec (canonical object when it
 * parses as a job spec) and spec_json verbatim (a string). */
static void json_job(FILE *f, const Dipaco__V1__Job *j) {
  fputc('{', f);
  json_summary_fields(f, job_summary(j));
  fputs(",\"message\":", f);
  jstr(f, j->message);
  const char *spec = j->spec_json ? j->spec_json : "";
  jobspec *js = malloc(sizeof *js);
  char *canon = NULL;
  if (js && spec[0] && jobspec_parse(spec, strlen(spec), js) == 0 && jobspec_to_json(js, &canon) == 0)
    fprintf(f, ",\"spec\":%s", canon);
  else
    fputs(",\"spec\":null", f);
  fputs(",\"spec_json\":", f);
  jstr(f, spec);
  fputc('}', f);
  free(canon);
  free(js);
}

static void text_spec(FILE *f, const jobspec *js) {
  if (js->init_dir[0]) fprintf(f, "%-18s %s\n", "model.init", js->init_dir);
  if (js->has_shape)
    fprintf(f, "%-18s n_layer %d, n_head %d, n_embd %d, n_positions %d, vocab_size %d\n",
            "model", js->model.n_layer, js->model.n_head, js->model.n_embd, js->model.n_positions,
            js->model.vocab_size);
  if (!js->init_dir[0]) fprintf(f, "%-18s %llu\n", "model.seed", (unsigned long long)js->seed);
  fprintf(f, "%-18s", "data.train");
  for (int i = 0; i < js->n_train; i++) fprintf(f, "%s%s", i ? ", " : " ", js->train[i]);
  fprintf(f, "%s\n%-18s", js->n_train ? "" : " -", "data.val");
  for (int i = 0; i < js->n_val; i++) fprintf(f, "%s%s", i ? ", " : " ", js->val[i]);
  fprintf(f, "%s\n", js->n_val ? "" : " -");
  fprintf(f, "%-18s %s\n", "spec.algorithm", jobspec_algorithm_name(js->algorithm));
  fprintf(f, "%-18s %d\n", "replicas", js->replicas);
  fprintf(f, "%-18s %d\n", "inner_steps", js->inner_steps);
  fprintf(f, "%-18s %d\n", "rounds", js->rounds);
  fprintf(f, "%-18s %d\n", "batch", js->batch);
  fprintf(f, "%-18s %d\n", "seq_len", js->seq_len);
  fprintf(f, "%-18s %.9g\n", "inner.lr", js->inner.lr);
  fprintf(f, "%-18s %d\n", "inner.warmup", js->inner.warmup);
  fprintf(f, "%-18s %.9g\n", "inner.lr_min_frac", js->inner.lr_min_frac);
  fprintf(f, "%-18s %.9g\n", "inner.weight_decay", js->inner.weight_decay);
  fprintf(f, "%-18s %.9g\n", "inner.beta1", js->inner.beta1);
  fprintf(f, "%-18s %.9g\n", "inner.beta2", js->inner.beta2);
  fprintf(f, "%-18s %.9g\n", "inner.eps", js->inner.eps);
  fprintf(f, "%-18s %.9g\n", "inner.grad_clip", js->inner.grad_clip);
  fprintf(f, "%-18s %s\n", "inner.state", jobspec_inner_state_name(js->inner.state));
  fprintf(f, "%-18s %.9g\n", "outer.lr", js->outer.lr);
  fprintf(f, "%-18s %.9g\n", "outer.momentum", js->outer.momentum);
  fprintf(f, "%-18s %s\n", "outer.nesterov", js->outer.nesterov ? "true" : "false");
  if (js->algorithm == JOB_ALGO_DILOCO_ASYNC) {
    static const char *const rules[] = {"delayed-nesterov", "nesterov", "sgd"};
    fprintf(f, "%-18s %s\n", "outer.rule",
            (unsigned)js->outer.async_rule < 3 ? rules[js->outer.async_rule] : "?");
    if (js->outer.buffer > 0) fprintf(f, "%-18s %d\n", "outer.delay_buffer", js->outer.buffer);
    else fprintf(f, "%-18s 0 (= slots)\n", "outer.delay_buffer");
    fprintf(f, "%-18s %.9g\n", "outer.c", js->outer.c);
    fprintf(f, "%-18s %d%s\n", "max_staleness", js->max_staleness, js->max_staleness ? "" : " (no limit)");
    fprintf(f, "%-18s %s, min_steps %d\n", "dylu", js->dylu.enabled ? "on" : "off", js->dylu.min_steps);
  }
  for (int l = 0; l < js->n_levels; l++)
    fprintf(f, "level.%-12d %slayers [%d, %d), %d module%s\n", l, js->levels[l].stem ? "stem + " : "",
            js->levels[l].layer_begin, js->levels[l].layer_end, js->levels[l].n_modules,
            js->levels[l].n_modules == 1 ? "" : "s");
  fprintf(f, "%-18s %.9g\n", "quorum", js->quorum);
  fprintf(f, "%-18s %.9g\n", "round_timeout_s", js->round_timeout_s);
  fprintf(f, "%-18s %s\n", "weighting", js->weighting == WEIGHTING_TOKENS ? "tokens" : "uniform");
}

static void text_job(FILE *f, const Dipaco__V1__Job *j) {
  const Dipaco__V1__JobSummary *s = job_summary(j);
  char b1[64], b2[64], b3[32];
  fprintf(f, "%-18s %llu\n", "job", (unsigned long long)s->job_id);
  fprintf(f, "%-18s %s\n", "name", s->name ? s->name : "");
  fprintf(f, "%-18s %s\n", "state", job_state_name(s->state));
  if (j->message && j->message[0]) fprintf(f, "%-18s %s\n", "message", j->message);
  fprintf(f, "%-18s %s\n", "algorithm", algorithm_name(s->algorithm));
  fprintf(f, "%-18s %llu / %llu\n", "round", (unsigned long long)s->round,
          (unsigned long long)s->rounds_total);
  fprintf(f, "%-18s %u\n", "paths", s->paths);
  fprintf(f, "%-18s %u\n", "active_leases", s->active_leases);
  fprintf(f, "%-18s %s\n", "last_loss", fmt_loss(s->last_loss, b3, sizeof b3));
  fprintf(f, "%-18s %s\n", "created", fmt_time(s->created_unix_ms, b1, sizeof b1));
  fprintf(f, "%-18s %s\n", "updated", fmt_time(s->updated_unix_ms, b2, sizeof b2));
  const char *spec = j->spec_json ? j->spec_json : "";
  jobspec *js = malloc(sizeof *js);
  if (js && spec[0] && jobspec_parse(spec, strlen(spec), js) == 0) text_spec(f, js);
  else if (spec[0]) fprintf(f, "%-18s %s\n", "spec_json", spec);
  free(js);
}

static void print_job(const actx *a, const Dipaco__V1__Job *j) {
  if (a->json) {
    json_job(stdout, j);
    fputc('\n', stdout);
  } else {
    text_job(stdout, j);
  }
}

/* ------------------------------------------------------------------ job create ---- */

/* Directory part of a path ("." when there is none); buf must hold PATH_MAX. */
static void dir_of(const char *path, char *buf, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(buf, cap, ".");
  else if (slash == path) snprintf(buf, cap, "/");
  else snprintf(buf, cap, "%.*s", (int)(slash - path), path);
}

/* Serialise params as the canonical safetensors bytes (modeldir_save into a private temp
 * directory, read back, removed). *out is malloc'd. */
static int safetensors_bytes(const gpt_config *cfg, const float *params, void **out, size_t *n) {
  const char *tmp = getenv("TMPDIR");
  char dir[PATH_MAX], f1[PATH_MAX + 32], f2[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/dipacoctl-upload-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(dir)) return dpc_err(dpc_errno_code(errno), "%s: cannot create: %s", dir, strerror(errno));
  snprintf(f1, sizeof f1, "%s/%s", dir, MODELDIR_WEIGHTS);
  snprintf(f2, sizeof f2, "%s/%s", dir, MODELDIR_CONFIG);
  int rc = modeldir_save(dir, cfg, params);
  if (rc == 0) rc = dpc_read_file(f1, MODEL_MAX_BYTES, out, n);
  unlink(f1);
  unlink(f2);
  rmdir(dir);
  return rc;
}

static int upload_model(actx *a, const char *dir, const gpt_config *want, uint64_t *upload_id) {
  gpt_config cfg;
  float *params = NULL;
  void *st = NULL;
  size_t n = 0;
  int rc = modeldir_load(dir, &cfg, &params);
  if (rc) return fail(a, NULL, rc);
  if (memcmp(&cfg, want, sizeof cfg) != 0) {
    free(params);
    fprintf(stderr, "dipacoctl %s: %s: config.json changed while reading it\n", a->cmd, dir);
    return 1;
  }
  rc = safetensors_bytes(&cfg, params, &st, &n);
  free(params);
  if (rc) return fail(a, NULL, rc);
  struct rpc_chunk hdr;
  memset(&hdr, 0, sizeof hdr);
  hdr.payload = DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS;
  hdr.codec = DIPACO__V1__CODEC__CODEC_FP32;
  ProtobufCMessage *pm = NULL;
  rc = rpc_push(a->cli, ADMIN "UploadInitialModel", &hdr, st, n, 0, STREAM_TIMEOUT_MS,
                &dipaco__v1__upload_initial_model_response__descriptor, &pm);
  uint32_t crc = dpc_crc32c(0, st, n);
  free(st);
  if (rc) return fail(a, ADMIN "UploadInitialModel", rc);
  Dipaco__V1__UploadInitialModelResponse *r = (Dipaco__V1__UploadInitialModelResponse *)pm;
  int bad = r->upload_id == 0 || r->bytes != n || r->crc32c != crc;
  if (bad)
    fprintf(stderr, "dipacoctl %s: the coordinator acknowledged upload %llu with %llu bytes, CRC-32C "
            "%08x; sent %zu bytes, CRC-32C %08x\n", a->cmd, (unsigned long long)r->upload_id,
            (unsigned long long)r->bytes, r->crc32c, n, crc);
  else
    fprintf(stderr, "dipacoctl %s: uploaded %s (%zu bytes, CRC-32C %08x) as upload %llu\n", a->cmd,
            dir, n, crc, (unsigned long long)r->upload_id);
  *upload_id = r->upload_id;
  protobuf_c_message_free_unpacked(pm, NULL);
  return bad ? 1 : 0;
}

static int cmd_job_create(actx *a, char **pos, int npos, int paused) {
  if (npos != 1) return usage(a, "expects one argument, the job spec file%s", "");
  const char *spec_path = pos[0];
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(spec_path, SPEC_MAX_BYTES, &buf, &n);
  if (rc) return fail(a, NULL, rc);
  jobspec *js = malloc(sizeof *js);
  char *canon = NULL;
  int status = 1;
  uint64_t upload_id = 0;
  if (!js) goto out;
  rc = jobspec_parse(buf, n, js);
  if (rc) {
    fprintf(stderr, "dipacoctl %s: %s: %s\n", a->cmd, spec_path, dpc_errmsg());
    goto out;
  }
  if (js->init_dir[0]) {
    char base[PATH_MAX], dir[PATH_MAX * 2], real[PATH_MAX];
    dir_of(spec_path, base, sizeof base);
    rc = jobspec_resolve_init(js, base);
    if (rc) {
      fprintf(stderr, "dipacoctl %s: %s: %s\n", a->cmd, spec_path, dpc_errmsg());
      goto out;
    }
    if (js->init_dir[0] == '/') snprintf(dir, sizeof dir, "%s", js->init_dir);
    else snprintf(dir, sizeof dir, "%s/%s", base, js->init_dir);
    /* Send the absolute directory: the coordinator runs elsewhere (another cwd). */
    if (realpath(dir, real) && strlen(real) < sizeof js->init_dir)
      memcpy(js->init_dir, real, strlen(real) + 1);
    if (jobspec_validate(js)) {
      fprintf(stderr, "dipacoctl %s: %s: %s\n", a->cmd, spec_path, dpc_errmsg());
      goto out;
    }
    status = upload_model(a, dir, &js->model, &upload_id);
    if (status) goto out;
    status = 1;
  }
  if (jobspec_to_json(js, &canon)) {
    fail(a, NULL, DPC_ENOMEM);
    goto out;
  }
  Dipaco__V1__CreateJobRequest req = DIPACO__V1__CREATE_JOB_REQUEST__INIT;
  req.name = js->name;
  req.spec_json = canon;
  req.initial_upload_id = upload_id;
  req.start_paused = paused != 0;
  ProtobufCMessage *pm = NULL;
  rc = unary(a, ADMIN "CreateJob", &req.base, &dipaco__v1__job__descriptor, &pm, 0);
  if (rc) {
    fail(a, ADMIN "CreateJob", rc);
    goto out;
  }
  Dipaco__V1__Job *j = (Dipaco__V1__Job *)pm;
  if (a->json) print_job(a, j);
  else printf("%llu\n", (unsigned long long)job_summary(j)->job_id);
  protobuf_c_message_free_unpacked(pm, NULL);
  status = 0;
out:
  free(canon);
  free(js);
  free(buf);
  return status;
}

/* ------------------------------------------------------------------ job list / show ---- */

/* Every job (paged with after_job_id), filtered by state (0 = all). On success *out holds
 * the pages (caller frees each with protobuf_c_message_free_unpacked and the array). */
static int list_all_jobs(actx *a, int state, Dipaco__V1__ListJobsResponse ***out, int *npages) {
  Dipaco__V1__ListJobsResponse **pages = NULL;
  int np = 0, rc = 0;
  uint64_t after = 0;
  for (int k = 0; k < LIST_MAX_PAGES; k++) {
    Dipaco__V1__ListJobsRequest req = DIPACO__V1__LIST_JOBS_REQUEST__INIT;
    req.state = state;
    req.limit = LIST_PAGE;
    req.after_job_id = after;
    ProtobufCMessage *pm = NULL;
    rc = unary(a, ADMIN "ListJobs", &req.base, &dipaco__v1__list_jobs_response__descriptor, &pm, 0);
    if (rc) break;
    Dipaco__V1__ListJobsResponse *r = (Dipaco__V1__ListJobsResponse *)pm;
    void *grown = realloc(pages, (size_t)(np + 1) * sizeof *pages);
    if (!grown) {
      protobuf_c_message_free_unpacked(pm, NULL);
      rc = dpc_err(DPC_ENOMEM, "out of memory listing jobs");
      break;
    }
    pages = grown;
    pages[np++] = r;
    uint64_t last = after;
    for (size_t i = 0; i < r->n_jobs; i++)
      if (r->jobs[i]->job_id > last) last = r->jobs[i]->job_id;
    /* An empty page ends the listing (a server may cap pages below `limit`); so does a page
     * that does not advance (a server that ignores after_job_id must not make us loop). */
    if (r->n_jobs == 0 || last == after) break;
    after = last;
  }
  if (rc) {
    for (int i = 0; i < np; i++) protobuf_c_message_free_unpacked(&pages[i]->base, NULL);
    free(pages);
    return rc;
  }
  *out = pages;
  *npages = np;
  return 0;
}

static void free_pages(Dipaco__V1__ListJobsResponse **pages, int np) {
  for (int i = 0; i < np; i++) protobuf_c_message_free_unpacked(&pages[i]->base, NULL);
  free(pages);
}

static int cmd_job_list(actx *a, int npos, const char *state_s) {
  if (npos != 0) return usage(a, "takes no arguments%s", "");
  int state = 0;
  if (state_s && (state = job_state_parse(state_s)) < 0)
    return usage(a, "--state: unknown state '%s' (pending, running, paused, done, cancelled, failed)", state_s);
  Dipaco__V1__ListJobsResponse **pages = NULL;
  int np = 0;
  int rc = list_all_jobs(a, state, &pages, &np);
  if (rc) return fail(a, ADMIN "ListJobs", rc);
  if (a->json) {
    fputs("{\"jobs\":[", stdout);
    int first = 1;
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < pages[p]->n_jobs; i++) {
        fputs(first ? "{" : ",{", stdout);
        json_summary_fields(stdout, pages[p]->jobs[i]);
        fputc('}', stdout);
        first = 0;
      }
    fputs("]}\n", stdout);
  } else {
    printf("%-6s %-20s %-10s %-15s %-9s %5s %8s %6s %9s  %s\n", "ID", "NAME", "STATE", "ALGORITHM",
           "ROUND", "PATHS", "REPLICAS", "LEASES", "LOSS", "UPDATED");
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < pages[p]->n_jobs; i++) {
        const Dipaco__V1__JobSummary *s = pages[p]->jobs[i];
        char round[48], loss[32], t[64];
        snprintf(round, sizeof round, "%llu/%llu", (unsigned long long)s->round,
                 (unsigned long long)s->rounds_total);
        printf("%-6llu %-20s %-10s %-15s %-9s %5u %8u %6u %9s  %s\n", (unsigned long long)s->job_id,
               s->name, job_state_name(s->state), algorithm_name(s->algorithm), round, s->paths,
               s->replicas, s->active_leases, fmt_loss(s->last_loss, loss, sizeof loss),
               fmt_time(s->updated_unix_ms, t, sizeof t));
      }
  }
  free_pages(pages, np);
  return 0;
}

static int get_job(actx *a, const char *method, uint64_t id, const char *reason, int timeout_ms,
                   Dipaco__V1__Job **out) {
  Dipaco__V1__JobRequest req = DIPACO__V1__JOB_REQUEST__INIT;
  req.job_id = id;
  req.reason = (char *)(reason ? reason : "");
  return unary(a, method, &req.base, &dipaco__v1__job__descriptor, (ProtobufCMessage **)out, timeout_ms);
}

/* job show | pause | resume | cancel */
static int cmd_job_simple(actx *a, const char *method, char **pos, int npos, const char *reason) {
  uint64_t id;
  if (npos != 1) return usage(a, "expects one argument, the job id%s", "");
  if (parse_id(pos[0], &id)) return usage(a, "job id must be a positive integer, got '%s'", pos[0]);
  Dipaco__V1__Job *j = NULL;
  int rc = get_job(a, method, id, reason, 0, &j);
  if (rc) return fail(a, method, rc);
  if (a->json || strcmp(method, ADMIN "GetJob") == 0) print_job(a, j);
  else printf("job %llu %s\n", (unsigned long long)id, job_state_name(job_summary(j)->state));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  return 0;
}

/* ------------------------------------------------------------------ job ledger ---- */

/* The delta ledger (GetMetrics series staleness / ledger_lease / ledger_replica): one line per
 * applied delta in applied order: version produced, lease, path, replica, base version,
 * staleness, fragment. The server sends each delta's three points one after another (a sync
 * round's deltas share version and fragment, so the points are paired by position). */
static int cmd_job_ledger(actx *a, char **pos, int npos) {
  uint64_t id;
  if (npos != 1) return usage(a, "expects one argument, the job id%s", "");
  if (parse_id(pos[0], &id)) return usage(a, "job id must be a positive integer, got '%s'", pos[0]);
  Dipaco__V1__GetMetricsRequest req = DIPACO__V1__GET_METRICS_REQUEST__INIT;
  char *names[3] = {"staleness", "ledger_lease", "ledger_replica"};
  req.job_id = id;
  req.n_names = 3;
  req.names = names;
  req.limit = 100000;
  Dipaco__V1__GetMetricsResponse *r = NULL;
  int rc = unary(a, ADMIN "GetMetrics", &req.base, &dipaco__v1__get_metrics_response__descriptor,
                 (ProtobufCMessage **)&r, 0);
  if (rc) return fail(a, ADMIN "GetMetrics", rc);
  if (!a->json) printf("version lease path replica base staleness fragment\n");
  else printf("[");
  int first = 1;
  for (size_t i = 0; i < r->n_points; i++) {
    const Dipaco__V1__MetricPoint *p = r->points[i];
    if (strcmp(p->name, "staleness") != 0) continue;
    double lease = -1, rep = -1;
    for (size_t k = i + 1; k < r->n_points && k <= i + 2; k++) {
      const Dipaco__V1__MetricPoint *q = r->points[k];
      if (q->round != p->round || q->fragment_id != p->fragment_id || q->path != p->path) break;
      if (strcmp(q->name, "ledger_lease") == 0) lease = q->value;
      if (strcmp(q->name, "ledger_replica") == 0) rep = q->value;
    }
    if (a->json)
      printf("%s{\"version\":%llu,\"lease\":%.0f,\"path\":%d,\"replica\":%.0f,\"base\":%llu,\"staleness\":%.0f,"
             "\"fragment\":%llu}", first ? "" : ",", (unsigned long long)p->round, lease, p->path, rep,
             (unsigned long long)p->step, p->value, (unsigned long long)p->fragment_id);
    else
      printf("%llu %.0f %d %.0f %llu %.0f %llu\n", (unsigned long long)p->round, lease, p->path, rep,
             (unsigned long long)p->step, p->value, (unsigned long long)p->fragment_id);
    first = 0;
  }
  if (a->json) printf("]\n");
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return 0;
}

/* ------------------------------------------------------------------ job wait ---- */

static int cmd_job_wait(actx *a, char **pos, int npos, float timeout_s, int poll_ms) {
  uint64_t id;
  if (npos != 1) return usage(a, "expects one argument, the job id%s", "");
  if (parse_id(pos[0], &id)) return usage(a, "job id must be a positive integer, got '%s'", pos[0]);
  if (timeout_s < 0) return usage(a, "--timeout must be >= 0 seconds (0 = no limit)%s", "");
  if (poll_ms < 10 || poll_ms > 60000) return usage(a, "--poll-ms must be in [10, 60000]%s", "");
  double t0 = now_s();
  int last_state = -1, warned = 0;
  uint64_t last_round = UINT64_MAX;
  for (;;) {
    double left = timeout_s > 0 ? (double)timeout_s - (now_s() - t0) : 1e9;
    int call_ms = left * 1000 < a->timeout_ms ? (int)(left * 1000) + 1 : a->timeout_ms;
    if (call_ms < 1) call_ms = 1; /* 0 would mean "no deadline" to rpc_unary */
    Dipaco__V1__Job *j = NULL;
    int rc = get_job(a, ADMIN "GetJob", id, NULL, call_ms, &j);
    if (rc) {
      int code = rpc_last_code();
      /* A restarting coordinator is not a failure of the job: keep waiting. (CANCELLED is
       * what a call in flight gets when the coordinator shuts down; this client never
       * cancels its own calls.) */
      if (code != RPC_UNAVAILABLE && code != RPC_DEADLINE_EXCEEDED && code != RPC_CANCELLED)
        return fail(a, ADMIN "GetJob", rc);
      if (!warned) fprintf(stderr, "dipacoctl %s: coordinator unreachable (%s); still waiting\n", a->cmd, dpc_errmsg());
      warned = 1;
    } else {
      const Dipaco__V1__JobSummary *s = job_summary(j);
      warned = 0;
      if ((int)s->state != last_state || s->round != last_round) {
        char loss[32];
        fprintf(stderr, "job %llu: %s round %llu/%llu, %u active leases, loss %s\n",
                (unsigned long long)id, job_state_name(s->state), (unsigned long long)s->round,
                (unsigned long long)s->rounds_total, s->active_leases,
                fmt_loss(s->last_loss, loss, sizeof loss));
        last_state = (int)s->state;
        last_round = s->round;
      }
      int st = s->state;
      if (st == DIPACO__V1__JOB_STATE__JOB_DONE || st == DIPACO__V1__JOB_STATE__JOB_FAILED ||
          st == DIPACO__V1__JOB_STATE__JOB_CANCELLED) {
        if (a->json) print_job(a, j);
        else printf("job %llu %s\n", (unsigned long long)id, job_state_name(st));
        if (st != DIPACO__V1__JOB_STATE__JOB_DONE)
          fprintf(stderr, "dipacoctl %s: job %llu %s%s%s\n", a->cmd, (unsigned long long)id,
                  job_state_name(st), j->message && j->message[0] ? ": " : "", j->message ? j->message : "");
        protobuf_c_message_free_unpacked(&j->base, NULL);
        return st == DIPACO__V1__JOB_STATE__JOB_DONE ? 0 : 1;
      }
      protobuf_c_message_free_unpacked(&j->base, NULL);
    }
    left = timeout_s > 0 ? (double)timeout_s - (now_s() - t0) : 1e9;
    if (left <= 0) {
      fprintf(stderr, "dipacoctl %s: timed out after %g s waiting for job %llu (last state %s)\n",
              a->cmd, (double)timeout_s, (unsigned long long)id,
              last_state < 0 ? "unknown" : job_state_name(last_state));
      return 3;
    }
    sleep_ms(left * 1000 < poll_ms ? (int)(left * 1000) + 1 : poll_ms);
  }
}

/* ------------------------------------------------------------------ job export ---- */

/* One chunked sub-stream of ExportPath being received. */
typedef struct {
  uint32_t payload;
  uint64_t total, got;
  uint32_t crc;
  int done;
} sub_stream;

static int sub_accept(sub_stream *ss, const struct rpc_chunk *c, const char *what, uint64_t max) {
  if (ss->done) return dpc_err(DPC_EFORMAT, "ExportPath: more %s data after its last chunk", what);
  if (ss->got == 0 && c->offset == 0 && ss->total == 0) {
    if (c->total == 0 || c->total > max)
      return dpc_err(DPC_ERANGE, "ExportPath: %s of %llu bytes (expected 1..%llu)", what,
                     (unsigned long long)c->total, (unsigned long long)max);
    ss->total = c->total;
  }
  if (c->offset != ss->got || c->total != ss->total)
    return dpc_err(DPC_EFORMAT, "ExportPath: %s chunk at offset %llu of %llu, expected offset %llu of %llu",
                   what, (unsigned long long)c->offset, (unsigned long long)c->total,
                   (unsigned long long)ss->got, (unsigned long long)ss->total);
  return 0;
}

static int sub_advance(sub_stream *ss, const struct rpc_chunk *c, const void *data, const char *what) {
  ss->crc = dpc_crc32c(ss->crc, data, (size_t)c->len);
  ss->got += c->len;
  if (ss->got == ss->total) {
    if (ss->crc != c->crc32c)
      return dpc_err(DPC_ECHECKSUM, "ExportPath: %s CRC-32C is %08x, the coordinator says %08x; "
                     "nothing was written, export again", what, ss->crc, c->crc32c);
    ss->done = 1;
  }
  return 0;
}

static int export_stream(actx *a, const Dipaco__V1__ExportPathRequest *req, const char *out_dir,
                         uint8_t **cfg_buf, size_t *cfg_len, uint64_t *st_bytes, uint32_t *st_crc,
                         uint64_t *version) {
  char st_path[PATH_MAX + 32];
  snprintf(st_path, sizeof st_path, "%s/%s", out_dir, MODELDIR_WEIGHTS);
  struct rpc_stream *s = NULL;
  dpc_afile *af = NULL;
  uint8_t *scratch = NULL, *cfg = NULL;
  sub_stream sc = {0}, sw = {0};
  int rc = rpc_stream_open(a->cli, ADMIN "ExportPath", &req->base, STREAM_TIMEOUT_MS, &s);
  while (rc == 0) {
    struct grpc_byte_buffer *m = NULL;
    rc = rpc_stream_read(s, &m);
    if (rc <= 0) break;
    struct rpc_chunk c;
    rc = rpc_chunk_parse(m, &c);
    if (rc == 0 && c.payload == DIPACO__V1__PAYLOAD__PAYLOAD_CONFIG_JSON) {
      if (sw.got || sw.done) rc = dpc_err(DPC_EFORMAT, "ExportPath: config.json after the weights");
      if (rc == 0) rc = sub_accept(&sc, &c, "config.json", MODELDIR_MAX_CONFIG);
      if (rc == 0 && !cfg && !(cfg = malloc((size_t)sc.total + 1))) rc = dpc_err(DPC_ENOMEM, "out of memory");
      if (rc == 0) rc = rpc_chunk_copy(m, &c, cfg + c.offset);
      if (rc == 0) rc = sub_advance(&sc, &c, cfg + c.offset, "config.json");
    } else if (rc == 0 && c.payload == DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS) {
      if (!sc.done) rc = dpc_err(DPC_EFORMAT, "ExportPath: weights before a complete config.json");
      if (rc == 0) rc = sub_accept(&sw, &c, "model.safetensors", MODEL_MAX_BYTES);
      if (rc == 0 && !af) rc = dpc_afile_open(st_path, &af);
      void *grown = rc == 0 ? realloc(scratch, c.len ? (size_t)c.len : 1) : NULL;
      if (rc == 0 && !grown) rc = dpc_err(DPC_ENOMEM, "out of memory");
      if (rc == 0) scratch = grown;
      if (rc == 0) rc = rpc_chunk_copy(m, &c, scratch);
      if (rc == 0) rc = sub_advance(&sw, &c, scratch, "model.safetensors");
      if (rc == 0) rc = dpc_afile_write(af, scratch, (size_t)c.len);
      if (rc == 0 && sw.done) *version = c.version;
    } else if (rc == 0) {
      rc = dpc_err(DPC_EFORMAT, "ExportPath: unexpected payload %u", c.payload);
    }
    rpc_msg_free(m);
  }
  if (rc == 0 && !(sc.done && sw.done))
    rc = dpc_err(DPC_EFORMAT, "ExportPath: the stream ended before %s was complete",
                 sc.done ? "model.safetensors" : "config.json");
  const char *method = rc < 0 && rpc_last_code() != RPC_OK ? ADMIN "ExportPath" : NULL;
  rpc_stream_free(s);
  free(scratch);
  if (rc == 0) rc = dpc_afile_commit(af);
  else if (af) dpc_afile_abort(af);
  if (rc) {
    free(cfg);
    return fail(a, method, rc);
  }
  cfg[sc.total] = 0;
  *cfg_buf = cfg;
  *cfg_len = (size_t)sc.total;
  *st_bytes = sw.total;
  *st_crc = sw.crc;
  return 0;
}

static int cmd_job_export(actx *a, char **pos, int npos, int path, long version, const char *out) {
  uint64_t id;
  if (npos != 1) return usage(a, "expects one argument, the job id%s", "");
  if (parse_id(pos[0], &id)) return usage(a, "job id must be a positive integer, got '%s'", pos[0]);
  if (path < 0) return usage(a, "--path must be >= 0%s", "");
  if (version < 0) return usage(a, "--version must be >= 0 (0 = latest)%s", "");
  if (!out[0]) return usage(a, "--out must name a directory%s", "");
  int rc = dpc_mkdir_p(out);
  if (rc) return fail(a, NULL, rc);
  Dipaco__V1__ExportPathRequest req = DIPACO__V1__EXPORT_PATH_REQUEST__INIT;
  req.job_id = id;
  req.path = (uint32_t)path;
  req.version = (uint64_t)version;
  uint8_t *cfg = NULL;
  size_t cfg_len = 0;
  uint64_t st_bytes = 0, got_version = 0;
  uint32_t st_crc = 0;
  if (export_stream(a, &req, out, &cfg, &cfg_len, &st_bytes, &st_crc, &got_version)) return 1;
  char cfg_path[PATH_MAX + 32], st_path[PATH_MAX + 32];
  snprintf(cfg_path, sizeof cfg_path, "%s/%s", out, MODELDIR_CONFIG);
  snprintf(st_path, sizeof st_path, "%s/%s", out, MODELDIR_WEIGHTS);
  rc = dpc_write_file_atomic(cfg_path, cfg, cfg_len);
  free(cfg);
  if (rc) return fail(a, NULL, rc);
  /* The pair must load as a model directory (config and weights agree, values finite). */
  gpt_config mc;
  float *params = NULL;
  rc = modeldir_load(out, &mc, &params);
  if (rc) {
    int st = fail(a, NULL, rc);
    unlink(cfg_path);
    unlink(st_path);
    fprintf(stderr, "dipacoctl %s: removed the unusable export from %s\n", a->cmd, out);
    return st;
  }
  gpt_layout *lay = malloc(sizeof *lay);
  size_t n_params = lay && gpt_layout_build(&mc, lay) == 0 ? lay->n_params : 0;
  free(lay);
  free(params);
  /* The version served: the chunks' when the coordinator sets it, else the one asked for
   * (0 = latest, unknown here). */
  if (got_version == 0) got_version = (uint64_t)version;
  char vbuf[32] = "null";
  if (got_version) snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long)got_version);
  if (a->json) {
    printf("{\"job_id\":%llu,\"path\":%d,\"version\":%s,\"out\":", (unsigned long long)id, path, vbuf);
    jstr(stdout, out);
    printf(",\"config_bytes\":%zu,\"safetensors_bytes\":%llu,\"safetensors_crc32c\":\"%08x\","
           "\"n_params\":%zu,\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"n_positions\":%d,"
           "\"vocab_size\":%d}\n", cfg_len, (unsigned long long)st_bytes, st_crc, n_params,
           mc.n_layer, mc.n_head, mc.n_embd, mc.n_positions, mc.vocab_size);
  } else {
    printf("exported job %llu path %d (%s%s) to %s: %zu parameters, %llu bytes, CRC-32C %08x\n",
           (unsigned long long)id, path, got_version ? "version " : "latest version", got_version ? vbuf : "",
           out, n_params, (unsigned long long)st_bytes, st_crc);
  }
  return 0;
}

/* ------------------------------------------------------------------ workers / paths / modules ---- */

static void json_worker(FILE *f, const Dipaco__V1__WorkerInfo *w) {
  fprintf(f, "{\"worker_id\":%llu,\"hostname\":", (unsigned long long)w->worker_id);
  jstr(f, w->hostname);
  fputs(",\"backend\":", f);
  jstr(f, w->backend);
  fputs(",\"device\":", f);
  jstr(f, w->device);
  fprintf(f, ",\"state\":\"%s\",\"lease_id\":%llu,\"job_id\":%llu,", worker_state_name(w->state),
          (unsigned long long)w->lease_id, (unsigned long long)w->job_id);
  if (w->slot) fprintf(f, "\"slot\":{\"path\":%u,\"replica\":%u}", w->slot->path, w->slot->replica);
  else fputs("\"slot\":null", f);
  fputs(",\"steps_per_sec\":", f);
  jnum(f, w->steps_per_sec);
  fprintf(f, ",\"last_heartbeat_unix_ms\":%lld,\"registered_unix_ms\":%lld,\"labels\":",
          (long long)w->last_heartbeat_unix_ms, (long long)w->registered_unix_ms);
  jstr(f, w->labels);
  fputc('}', f);
}

static int cmd_workers(actx *a, int npos, int all, long job) {
  if (npos != 0) return usage(a, "takes no arguments%s", "");
  if (job < 0) return usage(a, "--job must be a job id%s", "");
  Dipaco__V1__ListWorkersRequest req = DIPACO__V1__LIST_WORKERS_REQUEST__INIT;
  req.include_gone = all != 0;
  req.job_id = (uint64_t)job;
  ProtobufCMessage *pm = NULL;
  int rc = unary(a, ADMIN "ListWorkers", &req.base, &dipaco__v1__list_workers_response__descriptor, &pm, 0);
  if (rc) return fail(a, ADMIN "ListWorkers", rc);
  Dipaco__V1__ListWorkersResponse *r = (Dipaco__V1__ListWorkersResponse *)pm;
  if (a->json) {
    fputs("{\"workers\":[", stdout);
    for (size_t i = 0; i < r->n_workers; i++) {
      if (i) fputc(',', stdout);
      json_worker(stdout, r->workers[i]);
    }
    fputs("]}\n", stdout);
  } else {
    printf("%-6s %-20s %-8s %-9s %-6s %-9s %-7s %9s  %-20s %s\n", "ID", "HOST", "BACKEND", "STATE",
           "JOB", "SLOT", "LEASE", "STEPS/S", "HEARTBEAT", "DEVICE");
    for (size_t i = 0; i < r->n_workers; i++) {
      const Dipaco__V1__WorkerInfo *w = r->workers[i];
      char slot[32] = "-", job_s[24] = "-", lease[24] = "-", sps[32] = "-", t[64];
      if (w->job_id) {
        snprintf(job_s, sizeof job_s, "%llu", (unsigned long long)w->job_id);
        if (w->slot) snprintf(slot, sizeof slot, "p%u/r%u", w->slot->path, w->slot->replica);
      }
      if (w->lease_id) snprintf(lease, sizeof lease, "%llu", (unsigned long long)w->lease_id);
      if (isfinite(w->steps_per_sec) && w->steps_per_sec > 0) snprintf(sps, sizeof sps, "%.2f", w->steps_per_sec);
      printf("%-6llu %-20s %-8s %-9s %-6s %-9s %-7s %9s  %-20s %s\n", (unsigned long long)w->worker_id,
             w->hostname, w->backend, worker_state_name(w->state), job_s, slot, lease, sps,
             fmt_time(w->last_heartbeat_unix_ms, t, sizeof t), w->device);
    }
  }
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

static int cmd_paths(actx *a, char **pos, int npos) {
  uint64_t id;
  if (npos != 1) return usage(a, "expects one argument, the job id%s", "");
  if (parse_id(pos[0], &id)) return usage(a, "job id must be a positive integer, got '%s'", pos[0]);
  Dipaco__V1__ListPathsRequest req = DIPACO__V1__LIST_PATHS_REQUEST__INIT;
  req.job_id = id;
  ProtobufCMessage *pm = NULL;
  int rc = unary(a, ADMIN "ListPaths", &req.base, &dipaco__v1__list_paths_response__descriptor, &pm, 0);
  if (rc) return fail(a, ADMIN "ListPaths", rc);
  Dipaco__V1__ListPathsResponse *r = (Dipaco__V1__ListPathsResponse *)pm;
  if (a->json) {
    printf("{\"job_id\":%llu,\"paths\":[", (unsigned long long)id);
    for (size_t i = 0; i < r->n_paths; i++) {
      const Dipaco__V1__PathInfo *p = r->paths[i];
      printf("%s{\"path\":%u,\"modules\":[", i ? "," : "", p->path);
      for (size_t k = 0; k < p->n_modules; k++) printf("%s%llu", k ? "," : "", (unsigned long long)p->modules[k]);
      fputs("],\"slots\":[", stdout);
      for (size_t k = 0; k < p->n_slots; k++) {
        const Dipaco__V1__SlotInfo *s = p->slots[k];
        printf("%s{\"path\":%u,\"replica\":%u,\"worker_id\":%llu,\"lease_id\":%llu,\"step\":%llu,"
               "\"last_loss\":", k ? "," : "", s->slot ? s->slot->path : p->path,
               s->slot ? s->slot->replica : 0, (unsigned long long)s->worker_id,
               (unsigned long long)s->lease_id, (unsigned long long)s->step);
        jnum(stdout, s->last_loss);
        fputc('}', stdout);
      }
      fputs("]}", stdout);
    }
    fputs("]}\n", stdout);
  } else {
    printf("%-5s %-16s %-8s %-7s %-7s %-10s %s\n", "PATH", "MODULES", "REPLICA", "WORKER", "LEASE",
           "STEP", "LOSS");
    for (size_t i = 0; i < r->n_paths; i++) {
      const Dipaco__V1__PathInfo *p = r->paths[i];
      char mods[128] = "";
      size_t off = 0;
      for (size_t k = 0; k < p->n_modules && off < sizeof mods - 24; k++)
        off += (size_t)snprintf(mods + off, sizeof mods - off, "%s%llu", k ? "," : "",
                                (unsigned long long)p->modules[k]);
      if (p->n_slots == 0) printf("%-5u %-16s %-8s %-7s %-7s %-10s %s\n", p->path, mods, "-", "-", "-", "-", "-");
      for (size_t k = 0; k < p->n_slots; k++) {
        const Dipaco__V1__SlotInfo *s = p->slots[k];
        char w[24] = "-", l[24] = "-", loss[32];
        if (s->worker_id) snprintf(w, sizeof w, "%llu", (unsigned long long)s->worker_id);
        if (s->lease_id) snprintf(l, sizeof l, "%llu", (unsigned long long)s->lease_id);
        printf("%-5u %-16s %-8u %-7s %-7s %-10llu %s\n", p->path, mods, s->slot ? s->slot->replica : 0,
               w, l, (unsigned long long)s->step, fmt_loss(s->last_loss, loss, sizeof loss));
      }
    }
  }
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

static int cmd_modules(actx *a, char **pos, int npos) {
  uint64_t id;
  if (npos != 1) return usage(a, "expects one argument, the job id%s", "");
  if (parse_id(pos[0], &id)) return usage(a, "job id must be a positive integer, got '%s'", pos[0]);
  Dipaco__V1__ListModulesRequest req = DIPACO__V1__LIST_MODULES_REQUEST__INIT;
  req.job_id = id;
  ProtobufCMessage *pm = NULL;
  int rc = unary(a, ADMIN "ListModules", &req.base, &dipaco__v1__list_modules_response__descriptor, &pm, 0);
  if (rc) return fail(a, ADMIN "ListModules", rc);
  Dipaco__V1__ListModulesResponse *r = (Dipaco__V1__ListModulesResponse *)pm;
  if (a->json) {
    printf("{\"job_id\":%llu,\"modules\":[", (unsigned long long)id);
    for (size_t i = 0; i < r->n_modules; i++) {
      const Dipaco__V1__ModuleInfo *m = r->modules[i];
      printf("%s{\"module_id\":%llu,\"level\":%u,\"index\":%u,\"num_floats\":%llu,\"fragments\":[",
             i ? "," : "", (unsigned long long)m->module_id, m->level, m->index,
             (unsigned long long)m->num_floats);
      for (size_t k = 0; k < m->n_fragments; k++) {
        const Dipaco__V1__FragmentInfo *g = m->fragments[k];
        printf("%s{\"fragment_id\":%llu,\"module_id\":%llu,\"level\":%u,\"index\":%u,\"version\":%llu,"
               "\"offset_floats\":%llu,\"num_floats\":%llu,\"crc32c\":\"%08x\",\"sync_offset\":%u,"
               "\"overlap_steps\":%u,\"merge_alpha\":", k ? "," : "", (unsigned long long)g->fragment_id,
               (unsigned long long)g->module_id, g->level, g->index, (unsigned long long)g->version,
               (unsigned long long)g->offset_floats, (unsigned long long)g->num_floats, g->crc32c,
               g->sync_offset, g->overlap_steps);
        jnum(stdout, g->merge_alpha);
        printf(",\"updated_unix_ms\":%llu}", (unsigned long long)g->updated_unix_ms);
      }
      fputs("]}", stdout);
    }
    fputs("]}\n", stdout);
  } else {
    printf("%-7s %-6s %-6s %-12s %-9s %-8s %-12s %-12s %-9s %s\n", "MODULE", "LEVEL", "INDEX", "FLOATS",
           "FRAGMENT", "VERSION", "OFFSET", "LENGTH", "CRC32C", "UPDATED");
    for (size_t i = 0; i < r->n_modules; i++) {
      const Dipaco__V1__ModuleInfo *m = r->modules[i];
      if (m->n_fragments == 0)
        printf("%-7llu %-6u %-6u %-12llu %-9s %-8s %-12s %-12s %-9s %s\n", (unsigned long long)m->module_id,
               m->level, m->index, (unsigned long long)m->num_floats, "-", "-", "-", "-", "-", "-");
      for (size_t k = 0; k < m->n_fragments; k++) {
        const Dipaco__V1__FragmentInfo *g = m->fragments[k];
        char t[64];
        printf("%-7llu %-6u %-6u %-12llu %-9llu %-8llu %-12llu %-12llu %08x  %s\n",
               (unsigned long long)m->module_id, m->level, m->index, (unsigned long long)m->num_floats,
               (unsigned long long)g->fragment_id, (unsigned long long)g->version,
               (unsigned long long)g->offset_floats, (unsigned long long)g->num_floats, g->crc32c,
               fmt_time((int64_t)g->updated_unix_ms, t, sizeof t));
      }
    }
  }
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

/* ------------------------------------------------------------------ status ---- */

static int cmd_status(actx *a, int npos) {
  if (npos != 0) return usage(a, "takes no arguments%s", "");
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hreq.service = "";
  ProtobufCMessage *pm = NULL;
  int rc = unary(a, HEALTH_CHECK, &hreq.base, &grpc__health__v1__health_check_response__descriptor, &pm, 0);
  if (rc) return fail(a, HEALTH_CHECK, rc);
  int serving = ((Grpc__Health__V1__HealthCheckResponse *)pm)->status;
  protobuf_c_message_free_unpacked(pm, NULL);
  const char *health = serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? "SERVING"
                       : serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING ? "NOT_SERVING"
                       : "UNKNOWN";
  Dipaco__V1__ListJobsResponse **pages = NULL;
  int np = 0;
  rc = list_all_jobs(a, 0, &pages, &np);
  if (rc) return fail(a, ADMIN "ListJobs", rc);
  size_t jobs[7] = {0}, njobs = 0;
  for (int p = 0; p < np; p++)
    for (size_t i = 0; i < pages[p]->n_jobs; i++) {
      int s = pages[p]->jobs[i]->state;
      jobs[s >= 0 && s < 7 ? s : 0]++;
      njobs++;
    }
  free_pages(pages, np);
  Dipaco__V1__ListWorkersRequest wreq = DIPACO__V1__LIST_WORKERS_REQUEST__INIT;
  wreq.include_gone = 1;
  rc = unary(a, ADMIN "ListWorkers", &wreq.base, &dipaco__v1__list_workers_response__descriptor, &pm, 0);
  if (rc) return fail(a, ADMIN "ListWorkers", rc);
  Dipaco__V1__ListWorkersResponse *wr = (Dipaco__V1__ListWorkersResponse *)pm;
  size_t workers[5] = {0};
  for (size_t i = 0; i < wr->n_workers; i++) {
    int s = wr->workers[i]->state;
    workers[s >= 0 && s < 5 ? s : 0]++;
  }
  size_t nworkers = wr->n_workers;
  protobuf_c_message_free_unpacked(pm, NULL);
  static const char *const jn[7] = {"unspecified", "pending", "running", "paused", "done", "cancelled", "failed"};
  static const char *const wn[5] = {"unspecified", "idle", "training", "draining", "gone"};
  if (a->json) {
    fputs("{\"coordinator\":", stdout);
    jstr(stdout, a->addr);
    printf(",\"health\":\"%s\",\"jobs\":{\"total\":%zu", health, njobs);
    for (int i = 1; i < 7; i++) printf(",\"%s\":%zu", jn[i], jobs[i]);
    printf("},\"workers\":{\"total\":%zu", nworkers);
    for (int i = 1; i < 5; i++) printf(",\"%s\":%zu", wn[i], workers[i]);
    fputs("}}\n", stdout);
  } else {
    printf("%-12s %s %s\n", "coordinator", a->addr, health);
    printf("%-12s %zu (", "jobs", njobs);
    for (int i = 1; i < 7; i++) printf("%s%s %zu", i > 1 ? ", " : "", jn[i], jobs[i]);
    printf(")\n%-12s %zu (", "workers", nworkers);
    for (int i = 1; i < 5; i++) printf("%s%s %zu", i > 1 ? ", " : "", wn[i], workers[i]);
    printf(")\n");
  }
  return strcmp(health, "SERVING") == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------ dispatch ---- */

static const char *const job_subs[] = {"create", "list", "show", "pause", "resume", "cancel",
                                       "wait", "export", "ledger", NULL};

int ctl_admin(const char *coordinator, int argc, char **argv) {
  actx a;
  memset(&a, 0, sizeof a);
  const char *word = argv[0];
  int is_job = strcmp(word, "job") == 0, skip = 1;
  const char *sub = NULL;
  if (is_job) {
    if (argc < 2) {
      fprintf(stderr, "dipacoctl job: missing subcommand (create, list, show, pause, resume, "
              "cancel, wait, export, ledger)\n");
      return 2;
    }
    sub = argv[1];
    int known = 0;
    for (int i = 0; job_subs[i]; i++) known |= strcmp(sub, job_subs[i]) == 0;
    if (!known) {
      fprintf(stderr, "dipacoctl job: unknown subcommand '%s' (create, list, show, pause, resume, "
              "cancel, wait, export, ledger)\n", sub);
      return 2;
    }
    snprintf(a.cmd, sizeof a.cmd, "job %s", sub);
    skip = 2;
  } else if (strcmp(word, "workers") == 0 || strcmp(word, "paths") == 0 ||
             strcmp(word, "modules") == 0 || strcmp(word, "status") == 0) {
    snprintf(a.cmd, sizeof a.cmd, "%s", word);
  } else {
    fprintf(stderr, "dipacoctl: unknown command '%s' (run 'dipacoctl --help')\n", word);
    return 2;
  }

  int json = 0, paused = 0, all = 0, path = -1, poll_ms = 500;
  long version = 0, job = 0;
  float timeout_s = 0;
  const char *coord_opt = NULL, *state = NULL, *out = NULL, *reason = NULL, *token_file = NULL;
  struct rpc_tls tls = {0};
  ctl_opt opts[] = {{"json", CTL_FLAG, &json, 0, 0},
                    {"coordinator", CTL_STR, &coord_opt, 0, 0},
                    {"token-file", CTL_STR, &token_file, 0, 0},
                    {"tls-ca", CTL_STR, &tls.ca_file, 0, 0},
                    {"tls-cert", CTL_STR, &tls.cert_file, 0, 0},
                    {"tls-key", CTL_STR, &tls.key_file, 0, 0},
                    {"paused", CTL_FLAG, &paused, 0, 0},
                    {"state", CTL_STR, &state, 0, 0},
                    {"reason", CTL_STR, &reason, 0, 0},
                    {"timeout", CTL_FLOAT, &timeout_s, 0, 0},
                    {"poll-ms", CTL_INT, &poll_ms, 0, 0},
                    {"path", CTL_INT, &path, 0, 0},
                    {"out", CTL_STR, &out, 0, 0},
                    {"version", CTL_LONG, &version, 0, 0},
                    {"all", CTL_FLAG, &all, 0, 0},
                    {"job", CTL_LONG, &job, 0, 0},
                    {NULL, CTL_FLAG, NULL, 0, 0}};
  char **pos = NULL;
  int npos = 0;
  int prc = ctl_parse(a.cmd, argc - skip, argv + skip, opts, &pos, &npos);
  if (prc == -1) return 0;
  if (prc) return prc;

  /* Flags that belong to one command only: refuse them elsewhere rather than ignore them. */
  static const struct { const char *flag; const char *cmds; } only[] = {
      {"paused", "job create"}, {"state", "job list"}, {"reason", "job pause|job resume|job cancel"},
      {"timeout", "job wait"}, {"poll-ms", "job wait"}, {"path", "job export"}, {"out", "job export"},
      {"version", "job export"}, {"all", "workers"}, {"job", "workers"}};
  for (size_t k = 0; k < sizeof only / sizeof only[0]; k++) {
    for (ctl_opt *o = opts; o->name; o++) {
      if (!o->seen || strcmp(o->name, only[k].flag) != 0) continue;
      const char *c = only[k].cmds;
      size_t n = strlen(a.cmd);
      int ok = 0;
      for (const char *p = c; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        ok |= len == n && strncmp(p, a.cmd, n) == 0;
        p += len + (bar ? 1 : 0);
      }
      if (!ok) {
        fprintf(stderr, "dipacoctl %s: --%s applies only to %s\n", a.cmd, o->name, c);
        free(pos);
        return 2;
      }
    }
  }
  int is_export = is_job && strcmp(sub, "export") == 0;
  if (is_export && (path < 0 || !out)) {
    fprintf(stderr, "dipacoctl job export: needs --path P and --out DIR\n");
    free(pos);
    return 2;
  }

  a.json = json;
  a.addr = coord_opt ? coord_opt : coordinator && coordinator[0] ? coordinator : DEFAULT_COORDINATOR;
  a.timeout_ms = DEFAULT_TIMEOUT_MS;
  const char *t = getenv("DIPACO_CTL_TIMEOUT_MS");
  if (t && t[0]) {
    char *end = NULL;
    long v = strtol(t, &end, 10);
    if (*end || v < 1 || v > 3600000) {
      fprintf(stderr, "dipacoctl %s: $DIPACO_CTL_TIMEOUT_MS must be 1..3600000, got '%s'\n", a.cmd, t);
      free(pos);
      return 2;
    }
    a.timeout_ms = (int)v;
  }
  if (is_export) rpc_tune_malloc();

  int use_tls = tls.ca_file || tls.cert_file || tls.key_file;
  if (use_tls && (!tls.ca_file || !tls.cert_file != !tls.key_file)) {
    fprintf(stderr, "dipacoctl %s: TLS needs --tls-ca FILE (and --tls-cert with --tls-key for mutual TLS)\n", a.cmd);
    free(pos);
    return 2;
  }
  char file_tok[DPC_TOKEN_MAX + 1] = "";
  if (token_file && dpc_token_read_file(token_file, file_tok, sizeof file_tok)) {
    fprintf(stderr, "dipacoctl %s: --token-file: %s\n", a.cmd, dpc_errmsg());
    free(pos);
    return 2;
  }
  struct rpc_client_config cc = {.target = a.addr, .max_msg_bytes = 0, .own_connection = 0,
                                 .tls = use_tls ? &tls : NULL};
  int rc = rpc_client_open(&cc, &a.cli);
  if (rc) {
    int st = fail(&a, NULL, rc);
    free(pos);
    return st;
  }
  const char *tok = token_file ? file_tok : getenv("DIPACO_ADMIN_TOKEN");
  if (tok && tok[0]) {
    char bearer[1024];
    size_t tl = strcspn(tok, "\r\n");
    if (tl > 900) {
      fprintf(stderr, "dipacoctl %s: $DIPACO_ADMIN_TOKEN is longer than 900 bytes\n", a.cmd);
      rpc_client_close(a.cli);
      free(pos);
      return 2;
    }
    snprintf(bearer, sizeof bearer, "Bearer %.*s", (int)tl, tok);
    if ((rc = rpc_client_set_md(a.cli, RPC_MD_AUTHORIZATION, bearer)) != 0) {
      fprintf(stderr, "dipacoctl %s: $DIPACO_ADMIN_TOKEN: %s\n", a.cmd, dpc_errmsg());
      rpc_client_close(a.cli);
      free(pos);
      return 2;
    }
  }

  int status;
  if (!is_job) {
    if (strcmp(word, "workers") == 0) status = cmd_workers(&a, npos, all, job);
    else if (strcmp(word, "paths") == 0) status = cmd_paths(&a, pos, npos);
    else if (strcmp(word, "modules") == 0) status = cmd_modules(&a, pos, npos);
    else status = cmd_status(&a, npos);
  } else if (strcmp(sub, "create") == 0) status = cmd_job_create(&a, pos, npos, paused);
  else if (strcmp(sub, "list") == 0) status = cmd_job_list(&a, npos, state);
  else if (strcmp(sub, "show") == 0) status = cmd_job_simple(&a, ADMIN "GetJob", pos, npos, NULL);
  else if (strcmp(sub, "ledger") == 0) status = cmd_job_ledger(&a, pos, npos);
  else if (strcmp(sub, "pause") == 0) status = cmd_job_simple(&a, ADMIN "PauseJob", pos, npos, reason);
  else if (strcmp(sub, "resume") == 0) status = cmd_job_simple(&a, ADMIN "ResumeJob", pos, npos, reason);
  else if (strcmp(sub, "cancel") == 0) status = cmd_job_simple(&a, ADMIN "CancelJob", pos, npos, reason);
  else if (strcmp(sub, "wait") == 0) status = cmd_job_wait(&a, pos, npos, timeout_s, poll_ms);
  else status = cmd_job_export(&a, pos, npos, path, version, out);
  fflush(stdout);
  rpc_client_close(a.cli);
  free(pos);
  return status;
}
