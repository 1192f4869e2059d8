/* test_tokenizer_hf.c — tokenizer.json loading (common/tokenizer_hf.c) on a small hand-made
 * file: encodings worked out by hand (merges by rank, ignore_merges, added tokens, the Split
 * and Digits pre-tokenizers, the NFC subset), decode round trips, and every malformed or
 * unsupported variant refused with the key named. With the cache directory as argument it
 * also opens the packaged GPT-2, Llama 3 and Qwen3 files (deploy/fetch_assets.sh) and checks
 * their sizes and a few known ids (the oracle test compares whole corpora). */
#include "common/errors.h"
#include "common/tokenizer.h"
#include "tests/unit/test.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/dpc_tokhf_XXXXXX";
static char path[256];

/* GPT-2's byte alphabet: the code point that stands for byte b. */
static unsigned byte_cp(int b) {
  int k = 0;
  for (int x = 0; x < 256; x++) {
    int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    if (x == b) return printable ? (unsigned)x : 256u + (unsigned)k;
    if (!printable) k++;
  }
  return 0;
}

/* The token string of raw bytes s (ASCII here) in that alphabet. */
static const char *tokstr(const char *s) {
  static char buf[8][64];
  static int slot;
  char *o = buf[slot++ % 8], *p = o;
  for (; *s; s++) {
    unsigned cp = byte_cp((unsigned char)*s);
    if (cp < 0x80)
      *p++ = (char)cp;
    else {
      *p++ = (char)(0xC0 | cp >> 6);
      *p++ = (char)(0x80 | (cp & 0x3F));
    }
  }
  *p = '\0';
  return o;
}

/* Ids: bytes 0..255 are their own byte; then "he" 256, "ll" 257, "hell" 258, "hello" 259,
 * " w" 260, "or" 261, "abc" 262 (no merge makes it), "<|endoftext|>" 263 (added, special),
 * "<x>" 264 (added, not special). Merges in rank order: h e, l l, he ll, hell o, " w", o r. */
static cJSON *base_doc(void) {
  cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
  cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
  for (int b = 0; b < 256; b++) {
    char s[2] = {(char)b, 0};
    if (b == 0) {
      cJSON_AddNumberToObject(vocab, "\xc4\x80", 0); /* U+0100 stands for byte 0 */
      continue;
    }
    cJSON_AddNumberToObject(vocab, tokstr(s), b);
  }
  const char *more[] = {"he", "ll", "hell", "hello", " w", "or", "abc"};
  for (int i = 0; i < 7; i++)
    cJSON_AddNumberToObject(vocab, tokstr(more[i]), 256 + i);
  cJSON_AddItemToArray(merges, cJSON_CreateString("h e"));
  cJSON_AddItemToArray(merges, cJSON_CreateString("l l"));
  const char *pair[2] = {"he", "ll"};
  cJSON_AddItemToArray(merges, cJSON_CreateStringArray(pair, 2)); /* the ["a", "b"] form */
  cJSON_AddItemToArray(merges, cJSON_CreateString("hell o"));
  char sw[32];
  snprintf(sw, sizeof sw, "%s w", tokstr(" "));
  cJSON_AddItemToArray(merges, cJSON_CreateString(sw));
  cJSON_AddItemToArray(merges, cJSON_CreateString("o r"));
  const char *contents[] = {"<|endoftext|>", "<x>"};
  for (int i = 0; i < 2; i++) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", 263 + i);
    cJSON_AddStringToObject(a, "content", contents[i]);
    cJSON_AddFalseToObject(a, "single_word");
    cJSON_AddFalseToObject(a, "lstrip");
    cJSON_AddFalseToObject(a, "rstrip");
    cJSON_AddFalseToObject(a, "normalized");
    cJSON_AddBoolToObject(a, "special", i == 0);
    cJSON_AddItemToArray(added, a);
  }
  cJSON_AddStringToObject(model, "type", "BPE");
  cJSON_AddNullToObject(model, "dropout");
  cJSON_AddFalseToObject(model, "ignore_merges");
  cJSON_AddItemToObject(model, "vocab", vocab);
  cJSON_AddItemToObject(model, "merges", merges);
  cJSON_AddStringToObject(root, "version", "1.0");
  cJSON_AddNullToObject(root, "truncation");
  cJSON_AddNullToObject(root, "padding");
  cJSON_AddItemToObject(root, "added_tokens", added);
  cJSON_AddNullToObject(root, "normalizer");
  cJSON *pre = cJSON_CreateObject();
  cJSON_AddStringToObject(pre, "type", "ByteLevel");
  cJSON_AddFalseToObject(pre, "add_prefix_space");
  cJSON_AddTrueToObject(pre, "use_regex");
  cJSON_AddItemToObject(root, "pre_tokenizer", pre);
  cJSON *dec = cJSON_CreateObject();
  cJSON_AddStringToObject(dec, "type", "ByteLevel");
  cJSON_AddItemToObject(root, "decoder", dec);
  cJSON_AddItemToObject(root, "model", model);
  return root;
}

static int open_doc(cJSON *doc, dpc_tokenizer **t) {
  char *s = cJSON_PrintUnformatted(doc);
  FILE *f = fopen(path, "wb");
  fputs(s, f);
  fclose(f);
  free(s);
  return tok_open_hf(path, t);
}

/* Encodes text and compares with want[0..n); also checks decode gives the text back. */
static int enc_is(dpc_tokenizer *t, const char *text, const int *want, size_t n) {
  int *ids = NULL;
  size_t k = 0;
  char *back = NULL;
  size_t bl = 0;
  int ok =
      tok_encode(t, text, strlen(text), &ids, &k) == 0 && k == n && (!n || memcmp(ids, want, n * sizeof *ids) == 0);
  if (!ok) {
    fprintf(stderr, "  encode \"%s\": got", text);
    for (size_t i = 0; i < k; i++)
      fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, " (%s)\n", dpc_errmsg());
  }
  ok = ok && tok_decode(t, ids, k, &back, &bl) == 0 && bl == strlen(text) && memcmp(back, text, bl) == 0;
  free(ids);
  free(back);
  return ok;
}

static void test_encodings(void) {
  cJSON *doc = base_doc();
  dpc_tokenizer *t = NULL;
  CHECK_EQ_INT(open_doc(doc, &t), 0);
  CHECK_EQ_INT(tok_vocab_size(t), 265);
  CHECK_EQ_INT(tok_eot(t), 263);
  CHECK(enc_is(t, "hello world", (int[]){259, 260, 261, 'l', 'd'}, 5));
  CHECK(enc_is(t, "hell", (int[]){258}, 1));
  CHECK(enc_is(t, "abc", (int[]){'a', 'b', 'c'}, 3)); /* no merge makes "abc" */
  CHECK(enc_is(t, "hello<|endoftext|>he<x><x>", (int[]){259, 263, 256, 264, 264}, 5));
  CHECK(enc_is(t, "<|endoftext", (int[]){'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'}, 11));
  CHECK(enc_is(t, "", NULL, 0));
  tok_free(t);

  /* ignore_merges: a piece that is a vocabulary token is that token. */
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(doc, "model"), "ignore_merges", cJSON_CreateTrue());
  CHECK_EQ_INT(open_doc(doc, &t), 0);
  CHECK(enc_is(t, "abc abc", (int[]){262, ' ', 'a', 'b', 'c'}, 5));
  tok_free(t);

  /* Sequence [Digits(individual), ByteLevel(use_regex false)]: digits alone, nothing else split. */
  cJSON *seq = cJSON_CreateObject(), *list = cJSON_CreateArray(), *dig = cJSON_CreateObject(),
        *bl = cJSON_CreateObject();
  cJSON_AddStringToObject(seq, "type", "Sequence");
  cJSON_AddStringToObject(dig, "type", "Digits");
  cJSON_AddTrueToObject(dig, "individual_digits");
  cJSON_AddStringToObject(bl, "type", "ByteLevel");
  cJSON_AddFalseToObject(bl, "add_prefix_space");
  cJSON_AddFalseToObject(bl, "use_regex");
  cJSON_AddItemToArray(list, dig);
  cJSON_AddItemToArray(list, bl);
  cJSON_AddItemToObject(seq, "pretokenizers", list);
  cJSON_ReplaceItemInObject(doc, "pre_tokenizer", seq);
  CHECK_EQ_INT(open_doc(doc, &t), 0);
  CHECK(enc_is(t, "abc abc12", (int[]){'a', 'b', 'c', ' ', 'a', 'b', 'c', '1', '2'}, 9));
  CHECK(enc_is(t, " world", (int[]){260, 261, 'l', 'd'}, 4));
  tok_free(t);

  /* NFC: text NFC leaves alone is encoded; a combining mark is refused, naming NFC. */
  cJSON *nfc = cJSON_CreateObject();
  cJSON_AddStringToObject(nfc, "type", "NFC");
  cJSON_ReplaceItemInObject(doc, "normalizer", nfc);
  CHECK_EQ_INT(open_doc(doc, &t), 0);
  CHECK(enc_is(t, "hello \xc3\xa9\xe2\x80\x94", (int[]){259, ' ', 0xc3, 0xa9, 0xe2, 0x80, 0x94}, 7));
  int *ids = NULL;
  size_t k = 0;
  CHECK_EQ_INT(tok_encode(t, "e\xcc\x81", 3, &ids, &k), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "NFC") && strstr(dpc_errmsg(), "U+0301"));
  free(ids);
  tok_free(t);
  cJSON_Delete(doc);
}

/* A change to the base document that must be refused with `want` in the message. */
typedef void (*mutate_fn)(cJSON *doc);
static cJSON *model_of(cJSON *d) { return cJSON_GetObjectItem(d, "model"); }
static void set_str(cJSON *o, const char *k, const char *v) {
  cJSON_DeleteItemFromObject(o, k);
  cJSON_AddStringToObject(o, k, v);
}
static void m_wordpiece(cJSON *d) { set_str(model_of(d), "type", "WordPiece"); }
static void m_unigram(cJSON *d) { set_str(model_of(d), "type", "Unigram"); }
static void m_nfkc(cJSON *d) {
  cJSON *n = cJSON_CreateObject();
  cJSON_AddStringToObject(n, "type", "NFKC");
  cJSON_ReplaceItemInObject(d, "normalizer", n);
}
static void m_whitespace(cJSON *d) { set_str(cJSON_GetObjectItem(d, "pre_tokenizer"), "type", "Whitespace"); }
static void m_prefix(cJSON *d) {
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "pre_tokenizer"), "add_prefix_space", cJSON_CreateTrue());
}
static void m_no_pre(cJSON *d) { cJSON_ReplaceItemInObject(d, "pre_tokenizer", cJSON_CreateNull()); }
static void m_decoder(cJSON *d) { set_str(cJSON_GetObjectItem(d, "decoder"), "type", "WordPiece"); }
static void m_split_removed(cJSON *d) {
  cJSON *seq =
      cJSON_Parse("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
                  "\"behavior\":\"Removed\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false}]}");
  cJSON_ReplaceItemInObject(d, "pre_tokenizer", seq);
}
static void m_bad_regex(cJSON *d) {
  cJSON *seq =
      cJSON_Parse("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},"
                  "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false}]}");
  cJSON_ReplaceItemInObject(d, "pre_tokenizer", seq);
}
static void m_dropout(cJSON *d) { cJSON_ReplaceItemInObject(model_of(d), "dropout", cJSON_CreateNumber(0.1)); }
static void m_fallback(cJSON *d) { cJSON_AddTrueToObject(model_of(d), "byte_fallback"); }
static void m_suffix(cJSON *d) { cJSON_AddStringToObject(model_of(d), "end_of_word_suffix", "</w>"); }
static void m_trunc(cJSON *d) { cJSON_ReplaceItemInObject(d, "truncation", cJSON_CreateObject()); }
static void m_dup_id(cJSON *d) { cJSON_AddNumberToObject(cJSON_GetObjectItem(model_of(d), "vocab"), "zz", 5); }
static void m_big_id(cJSON *d) { cJSON_AddNumberToObject(cJSON_GetObjectItem(model_of(d), "vocab"), "zz", 1e12); }
static void m_neg_id(cJSON *d) { cJSON_AddNumberToObject(cJSON_GetObjectItem(model_of(d), "vocab"), "zz", -1); }
static void m_frac_id(cJSON *d) { cJSON_AddNumberToObject(cJSON_GetObjectItem(model_of(d), "vocab"), "zz", 300.5); }
static void m_hole(cJSON *d) { cJSON_AddNumberToObject(cJSON_GetObjectItem(model_of(d), "vocab"), "zz", 300); }
static void m_no_byte(cJSON *d) {
  cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItem(model_of(d), "vocab"), "a");
  cJSON_AddNumberToObject(cJSON_GetObjectItem(model_of(d), "vocab"), "zz", 'a');
}
static void m_merge_oov(cJSON *d) {
  cJSON_AddItemToArray(cJSON_GetObjectItem(model_of(d), "merges"), cJSON_CreateString("a x"));
}
static void m_merge_form(cJSON *d) {
  cJSON_AddItemToArray(cJSON_GetObjectItem(model_of(d), "merges"), cJSON_CreateString("abc"));
}
static void m_merge_dup(cJSON *d) {
  cJSON_AddItemToArray(cJSON_GetObjectItem(model_of(d), "merges"), cJSON_CreateString("o r"));
}
static void m_merge_num(cJSON *d) {
  cJSON_AddItemToArray(cJSON_GetObjectItem(model_of(d), "merges"), cJSON_CreateNumber(3));
}
static void m_lstrip(cJSON *d) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "added_tokens"), 1), "lstrip",
                            cJSON_CreateTrue());
}
static void m_added_clash(cJSON *d) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "added_tokens"), 1), "id",
                            cJSON_CreateNumber(65));
}
static void m_added_dup(cJSON *d) {
  cJSON *a = cJSON_Duplicate(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "added_tokens"), 1), 1);
  cJSON_ReplaceItemInObject(a, "id", cJSON_CreateNumber(265));
  cJSON_AddItemToArray(cJSON_GetObjectItem(d, "added_tokens"), a);
}
static void m_added_empty(cJSON *d) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "added_tokens"), 1), "content",
                            cJSON_CreateString(""));
}
static void m_model_array(cJSON *d) { cJSON_ReplaceItemInObject(d, "model", cJSON_CreateArray()); }

static void test_refused(void) {
  struct {
    mutate_fn fn;
    const char *want1, *want2;
  } cases[] = {
      {m_wordpiece, "model.type", "WordPiece"},
      {m_unigram, "model.type", "Unigram"},
      {m_nfkc, "normalizer.type", "NFKC"},
      {m_whitespace, "pre_tokenizer", "Whitespace"},
      {m_prefix, "pre_tokenizer.add_prefix_space", "true"},
      {m_no_pre, "pre_tokenizer", "null"},
      {m_decoder, "decoder.type", "WordPiece"},
      {m_split_removed, "pre_tokenizer.pretokenizers[0].behavior", "Removed"},
      {m_bad_regex, "pre_tokenizer.pretokenizers[0].pattern", "regex"},
      {m_dropout, "model.dropout", "null or 0"},
      {m_fallback, "model.byte_fallback", "true"},
      {m_suffix, "end_of_word_suffix", "</w>"},
      {m_trunc, "truncation", "null"},
      {m_dup_id, "model.vocab", "id 5 is given to"},
      {m_big_id, "model.vocab", "\"zz\": id must be an integer"},
      {m_neg_id, "model.vocab", "\"zz\": id must be an integer"},
      {m_frac_id, "model.vocab", "\"zz\": id must be an integer"},
      {m_hole, "model.vocab", "id 265 has no token"},
      {m_no_byte, "model.vocab", "no token for byte 0x61"},
      {m_merge_oov, "model.merges[6]", "not in model.vocab"},
      {m_merge_form, "model.merges[6]", "one space"},
      {m_merge_dup, "model.merges[6]", "repeats model.merges[5]"},
      {m_merge_num, "model.merges[6]", "expected"},
      {m_lstrip, "added_tokens[1]", "lstrip"},
      {m_added_clash, "added_tokens[1]", "id 65"},
      {m_added_dup, "added_tokens", "given twice"},
      {m_added_empty, "added_tokens[1]", "content"},
      {m_model_array, "model", "object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cJSON *doc = base_doc();
    cases[i].fn(doc);
    dpc_tokenizer *t = NULL;
    int rc = open_doc(doc, &t);
    const char *m = dpc_errmsg();
    int ok = rc == DPC_EFORMAT && !t && strstr(m, path) && strstr(m, cases[i].want1) && strstr(m, cases[i].want2);
    if (!ok) fprintf(stderr, "  case %zu (%s): rc %d, \"%s\"\n", i, cases[i].want1, rc, m);
    CHECK(ok);
    tok_free(t);
    cJSON_Delete(doc);
  }
  /* Not JSON at all, and not an object. */
  const char *bad[] = {"{\"model\": ", "[1, 2]", ""};
  for (int i = 0; i < 3; i++) {
    FILE *f = fopen(path, "wb");
    fputs(bad[i], f);
    fclose(f);
    dpc_tokenizer *t = NULL;
    CHECK_EQ_INT(tok_open_hf(path, &t), DPC_EFORMAT);
    CHECK(strstr(dpc_errmsg(), path) != NULL);
  }
}

static void test_spec(void) {
  dpc_tokenizer *t = NULL;
  CHECK_EQ_INT(tok_open_spec("byte", NULL, &t), 0);
  CHECK_EQ_INT(tok_vocab_size(t), 256);
  tok_free(t);
  CHECK_EQ_INT(tok_open_spec("gpt2", NULL, &t), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "--vocab-dir"));
  CHECK_EQ_INT(tok_open_spec("/nonexistent-dipaco/tokenizer.json", NULL, &t), DPC_ENOENT);
  CHECK(strstr(dpc_errmsg(), "/nonexistent-dipaco/tokenizer.json"));
  cJSON *doc = base_doc();
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  CHECK_EQ_INT(open_doc(doc, &t), 0);
  tok_free(t);
  t = NULL;
  CHECK_EQ_INT(tok_open_spec(dir, NULL, &t), 0); /* a directory holding tokenizer.json */
  CHECK_EQ_INT(tok_vocab_size(t), 265);
  tok_free(t);
  cJSON_Delete(doc);
  unlink(path);
}

/* The packaged files: sizes, end-of-text ids and a few encodings known from their models. */
static void test_packaged(const char *cache) {
  struct {
    const char *name;
    int V, eot;
    const char *text;
    int ids[3];
    size_t n;
  } files[] = {
      {"gpt2", 50257, 50256, "Hello World", {15496, 2159}, 2},
      {"llama3", 128256, 128001, "<|begin_of_text|>Hello World", {128000, 9906, 4435}, 3},
      {"qwen3", 151669, 151643, "Hello World<|endoftext|>", {9707, 4337, 151643}, 3},
  };
  for (int i = 0; i < 3; i++) {
    char p[4096];
    snprintf(p, sizeof p, "%s/hf-%s/tokenizer.json", cache, files[i].name);
    struct stat st;
    if (stat(p, &st) != 0) {
      fprintf(stderr, "FAIL: %s missing (deploy/fetch_assets.sh %s fetches it; tests/run.sh runs it)\n",
              p, cache);
      CHECK(0);
      continue;
    }
    dpc_tokenizer *t = NULL;
    int rc = tok_open_hf(p, &t);
    if (rc) fprintf(stderr, "  %s: %s\n", p, dpc_errmsg());
    CHECK_EQ_INT(rc, 0);
    if (rc) continue;
    CHECK_EQ_INT(tok_vocab_size(t), files[i].V);
    CHECK_EQ_INT(tok_eot(t), files[i].eot);
    CHECK(enc_is(t, files[i].text, files[i].ids, files[i].n));
    tok_free(t);
  }
}

int main(int argc, char **argv) {
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/t.json", dir);
  test_encodings();
  test_refused();
  test_spec();
  if (argc > 1) test_packaged(argv[1]);
  unlink(path);
  rmdir(dir);
  TEST_DONE();
}
