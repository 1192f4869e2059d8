/* codec.h — wire codecs for float streams (proto/dipaco.proto enum Codec, DESIGN.md §3): how
 * a fragment's parameters, deltas or optimizer moments become the bytes of a chunk stream and
 * back. Both daemons use these functions and nothing else to encode, size and check a stream,
 * so a new codec is added here once.
 *
 * Implemented: DPC_CODEC_FP32 (little-endian IEEE fp32, the exact default) and DPC_CODEC_BF16
 * (bfloat16, round to nearest even: the upper 16 bits of the fp32 pattern after rounding).
 * Reserved, refused with DPC_EUNSUPPORTED until Streaming DiLoCo implements them (issue #14):
 * int8, fp8 e4m3 and 4-bit e3m0 — block codecs whose stream is a sequence of blocks, each
 * [fp32 scale, little-endian][block_floats codes], the last block possibly short;
 * dpc_codec_bytes already sizes them so a stream header can be checked. Decoding always
 * yields fp32; accumulation is fp32 (DESIGN.md §3).
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

/* "fp32", "bf16", "int8", "fp8", "e3m0"; "?" for a value outside the enum. */
const char *dpc_codec_name(int codec);
/* Parse a codec name as job specs write it; DPC_EINVAL naming the accepted names otherwise. */
int dpc_codec_parse(const char *name, dpc_codec *out);
/* 1 if dpc_codec_encode/decode implement the codec. */
int dpc_codec_supported(int codec);

/* Encoded size in bytes of n floats (block_floats: floats per scale block for block codecs,
 * ignored otherwise). DPC_EINVAL for an unknown codec or a block codec with block_floats 0;
 * DPC_ERANGE if the size does not fit in size_t. */
int dpc_codec_bytes(int codec, uint64_t n, uint32_t block_floats, size_t *bytes);

/* Floats per scale block of the block codecs unless a job says otherwise. */
#define DPC_CODEC_BLOCK_DEFAULT 256

/* 1 for the block codecs (int8, fp8, e3m0: a per-block fp32 scale), else 0. */
int dpc_codec_is_block(int codec);

/* The bit of a codec in an `accept` set: DPC_CODEC_BIT(DPC_CODEC_FP32) | ... */
#define DPC_CODEC_BIT(c) (1u << (c))

/* Check a received stream header against what the receiver expects: the codec is in
 * `accept` (a set of DPC_CODEC_BIT; codecs this file cannot decode are never accepted),
 * num_floats equals want_floats and total equals the encoded size. DPC_EFORMAT /
 * DPC_EUNSUPPORTED with a message naming the field and both values. */
int dpc_codec_check(int codec, unsigned accept, uint64_t num_floats, uint64_t total, uint32_t block_floats,
                    uint64_t want_floats);

/* Encode x[n] into out[dpc_codec_bytes(...)] bytes. Non-finite input is refused before
 * anything is written (DPC_ENUMERIC naming the index); bf16 rounding cannot overflow a
 * finite fp32 to infinity beyond what fp32 → bf16 RNE gives (values above the largest bf16
 * round to infinity, which is refused too). */
int dpc_codec_encode(int codec, const float *x, size_t n, uint32_t block_floats, unsigned char *out);

/* Decode in[bytes] into y[n]; bytes must equal the encoded size of n floats (DPC_EFORMAT
 * otherwise). A decoded non-finite value is DPC_ENUMERIC naming the index. */
int dpc_codec_decode(int codec, const unsigned char *in, size_t bytes, size_t n, uint32_t block_floats, float *y);

#endif
