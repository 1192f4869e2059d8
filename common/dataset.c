/* dataset.c — concatenated token shards and the DiLoCo data-parallel batch order. */
#include "common/dataset.h"
#include "common/errors.h"
#include "common/shard.h"

#include <stdlib.h>
#include <string.h>

struct dataset {
  int n;
  shard **shards;
  uint64_t *start; /* start[i] = tokens before shard i; start[n] = N */
};

void dataset_close(dataset *ds) {
  if (!ds) return;
  for (int i = 0; i < ds->n; i++) shard_close(ds->shards[i]);
  free(ds->shards);
  free(ds->start);
  free(ds);
}

int dataset_open(const char *const *paths, int n, dataset **out) {
  *out = NULL;
  if (n < 1 || !paths) return dpc_err(DPC_EINVAL, "dataset: no shards given");
  dataset *ds = calloc(1, sizeof *ds);
  if (!ds || !(ds->shards = calloc((size_t)n, sizeof *ds->shards)) ||
      !(ds->start = calloc((size_t)n + 1, sizeof *ds->start))) {
    dataset_close(ds);
    return dpc_err(DPC_ENOMEM, "dataset: out of memory for %d shards", n);
  }
  for (int i = 0; i < n; i++) {
    int rc = shard_open(paths[i], &ds->shards[i]);
    if (rc) {
      dataset_close(ds);
      return rc;
    }
    ds->n = i + 1;
    ds->start[i + 1] = ds->start[i] + shard_num_tokens(ds->shards[i]);
  }
  *out = ds;
  return 0;
}

uint64_t dataset_num_tokens(const dataset *ds) { return ds->start[ds->n]; }

long dataset_num_batches(const dataset *ds, int B, int T) {
  if (B < 1 || T < 1) return dpc_err(DPC_EINVAL, "dataset: batch shape B=%d T=%d must be positive", B, T);
  uint64_t N = dataset_num_tokens(ds), bt = (uint64_t)B * (uint64_t)T;
  return N == 0 ? 0 : (long)((N - 1) / bt);
}

/* Index of the shard holding stream position pos (< N): last i with start[i] <= pos. */
static int shard_of(const dataset *ds, uint64_t pos) {
  int lo = 0, hi = ds->n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (ds->start[mid] <= pos) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

int dataset_read(const dataset *ds, uint64_t start, size_t n, int *dst) {
  uint64_t N = dataset_num_tokens(ds);
  if (start > N || n > N - start)
    return dpc_err(DPC_ERANGE, "dataset: tokens [%llu, +%zu) outside the %llu-token stream",
                   (unsigned long long)start, n, (unsigned long long)N);
  while (n > 0) {
    int i = shard_of(ds, start);
    uint64_t off = start - ds->start[i];
    uint64_t avail = shard_num_tokens(ds->shards[i]) - off; /* > 0: empty shards are skipped */
    size_t m = n < avail ? n : (size_t)avail;
    const uint16_t *t16 = shard_tokens(ds->shards[i]);
    const uint32_t *t32 = shard_tokens32(ds->shards[i]);
    /* Ids above INT32_MAX cannot be any vocabulary's; dataset_check_vocab refuses them. */
    for (size_t k = 0; k < m; k++) {
      uint32_t v = shard_token_at(t16, t32, off + k);
      dst[k] = v > INT32_MAX ? INT32_MAX : (int)v;
    }
    dst += m;
    n -= m;
    start += m;
  }
  return 0;
}

int dataset_batch(const dataset *ds, int B, int T, long b, int r, int R, int *inputs, int *targets) {
  long nb = dataset_num_batches(ds, B, T);
  if (nb < 0) return (int)nb;
  if (b < 0 || R < 1 || r < 0 || r >= R)
    return dpc_err(DPC_EINVAL, "dataset: batch %ld of replica %d of %d is not valid", b, r, R);
  uint64_t bt = (uint64_t)B * (uint64_t)T;
  if (nb == 0)
    return dpc_err(DPC_ERANGE, "dataset: %llu tokens is too small for one batch of B=%d x T=%d; need at least %llu tokens",
                   (unsigned long long)dataset_num_tokens(ds), B, T, (unsigned long long)(bt + 1));
  /* (b*R + r) mod nb without overflow. */
  __extension__ unsigned __int128 idx = ((unsigned __int128)(unsigned long)b * (unsigned)R + (unsigned)r) % (unsigned long)nb;
  uint64_t o = (uint64_t)idx * bt;
  for (int j = 0; j < B; j++) {
    uint64_t s = o + (uint64_t)j * (uint64_t)T;
    int rc = dataset_read(ds, s, (size_t)T, inputs + (size_t)j * T);
    if (!rc) rc = dataset_read(ds, s + 1, (size_t)T, targets + (size_t)j * T);
    if (rc) return rc;
  }
  return 0;
}

int dataset_max_token(const dataset *ds, int *max_token) {
  int mx = -1;
  for (int i = 0; i < ds->n; i++) {
    const uint16_t *t16 = shard_tokens(ds->shards[i]);
    const uint32_t *t32 = shard_tokens32(ds->shards[i]);
    size_t n = shard_num_tokens(ds->shards[i]);
    for (size_t k = 0; k < n; k++) {
      uint32_t v = shard_token_at(t16, t32, k);
      if (v > INT32_MAX) v = INT32_MAX;
      if ((int)v > mx) mx = (int)v;
    }
  }
  *max_token = mx;
  return 0;
}

int dataset_check_vocab(const dataset *ds, int vocab_size) {
  for (int i = 0; i < ds->n; i++) {
    const uint16_t *t16 = shard_tokens(ds->shards[i]);
    const uint32_t *t32 = shard_tokens32(ds->shards[i]);
    size_t n = shard_num_tokens(ds->shards[i]);
    for (size_t k = 0; k < n; k++) {
      uint32_t v = shard_token_at(t16, t32, k);
      if (vocab_size < 0 || v >= (uint32_t)vocab_size)
        return dpc_err(DPC_ERANGE, "shard %s: token %u at position %zu is >= vocab_size %d (wrong tokenizer or config?)",
                       shard_path(ds->shards[i]), v, k, vocab_size);
    }
  }
  return 0;
}
