/* storeget.h — a worker's reads from the S3 object store that holds the coordinator's blobs,
 * through the presigned URLs a lease carries (FragmentInfo.params_url, docs/design.md §4.4):
 * the worker never holds store credentials, and the parameters' bytes do not pass through the
 * coordinator. HTTP through libcurl. Thread-safe (one curl handle per call). */
#ifndef DPC_WORKER_STOREGET_H
#define DPC_WORKER_STOREGET_H

#include <stddef.h>
#include <stdint.h>

/* Bytes [off, off + n) of the object at url into dst, within timeout_ms. 0, or a negative
 * DPC_E* code with the detail in dpc_errmsg(): DPC_EPERM (403: the URL expired or was
 * altered), DPC_ENOENT (404), DPC_EFORMAT (a short or long answer), DPC_EUNAVAILABLE (no
 * connection, a timeout, 5xx). */
int storeget_range(const char *url, uint64_t off, void *dst, size_t n, int timeout_ms);

#endif
