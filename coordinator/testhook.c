/* testhook.c — crash-point test hooks (see testhook.h). */
#include "coordinator/testhook.h"

#include "common/errors.h"
#include "common/log.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

int testhook_armed;

static const char *const POINTS[] = {"pull", "push", "push-commit", "push-ack", "outer", "gc"};
static const char *g_point;
static long g_nth, g_hits;

static int g_rf_kind;
static long g_rf_nth, g_rf_hits;

static int replay_fault_init(void) {
  static const char *const FAULTS[] = {"undecodable", "mismatch", "gone"};
  const char *v = getenv("DIPACO_TEST_REPLAY_FAULT");
  if (!v || !*v) return 0;
  const char *colon = strchr(v, ':');
  size_t len = colon ? (size_t)(colon - v) : strlen(v);
  long nth = 1;
  if (colon) {
    char *end;
    nth = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || nth < 1 || nth > 1000000)
      return dpc_err(DPC_EINVAL, "DIPACO_TEST_REPLAY_FAULT=%s: the count after ':' must be an integer in [1, 1000000]", v);
  }
  for (int i = 0; i < 3; i++)
    if (strlen(FAULTS[i]) == len && strncmp(FAULTS[i], v, len) == 0) {
      g_rf_kind = i + 1;
      g_rf_nth = nth;
      DPC_WARN("test hook armed: replay round %ld served %s", nth, FAULTS[i]);
      return 0;
    }
  return dpc_err(DPC_EINVAL, "DIPACO_TEST_REPLAY_FAULT=%s: unknown fault (known: undecodable, mismatch, gone)", v);
}

int testhook_replay_fault(void) {
  if (!g_rf_kind || ++g_rf_hits != g_rf_nth) return REPLAY_FAULT_NONE;
  return g_rf_kind;
}

int testhook_init(void) {
  int rrc = replay_fault_init();
  if (rrc < 0) return rrc;
  const char *v = getenv("DIPACO_TEST_STOP_AT");
  if (!v || !*v) return 0;
  const char *colon = strchr(v, ':');
  size_t len = colon ? (size_t)(colon - v) : strlen(v);
  long nth = 1;
  if (colon) {
    char *end;
    nth = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || nth < 1 || nth > 1000000)
      return dpc_err(DPC_EINVAL, "DIPACO_TEST_STOP_AT=%s: the count after ':' must be an integer in [1, 1000000]", v);
  }
  for (size_t i = 0; i < sizeof POINTS / sizeof POINTS[0]; i++)
    if (strlen(POINTS[i]) == len && strncmp(POINTS[i], v, len) == 0) {
      g_point = POINTS[i];
      g_nth = nth;
      testhook_armed = 1;
      DPC_WARN("test hook armed: the coordinator stops itself (SIGSTOP) at point '%s', hit %ld", g_point, g_nth);
      return 0;
    }
  return dpc_err(DPC_EINVAL,
                 "DIPACO_TEST_STOP_AT=%s: unknown point (known: pull, push, push-commit, push-ack, outer, gc)", v);
}

void testhook_hit(const char *point) {
  if (!g_point || strcmp(point, g_point) != 0) return;
  if (++g_hits != g_nth) return;
  dpc_log(DPC_LOG_ERROR, "test hook: stopped at %s (hit %ld)", point, g_hits);
  raise(SIGSTOP);
}
