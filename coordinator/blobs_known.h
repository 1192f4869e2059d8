/* blobs_known.h — the names of inner-state blobs known to be in an S3 store, so that a lease
 * grant can tell whether a slot's checkpoint exists without asking the store (blobs.c keeps
 * it; nothing else does).
 *
 * Why: a grant runs on the coordinator's loop thread, and a HEAD per blob there would stop
 * every other call for as long as the store takes to answer (up to its deadline and retries
 * when it has just gone down). Inner state is written and deleted only by the coordinator, and
 * the start-up sweep lists every object once, so the set is exact from then on: a name is added
 * when its write succeeded or the listing found it, and removed when a delete was asked for
 * (removed even when the delete failed: "unknown" makes a grant carry no checkpoint, the safe
 * side). Until a listing completed the set is not authoritative and blobs.c asks the store.
 *
 * A sorted array of strings (bsearch, insertion by memmove): a few names per slot, fragment and
 * kind (two rounds at most). Thread-safe (one mutex). */
#ifndef DPC_BLOBS_KNOWN_H
#define DPC_BLOBS_KNOWN_H

typedef struct blobs_known blobs_known;

/* An empty set, not complete; NULL when out of memory. */
blobs_known *blobs_known_new(void);
void blobs_known_free(blobs_known *k);

/* 0, or DPC_ENOMEM (the name is then not known: the safe side). */
int blobs_known_add(blobs_known *k, const char *name);
void blobs_known_del(blobs_known *k, const char *name);
/* 1 when the set is complete and holds name, 0 when it is complete and does not, -1 when it is
 * not complete (ask the store). */
int blobs_known_has(blobs_known *k, const char *name);
/* Empty the set before a listing; mark it complete after one that succeeded. */
void blobs_known_reset(blobs_known *k);
void blobs_known_set_complete(blobs_known *k);

#endif
