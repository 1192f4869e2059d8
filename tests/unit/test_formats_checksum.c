/* test_formats_checksum.c — CRC32C against published vectors (RFC 3720 B.4), hardware path
 * against the software path over many lengths and alignments, chaining, and throughput
 * (`--bench` measures 256 MiB fragments). */
#include "common/checksum.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 0x1234567887654321ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Bit-at-a-time CRC-32C: the independent definition. */
static uint32_t crc_bitwise(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(size_t n, int reps) {
  unsigned char *buf = malloc(n);
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)next_rand();
  uint32_t sink = 0;
  double t0 = now();
  for (int r = 0; r < reps; r++) sink ^= dpc_crc32c_hw(0, buf, n);
  double t1 = now();
  for (int r = 0; r < reps; r++) sink ^= dpc_crc32c_sw(0, buf, n);
  double t2 = now();
  printf("crc32c over %zu MiB x %d: hw %s %.2f GB/s, sw %.2f GB/s (sink %08x)\n", n >> 20, reps,
         dpc_crc32c_hw_available() ? "(sse4.2)" : "(unavailable: sw)", (double)n * reps / (t1 - t0) / 1e9,
         (double)n * reps / (t2 - t1) / 1e9, sink);
  free(buf);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
    bench((size_t)256 << 20, 4);
    return 0;
  }
  const char *v = "123456789";
  CHECK_EQ_INT(dpc_crc32c(0, v, 9), 0xE3069283u);
  CHECK_EQ_INT(dpc_crc32c_sw(0, v, 9), 0xE3069283u);
  CHECK_EQ_INT(dpc_crc32c_hw(0, v, 9), 0xE3069283u);
  CHECK_EQ_INT(dpc_crc32c(0, "", 0), 0);
  unsigned char b[32];
  memset(b, 0, 32);
  CHECK_EQ_INT(dpc_crc32c(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, 32);
  CHECK_EQ_INT(dpc_crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
  CHECK_EQ_INT(dpc_crc32c(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
  CHECK_EQ_INT(dpc_crc32c(0, b, 32), 0x113FDB5Cu);
  printf("hardware crc32c: %s\n", dpc_crc32c_hw_available() ? "yes" : "no");

  /* hw == sw == bitwise over lengths that hit every path of the 3-stream code (unaligned
   * head, 3x8192 and 3x256 blocks, 8-byte words, tail) at all 8 alignments. */
  const size_t maxn = 3 * 8192 * 2 + 3 * 256 * 3 + 77;
  unsigned char *buf = malloc(maxn + 16);
  for (size_t i = 0; i < maxn + 16; i++) buf[i] = (unsigned char)next_rand();
  size_t lens[] = {0, 1, 7, 8, 9, 15, 16, 63, 255, 256, 767, 768, 769, 1000, 4096, 8191,
                   24575, 24576, 24577, 24576 + 768, 24576 * 2 + 5, maxn};
  int mismatches = 0;
  for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
    for (int a = 0; a < 8; a++) {
      const unsigned char *p = buf + a;
      size_t n = lens[li];
      uint32_t ref = crc_bitwise(p, n);
      if (dpc_crc32c_sw(0, p, n) != ref || dpc_crc32c_hw(0, p, n) != ref || dpc_crc32c(0, p, n) != ref) mismatches++;
    }
  for (int it = 0; it < 300; it++) {
    size_t n = next_rand() % maxn, a = next_rand() % 16;
    if (n + a > maxn + 16) n = maxn + 16 - a;
    uint32_t sw = dpc_crc32c_sw(0, buf + a, n);
    if (dpc_crc32c_hw(0, buf + a, n) != sw) mismatches++;
    /* Chaining: crc(a|b) == crc(crc(a), b) at a random split, on both paths. */
    size_t k = n ? next_rand() % n : 0;
    if (dpc_crc32c_hw(dpc_crc32c_hw(0, buf + a, k), buf + a + k, n - k) != sw) mismatches++;
    if (dpc_crc32c_sw(dpc_crc32c_sw(0, buf + a, k), buf + a + k, n - k) != sw) mismatches++;
  }
  CHECK_EQ_INT(mismatches, 0);
  free(buf);
  bench((size_t)8 << 20, 1);
  TEST_DONE();
}
