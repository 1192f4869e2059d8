/* test_tokenizer.c — the byte and GPT-2 tokenizers (common/tokenizer.h).
 *
 *   test_tokenizer            byte tokenizer; BPE on a small generated vocabulary checked
 *                             against a naive transcription of encoder.py's bpe() loop;
 *                             malformed vocabulary files give the right error and message.
 *   test_tokenizer GPT2_DIR   GPT-2 proper: known encodings, round trips of random UTF-8 and
 *                             random bytes, long pieces, cache consistency. Fails when
 *                             GPT2_DIR has no encoder.json (deploy/fetch_assets.sh). */
#include "common/errors.h"
#include "common/tokenizer.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

/* encode then decode; checks the bytes come back. Returns the ids (caller frees) via out. */
static int round_trip(dpc_tokenizer *t, const char *s, size_t n) {
  int *ids = NULL;
  size_t k = 0;
  char *back = NULL;
  size_t bl = 0;
  int ok = tok_encode(t, s, n, &ids, &k) == 0 && tok_decode(t, ids, k, &back, &bl) == 0 &&
           bl == n && memcmp(back, s, n) == 0 && k <= n;
  for (size_t i = 0; ok && i < k; i++) ok = ids[i] >= 0 && ids[i] < tok_vocab_size(t);
  free(ids);
  free(back);
  return ok;
}

static int encode_eq(dpc_tokenizer *t, const char *s, size_t n, const int *want, size_t wn) {
  int *ids = NULL;
  size_t k = 0;
  int rc = tok_encode(t, s, n, &ids, &k);
  int ok = rc == 0 && k == wn && (wn == 0 || memcmp(ids, want, wn * sizeof *ids) == 0);
  if (!ok) {
    fprintf(stderr, "encode(\"%.*s\") rc %d gave", (int)n, s, rc);
    for (size_t i = 0; i < k; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
  }
  free(ids);
  return ok;
}

static void test_byte(void) {
  dpc_tokenizer *t = NULL;
  CHECK_EQ_INT(tok_open_byte(&t), 0);
  CHECK_EQ_INT(tok_vocab_size(t), 256);
  CHECK_EQ_INT(tok_eot(t), -1);
  const int want[] = {0, 255, 'a', '\n'};
  CHECK(encode_eq(t, "\0\xff" "a\n", 4, want, 4));
  CHECK(encode_eq(t, "", 0, NULL, 0));
  char buf[1000];
  for (int it = 0; it < 50; it++) {
    size_t n = rnd() % sizeof buf;
    for (size_t i = 0; i < n; i++) buf[i] = (char)rnd();
    CHECK(round_trip(t, buf, n));
  }
  int bad[] = {1, 256};
  char *out = NULL;
  size_t ol = 0;
  CHECK_EQ_INT(tok_decode(t, bad, 2, &out, &ol), DPC_ERANGE);
  CHECK(strstr(dpc_errmsg(), "256") && strstr(dpc_errmsg(), "position 1"));
  tok_free(t);
}

/* ---- a small generated vocabulary ------------------------------------------------------ */

#define MAXTOK 600
static char tok_str[MAXTOK][64]; /* raw bytes of each token, NUL-terminated (no NUL bytes) */
static int tok_len[MAXTOK];
static int tok_id[MAXTOK]; /* id written to encoder.json for token k */
static int n_tok, n_merge;
static int merge_a[MAXTOK], merge_b[MAXTOK]; /* token indices; rank = index in this list */
static char tmpdir[64];

/* GPT-2's byte → code point map, derived here from the published rule. */
static unsigned byte_cp(int b) {
  int k = 0;
  for (int c = 0; c < 256; c++) {
    int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
    if (c == b) return printable ? (unsigned)c : 256u + (unsigned)k;
    if (!printable) k++;
  }
  return 0;
}

/* Writes the byte string s as a JSON/merges token string (UTF-8 of the mapped code points). */
static void put_token(FILE *f, const char *s, int n, int json) {
  for (int i = 0; i < n; i++) {
    unsigned cp = byte_cp((unsigned char)s[i]);
    if (json && (cp == '"' || cp == '\\')) fputc('\\', f);
    if (cp < 0x80) {
      fputc((int)cp, f);
    } else {
      fputc((int)(0xC0 | cp >> 6), f);
      fputc((int)(0x80 | (cp & 0x3F)), f);
    }
  }
}

static int find_tok(const char *s, int n) {
  for (int k = 0; k < n_tok; k++)
    if (tok_len[k] == n && memcmp(tok_str[k], s, (size_t)n) == 0) return k;
  return -1;
}

static void write_file(const char *name, const char *content) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  fputs(content, f);
  fclose(f);
}

static void write_vocab(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/encoder.json", tmpdir);
  FILE *f = fopen(path, "wb");
  fputs("{", f);
  for (int k = 0; k < n_tok; k++) {
    fputs(k ? ",\n\"" : "\"", f);
    put_token(f, tok_str[k], tok_len[k], 1);
    fprintf(f, "\": %d", tok_id[k]);
  }
  fputs("}\n", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/vocab.bpe", tmpdir);
  f = fopen(path, "wb");
  fputs("#version: 0.2\n", f);
  for (int r = 0; r < n_merge; r++) {
    put_token(f, tok_str[merge_a[r]], tok_len[merge_a[r]], 0);
    fputc(' ', f);
    put_token(f, tok_str[merge_b[r]], tok_len[merge_b[r]], 0);
    fputc('\n', f);
  }
  fclose(f);
}

/* 256 byte tokens under a permuted id order, then merges over "ab " built like BPE training
 * would (each merge joins two existing tokens into a new one), and <|endoftext|> last. */
static void make_vocab(void) {
  n_tok = n_merge = 0;
  for (int b = 1; b < 256; b++) {
    tok_str[n_tok][0] = (char)b;
    tok_len[n_tok++] = 1;
  }
  tok_str[n_tok][0] = '\0'; /* byte 0: a one-byte token whose C string is empty */
  tok_len[n_tok++] = 1;
  const char *base[] = {"a", "b", " "};
  int pool[MAXTOK], np = 0;
  for (int i = 0; i < 3; i++) pool[np++] = find_tok(base[i], 1);
  while (n_merge < 120) {
    int x = pool[rnd() % np], y = pool[rnd() % np];
    int n = tok_len[x] + tok_len[y];
    if (n > 12) continue;
    char s[64];
    memcpy(s, tok_str[x], (size_t)tok_len[x]);
    memcpy(s + tok_len[x], tok_str[y], (size_t)tok_len[y]);
    if (find_tok(s, n) >= 0) continue;
    memcpy(tok_str[n_tok], s, (size_t)n);
    tok_len[n_tok] = n;
    merge_a[n_merge] = x;
    merge_b[n_merge++] = y;
    pool[np++] = n_tok++;
  }
  memcpy(tok_str[n_tok], "<|endoftext|>", 13);
  tok_len[n_tok++] = 13;
  for (int k = 0; k < n_tok; k++) tok_id[k] = k;
  for (int k = n_tok - 2; k > 0; k--) { /* shuffle all ids but <|endoftext|>'s */
    int j = (int)(rnd() % (uint32_t)(k + 1)), tmp = tok_id[k];
    tok_id[k] = tok_id[j];
    tok_id[j] = tmp;
  }
}

/* encoder.py's bpe() as written: merge every occurrence of the lowest-rank pair, left to
 * right, until no pair has a rank. Works on token indices; returns the count. */
static int naive_bpe(const char *s, int n, int *out) {
  int w[256], m = 0;
  for (int i = 0; i < n; i++) w[m++] = find_tok(s + i, 1);
  for (;;) {
    int best = -1;
    for (int i = 0; i + 1 < m; i++)
      for (int r = 0; r < n_merge; r++)
        if (merge_a[r] == w[i] && merge_b[r] == w[i + 1] && (best < 0 || r < best)) best = r;
    if (best < 0) break;
    int nw[256], k = 0;
    for (int i = 0; i < m;) {
      if (i + 1 < m && w[i] == merge_a[best] && w[i + 1] == merge_b[best]) {
        char cat[64];
        int la = tok_len[w[i]], lb = tok_len[w[i + 1]];
        memcpy(cat, tok_str[w[i]], (size_t)la);
        memcpy(cat + la, tok_str[w[i + 1]], (size_t)lb);
        nw[k++] = find_tok(cat, la + lb);
        i += 2;
      } else {
        nw[k++] = w[i++];
      }
    }
    memcpy(w, nw, (size_t)k * sizeof *w);
    m = k;
  }
  for (int i = 0; i < m; i++) out[i] = tok_id[w[i]];
  return m;
}

static void test_small_vocab(void) {
  make_vocab();
  write_vocab();
  dpc_tokenizer *t = NULL;
  int rc = tok_open_gpt2(tmpdir, &t);
  CHECK_EQ_INT(rc, 0);
  if (rc) {
    fprintf(stderr, "%s\n", dpc_errmsg());
    return;
  }
  CHECK_EQ_INT(tok_vocab_size(t), n_tok);
  CHECK_EQ_INT(tok_eot(t), n_tok - 1);
  /* Pieces of letters "ab" (the regex keeps ' ?\p{L}+' together) against the naive loop. */
  int mismatches = 0;
  for (int it = 0; it < 3000; it++) {
    char s[80];
    int n = 0, len = 1 + (int)(rnd() % 40);
    if (rnd() % 2) s[n++] = ' ';
    int runs = (int)(rnd() % 3); /* long runs of one letter stress overlapping merges */
    while (n < len) {
      char c = "ab"[rnd() % 2];
      int rep = runs ? 1 + (int)(rnd() % 8) : 1;
      for (int r = 0; r < rep && n < len; r++) s[n++] = c;
    }
    int want[256];
    int wn = naive_bpe(s, n, want);
    if (!encode_eq(t, s, (size_t)n, want, (size_t)wn) && ++mismatches > 5) break;
  }
  CHECK_EQ_INT(mismatches, 0);
  /* Text with several pieces is the concatenation of its pieces. */
  const char *txt = "ab ba  aab\n";
  int *ids = NULL;
  size_t k = 0;
  CHECK_EQ_INT(tok_encode(t, txt, strlen(txt), &ids, &k), 0);
  int want[64], wn = 0;
  wn += naive_bpe("ab", 2, want + wn);
  wn += naive_bpe(" ba", 3, want + wn);
  wn += naive_bpe(" ", 1, want + wn); /* '\s+(?!\S)' leaves the last space to ' ?\p{L}+' */
  wn += naive_bpe(" aab", 4, want + wn);
  wn += naive_bpe("\n", 1, want + wn);
  CHECK(encode_eq(t, txt, strlen(txt), want, (size_t)wn));
  free(ids);
  CHECK(round_trip(t, "\0\x01\xff abba", 9));
  tok_free(t);
}

/* ---- malformed files --------------------------------------------------------------------- */

static void expect_open_error(int want_rc, const char *want_msg, const char *want_msg2) {
  dpc_tokenizer *t = NULL;
  dpc_errclear();
  int rc = tok_open_gpt2(tmpdir, &t);
  CHECK_EQ_INT(rc, want_rc);
  CHECK(t == NULL);
  int ok = strstr(dpc_errmsg(), want_msg) && (!want_msg2 || strstr(dpc_errmsg(), want_msg2));
  if (!ok) fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", dpc_errmsg(), want_msg);
  CHECK(ok);
  tok_free(t);
}

static void rewrite_merges(const char *extra_line_at_end) {
  write_vocab();
  char path[128];
  snprintf(path, sizeof path, "%s/vocab.bpe", tmpdir);
  FILE *f = fopen(path, "ab");
  fputs(extra_line_at_end, f);
  fclose(f);
}

static void test_bad_files(void) {
  char enc[128], bpe[128];
  snprintf(enc, sizeof enc, "%s/encoder.json", tmpdir);
  snprintf(bpe, sizeof bpe, "%s/vocab.bpe", tmpdir);
  dpc_tokenizer *t = NULL;
  CHECK_EQ_INT(tok_open_gpt2("/nonexistent-dipaco-dir", &t), DPC_ENOENT);
  CHECK(strstr(dpc_errmsg(), "/nonexistent-dipaco-dir/encoder.json: cannot open"));
  CHECK(strstr(dpc_errmsg(), "fetch_assets.sh"));

  make_vocab();
  write_vocab();
  unlink(bpe);
  expect_open_error(DPC_ENOENT, "vocab.bpe: cannot open", NULL);

  write_vocab();
  write_file("encoder.json", "{\"a\": 1,\n\"b\": 2,\n\"c\": }\n");
  expect_open_error(DPC_EFORMAT, "encoder.json:3: not valid JSON", NULL);
  write_file("encoder.json", "[1, 2, 3]");
  expect_open_error(DPC_EFORMAT, "encoder.json: expected a JSON object", NULL);
  write_file("encoder.json", "{\"a\": 0, \"b\": 1}");
  expect_open_error(DPC_EFORMAT, "encoder.json: 2 tokens", NULL);

  /* Semantic errors: patch one entry of a valid 256+ vocabulary. */
  make_vocab();
  int ka = find_tok("a", 1);
  int save_id = tok_id[ka];
  tok_id[ka] = n_tok + 5;
  write_vocab();
  expect_open_error(DPC_EFORMAT, "encoder.json: token \"a\": id must be an integer", NULL);
  tok_id[ka] = tok_id[find_tok("b", 1)];
  write_vocab();
  expect_open_error(DPC_EFORMAT, "is given to two tokens", NULL);
  tok_id[ka] = save_id;
  tok_len[ka] = 2; /* the token for byte 'a' becomes "zz" */
  memcpy(tok_str[ka], "zz", 2);
  write_vocab();
  expect_open_error(DPC_EFORMAT, "no token for byte 0x61", NULL);
  memcpy(tok_str[ka], "a", 2);
  tok_len[ka] = 1;
  write_vocab();
  /* A key with a character outside the byte alphabet (a raw space; GPT-2 writes it as 'Ġ'). */
  write_file("encoder.json", "");
  {
    FILE *f = fopen(enc, "wb");
    fputs("{", f);
    for (int k = 0; k < n_tok; k++) {
      fputs(k ? ",\"" : "\"", f);
      if (tok_str[k][0] == ' ' && tok_len[k] == 1) fputc(' ', f);
      else put_token(f, tok_str[k], tok_len[k], 1);
      fprintf(f, "\":%d", tok_id[k]);
    }
    fputs("}", f);
    fclose(f);
  }
  expect_open_error(DPC_EFORMAT, "token \" \"", "outside GPT-2's byte alphabet");

  /* vocab.bpe errors, with the line number (line 1 is the version comment). */
  char line[64];
  write_vocab();
  write_file("vocab.bpe", "a b\n");
  expect_open_error(DPC_EFORMAT, "vocab.bpe:1: expected a \"#version", NULL);
  rewrite_merges("a b c\n");
  snprintf(line, sizeof line, "vocab.bpe:%d: expected two tokens", n_merge + 2);
  expect_open_error(DPC_EFORMAT, line, "\"a b c\"");
  rewrite_merges("\nab ab\n");
  snprintf(line, sizeof line, "vocab.bpe:%d: empty line", n_merge + 2);
  expect_open_error(DPC_EFORMAT, line, NULL);
  rewrite_merges("x y\n");
  snprintf(line, sizeof line, "vocab.bpe:%d: the merged token of \"x y\"", n_merge + 2);
  expect_open_error(DPC_EFORMAT, line, "not in encoder.json");
  rewrite_merges("a q\xc5\xbf\n"); /* U+017F is past the alphabet's end (U+0143) */
  snprintf(line, sizeof line, "vocab.bpe:%d:", n_merge + 2);
  expect_open_error(DPC_EFORMAT, line, "outside GPT-2's byte alphabet");
  {
    /* The first merge again at the end. */
    int x = merge_a[0], y = merge_b[0];
    write_vocab();
    FILE *f = fopen(bpe, "ab");
    put_token(f, tok_str[x], tok_len[x], 0);
    fputc(' ', f);
    put_token(f, tok_str[y], tok_len[y], 0);
    fputc('\n', f);
    fclose(f);
    snprintf(line, sizeof line, "vocab.bpe:%d: merge", n_merge + 2);
    expect_open_error(DPC_EFORMAT, line, "repeats line 2");
  }
  /* A merge listed after a merge that already used its result: order matters for BPE. */
  {
    int r = -1;
    /* Swap merge 0 (creates some token X from base letters) with the first merge using X. */
    int x = 256 + 0; /* token index created by merge 0 */
    for (int i = 1; i < n_merge; i++)
      if (merge_a[i] == x || merge_b[i] == x) {
        r = i;
        break;
      }
    CHECK(r > 0);
    int sa = merge_a[0], sb = merge_b[0];
    merge_a[0] = merge_a[r];
    merge_b[0] = merge_b[r];
    merge_a[r] = sa;
    merge_b[r] = sb;
    write_vocab();
    /* The error is at the first line that creates a token the moved merge uses. */
    int first = -1;
    for (int p = 1; p < n_merge && first < 0; p++) {
      int made = p == r ? 256 : 256 + p;
      if (made == merge_a[0] || made == merge_b[0]) first = p;
    }
    snprintf(line, sizeof line, "vocab.bpe:%d: merge", first + 2);
    expect_open_error(DPC_EFORMAT, line, "already uses");
  }
  make_vocab();
  write_vocab();
  CHECK_EQ_INT(tok_open_gpt2(tmpdir, &t), 0); /* and the unpatched files load */
  tok_free(t);
}

/* ---- GPT-2 proper ------------------------------------------------------------------------ */

static size_t put_utf8(char *o, uint32_t cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18);
  o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

static void test_gpt2(const char *dir) {
  dpc_tokenizer *t = NULL;
  int rc = tok_open_gpt2(dir, &t);
  CHECK_EQ_INT(rc, 0);
  if (rc) {
    fprintf(stderr, "%s\n", dpc_errmsg());
    return;
  }
  CHECK_EQ_INT(tok_vocab_size(t), 50257);
  CHECK_EQ_INT(tok_eot(t), 50256);

  /* Known encodings (as given by OpenAI's encoder.py / tiktoken "gpt2"). */
  static const struct {
    const char *s;
    int ids[16];
    int n;
  } known[] = {
      {"Hello world", {15496, 995}, 2},
      {" Hello world", {18435, 995}, 2},
      {"I'm sure they'll say we've won, don't you?",
       {40, 1101, 1654, 484, 1183, 910, 356, 1053, 1839, 11, 836, 470, 345, 30}, 14},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}, 7},
      {"Hello\n\nworld  \t x", {15496, 198, 198, 6894, 220, 220, 197, 2124}, 8},
      {"1234567 3.14", {10163, 2231, 3134, 513, 13, 1415}, 6},
      {"\xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87 na\xc3\xafve", {47249, 222, 220, 40792, 23877, 229, 41492}, 7},
      {"DON'T", {41173, 6, 51}, 3},
      {"  leading and trailing  ", {220, 3756, 290, 25462, 220, 220}, 6},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    CHECK(encode_eq(t, known[i].s, strlen(known[i].s), known[i].ids, (size_t)known[i].n));
  CHECK(encode_eq(t, "", 0, NULL, 0));
  int eot = 50256;
  char *txt = NULL;
  size_t tl = 0;
  CHECK_EQ_INT(tok_decode(t, &eot, 1, &txt, &tl), 0);
  CHECK(tl == 13 && memcmp(txt, "<|endoftext|>", 13) == 0);
  free(txt);
  int bad = 50257;
  CHECK_EQ_INT(tok_decode(t, &bad, 1, &txt, &tl), DPC_ERANGE);

  /* Invalid UTF-8 between valid text is a piece of its own: the valid parts encode as if
   * alone. */
  {
    int *a = NULL, *b = NULL, *c = NULL, *all = NULL;
    size_t na, nb, nc, nall;
    CHECK_EQ_INT(tok_encode(t, "abc\xff\xfe" "def", 8, &all, &nall), 0);
    CHECK_EQ_INT(tok_encode(t, "abc", 3, &a, &na), 0);
    CHECK_EQ_INT(tok_encode(t, "\xff\xfe", 2, &b, &nb), 0);
    CHECK_EQ_INT(tok_encode(t, "def", 3, &c, &nc), 0);
    int ok = nall == na + nb + nc && memcmp(all, a, na * sizeof(int)) == 0 &&
             memcmp(all + na, b, nb * sizeof(int)) == 0 &&
             memcmp(all + na + nb, c, nc * sizeof(int)) == 0;
    CHECK(ok);
    free(a);
    free(b);
    free(c);
    free(all);
  }

  /* Round trips: random UTF-8 from assorted ranges, random bytes, mixtures. */
  static const uint32_t ranges[][2] = {{0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x24F},
                                       {0x370, 0x52F},   {0x600, 0x6FF},   {0x900, 0x97F},
                                       {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF},
                                       {0xAC00, 0xD7A3}, {0xE000, 0xE0FF}, {0x1F300, 0x1F6FF},
                                       {0x10000, 0x10FFFF}};
  char *buf = malloc(1 << 21);
  for (int it = 0; it < 300; it++) {
    size_t n = 0, want = rnd() % 2000;
    while (n < want) {
      int kind = (int)(rnd() % 16);
      if (kind < 13) {
        const uint32_t *r = ranges[kind];
        uint32_t cp = r[0] + rnd() % (r[1] - r[0] + 1);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        n += put_utf8(buf + n, cp);
      } else if (kind == 13) {
        n += (size_t)snprintf(buf + n, 16, "'%s", (const char *[]){"s", "t", "re", "ll", "S"}[rnd() % 5]);
      } else if (kind == 14) {
        buf[n++] = ' ';
      } else if (it % 2) {
        buf[n++] = (char)rnd(); /* stray byte: often invalid UTF-8 */
      }
    }
    CHECK(round_trip(t, buf, n));
  }
  for (int it = 0; it < 200; it++) {
    size_t n = rnd() % 3000;
    for (size_t i = 0; i < n; i++) buf[i] = (char)rnd();
    CHECK(round_trip(t, buf, n));
  }
  /* Truncated and overlong sequences, surrogates, NUL. */
  const char odd[] = "a\xc3 \xe4\xb8 \xf0\x9f\x98 \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \0 z\x80";
  CHECK(round_trip(t, odd, sizeof odd - 1));
  /* Long pieces: the BPE is O(n log n) per piece and the regex runs in place. */
  size_t big = 1 << 20;
  memset(buf, ' ', big);
  CHECK(round_trip(t, buf, big));
  memset(buf, 'a', big);
  CHECK(round_trip(t, buf, big));
  for (size_t i = 0; i < big; i++) buf[i] = (char)("abcdefghij"[rnd() % 10]);
  CHECK(round_trip(t, buf, big));
  for (size_t i = 0; i < big; i++) buf[i] = (char)(0x80 | rnd()); /* all invalid */
  CHECK(round_trip(t, buf, big));
  /* The word cache does not change results: a fresh tokenizer agrees with a warm one, also
   * after 300000 distinct words have made the cache grow and clear. */
  {
    size_t n = 0;
    for (uint32_t w = 0; w < 300000; w++) {
      buf[n++] = ' ';
      for (uint32_t x = w * 2654435761u % 11881376u, k = 0; k < 5; k++, x /= 26)
        buf[n++] = (char)('a' + x % 26);
    }
    CHECK(round_trip(t, buf, n));
    CHECK(round_trip(t, buf, n));
  }
  {
    const char *s = "The quick brown fox's 12 jumps\n\n over the lazy dog's back again.";
    dpc_tokenizer *fresh = NULL;
    CHECK_EQ_INT(tok_open_gpt2(dir, &fresh), 0);
    int *a = NULL, *b = NULL, *c = NULL;
    size_t na = 0, nb = 0, nc = 0;
    tok_encode(fresh, s, strlen(s), &a, &na);
    tok_encode(t, s, strlen(s), &b, &nb);
    tok_encode(t, s, strlen(s), &c, &nc);
    CHECK(na > 0 && na == nb && nb == nc && !memcmp(a, b, na * sizeof(int)) &&
          !memcmp(b, c, nb * sizeof(int)));
    free(a);
    free(b);
    free(c);
    tok_free(fresh);
  }
  free(buf);
  tok_free(t);
}

int main(int argc, char **argv) {
  if (argc > 1) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/encoder.json", argv[1]);
    if (stat(path, &st) != 0) {
      fprintf(stderr, "FAIL: %s not found; run deploy/fetch_assets.sh tests/.cache (tests/run.sh does)\n", path);
      return 1;
    }
    test_gpt2(argv[1]);
    TEST_DONE();
  }
  test_byte();
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dpc_tok_XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_small_vocab();
  test_bad_files();
  char path[128];
  snprintf(path, sizeof path, "%s/encoder.json", tmpdir);
  unlink(path);
  snprintf(path, sizeof path, "%s/vocab.bpe", tmpdir);
  unlink(path);
  rmdir(tmpdir);
  TEST_DONE();
}
