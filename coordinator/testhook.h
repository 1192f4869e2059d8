/* testhook.h — crash-point test hooks: make the coordinator stop itself at a named point so a
 * test can SIGKILL it exactly there (kill -9 mid-pull, mid-push, mid-outer-step, mid-GC) and
 * check that a restart on the same state directory loses and doubles nothing.
 *
 * Armed by the environment variable DIPACO_TEST_STOP_AT=<point>[:<nth>] (nth ≥ 1, default
 * 1), read once by testhook_init() at start-up. When the daemon reaches <point> for the nth
 * time it logs "test hook: stopped at <point> (hit <nth>)" (one write(2), at error level so
 * every log level shows it) and raises SIGSTOP on itself; the test waits for that line (or
 * the stopped state) and sends SIGKILL. Later hits never stop again. Unset, the hook is one
 * load and a not-taken branch (TESTHOOK below); production never sets the variable.
 *
 * Points (where each one sits, and what is durable when it fires):
 *   pull         PullFragment: a parameter stream with at least one chunk handed to gRPC and
 *                at least one still to send (the stream is half sent).
 *   push         PushDelta: part of a delta received and spooled to the temp file, not all.
 *   push-commit  PushDelta: the delta blob is fsync'd and renamed, its row not yet committed.
 *   push-ack     PushDelta: the delta row is committed, the acknowledgement not yet sent.
 *   outer        Sync outer step: the new version's parameter and momentum blobs are written,
 *                the round's transaction (version row, deltas applied, round closed) is not.
 *   outer-momentum  Sync outer step: the round's transaction is committed, the new version's
 *                momentum blob not yet stored (its commit runs after the version's).
 *   gc           Garbage collection: the old versions' / applied deltas' rows are updated in
 *                SQLite, their blob files not yet deleted (the code's order: DB first).
 * An unknown point name makes testhook_init fail, so a typo in a test cannot pass silently.
 *
 * Thread-safety: testhook_init runs before any other thread exists; testhook_hit is called
 * from the loop thread only. */
#ifndef DPC_TESTHOOK_H
#define DPC_TESTHOOK_H

extern int testhook_armed; /* set once by testhook_init; read-only afterwards */

/* Read DIPACO_TEST_STOP_AT. 0 when unset or valid, DPC_EINVAL (message set) otherwise. */
int testhook_init(void);
/* Count a hit of `point`; on the armed point's nth hit, log and SIGSTOP this process. */
void testhook_hit(const char *point);

/* Replay faults (docs/design.md §5.7): DIPACO_TEST_REPLAY_FAULT=<fault>[:<nth>] spoils the nth
 * PAYLOAD_REPLAY_ROUND the coordinator serves (default 1; later ones are served as they are):
 * `undecodable` overwrites its first stream's first 4 bytes with a NaN (what no encoder
 * writes), `mismatch` flips the lowest bit of its first byte (it decodes, to other values),
 * `gone` answers NOT_FOUND as if the round were collected. Read by testhook_init. */
enum { REPLAY_FAULT_NONE = 0, REPLAY_FAULT_UNDECODABLE, REPLAY_FAULT_MISMATCH, REPLAY_FAULT_GONE };
/* Count a served replay round; the fault to apply to it (REPLAY_FAULT_*). Loop thread only. */
int testhook_replay_fault(void);

/* DIPACO_TEST_POOL_DELAY_MS=<ms> (0 … 600000): work on the thread pool that a call waits for
 * (a parameter-cache fill, pcache.c; the blobs a pull reads, svc_read in svc.c; the multipart
 * uploads a PrepareDeltaPut starts, svc_put.c) sleeps that long first, so a test can show the
 * loop thread answering other calls meanwhile. Read by testhook_init; any thread may read it
 * after. */
int testhook_pool_delay_ms(void);

/* DIPACO_TEST_S3_MAX_PARTS=<n> (2 … 10000): the coordinator's S3 client takes the store to
 * allow at most n parts to a multipart upload instead of S3's 10000, so that a test with
 * megabyte objects shows what a 50 GB one meets (part sizes grown to fit, svc_put.c). Read by
 * testhook_init; 0 when unset. */
int testhook_s3_max_parts(void);
/* DIPACO_TEST_S3_COPY_MAX_MB=<5..5120>: one CopyObject's limit in MiB (S3's is 5 GiB), so that
 * a test copies small objects in parts (blob_s3_copy). Read by testhook_init; 0 when unset. */
int testhook_s3_copy_max_mb(void);

#define TESTHOOK(point)                  \
  do {                                   \
    if (testhook_armed) testhook_hit(point); \
  } while (0)

#endif
