/* test_formats_safetensors.c — safetensors round trip, deterministic output, 16-bit
 * conversions, and hostile headers (each must give the right code and name the file). */
#include "common/errors.h"
#include "common/safetensors.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/dpc_st_XXXXXX";
static char path[256];

/* Write a raw safetensors-like file: 8-byte length (hlen_override if nonzero), the header
 * text, and `data_len` bytes of data. */
static void write_raw(const char *hdr, uint64_t hlen_override, size_t data_len) {
  FILE *f = fopen(path, "wb");
  uint64_t hlen = hlen_override ? hlen_override : strlen(hdr);
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(hlen >> (8 * i));
  fwrite(lb, 1, 8, f);
  fwrite(hdr, 1, strlen(hdr), f);
  for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
  fclose(f);
}

/* A source in memory for st_open_source: counts its reads; fail_from > 0 fails every read at or
 * past that offset as a store outage would. */
typedef struct {
  const unsigned char *b;
  uint64_t len, fail_from;
  int reads;
} mem_src;

static int mem_read(void *ctx, uint64_t off, void *dst, size_t n) {
  mem_src *m = ctx;
  m->reads++;
  if (m->fail_from && off + n > m->fail_from) return dpc_err(DPC_EUNAVAILABLE, "store down at %llu", (unsigned long long)off);
  if (off > m->len || n > m->len - off) return 1;
  memcpy(dst, m->b + off, n);
  return 0;
}

/* Open must fail with `code` and a detail naming the file and containing `what`. */
static int expect_fail(const char *hdr, size_t data_len, int code, const char *what) {
  write_raw(hdr, 0, data_len);
  st_file *f = NULL;
  int rc = st_open(path, &f);
  int ok = rc == code && f == NULL && strstr(dpc_errmsg(), path) && strstr(dpc_errmsg(), what);
  if (!ok) fprintf(stderr, "  header %s: rc %d, detail \"%s\"\n", hdr, rc, dpc_errmsg());
  st_close(f);
  return ok;
}

static int files_equal(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int eq = fa && fb;
  while (eq) {
    int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) eq = 0;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return eq;
}

int main(void) {
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/t.safetensors", dir);

  /* 16-bit conversions on exact values. */
  CHECK(st_bf16_to_f32(0x3f80) == 1.0f && st_bf16_to_f32(0xc000) == -2.0f);
  CHECK(isinf(st_bf16_to_f32(0x7f80)));
  CHECK(st_f16_to_f32(0x3c00) == 1.0f && st_f16_to_f32(0xc000) == -2.0f);
  CHECK(st_f16_to_f32(0x0001) == 0x1p-24f && st_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  CHECK(st_f16_to_f32(0x7bff) == 65504.0f && st_f16_to_f32(0x3555) == 0x1.554p-2f);
  CHECK(isinf(st_f16_to_f32(0xfc00)) && st_f16_to_f32(0xfc00) < 0 && isnan(st_f16_to_f32(0x7e00)));
  CHECK(signbit(st_f16_to_f32(0x8000)) && st_f16_to_f32(0x8000) == 0.0f);
  CHECK_EQ_INT(st_f32_to_bf16(1.0f), 0x3f80);
  CHECK_EQ_INT(st_f32_to_bf16(0x1.01p0f), 0x3f80); /* tie -> even */
  CHECK_EQ_INT(st_f32_to_bf16(0x1.03p0f), 0x3f82); /* tie -> even (up) */
  CHECK_EQ_INT(st_f32_to_bf16(0x1.0101p0f), 0x3f81);
  CHECK(isnan(st_bf16_to_f32(st_f32_to_bf16(NAN))));

  /* Round trip: F32 matrix, scalar, empty tensor, BF16, I32, metadata with escapes. */
  float a[6] = {1, -2, 3.5f, 1e-30f, -0.0f, 7};
  float s = 42;
  uint16_t h[3] = {st_f32_to_bf16(0.5f), st_f32_to_bf16(-3.0f), st_f32_to_bf16(1.0f / 3)};
  int32_t ints[2] = {5, -6};
  st_write_tensor wt[] = {
      {"b.matrix", ST_F32, 2, {2, 3}, a},
      {"a.scalar", ST_F32, 0, {0}, &s},
      {"empty \"q\"", ST_F32, 2, {0, 4}, NULL},
      {"half", ST_BF16, 1, {3}, h},
      {"ints", ST_I32, 1, {2}, ints},
  };
  const char *meta[] = {"format", "pt", "note", "tab\there \"quoted\""};
  CHECK_EQ_INT(st_write(path, wt, 5, meta, 2), 0);
  st_file *f;
  CHECK_EQ_INT(st_open(path, &f), 0);
  CHECK_EQ_INT(st_num_tensors(f), 5);
  CHECK(strcmp(st_metadata(f, "format"), "pt") == 0);
  CHECK(strcmp(st_metadata(f, "note"), "tab\there \"quoted\"") == 0);
  CHECK(st_metadata(f, "absent") == NULL);
  int i = st_find(f, "b.matrix");
  CHECK_EQ_INT(i, 0); /* header order is write order */
  const st_tensor *t = st_get(f, i);
  CHECK(t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6);
  CHECK(t->begin == 0 && t->end == 24);
  float got[6];
  CHECK_EQ_INT(st_read_f32(f, i, 0, 6, got), 0);
  CHECK(memcmp(got, a, sizeof a) == 0);
  CHECK_EQ_INT(st_read_f32(f, i, 2, 3, got), 0);
  CHECK(memcmp(got, a + 2, 3 * sizeof *a) == 0);
  CHECK_EQ_INT(st_read_f32(f, i, 4, 3, got), DPC_EINVAL);
  i = st_find(f, "a.scalar");
  CHECK(st_get(f, i)->ndim == 0 && st_get(f, i)->numel == 1);
  CHECK_EQ_INT(st_read_f32(f, i, 0, 1, got), 0);
  CHECK(got[0] == 42.0f);
  i = st_find(f, "empty \"q\"");
  CHECK(i >= 0 && st_get(f, i)->numel == 0 && st_get(f, i)->begin == st_get(f, i)->end);
  i = st_find(f, "half");
  CHECK_EQ_INT(st_read_f32(f, i, 0, 3, got), 0);
  CHECK(got[0] == 0.5f && got[1] == -3.0f && got[2] == st_bf16_to_f32(h[2]) && fabsf(got[2] - 1.0f / 3) < 2e-3f);
  i = st_find(f, "ints");
  CHECK_EQ_INT(st_read_f32(f, i, 0, 2, got), DPC_EUNSUPPORTED);
  int32_t ig[2];
  CHECK_EQ_INT(st_read_raw(f, i, ig), 0);
  CHECK(ig[0] == 5 && ig[1] == -6);
  CHECK_EQ_INT(st_find(f, "nope"), -1);
  /* The same bytes from a ranged source: equal tensors, one read per tensor range (a 16-bit
   * tensor included, widened in place), a failing source's error with the tensor named, a
   * source shorter than it said. */
  {
    FILE *rf = fopen(path, "rb");
    unsigned char raw[4096];
    size_t rn = fread(raw, 1, sizeof raw, rf);
    fclose(rf);
    CHECK(rn > 8 && rn < sizeof raw);
    mem_src m = {.b = raw, .len = rn};
    st_file *g;
    CHECK_EQ_INT(st_open_source("mem://model", rn, mem_read, &m, &g), 0);
    CHECK_EQ_INT(st_num_tensors(g), 5);
    CHECK(strcmp(st_metadata(g, "note"), "tab\there \"quoted\"") == 0);
    m.reads = 0;
    CHECK_EQ_INT(st_read_f32(g, st_find(g, "b.matrix"), 1, 5, got), 0);
    CHECK(memcmp(got, a + 1, 5 * sizeof *a) == 0 && m.reads == 1);
    m.reads = 0;
    CHECK_EQ_INT(st_read_f32(g, st_find(g, "half"), 1, 2, got), 0);
    CHECK(got[0] == -3.0f && got[1] == st_bf16_to_f32(h[2]) && m.reads == 1);
    m.fail_from = 9;
    CHECK_EQ_INT(st_read_f32(g, st_find(g, "b.matrix"), 0, 6, got), DPC_EUNAVAILABLE);
    CHECK(strstr(dpc_errmsg(), "b.matrix") && strstr(dpc_errmsg(), "store down"));
    st_close(g);
    m.fail_from = 0;
    CHECK_EQ_INT(st_open_source("mem://model", rn + 64, mem_read, &m, &g), DPC_EFORMAT); /* the tensors do not tile */
    m.len = 6;
    CHECK_EQ_INT(st_open_source("mem://short", rn, mem_read, &m, &g), DPC_EFORMAT);
    CHECK(strstr(dpc_errmsg(), "mem://short") && strstr(dpc_errmsg(), "truncated"));
    m.fail_from = 1;
    CHECK_EQ_INT(st_open_source("mem://down", rn, mem_read, &m, &g), DPC_EUNAVAILABLE);
  }
  /* A file truncated after opening gives an error, not a crash. */
  CHECK(truncate(path, 8 + 8) == 0);
  CHECK_EQ_INT(st_read_f32(f, st_find(f, "b.matrix"), 0, 6, got), DPC_EFORMAT);
  st_close(f);

  /* Determinism: the same tensors give byte-identical files; data starts 8-aligned. */
  char p2[300];
  snprintf(p2, sizeof p2, "%s/u.safetensors", dir);
  CHECK_EQ_INT(st_write(path, wt, 5, meta, 2), 0);
  CHECK_EQ_INT(st_write(p2, wt, 5, meta, 2), 0);
  CHECK(files_equal(path, p2));
  FILE *fp = fopen(path, "rb");
  unsigned char lb[8];
  CHECK(fread(lb, 1, 8, fp) == 8);
  fclose(fp);
  CHECK_EQ_INT(lb[0] % 8, 0);

  /* Writer argument checks. */
  st_write_tensor dup[] = {{"x", ST_F32, 0, {0}, &s}, {"x", ST_F32, 0, {0}, &s}};
  CHECK_EQ_INT(st_write(p2, dup, 2, NULL, 0), DPC_EINVAL);
  st_write_tensor badname[] = {{"__metadata__", ST_F32, 0, {0}, &s}};
  CHECK_EQ_INT(st_write(p2, badname, 1, NULL, 0), DPC_EINVAL);
  st_write_tensor negshape[] = {{"x", ST_F32, 1, {-1}, &s}};
  CHECK_EQ_INT(st_write(p2, negshape, 1, NULL, 0), DPC_EINVAL);

  /* Tensors listed out of offset order are fine as long as they tile the data. */
  write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
            0, 16);
  CHECK_EQ_INT(st_open(path, &f), 0);
  st_close(f);

  /* Hostile inputs. */
  const char *one = "\"dtype\":\"F32\",\"shape\":[2]";
  char hdr[512];
  FILE *tf = fopen(path, "wb");
  fwrite("abc", 1, 3, tf);
  fclose(tf);
  CHECK_EQ_INT(st_open(path, &f), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), path) && strstr(dpc_errmsg(), "truncated"));
  write_raw("{}", 1ull << 62, 0);
  CHECK_EQ_INT(st_open(path, &f), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), path) && strstr(dpc_errmsg(), "limit"));
  write_raw("{}", 1000, 0);
  CHECK_EQ_INT(st_open(path, &f), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), path) && strstr(dpc_errmsg(), "exceeds the file size"));
  CHECK(expect_fail("", 0, DPC_EFORMAT, "'{'"));
  CHECK(expect_fail("{\"a\":", 0, DPC_EFORMAT, "not valid JSON"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8, DPC_EFORMAT, "JSON"));
  CHECK(expect_fail("[1, 2]", 0, DPC_EFORMAT, "'{'"));
  CHECK(expect_fail("{} x", 0, DPC_EFORMAT, "trailing bytes after the JSON"));
  snprintf(hdr, sizeof hdr, "{\"a\":{%s,\"data_offsets\":[0,8]}}", one);
  CHECK(expect_fail(hdr, 4, DPC_EFORMAT, "reach past the data section"));
  CHECK(expect_fail(hdr, 12, DPC_EFORMAT, "trailing bytes"));
  snprintf(hdr, sizeof hdr, "{\"a\":{%s,\"data_offsets\":[0,8]},\"b\":{%s,\"data_offsets\":[4,12]}}", one, one);
  CHECK(expect_fail(hdr, 12, DPC_EFORMAT, "overlap"));
  snprintf(hdr, sizeof hdr, "{\"a\":{%s,\"data_offsets\":[0,8]},\"b\":{%s,\"data_offsets\":[12,20]}}", one, one);
  CHECK(expect_fail(hdr, 20, DPC_EFORMAT, "hole"));
  snprintf(hdr, sizeof hdr, "{\"a\":{%s,\"data_offsets\":[0,8]},\"a\":{%s,\"data_offsets\":[8,16]}}", one, one);
  CHECK(expect_fail(hdr, 16, DPC_EFORMAT, "twice"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, DPC_EFORMAT, "needs 12"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DPC_EFORMAT, "dtype"));
  CHECK(expect_fail("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DPC_EFORMAT, "dtype"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, DPC_EFORMAT, "shape[0]"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, DPC_EFORMAT, "shape[0]"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8, DPC_EFORMAT, "shape"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,4503599627370496],\"data_offsets\":[0,8]}}",
                    8, DPC_EFORMAT, "overflows"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, DPC_EFORMAT, "end before begin"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8, DPC_EFORMAT, "data_offsets"));
  CHECK(expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1e300]}}", 8, DPC_EFORMAT, "data_offsets"));
  CHECK(expect_fail("{\"a\":[1]}", 0, DPC_EFORMAT, "not a JSON object"));
  CHECK(expect_fail("{\"__metadata__\":{\"k\":1}}", 0, DPC_EFORMAT, "not a string"));
  CHECK(expect_fail("{\"__metadata__\":[]}", 0, DPC_EFORMAT, "__metadata__"));
  CHECK(expect_fail("{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DPC_EFORMAT, "empty"));
  /* A NUL byte inside the declared header. */
  write_raw("{}", 3, 0);
  tf = fopen(path, "r+b");
  fseek(tf, 10, SEEK_SET);
  fputc(0, tf);
  fclose(tf);
  CHECK_EQ_INT(st_open(path, &f), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "NUL"));
  /* Deeply nested JSON is rejected without blowing the stack. */
  char deep[4200] = "{\"a\":";
  for (int k = 0; k < 2000; k++) strcat(deep, "[");
  CHECK(expect_fail(deep, 0, DPC_EFORMAT, "JSON"));
  snprintf(p2, sizeof p2, "%s/absent.safetensors", dir);
  CHECK_EQ_INT(st_open(p2, &f), DPC_ENOENT);
  CHECK(strstr(dpc_errmsg(), p2) != NULL);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  TEST_DONE();
}
