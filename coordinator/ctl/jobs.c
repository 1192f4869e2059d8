/* jobs.c — the `dipacoctl job` commands but export: create, list, show, pause, resume,
 * cancel, wait and ledger (commands.h).
 *
 * Job specs are validated here with coordinator/jobspec.h before anything is sent. A spec
 * with "model": {"init": DIR} (DIR relative to the spec file's directory, or absolute) is
 * resolved against DIR/config.json, so the spec sent to CreateJob is the canonical form
 * carrying both "init" (made absolute) and the shape; DIR is loaded with modeldir_load,
 * re-serialised as a canonical F32 safetensors file and uploaded with UploadInitialModel.
 * With --data-dir DIR, every path's training data (data.paths[p], or data.train) is resolved
 * under DIR as a worker with that --data-dir would, and must match files that hold at least
 * one batch (B·T + 1 tokens) and no token outside the vocabulary. */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "coordinator/ctl/commands.h"
#include "coordinator/ctl/ctl.h"
#include "coordinator/ctl/view.h"
#include "coordinator/jobspec.h"
#include "common/dataset.h"
#include "kernels/modeldir.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SPEC_MAX_BYTES (1u << 20)

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
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
 * directory, removed at once) and free them: *out maps the file's pages, so the upload holds
 * one copy of the model in memory, not two (a 7B model's F32 weights are 28 GiB). The
 * directory is under $TMPDIR, else /var/tmp, not /tmp: /tmp is often a tmpfs, whose pages
 * are memory again. Unmap *out with munmap(*out, *n). */
static int safetensors_map(const gpt_config *cfg, float *params, void **out, size_t *n) {
  const char *tmp = getenv("TMPDIR");
  char dir[PATH_MAX], f1[PATH_MAX + 32], f2[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/dipacoctl-upload-XXXXXX", tmp && tmp[0] ? tmp : "/var/tmp");
  if (!mkdtemp(dir)) {
    free(params);
    return dpc_err(dpc_errno_code(errno), "%s: cannot create: %s", dir, strerror(errno));
  }
  snprintf(f1, sizeof f1, "%s/%s", dir, MODELDIR_WEIGHTS);
  snprintf(f2, sizeof f2, "%s/%s", dir, MODELDIR_CONFIG);
  int rc = modeldir_save(dir, cfg, params);
  free(params);
  int fd = rc == 0 ? open(f1, O_RDONLY | O_CLOEXEC) : -1;
  struct stat st;
  if (rc == 0 && (fd < 0 || fstat(fd, &st) != 0))
    rc = dpc_err(dpc_errno_code(errno), "%s: %s", f1, strerror(errno));
  if (rc == 0 && (st.st_size < 8 || (uint64_t)st.st_size > MODEL_MAX_BYTES))
    rc = dpc_err(DPC_EFORMAT, "%s: %lld bytes, not a model of at most %llu", f1, (long long)st.st_size,
                 (unsigned long long)MODEL_MAX_BYTES);
  void *m = rc == 0 ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (rc == 0 && m == MAP_FAILED) rc = dpc_err(dpc_errno_code(errno), "%s: cannot map: %s", f1, strerror(errno));
  if (fd >= 0) close(fd);
  unlink(f1); /* the mapping keeps the pages until munmap */
  unlink(f2);
  rmdir(dir);
  if (rc) return rc;
  *out = m;
  *n = (size_t)st.st_size;
  return 0;
}

static int upload_model(actx *a, const char *dir, const gpt_config *want, uint64_t *upload_id) {
  gpt_config cfg;
  float *params = NULL;
  void *st = NULL;
  size_t n = 0;
  int rc = modeldir_load(dir, &cfg, &params);
  if (rc) return conn_fail(a, NULL, rc);
  if (memcmp(&cfg, want, sizeof cfg) != 0) {
    free(params);
    fprintf(stderr, "dipacoctl %s: %s: config.json changed while reading it\n", a->cmd, dir);
    return 1;
  }
  rc = safetensors_map(&cfg, params, &st, &n);
  if (rc) return conn_fail(a, NULL, rc);
  struct rpc_chunk hdr;
  memset(&hdr, 0, sizeof hdr);
  hdr.payload = DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS;
  hdr.codec = DIPACO__V1__CODEC__CODEC_FP32;
  ProtobufCMessage *pm = NULL;
  rc = rpc_push(a->cli, ADMIN "UploadInitialModel", &hdr, st, n, 0, STREAM_TIMEOUT_MS,
                &dipaco__v1__upload_initial_model_response__descriptor, &pm);
  uint32_t crc = dpc_crc32c(0, st, n);
  munmap(st, n);
  if (rc) return conn_fail(a, ADMIN "UploadInitialModel", rc);
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

/* "model": {"init": DIR}: resolves DIR against the spec file's directory, makes it absolute
 * in js, validates the spec and uploads the model; returns an exit status (0 uploaded). */
static int resolve_and_upload(actx *a, const char *spec_path, const char *text, size_t n, jobspec *js,
                              uint64_t *upload_id) {
  char base[PATH_MAX], dir[PATH_MAX * 2], real[PATH_MAX];
  dir_of(spec_path, base, sizeof base);
  /* (the outer defaults depend on the model's size, known only now) */
  if (jobspec_resolve_init(js, base) || jobspec_derive_outer(js, text, n)) {
    fprintf(stderr, "dipacoctl %s: %s: %s\n", a->cmd, spec_path, dpc_errmsg());
    return 1;
  }
  if (js->init_dir[0] == '/') snprintf(dir, sizeof dir, "%s", js->init_dir);
  else snprintf(dir, sizeof dir, "%s/%s", base, js->init_dir);
  /* Send the absolute directory: the coordinator runs elsewhere (another cwd). */
  if (realpath(dir, real) && strlen(real) < sizeof js->init_dir)
    memcpy(js->init_dir, real, strlen(real) + 1);
  if (jobspec_validate(js)) {
    fprintf(stderr, "dipacoctl %s: %s: %s\n", a->cmd, spec_path, dpc_errmsg());
    return 1;
  }
  return upload_model(a, dir, &js->model, upload_id);
}

int ctl_open_data(const char *data_dir, const char *const *globs, int n, const char *field, dataset **out) {
  *out = NULL;
  int rc = 0;
  char **files = NULL;
  int nf = 0;
  for (int i = 0; i < n && !rc; i++) {
    char pat[PATH_MAX + JOBSPEC_PATH_MAX + 2];
    snprintf(pat, sizeof pat, "%s/%s", data_dir, globs[i]);
    glob_t g;
    memset(&g, 0, sizeof g);
    if (glob(pat, 0, NULL, &g) != 0 || g.gl_pathc == 0)
      rc = dpc_err(DPC_ENOENT, "%s: \"%s\" matches no file under --data-dir %s", field, globs[i], data_dir);
    char **grown = rc ? NULL : realloc(files, (size_t)(nf + (int)g.gl_pathc) * sizeof *files);
    if (!rc && !grown) rc = dpc_err(DPC_ENOMEM, "out of memory");
    if (!rc) files = grown;
    for (size_t k = 0; !rc && k < g.gl_pathc; k++)
      if (!(files[nf++] = strdup(g.gl_pathv[k]))) rc = dpc_err(DPC_ENOMEM, "out of memory");
    globfree(&g);
  }
  if (!rc) rc = dataset_open((const char *const *)files, nf, out);
  for (int i = 0; i < nf; i++) free(files[i]);
  free(files);
  return rc;
}

/* Path `path`'s data under data_dir: files exist, one batch fits, tokens in the vocabulary. */
static int check_path_data(const jobspec *js, int path, const char *data_dir) {
  const char(*d)[JOBSPEC_PATH_MAX] = NULL;
  int n = jobspec_path_data(js, path, &d), rc = n < 0 ? n : 0;
  char field[48];
  if (js->n_data_paths) snprintf(field, sizeof field, "data.paths[%d]", path);
  else snprintf(field, sizeof field, "data.train");
  const char *globs[JOBSPEC_MAX_PATH_GLOBS + JOBSPEC_MAX_DATA];
  if (n > (int)(sizeof globs / sizeof globs[0])) n = (int)(sizeof globs / sizeof globs[0]);
  for (int i = 0; i < n; i++) globs[i] = d[i];
  dataset *ds = NULL;
  if (!rc) rc = ctl_open_data(data_dir, globs, n, field, &ds);
  if (!rc && js->has_shape) rc = dataset_check_vocab(ds, js->model.vocab_size);
  if (!rc && dataset_num_batches(ds, js->batch, js->seq_len) < 1)
    rc = dpc_err(DPC_ERANGE, "%s: path %d's data holds %llu tokens, less than one batch of batch x seq_len + 1 = %lld; "
                 "give the path more data (or a smaller batch or seq_len)", field, path,
                 (unsigned long long)dataset_num_tokens(ds), (long long)js->batch * js->seq_len + 1);
  dataset_close(ds);
  return rc;
}

static int check_data(actx *a, const char *spec_path, const jobspec *js, const char *data_dir) {
  int paths = js->n_data_paths ? js->n_data_paths : 1;
  for (int p = 0; p < paths; p++)
    if (check_path_data(js, p, data_dir)) {
      fprintf(stderr, "dipacoctl %s: %s: %s\n", a->cmd, spec_path, dpc_errmsg());
      return 1;
    }
  return 0;
}

int cmd_job_create(actx *a, const admin_args *o, char **pos, int npos) {
  if (npos != 1) return conn_usage(a, "expects one argument, the job spec file%s", "");
  const char *spec_path = pos[0];
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(spec_path, SPEC_MAX_BYTES, &buf, &n);
  if (rc) return conn_fail(a, NULL, rc);
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
  if (o->data_dir) {
    /* On a copy resolved for its shape (the vocabulary check); nothing is uploaded yet. */
    jobspec *cp = malloc(sizeof *cp);
    int bad = 1;
    if (cp) {
      *cp = *js;
      char base[PATH_MAX];
      dir_of(spec_path, base, sizeof base);
      if (cp->init_dir[0] && jobspec_resolve_init(cp, base)) cp->has_shape = 0;
      bad = check_data(a, spec_path, cp, o->data_dir);
      free(cp);
    }
    if (bad) goto out;
  }
  if (js->init_dir[0] && (status = resolve_and_upload(a, spec_path, buf, n, js, &upload_id))) goto out;
  status = 1;
  if (jobspec_to_json(js, &canon)) {
    conn_fail(a, NULL, DPC_ENOMEM);
    goto out;
  }
  Dipaco__V1__CreateJobRequest req = DIPACO__V1__CREATE_JOB_REQUEST__INIT;
  req.name = js->name;
  req.spec_json = canon;
  req.initial_upload_id = upload_id;
  req.start_paused = o->paused != 0;
  ProtobufCMessage *pm = NULL;
  /* Creating a job from uploaded weights reads them and writes them into the version-0 blobs
   * (fsync'd) before the answer: minutes for a multi-GB model on a slow disk. */
  rc = conn_call(a, ADMIN "CreateJob", &req.base, &dipaco__v1__job__descriptor, &pm,
                 upload_id && a->timeout_ms < CREATE_UPLOAD_TIMEOUT_MS ? CREATE_UPLOAD_TIMEOUT_MS : 0);
  if (rc) {
    conn_fail(a, ADMIN "CreateJob", rc);
    goto out;
  }
  Dipaco__V1__Job *j = (Dipaco__V1__Job *)pm;
  if (a->json) view_print_job(a->json, j);
  else printf("%llu\n", (unsigned long long)view_job_summary(j)->job_id);
  protobuf_c_message_free_unpacked(pm, NULL);
  status = 0;
out:
  free(canon);
  free(js);
  free(buf);
  return status;
}

int cmd_job_list(actx *a, const admin_args *o, char **pos, int npos) {
  (void)pos;
  const char *state_s = o->state;
  if (npos != 0) return conn_usage(a, "takes no arguments%s", "");
  int state = 0;
  if (state_s && (state = view_job_state_parse(state_s)) < 0)
    return conn_usage(a, "--state: unknown state '%s' (pending, running, paused, done, cancelled, failed)", state_s);
  Dipaco__V1__ListJobsResponse **pages = NULL;
  int np = 0;
  int rc = conn_list_jobs(a, state, &pages, &np);
  if (rc) return conn_fail(a, ADMIN "ListJobs", rc);
  if (a->json) {
    fputs("{\"jobs\":[", stdout);
    int first = 1;
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < pages[p]->n_jobs; i++) {
        fputs(first ? "{" : ",{", stdout);
        view_summary_fields(stdout, pages[p]->jobs[i]);
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
               s->name, view_job_state_name(s->state), view_algorithm_name(s->algorithm), round, s->paths,
               s->replicas, s->active_leases, view_fmt_loss(s->last_loss, loss, sizeof loss),
               view_fmt_time(s->updated_unix_ms, t, sizeof t));
      }
  }
  conn_free_jobs(pages, np);
  return 0;
}

static int get_job(actx *a, const char *method, uint64_t id, const char *reason, int timeout_ms,
                   Dipaco__V1__Job **out) {
  Dipaco__V1__JobRequest req = DIPACO__V1__JOB_REQUEST__INIT;
  req.job_id = id;
  req.reason = (char *)(reason ? reason : "");
  return conn_call(a, method, &req.base, &dipaco__v1__job__descriptor, (ProtobufCMessage **)out, timeout_ms);
}

/* job show | pause | resume | cancel */
static int job_simple(actx *a, const char *method, char **pos, int npos, const char *reason) {
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  Dipaco__V1__Job *j = NULL;
  int rc = get_job(a, method, id, reason, 0, &j);
  if (rc) return conn_fail(a, method, rc);
  if (a->json || strcmp(method, ADMIN "GetJob") == 0) view_print_job(a->json, j);
  else printf("job %llu %s\n", (unsigned long long)id, view_job_state_name(view_job_summary(j)->state));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  return 0;
}

int cmd_job_show(actx *a, const admin_args *o, char **pos, int npos) {
  (void)o;
  return job_simple(a, ADMIN "GetJob", pos, npos, NULL);
}

int cmd_job_pause(actx *a, const admin_args *o, char **pos, int npos) {
  return job_simple(a, ADMIN "PauseJob", pos, npos, o->reason);
}

int cmd_job_resume(actx *a, const admin_args *o, char **pos, int npos) {
  return job_simple(a, ADMIN "ResumeJob", pos, npos, o->reason);
}

int cmd_job_cancel(actx *a, const admin_args *o, char **pos, int npos) {
  return job_simple(a, ADMIN "CancelJob", pos, npos, o->reason);
}

/* ------------------------------------------------------------------ job ledger ---- */

/* The delta ledger (GetMetrics series staleness / ledger_lease / ledger_replica /
 * ledger_missed / ledger_dropped): one line per applied delta in applied order: version
 * produced, lease, path, replica, base version, staleness, fragment — the slots each round
 * merged; then, for sync jobs, one "missed" line per slot a closed round expected and closed
 * without (deadline or quorum grace): version produced, path, replica, fragment; then a summary
 * line ("summary: N deltas, staleness mean M max X, D dropped, K missed"). --json:
 * {"deltas": [...], "missed": [...], "summary": {...}}. The server sends each delta's three
 * points one after another (a sync round's deltas share version and fragment, so the points
 * are paired by position). */
int cmd_job_ledger(actx *a, const admin_args *o, char **pos, int npos) {
  (void)o;
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  Dipaco__V1__GetMetricsRequest req = DIPACO__V1__GET_METRICS_REQUEST__INIT;
  char *names[5] = {"staleness", "ledger_lease", "ledger_replica", "ledger_missed", "ledger_dropped"};
  req.job_id = id;
  req.n_names = 5;
  req.names = names;
  req.limit = 100000;
  Dipaco__V1__GetMetricsResponse *r = NULL;
  int rc = conn_call(a, ADMIN "GetMetrics", &req.base, &dipaco__v1__get_metrics_response__descriptor,
                 (ProtobufCMessage **)&r, 0);
  if (rc) return conn_fail(a, ADMIN "GetMetrics", rc);
  if (!a->json) printf("version lease path replica base staleness fragment\n");
  else printf("{\"deltas\":[");
  long long n = 0;
  double st_sum = 0, st_max = 0, dropped = 0;
  for (size_t i = 0; i < r->n_points; i++) {
    const Dipaco__V1__MetricPoint *p = r->points[i];
    if (strcmp(p->name, "ledger_dropped") == 0) dropped += p->value;
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
             "\"fragment\":%llu}", n ? "," : "", (unsigned long long)p->round, lease, p->path, rep,
             (unsigned long long)p->step, p->value, (unsigned long long)p->fragment_id);
    else
      printf("%llu %.0f %d %.0f %llu %.0f %llu\n", (unsigned long long)p->round, lease, p->path, rep,
             (unsigned long long)p->step, p->value, (unsigned long long)p->fragment_id);
    n++;
    st_sum += p->value;
    if (p->value > st_max) st_max = p->value;
  }
  double mean = n ? st_sum / (double)n : 0;
  long long nm = 0;
  if (a->json) printf("],\"missed\":[");
  for (size_t i = 0; i < r->n_points; i++) {
    const Dipaco__V1__MetricPoint *p = r->points[i];
    if (strcmp(p->name, "ledger_missed") != 0) continue;
    if (a->json)
      printf("%s{\"version\":%llu,\"path\":%d,\"replica\":%.0f,\"fragment\":%llu}", nm ? "," : "",
             (unsigned long long)p->round, p->path, p->value, (unsigned long long)p->fragment_id);
    else
      printf("missed: version %llu path %d replica %.0f fragment %llu (the round closed without it)\n",
             (unsigned long long)p->round, p->path, p->value, (unsigned long long)p->fragment_id);
    nm++;
  }
  if (a->json)
    printf("],\"summary\":{\"deltas\":%lld,\"staleness_mean\":%.17g,\"staleness_max\":%.0f,\"dropped\":%.0f,"
           "\"missed\":%lld}}\n", n, mean, st_max, dropped, nm);
  else
    printf("summary: %lld deltas, staleness mean %.3f max %.0f, %.0f dropped, %lld missed\n", n, mean, st_max, dropped,
           nm);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return 0;
}

/* ------------------------------------------------------------------ job wait ---- */

int cmd_job_wait(actx *a, const admin_args *o, char **pos, int npos) {
  const float timeout_s = o->timeout_s;
  const int poll_ms = o->poll_ms;
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  if (timeout_s < 0) return conn_usage(a, "--timeout must be >= 0 seconds (0 = no limit)%s", "");
  if (poll_ms < 10 || poll_ms > 60000) return conn_usage(a, "--poll-ms must be in [10, 60000]%s", "");
  double t0 = dpc_mono_s();
  int last_state = -1, warned = 0, bar = isatty(STDERR_FILENO);
  uint64_t last_round = UINT64_MAX;
  for (;;) {
    double left = timeout_s > 0 ? (double)timeout_s - (dpc_mono_s() - t0) : 1e9;
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
        return conn_fail(a, ADMIN "GetJob", rc);
      if (!warned) fprintf(stderr, "dipacoctl %s: coordinator unreachable (%s); still waiting\n", a->cmd, dpc_errmsg());
      warned = 1;
    } else {
      const Dipaco__V1__JobSummary *s = view_job_summary(j);
      warned = 0;
      if (bar) {
        view_progress_bar(stderr, id, s); /* a terminal: one line redrawn in place */
      } else if ((int)s->state != last_state || s->round != last_round) {
        char loss[32];
        fprintf(stderr, "job %llu: %s round %llu/%llu, %u active leases, loss %s\n",
                (unsigned long long)id, view_job_state_name(s->state), (unsigned long long)s->round,
                (unsigned long long)s->rounds_total, s->active_leases,
                view_fmt_loss(s->last_loss, loss, sizeof loss));
        last_state = (int)s->state;
        last_round = s->round;
      }
      int st = s->state;
      if (st == DIPACO__V1__JOB_STATE__JOB_DONE || st == DIPACO__V1__JOB_STATE__JOB_FAILED ||
          st == DIPACO__V1__JOB_STATE__JOB_CANCELLED) {
        if (bar) fputc('\n', stderr);
        if (a->json) view_print_job(a->json, j);
        else printf("job %llu %s\n", (unsigned long long)id, view_job_state_name(st));
        if (st != DIPACO__V1__JOB_STATE__JOB_DONE)
          fprintf(stderr, "dipacoctl %s: job %llu %s%s%s\n", a->cmd, (unsigned long long)id,
                  view_job_state_name(st), j->message && j->message[0] ? ": " : "", j->message ? j->message : "");
        protobuf_c_message_free_unpacked(&j->base, NULL);
        return st == DIPACO__V1__JOB_STATE__JOB_DONE ? 0 : 1;
      }
      protobuf_c_message_free_unpacked(&j->base, NULL);
    }
    left = timeout_s > 0 ? (double)timeout_s - (dpc_mono_s() - t0) : 1e9;
    if (left <= 0) {
      if (bar) fputc('\n', stderr);
      fprintf(stderr, "dipacoctl %s: timed out after %g s waiting for job %llu (last state %s)\n",
              a->cmd, (double)timeout_s, (unsigned long long)id,
              last_state < 0 ? "unknown" : view_job_state_name(last_state));
      return 3;
    }
    sleep_ms(left * 1000 < poll_ms ? (int)(left * 1000) + 1 : poll_ms);
  }
}

