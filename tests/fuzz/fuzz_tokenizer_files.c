/* fuzz_tokenizer_files.c — libFuzzer target: the GPT-2 tokenizer files encoder.json and
 * vocab.bpe (tok_open_gpt2, common/tokenizer.c). The input is split at the first "\n\x01\n":
 * encoder.json before it, vocab.bpe after it (all of it is encoder.json when absent). When
 * the pair is accepted, every id must decode, and decode(encode(x)) == x must hold for a
 * fixed text and for the input bytes themselves (byte-level BPE covers every byte). */
#include "util.h"

#include "common/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  return 0;
}

static void roundtrip(dpc_tokenizer *t, const char *x, size_t n) {
  int *ids = NULL;
  size_t nid = 0;
  char *back = NULL;
  size_t blen = 0;
  if (tok_encode(t, x, n, &ids, &nid) != 0) fz_fail("encode failed");
  for (size_t i = 0; i < nid; i++)
    if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) fz_fail("id %d out of range", ids[i]);
  if (tok_decode(t, ids, nid, &back, &blen) != 0) fz_fail("decode of encoded ids failed");
  if (blen != n || memcmp(back, x, n) != 0) fz_fail("decode(encode(x)) != x (%zu vs %zu bytes)", blen, n);
  free(ids);
  free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char sep[] = "\n\x01\n";
  const uint8_t *cut = memmem(data, size, sep, 3);
  size_t enc_n = cut ? (size_t)(cut - data) : size;
  fz_write("encoder.json", data, enc_n);
  fz_write("vocab.bpe", cut ? cut + 3 : data, cut ? size - enc_n - 3 : 0);
  dpc_tokenizer *t;
  if (tok_open_gpt2(fz_dir(), &t) != 0) return 0;
  int v = tok_vocab_size(t);
  if (v < 256) fz_fail("vocabulary of %d", v);
  if (tok_eot(t) >= v) fz_fail("eot %d outside the vocabulary", tok_eot(t));
  for (int id = 0; id < v; id++) {
    char *s = NULL;
    size_t n = 0;
    if (tok_decode(t, &id, 1, &s, &n) != 0 || (n == 0 && id != tok_eot(t))) fz_fail("id %d does not decode", id);
    free(s);
  }
  int bad = v;
  char *s = NULL;
  size_t n = 0;
  if (tok_decode(t, &bad, 1, &s, &n) == 0) fz_fail("id %d past the vocabulary decoded", v);
  static const char text[] = "Hello world, it's 2026: the quick brown fox's  \t\n  caf\xc3\xa9 \xff\xfe x\x00y";
  roundtrip(t, text, sizeof text - 1);
  roundtrip(t, (const char *)data, size < 512 ? size : 512);
  tok_free(t);
  return 0;
}
