/* shard.h — llm.c token shards: a header of 256 little-endian int32 (magic 20240520,
 * version 1, token count, the rest zero), then `count` uint16 tokens. Shards written by
 * llm.c's and nanoGPT-style scripts are read unchanged.
 *
 * shard_open() maps the file read-only and checks it exactly (magic, version, count against
 * the file size); errors name the file and the problem. A shard is immutable once open and
 * may be read from any number of threads. The file must not be truncated while open. */
#ifndef DPC_SHARD_H
#define DPC_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define SHARD_MAX_TOKENS 2147483647u /* the count is an int32 */

typedef struct shard shard;

/* Write tokens[0, n) as a shard at `path`, atomically. */
int shard_write(const char *path, const uint16_t *tokens, size_t n);

/* Open and validate; DPC_EFORMAT (truncated, wrong magic, wrong version, bad count, trailing
 * bytes), DPC_ENOENT/DPC_EPERM/DPC_EIO (cannot read). Free with shard_close. */
int shard_open(const char *path, shard **out);
void shard_close(shard *s);

size_t shard_num_tokens(const shard *s);
/* The tokens (valid until shard_close). */
const uint16_t *shard_tokens(const shard *s);
const char *shard_path(const shard *s);

#endif
