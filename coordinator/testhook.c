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
static int g_s3_copy_max_mb;

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
int testhook_s3_copy_max_mb(void) { return g_s3_copy_max_mb; }

/* VAR=<integer in [lo, hi]> into *out (left alone when VAR is unset or empty); DPC_EINVAL,
 * naming VAR and the range, for anything else. */
static int env_int(const char *var, long lo, long hi, int *out) {
  const char *v = getenv(var);
  if (!v || !*v) return 0;
  char *end;
  long n = strtol(v, &end, 10);
  if (end == v || *end || n < lo || n > hi)
    return dpc_err(DPC_EINVAL, "%s=%s: must be an integer in [%ld, %ld]", var, v, lo, hi);
  *out = (int)n;
  return 0;
}

int testhook_init(void) {
  static const char *const FAULTS[] = {"undecodable", "mismatch", "gone"};
  int idx;
  long nth;
  int rc = env_int("DIPACO_TEST_POOL_DELAY_MS", 0, 600000, &g_pool_delay_ms);
  if (rc < 0) return rc;
  if (g_pool_delay_ms) DPC_WARN("test hook armed: thread-pool work that calls wait for sleeps %d ms first", g_pool_delay_ms);
  if ((rc = env_int("DIPACO_TEST_S3_MAX_PARTS", 2, 10000, &g_s3_max_parts)) < 0) return rc;
  if (g_s3_max_parts) DPC_WARN("test hook armed: the S3 store takes at most %d parts to an upload", g_s3_max_parts);
  if ((rc = env_int("DIPACO_TEST_S3_COPY_MAX_MB", 5, 5120, &g_s3_copy_max_mb)) < 0) return rc;
  if (g_s3_copy_max_mb) DPC_WARN("test hook armed: objects above %d MiB are copied in parts", g_s3_copy_max_mb);
  rc = parse_armed("DIPACO_TEST_REPLAY_FAULT", "fault", FAULTS, 3, "undecodable, mismatch, gone", &idx, &nth);
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
