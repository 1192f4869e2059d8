/* statuspage.c — the coordinator's status page and /api/status (statuspage.h): one snapshot
 * built as a cJSON tree from struct coord and the store, printed as JSON or rendered as one
 * self-contained HTML page (tables, progress bars, loss charts as inline SVG).
 *
 * Choices:
 *  - The page and the JSON come from the same tree, so they always agree.
 *  - A loss history point is the mean over a path's replicas of the losses recorded with the
 *    round's deltas, at x = (round + 1) · inner_steps: the inner step the round trained up to.
 *  - Job states use dipacoctl's words (pending, running, paused, done, cancelled, failed). */
#include "coordinator/statuspage.h"

#include "common/errors.h"
#include "common/svgchart.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/blobs.h"
#include "coordinator/blobwatch.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *state_word(store_job_state s) {
  static const char *const w[] = {"pending", "running", "paused", "done", "cancelled", "failed"};
  return (int)s >= 0 && (int)s < 6 ? w[s] : "unknown";
}

static int job_live(const coord_job *j) {
  return j->state == JOB_CREATED || j->state == JOB_RUNNING || j->state == JOB_PAUSED;
}

/* ---- snapshot --------------------------------------------------------------------------------- */

/* {"paths": [{"path": p, "points": [[step, loss], ...]}, ...]} over the job's last
 * STATUSPAGE_HISTORY_ROUNDS rounds; NULL when out of memory or the store fails. */
static cJSON *job_history(coord *c, const coord_job *j, int64_t round) {
  int64_t since = round > STATUSPAGE_HISTORY_ROUNDS ? round - STATUSPAGE_HISTORY_ROUNDS : 0;
  store_metric *ms;
  int nm;
  if (store_list_metrics(c->st, j->id, since, &ms, &nm) < 0) return NULL;
  cJSON *h = cJSON_CreateObject(), *paths = cJSON_AddArrayToObject(h, "paths");
  const int np = j->n_paths < STATUSPAGE_MAX_PATHS ? j->n_paths : STATUSPAGE_MAX_PATHS;
  for (int p = 0; p < np && paths; p++) {
    cJSON *po = cJSON_CreateObject(), *pts = cJSON_AddArrayToObject(po, "points");
    cJSON_AddNumberToObject(po, "path", p);
    cJSON_AddItemToArray(paths, po);
    int64_t cur = -1;
    double sum = 0;
    int cnt = 0;
    for (int i = 0; i <= nm && pts; i++) {
      const int in = i < nm && ms[i].path == p && isfinite(ms[i].loss);
      if ((i == nm || (in && ms[i].round != cur)) && cnt > 0) {
        double xy[2] = {(double)(cur + 1) * j->spec.inner_steps, sum / cnt};
        cJSON_AddItemToArray(pts, cJSON_CreateDoubleArray(xy, 2));
        sum = 0;
        cnt = 0;
      }
      if (!in) continue;
      cur = ms[i].round;
      sum += ms[i].loss;
      cnt++;
    }
  }
  free(ms);
  return h;
}

/* Rounds done as job show counts them: the lowest fragment version (async: applied / slots). */
static int64_t job_round(coord *c, const coord_job *j) {
  store_fragment *fr;
  int nf;
  if (store_list_fragments(c->st, j->id, &fr, &nf) < 0) return 0;
  int64_t mn = nf ? INT64_MAX : 0;
  for (int i = 0; i < nf; i++)
    if (fr[i].version < mn) mn = fr[i].version;
  free(fr);
  if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC && j->n_slots > 0) mn /= j->n_slots;
  return mn;
}

static void add_float_or_null(cJSON *o, const char *k, double v) {
  if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
  else cJSON_AddNullToObject(o, k);
}

static cJSON *job_object(coord *c, const coord_job *j, const store_lease *act, int na, int chart) {
  cJSON *o = cJSON_CreateObject();
  store_job sj;
  memset(&sj, 0, sizeof sj);
  int have = store_get_job(c->st, j->id, &sj) == 0;
  int64_t round = job_round(c, j);
  cJSON_AddNumberToObject(o, "id", (double)j->id);
  cJSON_AddStringToObject(o, "name", have ? sj.name : j->spec.name);
  cJSON_AddStringToObject(o, "state", state_word(j->state));
  cJSON_AddStringToObject(o, "algorithm", jobspec_algorithm_name(j->spec.algorithm));
  cJSON_AddNumberToObject(o, "round", (double)round);
  cJSON_AddNumberToObject(o, "rounds", j->spec.rounds);
  cJSON_AddNumberToObject(o, "paths", j->n_paths);
  cJSON_AddNumberToObject(o, "replicas", j->spec.replicas);
  cJSON_AddNumberToObject(o, "inner_steps", j->spec.inner_steps);
  int leases = 0;
  for (int i = 0; i < na; i++) leases += act[i].job == j->id;
  cJSON_AddNumberToObject(o, "active_leases", leases);
  add_float_or_null(o, "loss", j->last_loss);
  int64_t in = 0, out = 0;
  store_job_traffic(c->st, j->id, &in, &out);
  cJSON_AddNumberToObject(o, "bytes_in", (double)in);
  cJSON_AddNumberToObject(o, "bytes_out", (double)out);
  store_slot *sl;
  int ns;
  double tokens = 0;
  if (store_list_slots(c->st, j->id, &sl, &ns) == 0) {
    for (int i = 0; i < ns; i++) tokens += (double)sl[i].inner_steps * j->spec.batch * j->spec.seq_len;
    free(sl);
  }
  cJSON_AddNumberToObject(o, "tokens", tokens);
  cJSON_AddNumberToObject(o, "created_unix_ms", have ? (double)sj.created_at : 0);
  cJSON_AddNumberToObject(o, "updated_unix_ms", have ? (double)sj.updated_at : 0);
  cJSON_AddStringToObject(o, "message", have && sj.error ? sj.error : "");
  cJSON *pl = cJSON_AddArrayToObject(o, "path_loss");
  for (int p = 0; p < j->n_paths && p < STATUSPAGE_MAX_PATH_ROWS && pl; p++) {
    double v = j->path_loss[p];
    cJSON_AddItemToArray(pl, isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull());
  }
  if (chart) {
    cJSON *h = job_history(c, j, round);
    if (h) cJSON_AddItemToObject(o, "history", h);
  }
  if (have) store_job_clear(&sj);
  return o;
}

static cJSON *worker_object(coord *c, const store_worker *w, const store_lease *act, int na, int64_t now) {
  cJSON *o = cJSON_CreateObject();
  char tmp[sizeof w->info];
  snprintf(tmp, sizeof tmp, "%s", w->info); /* "backend\tdevice\tlabels" (svc_worker.c Register) */
  char *dev = strchr(tmp, '\t'), *labels = NULL;
  if (dev) {
    *dev++ = 0;
    if ((labels = strchr(dev, '\t'))) *labels++ = 0;
  }
  const store_lease *mine = NULL;
  for (int i = 0; i < na; i++)
    if (act[i].worker == w->id) mine = &act[i];
  const char *state = w->state == WORKER_GONE || !lease_worker_alive(c, w, now) ? "gone"
                      : w->state == WORKER_DRAINING                           ? "draining"
                      : mine                                                  ? "training"
                                                                              : "idle";
  cJSON_AddNumberToObject(o, "id", (double)w->id);
  cJSON_AddStringToObject(o, "hostname", w->name);
  cJSON_AddStringToObject(o, "backend", tmp);
  cJSON_AddStringToObject(o, "device", dev ? dev : "");
  cJSON_AddStringToObject(o, "labels", labels ? labels : "");
  cJSON_AddStringToObject(o, "state", state);
  cJSON_AddNumberToObject(o, "steps_per_s", w->steps_per_s);
  cJSON_AddNumberToObject(o, "last_seen_unix_ms", (double)w->last_seen);
  if (mine) {
    cJSON_AddNumberToObject(o, "lease", (double)mine->id);
    cJSON_AddNumberToObject(o, "job", (double)mine->job);
    cJSON_AddNumberToObject(o, "path", mine->path);
    cJSON_AddNumberToObject(o, "replica", mine->replica);
  }
  return o;
}

/* The whole snapshot; NULL when out of memory. */
static cJSON *snapshot(coord *c) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  int64_t now = dpc_wall_ms();
  store_lease *act = NULL;
  int na = 0;
  if (store_list_active_leases(c->st, 0, &act, &na) < 0) act = NULL, na = 0;
  cJSON *co = cJSON_AddObjectToObject(root, "coordinator");
  cJSON_AddNumberToObject(co, "now_unix_ms", (double)now);
  cJSON_AddNumberToObject(co, "started_unix_ms", (double)c->started_ms);
  cJSON_AddNumberToObject(co, "rounds_total", (double)c->rounds_total);
  cJSON_AddNumberToObject(co, "outer_steps_total", (double)c->outer_steps);
  cJSON_AddNumberToObject(co, "bytes_in_total", (double)c->bytes_in);
  cJSON_AddNumberToObject(co, "bytes_out_total", (double)c->bytes_out);
  cJSON_AddNumberToObject(co, "active_leases", na);
  cJSON_AddNumberToObject(co, "jobs_total", c->n_jobs);
  char why[512];
  int64_t since = 0;
  cJSON *bs = cJSON_AddObjectToObject(co, "blob_store");
  int down = blobwatch_down(c, why, sizeof why, &since);
  cJSON_AddStringToObject(bs, "kind", blob_store_is_s3(c->bs) ? "s3" : "local");
  cJSON_AddBoolToObject(bs, "up", !down);
  if (down) {
    cJSON_AddStringToObject(bs, "reason", why);
    cJSON_AddNumberToObject(bs, "down_since_unix_ms", (double)since);
  }
  /* Jobs: STATUSPAGE_MAX_JOBS of them, the live ones first, each group newest first; the
   * first STATUSPAGE_MAX_CHARTS get their loss history. */
  cJSON *jobs = cJSON_AddArrayToObject(root, "jobs");
  int shown = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = c->n_jobs - 1; i >= 0 && shown < STATUSPAGE_MAX_JOBS; i--) {
      const coord_job *j = c->jobs[i];
      if (job_live(j) != (pass == 0)) continue;
      cJSON_AddItemToArray(jobs, job_object(c, j, act, na, shown < STATUSPAGE_MAX_CHARTS));
      shown++;
    }
  cJSON *wa = cJSON_AddArrayToObject(root, "workers");
  store_worker *ws;
  int nw;
  if (store_list_workers(c->st, &ws, &nw) == 0) {
    for (int i = 0; i < nw && i < STATUSPAGE_MAX_WORKERS; i++) cJSON_AddItemToArray(wa, worker_object(c, &ws[i], act, na, now));
    cJSON_AddNumberToObject(co, "workers_total", nw);
    free(ws);
  }
  free(act);
  return root;
}

int statuspage_json(coord *c, char **out, size_t *n) {
  *out = NULL;
  *n = 0;
  cJSON *root = snapshot(c);
  char *s = root ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (!s) return dpc_err(DPC_ENOMEM, "status: out of memory");
  *out = s;
  *n = strlen(s);
  return 0;
}

/* ---- HTML ------------------------------------------------------------------------------------ */

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : "";
}

static void fmt_bytes(FILE *f, double b) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  fprintf(f, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void fmt_loss(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.4f", v);
  else fputs("&ndash;", f);
}

/* The loss chart of one job's history: one line per path, loss against inner step. */
static void svg_chart(FILE *f, const cJSON *hist) {
  const cJSON *paths = cJSON_GetObjectItemCaseSensitive(hist, "paths"), *po;
  dpc_svg_series ser[STATUSPAGE_MAX_PATHS];
  char labels[STATUSPAGE_MAX_PATHS][32];
  double *buf[STATUSPAGE_MAX_PATHS];
  int ns = 0;
  cJSON_ArrayForEach(po, paths) {
    if (ns == STATUSPAGE_MAX_PATHS) break;
    const cJSON *pts = cJSON_GetObjectItemCaseSensitive(po, "points"), *pt;
    int n = cJSON_GetArraySize(pts), i = 0;
    double *xy = malloc(2 * (size_t)(n ? n : 1) * sizeof *xy);
    if (!xy) break;
    cJSON_ArrayForEach(pt, pts) {
      xy[i] = cJSON_GetArrayItem(pt, 0)->valuedouble;
      xy[n + i] = cJSON_GetArrayItem(pt, 1)->valuedouble;
      i++;
    }
    snprintf(labels[ns], sizeof labels[ns], "path %.0f", num(po, "path"));
    buf[ns] = xy;
    ser[ns] = (dpc_svg_series){.x = xy, .y = xy + n, .n = n, .label = labels[ns]};
    ns++;
  }
  fputs("<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"260\" "
        "viewBox=\"0 0 640 260\" role=\"img\" aria-label=\"training loss against inner step\">\n", f);
  dpc_svg_chart(f, 0, 0, 640, 260, ser, ns, NULL, "inner step", "loss");
  fputs("</svg>\n", f);
  for (int i = 0; i < ns; i++) free(buf[i]);
}

static void html_job(FILE *f, const cJSON *j) {
  double round = num(j, "round"), rounds = num(j, "rounds");
  double pct = rounds > 0 ? fmin(100, 100 * round / rounds) : 0;
  fprintf(f, "<section class=\"job\" id=\"job-%.0f\">\n<h2>job %.0f: <span class=\"name\">", num(j, "id"), num(j, "id"));
  dpc_xml_escape(f, str(j, "name"));
  fprintf(f, "</span> <span class=\"state %s\">%s</span></h2>\n", str(j, "state"), str(j, "state"));
  fprintf(f, "<div class=\"bar\"><div style=\"width:%.1f%%\"></div></div>\n", pct);
  fprintf(f, "<p>round <b>%.0f</b> / %.0f (%.0f%%) &middot; %s &middot; %.0f paths &times; %.0f replicas &middot; "
             "%.0f active leases &middot; loss <b>", round, rounds, pct, str(j, "algorithm"), num(j, "paths"),
          num(j, "replicas"), num(j, "active_leases"));
  fmt_loss(f, num(j, "loss"));
  fputs("</b> &middot; ", f);
  fmt_bytes(f, num(j, "bytes_in"));
  fputs(" in, ", f);
  fmt_bytes(f, num(j, "bytes_out"));
  fprintf(f, " out &middot; %.0f tokens</p>\n", num(j, "tokens"));
  if (str(j, "message")[0]) {
    fputs("<p class=\"msg\">", f);
    dpc_xml_escape(f, str(j, "message"));
    fputs("</p>\n", f);
  }
  const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "history");
  if (h) svg_chart(f, h);
  const cJSON *pl = cJSON_GetObjectItemCaseSensitive(j, "path_loss"), *v;
  if (cJSON_GetArraySize(pl) > 1) {
    fputs("<table><tr><th>path</th><th>latest loss</th></tr>\n", f);
    int p = 0;
    cJSON_ArrayForEach(v, pl) {
      fprintf(f, "<tr><td>%d</td><td>", p++);
      fmt_loss(f, cJSON_IsNumber(v) ? v->valuedouble : NAN);
      fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
  }
  fputs("</section>\n", f);
}

static void html_workers(FILE *f, const cJSON *ws, double now) {
  fputs("<h2>workers</h2>\n<table><tr><th>id</th><th>host</th><th>backend</th><th>device</th><th>state</th>"
        "<th>lease (job / path / replica)</th><th>steps/s</th><th>last seen</th></tr>\n", f);
  const cJSON *w;
  cJSON_ArrayForEach(w, ws) {
    fprintf(f, "<tr><td>%.0f</td><td>", num(w, "id"));
    dpc_xml_escape(f, str(w, "hostname"));
    fputs("</td><td>", f);
    dpc_xml_escape(f, str(w, "backend"));
    fputs("</td><td>", f);
    dpc_xml_escape(f, str(w, "device"));
    fprintf(f, "</td><td><span class=\"state %s\">%s</span></td><td>", str(w, "state"), str(w, "state"));
    if (isfinite(num(w, "lease")))
      fprintf(f, "%.0f (%.0f / %.0f / %.0f)", num(w, "lease"), num(w, "job"), num(w, "path"), num(w, "replica"));
    else
      fputs("&ndash;", f);
    fprintf(f, "</td><td>%.2f</td><td>%.0f s ago</td></tr>\n", num(w, "steps_per_s"),
            fmax(0, (now - num(w, "last_seen_unix_ms")) / 1000));
  }
  fputs("</table>\n", f);
}

static const char STYLE[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:20px 28px;color:#222;background:#fafafa}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:20px;margin:22px 0 6px}.name{font-weight:700}"
    ".dim{color:#777}.state{font-size:13px;padding:1px 7px;border-radius:9px;background:#ddd;font-weight:400}"
    ".state.running,.state.training{background:#cfe8cf}.state.failed,.state.gone{background:#f4c7c3}"
    ".state.done{background:#cfdff4}.state.paused,.state.draining{background:#f6e7b4}"
    ".bar{width:640px;height:10px;background:#e6e6e6;border-radius:5px;overflow:hidden}"
    ".bar div{height:100%;background:#3b82c4}table{border-collapse:collapse;margin:6px 0}"
    "td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#eee}"
    ".chart{display:block;margin:8px 0}"
    ".msg{color:#a33}";

int statuspage_html(coord *c, char **out, size_t *n) {
  *out = NULL;
  *n = 0;
  cJSON *root = snapshot(c);
  if (!root) return dpc_err(DPC_ENOMEM, "status: out of memory");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) {
    cJSON_Delete(root);
    return dpc_err(DPC_ENOMEM, "status: out of memory");
  }
  const cJSON *co = cJSON_GetObjectItemCaseSensitive(root, "coordinator");
  double now = num(co, "now_unix_ms");
  fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             "<meta http-equiv=\"refresh\" content=\"%d\"><title>dipaco coordinator</title><style>%s</style>"
             "</head><body>\n", STATUSPAGE_REFRESH_S, STYLE);
  fprintf(f, "<h1>dipaco coordinator</h1>\n<p class=\"dim\">up %.0f s &middot; %.0f rounds closed &middot; "
             "%.0f outer steps &middot; ", (now - num(co, "started_unix_ms")) / 1000, num(co, "rounds_total"),
          num(co, "outer_steps_total"));
  fmt_bytes(f, num(co, "bytes_in_total"));
  fputs(" in, ", f);
  fmt_bytes(f, num(co, "bytes_out_total"));
  fprintf(f, " out &middot; %.0f active leases &middot; refreshes every %d s &middot; "
             "<a href=\"/api/status\">JSON</a> &middot; <a href=\"/metrics\">metrics</a></p>\n",
          num(co, "active_leases"), STATUSPAGE_REFRESH_S);
  const cJSON *bs = cJSON_GetObjectItemCaseSensitive(co, "blob_store");
  if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(bs, "up"))) {
    fprintf(f, "<p class=\"msg\">The blob store is unavailable (for %.0f s): leases and outer steps wait. ",
            (now - num(bs, "down_since_unix_ms")) / 1000);
    dpc_xml_escape(f, str(bs, "reason"));
    fputs("</p>\n", f);
  }
  const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(root, "jobs"), *j;
  if (cJSON_GetArraySize(jobs) == 0) fputs("<p>No jobs yet.</p>\n", f);
  cJSON_ArrayForEach(j, jobs) html_job(f, j);
  html_workers(f, cJSON_GetObjectItemCaseSensitive(root, "workers"), now);
  fputs("</body></html>\n", f);
  int bad = ferror(f);
  fclose(f);
  cJSON_Delete(root);
  if (bad || !buf) {
    free(buf);
    return dpc_err(DPC_ENOMEM, "status: out of memory");
  }
  *out = buf;
  *n = len;
  return 0;
}
