/* worker.c — the dipaco-worker lease loop (see worker.h): register, idle heartbeats, ask for a
 * lease and hand it to lease.c, with retries, re-registration and a clean stop.
 *
 * Protocol assumptions, where proto/dipaco.proto leaves a choice open (to reconcile with
 * coordinator/svc_worker.c and svc.c):
 *  - Identity: after Register, every call carries dipaco-worker-id / dipaco-session. A
 *    re-registration (UNAUTHENTICATED, or COMMAND_REREGISTER) sends previous_worker_id /
 *    previous_session.
 *  - Lease: long-poll with max_wait_ms = 5000 (job_id 0 = any job). LEASE_WAIT: ask again
 *    after wait_ms (clamped to [10 ms, 30 s]). LEASE_NO_WORK: ask again after wait_ms (2 s
 *    when 0), or exit 0 with --exit-when-done once some job was seen running (a lease was
 *    granted or LEASE_WAIT answered): a worker started before any job exists waits for one.
 *  - Placement: a lease lists every fragment of the path; a path's modules, one per level,
 *    concatenated level 0 first, are the canonical layout. FragmentInfo.offset_floats is read
 *    as relative to its module (the proto's wording) or, when that does not tile the path, as
 *    the offset in the whole canonical layout (coordinator/svc.c's reading); the two
 *    readings coincide for plain DiLoCo and cannot both fit otherwise.
 *  - Pull: PullFragment(lease_id, fragment_id, version = the lease's base version,
 *    latest = false, codec fp32); the served version, size and (when non-zero) the lease's
 *    crc32c must match. Transient failures resume from the last byte received.
 *  - Train: steps first_step .. first_step + inner_steps − 1; the data batch of step s is s
 *    (DataWindow.first_batch must equal first_step); LR schedule over hyper.total_steps.
 *    Unsupported and refused with Release(RELEASE_ERROR): grad_accum > 1, shuffle,
 *    path_index (DiPaCo routing), a delta codec common/codec.c does not implement.
 *  - Streaming (Lease.streaming): stream.c replaces pull, train and push — the slot trains
 *    on from its local parameters, pushes each fragment's delta (encoded with
 *    Lease.delta_codec) at its sync step from a push thread and merges the new global
 *    version overlap_steps later (stream.h).
 *  - Inner state: KEEP keeps AdamW moments per (job, slot) in this worker (fresh state, with a
 *    warning, for a slot it never trained; stale state, with a warning, when another worker
 *    trained the slot in between); a lease that is abandoned restores the state it started
 *    with. RESET starts every lease fresh. CHECKPOINT: after training, the AdamW state of
 *    every fragment (m, v, step) goes up with PushInnerState BEFORE the delta is pushed (so a
 *    finished round always has its state durable); a lease with has_inner_checkpoint pulls
 *    the slot's state of the previous round (PullInnerState) and resumes it exactly, whoever
 *    trained the slot; without one it behaves as KEEP.
 *  - Push: one PushDelta stream carrying every fragment (Chunk: lease_id, fragment_id,
 *    version = base version, inner_steps, tokens = B·T·steps, payload DELTA, codec and
 *    block_floats of the lease, crc32c of the bytes as sent). PUSH_ACCEPTED / PUSH_DUPLICATE are success; PUSH_LATE / PUSH_STALE are
 *    logged and dropped. After the push the worker sends Release(RELEASE_DONE, step) and
 *    ignores its errors: the coordinator may equally end the lease on a complete push.
 *  - Steps on the wire: HeartbeatRequest.step and ReleaseRequest.step are the global step
 *    the slot has reached, first_step + inner steps done (one past the last completed step,
 *    so that "nothing done" is first_step rather than first_step − 1).
 *  - Heartbeat: a thread sends HeartbeatRequest(lease_id, step = global step reached,
 *    steps_per_sec EWMA, loss, tokens) every heartbeat_interval_ms during a lease (pull,
 *    train and push), and an idle one (lease_id 0) before a Lease call when a heartbeat
 *    interval has passed since the last one. COMMAND_STOP: stop the lease now, push nothing,
 *    Release(RELEASE_PREEMPTED, "stopped by the coordinator") and keep leasing (the proto
 *    calls it a lease-level command; the coordinator drains a worker with COMMAND_DRAIN,
 *    which may also answer an idle heartbeat). COMMAND_DRAIN: finish the round, push, then
 *    exit 0. COMMAND_REREGISTER: drop the lease, register again.
 *  - Errors: UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED / DATA_LOSS are retried with
 *    jittered exponential backoff (100 ms doubling, cap 5 s; from the second UNAVAILABLE on
 *    the retry uses a fresh channel, see wc_reconnect; a pull or push gives up after 10
 *    tries and the worker registers again). UNAUTHENTICATED re-registers. ABORTED /
 *    NOT_FOUND on a lease call, any refused heartbeat, or no heartbeat getting through for
 *    lease_ttl_ms drop the lease without Release. Any other failure of a lease (bad lease,
 *    missing data, refused push) releases it with RELEASE_ERROR and the error message.
 *  - SIGTERM (worker_stop): a lease whose remaining inner steps should take at most
 *    --drain-finish-s (heartbeat.c, finish_or_stop) is trained to its end and pushed, then the
 *    worker exits. Otherwise training stops after the current step. Sync: the lease is
 *    released with RELEASE_DRAINING, "worker shutting down" (no partial delta: an exact round
 *    averages whole rounds), unless the lease says partial_push (a sync job weighted by
 *    tokens, no streaming); a lease pushed while stopping is released with RELEASE_DRAINING
 *    too, so the coordinator frees the slots it keeps for this worker at once.
 *    Async (Lease.algorithm not SYNC) and partial_push leases: the delta of the inner steps
 *    completed so far is pushed (Chunk.inner_steps = those steps; the coordinator counts the
 *    lease as that many steps and merges it with its tokens' weight), as
 *    is the inner state first with inner.state checkpoint. A round already trained is pushed
 *    in both modes; pushes go on being retried on transient errors while stopping (the grace
 *    period of main.c bounds them). A Lease long-poll in flight is cancelled at once.
 *    worker_run then returns 0. */
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
