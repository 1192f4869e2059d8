/* membudget.h — what a job costs the coordinator in memory, and how much it may use (a spec
 * too big for the machine must be refused, not get the coordinator OOM-killed mid-create).
 *
 * The estimate counts the memory the coordinator holds for a job: version 0's parameters
 * while it is created and the parameter cache's mapping of the current version afterwards
 * (2 × P floats; the mapping's pages are the page cache's, counted to be safe), and the
 * streamed outer step (outerio.h): D + 4 ranges of min(F, OUTERIO_RANGE_FLOATS) floats for a
 * largest fragment of F floats and D deltas, plus one such range in each of its D + 2 input
 * readers; D is bounded by the job's slots. Transfers in flight (pull chunks,
 * quantized deltas being decoded) come on top and are not counted: the budget should leave
 * room for them. On an S3 store the blob cache's memory (--blob-cache-mb) is taken off the
 * budget at start-up (main.c).
 * Pure functions except membudget_default, which reads /sys/fs/cgroup and /proc. */
#ifndef DPC_COORD_MEMBUDGET_H
#define DPC_COORD_MEMBUDGET_H

#include <stddef.h>
#include <stdint.h>

/* Bytes for a job of n_params parameters whose largest fragment has max_frag floats and
 * that has n_slots slots (saturates at UINT64_MAX). */
uint64_t membudget_job_bytes(size_t n_params, size_t max_frag, int n_slots);

/* The default budget: the memory limit of the process's own cgroup when set (cgroup v2
 * memory.max or v1 memory.limit_in_bytes, found through /proc/self/cgroup: a systemd unit's
 * MemoryMax=, a container's limit), else 80% of MemTotal; 0 when neither can be read (no
 * limit). *source names which. */
uint64_t membudget_default(const char **source);

/* The same, with every path (/proc/self/cgroup, /sys/fs/cgroup, /proc/meminfo) under the
 * folder root ("" for this machine; tests pass a fake tree). */
uint64_t membudget_default_at(const char *root, const char **source);

#endif
