/* test_rpc_pyserver.c — a tiny server on the gRPC call layer for tests/oracle/rpc_grpcio.py:
 * serves Health/Check (built in) and dipaco.v1.Admin/ListJobs (returns `limit` jobs with ids
 * after after_job_id, named "job-<id>", state JOB_RUNNING; needs metadata
 * "authorization: Bearer t0ken"), prints "PORT <n>" on stdout once listening, and shuts
 * down cleanly on SIGTERM (exit status 0). */
#include "common/errors.h"
#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static void list_jobs(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  char auth[64];
  if (rpc_call_md(c, RPC_MD_AUTHORIZATION, auth, sizeof auth) < 0 ||
      strcmp(auth, "Bearer t0ken") != 0) {
    rpc_call_finish(c, RPC_PERMISSION_DENIED, "admin token required");
    return;
  }
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__list_jobs_request__descriptor, 1024, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__ListJobsRequest *r = (Dipaco__V1__ListJobsRequest *)pm;
  if (r->limit > 16) {
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "limit %u exceeds 16", r->limit);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  Dipaco__V1__JobSummary js[16], *jp[16];
  char names[16][32];
  for (uint32_t i = 0; i < r->limit; i++) {
    dipaco__v1__job_summary__init(&js[i]);
    js[i].job_id = r->after_job_id + 1 + i;
    snprintf(names[i], sizeof names[i], "job-%llu", (unsigned long long)js[i].job_id);
    js[i].name = names[i];
    js[i].state = DIPACO__V1__JOB_STATE__JOB_RUNNING;
    js[i].last_loss = 2.5f;
    jp[i] = &js[i];
  }
  Dipaco__V1__ListJobsResponse resp = DIPACO__V1__LIST_JOBS_RESPONSE__INIT;
  resp.n_jobs = r->limit;
  resp.jobs = jp;
  rpc_call_reply(c, &resp.base);
  protobuf_c_message_free_unpacked(pm, NULL);
}

int main(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  struct rpc_method m = {.path = "/dipaco.v1.Admin/ListJobs", .kind = RPC_UNARY,
                         .on_call = list_jobs};
  struct rpc_server_config cfg = {.addr = "127.0.0.1:0"};
  struct rpc_server *s;
  if (rpc_server_start(&cfg, &m, 1, &s)) {
    fprintf(stderr, "test_rpc_pyserver: %s\n", dpc_errmsg());
    return 1;
  }
  printf("PORT %d\n", rpc_server_port(s));
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  rpc_server_stop(s, 1000);
  return 0;
}
