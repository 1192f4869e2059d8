/* codec.h — wire codecs for float streams (proto/dipaco.proto enum Codec, docs/design.md
 * §3): how a fragment's parameters, deltas or optimizer moments become the bytes of a chunk
 * stream and back. Both daemons use these functions and nothing else to encode, size and
 * check a stream, so a new codec is added here once.
 *
 * Every codec is implemented (the normative math is docs/design.md §3):
 *  - DPC_CODEC_FP32: little-endian IEEE fp32, exact; the default.
 *  - DPC_CODEC_BF16: bfloat16, round to nearest even (the upper 16 bits of the fp32 pattern
 *    after rounding).
 *  - Block codecs: the stream is a sequence of blocks of block_floats consecutive values (the
 *    last block possibly short), each [fp32 scale, little-endian][codes]; amax is the block's
 *    largest |x|, and a block of zeros has scale 0 and all codes 0.
 *    DPC_CODEC_INT8: scale = amax / 127, code = round-half-even(x / scale) in [-127, 127],
 *      one byte each (two's complement); value = code * scale. Error <= scale / 2.
 *    DPC_CODEC_FP8_E4M3: scale = amax / 448, code = x / scale rounded to the nearest OCP
 *      e4m3fn value (ties to even mantissa, saturating at 448, no -0 written), one byte each;
 *      value = e4m3(code) * scale. Relative error <= 2^-4 (absolute <= scale * 2^-10 below
 *      scale * 2^-6, the subnormal codes).
 *    DPC_CODEC_E3M0: scale = amax, 4-bit codes (bit 3 sign, bits 0..2 e), two per byte, low
 *      nibble first, an odd count padding the last high nibble with 0; |value| = 0 (e = 0)
 *      or 2^(e-7) * scale (1/64 .. 1), the level nearest to |x| / scale, a midpoint taking the
 *      larger level. 132 bytes per 256 floats (0.129x fp32).
 *    dpc_codec_bytes sizes them so a stream header can be checked. An int8 or fp8 scale
 *    rounds to 0 in fp32 for a block of tiny subnormals (amax <= 127 * 2^-150, resp.
 *    448 * 2^-150): such a block is written as zeros too, which is what it decodes to.
 * Decoding always yields fp32; accumulation is fp32 (docs/design.md §3). Encoding and
 * decoding are deterministic: fp32 arithmetic only, no contraction, no dependence on the
 * rounding mode beyond the default round-to-nearest-even.
 *
 * Ownership: callers own every buffer. Thread-safety: all functions are reentrant. */
#ifndef DPC_CODEC_H
#define DPC_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* Values equal dipaco.v1.Codec on the wire. */
typedef enum {
  DPC_CODEC_FP32 = 0,
  DPC_CODEC_BF16 = 1,
  DPC_CODEC_INT8 = 2,
  DPC_CODEC_FP8_E4M3 = 3,
  DPC_CODEC_E3M0 = 4,
  DPC_CODEC_COUNT
} dpc_codec;

/* dipaco.v1.CODEC_SPARSE: SparseLoCo's sparse streams (common/sparse.h), which need the
 * fragment's tensor layout and the job's settings, so none of the dense functions below take
 * it (dpc_codec_supported is 0; a job spec selects it with its "sparse" block, not a name). */
#define DPC_CODEC_SPARSE 5

/* "fp32", "bf16", "int8", "fp8", "e3m0" ("sparse" for DPC_CODEC_SPARSE); "?" for a value
 * outside the enum. */
const char *dpc_codec_name(int codec);
/* Parse a codec name as job specs write it; DPC_EINVAL naming the accepted names otherwise. */
int dpc_codec_parse(const char *name, dpc_codec *out);
/* 1 if dpc_codec_encode/decode implement the codec (every dpc_codec value). */
int dpc_codec_supported(int codec);
/* 1 for the block codecs (int8, fp8, e3m0), whose streams need block_floats. */
int dpc_codec_is_block(int codec);

/* Floats per scale block that job specs and workers use unless told otherwise. */
#define DPC_CODEC_BLOCK_DEFAULT 256

/* Encoded size in bytes of n floats (block_floats: floats per scale block for block codecs,
 * ignored otherwise). DPC_EINVAL for an unknown codec or a block codec with block_floats 0;
 * DPC_ERANGE if the size does not fit in size_t. */
int dpc_codec_bytes(int codec, uint64_t n, uint32_t block_floats, size_t *bytes);

/* The bit of a codec in an `accept` set: DPC_CODEC_BIT(DPC_CODEC_FP32) | ... */
#define DPC_CODEC_BIT(c) (1u << (c))

/* Check a received stream header against what the receiver expects: the codec is in
 * `accept` (a set of DPC_CODEC_BIT; codecs this file cannot decode are never accepted),
 * num_floats equals want_floats and total equals the encoded size. DPC_EFORMAT /
 * DPC_EUNSUPPORTED with a message naming the field and both values. */
int dpc_codec_check(int codec, unsigned accept, uint64_t num_floats, uint64_t total, uint32_t block_floats,
                    uint64_t want_floats);

/* Encode x[n] into out[dpc_codec_bytes(...)] bytes. Non-finite input is refused before
 * anything is written (DPC_ENUMERIC naming the index), and so is a value whose block could
 * not be decoded (DPC_ENUMERIC: int8 with |x| near FLT_MAX, where 127 * scale overflows);
 * bf16 rounding cannot overflow a finite fp32 to infinity beyond what fp32 → bf16 RNE gives
 * (values above the largest bf16 round to infinity, which is refused too). */
int dpc_codec_encode(int codec, const float *x, size_t n, uint32_t block_floats, unsigned char *out);

/* Decode in[bytes] into y[n]; bytes must equal the encoded size of n floats (DPC_EFORMAT
 * otherwise). A non-finite fp32/bf16 value, a non-finite block scale or a decoded non-finite
 * value is DPC_ENUMERIC; a negative scale, an int8 code -128 (0x80), an fp8 NaN code (0x7f,
 * 0xff) or a non-zero e3m0 pad nibble — bytes no encoder writes — are DPC_EFORMAT. Messages
 * name the block and the value's index. y may be partly written on error. */
int dpc_codec_decode(int codec, const unsigned char *in, size_t bytes, size_t n, uint32_t block_floats, float *y);

#endif
