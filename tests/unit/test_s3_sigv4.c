/* test_s3_sigv4.c — the SigV4 signer (coordinator/s3_sigv4.h) against the examples AWS publishes
 * for S3 ("Signature Calculations for the Authorization Header" and "Query String Authentication":
 * access key AKIAIOSFODNN7EXAMPLE, bucket examplebucket, 2013-05-24, us-east-1), plus the encoding
 * and argument checks a caller relies on. */
#include "common/errors.h"
#include "coordinator/s3_sigv4.h"
#include "tests/unit/test.h"

#include <string.h>

static s3_creds aws_example(void) {
  s3_creds c;
  memset(&c, 0, sizeof c);
  strcpy(c.access_key, "AKIAIOSFODNN7EXAMPLE");
  strcpy(c.secret_key, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
  return c;
}

#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define HOST "examplebucket.s3.amazonaws.com"
#define CRED "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "

static void check_auth(const char *method, const char *path, const s3_kv *q, int nq, const s3_kv *h, int nh,
                       const char *payload, const char *want) {
  s3_creds c = aws_example();
  char out[1024];
  CHECK_EQ_INT(s3_sigv4_authorization(&c, "us-east-1", method, path, q, nq, h, nh, payload, out, sizeof out), 0);
  CHECK(strcmp(out, want) == 0);
  if (strcmp(out, want)) fprintf(stderr, "  got  %s\n  want %s\n", out, want);
}

int main(void) {
  char hx[65];
  s3_sha256_hex("", 0, hx);
  CHECK(strcmp(hx, EMPTY_SHA) == 0);

  /* GET Object with a Range header. */
  const s3_kv get_h[] = {{"Host", HOST}, {"Range", "bytes=0-9"}, {"x-amz-content-sha256", EMPTY_SHA},
                         {"x-amz-date", "20130524T000000Z"}};
  check_auth("GET", "/test.txt", NULL, 0, get_h, 4, EMPTY_SHA,
             CRED "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                  "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");

  /* PUT Object: a '$' in the key (encoded), a Date header and a storage class signed too. */
  const char *body = "Welcome to Amazon S3.";
  s3_sha256_hex(body, strlen(body), hx);
  CHECK(strcmp(hx, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072") == 0);
  const s3_kv put_h[] = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"Host", HOST}, {"x-amz-content-sha256", hx},
                         {"x-amz-date", "20130524T000000Z"}, {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  check_auth("PUT", "/test$file.text", NULL, 0, put_h, 5, hx,
             CRED "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, "
                  "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");

  /* GET Bucket lifecycle: a query parameter without a value. */
  const s3_kv lc_q[] = {{"lifecycle", NULL}};
  const s3_kv lc_h[] = {{"Host", HOST}, {"x-amz-content-sha256", EMPTY_SHA}, {"x-amz-date", "20130524T000000Z"}};
  check_auth("GET", "/", lc_q, 1, lc_h, 3, EMPTY_SHA,
             CRED "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
                  "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");

  /* List objects: two parameters given out of order (the signer sorts them). */
  const s3_kv ls_q[] = {{"prefix", "J"}, {"max-keys", "2"}};
  check_auth("GET", "/", ls_q, 2, lc_h, 3, EMPTY_SHA,
             CRED "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
                  "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");

  /* A presigned GET valid for a day. */
  s3_creds c = aws_example();
  char url[S3_URL_MAX];
  CHECK_EQ_INT(s3_sigv4_presign(&c, "us-east-1", "GET", "https://" HOST, HOST, "/test.txt", NULL, 0, NULL, 0,
                                1369353600 /* 2013-05-24T00:00:00Z */, 86400, url, sizeof url),
               0);
  const char *want = "https://" HOST "/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE"
                     "%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&"
                     "X-Amz-SignedHeaders=host&X-Amz-Signature="
                     "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
  CHECK(strcmp(url, want) == 0);
  if (strcmp(url, want)) fprintf(stderr, "  got  %s\n  want %s\n", url, want);

  /* A secret longer than HMAC's 64-byte block ("AWS4" + 100 bytes) is hashed first (RFC 2104);
   * the signature was computed with Python's hmac and hashlib. */
  memset(c.secret_key, 'x', 100);
  c.secret_key[100] = 0;
  CHECK_EQ_INT(s3_sigv4_presign(&c, "us-east-1", "GET", "https://" HOST, HOST, "/test.txt", NULL, 0, NULL, 0,
                                1369353600, 86400, url, sizeof url),
               0);
  CHECK(strstr(url, "X-Amz-Signature=0c05392626efdb809b96df20896acfeaf7ac3085e9d087d773816fcadb9cb449") != NULL);
  c = aws_example();

  /* Encoding: unreserved kept, '/' only in paths, everything else %XX upper-case. */
  char e[64];
  CHECK_EQ_INT(s3_uri_encode("a b/c~d+é", 1, e, sizeof e), 0);
  CHECK(strcmp(e, "a%20b/c~d%2B%C3%A9") == 0);
  CHECK_EQ_INT(s3_uri_encode("a/b", 0, e, sizeof e), 0);
  CHECK(strcmp(e, "a%2Fb") == 0);
  CHECK_EQ_INT(s3_uri_encode("abcdef", 0, e, 4), DPC_EINVAL);

  /* Refusals: no x-amz-date, a lifetime outside 1 s .. 7 days, a header without a value. */
  char out[512];
  const s3_kv no_date[] = {{"Host", HOST}};
  CHECK_EQ_INT(s3_sigv4_authorization(&c, "us-east-1", "GET", "/", NULL, 0, no_date, 1, EMPTY_SHA, out, sizeof out),
               DPC_EINVAL);
  const s3_kv no_val[] = {{"Host", NULL}, {"x-amz-date", "20130524T000000Z"}};
  CHECK_EQ_INT(s3_sigv4_authorization(&c, "us-east-1", "GET", "/", NULL, 0, no_val, 2, EMPTY_SHA, out, sizeof out),
               DPC_EINVAL);
  CHECK_EQ_INT(s3_sigv4_presign(&c, "us-east-1", "GET", "https://" HOST, HOST, "/k", NULL, 0, NULL, 0, 0, 604801, url,
                                sizeof url),
               DPC_EINVAL);
  CHECK_EQ_INT(s3_sigv4_presign(&c, "us-east-1", "GET", "https://" HOST, HOST, "/k", NULL, 0, NULL, 0, 0, 0, url,
                                sizeof url),
               DPC_EINVAL);
  /* A result that does not fit is refused, not truncated. */
  CHECK_EQ_INT(s3_sigv4_presign(&c, "us-east-1", "GET", "https://" HOST, HOST, "/k", NULL, 0, NULL, 0, 0, 60, url, 40),
               DPC_EINVAL);
  TEST_DONE();
}
