/* export.c — `dipacoctl job export`: receive a path's model (ExportPath: config.json, then
 * model.safetensors, each a chunked sub-stream with a CRC-32C) into --out DIR, written
 * atomically and checked to load as a model directory before it is reported. With
 * --all-paths, a DiPaCo model directory (kernels/router.h): OUT/path_<p>/ per path, the router
 * given by --router copied to OUT/router/, and OUT/dipaco.json. */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "coordinator/ctl/commands.h"
#include "coordinator/ctl/view.h"
#include "kernels/gpt.h"
#include "kernels/modeldir.h"
#include "kernels/router.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int cmd_job_export_check(const admin_args *o) {
  if (!o->out || (o->path < 0) == !o->all_paths) {
    fprintf(stderr, "dipacoctl job export: needs --out DIR and one of --path P or --all-paths\n");
    return 2;
  }
  if (o->router && !o->all_paths) {
    fprintf(stderr, "dipacoctl job export: --router goes with --all-paths (a DiPaCo model directory)\n");
    return 2;
  }
  rpc_tune_malloc();
  return 0;
}

/* One chunked sub-stream of ExportPath being received. */
typedef struct {
  uint32_t payload;
  uint64_t total, got;
  uint32_t crc;
  int done;
} sub_stream;

static int sub_accept(sub_stream *ss, const struct rpc_chunk *c, const char *what, uint64_t max) {
  if (ss->done) return dpc_err(DPC_EFORMAT, "ExportPath: more %s data after its last chunk", what);
  if (ss->got == 0 && c->offset == 0 && ss->total == 0) {
    if (c->total == 0 || c->total > max)
      return dpc_err(DPC_ERANGE, "ExportPath: %s of %llu bytes (expected 1..%llu)", what,
                     (unsigned long long)c->total, (unsigned long long)max);
    ss->total = c->total;
  }
  if (c->offset != ss->got || c->total != ss->total)
    return dpc_err(DPC_EFORMAT, "ExportPath: %s chunk at offset %llu of %llu, expected offset %llu of %llu",
                   what, (unsigned long long)c->offset, (unsigned long long)c->total,
                   (unsigned long long)ss->got, (unsigned long long)ss->total);
  return 0;
}

static int sub_advance(sub_stream *ss, const struct rpc_chunk *c, const void *data, const char *what) {
  ss->crc = dpc_crc32c(ss->crc, data, (size_t)c->len);
  ss->got += c->len;
  if (ss->got == ss->total) {
    if (ss->crc != c->crc32c)
      return dpc_err(DPC_ECHECKSUM, "ExportPath: %s CRC-32C is %08x, the coordinator says %08x; "
                     "nothing was written, export again", what, ss->crc, c->crc32c);
    ss->done = 1;
  }
  return 0;
}

static int export_stream(actx *a, const Dipaco__V1__ExportPathRequest *req, const char *out_dir,
                         uint8_t **cfg_buf, size_t *cfg_len, uint64_t *st_bytes, uint32_t *st_crc,
                         uint64_t *version) {
  char st_path[PATH_MAX + 32];
  snprintf(st_path, sizeof st_path, "%s/%s", out_dir, MODELDIR_WEIGHTS);
  struct rpc_stream *s = NULL;
  dpc_afile *af = NULL;
  uint8_t *scratch = NULL, *cfg = NULL;
  sub_stream sc = {0}, sw = {0};
  int rc = rpc_stream_open(a->cli, ADMIN "ExportPath", &req->base, STREAM_TIMEOUT_MS, &s);
  while (rc == 0) {
    struct grpc_byte_buffer *m = NULL;
    rc = rpc_stream_read(s, &m);
    if (rc <= 0) break;
    struct rpc_chunk c;
    rc = rpc_chunk_parse(m, &c);
    if (rc == 0 && c.payload == DIPACO__V1__PAYLOAD__PAYLOAD_CONFIG_JSON) {
      if (sw.got || sw.done) rc = dpc_err(DPC_EFORMAT, "ExportPath: config.json after the weights");
      if (rc == 0) rc = sub_accept(&sc, &c, "config.json", MODELDIR_MAX_CONFIG);
      if (rc == 0 && !cfg && !(cfg = malloc((size_t)sc.total + 1))) rc = dpc_err(DPC_ENOMEM, "out of memory");
      if (rc == 0) rc = rpc_chunk_copy(m, &c, cfg + c.offset);
      if (rc == 0) rc = sub_advance(&sc, &c, cfg + c.offset, "config.json");
    } else if (rc == 0 && c.payload == DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS) {
      if (!sc.done) rc = dpc_err(DPC_EFORMAT, "ExportPath: weights before a complete config.json");
      if (rc == 0) rc = sub_accept(&sw, &c, "model.safetensors", MODEL_MAX_BYTES);
      if (rc == 0 && !af) rc = dpc_afile_open(st_path, &af);
      void *grown = rc == 0 ? realloc(scratch, c.len ? (size_t)c.len : 1) : NULL;
      if (rc == 0 && !grown) rc = dpc_err(DPC_ENOMEM, "out of memory");
      if (rc == 0) scratch = grown;
      if (rc == 0) rc = rpc_chunk_copy(m, &c, scratch);
      if (rc == 0) rc = sub_advance(&sw, &c, scratch, "model.safetensors");
      if (rc == 0) rc = dpc_afile_write(af, scratch, (size_t)c.len);
      if (rc == 0 && sw.done) *version = c.version;
    } else if (rc == 0) {
      rc = dpc_err(DPC_EFORMAT, "ExportPath: unexpected payload %u", c.payload);
    }
    rpc_msg_free(m);
  }
  if (rc == 0 && !(sc.done && sw.done))
    rc = dpc_err(DPC_EFORMAT, "ExportPath: the stream ended before %s was complete",
                 sc.done ? "model.safetensors" : "config.json");
  const char *method = rc < 0 && rpc_last_code() != RPC_OK ? ADMIN "ExportPath" : NULL;
  rpc_stream_free(s);
  free(scratch);
  if (rc == 0) rc = dpc_afile_commit(af);
  else if (af) dpc_afile_abort(af);
  if (rc) {
    free(cfg);
    return conn_fail(a, method, rc);
  }
  cfg[sc.total] = 0;
  *cfg_buf = cfg;
  *cfg_len = (size_t)sc.total;
  *st_bytes = sw.total;
  *st_crc = sw.crc;
  return 0;
}

/* Export path `path` of job `id` into `out`; prints the report unless quiet. Exit status. */
static int export_one(actx *a, uint64_t id, int path, long version, const char *out, int quiet) {
  int rc = dpc_mkdir_p(out);
  if (rc) return conn_fail(a, NULL, rc);
  Dipaco__V1__ExportPathRequest req = DIPACO__V1__EXPORT_PATH_REQUEST__INIT;
  req.job_id = id;
  req.path = (uint32_t)path;
  req.version = (uint64_t)version;
  uint8_t *cfg = NULL;
  size_t cfg_len = 0;
  uint64_t st_bytes = 0, got_version = 0;
  uint32_t st_crc = 0;
  if (export_stream(a, &req, out, &cfg, &cfg_len, &st_bytes, &st_crc, &got_version)) return 1;
  char cfg_path[PATH_MAX + 32], st_path[PATH_MAX + 32];
  snprintf(cfg_path, sizeof cfg_path, "%s/%s", out, MODELDIR_CONFIG);
  snprintf(st_path, sizeof st_path, "%s/%s", out, MODELDIR_WEIGHTS);
  rc = dpc_write_file_atomic(cfg_path, cfg, cfg_len);
  free(cfg);
  if (rc) return conn_fail(a, NULL, rc);
  /* The pair must load as a model directory (config and weights agree, values finite). */
  gpt_config mc;
  float *params = NULL;
  rc = modeldir_load(out, &mc, &params);
  if (rc) {
    int st = conn_fail(a, NULL, rc);
    unlink(cfg_path);
    unlink(st_path);
    fprintf(stderr, "dipacoctl %s: removed the unusable export from %s\n", a->cmd, out);
    return st;
  }
  gpt_layout *lay = malloc(sizeof *lay);
  size_t n_params = lay && gpt_layout_build(&mc, lay) == 0 ? lay->n_params : 0;
  free(lay);
  free(params);
  if (quiet) return 0;
  /* The version served: the chunks' when the coordinator sets it, else the one asked for
   * (0 = latest, unknown here). */
  if (got_version == 0) got_version = (uint64_t)version;
  char vbuf[32] = "null";
  if (got_version) snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long)got_version);
  if (a->json) {
    printf("{\"job_id\":%llu,\"path\":%d,\"version\":%s,\"out\":", (unsigned long long)id, path, vbuf);
    view_jstr(stdout, out);
    printf(",\"config_bytes\":%zu,\"safetensors_bytes\":%llu,\"safetensors_crc32c\":\"%08x\","
           "\"n_params\":%zu,\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"n_positions\":%d,"
           "\"vocab_size\":%d}\n", cfg_len, (unsigned long long)st_bytes, st_crc, n_params,
           mc.n_layer, mc.n_head, mc.n_embd, mc.n_positions, mc.vocab_size);
  } else {
    printf("exported job %llu path %d (%s%s) to %s: %zu parameters, %llu bytes, CRC-32C %08x\n",
           (unsigned long long)id, path, got_version ? "version " : "latest version", got_version ? vbuf : "",
           out, n_params, (unsigned long long)st_bytes, st_crc);
  }
  return 0;
}

/* The router, re-read and re-written (so a bad one is refused, not copied), with its base. */
static int copy_router(actx *a, const char *from, const char *to, int n_paths) {
  router r;
  int rc = router_load(from, &r);
  if (rc) return conn_fail(a, NULL, rc);
  if (r.n_paths != n_paths) {
    fprintf(stderr, "dipacoctl %s: router %s routes to %d paths but the job has %d\n", a->cmd, from, r.n_paths,
            n_paths);
    router_free(&r);
    return 1;
  }
  char fb[PATH_MAX * 2 + 16], tb[PATH_MAX * 2 + 16];
  snprintf(fb, sizeof fb, "%s/%s", from, ROUTER_BASE_DIR);
  snprintf(tb, sizeof tb, "%s/%s", to, ROUTER_BASE_DIR);
  gpt_config cfg;
  float *params = NULL;
  rc = router_save(to, &r);
  if (!rc) rc = modeldir_load(fb, &cfg, &params);
  if (!rc) rc = modeldir_save(tb, &cfg, params);
  free(params);
  router_free(&r);
  return rc ? conn_fail(a, NULL, rc) : 0;
}

/* --all-paths: OUT/path_<p>/ for every path, OUT/router/ (with --router) and OUT/dipaco.json. */
static int export_all(actx *a, uint64_t id, long version, const char *out, const char *router_dir) {
  Dipaco__V1__JobRequest req = DIPACO__V1__JOB_REQUEST__INIT;
  req.job_id = id;
  req.reason = "";
  Dipaco__V1__Job *j = NULL;
  int rc = conn_call(a, ADMIN "GetJob", &req.base, &dipaco__v1__job__descriptor, (ProtobufCMessage **)&j, 0);
  if (rc) return conn_fail(a, ADMIN "GetJob", rc);
  int n_paths = (int)view_job_summary(j)->paths;
  protobuf_c_message_free_unpacked(&j->base, NULL);
  if (n_paths < 1) {
    fprintf(stderr, "dipacoctl %s: job %llu reports no paths\n", a->cmd, (unsigned long long)id);
    return 1;
  }
  if ((rc = dpc_mkdir_p(out))) return conn_fail(a, NULL, rc);
  char dir[PATH_MAX + 32];
  for (int p = 0; p < n_paths; p++) {
    snprintf(dir, sizeof dir, "%s/path_%d", out, p);
    int st = export_one(a, id, p, version, dir, 1);
    if (st) return st;
  }
  if (router_dir) {
    snprintf(dir, sizeof dir, "%s/router", out);
    int st = copy_router(a, router_dir, dir, n_paths);
    if (st) return st;
  }
  char meta[512], mpath[PATH_MAX + 32];
  int n = snprintf(meta, sizeof meta, "{\"format\": \"dipaco-model\", \"version\": 1, \"job_id\": %llu, \"paths\": %d, "
                   "\"router\": %s}\n", (unsigned long long)id, n_paths, router_dir ? "\"router\"" : "null");
  snprintf(mpath, sizeof mpath, "%s/%s", out, DIPACO_MODEL_JSON);
  if ((rc = dpc_write_file_atomic(mpath, meta, (size_t)n))) return conn_fail(a, NULL, rc);
  if (a->json) {
    printf("{\"job_id\":%llu,\"paths\":%d,\"router\":%s,\"out\":", (unsigned long long)id, n_paths,
           router_dir ? "true" : "false");
    view_jstr(stdout, out);
    printf("}\n");
  } else {
    printf("exported job %llu: %d paths to %s/path_<p>%s\n", (unsigned long long)id, n_paths, out,
           router_dir ? ", router to router/" : " (no router: add --router DIR for dipacoctl eval --dipaco)");
  }
  return 0;
}

int cmd_job_export(actx *a, const admin_args *o, char **pos, int npos) {
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  if (!o->all_paths && o->path < 0) return conn_usage(a, "--path must be >= 0%s", "");
  if (o->version < 0) return conn_usage(a, "--version must be >= 0 (0 = latest)%s", "");
  if (!o->out[0]) return conn_usage(a, "--out must name a directory%s", "");
  if (o->all_paths) return export_all(a, id, o->version, o->out, o->router);
  return export_one(a, id, o->path, o->version, o->out, 0);
}
