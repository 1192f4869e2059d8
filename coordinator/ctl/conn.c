/* conn.c — the admin commands' connection (address, per-call timeout, TLS, bearer token),
 * their unary calls and job paging, and how they report failures (conn.h). */
#include "coordinator/ctl/conn.h"
#include "common/auth.h"
#include "common/errors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_COORDINATOR "127.0.0.1:7070"
#define DEFAULT_TIMEOUT_MS 30000
#define LIST_PAGE 100
#define LIST_MAX_PAGES 10000
#define WORKERS_PAGE 1000

/* $DIPACO_CTL_TIMEOUT_MS, else the default; returns 0, or 2 after a message. */
static int call_timeout(actx *a) {
  a->timeout_ms = DEFAULT_TIMEOUT_MS;
  const char *t = getenv("DIPACO_CTL_TIMEOUT_MS");
  if (!t || !t[0]) return 0;
  char *end = NULL;
  long v = strtol(t, &end, 10);
  if (*end || v < 1 || v > 3600000) {
    fprintf(stderr, "dipacoctl %s: $DIPACO_CTL_TIMEOUT_MS must be 1..3600000, got '%s'\n", a->cmd, t);
    return 2;
  }
  a->timeout_ms = (int)v;
  return 0;
}

/* Sends tok (up to its first line end) as "authorization: Bearer TOKEN"; returns 0 or 2. */
static int set_bearer(actx *a, const char *tok) {
  char bearer[1024];
  size_t tl = strcspn(tok, "\r\n");
  if (tl > 900) {
    fprintf(stderr, "dipacoctl %s: $DIPACO_ADMIN_TOKEN is longer than 900 bytes\n", a->cmd);
    return 2;
  }
  snprintf(bearer, sizeof bearer, "Bearer %.*s", (int)tl, tok);
  if (rpc_client_set_md(a->cli, RPC_MD_AUTHORIZATION, bearer) != 0) {
    fprintf(stderr, "dipacoctl %s: $DIPACO_ADMIN_TOKEN: %s\n", a->cmd, dpc_errmsg());
    return 2;
  }
  return 0;
}

int conn_open(actx *a, const char *coordinator, const conn_flags *f) {
  a->cli = NULL;
  a->addr = f->coordinator ? f->coordinator : coordinator && coordinator[0] ? coordinator : DEFAULT_COORDINATOR;
  if (call_timeout(a)) return 2;
  const struct rpc_tls *tls = &f->tls;
  int use_tls = tls->ca_file || tls->cert_file || tls->key_file;
  if (use_tls && (!tls->ca_file || !tls->cert_file != !tls->key_file)) {
    fprintf(stderr, "dipacoctl %s: TLS needs --tls-ca FILE (and --tls-cert with --tls-key for mutual TLS)\n", a->cmd);
    return 2;
  }
  char file_tok[DPC_TOKEN_MAX + 1] = "";
  if (f->token_file && dpc_token_read_file(f->token_file, file_tok, sizeof file_tok)) {
    fprintf(stderr, "dipacoctl %s: --token-file: %s\n", a->cmd, dpc_errmsg());
    return 2;
  }
  struct rpc_client_config cc = {.target = a->addr, .max_msg_bytes = 0, .own_connection = 0,
                                 .tls = use_tls ? tls : NULL};
  int rc = rpc_client_open(&cc, &a->cli);
  if (rc) {
    a->cli = NULL;
    return conn_fail(a, NULL, rc);
  }
  const char *tok = f->token_file ? file_tok : getenv("DIPACO_ADMIN_TOKEN");
  if (tok && tok[0] && set_bearer(a, tok)) {
    conn_close(a);
    return 2;
  }
  return 0;
}

void conn_close(actx *a) {
  rpc_client_close(a->cli);
  a->cli = NULL;
}

int conn_call(actx *a, const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
              ProtobufCMessage **resp, int timeout_ms) {
  return rpc_unary(a->cli, method, req, desc, resp, timeout_ms > 0 ? timeout_ms : a->timeout_ms);
}


int conn_list_jobs(actx *a, int state, Dipaco__V1__ListJobsResponse ***out, int *npages) {
  Dipaco__V1__ListJobsResponse **pages = NULL;
  int np = 0, rc = 0;
  uint64_t after = 0;
  for (int k = 0; k < LIST_MAX_PAGES; k++) {
    Dipaco__V1__ListJobsRequest req = DIPACO__V1__LIST_JOBS_REQUEST__INIT;
    req.state = state;
    req.limit = LIST_PAGE;
    req.after_job_id = after;
    ProtobufCMessage *pm = NULL;
    rc = conn_call(a, ADMIN "ListJobs", &req.base, &dipaco__v1__list_jobs_response__descriptor, &pm, 0);
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
    conn_free_jobs(pages, np);
    return rc;
  }
  *out = pages;
  *npages = np;
  return 0;
}

void conn_free_jobs(Dipaco__V1__ListJobsResponse **pages, int np) {
  for (int i = 0; i < np; i++) protobuf_c_message_free_unpacked(&pages[i]->base, NULL);
  free(pages);
}

int conn_list_workers(actx *a, int include_gone, uint64_t job, Dipaco__V1__ListWorkersResponse ***out, int *npages) {
  Dipaco__V1__ListWorkersResponse **pages = NULL;
  int np = 0, rc = 0;
  char token[64] = "";
  for (int k = 0; k < LIST_MAX_PAGES; k++) {
    Dipaco__V1__ListWorkersRequest req = DIPACO__V1__LIST_WORKERS_REQUEST__INIT;
    req.include_gone = include_gone != 0;
    req.job_id = job;
    req.page_size = WORKERS_PAGE;
    req.page_token = token;
    ProtobufCMessage *pm = NULL;
    rc = conn_call(a, ADMIN "ListWorkers", &req.base, &dipaco__v1__list_workers_response__descriptor, &pm, 0);
    if (rc) break;
    Dipaco__V1__ListWorkersResponse *r = (Dipaco__V1__ListWorkersResponse *)pm;
    void *grown = realloc(pages, (size_t)(np + 1) * sizeof *pages);
    if (!grown) {
      protobuf_c_message_free_unpacked(pm, NULL);
      rc = dpc_err(DPC_ENOMEM, "out of memory listing workers");
      break;
    }
    pages = grown;
    pages[np++] = r;
    /* No token ends the listing; so does a token that does not move (a server that ignores
     * page_token must not make us loop) or one too long to be ours. */
    const char *t = r->next_page_token ? r->next_page_token : "";
    if (!t[0] || strcmp(t, token) == 0 || strlen(t) >= sizeof token) break;
    snprintf(token, sizeof token, "%s", t);
  }
  if (rc) {
    conn_free_workers(pages, np);
    return rc;
  }
  *out = pages;
  *npages = np;
  return 0;
}

void conn_free_workers(Dipaco__V1__ListWorkersResponse **pages, int np) {
  for (int i = 0; i < np; i++) protobuf_c_message_free_unpacked(&pages[i]->base, NULL);
  free(pages);
}

int conn_fail(const actx *a, const char *method, int rc) {
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

int conn_usage(const actx *a, const char *fmt, const char *arg) {
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

int conn_job_id_arg(const actx *a, char **pos, int npos, uint64_t *id) {
  if (npos != 1) return conn_usage(a, "expects one argument, the job id%s", "");
  if (parse_id(pos[0], id)) return conn_usage(a, "job id must be a positive integer, got '%s'", pos[0]);
  return 0;
}
