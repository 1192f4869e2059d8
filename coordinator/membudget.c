/* membudget.c — job memory estimate and the default budget (contract in membudget.h). */
#include "coordinator/membudget.h"

#include "coordinator/outerio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t sat_mul(uint64_t a, uint64_t b) { return a && b > UINT64_MAX / a ? UINT64_MAX : a * b; }
static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t membudget_job_bytes(size_t n_params, size_t max_frag, int n_slots) {
  uint64_t d = n_slots > 0 ? (uint64_t)n_slots : 1;
  uint64_t range = max_frag < OUTERIO_RANGE_FLOATS ? max_frag : OUTERIO_RANGE_FLOATS;
  uint64_t resident = sat_mul(4, range); /* each input's reader holds one range (blob_reader_view) */
  uint64_t floats = sat_add(sat_mul(2, n_params), sat_mul(sat_add(4, d), range));
  return sat_add(sat_mul(floats, sizeof(float)), sat_mul(sat_add(2, d), resident));
}

/* A cgroup memory limit file holding a number of bytes: 1 and *out, else 0 ("max", missing,
 * unreadable, or cgroup v1's "no limit", which is close to 2^63). */
static int read_limit(const char *path, uint64_t *out) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[64];
  int ok = 0;
  if (fgets(line, sizeof line, f) && strncmp(line, "max", 3) != 0) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(line, &end, 10);
    ok = errno == 0 && end != line && (*end == '\n' || *end == '\0') && v > 0 && v < (1ULL << 62);
    if (ok) *out = v;
  }
  fclose(f);
  return ok;
}

/* 1 if the comma-separated controller list ctrls names `name`. */
static int has_controller(const char *ctrls, const char *name) {
  size_t n = strlen(name);
  for (const char *p = ctrls; *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && strncmp(p, name, n) == 0) return 1;
    p += len + (p[len] == ',');
  }
  return 0;
}

/* The memory limit of the calling process's own cgroup, from /proc/self/cgroup: cgroup v2
 * ("0::PATH" → /sys/fs/cgroup/PATH/memory.max; a systemd service's MemoryMax=) or v1 (a
 * memory line "N:memory:PATH" → /sys/fs/cgroup/memory/PATH/memory.limit_in_bytes). PATH is
 * relative to the cgroup namespace, which is how a container sees /sys/fs/cgroup; a container
 * that sees its host's paths has its own cgroup mounted at the top instead (last tries). */
static int cgroup_limit(const char *root, uint64_t *out, const char **source) {
  char path[4352], line[4096];
  snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *ctrls = c1 + 1, *cg = strcmp(c2 + 1, "/") == 0 ? "" : c2 + 1;
    if (*ctrls == '\0') {
      snprintf(path, sizeof path, "%s/sys/fs/cgroup%s/memory.max", root, cg);
      if ((found = read_limit(path, out))) *source = "the cgroup's memory.max";
    } else if (has_controller(ctrls, "memory")) {
      snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory%s/memory.limit_in_bytes", root, cg);
      if ((found = read_limit(path, out))) *source = "the cgroup's memory.limit_in_bytes (cgroup v1)";
    }
  }
  if (f) fclose(f);
  if (!found) {
    snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory.max", root);
    if ((found = read_limit(path, out))) *source = "the cgroup's memory.max";
  }
  if (!found) {
    snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory/memory.limit_in_bytes", root);
    if ((found = read_limit(path, out))) *source = "the cgroup's memory.limit_in_bytes (cgroup v1)";
  }
  return found;
}

uint64_t membudget_default_at(const char *root, const char **source) {
  char path[4352], line[256];
  uint64_t limit = 0;
  if (cgroup_limit(root, &limit, source)) return limit;
  snprintf(path, sizeof path, "%s/proc/meminfo", root);
  FILE *f = fopen(path, "r");
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

uint64_t membudget_default(const char **source) { return membudget_default_at("", source); }
