/* test_membudget.c — the coordinator's default memory budget (coordinator/membudget.h) on fake
 * /proc and /sys/fs/cgroup trees: a systemd service's own cgroup v2 memory.max (MemoryMax=),
 * its cgroup v1 memory.limit_in_bytes (hybrid hosts), a container's top-level memory.max,
 * "max" and v1's "no limit" falling back to 80% of MemTotal, garbage refused, nothing at all
 * (0, no limit); and the job estimate's arithmetic and saturation. */
#include "coordinator/membudget.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];

/* Write `text` to ROOT/rel, creating its folders. */
static void put(const char *rel, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", g_root, rel);
  for (char *p = path + strlen(g_root) + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(path, 0755);
      *p = '/';
    }
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

static char g_base[64] = "/tmp/test_membudget.XXXXXX";

/* A fresh, empty fake root for case n. */
static void fresh(int n) {
  snprintf(g_root, sizeof g_root, "%s/%d", g_base, n);
  mkdir(g_root, 0755);
}

int main(void) {
  if (!mkdtemp(g_base)) {
    perror("mkdtemp");
    return 1;
  }
  const char *src = NULL;
  int n = 0;

  /* cgroup v2, a systemd service: its own folder's memory.max (MemoryMax=4G). */
  fresh(n++);
  put("proc/self/cgroup", "0::/system.slice/dipaco-coordinator.service\n");
  put("sys/fs/cgroup/memory.max", "1073741824\n"); /* a parent's limit must not be taken */
  put("sys/fs/cgroup/system.slice/dipaco-coordinator.service/memory.max", "4294967296\n");
  put("proc/meminfo", "MemTotal:       16000000 kB\n");
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 4294967296ULL);
  CHECK(strstr(src, "memory.max") != NULL);

  /* v2 with no limit ("max"): 80% of MemTotal. */
  fresh(n++);
  put("proc/self/cgroup", "0::/system.slice/dipaco-coordinator.service\n");
  put("sys/fs/cgroup/system.slice/dipaco-coordinator.service/memory.max", "max\n");
  put("proc/meminfo", "MemFree: 5 kB\nMemTotal:       1000 kB\n");
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 1000ULL * 1024 / 10 * 8);
  CHECK(strstr(src, "MemTotal") != NULL);

  /* Hybrid host (cgroup v1 memory controller, an empty unified hierarchy): limit_in_bytes. */
  fresh(n++);
  put("proc/self/cgroup", "9:name=systemd:/system.slice/x.service\n4:memory:/system.slice/x.service\n"
                          "2:cpu,cpuacct:/system.slice/x.service\n0::/system.slice/x.service\n");
  put("sys/fs/cgroup/memory/system.slice/x.service/memory.limit_in_bytes", "2147483648\n");
  put("proc/meminfo", "MemTotal:       16000000 kB\n");
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 2147483648ULL);
  CHECK(strstr(src, "limit_in_bytes") != NULL);

  /* v1 without a limit (its "unlimited" is just below 2^63): MemTotal. */
  fresh(n++);
  put("proc/self/cgroup", "4:memory:/user.slice\n");
  put("sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes", "9223372036854771712\n");
  put("proc/meminfo", "MemTotal:       2000 kB\n");
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 2000ULL * 1024 / 10 * 8);

  /* A container in its own cgroup namespace: "0::/" and the top-level memory.max. */
  fresh(n++);
  put("proc/self/cgroup", "0::/\n");
  put("sys/fs/cgroup/memory.max", "536870912\n");
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 536870912ULL);

  /* A container that sees its host's path but has its own cgroup mounted at the top. */
  fresh(n++);
  put("proc/self/cgroup", "0::/kubepods/burstable/pod1/abc\n");
  put("sys/fs/cgroup/memory.max", "805306368\n");
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 805306368ULL);

  /* Garbage in a limit file is not a limit. */
  fresh(n++);
  put("proc/self/cgroup", "0::/a\n");
  put("sys/fs/cgroup/a/memory.max", "12abc\n");
  put("proc/meminfo", "MemTotal:       100 kB\n");
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 100ULL * 1024 / 10 * 8);

  /* Nothing readable: 0 (no budget). */
  fresh(n++);
  CHECK_EQ_INT(membudget_default_at(g_root, &src), 0);
  CHECK(strstr(src, "none") != NULL);

  /* This machine: some answer and a source, whatever the machine is. */
  src = NULL;
  (void)membudget_default(&src);
  CHECK(src != NULL);

  /* The estimate for the streamed outer step (membudget.h): 4 bytes x (2 P + (4 + D) range)
   * plus (2 + D) mapped inputs of at most 4 F bytes resident each, D at least 1, saturating;
   * a fragment of 100 floats is its own range. */
  CHECK_EQ_INT(membudget_job_bytes(1000, 100, 2), 4ULL * (2000 + 6 * 100) + 4ULL * (4 * 100));
  CHECK_EQ_INT(membudget_job_bytes(1000, 100, 0), 4ULL * (2000 + 5 * 100) + 3ULL * (4 * 100));
  CHECK(membudget_job_bytes(SIZE_MAX, SIZE_MAX, 1000) == UINT64_MAX);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_base);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_base);
  TEST_DONE();
}
