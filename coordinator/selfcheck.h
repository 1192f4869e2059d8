/* selfcheck.h — the listener's self-check: notice a listener that stopped accepting.
 *
 * gRPC's listener stops accepting for good after accept() fails with EMFILE (too many open
 * files): the process stays up, old connections keep working, every new one hangs in the
 * kernel's backlog, and systemd never restarts it. The self-check catches that from outside
 * the library: a thread connects to the coordinator's own port every period, sends the
 * HTTP/2 client preface and waits for the server to answer anything (its SETTINGS frame, a
 * TLS alert, or closing the connection: each proves the connection was accepted). After
 * max_fail failures in a row it logs why and ends the process with exit status 70, so that
 * the service manager restarts it (the state is crash-safe, as after a kill).
 *
 * Contract: selfcheck_start copies what it needs; the thread touches nothing of the
 * coordinator's. selfcheck_stop (any thread, once) ends the checks, e.g. at a graceful
 * shutdown, when the listener stops accepting on purpose; the thread frees the handle. */
#ifndef DPC_COORD_SELFCHECK_H
#define DPC_COORD_SELFCHECK_H

#define SELFCHECK_EXIT 70

struct selfcheck;

/* listen: the --listen address ("HOST:PORT", "[V6]:PORT" or "unix:PATH"); port: the bound
 * port (it replaces PORT, which may be 0). A wildcard host is checked on loopback. period_ms
 * ≤ 0 turns the check off (*out = NULL). Returns 0 or a DPC_E* code (the thread could not start). */
int selfcheck_start(const char *listen, int port, int period_ms, int max_fail, struct selfcheck **out);
void selfcheck_stop(struct selfcheck *k); /* NULL: nothing */

#endif
