/* plot.c — `dipacoctl job plot ID --out FILE.svg`: the job's training loss per path as one
 * self-contained SVG file with two charts (commands.h): loss against inner steps, and loss
 * against the bytes the job exchanged (delta bytes pushed + parameter bytes pulled, as sent
 * on the wire), which is how DiLoCo-style runs are compared across codecs and sync rates.
 *
 * From GetMetrics: a point per (path, round) is the mean over the path's replicas of the
 * losses recorded with the round's deltas, at x = (round + 1) · inner_steps (the inner step
 * the round trained up to; inner_steps from the job's spec) and at the job's cumulative bytes
 * through that round (every slot row of rounds <= it). Paths beyond PLOT_MAX_PATHS are left
 * out (said on stderr). Written to a temporary file, then renamed over FILE. */
#include "common/fsutil.h"
#include "common/svgchart.h"
#include "coordinator/ctl/commands.h"
#include "coordinator/ctl/ctl.h"
#include "coordinator/ctl/view.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PLOT_MAX_PATHS 16

typedef struct {
  int64_t round;
  int path;
  double sum;
  int n;
} cell;

static int cell_cmp(const void *a, const void *b) {
  const cell *x = a, *y = b;
  if (x->path != y->path) return x->path < y->path ? -1 : 1;
  return x->round < y->round ? -1 : x->round > y->round;
}

/* inner_steps from the job's spec (JSON), or 0. */
static int spec_inner_steps(const char *spec) {
  cJSON *j = cJSON_Parse(spec ? spec : "");
  const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "inner_steps");
  int v = cJSON_IsNumber(h) && h->valuedouble >= 1 && h->valuedouble <= 1e9 ? (int)h->valuedouble : 0;
  cJSON_Delete(j);
  return v;
}

/* Write the two charts to path (temp file + rename). */
static int write_svg(const char *path, const char *name, uint64_t id, const cell *c, int nc, int64_t max_round,
                     const double *cum, int H) {
  dpc_svg_series s1[PLOT_MAX_PATHS], s2[PLOT_MAX_PATHS];
  char labels[PLOT_MAX_PATHS][24];
  double *buf = malloc(3 * (size_t)(nc ? nc : 1) * sizeof *buf);
  if (!buf) return dpc_err(DPC_ENOMEM, "out of memory");
  double *xs = buf, *xb = buf + nc, *ys = buf + 2 * nc;
  int ns = 0;
  for (int i = 0; i < nc;) {
    int k = i;
    while (k < nc && c[k].path == c[i].path) k++;
    if (ns < PLOT_MAX_PATHS) {
      for (int m = i; m < k; m++) {
        xs[m] = (double)(c[m].round + 1) * H;
        xb[m] = c[m].round <= max_round ? cum[c[m].round] : NAN;
        ys[m] = c[m].sum / c[m].n;
      }
      snprintf(labels[ns], sizeof labels[ns], "path %d", c[i].path);
      s1[ns] = (dpc_svg_series){.x = xs + i, .y = ys + i, .n = k - i, .label = labels[ns]};
      s2[ns] = (dpc_svg_series){.x = xb + i, .y = ys + i, .n = k - i, .label = labels[ns]};
      ns++;
    }
    i = k;
  }
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    free(buf);
    return dpc_err(dpc_errno_code(errno), "%s: cannot write: %s", tmp, strerror(errno));
  }
  char title[512];
  snprintf(title, sizeof title, "job %llu %s: training loss", (unsigned long long)id, name);
  fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" "
        "height=\"620\" viewBox=\"0 0 720 620\">\n<rect width=\"720\" height=\"620\" fill=\"#fafafa\"/>\n<title>",
        f);
  dpc_xml_escape(f, title);
  fputs("</title>\n", f);
  dpc_svg_chart(f, 0, 0, 720, 310, s1, ns, title, "inner steps", "loss");
  dpc_svg_chart(f, 0, 310, 720, 310, s2, ns, NULL, "bytes exchanged (pushed + pulled)", "loss");
  fputs("</svg>\n", f);
  free(buf);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    unlink(tmp);
    return dpc_err(DPC_EIO, "%s: write failed", tmp);
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return dpc_err(dpc_errno_code(e), "%s: cannot rename to %s: %s", tmp, path, strerror(e));
  }
  return 0;
}

int cmd_job_plot(actx *a, const admin_args *o, char **pos, int npos) {
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  if (!o->out || !o->out[0]) return conn_usage(a, "needs --out FILE.svg%s", "");
  Dipaco__V1__JobRequest jr = DIPACO__V1__JOB_REQUEST__INIT;
  jr.job_id = id;
  jr.reason = "";
  Dipaco__V1__Job *j = NULL;
  int rc = conn_call(a, ADMIN "GetJob", &jr.base, &dipaco__v1__job__descriptor, (ProtobufCMessage **)&j, 0);
  if (rc) return conn_fail(a, ADMIN "GetJob", rc);
  int H = spec_inner_steps(j->spec_json);
  Dipaco__V1__GetMetricsRequest req = DIPACO__V1__GET_METRICS_REQUEST__INIT;
  char *names[3] = {"loss", "bytes_in", "bytes_out"};
  req.job_id = id;
  req.n_names = 3;
  req.names = names;
  req.limit = 1000000;
  Dipaco__V1__GetMetricsResponse *r = NULL;
  rc = conn_call(a, ADMIN "GetMetrics", &req.base, &dipaco__v1__get_metrics_response__descriptor,
                 (ProtobufCMessage **)&r, 0);
  if (rc) {
    protobuf_c_message_free_unpacked(&j->base, NULL);
    return conn_fail(a, ADMIN "GetMetrics", rc);
  }
  if (H <= 0) {
    protobuf_c_message_free_unpacked(&j->base, NULL);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    fprintf(stderr, "dipacoctl %s: job %llu: its spec names no inner_steps\n", a->cmd, (unsigned long long)id);
    return 1;
  }
  /* Bytes per round, then cumulative; loss cells per (path, round). */
  int64_t max_round = -1;
  for (size_t i = 0; i < r->n_points; i++)
    if ((int64_t)r->points[i]->round > max_round && r->points[i]->round < (1u << 30))
      max_round = (int64_t)r->points[i]->round;
  double *cum = calloc((size_t)(max_round + 2), sizeof *cum);
  cell *cells = calloc(r->n_points + 1, sizeof *cells);
  int nc = 0, status = 1, paths_seen = 0;
  if (!cum || !cells) {
    conn_fail(a, NULL, DPC_ENOMEM);
    goto out;
  }
  for (size_t i = 0; i < r->n_points; i++) {
    const Dipaco__V1__MetricPoint *p = r->points[i];
    if (p->round >= (1u << 30)) continue;
    if (strcmp(p->name, "loss") != 0) {
      cum[p->round] += p->value;
      continue;
    }
    if (p->path < 0 || !isfinite(p->value)) continue;
    cells[nc++] = (cell){.round = (int64_t)p->round, .path = p->path, .sum = p->value, .n = 1};
  }
  for (int64_t t = 1; t <= max_round; t++) cum[t] += cum[t - 1];
  /* Sort by (path, round), then merge a round's replicas into one cell. */
  qsort(cells, (size_t)nc, sizeof *cells, cell_cmp);
  int m = 0;
  for (int i = 0; i < nc; i++) {
    if (m > 0 && cells[m - 1].path == cells[i].path && cells[m - 1].round == cells[i].round) {
      cells[m - 1].sum += cells[i].sum;
      cells[m - 1].n++;
    } else {
      cells[m++] = cells[i];
    }
  }
  nc = m;
  for (int i = 0; i < nc; i++) paths_seen += i == 0 || cells[i].path != cells[i - 1].path;
  if (paths_seen > PLOT_MAX_PATHS)
    fprintf(stderr, "dipacoctl %s: job %llu has losses on %d paths; plotting the first %d\n", a->cmd,
            (unsigned long long)id, paths_seen, PLOT_MAX_PATHS);
  if ((rc = write_svg(o->out, view_job_summary(j)->name, id, cells, nc, max_round, cum, H)) < 0) {
    conn_fail(a, NULL, rc);
    goto out;
  }
  if (a->json) {
    fputs("{\"out\":", stdout);
    view_jstr(stdout, o->out);
    printf(",\"paths\":%d,\"points\":%d}\n", paths_seen < PLOT_MAX_PATHS ? paths_seen : PLOT_MAX_PATHS, nc);
  } else
    printf("%s: loss of %d path%s, %d points (rounds up to %lld)\n", o->out, paths_seen, paths_seen == 1 ? "" : "s", nc,
           (long long)max_round);
  status = 0;
out:
  free(cum);
  free(cells);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  return status;
}
