/* dataset.h — a list of token shards read as one concatenated stream of N tokens, and the
 * batch order of docs/design.md §3 ("Data order"):
 *
 *   nb = floor((N - 1) / (B*T)) whole batches; batch b of replica r of R starts at
 *   o = ((b*R + r) mod nb) * B*T; sequence j has inputs tokens[o + j*T .. o + j*T + T - 1]
 *   and targets tokens[o + j*T + 1 .. o + j*T + T]
 *
 * (llm.c's data-parallel loader). Sequences may cross shard boundaries. A dataset is
 * immutable once open; dataset_batch may be called from any number of threads. */
#ifndef DPC_DATASET_H
#define DPC_DATASET_H

#include <stddef.h>
#include <stdint.h>

typedef struct dataset dataset;

/* Open shards paths[0, n) in this order (n >= 1). Errors are those of shard_open. */
int dataset_open(const char *const *paths, int n, dataset **out);
void dataset_close(dataset *ds);

/* N, the total number of tokens. */
uint64_t dataset_num_tokens(const dataset *ds);

/* floor((N - 1) / (B*T)); 0 when the data is too small, negative DPC_EINVAL for bad B or T. */
long dataset_num_batches(const dataset *ds, int B, int T);

/* Fill inputs[B*T] and targets[B*T] with batch `b` (>= 0) of replica r of R as above.
 * DPC_ERANGE (with the number of tokens needed) if nb == 0; DPC_EINVAL for bad arguments. */
int dataset_batch(const dataset *ds, int B, int T, long b, int r, int R, int *inputs, int *targets);

/* Copy tokens [start, start + n) of the stream into dst. */
int dataset_read(const dataset *ds, uint64_t start, size_t n, int *dst);

/* Largest token id in the whole stream (-1 if empty), to check against vocab_size. */
int dataset_max_token(const dataset *ds, int *max_token);

/* DPC_ERANGE naming the shard and position of the first token >= vocab_size, else 0. */
int dataset_check_vocab(const dataset *ds, int vocab_size);

#endif
