/* auth.h — shared secrets of a dipaco cluster: the coordinator's join token (workers present
 * it to Register) and admin token (every Admin call), kept in token files.
 *
 * A token is 32 random bytes (getrandom) written as 64 lower-case hex characters. A token
 * file holds the token and an optional trailing newline; it is created with mode 0600 and
 * never overwritten. Any printable ASCII token of 16..DPC_TOKEN_MAX bytes is accepted when
 * read (operators may bring their own). Servers keep only a hash of a token (SHA-256 in the
 * coordinator, which links libcrypto) and compare hashes with dpc_ct_equal, whose time does
 * not depend on where the inputs differ. Wire form: metadata "authorization: Bearer TOKEN".
 *
 * dpc_auth_keys holds the hashes a server checks (zeroed = no check configured). It is set
 * once by main() before the server starts and only read afterwards. Thread-safety: all
 * functions are safe from any thread (no shared state). */
#ifndef DPC_AUTH_H
#define DPC_AUTH_H

#include <stddef.h>

#define DPC_TOKEN_BYTES 32  /* random bytes in a generated token */
#define DPC_TOKEN_MIN 16    /* shortest token accepted from a file */
#define DPC_TOKEN_MAX 256   /* longest token accepted from a file or the wire */
#define DPC_TOKEN_HASH 32   /* SHA-256 */

/* A new random token: 2·DPC_TOKEN_BYTES hex characters and a NUL in out[cap ≥ 65]. */
int dpc_token_generate(char *out, size_t cap);

/* Create `path` (mode 0600, O_EXCL: an existing file is DPC_EEXIST and left alone) holding a
 * new random token followed by a newline; fsyncs the file and its directory. The token is
 * also returned in out[cap ≥ 65]. */
int dpc_token_create_file(const char *path, char *out, size_t cap);

/* Read a token file into out[cap]: trailing whitespace is dropped; the rest must be
 * DPC_TOKEN_MIN..DPC_TOKEN_MAX printable ASCII characters without spaces (DPC_EFORMAT
 * otherwise). A file that others may write (mode & 022) is refused (DPC_EPERM); one that
 * others may read is accepted with a warning. */
int dpc_token_read_file(const char *path, char *out, size_t cap);

/* The token of an "authorization" metadata value "Bearer TOKEN" (scheme case-insensitive,
 * spaces after it skipped), or NULL when the value has another form or no token. */
const char *dpc_bearer_token(const char *md_value);

/* 1 if a[0, n) == b[0, n), else 0; time independent of the contents. */
int dpc_ct_equal(const void *a, const void *b, size_t n);

/* Hashes of the tokens a server accepts; a role whose `has_` flag is 0 is not checked. */
typedef struct dpc_auth_keys {
  int has_join, has_admin;
  unsigned char join[DPC_TOKEN_HASH];  /* SHA-256 of the join token */
  unsigned char admin[DPC_TOKEN_HASH]; /* SHA-256 of the admin token */
} dpc_auth_keys;

#endif
