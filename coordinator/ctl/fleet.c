/* fleet.c — the admin commands that show the fleet and a job's layout: workers (every
 * worker and what it trains), paths (each path's modules, replica slots, data — with its size
 * under --data-dir — and recent loss), modules (each module's fragments and versions and the
 * paths that share it) and status (health plus job and worker counts). */
#include "coordinator/ctl/commands.h"
#include "coordinator/ctl/view.h"
#include "proto/health.pb-c.h"

#include "common/errors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEALTH_CHECK "/grpc.health.v1.Health/Check"

static void json_worker(FILE *f, const Dipaco__V1__WorkerInfo *w) {
  fprintf(f, "{\"worker_id\":%llu,\"hostname\":", (unsigned long long)w->worker_id);
  view_jstr(f, w->hostname);
  fputs(",\"backend\":", f);
  view_jstr(f, w->backend);
  fputs(",\"device\":", f);
  view_jstr(f, w->device);
  fprintf(f, ",\"state\":\"%s\",\"lease_id\":%llu,\"job_id\":%llu,", view_worker_state_name(w->state),
          (unsigned long long)w->lease_id, (unsigned long long)w->job_id);
  if (w->slot) fprintf(f, "\"slot\":{\"path\":%u,\"replica\":%u}", w->slot->path, w->slot->replica);
  else fputs("\"slot\":null", f);
  fputs(",\"steps_per_sec\":", f);
  view_jnum(f, w->steps_per_sec);
  fprintf(f, ",\"last_heartbeat_unix_ms\":%lld,\"registered_unix_ms\":%lld,\"labels\":",
          (long long)w->last_heartbeat_unix_ms, (long long)w->registered_unix_ms);
  view_jstr(f, w->labels);
  fputc('}', f);
}

int cmd_workers(actx *a, const admin_args *o, char **pos, int npos) {
  (void)pos;
  const int all = o->all;
  const long job = o->job;
  if (npos != 0) return conn_usage(a, "takes no arguments%s", "");
  if (job < 0) return conn_usage(a, "--job must be a job id%s", "");
  Dipaco__V1__ListWorkersResponse **pages = NULL;
  int np = 0;
  int rc = conn_list_workers(a, all, (uint64_t)job, &pages, &np);
  if (rc) return conn_fail(a, ADMIN "ListWorkers", rc);
  if (a->json) {
    fputs("{\"workers\":[", stdout);
    int first = 1;
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < pages[p]->n_workers; i++) {
        if (!first) fputc(',', stdout);
        first = 0;
        json_worker(stdout, pages[p]->workers[i]);
      }
    fputs("]}\n", stdout);
  } else {
    printf("%-6s %-20s %-8s %-9s %-6s %-9s %-7s %9s  %-20s %s\n", "ID", "HOST", "BACKEND", "STATE",
           "JOB", "SLOT", "LEASE", "STEPS/S", "HEARTBEAT", "DEVICE");
    for (int p = 0; p < np; p++)
      for (size_t i = 0; i < pages[p]->n_workers; i++) {
        const Dipaco__V1__WorkerInfo *w = pages[p]->workers[i];
        char slot[32] = "-", job_s[24] = "-", lease[24] = "-", sps[32] = "-", t[64];
        if (w->job_id) {
          snprintf(job_s, sizeof job_s, "%llu", (unsigned long long)w->job_id);
          if (w->slot) snprintf(slot, sizeof slot, "p%u/r%u", w->slot->path, w->slot->replica);
        }
        if (w->lease_id) snprintf(lease, sizeof lease, "%llu", (unsigned long long)w->lease_id);
        if (isfinite(w->steps_per_sec) && w->steps_per_sec > 0) snprintf(sps, sizeof sps, "%.2f", w->steps_per_sec);
        printf("%-6llu %-20s %-8s %-9s %-6s %-9s %-7s %9s  %-20s %s\n", (unsigned long long)w->worker_id,
               w->hostname, w->backend, view_worker_state_name(w->state), job_s, slot, lease, sps,
               view_fmt_time(w->last_heartbeat_unix_ms, t, sizeof t), w->device);
      }
  }
  conn_free_workers(pages, np);
  return 0;
}

/* The mean of path p's slots' last losses (NAN when none has one). */
static double path_loss(const Dipaco__V1__PathInfo *p) {
  double sum = 0;
  int n = 0;
  for (size_t k = 0; k < p->n_slots; k++)
    if (isfinite(p->slots[k]->last_loss)) sum += p->slots[k]->last_loss, n++;
  return n ? sum / n : NAN;
}

/* A job's paths, their modules, data (tokens[i] ≥ 0: counted under --data-dir) and replica
 * slots: one JSON document. */
static void paths_json(uint64_t id, const Dipaco__V1__ListPathsResponse *r, const long long *tokens) {
  printf("{\"job_id\":%llu,\"paths\":[", (unsigned long long)id);
  for (size_t i = 0; i < r->n_paths; i++) {
    const Dipaco__V1__PathInfo *p = r->paths[i];
    printf("%s{\"path\":%u,\"data\":[", i ? "," : "", p->path);
    for (size_t k = 0; k < p->n_data; k++) {
      if (k) fputc(',', stdout);
      view_jstr(stdout, p->data[k]);
    }
    fputs("],\"tokens\":", stdout);
    if (tokens && tokens[i] >= 0) printf("%lld", tokens[i]);
    else fputs("null", stdout);
    fputs(",\"loss\":", stdout);
    view_jnum(stdout, path_loss(p));
    fputs(",\"modules\":[", stdout);
    for (size_t k = 0; k < p->n_modules; k++) printf("%s%llu", k ? "," : "", (unsigned long long)p->modules[k]);
    fputs("],\"slots\":[", stdout);
    for (size_t k = 0; k < p->n_slots; k++) {
      const Dipaco__V1__SlotInfo *s = p->slots[k];
      printf("%s{\"path\":%u,\"replica\":%u,\"worker_id\":%llu,\"lease_id\":%llu,\"step\":%llu,"
             "\"last_loss\":", k ? "," : "", s->slot ? s->slot->path : p->path,
             s->slot ? s->slot->replica : 0, (unsigned long long)s->worker_id,
             (unsigned long long)s->lease_id, (unsigned long long)s->step);
      view_jnum(stdout, s->last_loss);
      fputc('}', stdout);
    }
    fputs("]}", stdout);
  }
  fputs("]}\n", stdout);
}

/* A job's paths, their modules and replica slots: a text table; then each path's data, its
 * size (with --data-dir) and the mean of its slots' last losses. */
static void paths_text(const Dipaco__V1__ListPathsResponse *r, const long long *tokens) {
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
             w, l, (unsigned long long)s->step, view_fmt_loss(s->last_loss, loss, sizeof loss));
    }
  }
  printf("\n%-5s %-12s %-9s %s\n", "PATH", "TOKENS", "LOSS", "DATA");
  for (size_t i = 0; i < r->n_paths; i++) {
    const Dipaco__V1__PathInfo *p = r->paths[i];
    char tok[24] = "-", loss[32];
    if (tokens && tokens[i] >= 0) snprintf(tok, sizeof tok, "%lld", tokens[i]);
    printf("%-5u %-12s %-9s ", p->path, tok, view_fmt_loss(path_loss(p), loss, sizeof loss));
    for (size_t k = 0; k < p->n_data; k++) printf("%s%s", k ? " " : "", p->data[k]);
    printf("%s\n", p->n_data ? "" : "-");
  }
}

/* Each path's tokens under --data-dir (the data a worker with that directory would read);
 * NULL without it. 0, or 1 with the error reported. */
static int count_tokens(actx *a, const char *dir, const Dipaco__V1__ListPathsResponse *r, long long **out) {
  *out = NULL;
  if (!dir) return 0;
  long long *t = calloc(r->n_paths + 1, sizeof *t);
  if (!t) return conn_fail(a, NULL, DPC_ENOMEM);
  for (size_t i = 0; i < r->n_paths; i++) {
    const Dipaco__V1__PathInfo *p = r->paths[i];
    char field[40];
    snprintf(field, sizeof field, "path %u", p->path);
    dataset *ds = NULL;
    int rc = ctl_open_data(dir, (const char *const *)p->data, (int)p->n_data, field, &ds);
    if (rc) {
      free(t);
      return conn_fail(a, NULL, rc);
    }
    t[i] = (long long)dataset_num_tokens(ds);
    dataset_close(ds);
  }
  *out = t;
  return 0;
}

int cmd_paths(actx *a, const admin_args *o, char **pos, int npos) {
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  Dipaco__V1__ListPathsRequest req = DIPACO__V1__LIST_PATHS_REQUEST__INIT;
  req.job_id = id;
  ProtobufCMessage *pm = NULL;
  int rc = conn_call(a, ADMIN "ListPaths", &req.base, &dipaco__v1__list_paths_response__descriptor, &pm, 0);
  if (rc) return conn_fail(a, ADMIN "ListPaths", rc);
  Dipaco__V1__ListPathsResponse *r = (Dipaco__V1__ListPathsResponse *)pm;
  long long *tokens = NULL;
  if (count_tokens(a, o->data_dir, r, &tokens)) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return 1;
  }
  if (a->json) paths_json(id, r, tokens);
  else paths_text(r, tokens);
  free(tokens);
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

/* A job's modules and their fragments: one JSON document. */
static void modules_json(uint64_t id, const Dipaco__V1__ListModulesResponse *r) {
  printf("{\"job_id\":%llu,\"modules\":[", (unsigned long long)id);
  for (size_t i = 0; i < r->n_modules; i++) {
    const Dipaco__V1__ModuleInfo *m = r->modules[i];
    printf("%s{\"module_id\":%llu,\"level\":%u,\"index\":%u,\"num_floats\":%llu,\"paths\":[",
           i ? "," : "", (unsigned long long)m->module_id, m->level, m->index,
           (unsigned long long)m->num_floats);
    for (size_t k = 0; k < m->n_paths; k++) printf("%s%u", k ? "," : "", m->paths[k]);
    fputs("],\"fragments\":[", stdout);
    for (size_t k = 0; k < m->n_fragments; k++) {
      const Dipaco__V1__FragmentInfo *g = m->fragments[k];
      printf("%s{\"fragment_id\":%llu,\"module_id\":%llu,\"level\":%u,\"index\":%u,\"version\":%llu,"
             "\"offset_floats\":%llu,\"num_floats\":%llu,\"crc32c\":\"%08x\",\"sync_offset\":%u,"
             "\"overlap_steps\":%u,\"merge_alpha\":", k ? "," : "", (unsigned long long)g->fragment_id,
             (unsigned long long)g->module_id, g->level, g->index, (unsigned long long)g->version,
             (unsigned long long)g->offset_floats, (unsigned long long)g->num_floats, g->crc32c,
             g->sync_offset, g->overlap_steps);
      view_jnum(stdout, g->merge_alpha);
      printf(",\"updated_unix_ms\":%llu}", (unsigned long long)g->updated_unix_ms);
    }
    fputs("]}", stdout);
  }
  fputs("]}\n", stdout);
}

/* A job's modules and their fragments: a text table. */
static void modules_text(const Dipaco__V1__ListModulesResponse *r) {
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
             view_fmt_time((int64_t)g->updated_unix_ms, t, sizeof t));
    }
  }
  printf("\n%-7s %-6s %-6s %s\n", "MODULE", "LEVEL", "INDEX", "PATHS (sharing it: its deltas are averaged over them)");
  for (size_t i = 0; i < r->n_modules; i++) {
    const Dipaco__V1__ModuleInfo *m = r->modules[i];
    printf("%-7llu %-6u %-6u ", (unsigned long long)m->module_id, m->level, m->index);
    for (size_t k = 0; k < m->n_paths; k++) printf("%s%u", k ? "," : "", m->paths[k]);
    printf("%s\n", m->n_paths ? "" : "-");
  }
}

int cmd_modules(actx *a, const admin_args *o, char **pos, int npos) {
  (void)o;
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  Dipaco__V1__ListModulesRequest req = DIPACO__V1__LIST_MODULES_REQUEST__INIT;
  req.job_id = id;
  ProtobufCMessage *pm = NULL;
  int rc = conn_call(a, ADMIN "ListModules", &req.base, &dipaco__v1__list_modules_response__descriptor, &pm, 0);
  if (rc) return conn_fail(a, ADMIN "ListModules", rc);
  Dipaco__V1__ListModulesResponse *r = (Dipaco__V1__ListModulesResponse *)pm;
  if (a->json) modules_json(id, r);
  else modules_text(r);
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

/* What `status` reports: health and the jobs and workers per state (index = proto enum). */
typedef struct {
  const char *health;
  size_t jobs[7], njobs;
  size_t workers[5], nworkers;
} fleet_status;

/* Fills st from Health/Check, every job and every worker; returns 0 or the exit status. */
static int gather_status(actx *a, fleet_status *st) {
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hreq.service = "";
  ProtobufCMessage *pm = NULL;
  int rc = conn_call(a, HEALTH_CHECK, &hreq.base, &grpc__health__v1__health_check_response__descriptor, &pm, 0);
  if (rc) return conn_fail(a, HEALTH_CHECK, rc);
  int serving = ((Grpc__Health__V1__HealthCheckResponse *)pm)->status;
  protobuf_c_message_free_unpacked(pm, NULL);
  st->health = serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? "SERVING"
               : serving == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING ? "NOT_SERVING"
               : "UNKNOWN";
  Dipaco__V1__ListJobsResponse **pages = NULL;
  int np = 0;
  rc = conn_list_jobs(a, 0, &pages, &np);
  if (rc) return conn_fail(a, ADMIN "ListJobs", rc);
  for (int p = 0; p < np; p++)
    for (size_t i = 0; i < pages[p]->n_jobs; i++) {
      int s = pages[p]->jobs[i]->state;
      st->jobs[s >= 0 && s < 7 ? s : 0]++;
      st->njobs++;
    }
  conn_free_jobs(pages, np);
  Dipaco__V1__ListWorkersResponse **wpages = NULL;
  int nwp = 0;
  rc = conn_list_workers(a, 1, 0, &wpages, &nwp);
  if (rc) return conn_fail(a, ADMIN "ListWorkers", rc);
  for (int p = 0; p < nwp; p++)
    for (size_t i = 0; i < wpages[p]->n_workers; i++) {
      int s = wpages[p]->workers[i]->state;
      st->workers[s >= 0 && s < 5 ? s : 0]++;
      st->nworkers++;
    }
  conn_free_workers(wpages, nwp);
  return 0;
}

int cmd_status(actx *a, const admin_args *o, char **pos, int npos) {
  (void)o;
  (void)pos;
  if (npos != 0) return conn_usage(a, "takes no arguments%s", "");
  fleet_status st = {0};
  int rc = gather_status(a, &st);
  if (rc) return rc;
  static const char *const jn[7] = {"unspecified", "pending", "running", "paused", "done", "cancelled", "failed"};
  static const char *const wn[5] = {"unspecified", "idle", "training", "draining", "gone"};
  if (a->json) {
    fputs("{\"coordinator\":", stdout);
    view_jstr(stdout, a->addr);
    printf(",\"health\":\"%s\",\"jobs\":{\"total\":%zu", st.health, st.njobs);
    for (int i = 1; i < 7; i++) printf(",\"%s\":%zu", jn[i], st.jobs[i]);
    printf("},\"workers\":{\"total\":%zu", st.nworkers);
    for (int i = 1; i < 5; i++) printf(",\"%s\":%zu", wn[i], st.workers[i]);
    fputs("}}\n", stdout);
  } else {
    printf("%-12s %s %s\n", "coordinator", a->addr, st.health);
    printf("%-12s %zu (", "jobs", st.njobs);
    for (int i = 1; i < 7; i++) printf("%s%s %zu", i > 1 ? ", " : "", jn[i], st.jobs[i]);
    printf(")\n%-12s %zu (", "workers", st.nworkers);
    for (int i = 1; i < 5; i++) printf("%s%s %zu", i > 1 ? ", " : "", wn[i], st.workers[i]);
    printf(")\n");
  }
  return strcmp(st.health, "SERVING") == 0 ? 0 : 1;
}
