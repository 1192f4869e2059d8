#!/usr/bin/env bash
# mirror.sh BUCKET PREFIX STATE OUT — for tests/integration/ledger_check.py, which reads blobs
# from a state directory: OUT gets STATE's database (linked) and every object under
# BUCKET/PREFIX/ downloaded into OUT/blobs/. Fails when the listing does not fit one page or an
# unfinished multipart upload is left in the bucket. Run under tests/s3/with_rgw.sh.
set -euo pipefail
BUCKET=$1; PREFIX=$2; STATE=$3; OUT=$4
HERE=$(cd "$(dirname "$0")" && pwd)
s3get() { bash "$HERE/s3curl.sh" "$@"; }
mkdir -p "$OUT/blobs"
ln -s "$STATE/dipaco.db" "$OUT/dipaco.db"
for f in dipaco.db-wal dipaco.db-shm; do [ -e "$STATE/$f" ] && ln -s "$STATE/$f" "$OUT/$f"; done
listing=$(s3get "$S3_ENDPOINT/$BUCKET?list-type=2&prefix=$PREFIX%2F") || { echo "cannot list the bucket" >&2; exit 1; }
grep -q "<IsTruncated>false" <<<"$listing" || { echo "more objects than one listing page" >&2; exit 1; }
for key in $(grep -o '<Key>[^<]*</Key>' <<<"$listing" | sed 's/<[^>]*>//g'); do
  mkdir -p "$OUT/blobs/$(dirname "${key#"$PREFIX"/}")"
  s3get -o "$OUT/blobs/${key#"$PREFIX"/}" "$S3_ENDPOINT/$BUCKET/$key" || { echo "cannot read $key" >&2; exit 1; }
done
[ "$(s3get "$S3_ENDPOINT/$BUCKET?uploads=" | grep -c '<UploadId>' || true)" = 0 ] \
  || { echo "unfinished uploads left" >&2; exit 1; }
echo "mirrored $(find "$OUT/blobs" -type f | wc -l) objects of the bucket for the ledger check"
