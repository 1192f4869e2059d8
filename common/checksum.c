/* checksum.c — CRC32C: a slice-by-8 software path and an SSE4.2 path that runs three
 * independent crc32 streams to hide the instruction's latency, then merges them with
 * precomputed "append n zero bytes" tables (Mark Adler's construction). Tables are built
 * once, on first use, under pthread_once. */
#include "common/checksum.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define DPC_CRC_X86 1
#endif

#define POLY 0x82f63b78u /* CRC-32C, bit-reflected */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

static uint32_t sw_table[8][256];
static uint32_t zeros_long[4][256];  /* shift a CRC register over LONG_BLOCK zero bytes */
static uint32_t zeros_short[4][256]; /* ... over SHORT_BLOCK zero bytes */
static int have_hw;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* GF(2) matrix (32 columns) times vector. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
  for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* Operator that feeds `len` zero bytes (len a power of two) through a CRC register. */
static void zeros_op(uint32_t *even, size_t len) {
  uint32_t odd[32];
  odd[0] = POLY; /* one zero bit */
  uint32_t row = 1;
  for (int n = 1; n < 32; n++) {
    odd[n] = row;
    row <<= 1;
  }
  gf2_square(even, odd); /* two zero bits */
  gf2_square(odd, even); /* four zero bits */
  for (;;) {
    gf2_square(even, odd); /* first pass: one byte */
    len >>= 1;
    if (len == 0) return;
    gf2_square(odd, even);
    len >>= 1;
    if (len == 0) break;
  }
  memcpy(even, odd, sizeof odd);
}

static void zeros_tables(uint32_t zeros[4][256], size_t len) {
  uint32_t op[32];
  zeros_op(op, len);
  for (uint32_t n = 0; n < 256; n++) {
    zeros[0][n] = gf2_times(op, n);
    zeros[1][n] = gf2_times(op, n << 8);
    zeros[2][n] = gf2_times(op, n << 16);
    zeros[3][n] = gf2_times(op, n << 24);
  }
}

static inline uint32_t shift_crc(uint32_t zeros[4][256], uint32_t crc) {
  return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
         zeros[3][crc >> 24];
}

static void init_tables(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    sw_table[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = sw_table[0][n];
    for (int k = 1; k < 8; k++) {
      c = sw_table[0][c & 0xff] ^ (c >> 8);
      sw_table[k][n] = c;
    }
  }
  zeros_tables(zeros_long, LONG_BLOCK);
  zeros_tables(zeros_short, SHORT_BLOCK);
#ifdef DPC_CRC_X86
  __builtin_cpu_init();
  have_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

static inline uint64_t load64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

uint32_t dpc_crc32c_sw(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&tables_once, init_tables);
  const unsigned char *p = buf;
  uint64_t c = ~crc & 0xffffffffu;
  while (n && ((uintptr_t)p & 7)) {
    c = sw_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    n--;
  }
  while (n >= 8) {
    /* Little-endian word: byte 0 is the low byte. */
    uint64_t w = load64(p) ^ c;
    c = sw_table[7][w & 0xff] ^ sw_table[6][(w >> 8) & 0xff] ^ sw_table[5][(w >> 16) & 0xff] ^
        sw_table[4][(w >> 24) & 0xff] ^ sw_table[3][(w >> 32) & 0xff] ^
        sw_table[2][(w >> 40) & 0xff] ^ sw_table[1][(w >> 48) & 0xff] ^ sw_table[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = sw_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return (uint32_t)~c;
}

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checksum.c assumes a little-endian host"
#endif

#ifdef DPC_CRC_X86
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *buf,
                                                                 size_t len) {
  const unsigned char *next = buf;
  uint64_t crc0 = ~crc & 0xffffffffu;
  while (len && ((uintptr_t)next & 7)) {
    crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
    len--;
  }
  /* Three streams of LONG_BLOCK, merged: crc(A|B) = shift(crc(A), |B|) ^ crc0(B). */
  while (len >= 3 * LONG_BLOCK) {
    uint64_t crc1 = 0, crc2 = 0;
    const unsigned char *end = next + LONG_BLOCK;
    do {
      crc0 = _mm_crc32_u64(crc0, load64(next));
      crc1 = _mm_crc32_u64(crc1, load64(next + LONG_BLOCK));
      crc2 = _mm_crc32_u64(crc2, load64(next + 2 * LONG_BLOCK));
      next += 8;
    } while (next < end);
    crc0 = shift_crc(zeros_long, (uint32_t)crc0) ^ crc1;
    crc0 = shift_crc(zeros_long, (uint32_t)crc0) ^ crc2;
    next += 2 * LONG_BLOCK;
    len -= 3 * LONG_BLOCK;
  }
  while (len >= 3 * SHORT_BLOCK) {
    uint64_t crc1 = 0, crc2 = 0;
    const unsigned char *end = next + SHORT_BLOCK;
    do {
      crc0 = _mm_crc32_u64(crc0, load64(next));
      crc1 = _mm_crc32_u64(crc1, load64(next + SHORT_BLOCK));
      crc2 = _mm_crc32_u64(crc2, load64(next + 2 * SHORT_BLOCK));
      next += 8;
    } while (next < end);
    crc0 = shift_crc(zeros_short, (uint32_t)crc0) ^ crc1;
    crc0 = shift_crc(zeros_short, (uint32_t)crc0) ^ crc2;
    next += 2 * SHORT_BLOCK;
    len -= 3 * SHORT_BLOCK;
  }
  while (len >= 8) {
    crc0 = _mm_crc32_u64(crc0, load64(next));
    next += 8;
    len -= 8;
  }
  while (len) {
    crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
    len--;
  }
  return (uint32_t)~crc0;
}
#endif

int dpc_crc32c_hw_available(void) {
  pthread_once(&tables_once, init_tables);
  return have_hw;
}

uint32_t dpc_crc32c_hw(uint32_t crc, const void *p, size_t n) {
  pthread_once(&tables_once, init_tables);
#ifdef DPC_CRC_X86
  if (have_hw) return crc32c_sse42(crc, p, n);
#endif
  return dpc_crc32c_sw(crc, p, n);
}

uint32_t dpc_crc32c(uint32_t crc, const void *p, size_t n) { return dpc_crc32c_hw(crc, p, n); }
