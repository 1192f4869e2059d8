/* outerio.h — the outer steps streamed over the blob store (core library, see coord.h): the
 * sync step (DiLoCo / DiPaCo / Streaming, dense or SparseLoCo deltas) and the async apply of
 * one delta (delayed Nesterov, Nesterov, SGD), computed range by range so that the memory they
 * take is bounded whatever the model size and the number of deltas.
 *
 * For each range [lo, hi) of the fragment, in order: read that range of θ_t, of the momentum
 * (zeros without a blob) and of every delta in the caller's fixed order (an fp32 spool through
 * a blob_reader view of its mapping, checksummed, then used in place; a SparseLoCo stream, held
 * encoded in memory, decoded for the range), reduce the
 * deltas with outer_average and apply the rule (kernels/outer.h) to the range, then append
 * the range of θ_{t+1} and of the new momentum to their blob writers. Every kernel of
 * kernels/outer.h is element-wise with a fixed order of operations per element, so the result
 * is bit-identical to the whole-array computation for any range size. Memory: 3 ranges of
 * floats (default OUTERIO_RANGE_FLOATS each; one more per sparse delta) plus one fp64 block
 * inside outer_average, the encoded sparse streams (a few per cent of the fragment each), and
 * one range in each input's reader (blob_reader).
 *
 * Nothing is published before everything is checked: the new blobs are committed (fsync,
 * rename) only after every input's checksum matched (the blob trailers and, for deltas, the
 * checksum its row recorded), every average and parameter came out finite; otherwise the
 * writers are aborted and the error (DPC_ECHECKSUM, DPC_EFORMAT, DPC_ENOENT, DPC_ESHAPE,
 * DPC_ENUMERIC, DPC_EIO ...) is returned with dpc_errmsg set. The two (or three) output blobs
 * are fsync'd at their commits, at the end (a sync step's momentum, with momentum_later, by
 * the caller after the version's commit); the kernel is asked to start writing each range
 * back as soon as it is appended, so most of the write-back overlaps the computation.
 *
 * Thread-safety: reentrant; runs on the coordinator's thread pool (one call per fragment at a
 * time; the blob store allows concurrent use on distinct names). */
#ifndef DPC_COORD_OUTERIO_H
#define DPC_COORD_OUTERIO_H

#include "common/sparse.h"
#include "coordinator/blobs.h"

#include <stddef.h>
#include <stdint.h>

/* Default range: 32 Ki floats (128 KiB per stream): the working set of a range of every input
 * stays in the CPU caches between the checksum pass and the arithmetic. */
#define OUTERIO_RANGE_FLOATS ((size_t)1 << 15)

typedef struct {
  blob_store *bs;
  size_t len;                  /* floats in the fragment */
  size_t range_floats;         /* 0 = OUTERIO_RANGE_FLOATS */
  const char *param_blob;      /* θ_t */
  const char *momentum_blob;   /* u_t; "" or NULL = zeros (round 0) */
  int n;                       /* deltas, >= 1 */
  /* [n] in (path, replica) order: BLOB_DELTA (fp32), BLOB_SPARSE (SparseLoCo) or BLOB_ENCODED (a
   * quantized delta as sent, decoded range by range with codec and block_floats below) names */
  const char (*delta_blobs)[BLOB_NAME_MAX];
  const uint32_t *delta_crcs;  /* [n] the checksum each row recorded (what was acknowledged; for an
                                * encoded delta, of its decoded fp32 payload) */
  int codec;                   /* the job's delta codec (dpc_codec), for BLOB_ENCODED deltas */
  uint32_t block_floats;       /* ... and its block size */
  const double *weights;       /* [n] (outer_average's weights) */
  /* SparseLoCo deltas: the codec settings and the fragment's tensor lengths (NULL: none) */
  const dpc_sparse_cfg *sp_cfg;
  const uint64_t *sp_tlen;
  int sp_nt;
  float lr, mu;
  int nesterov;
  const char *new_param, *new_momentum; /* θ_{t+1}, u_{t+1} */
  /* Not NULL: u_{t+1}'s writer (opened BLOB_WRITE_LATER) is handed back here uncommitted, every
   * byte appended, *momentum_crc its checksum; the caller commits or aborts it. The version
   * can be committed before its momentum is stored because the inputs it is made from stay
   * until the next round closes (docs/design.md §5.3). */
  blob_writer **momentum_later;
} outerio_sync;

/* The sync outer step: θ_{t+1}, u_{t+1} written durably (u_{t+1} left to the caller with
 * momentum_later); *param_crc / *momentum_crc get their payload checksums. 0 or a negative
 * DPC_E* code (nothing written then). */
int outerio_sync_step(const outerio_sync *a, uint32_t *param_crc, uint32_t *momentum_crc);

typedef enum { OUTERIO_SGD = 0, OUTERIO_NESTEROV = 1, OUTERIO_DN = 2 } outerio_rule;

typedef struct {
  blob_store *bs;
  size_t len;
  size_t range_floats; /* 0 = OUTERIO_RANGE_FLOATS */
  outerio_rule rule;
  const char *param_blob;
  const char *momentum_blob; /* "" or NULL = zeros (not read for SGD) */
  const char *dnbuf_blob;    /* delayed Nesterov's Δbuf; "" or NULL = zeros */
  const char *delta_blob;
  uint32_t delta_crc;        /* the checksum the delta's row recorded */
  int N;                     /* delayed Nesterov */
  double c;
  int64_t dn_t;              /* deltas applied before this one */
  float lr, mu;
  const char *new_param, *new_momentum, *new_dnbuf; /* momentum unused for SGD, Δbuf unless DN */
} outerio_async;

/* One async application (rounds.c's rules, docs/design.md §3): the new blobs written durably with
 * their checksums; *dn_t_out (DN only) gets the counter after it. 0 or a negative DPC_E*. */
int outerio_async_step(const outerio_async *a, uint32_t *param_crc, uint32_t *momentum_crc, uint32_t *dnbuf_crc,
                       int64_t *dn_t_out);

#endif
