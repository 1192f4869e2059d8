/* fuzz_tokenizer_json.c — libFuzzer target: a Hugging Face tokenizer.json (tok_open_hf,
 * common/tokenizer_hf.c). The input is the whole file. When it is accepted, the vocabulary has
 * at least 256 ids, every id decodes, the end-of-text id lies inside, and encoding a fixed text
 * and the input itself gives ids inside the vocabulary that decode, the same ids twice (the
 * word cache changes nothing); encoding may only fail for the documented reasons (text outside
 * the NFC subset, a regex over its match limit). */
#include "util.h"

#include "common/errors.h"
#include "common/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  return 0;
}

static void encode_twice(dpc_tokenizer *t, const char *x, size_t n) {
  int *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  int rc = tok_encode(t, x, n, &a, &na);
  if (rc == DPC_EFORMAT || rc == DPC_ERANGE) return; /* NFC subset, regex match limit */
  if (rc) fz_fail("encode failed: %s", dpc_errmsg());
  for (size_t i = 0; i < na; i++)
    if (a[i] < 0 || a[i] >= tok_vocab_size(t)) fz_fail("id %d out of range", a[i]);
  if (tok_encode(t, x, n, &b, &nb) != 0 || na != nb || (na && memcmp(a, b, na * sizeof *a) != 0))
    fz_fail("a second encode differs");
  char *back = NULL;
  size_t bl = 0;
  if (tok_decode(t, a, na, &back, &bl) != 0) fz_fail("decode of encoded ids failed");
  free(a);
  free(b);
  free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dpc_tokenizer *t;
  if (tok_open_hf(fz_memfile(data, size), &t) != 0) return 0;
  int v = tok_vocab_size(t);
  if (v < 256) fz_fail("vocabulary of %d", v);
  if (tok_eot(t) >= v) fz_fail("eot %d outside the vocabulary", tok_eot(t));
  for (int id = 0; id < v; id++) {
    char *s = NULL;
    size_t n = 0;
    if (tok_decode(t, &id, 1, &s, &n) != 0 || n == 0) fz_fail("id %d does not decode", id);
    free(s);
  }
  static const char text[] =
      "Hello world, it's 2026: the quick brown fox's  \t\n  caf\xc3\xa9 \xff\xfe x\x00y <|endoftext|>";
  encode_twice(t, text, sizeof text - 1);
  encode_twice(t, (const char *)data, size < 512 ? size : 512);
  tok_free(t);
  return 0;
}
