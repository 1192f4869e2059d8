#!/usr/bin/env bash
# s3curl.sh CURL-ARGS… — curl signed for the test gateway (tests/s3/with_rgw.sh's AWS_* variables):
# SigV4 with the payload hash header RGW requires. curl signs the query as written, so a URL's
# query must already be sorted and percent-encoded ("?list-type=2&prefix=run%2F").
exec curl -sf --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
  -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"
