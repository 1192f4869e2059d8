/* conn.h — the connection every dipacoctl admin command works through, and how the commands
 * call and report. An actx carries the command's name (for messages), the coordinator's
 * address, the gRPC client and the output mode; the command that opens it (admin.c) closes it.
 *
 * The coordinator address comes from --coordinator (before or after the command),
 * $DIPACO_COORDINATOR, or 127.0.0.1:7070. The admin token (--token-file FILE, else
 * $DIPACO_ADMIN_TOKEN) is sent as "authorization: Bearer TOKEN" on every call. TLS:
 * --tls-ca FILE verifies the coordinator's certificate; --tls-cert/--tls-key add a client
 * certificate (mutual TLS). These flags go before or after the command.
 * $DIPACO_CTL_TIMEOUT_MS bounds each unary call (default 30000).
 * Thread-safety: none (one command, one thread). */
#ifndef DPC_CTL_CONN_H
#define DPC_CTL_CONN_H

#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define ADMIN "/dipaco.v1.Admin/"
#define MODEL_MAX_BYTES ((size_t)1 << 40)    /* 1 TiB: upload / export bound, the coordinator's (admin_upload.c) */
#define STREAM_TIMEOUT_MS (24 * 3600 * 1000) /* bulk transfers: effectively none */
#define CREATE_UPLOAD_TIMEOUT_MS (3600 * 1000) /* CreateJob from an upload (writes the model's blobs) */

typedef struct {
  char cmd[32];      /* "job show", for messages */
  const char *addr;
  struct rpc_client *cli;
  int json;
  int timeout_ms;    /* per unary call */
} actx;

/* The connection flags (given before or after the command). */
typedef struct {
  const char *coordinator; /* --coordinator, or NULL */
  const char *token_file;  /* --token-file, or NULL */
  struct rpc_tls tls;      /* --tls-ca, --tls-cert, --tls-key */
} conn_flags;

/* Opens a->cli to the coordinator (f->coordinator, else `coordinator` from main, else the
 * default) with the timeout, TLS and bearer token the flags and environment ask for; a->cmd
 * and a->json are set by the caller. Returns an exit status: 0 open (close it with
 * conn_close), 1 the client could not be created, 2 a bad flag or variable (message printed). */
int conn_open(actx *a, const char *coordinator, const conn_flags *f);
void conn_close(actx *a);

/* One unary call; timeout_ms 0 = the connection's per-call timeout. */
int conn_call(actx *a, const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
              ProtobufCMessage **resp, int timeout_ms);

/* Every job (paged with after_job_id), filtered by state (0 = all). On success *out holds
 * the pages; free them with conn_free_jobs. */
int conn_list_jobs(actx *a, int state, Dipaco__V1__ListJobsResponse ***out, int *npages);
void conn_free_jobs(Dipaco__V1__ListJobsResponse **pages, int np);

/* Every worker (include_gone: gone ones too; job 0 = any job), following next_page_token.
 * On success *out holds the pages; free them with conn_free_workers. */
int conn_list_workers(actx *a, int include_gone, uint64_t job, Dipaco__V1__ListWorkersResponse ***out, int *npages);
void conn_free_workers(Dipaco__V1__ListWorkersResponse **pages, int np);

/* Print an RPC (method set) or local failure as "dipacoctl CMD: CODE: message" and return 1. */
int conn_fail(const actx *a, const char *method, int rc);

/* Print the usage error "dipacoctl CMD: <fmt with arg> (see 'dipacoctl --help')" and return 2. */
int conn_usage(const actx *a, const char *fmt, const char *arg);

/* The command's one positional argument, a job id (a strict positive decimal): returns 0,
 * or 2 after a usage message. */
int conn_job_id_arg(const actx *a, char **pos, int npos, uint64_t *id);

#endif
