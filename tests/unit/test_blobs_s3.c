/* test_blobs_s3.c — the blob store on S3 (blob_store_open_s3, coordinator/blobs_s3.h) against a
 * real RADOS Gateway (run under tests/s3/with_rgw.sh): blobs round-trip through every read path
 * (whole, allocating, sequential reader, mapping), a blob larger than one part goes up as a
 * multipart upload (in larger parts where the store allows too few; refused when even those cannot hold it), an aborted writer leaves nothing, damaged objects (a flipped byte, a short
 * object, another kind) are refused with the same errors as damaged files, and the start-up sweep
 * removes unrecorded objects and unfinished uploads but keeps recorded blobs and inner state;
 * after it, inner state's existence is answered without a request. A worker's whole-object read
 * through a URL (storeget_blob) checks the header and both checksums.
 * With the memory cache on (blob_store_set_cache): what the store wrote, and a delta read with
 * blob_reader_keep and verified, are read again without the store (they survive the object's
 * loss), a read without keep leaves nothing, a delta that failed its checksum is not kept,
 * inner state is never kept, and deleting a blob drops its copy; a blob written with
 * BLOB_WRITE_LATER reaches the store only at its commit (without room in the cache, as it
 * comes). A worker's reads through
 * presigned URLs (worker/storeget.h), whole, ranged, streamed and in parallel pieces, fail with clear codes on an
 * altered URL, a missing object, a refused piece and a server that never answers; a delta
 * object put in parts over several streams at once completes, or fails on a spoilt part. An
 * object beyond one copy is copied part by part, each part's MD5 checked. */
#include "common/errors.h"
#include "coordinator/blobs.h"
#include "coordinator/blobs_s3.h"
#include "coordinator/s3.h"
#include "tests/unit/test.h"
#include "worker/storeget.h"
#include "worker/storeput.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static s3_options opts(void) {
  return (s3_options){.url = "s3://dpc-blobs/state", .endpoint = getenv("S3_ENDPOINT"), .timeout_ms = 10000};
}

/* Bytes of object `name` (under the store's prefix) into a malloc'd buffer. */
static unsigned char *fetch(s3_client *c, const char *name, uint64_t *size) {
  if (s3_head(c, name, size, NULL, 0) < 0) return NULL;
  unsigned char *b = malloc(*size);
  if (b && s3_get_range(c, name, 0, b, *size) < 0) {
    free(b);
    return NULL;
  }
  return b;
}

static int count_uploads(void *ud, const char *key, const char *id) {
  (void)key;
  (void)id;
  (*(int *)ud)++;
  return 0;
}

static void round_trip(blob_store *bs) {
  const size_t n = 1000;
  float *x = malloc(n * sizeof *x), *y = calloc(n, sizeof *y);
  for (size_t i = 0; i < n; i++) x[i] = (float)i * 0.25f - 7.0f;
  uint32_t crc = 0, crc2 = 0;
  CHECK_EQ_INT(blob_write(bs, "1/f0-v0.params", BLOB_PARAMS, x, n, &crc), 0);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v0.params", BLOB_PARAMS, y, n, &crc2), 0);
  CHECK(memcmp(x, y, n * sizeof *x) == 0 && crc == crc2);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v0.params", BLOB_PARAMS, y, n - 1, NULL), DPC_ESHAPE);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v0.params", BLOB_MOMENTUM, y, n, NULL), DPC_EFORMAT);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v9.params", BLOB_PARAMS, y, n, NULL), DPC_ENOENT);
  float *z = NULL;
  size_t got = 0;
  CHECK_EQ_INT(blob_read_alloc(bs, "1/f0-v0.params", BLOB_PARAMS, &z, &got, NULL), 0);
  CHECK(got == n && z && memcmp(x, z, n * sizeof *x) == 0);
  free(z);
  blob_reader *r = NULL;
  const void *view;
  CHECK_EQ_INT(blob_reader_open(bs, "1/f0-v0.params", BLOB_PARAMS, n, &r), 0);
  if (r) {
    CHECK_EQ_INT(blob_reader_view(r, 400 * sizeof(float), &view), 0);
    CHECK(memcmp(view, x, 400 * sizeof(float)) == 0);
    CHECK_EQ_INT(blob_reader_read(r, y, 600 * sizeof(float)), 0);
    CHECK(memcmp(y, x + 400, 600 * sizeof(float)) == 0);
    CHECK_EQ_INT(blob_reader_close(r, &crc2), 0);
    CHECK(crc2 == crc);
  }
  const float *data;
  void *map;
  size_t map_len;
  CHECK_EQ_INT(blob_map(bs, "1/f0-v0.params", BLOB_PARAMS, n, 0, &data, &map, &map_len, &crc2), 0);
  CHECK(crc2 == crc && memcmp(data, x, n * sizeof *x) == 0);
  blob_unmap(map, map_len);
  CHECK_EQ_INT(blob_delete(bs, "1/f0-v0.params"), 0);
  CHECK_EQ_INT(blob_delete(bs, "1/f0-v0.params"), 0);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v0.params", BLOB_PARAMS, y, n, NULL), DPC_ENOENT);
  free(x);
  free(y);
}

/* A worker's read through a lease's presigned URL (worker/storeget.h): the payload of a blob,
 * refused when the URL is altered or names nothing. */
static void presigned_reads(blob_store *bs) {
  float x[300], y[300];
  for (int i = 0; i < 300; i++) x[i] = (float)i / 7.0f;
  CHECK_EQ_INT(blob_write(bs, "6/f0-v4.params", BLOB_PARAMS, x, 300, NULL), 0);
  char url[S3_URL_MAX];
  CHECK_EQ_INT(blob_store_url(bs, "6/f0-v4.params", 1200, url, sizeof url), 0);
  CHECK(strstr(url, "X-Amz-Expires=900&") != NULL); /* a small object: the base life */
  memset(y, 0, sizeof y);
  CHECK_EQ_INT(storeget_range(url, BLOB_HEADER_BYTES, y, sizeof y, 10000), 0);
  CHECK(memcmp(x, y, sizeof x) == 0);
  CHECK_EQ_INT(storeget_range(url, BLOB_HEADER_BYTES + 100 * 4, y, 50 * 4, 10000), 0);
  CHECK(memcmp(x + 100, y, 50 * 4) == 0);
  size_t n = strlen(url);
  url[n - 1] = url[n - 1] == '0' ? '1' : '0';
  CHECK_EQ_INT(storeget_range(url, BLOB_HEADER_BYTES, y, sizeof y, 10000), DPC_EPERM);
  CHECK_EQ_INT(blob_store_url(bs, "6/f0-v5.params", 0, url, sizeof url), 0);
  CHECK_EQ_INT(storeget_range(url, BLOB_HEADER_BYTES, y, sizeof y, 10000), DPC_ENOENT);
  CHECK_EQ_INT(storeget_range("http://127.0.0.1:1/x", 0, y, 4, 2000), DPC_EUNAVAILABLE);
  /* A URL lives long enough for what its holder moves before it is used, at BLOB_URL_MIN_RATE
   * (a 28 GB delta over a slow link), within SigV4's 7 days; the store takes such a URL. */
  CHECK_EQ_INT(blob_url_ttl_s(0), 900);
  CHECK_EQ_INT(blob_url_ttl_s(28000000000ull), 28900);
  CHECK_EQ_INT(blob_url_ttl_s((uint64_t)1 << 40), 604800);
  CHECK_EQ_INT(blob_store_url(bs, "6/f0-v4.params", (uint64_t)1 << 40, url, sizeof url), 0);
  CHECK(strstr(url, "X-Amz-Expires=604800&") != NULL);
  CHECK_EQ_INT(storeget_range(url, BLOB_HEADER_BYTES, y, sizeof y, 10000), 0);
  CHECK(memcmp(x, y, sizeof x) == 0);
  unsigned char md5[16] = {0};
  CHECK_EQ_INT(blob_store_put_url(bs, "6/f0-v7.params", md5, 28000000000ull, url, sizeof url), 0);
  CHECK(strstr(url, "X-Amz-Expires=28900&") != NULL);
}

/* storeget_stream's sink: the pieces must come in order and end to end; stop_after > 0 refuses
 * the piece after that many bytes. */
typedef struct {
  unsigned char *dst;
  uint64_t next, stop_after;
  int pieces;
} stream_sink;

static int stream_take(void *ud, uint64_t at, const void *p, size_t n) {
  stream_sink *k = ud;
  if (at != k->next) return DPC_EFORMAT;
  if (k->stop_after && at >= k->stop_after) return DPC_ESTATE;
  memcpy(k->dst + at, p, n);
  k->next = at + n;
  k->pieces++;
  return 0;
}

/* A streamed read of the same bytes over one connection; the sink's refusal ends it with the
 * sink's code; a server that accepts and never answers fails on the stall limit, not hanging. */
static void streamed_reads(blob_store *bs) {
  const size_t n = (size_t)3 << 20; /* several pieces from curl */
  float *x = malloc(n * sizeof *x), *y = calloc(n, sizeof *y);
  CHECK(x && y);
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 1013) * 0.5f;
  CHECK_EQ_INT(blob_write(bs, "6/f0-v6.params", BLOB_PARAMS, x, n, NULL), 0);
  char url[S3_URL_MAX];
  CHECK_EQ_INT(blob_store_url(bs, "6/f0-v6.params", 0, url, sizeof url), 0);
  stream_sink k = {.dst = (unsigned char *)y};
  CHECK_EQ_INT(storeget_stream(url, BLOB_HEADER_BYTES, n * 4, stream_take, &k, 10000), 0);
  CHECK(k.next == n * 4 && k.pieces > 1);
  CHECK(memcmp(x, y, n * 4) == 0);
  memset(y, 0, n * 4); /* in three pieces at once, and one piece when the pieces would be small */
  CHECK_EQ_INT(storeget_parallel(url, BLOB_HEADER_BYTES, y, n * 4, 3, (size_t)1 << 20, 10000), 0);
  CHECK(memcmp(x, y, n * 4) == 0);
  memset(y, 0, n * 4);
  CHECK_EQ_INT(storeget_parallel(url, BLOB_HEADER_BYTES, y, n * 4, 3, STOREGET_PIECE_MIN, 10000), 0);
  CHECK(memcmp(x, y, n * 4) == 0);
  char bad[S3_URL_MAX];
  snprintf(bad, sizeof bad, "%s", url);
  bad[strlen(bad) - 1] = bad[strlen(bad) - 1] == '0' ? '1' : '0';
  CHECK_EQ_INT(storeget_parallel(bad, BLOB_HEADER_BYTES, y, n * 4, 3, (size_t)1 << 20, 10000), DPC_EPERM);
  stream_sink stop = {.dst = (unsigned char *)y, .stop_after = 1};
  CHECK_EQ_INT(storeget_stream(url, BLOB_HEADER_BYTES, n * 4, stream_take, &stop, 10000), DPC_ESTATE);
  CHECK(stop.pieces == 1);
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  CHECK(ls >= 0 && bind(ls, (struct sockaddr *)&a, sizeof a) == 0 && listen(ls, 4) == 0 &&
        getsockname(ls, (struct sockaddr *)&a, &al) == 0);
  char silent[64];
  snprintf(silent, sizeof silent, "http://127.0.0.1:%d/x", ntohs(a.sin_port));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK_EQ_INT(storeget_range(silent, 0, y, 4, 1500), DPC_EUNAVAILABLE);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  CHECK(took >= 0.9 && took < 10);
  close(ls);
  free(x);
  free(y);
}

/* A worker's delta object in parts (worker/storeput.h) over three streams at once: the object
 * the coordinator completes reads back as the delta, its ETag S3's multipart one; one part's
 * URL altered fails the put with that part's 403 and the upload is aborted. */
static void parallel_part_puts(blob_store *bs) {
  const uint64_t pb = (uint64_t)5 << 20, nf = (3 * pb + 4096) / 4; /* four parts, the last short */
  float *d = malloc(nf * sizeof *d), *back = malloc(nf * sizeof *back);
  CHECK(d && back);
  for (uint64_t i = 0; i < nf; i++) d[i] = (float)(i % 977) * 1e-4f;
  storeput_object o;
  storeput_make(&o, d, nf);
  const int parts = storeput_parts(&o, pb);
  CHECK_EQ_INT(parts, 4);
  unsigned char md5[4][16];
  CHECK_EQ_INT(storeput_digest(&o, pb, md5), 0);
  for (int pass = 0; pass < 2; pass++) {
    const char *name = pass ? "7/f0-v1-a3.delta" : "7/f0-v1-a2.delta";
    char id[512], *urls[4];
    CHECK_EQ_INT(blob_store_upload_begin(bs, name, id, sizeof id), 0);
    for (int k = 0; k < parts; k++) {
      urls[k] = malloc(S3_URL_MAX);
      CHECK_EQ_INT(blob_store_part_url(bs, name, id, k + 1, md5[k], 0, urls[k], S3_URL_MAX), 0);
    }
    if (pass) { /* the third part's signature spoilt */
      size_t n = strlen(urls[2]);
      urls[2][n - 1] = urls[2][n - 1] == '0' ? '1' : '0';
      CHECK_EQ_INT(storeput_put_parts(urls, &o, pb, parts, (const unsigned char (*)[16])md5, 3, 10000), DPC_EPERM);
      CHECK(strstr(dpc_errmsg(), "403") != NULL);
      CHECK_EQ_INT(blob_store_upload_abort(bs, name, id), 0);
    } else {
      CHECK_EQ_INT(storeput_put_parts(urls, &o, pb, parts, (const unsigned char (*)[16])md5, 3, 10000), 0);
      CHECK_EQ_INT(blob_store_upload_complete(bs, name, id, parts, (const unsigned char (*)[16])md5), 0);
      char etag[80], want[80];
      blob_put_etag((const unsigned char (*)[16])md5, parts, want);
      /* settled again (a repeated commit): the completion finds no upload, the HEAD decides */
      CHECK_EQ_INT(blob_store_settle_put(bs, name, storeput_bytes(&o), NULL, id, parts,
                                         (const unsigned char (*)[16])md5, etag), 0);
      CHECK(strcmp(etag, want) == 0);
      uint32_t crc = 0;
      CHECK_EQ_INT(blob_read(bs, name, BLOB_DELTA, back, nf, &crc), 0);
      CHECK(memcmp(d, back, nf * sizeof *d) == 0 && crc == o.crc);
    }
    for (int k = 0; k < parts; k++) free(urls[k]);
  }
  free(d);
  free(back);
}

/* Blob `name` (n floats of kind) maps back as x with checksum crc. */
static void maps_back(blob_store *bs, const char *name, blob_kind kind, const float *x, size_t n, uint32_t crc) {
  const float *data;
  void *map;
  size_t map_len;
  uint32_t crc2 = 0;
  CHECK_EQ_INT(blob_map(bs, name, kind, n, 1, &data, &map, &map_len, &crc2), 0);
  CHECK(crc2 == crc && memcmp(data, x, n * sizeof *x) == 0);
  blob_unmap(map, map_len);
}

static void multipart(blob_store *bs, s3_client *c) {
  const size_t n = (BLOB_S3_PART_BYTES / 4) * 2 + 12345; /* three parts */
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 9973) - 100.0f;
  blob_writer *w = NULL;
  CHECK_EQ_INT(blob_writer_open(bs, "2/f1-v3.momentum", BLOB_MOMENTUM, n, &w), 0);
  uint32_t crc = 0;
  for (size_t at = 0; w && at < n; at += 1000003) /* odd-sized appends cross part boundaries */
    CHECK_EQ_INT(blob_writer_append(w, x + at, (n - at < 1000003 ? n - at : 1000003) * sizeof *x), 0);
  if (w) CHECK_EQ_INT(blob_writer_commit(w, &crc), 0);
  maps_back(bs, "2/f1-v3.momentum", BLOB_MOMENTUM, x, n, crc);
  /* Read range by range (each read fetches the next range ahead), then with a size the
   * read-ahead did not guess, then in views: the same bytes, the same checksum. */
  blob_reader *r = NULL;
  CHECK_EQ_INT(blob_reader_open(bs, "2/f1-v3.momentum", BLOB_MOMENTUM, n, &r), 0);
  float *y = calloc(n, sizeof *y);
  size_t at = 0, step = 1 << 20;
  for (int k = 0; r && k < 3; k++, at += step) CHECK_EQ_INT(blob_reader_read(r, y + at, step * sizeof *y), 0);
  if (r) CHECK_EQ_INT(blob_reader_read(r, y + at, 777 * sizeof *y), 0);
  at += 777;
  while (r && at < n) {
    size_t m = n - at < step ? n - at : step;
    const void *v;
    CHECK_EQ_INT(blob_reader_view(r, m * sizeof *y, &v), 0);
    memcpy(y + at, v, m * sizeof *y);
    at += m;
  }
  uint32_t crc3 = 0;
  if (r) CHECK_EQ_INT(blob_reader_close(r, &crc3), 0);
  CHECK(crc3 == crc && memcmp(y, x, n * sizeof *x) == 0);
  /* A reader closed early, with a range in flight, frees it (ASan and the leak checker). */
  CHECK_EQ_INT(blob_reader_open(bs, "2/f1-v3.momentum", BLOB_MOMENTUM, n, &r), 0);
  if (r) CHECK_EQ_INT(blob_reader_read(r, y, step * sizeof *y), 0);
  blob_reader_abort(r);
  free(y);
  /* A writer abandoned after its first part leaves neither an object nor an upload. */
  CHECK_EQ_INT(blob_writer_open(bs, "2/f1-v4.momentum", BLOB_MOMENTUM, n, &w), 0);
  if (w) CHECK_EQ_INT(blob_writer_append(w, x, BLOB_S3_PART_BYTES + 4), 0);
  blob_writer_abort(w);
  uint64_t size;
  CHECK_EQ_INT(s3_head(c, "2/f1-v4.momentum", &size, NULL, 0), DPC_ENOENT);
  int uploads = 0;
  CHECK_EQ_INT(s3_mpu_list(c, count_uploads, &uploads), 0);
  CHECK_EQ_INT(uploads, 0);
  /* A writer that gets fewer bytes than it declared does not commit. */
  CHECK_EQ_INT(blob_writer_open(bs, "2/f1-v5.momentum", BLOB_MOMENTUM, 10, &w), 0);
  if (w) CHECK_EQ_INT(blob_writer_append(w, x, 9 * sizeof *x), 0);
  if (w) CHECK_EQ_INT(blob_writer_commit(w, NULL), DPC_ESHAPE);
  CHECK_EQ_INT(s3_head(c, "2/f1-v5.momentum", &size, NULL, 0), DPC_ENOENT);
  free(x);
}

/* A store that allows two parts to an upload: a blob of more than two 16 MiB parts goes up in
 * two larger ones (its ETag says how many) and reads back whole. */
static void few_parts(void) {
  s3_options o = opts();
  o.url = "s3://dpc-blobs/few";
  o.max_parts = 2;
  blob_store *bs = NULL;
  CHECK_EQ_INT(blob_store_open_s3(&o, &bs), 0);
  if (!bs) return;
  const size_t n = (BLOB_S3_PART_BYTES / 4) * 2 + 4096;
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 7919) * 0.5f;
  uint32_t crc = 0;
  CHECK_EQ_INT(blob_write(bs, "5/f0-v1.params", BLOB_PARAMS, x, n, &crc), 0);
  s3_options co = opts();
  co.url = "s3://dpc-blobs/few";
  s3_client *fc = NULL;
  CHECK_EQ_INT(s3_open(&fc, &co), 0);
  uint64_t size = 0;
  char etag[80] = "";
  if (fc) CHECK_EQ_INT(s3_head(fc, "5/f0-v1.params", &size, etag, sizeof etag), 0);
  CHECK(strlen(etag) > 2 && !strcmp(etag + strlen(etag) - 2, "-2"));
  maps_back(bs, "5/f0-v1.params", BLOB_PARAMS, x, n, crc);
  /* Beyond two parts of S3's largest (5 GiB) the object cannot be made at all: refused as the
   * writer opens, before anything is sent. */
  blob_writer *w = NULL;
  CHECK_EQ_INT(blob_writer_open(bs, "5/f0-v2.params", BLOB_PARAMS, (size_t)3 << 30, &w), DPC_EINVAL);
  CHECK(w == NULL && strstr(dpc_errmsg(), "2 parts of at most 5 GiB") != NULL);
  s3_close(fc);
  blob_store_close(bs);
  free(x);
}

/* Put bytes d[0, n) as `name` in parts of pb (its parts' MD5s to md5, its ETag to etag). */
static void put_parts(s3_client *c, const char *name, const unsigned char *d, uint64_t n, uint64_t pb,
                      unsigned char (*md5)[16], char etag[80]) {
  char id[512], et[4][80];
  const int parts = (int)((n + pb - 1) / pb);
  CHECK(parts <= 4);
  if (parts > 4) return;
  CHECK_EQ_INT(s3_mpu_create(c, name, id, sizeof id), 0);
  for (int i = 0; i < parts; i++) {
    const uint64_t off = (uint64_t)i * pb, len = n - off < pb ? n - off : pb;
    CHECK_EQ_INT(s3_mpu_put_part(c, name, id, i + 1, d + off, len, et[i], sizeof et[i]), 0);
    for (int k = 0; k < 16; k++) sscanf(et[i] + 2 * k, "%2hhx", &md5[i][k]);
  }
  CHECK_EQ_INT(s3_mpu_complete(c, name, id, parts, et), 0);
  uint64_t size = 0;
  CHECK_EQ_INT(s3_head(c, name, &size, etag, 80), 0);
}

/* A store whose one copy holds 5 MiB (S3's holds 5 GiB) copies a larger object part by part
 * along the parts it was put in: the copy holds its bytes and is known to exist. An object
 * rewritten after its check is never copied (each part's MD5 is checked: the gateway ignores
 * the ETag condition on a part copy) and leaves no upload; an object not put in parts is refused. */
static void copies_in_parts(s3_client *c) {
  s3_options o = opts();
  o.copy_max = (uint64_t)5 << 20;
  blob_store *bs = NULL;
  CHECK_EQ_INT(blob_store_open_s3(&o, &bs), 0);
  if (!bs) return;
  const uint64_t pb = (uint64_t)5 << 20, n = 2 * pb + 1000;
  unsigned char *d = malloc(n), md5[3][16], md5b[3][16];
  for (uint64_t i = 0; i < n; i++) d[i] = (unsigned char)(i * 7 + (i >> 11));
  char etag[80], etag2[80];
  put_parts(c, "8/f0-v1-a2-t5.innerm", d, n, pb, md5, etag);
  CHECK_EQ_INT(blob_store_copy(bs, "8/f0-v1-a2-t5.innerm", "8/f0-v1-a2.innerm", etag, n, pb, 3,
                               (const unsigned char(*)[16])md5), 0);
  uint64_t size = 0;
  unsigned char *back = fetch(c, "8/f0-v1-a2.innerm", &size);
  CHECK(back && size == n && memcmp(back, d, n) == 0);
  free(back);
  CHECK(blob_exists(bs, "8/f0-v1-a2.innerm"));
  /* Rewritten (its last part) after the commit's check: the copy fails on that part. */
  d[n - 1] ^= 0x5a;
  put_parts(c, "8/f0-v1-a2-t5.innerm", d, n, pb, md5b, etag2);
  CHECK_EQ_INT(blob_store_copy(bs, "8/f0-v1-a2-t5.innerm", "8/f0-v2-a2.innerm", etag, n, pb, 3,
                               (const unsigned char(*)[16])md5), DPC_ECHECKSUM);
  CHECK(strstr(dpc_errmsg(), "part 3") != NULL);
  CHECK_EQ_INT(s3_head(c, "8/f0-v2-a2.innerm", &size, NULL, 0), DPC_ENOENT);
  int open = 0;
  CHECK_EQ_INT(s3_mpu_list(c, count_uploads, &open), 0);
  CHECK_EQ_INT(open, 0);
  /* Beyond one copy and not in parts: refused before any request. */
  CHECK_EQ_INT(blob_store_copy(bs, "8/f0-v1-a2-t5.innerm", "8/f0-v3-a2.innerm", NULL, n, 0, 0, NULL), DPC_EINVAL);
  CHECK_EQ_INT(s3_delete(c, "8/f0-v1-a2-t5.innerm"), 0);
  CHECK_EQ_INT(blob_delete(bs, "8/f0-v1-a2.innerm"), 0);
  blob_store_close(bs);
  free(d);
}

static void damaged(blob_store *bs, s3_client *c) {
  float x[64] = {1, 2, 3};
  CHECK_EQ_INT(blob_write(bs, "3/f0-v1.params", BLOB_PARAMS, x, 64, NULL), 0);
  uint64_t size = 0;
  unsigned char *b = fetch(c, "3/f0-v1.params", &size);
  CHECK(b != NULL && size == BLOB_HEADER_BYTES + 64 * 4 + BLOB_TRAILER_BYTES);
  if (!b) return;
  b[BLOB_HEADER_BYTES + 5] ^= 0x10; /* a payload bit flipped behind the store's back */
  CHECK_EQ_INT(s3_put(c, "3/f0-v1.params", b, size), 0);
  float y[64];
  CHECK_EQ_INT(blob_read(bs, "3/f0-v1.params", BLOB_PARAMS, y, 64, NULL), DPC_ECHECKSUM);
  const float *data;
  void *map;
  size_t map_len;
  CHECK_EQ_INT(blob_map(bs, "3/f0-v1.params", BLOB_PARAMS, 64, 0, &data, &map, &map_len, NULL), DPC_ECHECKSUM);
  blob_reader *r = NULL;
  CHECK_EQ_INT(blob_reader_open(bs, "3/f0-v1.params", BLOB_PARAMS, 64, &r), 0);
  if (r) {
    CHECK_EQ_INT(blob_reader_read(r, y, sizeof y), 0);
    CHECK_EQ_INT(blob_reader_close(r, NULL), DPC_ECHECKSUM);
  }
  CHECK_EQ_INT(s3_put(c, "3/f0-v1.params", b, size - 4), 0); /* truncated */
  CHECK_EQ_INT(blob_read(bs, "3/f0-v1.params", BLOB_PARAMS, y, 64, NULL), DPC_EFORMAT);
  CHECK_EQ_INT(s3_put(c, "3/f0-v1.params", "not a blob at all, just text", 28), 0);
  CHECK_EQ_INT(blob_read(bs, "3/f0-v1.params", BLOB_PARAMS, y, 64, NULL), DPC_EFORMAT);
  free(b);
}

/* A worker's read of a whole blob object through its URL (storeget_blob: inner-state
 * checkpoints): the floats asked for land in dst and nothing past them, M's two extra floats
 * (the AdamW step) in extra; another kind or length, a flipped payload bit, a cut object and a
 * request for more than two extra floats are refused. */
static void blob_objects(blob_store *bs, s3_client *c) {
  enum { N = 100 };
  float x[N + 2], y[N + 1];
  for (int i = 0; i < N; i++) x[i] = (float)i * 0.25f - 3.0f;
  const uint64_t step = 0x0000000500000007ull;
  memcpy(x + N, &step, 8);
  CHECK_EQ_INT(blob_write(bs, "8/f0-v2-a3.inner_m", BLOB_INNER_M, x, N + 2, NULL), 0);
  char url[S3_URL_MAX];
  CHECK_EQ_INT(blob_store_url(bs, "8/f0-v2-a3.inner_m", 0, url, sizeof url), 0);
  unsigned char extra[8] = {0};
  y[N] = 42.0f;
  CHECK_EQ_INT(storeget_blob(url, "m", BLOB_INNER_M, N + 2, y, N, extra, 10000), 0);
  CHECK(memcmp(x, y, N * sizeof(float)) == 0 && y[N] == 42.0f && memcmp(extra, &step, 8) == 0);
  CHECK_EQ_INT(storeget_blob(url, "m", BLOB_INNER_V, N + 2, y, N, extra, 10000), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "kind 6") != NULL);
  CHECK_EQ_INT(storeget_blob(url, "m", BLOB_INNER_M, N, y, N, NULL, 10000), DPC_EFORMAT);
  CHECK_EQ_INT(storeget_blob(url, "m", BLOB_INNER_M, N + 3, y, N, extra, 10000), DPC_EINVAL);
  uint64_t size = 0;
  unsigned char *b = fetch(c, "8/f0-v2-a3.inner_m", &size);
  CHECK(b != NULL && size == BLOB_HEADER_BYTES + (N + 2) * 4 + BLOB_TRAILER_BYTES);
  if (!b) return;
  b[BLOB_HEADER_BYTES + 9] ^= 0x04; /* damaged behind the store's back */
  CHECK_EQ_INT(s3_put(c, "8/f0-v2-a3.inner_m", b, size), 0);
  CHECK_EQ_INT(storeget_blob(url, "m", BLOB_INNER_M, N + 2, y, N, extra, 10000), DPC_ECHECKSUM);
  CHECK_EQ_INT(s3_put(c, "8/f0-v2-a3.inner_m", b, size - 8), 0); /* cut */
  CHECK_EQ_INT(storeget_blob(url, "m", BLOB_INNER_M, N + 2, y, N, extra, 10000), DPC_EFORMAT);
  free(b);
}

/* Read blob name (n floats of kind) whole through a sequential reader into y, asking it to keep
 * a copy in the cache as a commit's check does; its close's code. */
static int read_whole(blob_store *bs, const char *name, blob_kind kind, float *y, size_t n) {
  blob_reader *r = NULL;
  int rc = blob_reader_open(bs, name, kind, n, &r);
  if (rc) return rc;
  blob_reader_keep(r);
  const void *v;
  if ((rc = blob_reader_view(r, n / 2 * sizeof(float), &v)) == 0) {
    memcpy(y, v, n / 2 * sizeof(float));
    rc = blob_reader_read(r, y + n / 2, (n - n / 2) * sizeof(float));
  }
  if (rc) {
    blob_reader_abort(r);
    return rc;
  }
  return blob_reader_close(r, NULL);
}

static void cached(blob_store *bs, s3_client *c) {
  enum { N = 256 };
  float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = (float)i / 3.0f;
  blobs_cache_stats st;
  CHECK_EQ_INT(blob_store_set_cache(bs, 1 << 20), 0);
  /* Written by the store: read again from memory, even once the object is gone. */
  uint32_t crc = 0, crc2 = 0;
  CHECK_EQ_INT(blob_write(bs, "7/f0-v1.params", BLOB_PARAMS, x, N, &crc), 0);
  CHECK_EQ_INT(s3_delete(c, "7/f0-v1.params"), 0);
  blob_reader *r = NULL;
  CHECK_EQ_INT(blob_reader_open(bs, "7/f0-v1.params", BLOB_PARAMS, N, &r), 0);
  if (r) {
    CHECK_EQ_INT(blob_reader_read(r, y, sizeof y), 0);
    CHECK_EQ_INT(blob_reader_close(r, &crc2), 0);
    CHECK(memcmp(x, y, sizeof x) == 0 && crc == crc2);
  }
  blob_store_cache_stats(bs, &st);
  CHECK(st.hit_bytes == sizeof x && st.resident == sizeof x);
  CHECK_EQ_INT(blob_reader_open(bs, "7/f0-v1.params", BLOB_PARAMS, N - 1, &r), DPC_ENOENT); /* not the cached shape */
  /* A delta read and verified once is kept; a corrupt one is refused and not kept. */
  CHECK_EQ_INT(blob_write(bs, "7/f0-v1-a2.delta", BLOB_DELTA, x, N, NULL), 0);
  uint64_t size = 0;
  unsigned char *b = fetch(c, "7/f0-v1-a2.delta", &size);
  CHECK(b != NULL);
  if (!b) return;
  CHECK_EQ_INT(blob_store_set_cache(bs, 1 << 20), 0); /* empty again: as after a restart */
  /* A read that does not ask to keep its bytes (an outer step's) leaves nothing behind. */
  CHECK_EQ_INT(blob_read(bs, "7/f0-v1-a2.delta", BLOB_DELTA, y, N, NULL), 0);
  CHECK_EQ_INT(blob_reader_open(bs, "7/f0-v1-a2.delta", BLOB_DELTA, N, &r), 0);
  if (r) {
    CHECK_EQ_INT(blob_reader_read(r, y, sizeof y), 0);
    CHECK_EQ_INT(blob_reader_close(r, NULL), 0);
  }
  blob_store_cache_stats(bs, &st);
  CHECK(st.resident == 0 && st.hit_bytes == 0);
  CHECK_EQ_INT(s3_put(c, "7/f0-v1-a3.delta", b, size), 0);   /* as a worker puts it */
  CHECK_EQ_INT(read_whole(bs, "7/f0-v1-a3.delta", BLOB_DELTA, y, N), 0);
  CHECK(memcmp(x, y, sizeof x) == 0);
  b[BLOB_HEADER_BYTES + 9] ^= 0x01;
  CHECK_EQ_INT(s3_put(c, "7/f0-v1-a3.delta", b, size), 0); /* damaged after its check ... */
  CHECK_EQ_INT(s3_put(c, "7/f0-v1-a4.delta", b, size), 0); /* ... and before it */
  memset(y, 0, sizeof y);
  CHECK_EQ_INT(read_whole(bs, "7/f0-v1-a3.delta", BLOB_DELTA, y, N), 0); /* the verified copy */
  CHECK(memcmp(x, y, sizeof x) == 0);
  CHECK_EQ_INT(read_whole(bs, "7/f0-v1-a4.delta", BLOB_DELTA, y, N), DPC_ECHECKSUM);
  CHECK_EQ_INT(read_whole(bs, "7/f0-v1-a4.delta", BLOB_DELTA, y, N), DPC_ECHECKSUM); /* still from the store */
  blob_store_cache_stats(bs, &st);
  CHECK(st.hit_bytes == sizeof x && st.resident == sizeof x && st.reserved == 0);
  /* Inner state is not kept; deleting a blob drops its copy. */
  CHECK_EQ_INT(blob_write(bs, "7/f0-v0-a1.innerm", BLOB_INNER_M, x, N, NULL), 0);
  blob_store_cache_stats(bs, &st);
  CHECK(st.resident == sizeof x);
  CHECK_EQ_INT(blob_delete(bs, "7/f0-v1-a3.delta"), 0);
  CHECK_EQ_INT(read_whole(bs, "7/f0-v1-a3.delta", BLOB_DELTA, y, N), DPC_ENOENT);
  blob_store_cache_stats(bs, &st);
  CHECK(st.resident == 0);
  free(b);
  CHECK_EQ_INT(blob_store_set_cache(bs, 0), 0);
  const char *left[] = {"7/f0-v1-a2.delta", "7/f0-v1-a4.delta", "7/f0-v0-a1.innerm"};
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(s3_delete(c, left[i]), 0);
}

static int count_upload(void *ud, const char *key, const char *id) {
  (void)key;
  (void)id;
  (*(int *)ud)++;
  return 0;
}

/* BLOB_WRITE_LATER (a sync step's momentum): with the payload in the cache nothing reaches
 * the store before the commit, which sends it whole; the writer's checksum is the commit's.
 * The same blob written the ordinary way has its multipart upload under way before the
 * commit, which is what proves the first half of the check can fail. */
static void written_later(blob_store *bs, s3_client *c) {
  const size_t n = (size_t)5 << 20; /* 20 MiB: more than one 16 MiB part */
  float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  CHECK(x && y);
  if (!x || !y) goto out;
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 1013) * 1e-3f;
  CHECK_EQ_INT(blob_store_set_cache(bs, 64 << 20), 0);
  for (int mode = 0; mode < 3; mode++) { /* ordinary; later, one part in flight; later, hurried */
    const int later = mode > 0;
    const char *name = later ? "7/f0-v2.momentum" : "7/f0-v3.momentum";
    blob_writer *w = NULL;
    CHECK_EQ_INT(blob_writer_open_ex(bs, name, BLOB_MOMENTUM, n, later ? BLOB_WRITE_LATER : 0, &w), 0);
    if (!w) continue;
    atomic_int hurry;
    atomic_init(&hurry, mode == 2);
    blob_writer_hurry_flag(w, &hurry);
    CHECK_EQ_INT(blob_writer_append(w, x, n / 2 * sizeof *x), 0);
    CHECK_EQ_INT(blob_writer_append(w, x + n / 2, (n - n / 2) * sizeof *x), 0);
    int ups = 0;
    CHECK_EQ_INT(s3_mpu_list(c, count_upload, &ups), 0);
    CHECK_EQ_INT(ups, later ? 0 : 1);
    uint64_t size = 0;
    CHECK_EQ_INT(s3_head(c, name, &size, NULL, 0), DPC_ENOENT);
    const uint32_t running = blob_writer_crc(w);
    uint32_t crc = 0, crc2 = 0;
    CHECK_EQ_INT(blob_writer_commit(w, &crc), 0);
    CHECK(crc == running);
    CHECK_EQ_INT(s3_head(c, name, &size, NULL, 0), 0);
    CHECK(size == BLOB_HEADER_BYTES + n * sizeof *x + BLOB_TRAILER_BYTES);
    blob_store_uncache(bs, name); /* read from the store */
    CHECK_EQ_INT(blob_read(bs, name, BLOB_MOMENTUM, y, n, &crc2), 0);
    CHECK(crc2 == crc && memcmp(x, y, n * sizeof *x) == 0);
    CHECK_EQ_INT(s3_delete(c, name), 0);
  }
  /* Without room in the cache it is written as it comes, as any blob. */
  CHECK_EQ_INT(blob_store_set_cache(bs, 0), 0);
  blob_writer *w = NULL;
  CHECK_EQ_INT(blob_writer_open_ex(bs, "7/f0-v4.momentum", BLOB_MOMENTUM, n, BLOB_WRITE_LATER, &w), 0);
  if (w) {
    CHECK_EQ_INT(blob_writer_append(w, x, n * sizeof *x), 0);
    int ups = 0;
    CHECK_EQ_INT(s3_mpu_list(c, count_upload, &ups), 0);
    CHECK_EQ_INT(ups, 1);
    blob_writer_abort(w);
  }
out:
  free(x);
  free(y);
}

typedef struct {
  char names[32][96];
  int n;
} names;

static int collect(void *ud, const char *key, uint64_t size, int64_t mtime_s) {
  (void)size;
  (void)mtime_s;
  names *l = ud;
  if (l->n < 32) snprintf(l->names[l->n++], 96, "%s", key);
  return 0;
}

static int has(const names *l, const char *k) {
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->names[i], k)) return 1;
  return 0;
}

static void sweep(blob_store *bs, s3_client *c) {
  float x[8] = {0};
  const char *all[] = {"4/f0-v1.params", "4/f0-v2.params", "4/f0-v1-a3.delta", "4/f0-v1-a2.innerm", "5/f0-v1.params"};
  for (int i = 0; i < 5; i++) {
    blob_kind k;
    CHECK_EQ_INT(blob_kind_of_name(all[i], &k), 0);
    CHECK_EQ_INT(blob_write(bs, all[i], k, x, 8, NULL), 0);
  }
  char id[512];
  CHECK_EQ_INT(s3_mpu_create(c, "4/f0-v3.params", id, sizeof id), 0); /* a crash mid-upload */
  char *keep[] = {strdup("4/f0-v2.params")};
  int temps = -1, orphans = -1;
  CHECK_EQ_INT(blob_store_sweep(bs, keep, 1, &temps, &orphans), 0);
  free(keep[0]);
  CHECK_EQ_INT(temps, 1);
  CHECK_EQ_INT(orphans, 2); /* 4/f0-v1.params and 4/f0-v1-a3.delta: unrecorded in a recorded job */
  names l = {0};
  CHECK_EQ_INT(s3_list(c, "", collect, &l), 0);
  CHECK(has(&l, "4/f0-v2.params") && has(&l, "4/f0-v1-a2.innerm") && has(&l, "5/f0-v1.params"));
  CHECK(!has(&l, "4/f0-v1.params") && !has(&l, "4/f0-v1-a3.delta"));
  int uploads = 0;
  CHECK_EQ_INT(s3_mpu_list(c, count_uploads, &uploads), 0);
  CHECK_EQ_INT(uploads, 0);
  /* No database (keep NULL): nothing is an orphan. */
  CHECK_EQ_INT(blob_store_sweep(bs, NULL, 0, &temps, &orphans), 0);
  CHECK_EQ_INT(orphans, 0);
}

/* After a sweep, whether inner state exists is answered from the names the store wrote or the
 * listing found, without a request: an object removed behind the store's back still counts
 * (the proof that no HEAD was made), one deleted through it does not; other kinds ask the
 * store. */
static void known_inner(blob_store *bs, s3_client *c) {
  float x[8] = {0};
  unsigned char junk[4] = {1, 2, 3, 4};
  CHECK_EQ_INT(s3_put(c, "4/f0-v1-a5.innerv", junk, sizeof junk), 0); /* not through the store */
  CHECK(!blob_exists(bs, "4/f0-v1-a5.innerv")); /* swept before it was put: unknown, no request */
  s3_options o = opts();
  blob_store *fresh = NULL; /* a store not swept yet asks with a HEAD */
  CHECK_EQ_INT(blob_store_open_s3(&o, &fresh), 0);
  CHECK(fresh && blob_exists(fresh, "4/f0-v1-a5.innerv") && !blob_exists(fresh, "4/f0-v9-a5.innerv"));
  blob_store_close(fresh);
  CHECK_EQ_INT(blob_store_sweep(bs, NULL, 0, NULL, NULL), 0);
  CHECK(blob_exists(bs, "4/f0-v1-a5.innerv") && blob_exists(bs, "4/f0-v1-a2.innerm")); /* listed */
  CHECK_EQ_INT(s3_delete(c, "4/f0-v1-a5.innerv"), 0);
  CHECK(blob_exists(bs, "4/f0-v1-a5.innerv")); /* answered from the set: no request */
  CHECK_EQ_INT(blob_delete(bs, "4/f0-v1-a2.innerm"), 0);
  CHECK(!blob_exists(bs, "4/f0-v1-a2.innerm"));
  CHECK(!blob_exists(bs, "4/f0-v2-a2.innerm"));
  CHECK_EQ_INT(blob_write(bs, "4/f0-v2-a2.innerm", BLOB_INNER_M, x, 8, NULL), 0);
  CHECK(blob_exists(bs, "4/f0-v2-a2.innerm"));
  char *del[] = {"4/f0-v2-a2.innerm", "4/f0-v1-a5.innerv"};
  CHECK_EQ_INT(blob_delete_many(bs, del, 2), 0);
  CHECK(!blob_exists(bs, "4/f0-v2-a2.innerm") && !blob_exists(bs, "4/f0-v1-a5.innerv"));
  CHECK(blob_exists(bs, "4/f0-v2.params")); /* other kinds: a HEAD */
  CHECK_EQ_INT(s3_delete(c, "4/f0-v2.params"), 0);
  CHECK(!blob_exists(bs, "4/f0-v2.params"));
}

int main(void) {
  if (!getenv("S3_ENDPOINT")) {
    fprintf(stderr, "FAIL: run me under tests/s3/with_rgw.sh\n");
    return 1;
  }
  s3_options o = opts();
  blob_store *bs = NULL;
  CHECK_EQ_INT(blob_store_open_s3(&o, &bs), DPC_EINVAL); /* no bucket yet: refused, named */
  CHECK(strstr(dpc_errmsg(), "dpc-blobs") != NULL);
  s3_client *c = NULL;
  CHECK_EQ_INT(s3_open(&c, &o), 0);
  if (!c) TEST_DONE();
  CHECK_EQ_INT(s3_create_bucket(c), 0);
  CHECK_EQ_INT(blob_store_open_s3(&o, &bs), 0);
  if (bs) {
    CHECK(blob_store_is_s3(bs));
    char path[256];
    CHECK_EQ_INT(blob_path(bs, "1/f0-v0.params", path, sizeof path), 0);
    CHECK(strcmp(path, "s3://dpc-blobs/state/1/f0-v0.params") == 0);
    round_trip(bs);
    presigned_reads(bs);
    streamed_reads(bs);
    parallel_part_puts(bs);
    multipart(bs, c);
    few_parts();
    copies_in_parts(c);
    damaged(bs, c);
    blob_objects(bs, c);
    cached(bs, c);
    sweep(bs, c);
    known_inner(bs, c);
    written_later(bs, c);
  }
  blob_store_close(bs);
  s3_close(c);
  TEST_DONE();
}
