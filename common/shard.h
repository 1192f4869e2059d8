/* shard.h — llm.c token shards: a header of 256 little-endian int32 (magic 20240520,
 * version, token count, ...), then `count` tokens (docs/design.md §6.1):
 *   version 1: uint16 tokens, the rest of the header zero (llm.c's format; shards written by
 *              llm.c's and nanoGPT-style scripts are read unchanged);
 *   version 2: uint32 tokens, header int 3 = 4 (bytes per token), the rest zero; for
 *              vocabularies over 65536 tokens (Llama 3: 128256). llm.c refuses these.
 * Writers choose version 1 whenever the vocabulary fits, so such shards stay bit-identical.
 *
 * shard_open() maps the file read-only and checks it exactly (magic, version, count against
 * the file size); errors name the file and the problem. A shard is immutable once open and
 * may be read from any number of threads. The file must not be truncated while open. */
#ifndef DPC_SHARD_H
#define DPC_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1     /* uint16 tokens */
#define SHARD_VERSION_U32 2 /* uint32 tokens; header int 3 holds 4 */
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define SHARD_MAX_TOKENS 2147483647u /* the count is an int32 */

typedef struct shard shard;

/* Write tokens[0, n) as a version 1 shard at `path`, atomically. */
int shard_write(const char *path, const uint16_t *tokens, size_t n);

/* Write ids[0, n) as a shard for a vocabulary of vocab_size tokens: version 1 when
 * vocab_size <= 65536, else version 2. An id outside [0, vocab_size) is DPC_ERANGE naming the
 * shard and the position, and nothing is written. */
int shard_write_ids(const char *path, const int *ids, size_t n, int vocab_size);

/* Open and validate; DPC_EFORMAT (truncated, wrong magic, unknown version, a version 2 header
 * without token size 4, bad count, trailing bytes), DPC_ENOENT/DPC_EPERM/DPC_EIO (cannot read). Free with shard_close. */
int shard_open(const char *path, shard **out);
void shard_close(shard *s);

size_t shard_num_tokens(const shard *s);
/* 2 (version 1) or 4 (version 2). */
int shard_token_bytes(const shard *s);
/* The tokens (valid until shard_close): shard_tokens for a 2-byte shard, shard_tokens32 for
 * a 4-byte one; each gives NULL for the other width. */
const uint16_t *shard_tokens(const shard *s);
const uint32_t *shard_tokens32(const shard *s);
/* Token i (< shard_num_tokens) of either width. */
static inline uint32_t shard_token_at(const uint16_t *t16, const uint32_t *t32, size_t i) {
  return t16 ? t16[i] : t32[i];
}
const char *shard_path(const shard *s);

#endif
