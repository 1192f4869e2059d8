/* testhook.c — crash-point test hooks (see testhook.h). */
#include "coordinator/testhook.h"

#include "common/errors.h"
#include "common/log.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

int testhook_armed;

static const char *const POINTS[] = {"pull", "push", "push-commit", "push-ack", "outer", "outer-momentum", "gc"};
static const char *g_point;
static long g_nth, g_hits;

static int g_rf_kind;
static long g_rf_nth, g_rf_hits;
static int g_pool_delay_ms;
static int g_s3_max_parts;

/* Parse VAR=<name>[:<nth>] against names[0..n): *idx the name's index (-1 when VAR is unset or
 * empty), *nth the count (default 1). DPC_EINVAL, naming VAR and the known names (of `what`:
 * point, fault), otherwise. */
static int parse_armed(const char *var, const char *what, const char *const *names, size_t n, const char *known,
                       int *idx, long *nth) {
  *idx = -1;
  *nth = 1;
  const char *v = getenv(var);
  if (!v || !*v) return 0;
  const char *colon = strchr(v, ':');
  size_t len = colon ? (size_t)(colon - v) : strlen(v);
  if (colon) {
    char *end;
    *nth = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || *nth < 1 || *nth > 1000000)
      return dpc_err(DPC_EINVAL, "%s=%s: the count after ':' must be an integer in [1, 1000000]", var, v);
  }
  for (size_t i = 0; i < n; i++)
    if (strlen(names[i]) == len && strncmp(names[i], v, len) == 0) {
      *idx = (int)i;
      return 0;
    }
  return dpc_err(DPC_EINVAL, "%s=%s: unknown %s (known: %s)", var, v, what, known);
}

int testhook_replay_fault(void) {
  if (!g_rf_kind || ++g_rf_hits != g_rf_nth) return REPLAY_FAULT_NONE;
  return g_rf_kind;
}

int testhook_pool_delay_ms(void) { return g_pool_delay_ms; }
int testhook_s3_max_parts(void) { return g_s3_max_parts; }

int testhook_init(void) {
  static const char *const FAULTS[] = {"undecodable", "mismatch", "gone"};
  int idx;
  long nth;
  const char *d = getenv("DIPACO_TEST_POOL_DELAY_MS");
  if (d && *d) {
    char *end;
    long ms = strtol(d, &end, 10);
    if (end == d || *end || ms < 0 || ms > 600000)
      return dpc_err(DPC_EINVAL, "DIPACO_TEST_POOL_DELAY_MS=%s: must be an integer in [0, 600000]", d);
    g_pool_delay_ms = (int)ms;
    DPC_WARN("test hook armed: thread-pool work that calls wait for sleeps %ld ms first", ms);
  }
  const char *mp = getenv("DIPACO_TEST_S3_MAX_PARTS");
  if (mp && *mp) {
    char *end;
    long n = strtol(mp, &end, 10);
    if (end == mp || *end || n < 2 || n > 10000)
      return dpc_err(DPC_EINVAL, "DIPACO_TEST_S3_MAX_PARTS=%s: must be an integer in [2, 10000]", mp);
    g_s3_max_parts = (int)n;
    DPC_WARN("test hook armed: the S3 store takes at most %ld parts to an upload", n);
  }
  int rc = parse_armed("DIPACO_TEST_REPLAY_FAULT", "fault", FAULTS, 3, "undecodable, mismatch, gone", &idx, &nth);
  if (rc < 0) return rc;
  if (idx >= 0) {
    g_rf_kind = idx + 1; /* REPLAY_FAULT_* follow FAULTS' order */
    g_rf_nth = nth;
    DPC_WARN("test hook armed: replay round %ld served %s", nth, FAULTS[idx]);
  }
  rc = parse_armed("DIPACO_TEST_STOP_AT", "point", POINTS, sizeof POINTS / sizeof POINTS[0],
                   "pull, push, push-commit, push-ack, outer, outer-momentum, gc", &idx, &nth);
  if (rc < 0 || idx < 0) return rc;
  g_point = POINTS[idx];
  g_nth = nth;
  testhook_armed = 1;
  DPC_WARN("test hook armed: the coordinator stops itself (SIGSTOP) at point '%s', hit %ld", g_point, g_nth);
  return 0;
}

void testhook_hit(const char *point) {
  if (!g_point || strcmp(point, g_point) != 0) return;
  if (++g_hits != g_nth) return;
  dpc_log(DPC_LOG_ERROR, "test hook: stopped at %s (hit %ld)", point, g_hits);
  raise(SIGSTOP);
}
