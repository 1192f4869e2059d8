/* worker.c — the dipaco-worker lease loop (see worker.h): register, send idle heartbeats, ask
 * for a lease and hand it to lease.c, with retries, re-registration and a clean stop.
 *
 * The protocol it follows — identity, long-polls, pulls, pushes, inner state, heartbeat
 * commands, error handling and SIGTERM — is the worker's side of the wire API in
 * docs/design.md §4 (§4.4 in particular). */
#include "worker/worker.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "worker/client.h"
#include "worker/heartbeat.h"
#include "worker/lease.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  struct worker_opts o;
  worker_ctl *ctl;
  wclient wc;
  int registered;
  int draining;
  int worked;   /* a lease was completed */
  int saw_job;  /* a lease was granted or LEASE_WAIT seen: some job was running */
  int failures; /* Register / Lease calls in a row that failed: the backoff's exponent */
  int64_t last_hb_ms;
  unsigned seed;
  lease_runner lr;      /* one lease at a time, and what carries over between leases */
  char device[96];      /* RegisterRequest.device: what the backend runs on */
  uint64_t device_mem;  /* RegisterRequest.device_memory_bytes */
} worker;

static int do_register(worker *w, int *code) {
  char host[256] = "";
  if (w->o.name) snprintf(host, sizeof host, "%s", w->o.name);
  else if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
  Dipaco__V1__RegisterRequest req = DIPACO__V1__REGISTER_REQUEST__INIT;
  Dipaco__V1__Codec codecs[DPC_CODEC_COUNT + 1];
  size_t n_codecs = 0;
  for (int k = 0; k < DPC_CODEC_COUNT; k++)
    if (dpc_codec_supported(k)) codecs[n_codecs++] = (Dipaco__V1__Codec)k;
  codecs[n_codecs++] = (Dipaco__V1__Codec)DPC_CODEC_SPARSE;
  req.hostname = host;
  req.backend = w->o.backend == GPT_BACKEND_CUDA ? "cuda" : "cpu";
  req.device = w->device;
  req.device_memory_bytes = w->device_mem;
  long nc = sysconf(_SC_NPROCESSORS_ONLN);
  req.threads = (uint32_t)(w->o.threads > 0 ? w->o.threads : (nc > 0 ? nc : 1));
  req.version = "dipaco-worker 0.1";
  req.n_codecs = n_codecs;
  req.codecs = codecs;
  req.labels = (char *)(w->o.labels ? w->o.labels : "");
  uint64_t prev = w->wc.worker_id;
  int rc = wc_register(&w->wc, &req, code);
  if (rc) return rc;
  w->registered = 1;
  w->last_hb_ms = dpc_mono_ms();
  DPC_INFO("registered with %s as worker %" PRIu64 "%s (heartbeat %u ms, lease ttl %u ms, chunk %u bytes)",
           w->o.coordinator, w->wc.worker_id, prev && prev != w->wc.worker_id ? " (new id)" : "", w->wc.heartbeat_ms,
           w->wc.lease_ttl_ms, w->wc.max_chunk_bytes);
  return 0;
}

/* A Register or Lease call failed transiently: back off (from the second UNAVAILABLE on with
 * a fresh channel, see wc_reconnect). */
static void call_failed(worker *w, int code) {
  if (code == RPC_UNAVAILABLE && w->failures >= 1) wc_reconnect(&w->wc, w->o.coordinator);
  worker_sleep(w->ctl, worker_backoff_ms(w->failures++, &w->seed));
}

/* Register when not registered. 0 when registered (or retrying later), a negative DPC_E* code
 * when the coordinator refuses this worker for good. */
static int ensure_registered(worker *w) {
  if (w->registered) return 0;
  int code = RPC_OK, rc = do_register(w, &code);
  if (rc && (code == RPC_UNAUTHENTICATED || code == RPC_PERMISSION_DENIED)) {
    /* A refused join token will be refused again: retrying would only hide a
     * configuration error from the operator (or the container runtime). */
    DPC_ERROR("register with %s refused: %s (check --token-file / $DIPACO_JOIN_TOKEN: it must hold the "
              "coordinator's STATE/join.token)", w->o.coordinator, dpc_errmsg());
    return rc;
  }
  if (rc) {
    DPC_WARN("register with %s failed: %s", w->o.coordinator, dpc_errmsg());
    call_failed(w, code);
  }
  return 0;
}

/* An idle heartbeat when one is due; only its commands matter (the Lease call that follows
 * tells whether the coordinator is up). */
static void idle_heartbeat(worker *w) {
  if (dpc_mono_ms() - w->last_hb_ms < (int64_t)w->wc.heartbeat_ms) return;
  int code = RPC_OK, cmd = 0;
  int rc = hb_idle(&w->wc, &cmd, &code);
  w->last_hb_ms = dpc_mono_ms();
  if (rc) {
    if (wc_classify(rc, code) == WC_REREGISTER) w->registered = 0;
    else DPC_DEBUG("idle heartbeat failed: %s", dpc_errmsg());
  } else if (cmd == DIPACO__V1__COMMAND__COMMAND_DRAIN) {
    DPC_INFO("coordinator says DRAIN: exiting");
    w->draining = 1;
  } else if (cmd == DIPACO__V1__COMMAND__COMMAND_REREGISTER) {
    w->registered = 0;
  }
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

/* Act on a Lease answer; returns 1 when the worker should exit (--exit-when-done). */
static int handle_lease_response(worker *w, const Dipaco__V1__LeaseResponse *resp) {
  if (resp->outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED) {
    w->saw_job = 1;
    int flags = lease_run(&w->lr, resp->lease);
    if (flags & LEASE_PUSHED) w->worked = 1;
    if (flags & LEASE_REREGISTER) w->registered = 0;
    if (flags & LEASE_DRAIN) w->draining = 1;
  } else if (resp->outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_WAIT) {
    w->saw_job = 1;
    uint32_t ms = resp->wait_ms < 10 ? 10 : resp->wait_ms > 30000 ? 30000 : resp->wait_ms;
    DPC_DEBUG("lease: wait %u ms", ms);
    worker_sleep(w->ctl, ms);
  } else {
    /* A worker that joined late may never have seen the job it was meant for (it may have
     * ended while the worker reconnected): jobs_ended says so. */
    if (w->o.exit_when_done && (w->worked || w->saw_job || resp->jobs_ended)) {
      DPC_INFO("no work left: exiting (--exit-when-done)");
      return 1;
    }
    uint32_t ms = resp->wait_ms ? resp->wait_ms : 2000;
    if (ms > 30000) ms = 30000;
    DPC_DEBUG("lease: no work; asking again in %u ms", ms);
    worker_sleep(w->ctl, ms);
  }
  return 0;
}

/* One Lease long-poll and what follows; returns 1 when the loop should end. */
static int ask_for_lease(worker *w) {
  Dipaco__V1__LeaseResponse *resp = NULL;
  int code = RPC_OK;
  int rc = wc_lease(&w->wc, w->o.poll_ms, &resp, &code, worker_stop_requested, w->ctl);
  if (rc && worker_stopping(w->ctl)) return 1; /* the long-poll was cancelled (or failed) on SIGTERM */
  if (rc) {
    if (wc_classify(rc, code) == WC_REREGISTER) {
      DPC_WARN("lease: %s; registering again", dpc_errmsg());
      w->registered = 0;
    } else {
      DPC_WARN("lease request failed: %s", dpc_errmsg());
      call_failed(w, code);
    }
    return 0;
  }
  w->failures = 0;
  w->last_hb_ms = dpc_mono_ms(); /* a Lease call shows the worker is alive, too */
  int done = handle_lease_response(w, resp);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return done;
}

static void worker_free(worker *w) {
  slot_cache_free(&w->lr.slots);
  stream_keep_free(&w->lr.stream);
  sl_cache_free(&w->lr.sparse);
  rp_cache_free(&w->lr.replay);
  wc_close(&w->wc);
  free(w);
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
  w->seed = (unsigned)getpid() ^ (unsigned)dpc_mono_ms();
  w->lr = (lease_runner){.o = &w->o, .ctl = ctl, .wc = &w->wc, .seed = &w->seed};
  if ((rc = wc_open(&w->wc, o->coordinator, o->max_chunk_bytes))) {
    free(w);
    return rc;
  }
  while (!worker_stopping(ctl) && !w->draining) {
    if ((rc = ensure_registered(w))) {
      worker_free(w);
      return rc;
    }
    if (!w->registered) continue;
    idle_heartbeat(w);
    if (!w->registered || w->draining) continue;
    if (ask_for_lease(w)) break;
  }
  if (w->draining) {
    DPC_INFO("drained: exiting");
  } else if (worker_stopping(ctl)) {
    /* Between leases (a SIGTERM in the Lease long-poll): say so, so that a slot kept for this
     * worker goes to another at once, not after its connection's reconnect grace. (After a
     * lease the Release already said it; saying it twice is harmless.) */
    int code;
    if (w->registered &&
        wc_release(&w->wc, 0, DIPACO__V1__RELEASE_REASON__RELEASE_DRAINING, 0, "worker shutting down", &code))
      DPC_DEBUG("release at exit: %s", dpc_errmsg());
    DPC_INFO("stopped");
  }
  worker_free(w);
  return 0;
}
