/* admin_upload.h — dipaco.v1.Admin UploadInitialModel and the uploads (layer 4, see coord.h):
 * STATE/uploads/<id>.safetensors, or on an S3 store the object uploads/<id>.safetensors,
 * read by CreateJob (admin_jobs.c).
 *
 * Contract: the handlers and admin_uploads_init run on the loop thread; admin_upload_path
 * and admin_load_upload only read c->state_dir and may run in the thread pool. */
#ifndef DPC_COORD_ADMIN_UPLOAD_H
#define DPC_COORD_ADMIN_UPLOAD_H

#include "common/rpc.h"
#include "coordinator/coord.h"
#include "kernels/gpt.h"

/* STATE/uploads/<id>.safetensors into buf. */
void admin_upload_path(const coord *c, uint64_t id, char *buf, size_t cap);
/* Read upload `id` into theta (the canonical layout of lay): every tensor present with the
 * shape lay implies, every value finite. 0 or a negative DPC_E* code (DPC_ENOENT: no such
 * upload). */
int admin_load_upload(const coord *c, uint64_t id, const gpt_layout *lay, float *theta);
/* Remove upload `id` once a job holds its weights (on S3 the request runs on the thread pool). */
void admin_upload_drop(coord *c, uint64_t id);
/* At start-up: upload ids continue after the largest stored upload; unfinished or unclaimed
 * uploads are removed. A negative DPC_E* code when an S3 store's uploads cannot be listed (ids
 * could then repeat one still stored). */
int admin_uploads_init(coord *c);
/* Fill out[] with this file's methods (ud = c) and return how many. */
int admin_upload_methods(coord *c, struct rpc_method *out);

#endif
