/* blobwatch.c — the blob store's outages (see blobwatch.h). */
#include "coordinator/blobwatch.h"

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/blobs.h"
#include "coordinator/loop.h"

#include <stdio.h>
#include <string.h>

static void probe_run(uv_work_t *req) {
  coord *c = req->data;
  (void)blob_store_probe(c->bs); /* the store records the outcome */
}

static void probe_after(uv_work_t *req, int status) {
  (void)status;
  coord *c = req->data;
  c->store_health.probing = 0;
  loop_work_done(c);
}

void blobwatch_tick(coord *c) {
  char reason[512];
  int64_t since = 0;
  int up = blob_store_health(c->bs, reason, sizeof reason, &since);
  struct coord_store_health *h = &c->store_health;
  int64_t now = dpc_wall_ms();
  if (!up && !h->down) {
    h->down = 1;
    h->since_ms = since;
    h->outages++;
    snprintf(h->reason, sizeof h->reason, "%s", reason);
    DPC_ERROR("blob store unavailable: %s; no lease is granted and no outer step runs until it is back (probing "
              "every %d ms)", reason, BLOBWATCH_PROBE_MS);
  } else if (!up) {
    snprintf(h->reason, sizeof h->reason, "%s", reason);
  } else if (h->down) {
    h->down = 0;
    DPC_INFO("blob store available again after %.1f s: leases and outer steps resume",
             (double)(now - h->since_ms) / 1000.0);
  }
  /* A probe also deletes failed writes' objects, so one runs while any wait, down or not. */
  if ((h->down || blob_store_doubtful(c->bs) > 0) && !h->probing && now >= h->probe_at_ms && !c->stopping) {
    h->req.data = c;
    if (loop_queue_work(c, &h->req, probe_run, probe_after) == 0) {
      h->probing = 1;
      h->probe_at_ms = now + BLOBWATCH_PROBE_MS;
    }
  }
}

int blobwatch_down(coord *c, char *reason, size_t cap, int64_t *since_ms) {
  if (!c->store_health.down) return 0;
  if (reason && cap) snprintf(reason, cap, "%s", c->store_health.reason);
  if (since_ms) *since_ms = c->store_health.since_ms;
  return 1;
}
