/* data.h — where a lease's inputs come from on this machine: the job's training files under
 * --data-dir (paths and glob patterns, checked so that a lease cannot reach outside it) and
 * where each fragment of the lease sits in the path's flat parameter buffer.
 *
 * Ownership: worker_resolve_data hands the caller a malloc'd array (worker_free_paths).
 * Thread-safety: no shared state; safe from any thread. Errors: 0 or a negative DPC_E* code
 * with the detail in dpc_errmsg(). */
#ifndef DPC_WORKER_DATA_H
#define DPC_WORKER_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Resolve a job's training data for path `path`: every entry of spec_json's "data.paths[path]"
 * (DiPaCo routed data) or "data.train" (or of `fallback`,
 * DataWindow.dataset split at ',', when the spec has none) is a path or glob(3) pattern relative to
 * data_dir (absolute paths and ".." components are refused); each pattern's matches are
 * sorted, patterns keep their order; a pattern that matches nothing is an error naming it.
 * *paths (n entries) is malloc'd: free with worker_free_paths. */
int worker_resolve_data(const char *data_dir, const char *spec_json, int path, const char *fallback, char ***paths,
                        int *n);
void worker_free_paths(char **paths, int n);

/* Where each fragment of a lease goes in the path's flat parameter buffer. A path's modules
 * (one per level) are consecutive ranges of the canonical layout, level 0 first, so the path
 * buffer is the whole model's layout and FragmentInfo.offset_floats (an offset in that
 * layout, proto/dipaco.proto) is the fragment's place in it. level[i], module[i], off[i],
 * len[i] describe fragment i of n; abs_off[i] receives its offset in the path buffer. The
 * fragments must tile [0, n_params) exactly, in level order, one module per level
 * (DPC_EFORMAT naming the first fragment that does not). */
int worker_place_fragments(size_t n, const uint32_t *level, const uint64_t *module, const uint64_t *off,
                           const uint64_t *len, size_t n_params, size_t *abs_off);

#endif
