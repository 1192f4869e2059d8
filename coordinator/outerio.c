/* outerio.c — the outer steps streamed range by range over the blob store (contract in
 * outerio.h). */
#include "coordinator/outerio.h"

#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "kernels/outer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ask for write-back of the new blobs every this many floats appended (64 MiB). */
#define WRITEBACK_FLOATS ((size_t)16 << 20)

/* One range of the fragment: floats [lo, lo + len); for SparseLoCo deltas also where its
 * records sit in the encoded stream (a range never splits a sparse chunk). */
typedef struct {
  size_t lo, len;
  size_t sp_off, sp_bytes;
} orange;

/* The ranges of a fragment: plain cuts of rf floats, or, with sparse deltas, pieces of one
 * tensor each that start at a multiple of the codec chunk (a chunk record is self-contained,
 * so a piece decodes on its own as a one-tensor stream). */
static int plan_ranges(size_t len, size_t rf, const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt, orange **out,
                       size_t *n_out) {
  size_t cap = len / rf + 2 + (cfg ? (size_t)nt : 0), n = 0;
  orange *r = malloc(cap * sizeof *r);
  if (!r) return dpc_err(DPC_ENOMEM, "outer step: out of memory for %zu ranges", cap);
  if (!cfg) {
    for (size_t lo = 0; lo < len; lo += rf) r[n++] = (orange){.lo = lo, .len = len - lo < rf ? len - lo : rf};
  } else {
    size_t step = rf / cfg->chunk * cfg->chunk, lo = 0, off = 0;
    if (step == 0) step = cfg->chunk;
    for (int t = 0; t < nt; t++) {
      for (uint64_t pos = 0; pos < tlen[t]; pos += step) {
        uint64_t piece = tlen[t] - pos < step ? tlen[t] - pos : step;
        size_t bytes = 0;
        int rc = dpc_sparse_bytes(cfg, &piece, 1, &bytes, NULL);
        if (rc < 0) {
          free(r);
          return rc;
        }
        if (n == cap) {
          orange *g = realloc(r, 2 * cap * sizeof *r);
          if (!g) {
            free(r);
            return dpc_err(DPC_ENOMEM, "outer step: out of memory for the range plan");
          }
          r = g;
          cap *= 2;
        }
        r[n++] = (orange){.lo = lo, .len = (size_t)piece, .sp_off = off, .sp_bytes = bytes};
        lo += (size_t)piece;
        off += bytes;
      }
    }
    if (lo != len) {
      free(r);
      return dpc_err(DPC_ESHAPE, "outer step: the sparse layout covers %zu floats, the fragment has %zu", lo, len);
    }
  }
  *out = r;
  *n_out = n;
  return 0;
}

static int is_kind(const char *name, blob_kind want) {
  blob_kind k = BLOB_DELTA;
  return blob_kind_of_name(name, &k) == 0 && k == want;
}
static int is_sparse(const char *name) { return is_kind(name, BLOB_SPARSE); }
static int is_encoded(const char *name) { return is_kind(name, BLOB_ENCODED); }

/* The delta applied is the one acknowledged: its payload crc must equal the crc its row
 * recorded at the commit point. */
static int matches_row(const char *name, uint32_t crc, uint32_t want) {
  if (crc == want) return 0;
  return dpc_err(DPC_ECHECKSUM, "delta blob %s holds crc 0x%08x, but its row recorded 0x%08x: not the acknowledged "
                 "delta; refusing to apply it", name, crc, want);
}

/* A SparseLoCo delta read whole (it is small), checked against its row: *enc (caller frees). */
static int read_sparse(const outerio_sync *a, int i, size_t want_bytes, unsigned char **enc) {
  const char *name = a->delta_blobs[i];
  float *buf = NULL;
  size_t nf = 0;
  uint32_t crc = 0;
  int rc = blob_read_alloc(a->bs, name, BLOB_SPARSE, &buf, &nf, &crc);
  if (rc < 0) return rc;
  if (nf != (want_bytes + 3) / 4)
    rc = dpc_err(DPC_ESHAPE, "sparse delta blob %s holds %zu floats, expected %zu", name, nf, (want_bytes + 3) / 4);
  if (!rc) rc = matches_row(name, crc, a->delta_crcs[i]);
  if (rc) {
    free(buf);
    return rc;
  }
  *enc = (unsigned char *)buf;
  return 0;
}

static int all_finite(const float *x, size_t n, size_t base, const char *what) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; j++) {
    uint32_t bits;
    memcpy(&bits, &x[j], 4);
    bad |= (~bits & 0x7f800000u) == 0;
  }
  if (!bad) return 0;
  for (size_t j = 0; j < n; j++)
    if (!isfinite(x[j])) return dpc_err(DPC_ENUMERIC, "%s gave a non-finite parameter at index %zu", what, base + j);
  return 0;
}

/* Read m floats of r into dst, or zeros without a reader. */
static int read_or_zero(blob_reader *r, float *dst, size_t m) {
  if (r) return blob_reader_read(r, dst, m * sizeof *dst);
  memset(dst, 0, m * sizeof *dst);
  return 0;
}

/* Close a reader, keeping the first error in *rc (a later checksum error wins over an earlier
 * numeric one: a corrupt input explains a non-finite result). */
static void close_reader(blob_reader **r, int *rc, uint32_t *crc) {
  if (!*r) return;
  int e = blob_reader_close(*r, crc);
  *r = NULL;
  if (e < 0 && (*rc == 0 || *rc == DPC_ENUMERIC)) *rc = e;
}

/* A sync outer step's buffers and open files: one range of each (theta, u, the average, a
 * decode buffer per sparse delta), the inputs being read and the outputs being written. */
typedef struct {
  size_t maxr; /* the longest range, in floats */
  float *theta, *u, *avg;
  float **d;           /* [n] decode buffers of sparse and encoded deltas (NULL for fp32 spools, read in place) */
  const float **dc;    /* [n] the current range of each delta */
  unsigned char **enc; /* [n] a sparse delta's whole stream */
  blob_reader **dr;    /* [n] an fp32 or encoded delta's reader */
  uint32_t *dcrc;      /* [n] an encoded delta: CRC-32C of its decoded payload so far */
  size_t *epad;        /* [n] an encoded delta: the blob's padding bytes after the stream */
  blob_reader *pr, *ur;
  blob_writer *pw, *uw;
} sync_io;

static void sync_io_free(sync_io *io, int n) {
  blob_writer_abort(io->pw);
  blob_writer_abort(io->uw);
  blob_reader_abort(io->pr);
  blob_reader_abort(io->ur);
  for (int i = 0; i < n; i++) {
    if (io->dr) blob_reader_abort(io->dr[i]);
    if (io->enc) free(io->enc[i]);
    if (io->d) free(io->d[i]);
  }
  free(io->dr);
  free(io->dcrc);
  free(io->epad);
  free(io->enc);
  free(io->dc);
  free(io->d);
  free(io->theta);
  free(io->u);
  free(io->avg);
}

/* Allocate the range buffers and open every input and both outputs. */
static int sync_io_open(const outerio_sync *a, size_t maxr, size_t sp_bytes, sync_io *io) {
  const int n = a->n;
  io->maxr = maxr;
  io->theta = malloc(maxr * sizeof *io->theta);
  io->u = malloc(maxr * sizeof *io->u);
  io->avg = malloc(maxr * sizeof *io->avg);
  io->d = calloc((size_t)n, sizeof *io->d);
  io->dc = calloc((size_t)n, sizeof *io->dc);
  io->enc = calloc((size_t)n, sizeof *io->enc);
  io->dr = calloc((size_t)n, sizeof *io->dr);
  io->dcrc = calloc((size_t)n, sizeof *io->dcrc);
  io->epad = calloc((size_t)n, sizeof *io->epad);
  if (!io->theta || !io->u || !io->avg || !io->d || !io->dc || !io->enc || !io->dr || !io->dcrc || !io->epad)
    return dpc_err(DPC_ENOMEM, "out of memory for the outer step (%zu-float ranges)", maxr);
  for (int i = 0; i < n; i++) /* a decode buffer for sparse and encoded deltas; fp32 spools are read in place */
    if ((is_sparse(a->delta_blobs[i]) || is_encoded(a->delta_blobs[i])) && !(io->d[i] = malloc(maxr * sizeof **io->d)))
      return dpc_err(DPC_ENOMEM, "out of memory for the outer step (%zu-float ranges)", maxr);
  int rc;
  if ((rc = blob_reader_open(a->bs, a->param_blob, BLOB_PARAMS, a->len, &io->pr)) < 0) return rc;
  if (a->momentum_blob && a->momentum_blob[0] &&
      (rc = blob_reader_open(a->bs, a->momentum_blob, BLOB_MOMENTUM, a->len, &io->ur)) < 0)
    return rc;
  for (int i = 0; i < n; i++) {
    size_t eb = 0;
    if (is_sparse(a->delta_blobs[i])) {
      rc = read_sparse(a, i, sp_bytes, &io->enc[i]);
    } else if (is_encoded(a->delta_blobs[i])) { /* the stream padded to whole floats */
      if ((rc = dpc_codec_bytes(a->codec, a->len, a->block_floats, &eb)) == 0) {
        io->epad[i] = (eb + 3) / 4 * 4 - eb;
        rc = blob_reader_open(a->bs, a->delta_blobs[i], BLOB_ENCODED, (eb + 3) / 4, &io->dr[i]);
      }
    } else {
      rc = blob_reader_open(a->bs, a->delta_blobs[i], BLOB_DELTA, a->len, &io->dr[i]);
    }
    if (rc < 0) return rc;
  }
  if ((rc = blob_writer_open(a->bs, a->new_param, BLOB_PARAMS, a->len, &io->pw)) < 0) return rc;
  return blob_writer_open_ex(a->bs, a->new_momentum, BLOB_MOMENTUM, a->len, a->momentum_later ? BLOB_WRITE_LATER : 0,
                             &io->uw);
}

/* The range [lo, lo + m) of encoded delta i (ranges start on a block: plan_ranges), decoded into
 * io->d[i] and added to its decoded CRC; the last range reads the blob's padding too. A stream
 * that does not decode sets *numeric (as a non-finite result does: the inputs are read on, and
 * a checksum error found at their close wins). */
static int encoded_range(const outerio_sync *a, sync_io *io, int i, size_t lo, size_t m, int *numeric) {
  size_t eb = 0;
  const void *v;
  int rc = dpc_codec_bytes(a->codec, m, a->block_floats, &eb);
  if (rc == 0) rc = blob_reader_view(io->dr[i], eb, &v);
  if (rc < 0) return rc;
  if (!*numeric && (rc = dpc_codec_decode(a->codec, v, eb, m, a->block_floats, io->d[i])) < 0)
    *numeric = dpc_err(DPC_ENUMERIC, "delta blob %s does not decode in floats %zu..%zu: %s", a->delta_blobs[i], lo,
                       lo + m, dpc_errmsg());
  if (!*numeric) io->dcrc[i] = dpc_crc32c(io->dcrc[i], io->d[i], m * sizeof(float));
  if (lo + m == a->len && io->epad[i] > 0) rc = blob_reader_view(io->dr[i], io->epad[i], &v);
  return rc < 0 ? rc : 0;
}

/* Step every range: read theta, u and the deltas' range, average, Nesterov, write. Returns a
 * negative code for an I/O or format failure; otherwise 0, or DPC_ENUMERIC in *numeric (the
 * message set) after a non-finite result: the inputs are then still read to their end (no
 * more computing or writing), so that a corrupt input is reported as such rather than as a
 * numeric failure. */
static int sync_ranges(const outerio_sync *a, const orange *rg, size_t nr, sync_io *io, int *numeric) {
  const int n = a->n;
  size_t since_wb = 0;
  int rc = 0;
  *numeric = 0;
  for (size_t k = 0; k < nr; k++) {
    const size_t lo = rg[k].lo, m = rg[k].len;
    if ((rc = read_or_zero(io->pr, io->theta, m)) < 0 || (rc = read_or_zero(io->ur, io->u, m)) < 0) return rc;
    for (int i = 0; i < n; i++) {
      const void *v = io->d[i];
      if (io->dr[i] && io->d[i]) rc = encoded_range(a, io, i, lo, m, numeric);
      else if (io->dr[i]) rc = blob_reader_view(io->dr[i], m * sizeof(float), &v);
      else if (!*numeric) {
        uint64_t piece = m;
        rc = dpc_sparse_decode(a->sp_cfg, &piece, 1, io->enc[i] + rg[k].sp_off, rg[k].sp_bytes, io->d[i]);
      }
      if (rc < 0) return rc;
      io->dc[i] = v;
    }
    if (*numeric) continue;
    if ((rc = outer_average(io->dc, a->weights, n, m, io->avg)) < 0) {
      if (rc != DPC_ENUMERIC) return rc;
      *numeric = dpc_err(DPC_ENUMERIC, "the average of the deltas is not finite in floats %zu..%zu (%s)", lo, lo + m,
                         dpc_errmsg());
      continue;
    }
    outer_nesterov_step(io->theta, io->u, io->avg, m, a->lr, a->mu, a->nesterov);
    if ((rc = all_finite(io->theta, m, lo, "outer step")) < 0) {
      *numeric = rc;
      continue;
    }
    if ((rc = blob_writer_append(io->pw, io->theta, m * sizeof *io->theta)) < 0 ||
        (rc = blob_writer_append(io->uw, io->u, m * sizeof *io->u)) < 0)
      return rc;
    if ((since_wb += m) >= WRITEBACK_FLOATS) {
      blob_writer_writeback(io->pw);
      blob_writer_writeback(io->uw);
      since_wb = 0;
    }
  }
  return 0;
}

/* Close every input, checking each fp32 delta's CRC against its row: the first error, with a
 * checksum error winning over the numeric one (rc = numeric on entry). */
static int sync_close_inputs(const outerio_sync *a, sync_io *io, int rc) {
  close_reader(&io->pr, &rc, NULL);
  close_reader(&io->ur, &rc, NULL);
  for (int i = 0; i < a->n; i++) {
    uint32_t crc = 0;
    int e = 0;
    close_reader(&io->dr[i], &e, &crc);
    if (io->d[i] && !io->enc[i]) crc = io->dcrc[i]; /* encoded: the row recorded the decoded payload's */
    if (!e && !io->enc[i] && !(io->d[i] && rc == DPC_ENUMERIC))
      e = matches_row(a->delta_blobs[i], crc, a->delta_crcs[i]);
    if (e < 0 && (rc == 0 || rc == DPC_ENUMERIC)) rc = e;
  }
  return rc;
}

int outerio_sync_step(const outerio_sync *a, uint32_t *param_crc, uint32_t *momentum_crc) {
  const size_t rf = a->range_floats ? a->range_floats : OUTERIO_RANGE_FLOATS;
  const int n = a->n;
  if (n < 1) return dpc_err(DPC_EINVAL, "outer step: no deltas");
  int sparse = 0, encoded = 0;
  for (int i = 0; i < n; i++) sparse |= is_sparse(a->delta_blobs[i]), encoded |= is_encoded(a->delta_blobs[i]);
  if (sparse && !a->sp_tlen)
    return dpc_err(DPC_EFORMAT, "delta blob is sparse, but the job is not a SparseLoCo job");
  if (encoded && (!dpc_codec_supported(a->codec) || a->codec == DPC_CODEC_FP32 ||
                  (dpc_codec_is_block(a->codec) && a->block_floats == 0)))
    return dpc_err(DPC_EFORMAT, "delta blob is encoded, but the job has no delta codec to decode it with");
  /* An encoded delta's ranges start on a block: each decodes on its own. */
  size_t rfe = rf;
  if (encoded && dpc_codec_is_block(a->codec)) rfe = rf >= a->block_floats ? rf / a->block_floats * a->block_floats
                                                                          : a->block_floats;
  orange *rg = NULL;
  size_t nr = 0;
  int rc = plan_ranges(a->len, rfe, sparse ? a->sp_cfg : NULL, a->sp_tlen, a->sp_nt, &rg, &nr);
  if (rc < 0) return rc;
  size_t sp_bytes = 0;
  if (sparse && (rc = dpc_sparse_bytes(a->sp_cfg, a->sp_tlen, a->sp_nt, &sp_bytes, NULL)) < 0) {
    free(rg);
    return rc;
  }
  size_t maxr = 0;
  for (size_t k = 0; k < nr; k++)
    if (rg[k].len > maxr) maxr = rg[k].len;
  if (maxr == 0) maxr = 1;
  sync_io io = {0};
  int numeric = 0;
  if ((rc = sync_io_open(a, maxr, sp_bytes, &io)) < 0 || (rc = sync_ranges(a, rg, nr, &io, &numeric)) < 0) goto out;
  /* Every input checked before anything is published. */
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", numeric ? dpc_errmsg() : "");
  rc = sync_close_inputs(a, &io, numeric);
  if (rc == DPC_ENUMERIC && numeric) dpc_err(DPC_ENUMERIC, "%s", msg);
  if (rc < 0) goto out;
  rc = blob_writer_commit(io.pw, param_crc);
  io.pw = NULL;
  if (rc < 0) goto out;
  if (a->momentum_later) {
    *momentum_crc = blob_writer_crc(io.uw);
    *a->momentum_later = io.uw;
  } else {
    rc = blob_writer_commit(io.uw, momentum_crc);
  }
  io.uw = NULL;
  if (rc == 0) { /* θ_t, u_t and the round's deltas are inputs of no later step */
    blob_store_uncache(a->bs, a->param_blob);
    blob_store_uncache(a->bs, a->momentum_blob);
    for (int i = 0; i < n; i++) blob_store_uncache(a->bs, a->delta_blobs[i]);
  }
out:
  sync_io_free(&io, n);
  free(rg);
  return rc;
}

int outerio_async_step(const outerio_async *a, uint32_t *param_crc, uint32_t *momentum_crc, uint32_t *dnbuf_crc,
                       int64_t *dn_t_out) {
  const size_t rf = a->range_floats ? a->range_floats : OUTERIO_RANGE_FLOATS;
  const size_t maxr = a->len < rf ? (a->len ? a->len : 1) : rf;
  const int mom = a->rule != OUTERIO_SGD, dn = a->rule == OUTERIO_DN;
  float *theta = malloc(maxr * sizeof(float));
  const float *g = NULL;
  float *m = calloc(maxr, sizeof(float)), *buf = calloc(maxr, sizeof(float));
  blob_reader *pr = NULL, *gr = NULL, *mr = NULL, *br = NULL;
  blob_writer *pw = NULL, *mw = NULL, *bw = NULL;
  int rc = 0;
  int64_t t_after = a->dn_t;
  if (!theta || !m || !buf) {
    rc = dpc_err(DPC_ENOMEM, "out of memory for the async outer step (%zu-float ranges)", maxr);
    goto out;
  }
  if ((rc = blob_reader_open(a->bs, a->param_blob, BLOB_PARAMS, a->len, &pr)) < 0) goto out;
  if ((rc = blob_reader_open(a->bs, a->delta_blob, BLOB_DELTA, a->len, &gr)) < 0) goto out;
  if (mom && a->momentum_blob && a->momentum_blob[0] &&
      (rc = blob_reader_open(a->bs, a->momentum_blob, BLOB_MOMENTUM, a->len, &mr)) < 0)
    goto out;
  if (dn && a->dnbuf_blob && a->dnbuf_blob[0] && (rc = blob_reader_open(a->bs, a->dnbuf_blob, BLOB_DN_BUF, a->len, &br)) < 0)
    goto out;
  if ((rc = blob_writer_open(a->bs, a->new_param, BLOB_PARAMS, a->len, &pw)) < 0) goto out;
  if (mom && (rc = blob_writer_open(a->bs, a->new_momentum, BLOB_MOMENTUM, a->len, &mw)) < 0) goto out;
  if (dn && (rc = blob_writer_open(a->bs, a->new_dnbuf, BLOB_DN_BUF, a->len, &bw)) < 0) goto out;
  int numeric = 0;
  size_t since_wb = 0;
  for (size_t lo = 0; lo < a->len; lo += rf) {
    const size_t k = a->len - lo < rf ? a->len - lo : rf;
    const void *gv;
    if ((rc = read_or_zero(pr, theta, k)) < 0 || (rc = blob_reader_view(gr, k * sizeof(float), &gv)) < 0) goto out;
    g = gv;
    if (mom && (rc = read_or_zero(mr, m, k)) < 0) goto out;
    if (dn && (rc = read_or_zero(br, buf, k)) < 0) goto out;
    if (numeric) continue;
    if (dn) {
      outer_dn_state s;
      if ((rc = outer_dn_init(&s, buf, m, k, a->N, a->c, a->dn_t, 0)) < 0) goto out;
      if ((rc = outer_dn_apply(&s, theta, g, a->lr, a->mu)) < 0) goto out;
      t_after = s.t;
    } else if (mom) {
      outer_nesterov_step(theta, m, g, k, a->lr, a->mu, 1);
    } else {
      outer_sgd_step(theta, g, k, a->lr);
    }
    if ((rc = all_finite(theta, k, lo, "async outer step")) < 0) {
      numeric = rc;
      continue;
    }
    if ((rc = blob_writer_append(pw, theta, k * sizeof(float))) < 0) goto out;
    if (mom && (rc = blob_writer_append(mw, m, k * sizeof(float))) < 0) goto out;
    if (dn && (rc = blob_writer_append(bw, buf, k * sizeof(float))) < 0) goto out;
    if ((since_wb += k) >= WRITEBACK_FLOATS) {
      blob_writer_writeback(pw);
      if (mw) blob_writer_writeback(mw);
      if (bw) blob_writer_writeback(bw);
      since_wb = 0;
    }
  }
  if (dn && a->len == 0) t_after = a->dn_t + 1;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", numeric ? dpc_errmsg() : "");
  rc = numeric;
  uint32_t gcrc = 0;
  int ge = 0;
  close_reader(&pr, &rc, NULL);
  close_reader(&gr, &ge, &gcrc);
  if (!ge) ge = matches_row(a->delta_blob, gcrc, a->delta_crc);
  if (ge < 0 && (rc == 0 || rc == DPC_ENUMERIC)) rc = ge;
  close_reader(&mr, &rc, NULL);
  close_reader(&br, &rc, NULL);
  if (rc == DPC_ENUMERIC && numeric) dpc_err(DPC_ENUMERIC, "%s", msg);
  if (rc < 0) goto out;
  rc = blob_writer_commit(pw, param_crc);
  pw = NULL;
  if (!rc && mom) {
    rc = blob_writer_commit(mw, momentum_crc);
    mw = NULL;
  }
  if (!rc && dn) {
    rc = blob_writer_commit(bw, dnbuf_crc);
    bw = NULL;
  }
  if (!rc && dn_t_out) *dn_t_out = t_after;
  if (!rc) { /* inputs of no later step */
    blob_store_uncache(a->bs, a->param_blob);
    blob_store_uncache(a->bs, a->momentum_blob);
    blob_store_uncache(a->bs, a->dnbuf_blob);
    blob_store_uncache(a->bs, a->delta_blob);
  }
out:
  blob_writer_abort(pw);
  blob_writer_abort(mw);
  blob_writer_abort(bw);
  blob_reader_abort(pr);
  blob_reader_abort(gr);
  blob_reader_abort(mr);
  blob_reader_abort(br);
  free(theta);
  free(m);
  free(buf);
  return rc;
}
