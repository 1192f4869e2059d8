/* test_store_blobs.c — the blob store: round trip, names, streaming writer, and corruption
 * detection (flipped payload byte, flipped header byte, truncation, wrong magic, wrong
 * kind/length), plus an injected fsync failure that must leave the old blob intact, the
 * start-up sweep of temp files and orphaned blobs, and the sequential reader. */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "coordinator/blobs.h"
#include "tests/unit/test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void flip_byte(const char *path, long off) {
  int fd = open(path, O_RDWR);
  unsigned char b;
  CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
  b ^= 0x10;
  CHECK(pwrite(fd, &b, 1, off) == 1);
  close(fd);
}

static void copy_file(const char *from, const char *to) {
  void *buf;
  size_t n;
  CHECK_EQ_INT(dpc_read_file(from, 1 << 26, &buf, &n), 0);
  CHECK_EQ_INT(dpc_write_file_atomic(to, buf, n), 0);
  free(buf);
}

int main(void) {
  char dir[] = "/tmp/dpc_blobs_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  blob_store *bs;
  CHECK_EQ_INT(blob_store_open(dir, &bs), 0);

  /* Names. */
  char name[BLOB_NAME_MAX], name2[BLOB_NAME_MAX];
  blob_id id = {.job = 3, .fragment = 1, .version = 12, .aux = 0, .kind = BLOB_PARAMS};
  CHECK_EQ_INT(blob_name(&id, name, sizeof name), 0);
  CHECK(strcmp(name, "3/f1-v12.params") == 0);
  blob_id did = {.job = 3, .fragment = 1, .version = 4, .aux = 77, .kind = BLOB_DELTA};
  CHECK_EQ_INT(blob_name(&did, name2, sizeof name2), 0);
  CHECK(strcmp(name2, "3/f1-v4-a77.delta") == 0);
  blob_kind k;
  CHECK_EQ_INT(blob_kind_of_name(name2, &k), 0);
  CHECK_EQ_INT(k, BLOB_DELTA);
  blob_id bad = id;
  bad.version = -1;
  CHECK_EQ_INT(blob_name(&bad, name2, sizeof name2), DPC_EINVAL);
  bad = id;
  bad.kind = (blob_kind)99;
  CHECK_EQ_INT(blob_name(&bad, name2, sizeof name2), DPC_EINVAL);
  float tmp[4];
  CHECK_EQ_INT(blob_read(bs, "../etc/passwd.params", BLOB_PARAMS, tmp, 4, NULL), DPC_EINVAL);
  CHECK_EQ_INT(blob_read(bs, "/abs.params", BLOB_PARAMS, tmp, 4, NULL), DPC_EINVAL);
  CHECK_EQ_INT(blob_read(bs, "a/b/c.params", BLOB_PARAMS, tmp, 4, NULL), DPC_EINVAL);

  /* Round trip. */
  enum { N = 1000 };
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  for (int i = 0; i < N; i++) a[i] = (float)i * 0.25f - 7.0f;
  uint32_t crc = 0, crc2 = 0;
  CHECK_EQ_INT(blob_write(bs, name, BLOB_PARAMS, a, N, &crc), 0);
  CHECK_EQ_INT(crc, dpc_crc32c(0, a, N * sizeof *a)); /* the payload CRC is the wire checksum */
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, &crc2), 0);
  CHECK_EQ_INT(crc2, crc);
  CHECK(memcmp(a, b, N * sizeof *a) == 0);
  float *c = NULL;
  size_t n = 0;
  CHECK_EQ_INT(blob_read_alloc(bs, name, BLOB_PARAMS, &c, &n, NULL), 0);
  CHECK_EQ_INT(n, N);
  CHECK(c && memcmp(a, c, N * sizeof *a) == 0);
  free(c);
  char path[512], saved[600];
  CHECK_EQ_INT(blob_path(bs, name, path, sizeof path), 0);
  snprintf(saved, sizeof saved, "%s.saved", path);
  copy_file(path, saved);

  /* Wrong expectations are refused. */
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N - 1, NULL), DPC_ESHAPE);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_MOMENTUM, b, N, NULL), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "kind") != NULL);
  CHECK_EQ_INT(blob_read(bs, "3/f1-v99.params", BLOB_PARAMS, b, N, NULL), DPC_ENOENT);

  /* Flipped payload byte. */
  flip_byte(path, BLOB_HEADER_BYTES + 4 * 500 + 2);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), DPC_ECHECKSUM);
  CHECK(strstr(dpc_errmsg(), "payload checksum") != NULL);
  /* Flipped header byte (reserved field): the header CRC catches it. */
  copy_file(saved, path);
  flip_byte(path, 13);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), DPC_ECHECKSUM);
  CHECK(strstr(dpc_errmsg(), "header checksum") != NULL);
  /* Flipped trailer byte. */
  copy_file(saved, path);
  flip_byte(path, BLOB_HEADER_BYTES + 4 * N + 1);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), DPC_ECHECKSUM);
  /* Wrong magic. */
  copy_file(saved, path);
  flip_byte(path, 0);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "bad magic") != NULL);
  /* Truncated by one float, and to less than a header. */
  copy_file(saved, path);
  CHECK(truncate(path, BLOB_HEADER_BYTES + 4 * N + BLOB_TRAILER_BYTES - 4) == 0);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "truncated") != NULL);
  CHECK(truncate(path, 10) == 0);
  CHECK_EQ_INT(blob_read_alloc(bs, name, BLOB_PARAMS, &c, &n, NULL), DPC_EFORMAT);
  CHECK(c == NULL);
  /* Length field corrupted to a huge value: refused before any allocation. */
  copy_file(saved, path);
  {
    int fd = open(path, O_RDWR);
    uint64_t huge = (uint64_t)1 << 40;
    CHECK(fd >= 0 && pwrite(fd, &huge, 8, 16) == 8);
    close(fd);
  }
  CHECK_EQ_INT(blob_read_alloc(bs, name, BLOB_PARAMS, &c, &n, NULL), DPC_EFORMAT);
  copy_file(saved, path);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), 0);

  /* Streaming writer: chunks of odd sizes; short or long writes are refused. */
  blob_writer *w;
  CHECK_EQ_INT(blob_writer_open(bs, "3/f0-v1-a5.delta", BLOB_DELTA, N, &w), 0);
  const char *bytes = (const char *)a;
  CHECK_EQ_INT(blob_writer_append(w, bytes, 3), 0);
  CHECK_EQ_INT(blob_writer_append(w, bytes + 3, 1000), 0);
  CHECK_EQ_INT(blob_writer_append(w, bytes + 1003, 4 * N - 1003), 0);
  CHECK_EQ_INT(blob_writer_append(w, bytes, 1), DPC_ERANGE);
  CHECK_EQ_INT(blob_writer_commit(w, &crc2), 0);
  CHECK_EQ_INT(crc2, crc);
  CHECK_EQ_INT(blob_read(bs, "3/f0-v1-a5.delta", BLOB_DELTA, b, N, NULL), 0);
  CHECK(memcmp(a, b, N * sizeof *a) == 0);
  CHECK_EQ_INT(blob_writer_open(bs, "3/f0-v2-a5.delta", BLOB_DELTA, N, &w), 0);
  CHECK_EQ_INT(blob_writer_append(w, bytes, 8), 0);
  CHECK_EQ_INT(blob_writer_commit(w, NULL), DPC_ESHAPE);
  CHECK_EQ_INT(blob_read(bs, "3/f0-v2-a5.delta", BLOB_DELTA, b, N, NULL), DPC_ENOENT);

  /* A failing fsync leaves the previous blob of that name untouched and no new file. */
  float *z = calloc(N, sizeof *z);
  dpc_fsutil_inject_fault(DPC_FS_FAULT_FSYNC, EIO);
  CHECK_EQ_INT(blob_write(bs, name, BLOB_PARAMS, z, N, NULL), DPC_EIO);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), 0);
  CHECK(memcmp(a, b, N * sizeof *a) == 0);
  dpc_fsutil_inject_fault(DPC_FS_FAULT_WRITE, ENOSPC);
  CHECK_EQ_INT(blob_write(bs, "3/f2-v0.params", BLOB_PARAMS, z, N, NULL), DPC_EIO);
  CHECK_EQ_INT(blob_read(bs, "3/f2-v0.params", BLOB_PARAMS, b, N, NULL), DPC_ENOENT);

  /* Empty arrays are legal blobs. */
  CHECK_EQ_INT(blob_write(bs, "3/f9-v0.momentum", BLOB_MOMENTUM, NULL, 0, NULL), 0);
  CHECK_EQ_INT(blob_read(bs, "3/f9-v0.momentum", BLOB_MOMENTUM, b, 0, NULL), 0);

  /* Delete: durable, idempotent. */
  CHECK_EQ_INT(blob_delete(bs, name), 0);
  CHECK_EQ_INT(blob_read(bs, name, BLOB_PARAMS, b, N, NULL), DPC_ENOENT);
  CHECK_EQ_INT(blob_delete(bs, name), 0);

  /* Batch delete across two directories, with a missing name and a bad one in the batch. */
  CHECK_EQ_INT(blob_write(bs, "4/f1-v1-a7.delta", BLOB_DELTA, a, N, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "4/f1-v1-a8.delta", BLOB_DELTA, a, N, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "5/f1-v1-a9.delta", BLOB_DELTA, a, N, NULL), 0);
  char *batch[] = {"4/f1-v1-a7.delta", "4/f1-v1-a8.delta", "4/f1-v1-a99.delta", "5/f1-v1-a9.delta"};
  CHECK_EQ_INT(blob_delete_many(bs, batch, 4), 0);
  for (int i = 0; i < 4; i++) CHECK_EQ_INT(blob_read(bs, batch[i], BLOB_DELTA, b, N, NULL), DPC_ENOENT);
  char *hostile[] = {"../escape.delta"};
  CHECK(blob_delete_many(bs, hostile, 1) < 0);

  /* Start-up sweep: temp files go everywhere; in job 6 (which keep references) the params
   * and delta blobs nobody names go, inner-state blobs and named ones stay; job 7, which keep
   * does not mention, is left alone whatever it holds. */
  CHECK_EQ_INT(blob_write(bs, "6/f0-v1.params", BLOB_PARAMS, a, N, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "6/f0-v2.params", BLOB_PARAMS, a, N, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "6/f0-v1-a3.delta", BLOB_DELTA, a, N, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "6/f0-v1-a1.innerm", BLOB_INNER_M, a, N, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "7/f0-v0.params", BLOB_PARAMS, a, N, NULL), 0);
  char tmp1[600], tmp2[600];
  snprintf(tmp1, sizeof tmp1, "%s/blobs/6/f0-v3.params.tmp.123.0", dir);
  snprintf(tmp2, sizeof tmp2, "%s/blobs/7/f0-v1-a4.delta.tmp.9.1", dir);
  CHECK_EQ_INT(dpc_write_file_atomic(tmp1, "x", 1), 0);
  CHECK_EQ_INT(dpc_write_file_atomic(tmp2, "x", 1), 0);
  char *keep[] = {strdup("6/f0-v2.params"), strdup("5/f0-v0.params")};
  int temps = -1, orphans = -1;
  CHECK_EQ_INT(blob_store_sweep(bs, keep, 2, &temps, &orphans), 0);
  CHECK_EQ_INT(temps, 2);
  CHECK_EQ_INT(orphans, 2);
  CHECK(access(tmp1, F_OK) != 0 && access(tmp2, F_OK) != 0);
  CHECK_EQ_INT(blob_read(bs, "6/f0-v1.params", BLOB_PARAMS, b, N, NULL), DPC_ENOENT);
  CHECK_EQ_INT(blob_read(bs, "6/f0-v1-a3.delta", BLOB_DELTA, b, N, NULL), DPC_ENOENT);
  CHECK_EQ_INT(blob_read(bs, "6/f0-v2.params", BLOB_PARAMS, b, N, NULL), 0);
  CHECK_EQ_INT(blob_read(bs, "6/f0-v1-a1.innerm", BLOB_INNER_M, b, N, NULL), 0);
  CHECK_EQ_INT(blob_read(bs, "7/f0-v0.params", BLOB_PARAMS, b, N, NULL), 0);
  /* Without a keep list only temp files go. */
  CHECK_EQ_INT(blob_store_sweep(bs, NULL, 0, &temps, &orphans), 0);
  CHECK_EQ_INT(temps + orphans, 0);
  free(keep[0]);
  free(keep[1]);

  /* Sequential reader: views of several sizes give the payload in order (each valid until the
   * next), close checks the checksum; reading past the payload, closing early and a file cut
   * short under an open reader are refused. */
  {
    uint32_t wcrc = 0, rcrc = 0;
    CHECK_EQ_INT(blob_write(bs, "8/f0-v0.params", BLOB_PARAMS, a, N, &wcrc), 0);
    blob_reader *r;
    CHECK_EQ_INT(blob_reader_open(bs, "8/f0-v0.params", BLOB_PARAMS, N, &r), 0);
    const size_t pieces[] = {3, 100, 1, 500};
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
      const void *v = NULL;
      CHECK_EQ_INT(blob_reader_view(r, pieces[i] * sizeof(float), &v), 0);
      CHECK(v != NULL && memcmp(v, a + at, pieces[i] * sizeof(float)) == 0);
      at += pieces[i];
    }
    CHECK_EQ_INT(blob_reader_read(r, b, (N - at) * sizeof(float)), 0);
    CHECK(memcmp(b, a + at, (N - at) * sizeof(float)) == 0);
    const void *v;
    CHECK_EQ_INT(blob_reader_view(r, sizeof(float), &v), DPC_ERANGE);
    CHECK_EQ_INT(blob_reader_close(r, &rcrc), 0);
    CHECK_EQ_INT(rcrc, wcrc);
    CHECK_EQ_INT(blob_reader_open(bs, "8/f0-v0.params", BLOB_PARAMS, N, &r), 0);
    CHECK_EQ_INT(blob_reader_view(r, 10 * sizeof(float), &v), 0);
    CHECK_EQ_INT(blob_reader_close(r, NULL), DPC_ESHAPE);
    CHECK_EQ_INT(blob_reader_open(bs, "8/f0-v0.params", BLOB_PARAMS, N, &r), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/blobs/8/f0-v0.params", dir);
    CHECK(truncate(path, 2000) == 0);
    CHECK_EQ_INT(blob_reader_read(r, b, N * sizeof(float)), DPC_EFORMAT);
    blob_reader_abort(r);
  }

  blob_store_close(bs);
  free(a);
  free(b);
  free(z);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  TEST_DONE();
}
