/* tokenizer.c — byte tokenizer and GPT-2 byte-level BPE (contract in tokenizer.h), and the
 * BPE, word cache and decoding that common/tokenizer_hf.c (tokenizer.json) builds on.
 *
 * Loading turns every token string of encoder.json back into the raw bytes it stands for
 * (GPT-2 writes bytes as printable code points, its "byte ↔ unicode" map), so the tables
 * and the BPE work on bytes, and decode is a lookup. The merges become a hash table from a
 * pair of ids to (rank, merged id).
 *
 * BPE on one piece uses a heap of candidate pairs ordered by (rank, position) over a linked
 * list of symbols: O(n log n) per piece, so long pieces (a run of 10^6 letters) stay cheap.
 * It gives the same result as the reference loop (merge every occurrence of the lowest-rank
 * pair left to right, repeat) provided every merge that creates a token comes before every
 * merge that uses it, because then a merge never makes a pair of lower or equal rank; the
 * loader checks that property (GPT-2's file has it, as has any file written by BPE training).
 * Pieces up to TOK_CACHE_PIECE_MAX bytes are memoised in a bounded word cache. */
#include "common/tokenizer_internal.h"

#include "common/errors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if PCRE2_MAJOR < 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR < 34)
#error "PCRE2 10.34 or newer is needed (PCRE2_MATCH_INVALID_UTF)"
#endif

#define GPT2_HINT "; fetch the GPT-2 files with deploy/fetch_assets.sh DIR"
#define TOK_CACHE_PIECE_MAX 64          /* longer pieces are not cached */
#define TOK_CACHE_MIN_SLOTS 4096
#define TOK_CACHE_MAX_ENTRIES (1u << 18) /* the cache is cleared when it gets this full */
#define TOK_CACHE_MAX_BYTES ((size_t)48 << 20)
#define TOK_SCRATCH_KEEP (1u << 16)      /* BPE scratch kept between calls, in symbols */

/* GPT-2's pre-tokenizer (encoder.py), unchanged. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- small helpers ---------------------------------------------------------------------- */

uint64_t tokint_hash_bytes(const unsigned char *p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = ((h << 5 | h >> 59) ^ w) * 0x517CC1B727220A95ull;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
  h = ((h << 5 | h >> 59) ^ w) * 0x517CC1B727220A95ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h ? h : 1; /* 0 marks an empty cache slot */
}

static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

size_t tokint_pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

/* Writes s[0..n) into out (size cap) as a quoted, escaped string for error messages. */
const char *tokint_quote(const unsigned char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  out[o++] = '"';
  for (size_t i = 0; i < n && o + 6 < cap; i++) {
    unsigned char c = s[i];
    if (c >= 0x20 && c != 0x7F && c != '"' && c != '\\') out[o++] = (char)c;
    else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
  }
  if (o + 2 > cap) o = cap - 2;
  out[o++] = '"';
  out[o] = '\0';
  return out;
}

/* Reads a whole file of at most TOK_FILE_MAX bytes; *buf (NUL-terminated) is the caller's. */
int tokint_read_file(const char *path, const char *hint, char **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    return dpc_err(e == ENOENT ? DPC_ENOENT : DPC_EIO,
                   "%s: cannot open (%s)%s", path, strerror(e), hint ? hint : "");
  }
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap + 1);
  if (!b) {
    fclose(f);
    return dpc_err(DPC_ENOMEM, "%s: out of memory reading the file", path);
  }
  for (;;) {
    if (n == cap) {
      if (cap >= TOK_FILE_MAX) {
        free(b);
        fclose(f);
        return dpc_err(DPC_EFORMAT, "%s: larger than %zu bytes; not a tokenizer file", path,
                       TOK_FILE_MAX);
      }
      cap *= 2;
      char *nb = realloc(b, cap + 1);
      if (!nb) {
        free(b);
        fclose(f);
        return dpc_err(DPC_ENOMEM, "%s: out of memory reading the file", path);
      }
      b = nb;
    }
    size_t got = fread(b + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(b);
    return dpc_err(DPC_EIO, "%s: read error", path);
  }
  b[n] = '\0';
  *buf = b;
  *len = n;
  return 0;
}

/* ---- GPT-2 byte ↔ unicode map ----------------------------------------------------------- */

/* GPT-2 shows byte b as code point b when b is printable Latin-1 (! .. ~, ¡ .. ¬, ® .. ÿ) and
 * as 256 + k for the k-th other byte. uni_to_byte inverts it (-1: not in the alphabet). */
void tokint_byte_unicode_map(int uni_to_byte[324]) {
  for (int i = 0; i < 324; i++) uni_to_byte[i] = -1;
  int k = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uni_to_byte[printable ? b : 256 + k++] = b;
  }
}

/* Decodes a token string (UTF-8 of code points of the byte alphabet) into raw bytes in out
 * (at least n bytes). Returns the byte count, or -1 when s is not valid UTF-8 or has a code
 * point outside the alphabet. */
long tokint_token_string_bytes(const int uni_to_byte[324], const unsigned char *s, size_t n,
                               unsigned char *out) {
  size_t i = 0, o = 0;
  while (i < n) {
    unsigned cp;
    if (s[i] < 0x80) {
      cp = s[i++];
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
      cp = (unsigned)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
      if (cp < 0x80) return -1;
      i += 2;
    } else {
      return -1; /* the alphabet ends at U+0143: two bytes at most */
    }
    if (cp >= 324 || uni_to_byte[cp] < 0) return -1;
    out[o++] = (unsigned char)uni_to_byte[cp];
  }
  return (long)o;
}

/* ---- vocabulary index (load time only): token bytes → id --------------------------------- */

int tokint_vindex_find(const dpc_tokenizer *t, const tok_vindex *vx, const unsigned char *s,
                       size_t n) {
  for (size_t i = tokint_hash_bytes(s, n) & vx->mask;; i = (i + 1) & vx->mask) {
    int32_t id = vx->slot[i];
    if (id < 0) return -1;
    size_t len = t->tok_off[id + 1] - t->tok_off[id];
    if (len == n && memcmp(t->tok_bytes + t->tok_off[id], s, n) == 0) return id;
  }
}

/* Inserts token id; returns the id already holding the same bytes, or -1. */
int tokint_vindex_add(const dpc_tokenizer *t, tok_vindex *vx, int32_t id) {
  const unsigned char *s = t->tok_bytes + t->tok_off[id];
  size_t n = t->tok_off[id + 1] - t->tok_off[id];
  size_t i = tokint_hash_bytes(s, n) & vx->mask;
  for (; vx->slot[i] >= 0; i = (i + 1) & vx->mask) {
    int32_t o = vx->slot[i];
    if (t->tok_off[o + 1] - t->tok_off[o] == n && memcmp(t->tok_bytes + t->tok_off[o], s, n) == 0)
      return o;
  }
  vx->slot[i] = id;
  return -1;
}

/* ---- merge table -------------------------------------------------------------------------- */

static int merge_find(const dpc_tokenizer *t, int32_t a, int32_t b, int32_t *merged) {
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (size_t i = hash_u64(key) & t->mmask;; i = (i + 1) & t->mmask) {
    if (t->mkeys[i] == key) {
      *merged = t->mmerged[i];
      return t->mrank[i];
    }
    if (t->mkeys[i] == TOK_EMPTY_KEY) return -1;
  }
}

int tokint_merges_alloc(dpc_tokenizer *t, size_t n) {
  t->mmask = tokint_pow2_at_least(2 * n) - 1;
  t->mkeys = malloc((t->mmask + 1) * sizeof *t->mkeys);
  t->mrank = malloc((t->mmask + 1) * sizeof *t->mrank);
  t->mmerged = malloc((t->mmask + 1) * sizeof *t->mmerged);
  if (!t->mkeys || !t->mrank || !t->mmerged) return dpc_err(DPC_ENOMEM, "tokenizer: out of memory for %zu merges", n);
  memset(t->mkeys, 0xFF, (t->mmask + 1) * sizeof *t->mkeys);
  return 0;
}

int tokint_merge_add(dpc_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged) {
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  size_t i = hash_u64(key) & t->mmask;
  for (; t->mkeys[i] != TOK_EMPTY_KEY; i = (i + 1) & t->mmask)
    if (t->mkeys[i] == key) return t->mrank[i];
  t->mkeys[i] = key;
  t->mrank[i] = rank;
  t->mmerged[i] = merged;
  return -1;
}

/* ---- loading ------------------------------------------------------------------------------- */

static int load_encoder(dpc_tokenizer *t, const char *path, const int uni_to_byte[324],
                        tok_vindex *vx) {
  char *buf = NULL, q[96];
  size_t len = 0;
  int rc = tokint_read_file(path, GPT2_HINT, &buf, &len);
  if (rc) return rc;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
  cJSON **by_id = NULL;
  if (!root) {
    size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
    int line = 1;
    for (size_t i = 0; i < at; i++) line += buf[i] == '\n';
    rc = dpc_err(DPC_EFORMAT, "%s:%d: not valid JSON (parse stopped at byte %zu); re-fetch it",
                 path, line, at);
    goto out;
  }
  if (!cJSON_IsObject(root)) {
    rc = dpc_err(DPC_EFORMAT, "%s: expected a JSON object mapping token strings to ids", path);
    goto out;
  }
  int V = cJSON_GetArraySize(root);
  if (V < 256 || V > TOK_VOCAB_MAX) {
    rc = dpc_err(DPC_EFORMAT, "%s: %d tokens; a byte-level BPE vocabulary has 256 to %d", path,
                 V, TOK_VOCAB_MAX);
    goto out;
  }
  by_id = calloc((size_t)V, sizeof *by_id);
  if (!by_id) {
    rc = dpc_err(DPC_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  size_t total = 0;
  for (cJSON *it = root->child; it; it = it->next) {
    const unsigned char *key = (const unsigned char *)it->string;
    size_t klen = strlen(it->string);
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !(v >= 0 && v < V) || v != (double)(int)v) {
      rc = dpc_err(DPC_EFORMAT, "%s: token %s: id must be an integer in [0, %d) (ids 0..V-1)",
                   path, tokint_quote(key, klen, q, sizeof q), V);
      goto out;
    }
    int id = (int)v;
    if (by_id[id]) {
      rc = dpc_err(DPC_EFORMAT, "%s: id %d is given to two tokens (%s and another)", path, id,
                   tokint_quote(key, klen, q, sizeof q));
      goto out;
    }
    if (klen == 0) {
      rc = dpc_err(DPC_EFORMAT, "%s: id %d has an empty token string", path, id);
      goto out;
    }
    by_id[id] = it;
    total += klen;
  }
  /* Every id in [0, V) is used: V distinct ids were seen in an object of V members. */
  t->n_vocab = V;
  t->tok_off = malloc(((size_t)V + 1) * sizeof *t->tok_off);
  t->tok_bytes = malloc(total + 1);
  vx->mask = tokint_pow2_at_least(2 * (size_t)V) - 1;
  vx->slot = malloc((vx->mask + 1) * sizeof *vx->slot);
  if (!t->tok_off || !t->tok_bytes || !vx->slot || total > UINT32_MAX) {
    rc = dpc_err(DPC_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  memset(vx->slot, 0xFF, (vx->mask + 1) * sizeof *vx->slot);
  size_t off = 0;
  for (int id = 0; id < V; id++) {
    const unsigned char *key = (const unsigned char *)by_id[id]->string;
    size_t klen = strlen(by_id[id]->string);
    long nb = tokint_token_string_bytes(uni_to_byte, key, klen, t->tok_bytes + off);
    if (nb < 0) {
      rc = dpc_err(DPC_EFORMAT, "%s: token %s (id %d) has a character outside GPT-2's byte "
                                "alphabet; not a byte-level BPE vocabulary",
                   path, tokint_quote(key, klen, q, sizeof q), id);
      goto out;
    }
    t->tok_off[id] = (uint32_t)off;
    off += (size_t)nb;
    t->tok_off[id + 1] = (uint32_t)off;
    if (tokint_vindex_add(t, vx, id) >= 0) {
      rc = dpc_err(DPC_EFORMAT, "%s: token %s (id %d) appears twice", path,
                   tokint_quote(key, klen, q, sizeof q), id);
      goto out;
    }
  }
  for (int b = 0; b < 256; b++) {
    unsigned char c = (unsigned char)b;
    t->byte_id[b] = tokint_vindex_find(t, vx, &c, 1);
    if (t->byte_id[b] < 0) {
      rc = dpc_err(DPC_EFORMAT, "%s: no token for byte 0x%02x; a byte-level BPE vocabulary has "
                                "all 256",
                   path, b);
      goto out;
    }
  }
  t->eot = tokint_vindex_find(t, vx, (const unsigned char *)"<|endoftext|>", 13);
out:
  free(by_id);
  cJSON_Delete(root);
  free(buf);
  return rc;
}

static int load_merges(dpc_tokenizer *t, const char *path, const int uni_to_byte[324],
                       const tok_vindex *vx) {
  char *buf = NULL, q[96];
  size_t len = 0;
  unsigned char *tmp = NULL, *used = NULL;
  int rc = tokint_read_file(path, GPT2_HINT, &buf, &len);
  if (rc) return rc;
  if (len < 8 || memcmp(buf, "#version", 8) != 0) {
    rc = dpc_err(DPC_EFORMAT, "%s:1: expected a \"#version: ...\" comment as the first line",
                 path);
    goto out;
  }
  size_t n_lines = 1;
  for (size_t i = 0; i < len; i++) n_lines += buf[i] == '\n';
  if (n_lines > INT32_MAX / 2) {
    rc = dpc_err(DPC_EFORMAT, "%s: too many lines", path);
    goto out;
  }
  tmp = malloc(len + 1);
  used = calloc((size_t)t->n_vocab, 1);
  if (tokint_merges_alloc(t, n_lines) || !tmp || !used) {
    rc = dpc_err(DPC_ENOMEM, "%s: out of memory", path);
    goto out;
  }

  const char *p = memchr(buf, '\n', len);
  size_t pos = p ? (size_t)(p - buf) + 1 : len;
  int lineno = 1, rank = 0;
  while (pos < len) {
    lineno++;
    const char *line = buf + pos;
    const char *nl = memchr(line, '\n', len - pos);
    size_t ll = nl ? (size_t)(nl - line) : len - pos;
    pos += ll + (nl ? 1 : 0);
    if (ll > 0 && line[ll - 1] == '\r') ll--;
    if (ll == 0) {
      if (pos >= len) break; /* the file's final newline */
      rc = dpc_err(DPC_EFORMAT, "%s:%d: empty line; each line is one merge \"A B\"", path,
                   lineno);
      goto out;
    }
    const char *sp = memchr(line, ' ', ll);
    if (!sp || sp == line || sp == line + ll - 1 ||
        memchr(sp + 1, ' ', ll - (size_t)(sp + 1 - line))) {
      rc = dpc_err(DPC_EFORMAT, "%s:%d: expected two tokens separated by one space, got %s", path,
                   lineno, tokint_quote((const unsigned char *)line, ll, q, sizeof q));
      goto out;
    }
    size_t la = (size_t)(sp - line), lb = ll - la - 1;
    long na = tokint_token_string_bytes(uni_to_byte, (const unsigned char *)line, la, tmp);
    long nb = na < 0 ? -1
                     : tokint_token_string_bytes(uni_to_byte, (const unsigned char *)sp + 1, lb, tmp + na);
    if (na < 0 || nb < 0) {
      rc = dpc_err(DPC_EFORMAT, "%s:%d: %s has a character outside GPT-2's byte alphabet", path,
                   lineno, tokint_quote((const unsigned char *)line, ll, q, sizeof q));
      goto out;
    }
    int ida = tokint_vindex_find(t, vx, tmp, (size_t)na);
    int idb = tokint_vindex_find(t, vx, tmp + na, (size_t)nb);
    int idm = tokint_vindex_find(t, vx, tmp, (size_t)(na + nb));
    if (ida < 0 || idb < 0 || idm < 0) {
      const char *what = ida < 0 ? "first token" : idb < 0 ? "second token" : "merged token";
      rc = dpc_err(DPC_EFORMAT, "%s:%d: the %s of %s is not in encoder.json", path, lineno, what,
                   tokint_quote((const unsigned char *)line, ll, q, sizeof q));
      goto out;
    }
    int prev = tokint_merge_add(t, ida, idb, rank, idm);
    if (prev >= 0) {
      rc = dpc_err(DPC_EFORMAT, "%s:%d: merge %s repeats line %d", path, lineno,
                   tokint_quote((const unsigned char *)line, ll, q, sizeof q), prev + 2);
      goto out;
    }
    if (used[idm]) {
      rc = dpc_err(DPC_EFORMAT, "%s:%d: merge %s creates a token that an earlier merge already "
                                "uses; merges must be listed in the order BPE created them",
                   path, lineno, tokint_quote((const unsigned char *)line, ll, q, sizeof q));
      goto out;
    }
    used[ida] = used[idb] = 1;
    rank++;
  }
out:
  free(used);
  free(tmp);
  free(buf);
  return rc;
}

static int compile_regex(dpc_tokenizer *t) {
  int errcode;
  PCRE2_SIZE erroff;
  t->re = pcre2_compile((PCRE2_SPTR)gpt2_pattern, PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode, &erroff, NULL);
  if (!t->re) {
    PCRE2_UCHAR msg[128];
    pcre2_get_error_message(errcode, msg, sizeof msg);
    return dpc_err(DPC_EINTERNAL, "tokenizer: PCRE2 rejects the GPT-2 pattern at %zu: %s",
                   (size_t)erroff, (const char *)msg);
  }
  t->use_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
  t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
  if (!t->md) return dpc_err(DPC_ENOMEM, "tokenizer: out of memory");
  return 0;
}

int tok_open_byte(dpc_tokenizer **out) {
  if (!out) return dpc_err(DPC_EINVAL, "tok_open_byte: out is NULL");
  dpc_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return dpc_err(DPC_ENOMEM, "tok_open_byte: out of memory");
  t->kind = TOK_BYTE;
  t->n_vocab = 256;
  t->eot = -1;
  *out = t;
  return 0;
}

int tok_open_gpt2(const char *vocab_dir, dpc_tokenizer **out) {
  if (!vocab_dir || !out) return dpc_err(DPC_EINVAL, "tok_open_gpt2: NULL argument");
  *out = NULL;
  size_t dl = strlen(vocab_dir);
  char *enc_path = malloc(dl + 16), *bpe_path = malloc(dl + 16);
  dpc_tokenizer *t = calloc(1, sizeof *t);
  tok_vindex vx = {NULL, 0};
  int rc = 0;
  if (!enc_path || !bpe_path || !t) {
    rc = dpc_err(DPC_ENOMEM, "tok_open_gpt2: out of memory");
    goto out;
  }
  snprintf(enc_path, dl + 16, "%s/encoder.json", vocab_dir);
  snprintf(bpe_path, dl + 16, "%s/vocab.bpe", vocab_dir);
  t->kind = TOK_GPT2;
  int uni_to_byte[324];
  tokint_byte_unicode_map(uni_to_byte);
  if ((rc = load_encoder(t, enc_path, uni_to_byte, &vx))) goto out;
  if ((rc = load_merges(t, bpe_path, uni_to_byte, &vx))) goto out;
  if ((rc = compile_regex(t))) goto out;
  *out = t;
  t = NULL;
out:
  free(vx.slot);
  free(enc_path);
  free(bpe_path);
  tok_free(t);
  return rc;
}

void tok_free(dpc_tokenizer *t) {
  if (!t) return;
  if (t->hf_free) t->hf_free(t->hf);
  free(t->tok_off);
  free(t->tok_bytes);
  free(t->mkeys);
  free(t->mrank);
  free(t->mmerged);
  pcre2_match_data_free(t->md);
  pcre2_code_free(t->re);
  free(t->cache);
  free(t->cache_keys);
  free(t->cache_ids);
  free(t->sym_id);
  free(t->sym_prev);
  free(t->sym_next);
  free(t->heap);
  free(t);
}

int tok_vocab_size(const dpc_tokenizer *t) { return t ? t->n_vocab : 0; }

int tok_eot(const dpc_tokenizer *t) { return t ? t->eot : -1; }

/* ---- encoding ------------------------------------------------------------------------------ */

int tokint_vec_reserve(tok_idvec *o, size_t extra) {
  if (o->n + extra <= o->cap) return 0;
  size_t cap = o->cap ? o->cap : 64;
  while (cap < o->n + extra) {
    if (cap > SIZE_MAX / 2 / sizeof(int)) return dpc_err(DPC_ENOMEM, "tok_encode: too many tokens");
    cap *= 2;
  }
  int *nv = realloc(o->v, cap * sizeof *nv);
  if (!nv) return dpc_err(DPC_ENOMEM, "tok_encode: out of memory for %zu ids", cap);
  o->v = nv;
  o->cap = cap;
  return 0;
}

static int heap_less(const heap_ent *x, const heap_ent *y) {
  return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(&e, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n) {
  heap_ent top = h[0], last = h[--*n];
  size_t i = 0, m = *n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= m) break;
    if (c + 1 < m && heap_less(&h[c + 1], &h[c])) c++;
    if (!heap_less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (m) h[i] = last;
  return top;
}

static int scratch_reserve(dpc_tokenizer *t, size_t n) {
  if (n <= t->scratch_cap) return 0;
  size_t cap = tokint_pow2_at_least(n);
  if (cap > INT32_MAX / 4)
    return dpc_err(DPC_ERANGE, "tok_encode: a single piece of %zu bytes is too long", n);
  free(t->sym_id);
  free(t->sym_prev);
  free(t->sym_next);
  free(t->heap);
  t->sym_id = malloc(cap * sizeof *t->sym_id);
  t->sym_prev = malloc(cap * sizeof *t->sym_prev);
  t->sym_next = malloc(cap * sizeof *t->sym_next);
  t->heap = malloc(3 * cap * sizeof *t->heap);
  if (!t->sym_id || !t->sym_prev || !t->sym_next || !t->heap) {
    t->scratch_cap = 0;
    return dpc_err(DPC_ENOMEM, "tok_encode: out of memory for a %zu-byte piece", n);
  }
  t->scratch_cap = cap;
  return 0;
}

static void push_pair(dpc_tokenizer *t, size_t *hn, int32_t i, int32_t j) {
  int32_t merged, a = t->sym_id[i], b = t->sym_id[j];
  int rank = merge_find(t, a, b, &merged);
  if (rank >= 0) heap_push(t->heap, hn, (heap_ent){rank, i, a, b, merged});
}

/* BPE of one piece p[0..n) (n >= 1); appends its ids to o. */
static int bpe_piece(dpc_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *o) {
  int rc = tokint_vec_reserve(o, n);
  if (rc) return rc;
  if (n == 1) {
    o->v[o->n++] = t->byte_id[p[0]];
    return 0;
  }
  if ((rc = scratch_reserve(t, n))) return rc;
  int32_t *id = t->sym_id, *prev = t->sym_prev, *next = t->sym_next;
  for (size_t i = 0; i < n; i++) {
    id[i] = t->byte_id[p[i]];
    prev[i] = (int32_t)i - 1;
    next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  size_t hn = 0;
  for (size_t i = 0; i + 1 < n; i++) push_pair(t, &hn, (int32_t)i, (int32_t)i + 1);
  while (hn) {
    heap_ent e = heap_pop(t->heap, &hn);
    int32_t i = e.pos, j = next[i];
    /* Skip a stale entry: its left symbol was consumed or changed, or its right one did. */
    if (id[i] != e.a || j < 0 || id[j] != e.b) continue;
    id[i] = e.merged;
    id[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) push_pair(t, &hn, prev[i], i);
    if (next[i] >= 0) push_pair(t, &hn, i, next[i]);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) o->v[o->n++] = id[i];
  return 0;
}

static void cache_clear(dpc_tokenizer *t) {
  memset(t->cache, 0, (t->cache_mask + 1) * sizeof *t->cache);
  t->cache_n = 0;
  t->cache_keys_len = 0;
  t->cache_ids_len = 0;
}

/* Doubles the slot table (at most 2 * TOK_CACHE_MAX_ENTRIES slots, so load stays <= 1/2). */
static int cache_grow(dpc_tokenizer *t) {
  size_t slots = 2 * (t->cache_mask + 1);
  cache_slot *c = calloc(slots, sizeof *c);
  if (!c) return -1;
  for (size_t j = 0; j <= t->cache_mask; j++) {
    if (!t->cache[j].h) continue;
    size_t i = t->cache[j].h & (slots - 1);
    while (c[i].h) i = (i + 1) & (slots - 1);
    c[i] = t->cache[j];
  }
  free(t->cache);
  t->cache = c;
  t->cache_mask = slots - 1;
  return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 4096;
  while (c < need) c *= 2;
  void *np = realloc(*p, c * elem);
  if (!np) return -1;
  *p = np;
  *cap = c;
  return 0;
}

/* Ids of the piece p[0..n) appended to o, from the cache or by BPE (then cached). */
int tokint_encode_piece(dpc_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *o) {
  if (n > TOK_CACHE_PIECE_MAX) return bpe_piece(t, p, n, o);
  if (!t->cache) {
    t->cache_mask = TOK_CACHE_MIN_SLOTS - 1;
    t->cache = calloc(t->cache_mask + 1, sizeof *t->cache);
    if (!t->cache) return dpc_err(DPC_ENOMEM, "tok_encode: out of memory for the word cache");
  }
  uint64_t h = tokint_hash_bytes(p, n);
  size_t i = h & t->cache_mask;
  for (; t->cache[i].h; i = (i + 1) & t->cache_mask) {
    const cache_slot *s = &t->cache[i];
    if (s->h == h && s->key_len == n && memcmp(t->cache_keys + s->key_off, p, n) == 0) {
      int rc = tokint_vec_reserve(o, s->n_ids);
      if (rc) return rc;
      memcpy(o->v + o->n, t->cache_ids + s->ids_off, s->n_ids * sizeof(int));
      o->n += s->n_ids;
      return 0;
    }
  }
  size_t start = o->n;
  int rc = bpe_piece(t, p, n, o);
  if (rc) return rc;
  size_t k = o->n - start;
  if (t->cache_n >= TOK_CACHE_MAX_ENTRIES ||
      t->cache_keys_len + 4 * t->cache_ids_len > TOK_CACHE_MAX_BYTES) {
    cache_clear(t);
    i = h & t->cache_mask;
  } else if (2 * (t->cache_n + 1) > t->cache_mask + 1) {
    if (cache_grow(t)) return 0; /* caching is optional; the ids are already out */
    i = h & t->cache_mask;
    while (t->cache[i].h) i = (i + 1) & t->cache_mask;
  }
  if (grow((void **)&t->cache_keys, &t->cache_keys_cap, t->cache_keys_len + n, 1) ||
      grow((void **)&t->cache_ids, &t->cache_ids_cap, t->cache_ids_len + k, sizeof(int)))
    return 0; /* caching is optional; the ids are already out */
  cache_slot *s = &t->cache[i];
  s->h = h;
  s->key_off = (uint32_t)t->cache_keys_len;
  s->key_len = (uint16_t)n;
  s->ids_off = (uint32_t)t->cache_ids_len;
  s->n_ids = (uint16_t)k;
  memcpy(t->cache_keys + t->cache_keys_len, p, n);
  memcpy(t->cache_ids + t->cache_ids_len, o->v + start, k * sizeof(int));
  t->cache_keys_len += n;
  t->cache_ids_len += k;
  t->cache_n++;
  return 0;
}

/* Finds the next regex match at or after pos; 1 with [*s, *e), 0 for none, or an error. */
static int next_match(dpc_tokenizer *t, const unsigned char *text, size_t len, size_t pos,
                      size_t *s, size_t *e) {
  int rc = t->use_jit ? pcre2_jit_match(t->re, text, len, pos, 0, t->md, NULL)
                      : pcre2_match(t->re, text, len, pos, 0, t->md, NULL);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(t->re, text, len, pos, PCRE2_NO_JIT, t->md, NULL);
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) {
    PCRE2_UCHAR msg[128];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return dpc_err(DPC_EINTERNAL, "tok_encode: PCRE2 match failed at byte %zu: %s", pos,
                   (const char *)msg);
  }
  const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
  if (ov[1] <= ov[0] || ov[0] < pos || ov[1] > len)
    return dpc_err(DPC_EINTERNAL, "tok_encode: empty or misplaced regex match at byte %zu", pos);
  *s = ov[0];
  *e = ov[1];
  return 1;
}

int tok_encode(dpc_tokenizer *t, const char *text, size_t len, int **ids, size_t *n) {
  if (!t || !ids || !n || (!text && len)) return dpc_err(DPC_EINVAL, "tok_encode: NULL argument");
  *ids = NULL;
  *n = 0;
  const unsigned char *u = (const unsigned char *)text;
  if (t->kind == TOK_BYTE) {
    int *v = malloc((len ? len : 1) * sizeof *v);
    if (!v) return dpc_err(DPC_ENOMEM, "tok_encode: out of memory for %zu ids", len);
    for (size_t i = 0; i < len; i++) v[i] = u[i];
    *ids = v;
    *n = len;
    return 0;
  }
  tok_idvec o = {NULL, 0, 0};
  int rc = tokint_vec_reserve(&o, len / 3 + 16);
  size_t pos = 0;
  if (!rc && t->hf_encode) {
    rc = t->hf_encode(t, u, len, &o);
    pos = len;
  }
  while (!rc && pos < len) {
    size_t s = len, e = len;
    int m = next_match(t, u, len, pos, &s, &e);
    if (m < 0) {
      rc = m;
      break;
    }
    /* Bytes the regex skipped (only invalid UTF-8 can be skipped) form one piece. */
    if (s > pos) rc = tokint_encode_piece(t, u + pos, s - pos, &o);
    if (!rc && m) rc = tokint_encode_piece(t, u + s, e - s, &o);
    pos = e;
  }
  if (t->scratch_cap > TOK_SCRATCH_KEEP) { /* do not hold ~72 bytes/byte of a huge piece */
    free(t->sym_id);
    free(t->sym_prev);
    free(t->sym_next);
    free(t->heap);
    t->sym_id = t->sym_prev = t->sym_next = NULL;
    t->heap = NULL;
    t->scratch_cap = 0;
  }
  if (rc) {
    free(o.v);
    return rc;
  }
  *ids = o.v;
  *n = o.n;
  return 0;
}

/* ---- decoding ------------------------------------------------------------------------------ */

int tok_decode(const dpc_tokenizer *t, const int *ids, size_t n, char **text, size_t *len) {
  if (!t || !text || !len || (!ids && n)) return dpc_err(DPC_EINVAL, "tok_decode: NULL argument");
  *text = NULL;
  *len = 0;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->n_vocab)
      return dpc_err(DPC_ERANGE, "tok_decode: token id %d at position %zu is outside the "
                                 "vocabulary [0, %d)",
                     ids[i], i, t->n_vocab);
    total += t->kind == TOK_BYTE ? 1 : t->tok_off[ids[i] + 1] - t->tok_off[ids[i]];
  }
  char *out = malloc(total + 1);
  if (!out) return dpc_err(DPC_ENOMEM, "tok_decode: out of memory for %zu bytes", total);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (t->kind == TOK_BYTE) {
      out[o++] = (char)ids[i];
    } else {
      size_t l = t->tok_off[ids[i] + 1] - t->tok_off[ids[i]];
      memcpy(out + o, t->tok_bytes + t->tok_off[ids[i]], l);
      o += l;
    }
  }
  out[o] = '\0';
  *text = out;
  *len = o;
  return 0;
}
