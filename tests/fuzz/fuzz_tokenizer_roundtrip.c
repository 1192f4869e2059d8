/* fuzz_tokenizer_roundtrip.c — libFuzzer target: tok_encode/tok_decode on arbitrary bytes
 * (common/tokenizer.c). decode(encode(x)) == x must hold for the byte tokenizer and, when the
 * released GPT-2 files are present (tests/.cache/gpt2, or $DPC_GPT2_DIR), for GPT-2's BPE;
 * every id must lie in the vocabulary, and the byte tokenizer must give one id per byte. */
#include "util.h"

#include "common/errors.h"
#include "common/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dpc_tokenizer *g_byte, *g_gpt2;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  if (tok_open_byte(&g_byte) != 0) fz_fail("tok_open_byte: %s", dpc_errmsg());
  const char *dir = getenv("DPC_GPT2_DIR");
  if (!dir) dir = DPC_SOURCE_DIR "/tests/.cache/gpt2";
  if (tok_open_gpt2(dir, &g_gpt2) != 0) {
    fprintf(stderr, "fuzz_tokenizer_roundtrip: GPT-2 files not usable (%s); byte tokenizer only\n", dpc_errmsg());
    g_gpt2 = NULL;
  }
  return 0;
}

static void roundtrip(dpc_tokenizer *t, const char *x, size_t n, int one_per_byte) {
  int *ids = NULL;
  size_t nid = 0;
  char *back = NULL;
  size_t blen = 0;
  if (tok_encode(t, x, n, &ids, &nid) != 0) fz_fail("encode failed: %s", dpc_errmsg());
  if (!ids) fz_fail("encode gave a NULL array");
  if (one_per_byte && nid != n) fz_fail("byte tokenizer gave %zu ids for %zu bytes", nid, n);
  if (nid > n) fz_fail("%zu ids for %zu bytes", nid, n);
  for (size_t i = 0; i < nid; i++)
    if (ids[i] < 0 || ids[i] >= tok_vocab_size(t) || ids[i] == tok_eot(t)) fz_fail("id %d produced", ids[i]);
  if (tok_decode(t, ids, nid, &back, &blen) != 0) fz_fail("decode failed: %s", dpc_errmsg());
  if (blen != n || memcmp(back, x, n) != 0 || back[blen] != '\0')
    fz_fail("decode(encode(x)) != x (%zu vs %zu bytes)", blen, n);
  free(ids);
  free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  roundtrip(g_byte, (const char *)data, size, 1);
  if (g_gpt2) roundtrip(g_gpt2, (const char *)data, size, 0);
  return 0;
}
