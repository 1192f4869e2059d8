/* membudget.c — job memory estimate and the default budget (contract in membudget.h). */
#include "coordinator/membudget.h"

#include "coordinator/outerio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t sat_mul(uint64_t a, uint64_t b) { return a && b > UINT64_MAX / a ? UINT64_MAX : a * b; }
static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t membudget_job_bytes(size_t n_params, size_t max_frag, int n_slots) {
  uint64_t d = n_slots > 0 ? (uint64_t)n_slots : 1;
  uint64_t range = max_frag < OUTERIO_RANGE_FLOATS ? max_frag : OUTERIO_RANGE_FLOATS;
  uint64_t resident = sat_mul(4, max_frag) < BLOB_READER_RESIDENT_BYTES ? sat_mul(4, max_frag) : BLOB_READER_RESIDENT_BYTES;
  uint64_t floats = sat_add(sat_mul(2, n_params), sat_mul(sat_add(4, d), range));
  return sat_add(sat_mul(floats, sizeof(float)), sat_mul(sat_add(2, d), resident));
}

uint64_t membudget_default(const char **source) {
  char line[256];
  FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
  if (f) {
    char *end = NULL;
    unsigned long long v = 0;
    if (fgets(line, sizeof line, f) && strncmp(line, "max", 3) != 0) v = strtoull(line, &end, 10);
    fclose(f);
    if (v > 0 && end && (*end == '\n' || *end == '\0')) {
      *source = "the cgroup's memory.max";
      return v;
    }
  }
  f = fopen("/proc/meminfo", "r");
  if (f) {
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) break;
    fclose(f);
    if (kb > 0) {
      *source = "80% of MemTotal";
      return (uint64_t)kb * 1024 / 10 * 8;
    }
  }
  *source = "none (unknown memory size)";
  return 0;
}
