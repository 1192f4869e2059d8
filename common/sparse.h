/* sparse.h — SparseLoCo's sparse delta codec (docs/design.md §3): chunked top-k
 * of an error-feedback accumulator, 2-bit (value_bits) values with a per-chunk lookup table,
 * packed indices. Both daemons use these functions and nothing else to size, encode, check and
 * decode a sparse stream, so the worker, the coordinator and the oracle agree bit for bit.
 *
 * Layout. A fragment is a run of tensors of lengths tlen[0..nt) (sum n). Each tensor, flat,
 * is cut into chunks of cfg->chunk consecutive values, the last one shorter. A chunk of L
 * values keeps k = ceil(density * L) entries (computed in double, at least 1, at most L).
 * The stream is the concatenation, tensor by tensor and chunk by chunk, of chunk records:
 *   table   2^b little-endian fp32 values (b = value_bits): the dequantized value of code c
 *   indices k positions within the chunk, strictly increasing, ib = ceil(log2(chunk)) bits
 *           each, packed LSB-first into a bit stream, zero-padded to a byte
 *   codes   k codes of b bits each in the same order as the indices, LSB-first, zero-padded
 *           to a byte
 * so a record's size depends on L alone and dpc_sparse_bytes sizes a stream up front.
 *
 * Selection (deterministic): the k entries of largest |e| in the chunk; ties go to the lower
 * index. Quantizer (after the reference code's statistical quantizer, nb = 2^b bins): over
 * the kept values x_1..x_k in index order, in double (each sum accumulated from +0.0 in
 * index order, no fused multiply-add): mu = mean(x), c_i = x_i - mu,
 * sigma = sqrt(sum c_i^2 / (k - 1)) (0 when k = 1), scale = 6 * sigma / nb (1 when that is 0
 * or not finite), code_i = clamp(rint_half_even(c_i / scale + nb / 2), 0, nb - 1);
 * table[c] = (float)(mean of the x_i with code c) for a used code, 0.0f for an unused one.
 * The dequantized sparse vector s has s = table[code_i] at kept positions and 0 elsewhere.
 *
 * Decoding rejects (DPC_EFORMAT / DPC_ENUMERIC, naming tensor, chunk and field): a wrong
 * total length, a non-finite table value, a table value other than +0.0f (bit pattern 0, so
 * -0.0f too) for a code no index uses, indices not strictly increasing or >= L, non-zero
 * padding bits.
 *
 * Ownership: callers own every buffer. Thread-safety: reentrant; encode uses OpenMP over
 * chunks (the result does not depend on the thread count). */
#ifndef DPC_SPARSE_H
#define DPC_SPARSE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  double density;      /* fraction of each chunk kept, in (0, 1] */
  uint32_t chunk;      /* values per chunk, 2 .. 65536 */
  uint32_t value_bits; /* bits per kept value, 1 .. 8 */
} dpc_sparse_cfg;

#define DPC_SPARSE_CHUNK_DEFAULT 4096
#define DPC_SPARSE_MAX_CHUNK 65536u

/* DPC_EINVAL naming the field unless density in (0, 1], chunk in [2, 65536] and value_bits
 * in [1, 8]. */
int dpc_sparse_cfg_check(const dpc_sparse_cfg *cfg);

/* Entries kept in a chunk of len values (k above); 0 for len 0. */
uint32_t dpc_sparse_chunk_k(const dpc_sparse_cfg *cfg, uint32_t len);

/* Encoded bytes of a fragment (tensors tlen[0..nt)) and, if kept != NULL, the number of kept
 * entries. DPC_EINVAL for a bad cfg, nt < 1 or a zero-length tensor. */
int dpc_sparse_bytes(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, size_t *bytes, uint64_t *kept);

/* Encode the error-feedback accumulator e[n] (n = sum tlen) into out[dpc_sparse_bytes] and
 * subtract the dequantized sparse vector from it in place (e <- e - s): the residual stays
 * for the next round. A non-finite e is refused (DPC_ENUMERIC naming the index) before
 * anything is written or changed. */
int dpc_sparse_encode(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, float *e, unsigned char *out);

/* Check a stream without decoding it: every rule above, O(kept entries). */
int dpc_sparse_check(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const unsigned char *in, size_t bytes);

/* dpc_sparse_check that also gives the sum of squares of the dequantized values (the delta's
 * squared L2 norm, for the coordinator's norm screen) in *ss, in O(kept entries). */
int dpc_sparse_sumsq(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const unsigned char *in, size_t bytes,
                     double *ss);

/* Decode into y[n]: s at kept positions, 0.0f elsewhere (y is fully written on success and may
 * be partly written on error). Same checks as dpc_sparse_check. */
int dpc_sparse_decode(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const unsigned char *in, size_t bytes,
                      float *y);

#endif
