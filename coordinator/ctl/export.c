/* export.c — `dipacoctl job export`: receive a path's model (ExportPath: config.json, then
 * model.safetensors, each a chunked sub-stream with a CRC-32C) into --out DIR, written
 * atomically and checked to load as a model directory before it is reported. */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "coordinator/ctl/commands.h"
#include "coordinator/ctl/view.h"
#include "kernels/gpt.h"
#include "kernels/modeldir.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int cmd_job_export_check(const admin_args *o) {
  if (o->path < 0 || !o->out) {
    fprintf(stderr, "dipacoctl job export: needs --path P and --out DIR\n");
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

int cmd_job_export(actx *a, const admin_args *o, char **pos, int npos) {
  const int path = o->path;
  const long version = o->version;
  const char *out = o->out;
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  if (path < 0) return conn_usage(a, "--path must be >= 0%s", "");
  if (version < 0) return conn_usage(a, "--version must be >= 0 (0 = latest)%s", "");
  if (!out[0]) return conn_usage(a, "--out must name a directory%s", "");
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

