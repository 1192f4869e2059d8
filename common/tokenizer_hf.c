/* tokenizer_hf.c — byte-level BPE tokenizers read from Hugging Face tokenizer.json files
 * (contract in tokenizer.h, the accepted subset in docs/design.md §6.7).
 *
 * Why hand-written: tokenizer.json is defined by the Rust `tokenizers` library (with Python and
 * JavaScript bindings); no C library reads it. The file is untrusted input, so this reads it
 * with cJSON, bounds every size, accepts exactly the pieces it computes as that library does
 * and refuses the rest with the key and value named. The BPE itself, the word cache and
 * decoding are common/tokenizer.c's; its heap of (rank, position) candidates is also the
 * algorithm of the library's BPE (a priority queue of merges by rank, then leftmost position,
 * skipping stale entries), so the result equals it for any merge list, in any order.
 *
 * Encoding a text: (1) added tokens are found leftmost-longest in the raw text and become
 * their ids; (2) each stretch between them is checked against the NFC normalizer when the
 * file has one (only text that NFC leaves unchanged is accepted: see nfc_stable); (3) the
 * pre-tokenizers split it in sequence (a Split regex, Digits, and ByteLevel last, whose
 * use_regex adds GPT-2's pattern), each applied to the pieces of the one before; (4) each
 * piece is one id when ignore_merges is set and the piece is a vocabulary token, else BPE.
 * Regexes are PCRE2 with UTF and Unicode properties; bytes that are not UTF-8 are never
 * matched and stay in the gaps between matches, as in tokenizer.c. */
#include "common/tokenizer_internal.h"

#include "common/errors.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_MAX_STAGES 8
#define HF_MAX_ADDED 65536
#define HF_MAX_ADDED_LEN 1024
#define HF_MAX_PATTERN 4096
#define HF_MAX_TOKEN_LEN 4096 /* bytes of one vocabulary or merge token string */
#define HF_MATCH_LIMIT 10000000u

static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
  pcre2_code *re;
  pcre2_match_data *md;
  int jit;
  char key[48]; /* where the stage came from, for match errors */
} hf_stage;

struct tokhf {
  hf_stage st[HF_MAX_STAGES];
  int nst;
  int nfc;           /* normalizer NFC */
  int ignore_merges; /* a piece that is a vocabulary token is that token */
  tok_vindex vx;     /* model vocabulary (not the added tokens): bytes → id */
  pcre2_match_context *mctx;
  /* Added tokens sorted by their content bytes: id add_id[k], bytes add_bytes[add_off[k] ..
   * add_off[k + 1]); those starting with byte c are k in [first[c], first[c + 1]). */
  int n_added;
  int32_t *add_id;
  uint32_t *add_off;
  unsigned char *add_bytes;
  int first[257];
};

typedef struct {
  const char *path;
  dpc_tokenizer *t;
  struct tokhf *h;
  int uni[324];
  int n_model;                        /* entries of model.vocab */
  const char **str;                   /* (V) the token string of each id: model.vocab key or added content */
  unsigned char *is_model, *is_added; /* (V) */
} hf_load;

/* ---- errors and JSON helpers --------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static int bad(const hf_load *L, const char *key, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return dpc_err(DPC_EFORMAT, "%s: %s: %s", L->path, key, msg);
}

static const char *qs(const char *s, char *buf, size_t cap) {
  return tokint_quote((const unsigned char *)s, strlen(s), buf, cap);
}

static int is_null(const cJSON *j) { return !j || cJSON_IsNull(j); }

/* A boolean member: absent or null gives dflt. */
static int get_bool(const hf_load *L, const cJSON *obj, const char *key, const char *name, int dflt, int *out) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, name);
  *out = dflt; /* also on error: callers' optimised builds cannot see that they never read it then */
  if (is_null(j)) return 0;
  if (!cJSON_IsBool(j)) return bad(L, key, "\"%s\" must be true or false", name);
  *out = cJSON_IsTrue(j);
  return 0;
}

/* The "type" string of an object member, or NULL (with the error set) when it has none. */
static const char *get_type(const hf_load *L, const cJSON *obj, const char *key, int *rc) {
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
  if (!cJSON_IsObject(obj) || !cJSON_IsString(ty)) {
    *rc = bad(L, key, "expected an object with a \"type\" string");
    return NULL;
  }
  return ty->valuestring;
}

/* A member that must be absent, null, or an empty string (BPE affixes the file does not use). */
static int want_empty(const hf_load *L, const cJSON *obj, const char *key, const char *name) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, name);
  if (is_null(j) || (cJSON_IsString(j) && !j->valuestring[0])) return 0;
  char q[96];
  return bad(L, key, "\"%s\" is %s; only byte-level BPE without it is supported", name,
             cJSON_IsString(j) ? qs(j->valuestring, q, sizeof q) : "set");
}

/* An integer id in [0, TOK_VOCAB_MAX), or -1. */
static int json_id(const cJSON *j) {
  if (!cJSON_IsNumber(j)) return -1;
  double v = j->valuedouble;
  if (!(v >= 0 && v < TOK_VOCAB_MAX) || v != (double)(int)v) return -1;
  return (int)v;
}

/* ---- top level, normalizer, decoder, pre-tokenizers ---------------------------------------- */

static int check_top(hf_load *L, const cJSON *root) {
  int rc = 0;
  const char *names[] = {"truncation", "padding"};
  for (int i = 0; i < 2; i++)
    if (!is_null(cJSON_GetObjectItemCaseSensitive(root, names[i])))
      return bad(L, names[i], "must be null (dipaco encodes whole texts, unpadded)");
  const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
  if (!is_null(norm)) {
    const char *ty = get_type(L, norm, "normalizer", &rc);
    if (!ty) return rc;
    if (strcmp(ty, "NFC") != 0) return bad(L, "normalizer.type", "\"%.64s\" is not supported (null or NFC)", ty);
    L->h->nfc = 1;
  }
  const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  if (is_null(dec)) return bad(L, "decoder", "null; byte-level BPE needs the ByteLevel decoder");
  const char *ty = get_type(L, dec, "decoder", &rc);
  if (!ty) return rc;
  if (strcmp(ty, "ByteLevel") != 0) return bad(L, "decoder.type", "\"%.64s\" is not supported (ByteLevel only)", ty);
  /* post_processor only adds BOS/EOS when asked to; dipaco encodes without it. */
  const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
  if (!is_null(post) && !get_type(L, post, "post_processor", &rc)) return rc;
  return 0;
}

static int add_stage(hf_load *L, const char *key, const char *pattern, size_t plen) {
  struct tokhf *h = L->h;
  if (h->nst == HF_MAX_STAGES) return bad(L, key, "more than %d pre-tokenizers", HF_MAX_STAGES);
  if (plen > HF_MAX_PATTERN) return bad(L, key, "pattern of %zu bytes (at most %d)", plen, HF_MAX_PATTERN);
  hf_stage *st = &h->st[h->nst];
  int errcode;
  PCRE2_SIZE erroff;
  st->re = pcre2_compile((PCRE2_SPTR)pattern, plen, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode, &erroff,
                         NULL);
  if (!st->re) {
    PCRE2_UCHAR msg[128];
    pcre2_get_error_message(errcode, msg, sizeof msg);
    return bad(L, key, "regex not accepted at offset %zu: %s", (size_t)erroff, (const char *)msg);
  }
  h->nst++;
  st->jit = pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE) == 0;
  st->md = pcre2_match_data_create_from_pattern(st->re, NULL);
  if (!st->md) return dpc_err(DPC_ENOMEM, "%s: out of memory", L->path);
  snprintf(st->key, sizeof st->key, "%s", key);
  return 0;
}

/* A Split pattern given as {"String": s}: s as a literal (every ASCII punctuation escaped). */
static int add_literal_stage(hf_load *L, const char *key, const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > HF_MAX_PATTERN / 2) return bad(L, key, "string pattern of %zu bytes", n);
  char pat[HF_MAX_PATTERN + 1];
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) pat[o++] = '\\';
    pat[o++] = (char)c;
  }
  return add_stage(L, key, pat, o);
}

static int pretok_split(hf_load *L, const cJSON *p, const char *key) {
  char k[96], q[96];
  int invert, rc;
  snprintf(k, sizeof k, "%s.invert", key);
  if ((rc = get_bool(L, p, k, "invert", 0, &invert))) return rc;
  if (invert) return bad(L, k, "true is not supported");
  const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
  snprintf(k, sizeof k, "%s.behavior", key);
  if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
    return bad(L, k, "%s is not supported (Isolated only)",
               cJSON_IsString(beh) ? qs(beh->valuestring, q, sizeof q) : "missing");
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
  const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
  const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
  snprintf(k, sizeof k, "%s.pattern", key);
  if (cJSON_IsString(re)) return add_stage(L, k, re->valuestring, strlen(re->valuestring));
  if (cJSON_IsString(str)) return add_literal_stage(L, k, str->valuestring);
  return bad(L, k, "expected {\"Regex\": ...} or {\"String\": ...}");
}

static int pretok_one(hf_load *L, const cJSON *p, const char *key, int last) {
  int rc = 0, flag;
  char k[96];
  const char *ty = get_type(L, p, key, &rc);
  if (!ty) return rc;
  if (strcmp(ty, "ByteLevel") == 0) {
    if (!last) return bad(L, key, "ByteLevel must be the last pre-tokenizer");
    snprintf(k, sizeof k, "%s.add_prefix_space", key);
    if ((rc = get_bool(L, p, k, "add_prefix_space", 1, &flag))) return rc;
    if (flag) return bad(L, k, "true (or absent, which means true) is not supported");
    if ((rc = get_bool(L, p, key, "use_regex", 1, &flag))) return rc;
    snprintf(k, sizeof k, "%s (GPT-2 regex)", key);
    return flag ? add_stage(L, k, gpt2_pattern, strlen(gpt2_pattern)) : 0;
  }
  if (last) return bad(L, key, "the last pre-tokenizer must be ByteLevel, not \"%.64s\"", ty);
  if (strcmp(ty, "Split") == 0) return pretok_split(L, p, key);
  if (strcmp(ty, "Digits") == 0) {
    if ((rc = get_bool(L, p, key, "individual_digits", 0, &flag))) return rc;
    return flag ? add_stage(L, key, "\\p{N}", 5) : add_stage(L, key, "\\p{N}+", 6);
  }
  return bad(L, key, "type \"%.64s\" is not supported (Split, Digits, ByteLevel, Sequence)", ty);
}

static int load_pretok(hf_load *L, const cJSON *pt) {
  int rc = 0;
  if (is_null(pt)) return bad(L, "pre_tokenizer", "null; byte-level BPE needs a ByteLevel pre-tokenizer");
  const char *ty = get_type(L, pt, "pre_tokenizer", &rc);
  if (!ty) return rc;
  if (strcmp(ty, "Sequence") != 0) return pretok_one(L, pt, "pre_tokenizer", 1);
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
  int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : -1;
  if (n < 1 || n > HF_MAX_STAGES)
    return bad(L, "pre_tokenizer.pretokenizers", "expected an array of 1 to %d pre-tokenizers", HF_MAX_STAGES);
  int i = 0;
  for (const cJSON *p = list->child; p; p = p->next, i++) {
    char key[64];
    snprintf(key, sizeof key, "pre_tokenizer.pretokenizers[%d]", i);
    if ((rc = pretok_one(L, p, key, i == n - 1))) return rc;
  }
  return 0;
}

static int check_model(hf_load *L, const cJSON *m) {
  int rc = 0, flag;
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(m, "type");
  if (!cJSON_IsObject(m)) return bad(L, "model", "expected an object");
  if (!cJSON_IsString(ty) && !(is_null(ty) && cJSON_GetObjectItemCaseSensitive(m, "merges")))
    return bad(L, "model.type", "missing");
  if (cJSON_IsString(ty) && strcmp(ty->valuestring, "BPE") != 0)
    return bad(L, "model.type", "\"%.64s\" is not supported (only byte-level \"BPE\")", ty->valuestring);
  const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(m, "dropout");
  if (!is_null(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
    return bad(L, "model.dropout", "must be null or 0 (dropout makes encoding random)");
  if ((rc = want_empty(L, m, "model", "continuing_subword_prefix")) ||
      (rc = want_empty(L, m, "model", "end_of_word_suffix")))
    return rc;
  if ((rc = get_bool(L, m, "model.byte_fallback", "byte_fallback", 0, &flag))) return rc;
  if (flag) return bad(L, "model.byte_fallback", "true is not supported (byte-level BPE needs no fallback)");
  if ((rc = get_bool(L, m, "model.ignore_merges", "ignore_merges", 0, &L->h->ignore_merges))) return rc;
  if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(m, "vocab")))
    return bad(L, "model.vocab", "expected an object mapping token strings to ids");
  if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m, "merges"))) return bad(L, "model.merges", "expected an array");
  return 0;
}

/* ---- vocabulary and added tokens ------------------------------------------------------------ */

/* Validates the added tokens' fields and finds V = largest id + 1 over both lists. */
static int scan_ids(hf_load *L, const cJSON *vocab, const cJSON *added, int *V) {
  char q[96], key[64];
  int mx = -1, i = 0;
  for (const cJSON *it = vocab->child; it; it = it->next) {
    int id = json_id(it);
    if (id < 0)
      return bad(L, "model.vocab", "token %s: id must be an integer in [0, %d)", qs(it->string, q, sizeof q),
                 TOK_VOCAB_MAX);
    if (!it->string[0]) return bad(L, "model.vocab", "id %d has an empty token string", id);
    if (strlen(it->string) > HF_MAX_TOKEN_LEN)
      return bad(L, "model.vocab", "token %d is longer than %d bytes", id, HF_MAX_TOKEN_LEN);
    if (id > mx) mx = id;
    L->n_model++;
  }
  if (added && !cJSON_IsArray(added)) return bad(L, "added_tokens", "expected an array");
  if (added && cJSON_GetArraySize(added) > HF_MAX_ADDED)
    return bad(L, "added_tokens", "more than %d entries", HF_MAX_ADDED);
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
    snprintf(key, sizeof key, "added_tokens[%d]", i);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
    int id = json_id(cJSON_GetObjectItemCaseSensitive(a, "id"));
    if (!cJSON_IsObject(a) || id < 0)
      return bad(L, key, "expected an object with an integer \"id\" in [0, %d)", TOK_VOCAB_MAX);
    if (!cJSON_IsString(c) || !c->valuestring[0] || strlen(c->valuestring) > HF_MAX_ADDED_LEN)
      return bad(L, key, "\"content\" must be a string of 1 to %d bytes", HF_MAX_ADDED_LEN);
    const char *flags[] = {"single_word", "lstrip", "rstrip"};
    for (int f = 0; f < 3; f++) {
      int v, rc = get_bool(L, a, key, flags[f], 0, &v);
      if (rc) return rc;
      if (v) return bad(L, key, "\"%s\": true is not supported", flags[f]);
    }
    if (id > mx) mx = id;
  }
  if (mx < 255) return bad(L, "model.vocab", "%d tokens; a byte-level BPE vocabulary has at least 256", mx + 1);
  *V = mx + 1;
  return 0;
}

/* Gives each id in [0, V) its string; duplicates and holes are errors. */
static int place_ids(hf_load *L, const cJSON *vocab, const cJSON *added, int V) {
  char q[96], q2[96], key[64];
  L->str = calloc((size_t)V, sizeof *L->str);
  L->is_model = calloc((size_t)V, 1);
  L->is_added = calloc((size_t)V, 1);
  if (!L->str || !L->is_model || !L->is_added) return dpc_err(DPC_ENOMEM, "%s: out of memory", L->path);
  for (const cJSON *it = vocab->child; it; it = it->next) {
    int id = json_id(it);
    if (L->str[id])
      return bad(L, "model.vocab", "id %d is given to %s and %s", id, qs(L->str[id], q, sizeof q),
                 qs(it->string, q2, sizeof q2));
    L->str[id] = it->string;
    L->is_model[id] = 1;
  }
  int i = 0;
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
    snprintf(key, sizeof key, "added_tokens[%d]", i);
    int id = json_id(cJSON_GetObjectItemCaseSensitive(a, "id"));
    const char *c = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
    if (L->is_added[id]) return bad(L, key, "id %d is already an added token", id);
    if (L->str[id] && strcmp(L->str[id], c) != 0)
      return bad(L, key, "id %d is %s in model.vocab but the content is %s", id, qs(L->str[id], q, sizeof q),
                 qs(c, q2, sizeof q2));
    L->str[id] = c;
    L->is_added[id] = 1;
  }
  for (int id = 0; id < V; id++)
    if (!L->str[id])
      return bad(L, "model.vocab", "id %d has no token; the ids of model.vocab and added_tokens must cover 0..%d", id,
                 V - 1);
  return 0;
}

/* Token bytes as the ByteLevel decoder gives them: the byte alphabet's bytes when every
 * character is in it, else the string's own UTF-8. Returns the length written to out. */
static size_t decoded_bytes(const hf_load *L, const char *s, unsigned char *out, int *in_alphabet) {
  size_t n = strlen(s);
  long nb = tokint_token_string_bytes(L->uni, (const unsigned char *)s, n, out);
  *in_alphabet = nb >= 0;
  if (nb >= 0) return (size_t)nb;
  memcpy(out, s, n);
  return n;
}

static int build_vocab(hf_load *L, int V) {
  dpc_tokenizer *t = L->t;
  tok_vindex *vx = &L->h->vx;
  char q[96];
  size_t total = 0;
  for (int id = 0; id < V; id++)
    total += strlen(L->str[id]);
  t->n_vocab = V;
  t->tok_off = malloc(((size_t)V + 1) * sizeof *t->tok_off);
  t->tok_bytes = malloc(total + 1);
  vx->mask = tokint_pow2_at_least(2 * (size_t)V) - 1;
  vx->slot = malloc((vx->mask + 1) * sizeof *vx->slot);
  if (!t->tok_off || !t->tok_bytes || !vx->slot || total > UINT32_MAX)
    return dpc_err(DPC_ENOMEM, "%s: out of memory", L->path);
  memset(vx->slot, 0xFF, (vx->mask + 1) * sizeof *vx->slot);
  size_t off = 0;
  for (int id = 0; id < V; id++) {
    int alpha;
    t->tok_off[id] = (uint32_t)off;
    off += decoded_bytes(L, L->str[id], t->tok_bytes + off, &alpha);
    t->tok_off[id + 1] = (uint32_t)off;
    /* Only model tokens in the byte alphabet can come out of BPE; index those. */
    if (L->is_model[id] && alpha && tokint_vindex_add(t, vx, id) >= 0)
      return bad(L, "model.vocab", "token %s (id %d) appears twice", qs(L->str[id], q, sizeof q), id);
  }
  for (int b = 0; b < 256; b++) {
    unsigned char c = (unsigned char)b;
    t->byte_id[b] = tokint_vindex_find(t, vx, &c, 1);
    if (t->byte_id[b] < 0)
      return bad(L, "model.vocab", "no token for byte 0x%02x; a byte-level BPE vocabulary has all 256", b);
  }
  return 0;
}

typedef struct {
  const unsigned char *p;
  size_t len;
  int id;
} added_ent;

static int cmp_added(const void *x, const void *y) {
  const added_ent *a = x, *b = y;
  int c = memcmp(a->p, b->p, a->len < b->len ? a->len : b->len);
  return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* The added tokens, sorted by content and bucketed by first byte, for matching in text. */
static int build_added(hf_load *L, const cJSON *added) {
  struct tokhf *h = L->h;
  int n = added ? cJSON_GetArraySize(added) : 0, i = 0;
  size_t total = 0;
  added_ent *ent = malloc(((size_t)n + 1) * sizeof *ent);
  if (!ent) return dpc_err(DPC_ENOMEM, "%s: out of memory", L->path);
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
    ent[i].p = (const unsigned char *)cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
    ent[i].len = strlen((const char *)ent[i].p);
    ent[i].id = json_id(cJSON_GetObjectItemCaseSensitive(a, "id"));
    total += ent[i].len;
  }
  qsort(ent, (size_t)n, sizeof *ent, cmp_added);
  h->add_id = malloc(((size_t)n + 1) * sizeof *h->add_id);
  h->add_off = malloc(((size_t)n + 1) * sizeof *h->add_off);
  h->add_bytes = malloc(total + 1);
  int rc = 0;
  if (!h->add_id || !h->add_off || !h->add_bytes) rc = dpc_err(DPC_ENOMEM, "%s: out of memory", L->path);
  size_t w = 0;
  for (int k = 0; !rc && k < n; k++) {
    if (k > 0 && cmp_added(&ent[k - 1], &ent[k]) == 0) {
      char q[96];
      rc = bad(L, "added_tokens", "content %s is given twice (ids %d and %d)",
               tokint_quote(ent[k].p, ent[k].len, q, sizeof q), ent[k - 1].id, ent[k].id);
      break;
    }
    h->add_off[k] = (uint32_t)w;
    memcpy(h->add_bytes + w, ent[k].p, ent[k].len);
    w += ent[k].len;
    h->add_id[k] = ent[k].id;
  }
  free(ent);
  if (rc) return rc;
  h->add_off[n] = (uint32_t)w;
  h->n_added = n;
  for (int c = 0, k = 0; c <= 256; c++) {
    while (k < n && h->add_bytes[h->add_off[k]] < c)
      k++;
    h->first[c] = k;
  }
  return 0;
}

/* An added token whose content is also a model token must carry that token's id. */
static int check_added_ids(hf_load *L) {
  const struct tokhf *h = L->h;
  unsigned char buf[HF_MAX_ADDED_LEN];
  char q[96];
  for (int k = 0; k < h->n_added; k++) {
    const char *c = L->str[h->add_id[k]];
    long nb = tokint_token_string_bytes(L->uni, (const unsigned char *)c, strlen(c), buf);
    int id = nb > 0 ? tokint_vindex_find(L->t, &h->vx, buf, (size_t)nb) : -1;
    if (id >= 0 && id != h->add_id[k])
      return bad(L, "added_tokens", "%s has id %d but is token %d of model.vocab", qs(c, q, sizeof q), h->add_id[k],
                 id);
  }
  return 0;
}

/* ---- merges ----------------------------------------------------------------------------------- */

/* The two token strings of merge j: "a b" or ["a", "b"]. */
static int merge_strings(hf_load *L, const cJSON *m, const char *key, const char **a, size_t *la, const char **b,
                         size_t *lb) {
  if (cJSON_IsString(m)) {
    const char *s = m->valuestring, *sp = strchr(s, ' ');
    if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) return bad(L, key, "expected \"A B\" (one space)");
    *a = s;
    *la = (size_t)(sp - s);
    *b = sp + 1;
    *lb = strlen(sp + 1);
  } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
             cJSON_IsString(m->child->next)) {
    *a = m->child->valuestring;
    *la = strlen(*a);
    *b = m->child->next->valuestring;
    *lb = strlen(*b);
    if (!*la || !*lb) return bad(L, key, "empty token");
  } else {
    return bad(L, key, "expected \"A B\" or [\"A\", \"B\"]");
  }
  if (*la > HF_MAX_TOKEN_LEN || *lb > HF_MAX_TOKEN_LEN)
    return bad(L, key, "token longer than %d bytes", HF_MAX_TOKEN_LEN);
  return 0;
}

static int load_merges(hf_load *L, const cJSON *merges) {
  dpc_tokenizer *t = L->t;
  int n = cJSON_GetArraySize(merges);
  if (n > INT32_MAX / 4) return bad(L, "model.merges", "too many merges");
  if (tokint_merges_alloc(t, (size_t)n + 1)) return DPC_ENOMEM;
  unsigned char tmp[2 * HF_MAX_TOKEN_LEN];
  char key[48], q[96];
  int j = 0;
  for (const cJSON *m = merges->child; m; m = m->next, j++) {
    const char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    snprintf(key, sizeof key, "model.merges[%d]", j);
    int rc = merge_strings(L, m, key, &a, &la, &b, &lb);
    if (rc) return rc;
    long na = tokint_token_string_bytes(L->uni, (const unsigned char *)a, la, tmp);
    long nb = na < 0 ? -1 : tokint_token_string_bytes(L->uni, (const unsigned char *)b, lb, tmp + na);
    if (na < 0 || nb < 0)
      return bad(L, key, "%s has a character outside the byte-level alphabet",
                 tokint_quote((const unsigned char *)(na < 0 ? a : b), na < 0 ? la : lb, q, sizeof q));
    int ida = tokint_vindex_find(t, &L->h->vx, tmp, (size_t)na);
    int idb = tokint_vindex_find(t, &L->h->vx, tmp + na, (size_t)nb);
    int idm = tokint_vindex_find(t, &L->h->vx, tmp, (size_t)(na + nb));
    if (ida < 0 || idb < 0 || idm < 0)
      return bad(L, key, "the %s token is not in model.vocab", ida < 0 ? "first" : idb < 0 ? "second" : "merged");
    int prev = tokint_merge_add(t, ida, idb, j, idm);
    if (prev >= 0) return bad(L, key, "repeats model.merges[%d]", prev);
  }
  return 0;
}

/* ---- encoding --------------------------------------------------------------------------------- */

/* The leftmost, then longest, added token in u[pos, len): *s, *e and its id; *s = len if none. */
static void next_added(const struct tokhf *h, const unsigned char *u, size_t len, size_t pos, size_t *s, size_t *e,
                       int *id) {
  *s = *e = len;
  if (!h->n_added) return;
  for (size_t i = pos; i < len; i++) {
    int lo = h->first[u[i]], hi = h->first[u[i] + 1];
    size_t best = 0;
    for (int k = lo; k < hi; k++) {
      size_t l = h->add_off[k + 1] - h->add_off[k];
      if (l > best && l <= len - i && memcmp(u + i, h->add_bytes + h->add_off[k], l) == 0) {
        best = l;
        *id = h->add_id[k];
      }
    }
    if (best) {
      *s = i;
      *e = i + best;
      return;
    }
  }
}

/* Whether NFC leaves the code point unchanged whatever surrounds it: canonical combining class
 * 0, no canonical decomposition to undo, never the second half of a composition. The ranges
 * are Latin-1 and Latin Extended-A/B and IPA (below the combining marks at U+0300), general
 * punctuation and currency signs (U+2002..U+20C0), CJK unified ideographs, Hangul syllables
 * and the emoji blocks. Text outside them is refused rather than encoded wrongly. */
static int nfc_stable(uint32_t cp) {
  return cp < 0x300 || (cp >= 0x2002 && cp <= 0x20C0) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
         (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x1F300 && cp <= 0x1FAFF);
}

static int nfc_check(const unsigned char *u, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = u[i];
    size_t l = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (l <= 1 || i + l > n) { /* ASCII, or not UTF-8: passed through as bytes */
      i++;
      continue;
    }
    uint32_t cp = c & (0x7F >> l);
    for (size_t k = 1; k < l; k++)
      cp = cp << 6 | (u[i + k] & 0x3F);
    if (!nfc_stable(cp))
      return dpc_err(DPC_EFORMAT,
                     "tok_encode: the tokenizer's NFC normalizer is implemented only for text NFC "
                     "leaves unchanged (docs/design.md §6.7); U+%04X is outside that set",
                     (unsigned)cp);
    i += l;
  }
  return 0;
}

/* Finds the next match of stage st in p[0, n) at or after pos: 1 with [*s, *e), 0 for none. */
static int stage_match(const struct tokhf *h, const hf_stage *st, const unsigned char *p, size_t n, size_t pos,
                       size_t *s, size_t *e) {
  int rc = st->jit ? pcre2_jit_match(st->re, p, n, pos, 0, st->md, h->mctx)
                   : pcre2_match(st->re, p, n, pos, 0, st->md, h->mctx);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(st->re, p, n, pos, PCRE2_NO_JIT, st->md, h->mctx);
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) {
    PCRE2_UCHAR msg[128];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return dpc_err(DPC_ERANGE, "tok_encode: the regex of %s failed at byte %zu of a %zu-byte piece: %s", st->key, pos,
                   n, (const char *)msg);
  }
  const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
  if (ov[1] < ov[0] || ov[0] < pos || ov[1] > n)
    return dpc_err(DPC_EINTERNAL, "tok_encode: misplaced regex match at byte %zu", pos);
  *s = ov[0];
  *e = ov[1];
  return 1;
}

static int word(dpc_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *o) {
  if (t->hf->ignore_merges) {
    int id = tokint_vindex_find(t, &t->hf->vx, p, n);
    if (id >= 0) {
      int rc = tokint_vec_reserve(o, 1);
      if (!rc) o->v[o->n++] = id;
      return rc;
    }
  }
  return tokint_encode_piece(t, p, n, o);
}

/* Pre-tokenizer k splits p[0, n) into matches and the gaps between them (the Isolated
 * behaviour); every non-empty piece goes on to stage k + 1, the last to BPE. */
static int split(dpc_tokenizer *t, int k, const unsigned char *p, size_t n, tok_idvec *o) {
  if (n == 0) return 0;
  if (k == t->hf->nst) return word(t, p, n, o);
  const hf_stage *st = &t->hf->st[k];
  size_t pos = 0, prev = 0, s = 0, e = 0;
  int rc = 0, m;
  while (!rc && pos <= n && (m = stage_match(t->hf, st, p, n, pos, &s, &e)) != 0) {
    if (m < 0) return m;
    if (s > prev) rc = split(t, k + 1, p + prev, s - prev, o);
    if (rc) break;
    if (e > s) {
      rc = split(t, k + 1, p + s, e - s, o);
      prev = pos = e;
      continue;
    }
    /* An empty match splits there; the search goes on one character later. */
    prev = s;
    if (s >= n) break;
    unsigned c = p[s];
    size_t l = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    pos = s + (s + l <= n ? l : 1);
  }
  if (!rc && prev < n) rc = split(t, k + 1, p + prev, n - prev, o);
  return rc;
}

static int hf_encode(dpc_tokenizer *t, const unsigned char *u, size_t len, tok_idvec *o) {
  const struct tokhf *h = t->hf;
  size_t pos = 0;
  while (pos < len) {
    size_t s, e;
    int id = -1, rc = 0;
    next_added(h, u, len, pos, &s, &e, &id);
    if (s > pos && h->nfc) rc = nfc_check(u + pos, s - pos);
    if (!rc && s > pos) rc = split(t, 0, u + pos, s - pos, o);
    if (!rc && s < len && !(rc = tokint_vec_reserve(o, 1))) o->v[o->n++] = id;
    if (rc) return rc;
    pos = e;
  }
  return 0;
}

/* ---- opening ----------------------------------------------------------------------------------- */

static void hf_free(struct tokhf *h) {
  if (!h) return;
  for (int i = 0; i < h->nst; i++) {
    pcre2_match_data_free(h->st[i].md);
    pcre2_code_free(h->st[i].re);
  }
  pcre2_match_context_free(h->mctx);
  free(h->vx.slot);
  free(h->add_id);
  free(h->add_off);
  free(h->add_bytes);
  free(h);
}

static int load_json(hf_load *L, cJSON **root) {
  char *buf = NULL;
  size_t len = 0;
  int rc = tokint_read_file(L->path, NULL, &buf, &len);
  if (rc) return rc;
  const char *end = NULL;
  *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
  if (!*root) {
    size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
    int line = 1;
    for (size_t i = 0; i < at; i++)
      line += buf[i] == '\n';
    rc = dpc_err(DPC_EFORMAT, "%s:%d: not valid JSON (parse stopped at byte %zu)", L->path, line, at);
  } else if (!cJSON_IsObject(*root)) {
    rc = dpc_err(DPC_EFORMAT, "%s: expected a JSON object (a Hugging Face tokenizer.json)", L->path);
  }
  free(buf);
  return rc;
}

static int load_all(hf_load *L, const cJSON *root) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  if (is_null(added)) added = NULL;
  int rc, V = 0;
  if ((rc = check_top(L, root)) || (rc = check_model(L, model)) ||
      (rc = load_pretok(L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))))
    return rc;
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  if ((rc = scan_ids(L, vocab, added, &V)) || (rc = place_ids(L, vocab, added, V)) || (rc = build_vocab(L, V)) ||
      (rc = build_added(L, added)) || (rc = check_added_ids(L)) ||
      (rc = load_merges(L, cJSON_GetObjectItemCaseSensitive(model, "merges"))))
    return rc;
  static const char *eots[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
  L->t->eot = -1;
  for (int i = 0; i < 3 && L->t->eot < 0; i++)
    for (int id = 0; id < V; id++)
      if (strcmp(L->str[id], eots[i]) == 0) {
        L->t->eot = id;
        break;
      }
  return 0;
}

int tok_open_hf(const char *path, dpc_tokenizer **out) {
  if (!path || !out) return dpc_err(DPC_EINVAL, "tok_open_hf: NULL argument");
  *out = NULL;
  hf_load L = {.path = path};
  tokint_byte_unicode_map(L.uni);
  cJSON *root = NULL;
  dpc_tokenizer *t = calloc(1, sizeof *t);
  struct tokhf *h = calloc(1, sizeof *h);
  int rc = 0;
  if (!t || !h) {
    free(t);
    free(h);
    return dpc_err(DPC_ENOMEM, "tok_open_hf: out of memory");
  }
  t->kind = TOK_HF;
  t->hf = h;
  t->hf_free = hf_free;
  t->hf_encode = hf_encode;
  L.t = t;
  L.h = h;
  h->mctx = pcre2_match_context_create(NULL);
  if (!h->mctx) rc = dpc_err(DPC_ENOMEM, "tok_open_hf: out of memory");
  if (!rc) {
    pcre2_set_match_limit(h->mctx, HF_MATCH_LIMIT);
    rc = load_json(&L, &root);
  }
  if (!rc) rc = load_all(&L, root);
  cJSON_Delete(root);
  free(L.str);
  free(L.is_model);
  free(L.is_added);
  if (rc) {
    tok_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

int tok_open_spec(const char *spec, const char *vocab_dir, dpc_tokenizer **out) {
  if (!spec || !out) return dpc_err(DPC_EINVAL, "tok_open_spec: NULL argument");
  *out = NULL;
  if (strcmp(spec, "byte") == 0) return tok_open_byte(out);
  if (strcmp(spec, "gpt2") == 0) {
    if (!vocab_dir)
      return dpc_err(DPC_EINVAL, "tokenizer gpt2 needs --vocab-dir DIR (encoder.json, vocab.bpe); or give a "
                                 "tokenizer.json path");
    return tok_open_gpt2(vocab_dir, out);
  }
  struct stat st;
  if (stat(spec, &st) != 0)
    return dpc_err(DPC_ENOENT,
                   "unknown tokenizer %s: not byte or gpt2, and no such file or directory (give a tokenizer.json)",
                   spec);
  if (!S_ISDIR(st.st_mode)) return tok_open_hf(spec, out);
  size_t n = strlen(spec) + 16;
  char *p = malloc(n);
  if (!p) return dpc_err(DPC_ENOMEM, "tok_open_spec: out of memory");
  snprintf(p, n, "%s/tokenizer.json", spec);
  int rc = tok_open_hf(p, out);
  free(p);
  return rc;
}
