/* fuzz_shard.c — libFuzzer target: an llm.c token shard (common/shard.c). The input is the
 * whole file; an accepted shard must match the format exactly (magic, version, count, size)
 * and its tokens must be the file's bytes after the header. */
#include "util.h"

#include "common/shard.h"

#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  return 0;
}

static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  shard *s;
  if (shard_open(fz_memfile(data, size), &s) != 0) return 0;
  if (size < SHARD_HEADER_BYTES) fz_fail("accepted a %zu-byte shard", size);
  int32_t ver = le32(data + 4);
  if (le32(data) != SHARD_MAGIC || (ver != SHARD_VERSION && ver != SHARD_VERSION_U32)) fz_fail("bad magic/version accepted");
  if (ver == SHARD_VERSION_U32 && le32(data + 12) != 4) fz_fail("version 2 without token size 4 accepted");
  size_t w = ver == SHARD_VERSION ? 2 : 4;
  if ((size_t)shard_token_bytes(s) != w) fz_fail("token width %d for version %d", shard_token_bytes(s), (int)ver);
  size_t n = shard_num_tokens(s);
  if ((int64_t)n != (int64_t)le32(data + 8)) fz_fail("count %zu differs from the header", n);
  if (SHARD_HEADER_BYTES + w * n != size) fz_fail("count %zu does not match the size %zu", n, size);
  const void *tok = w == 2 ? (const void *)shard_tokens(s) : (const void *)shard_tokens32(s);
  if (n && (!tok || memcmp(tok, data + SHARD_HEADER_BYTES, w * n) != 0)) fz_fail("tokens differ");
  shard_close(s);
  return 0;
}
