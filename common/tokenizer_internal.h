/* tokenizer_internal.h — the dpc_tokenizer object and the helpers that common/tokenizer.c
 * (byte and GPT-2 tokenizers, BPE, encode/decode) shares with common/tokenizer_hf.c (the
 * Hugging Face tokenizer.json loader). Private to those two files; users see tokenizer.h.
 *
 * tokenizer.c is the lower module: it never calls tokenizer_hf.c by name. A tokenizer.json
 * tokenizer reaches its own code through the hf_encode / hf_free callbacks below. */
#ifndef DPC_TOKENIZER_INTERNAL_H
#define DPC_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tokenizer.h"

#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

enum { TOK_BYTE = 1, TOK_GPT2 = 2, TOK_HF = 3 };

#define TOK_FILE_MAX ((size_t)64 << 20) /* bound on a vocabulary file's size */
#define TOK_VOCAB_MAX (1 << 22)
#define TOK_EMPTY_KEY UINT64_MAX

typedef struct {
  uint64_t h;       /* hash of the piece; 0 marks an empty slot */
  uint32_t key_off; /* piece bytes in cache_keys */
  uint32_t ids_off; /* its ids in cache_ids */
  uint16_t key_len;
  uint16_t n_ids;
} cache_slot;

typedef struct {
  int32_t rank, pos; /* heap order: lowest rank first, then leftmost */
  int32_t a, b;      /* the pair as it was when pushed; stale if the symbols changed */
  int32_t merged;
} heap_ent;

/* A growing array of token ids. */
typedef struct {
  int *v;
  size_t n, cap;
} tok_idvec;

/* Token bytes → id (open addressing over ids; -1 marks an empty slot). */
typedef struct {
  int32_t *slot;
  size_t mask;
} tok_vindex;

struct tokhf; /* tokenizer.json state, owned by tokenizer_hf.c */

struct dpc_tokenizer {
  int kind;
  int n_vocab;
  int eot;

  /* The bytes of token i are tok_bytes[tok_off[i] .. tok_off[i + 1]). */
  uint32_t *tok_off; /* (V + 1) */
  unsigned char *tok_bytes;
  int byte_id[256]; /* the single-byte token of each byte */

  /* Merge table: key (a << 32 | b) → rank and merged id; open addressing, size a power of 2. */
  uint64_t *mkeys;
  int32_t *mrank, *mmerged;
  size_t mmask;

  pcre2_code *re; /* GPT-2's pre-tokenizer */
  pcre2_match_data *md;
  int use_jit;

  /* tokenizer.json: its state and the two callbacks tok_encode / tok_free go through. */
  struct tokhf *hf;
  int (*hf_encode)(dpc_tokenizer *t, const unsigned char *text, size_t len, tok_idvec *o);
  void (*hf_free)(struct tokhf *hf);

  /* Word cache (encode only). */
  cache_slot *cache;
  size_t cache_mask, cache_n;
  unsigned char *cache_keys;
  size_t cache_keys_len, cache_keys_cap;
  int *cache_ids;
  size_t cache_ids_len, cache_ids_cap;

  /* BPE scratch, sized for the longest piece seen. */
  int32_t *sym_id, *sym_prev, *sym_next; /* (n) */
  heap_ent *heap;                        /* (3n) */
  size_t scratch_cap;
};

uint64_t tokint_hash_bytes(const unsigned char *p, size_t n);
size_t tokint_pow2_at_least(size_t n);
/* s[0..n) quoted and escaped into out (size cap), for error messages; returns out. */
const char *tokint_quote(const unsigned char *s, size_t n, char *out, size_t cap);
/* A whole file of at most TOK_FILE_MAX bytes, NUL-terminated; *buf is the caller's;
 * hint (or NULL) is appended to the message when the file cannot be opened. */
int tokint_read_file(const char *path, const char *hint, char **buf, size_t *len);
/* GPT-2's byte ↔ printable code point map: uni_to_byte[cp] is the byte, or -1. */
void tokint_byte_unicode_map(int uni_to_byte[324]);
/* Raw bytes of a token string written in that alphabet (out holds n bytes); -1 if it is not. */
long tokint_token_string_bytes(const int uni_to_byte[324], const unsigned char *s, size_t n,
                               unsigned char *out);
int tokint_vindex_find(const dpc_tokenizer *t, const tok_vindex *vx, const unsigned char *s,
                       size_t n);
/* Inserts id; returns the id already holding the same bytes, or -1. */
int tokint_vindex_add(const dpc_tokenizer *t, tok_vindex *vx, int32_t id);
/* Allocates an empty merge table for up to n merges (DPC_ENOMEM). */
int tokint_merges_alloc(dpc_tokenizer *t, size_t n);
/* Adds a merge; returns the rank of an existing identical pair, or -1. */
int tokint_merge_add(dpc_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged);
int tokint_vec_reserve(tok_idvec *o, size_t extra);
/* BPE ids of the piece p[0..n) (n >= 1) appended to o, through the word cache. */
int tokint_encode_piece(dpc_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *o);

#endif
