/* sparse.c — SparseLoCo's sparse delta codec (common/sparse.h): chunked top-k selection of an
 * error-feedback accumulator, the statistical quantizer with its per-chunk lookup table, and
 * the LSB-first bit packing of indices and codes; sizing, encoding, checking and decoding.
 *
 * Selection is a radix select on the magnitude bits of each chunk (three histogram passes of
 * 11, 10 and 10 bits, O(L) whatever the data), which finds the k-th largest |e|; every entry
 * above it is kept, and of the entries equal to it the lowest indices, so ties go to the lower
 * index and the kept indices come out in increasing order without a sort. Statistics are in
 * double in index order, built with -ffp-contract=off (common/CMakeLists.txt), so the sums are
 * the same on every machine. Chunks are independent: encode runs them in parallel (OpenMP) with
 * per-thread scratch, and the stream does not depend on the thread count. */
#include "common/sparse.h"
#include "common/bytes.h"
#include "common/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Bits per index: ceil(log2(chunk)). */
static unsigned index_bits(uint32_t chunk) {
  unsigned ib = 0;
  while (ib < 32 && ((uint64_t)1 << ib) < chunk) ib++;
  return ib;
}

int dpc_sparse_cfg_check(const dpc_sparse_cfg *cfg) {
  if (!cfg) return dpc_err(DPC_EINVAL, "sparse cfg: NULL");
  if (!(cfg->density > 0.0 && cfg->density <= 1.0))
    return dpc_err(DPC_EINVAL, "sparse cfg: density %g is outside (0, 1]", cfg->density);
  if (cfg->chunk < 2 || cfg->chunk > DPC_SPARSE_MAX_CHUNK)
    return dpc_err(DPC_EINVAL, "sparse cfg: chunk %u is outside [2, %u]", cfg->chunk, DPC_SPARSE_MAX_CHUNK);
  if (cfg->value_bits < 1 || cfg->value_bits > 8)
    return dpc_err(DPC_EINVAL, "sparse cfg: value_bits %u is outside [1, 8]", cfg->value_bits);
  return 0;
}

uint32_t dpc_sparse_chunk_k(const dpc_sparse_cfg *cfg, uint32_t len) {
  if (len == 0) return 0;
  double k = ceil(cfg->density * (double)len);
  if (!(k >= 1.0)) return 1; /* also a NaN density */
  if (k >= (double)len) return len;
  return (uint32_t)k;
}

/* Bytes of one chunk record keeping k entries: table, packed indices, packed codes. */
static uint64_t record_bytes(const dpc_sparse_cfg *cfg, unsigned ib, uint32_t k) {
  unsigned b = cfg->value_bits;
  return 4 * ((uint64_t)1 << b) + ((uint64_t)k * ib + 7) / 8 + ((uint64_t)k * b + 7) / 8;
}

/* The layout every function shares: sizes, and the first chunk, value and byte of each tensor
 * (arrays of nt + 1 entries when wanted). */
typedef struct {
  uint64_t n, kept, bytes, chunks;
} layout_sum;

static int layout(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, layout_sum *sum, uint64_t *chunk0,
                  uint64_t *val0, uint64_t *byte0) {
  int rc = dpc_sparse_cfg_check(cfg);
  if (rc < 0) return rc;
  if (nt < 1) return dpc_err(DPC_EINVAL, "sparse stream: %d tensors (need at least 1)", nt);
  if (!tlen) return dpc_err(DPC_EINVAL, "sparse stream: NULL tensor lengths");
  unsigned ib = index_bits(cfg->chunk);
  uint64_t full_bytes = record_bytes(cfg, ib, dpc_sparse_chunk_k(cfg, cfg->chunk));
  uint64_t full_k = dpc_sparse_chunk_k(cfg, cfg->chunk);
  layout_sum s = {0, 0, 0, 0};
  for (int t = 0; t < nt; t++) {
    if (chunk0) chunk0[t] = s.chunks, val0[t] = s.n, byte0[t] = s.bytes;
    uint64_t len = tlen[t];
    if (len == 0) return dpc_err(DPC_EINVAL, "sparse stream: tensor %d has length 0", t);
    uint64_t full = len / cfg->chunk, rest = len % cfg->chunk;
    uint32_t rk = dpc_sparse_chunk_k(cfg, (uint32_t)rest);
    uint64_t rb = rest ? record_bytes(cfg, ib, rk) : 0;
    /* full * full_bytes + rb, and the running sums, without wrapping. */
    if (full > (UINT64_MAX - rb) / full_bytes || s.bytes > UINT64_MAX - (full * full_bytes + rb) ||
        s.n > UINT64_MAX - len)
      return dpc_err(DPC_ERANGE, "sparse stream: tensor %d (length %llu) overflows the stream size", t,
                     (unsigned long long)len);
    s.n += len;
    s.bytes += full * full_bytes + rb;
    s.kept += full * full_k + rk; /* kept <= n */
    s.chunks += full + (rest != 0);
  }
  if (chunk0) chunk0[nt] = s.chunks, val0[nt] = s.n, byte0[nt] = s.bytes;
  if (s.bytes > SIZE_MAX || s.n > SIZE_MAX)
    return dpc_err(DPC_ERANGE, "sparse stream: %llu values, %llu bytes do not fit in memory", (unsigned long long)s.n,
                   (unsigned long long)s.bytes);
  *sum = s;
  return 0;
}

int dpc_sparse_bytes(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, size_t *bytes, uint64_t *kept) {
  layout_sum s;
  int rc = layout(cfg, tlen, nt, &s, NULL, NULL, NULL);
  if (rc < 0) return rc;
  if (bytes) *bytes = (size_t)s.bytes;
  if (kept) *kept = s.kept;
  return 0;
}

/* Per-tensor starts (chunk, value, byte) for the chunk loops; caller frees *starts. */
static int layout_starts(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, layout_sum *s, uint64_t **starts) {
  *starts = NULL;
  int rc = dpc_sparse_cfg_check(cfg);
  if (rc < 0) return rc;
  if (nt < 1) return dpc_err(DPC_EINVAL, "sparse stream: %d tensors (need at least 1)", nt);
  if ((size_t)nt + 1 > SIZE_MAX / (3 * sizeof(uint64_t))) return dpc_err(DPC_ERANGE, "sparse stream: %d tensors", nt);
  uint64_t *a = malloc(3 * ((size_t)nt + 1) * sizeof *a);
  if (!a) return dpc_err(DPC_ENOMEM, "sparse stream: out of memory for %d tensors", nt);
  rc = layout(cfg, tlen, nt, s, a, a + nt + 1, a + 2 * ((size_t)nt + 1));
  if (rc < 0) {
    free(a);
    return rc;
  }
  *starts = a;
  return 0;
}

/* Where global chunk g lies: tensor t (by binary search over chunk0), chunk c within it, its
 * first value, length and first byte. */
typedef struct {
  int t;
  uint64_t c, v0, b0;
  uint32_t len, k;
} chunk_at;

static chunk_at locate(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const uint64_t *chunk0,
                       const uint64_t *val0, const uint64_t *byte0, uint64_t g) {
  int lo = 0, hi = nt - 1; /* the last t with chunk0[t] <= g */
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (chunk0[mid] <= g) lo = mid;
    else hi = mid - 1;
  }
  chunk_at a;
  a.t = lo;
  a.c = g - chunk0[lo];
  a.v0 = val0[lo] + a.c * cfg->chunk;
  uint64_t left = tlen[lo] - a.c * cfg->chunk;
  a.len = left < cfg->chunk ? (uint32_t)left : cfg->chunk;
  a.k = dpc_sparse_chunk_k(cfg, a.len);
  /* Every chunk before this one in the tensor is full. */
  a.b0 = byte0[lo] + a.c * record_bytes(cfg, index_bits(cfg->chunk), dpc_sparse_chunk_k(cfg, cfg->chunk));
  return a;
}

/* LSB-first bit writer: value v of w bits at bit position p sets bits p..p+w-1 of the stream,
 * byte p / 8 from bit p % 8 upward. Writes every byte it covers, the last one zero-padded. */
typedef struct {
  unsigned char *p;
  uint64_t acc;
  unsigned nbits;
} bit_writer;

static void bw_put(bit_writer *w, uint32_t v, unsigned width) {
  w->acc |= (uint64_t)v << w->nbits;
  w->nbits += width;
  while (w->nbits >= 8) {
    *w->p++ = (unsigned char)w->acc;
    w->acc >>= 8;
    w->nbits -= 8;
  }
}

static void bw_flush(bit_writer *w) {
  if (w->nbits) *w->p++ = (unsigned char)w->acc;
  w->acc = 0, w->nbits = 0;
}

/* The matching reader; the caller never reads past the area it was given. */
typedef struct {
  const unsigned char *p;
  uint64_t acc;
  unsigned nbits;
} bit_reader;

static uint32_t br_get(bit_reader *r, unsigned width) {
  while (r->nbits < width) {
    r->acc |= (uint64_t)*r->p++ << r->nbits;
    r->nbits += 8;
  }
  uint32_t v = (uint32_t)(r->acc & (((uint64_t)1 << width) - 1));
  r->acc >>= width;
  r->nbits -= width;
  return v;
}

/* Per-thread scratch of the encoder, sized for the longest chunk. */
typedef struct {
  uint32_t *cand; /* (L) candidate indices of the radix select */
  uint32_t *idx;  /* (k) kept indices, increasing */
  uint8_t *code;  /* (k) codes */
} scratch;

/* Kept indices of x[0..len): the k of largest |x|, ties to the lower index, in increasing
 * order, into idx. Finite input. */
static void select_topk(const float *x, uint32_t len, uint32_t k, scratch *s) {
  uint32_t hist[2048];
  static const unsigned shift[3] = {20, 10, 0}, width[3] = {11, 10, 10};
  uint32_t need = k, prefix = 0, nc = 0;
  for (int pass = 0; pass < 3; pass++) {
    uint32_t nb = 1u << width[pass], mask = nb - 1;
    memset(hist, 0, nb * sizeof *hist);
    if (pass == 0) {
      for (uint32_t i = 0; i < len; i++) hist[(dpc_f32_bits(x[i]) & 0x7fffffffu) >> shift[0]]++;
    } else {
      for (uint32_t j = 0; j < nc; j++) hist[((dpc_f32_bits(x[s->cand[j]]) & 0x7fffffffu) >> shift[pass]) & mask]++;
    }
    /* The bin holding the need-th largest candidate; the bins above it are all kept. */
    uint32_t b = mask;
    while (hist[b] < need) need -= hist[b--];
    prefix |= b << shift[pass];
    /* Candidates: those whose magnitude matches the prefix so far. */
    uint32_t hi_mask = ~((1u << shift[pass]) - 1) & 0x7fffffffu;
    uint32_t m = 0;
    if (pass == 0) {
      for (uint32_t i = 0; i < len; i++)
        if (((dpc_f32_bits(x[i]) & 0x7fffffffu) & hi_mask) == prefix) s->cand[m++] = i;
    } else {
      for (uint32_t j = 0; j < nc; j++)
        if (((dpc_f32_bits(x[s->cand[j]]) & 0x7fffffffu) & hi_mask) == prefix) s->cand[m++] = s->cand[j];
    }
    nc = m;
  }
  /* prefix is now the k-th largest magnitude; need of the entries equal to it are kept, the
   * lowest indices first. */
  uint32_t n = 0;
  for (uint32_t i = 0; i < len; i++) {
    uint32_t u = dpc_f32_bits(x[i]) & 0x7fffffffu;
    if (u > prefix) s->idx[n++] = i;
    else if (u == prefix && need) s->idx[n++] = i, need--;
  }
}

/* Encode one chunk x[0..len) (k kept) into out and subtract s from x. */
static void encode_chunk(const dpc_sparse_cfg *cfg, unsigned ib, float *x, uint32_t len, uint32_t k, scratch *s,
                         unsigned char *out) {
  const unsigned b = cfg->value_bits, nb = 1u << b;
  select_topk(x, len, k, s);
  double sum = 0.0;
  for (uint32_t j = 0; j < k; j++) sum += (double)x[s->idx[j]];
  double mu = sum / (double)k, ss = 0.0;
  for (uint32_t j = 0; j < k; j++) {
    double c = (double)x[s->idx[j]] - mu;
    ss += c * c;
  }
  double sigma = k > 1 ? sqrt(ss / (double)(k - 1)) : 0.0;
  double scale = 6.0 * sigma / (double)nb;
  if (scale == 0.0 || !isfinite(scale)) scale = 1.0;
  double half = (double)(nb / 2), top = (double)(nb - 1);
  double tsum[256];
  uint32_t cnt[256];
  memset(tsum, 0, nb * sizeof *tsum);
  memset(cnt, 0, nb * sizeof *cnt);
  for (uint32_t j = 0; j < k; j++) {
    double v = (double)x[s->idx[j]];
    double q = rint((v - mu) / scale + half);
    q = q < 0.0 ? 0.0 : q > top ? top : q;
    uint8_t c = (uint8_t)q;
    s->code[j] = c;
    tsum[c] += v;
    cnt[c]++;
  }
  float table[256];
  for (unsigned c = 0; c < nb; c++) {
    table[c] = cnt[c] ? (float)(tsum[c] / (double)cnt[c]) : 0.0f;
    dpc_put_le32(out + 4 * c, dpc_f32_bits(table[c]));
  }
  bit_writer w = {out + 4 * nb, 0, 0};
  for (uint32_t j = 0; j < k; j++) bw_put(&w, s->idx[j], ib);
  bw_flush(&w);
  for (uint32_t j = 0; j < k; j++) bw_put(&w, s->code[j], b);
  bw_flush(&w);
  for (uint32_t j = 0; j < k; j++) x[s->idx[j]] = x[s->idx[j]] - table[s->code[j]];
}

int dpc_sparse_encode(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, float *e, unsigned char *out) {
  layout_sum sum;
  uint64_t *st;
  int rc = layout_starts(cfg, tlen, nt, &sum, &st);
  if (rc < 0) return rc;
  if (!e || !out) {
    free(st);
    return dpc_err(DPC_EINVAL, "sparse encode: NULL buffer");
  }
  /* Refuse a non-finite accumulator before anything changes. */
  const size_t n = (size_t)sum.n;
  uint32_t top = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u = dpc_f32_bits(e[i]) & 0x7fffffffu;
    top = u > top ? u : top;
  }
  if (top >= 0x7f800000u) {
    size_t i = 0;
    while (isfinite(e[i])) i++;
    free(st);
    return dpc_err(DPC_ENUMERIC, "sparse encode: value %zu is %g: refused before encoding", i, (double)e[i]);
  }
  uint32_t maxlen = 0;
  for (int t = 0; t < nt; t++) {
    uint32_t l = tlen[t] < cfg->chunk ? (uint32_t)tlen[t] : cfg->chunk;
    maxlen = l > maxlen ? l : maxlen;
  }
  int nthr = 1;
#ifdef _OPENMP
  nthr = omp_get_max_threads();
  if (nthr < 1) nthr = 1;
  if ((uint64_t)nthr > sum.chunks) nthr = (int)sum.chunks;
#endif
  /* One block of scratch per thread: cand and idx (uint32) and codes (bytes) for maxlen. */
  size_t per = (size_t)maxlen * (2 * sizeof(uint32_t) + 1);
  unsigned char *mem = malloc((size_t)nthr * per);
  if (!mem) {
    free(st);
    return dpc_err(DPC_ENOMEM, "sparse encode: out of memory for %d threads' scratch", nthr);
  }
  const uint64_t *chunk0 = st, *val0 = st + nt + 1, *byte0 = st + 2 * ((size_t)nt + 1);
  const unsigned ib = index_bits(cfg->chunk);
  const long long nchunks = (long long)sum.chunks;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthr) if (n >= ((size_t)1 << 16))
#endif
  {
    int me = 0;
#ifdef _OPENMP
    me = omp_get_thread_num();
#endif
    unsigned char *m = mem + (size_t)me * per;
    scratch s = {(uint32_t *)(void *)m, (uint32_t *)(void *)(m + (size_t)maxlen * 4), m + (size_t)maxlen * 8};
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 8)
#endif
    for (long long g = 0; g < nchunks; g++) {
      chunk_at a = locate(cfg, tlen, nt, chunk0, val0, byte0, (uint64_t)g);
      encode_chunk(cfg, ib, e + a.v0, a.len, a.k, &s, out + a.b0);
    }
  }
  free(mem);
  free(st);
  return 0;
}

/* Check (and with y, decode; with ss, add the squares of the values to *ss) one chunk record at in. */
static int check_chunk(const dpc_sparse_cfg *cfg, unsigned ib, const chunk_at *a, const unsigned char *in, float *y,
                       double *ss) {
  const unsigned b = cfg->value_bits, nb = 1u << b;
  float table[256];
  for (unsigned c = 0; c < nb; c++) {
    table[c] = dpc_bits_f32(dpc_get_le32(in + 4 * c));
    if (!isfinite(table[c]))
      return dpc_err(DPC_ENUMERIC, "sparse stream: tensor %d chunk %llu: table[%u] is %g", a->t,
                     (unsigned long long)a->c, c, (double)table[c]);
  }
  if (y) memset(y, 0, (size_t)a->len * sizeof *y);
  /* Indices: increasing, inside the chunk, zero padding. */
  const unsigned char *ip = in + 4 * nb;
  const size_t ibytes = ((size_t)a->k * ib + 7) / 8;
  bit_reader r = {ip, 0, 0};
  uint32_t prev = 0;
  for (uint32_t j = 0; j < a->k; j++) {
    uint32_t i = br_get(&r, ib);
    if (i >= a->len)
      return dpc_err(DPC_EFORMAT, "sparse stream: tensor %d chunk %llu: index %u (entry %u) is past the chunk's %u values",
                     a->t, (unsigned long long)a->c, i, j, a->len);
    if (j > 0 && i <= prev)
      return dpc_err(DPC_EFORMAT, "sparse stream: tensor %d chunk %llu: index %u follows %u (indices must increase)",
                     a->t, (unsigned long long)a->c, i, prev);
    prev = i;
  }
  if (r.acc)
    return dpc_err(DPC_EFORMAT, "sparse stream: tensor %d chunk %llu: index padding bits are not zero", a->t,
                   (unsigned long long)a->c);
  /* Codes: which are used, zero padding; then the values. */
  uint32_t used[8] = {0};
  bit_reader rc = {ip + ibytes, 0, 0};
  r = (bit_reader){ip, 0, 0};
  for (uint32_t j = 0; j < a->k; j++) {
    uint32_t c = br_get(&rc, b), i = br_get(&r, ib);
    used[c >> 5] |= 1u << (c & 31);
    if (y) y[i] = table[c];
    if (ss) *ss += (double)table[c] * (double)table[c];
  }
  if (rc.acc)
    return dpc_err(DPC_EFORMAT, "sparse stream: tensor %d chunk %llu: code padding bits are not zero", a->t,
                   (unsigned long long)a->c);
  for (unsigned c = 0; c < nb; c++)
    if (!(used[c >> 5] >> (c & 31) & 1u) && dpc_f32_bits(table[c]) != 0)
      return dpc_err(DPC_EFORMAT, "sparse stream: tensor %d chunk %llu: table[%u] is %g but no index uses code %u (must be +0)",
                     a->t, (unsigned long long)a->c, c, (double)table[c], c);
  return 0;
}

static int check_stream(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const unsigned char *in, size_t bytes,
                        float *y, double *ss) {
  layout_sum sum;
  uint64_t *st;
  int rc = layout_starts(cfg, tlen, nt, &sum, &st);
  if (rc < 0) return rc;
  if (bytes != sum.bytes) {
    free(st);
    return dpc_err(DPC_EFORMAT, "sparse stream: %zu bytes, expected %llu for %llu values in %d tensors (chunk %u, density %g, %u bits)",
                   bytes, (unsigned long long)sum.bytes, (unsigned long long)sum.n, nt, cfg->chunk, cfg->density,
                   cfg->value_bits);
  }
  if (!in && bytes) {
    free(st);
    return dpc_err(DPC_EINVAL, "sparse stream: NULL input");
  }
  const uint64_t *chunk0 = st, *val0 = st + nt + 1, *byte0 = st + 2 * ((size_t)nt + 1);
  const unsigned ib = index_bits(cfg->chunk);
  for (uint64_t g = 0; g < sum.chunks && rc == 0; g++) {
    chunk_at a = locate(cfg, tlen, nt, chunk0, val0, byte0, g);
    rc = check_chunk(cfg, ib, &a, in + a.b0, y ? y + a.v0 : NULL, ss);
  }
  free(st);
  return rc;
}

int dpc_sparse_check(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const unsigned char *in, size_t bytes) {
  return check_stream(cfg, tlen, nt, in, bytes, NULL, NULL);
}

int dpc_sparse_sumsq(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const unsigned char *in, size_t bytes,
                     double *ss) {
  *ss = 0;
  return check_stream(cfg, tlen, nt, in, bytes, NULL, ss);
}

int dpc_sparse_decode(const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, const unsigned char *in, size_t bytes,
                      float *y) {
  if (!y) return dpc_err(DPC_EINVAL, "sparse decode: NULL output");
  return check_stream(cfg, tlen, nt, in, bytes, y, NULL);
}
