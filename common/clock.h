/* clock.h — the clocks every process reads: wall time in milliseconds (what the store
 * records and leases expire by) and monotonic time (durations, rates, timeouts). One place,
 * so no module writes its own clock_gettime wrapper. Thread-safe (clock_gettime is). */
#ifndef DPC_CLOCK_H
#define DPC_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds since the Unix epoch (CLOCK_REALTIME). */
static inline int64_t dpc_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Monotonic nanoseconds (CLOCK_MONOTONIC), for durations only. */
static inline int64_t dpc_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t dpc_mono_ms(void) { return dpc_mono_ns() / 1000000; }
static inline double dpc_mono_s(void) { return (double)dpc_mono_ns() * 1e-9; }

#endif
