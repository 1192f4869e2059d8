/* view.c — how the admin commands show things: proto enums as names, losses and times as
 * text, JSON strings and numbers, and a job as a text table or one JSON object (view.h). */
#include "coordinator/ctl/view.h"
#include "common/codec.h"
#include "coordinator/jobspec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void view_jstr(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (*p < 0x20) fprintf(f, "\\u%04x", *p);
      else fputc(*p, f);
    }
  }
  fputc('"', f);
}

/* A float as JSON: non-finite values (NaN = "unknown" loss) become null. */
void view_jnum(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.9g", v);
  else fputs("null", f);
}

const char *view_fmt_loss(double v, char *buf, size_t cap) {
  if (!isfinite(v) || v == 0) snprintf(buf, cap, "-");
  else snprintf(buf, cap, "%.4f", v);
  return buf;
}

const char *view_fmt_time(int64_t unix_ms, char *buf, size_t cap) {
  if (unix_ms <= 0) {
    snprintf(buf, cap, "-");
    return buf;
  }
  time_t t = (time_t)(unix_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

const char *view_job_state_name(int s) {
  switch (s) {
  case DIPACO__V1__JOB_STATE__JOB_PENDING: return "PENDING";
  case DIPACO__V1__JOB_STATE__JOB_RUNNING: return "RUNNING";
  case DIPACO__V1__JOB_STATE__JOB_PAUSED: return "PAUSED";
  case DIPACO__V1__JOB_STATE__JOB_DONE: return "DONE";
  case DIPACO__V1__JOB_STATE__JOB_CANCELLED: return "CANCELLED";
  case DIPACO__V1__JOB_STATE__JOB_FAILED: return "FAILED";
  case DIPACO__V1__JOB_STATE__JOB_STATE_UNSPECIFIED: return "UNSPECIFIED";
  default: return "UNKNOWN";
  }
}

int view_job_state_parse(const char *s) {
  static const char *const names[] = {"pending", "running", "paused", "done", "cancelled", "failed"};
  for (int i = 0; i < 6; i++)
    if (strcasecmp(s, names[i]) == 0) return i + 1;
  return -1;
}

const char *view_algorithm_name(int a) {
  switch (a) {
  case DIPACO__V1__ALGORITHM__ALGORITHM_SYNC: return "sync";
  case DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_DELAYED: return "async-delayed";
  case DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_NESTEROV: return "async-nesterov";
  default: return "unknown";
  }
}

const char *view_worker_state_name(int s) {
  switch (s) {
  case DIPACO__V1__WORKER_STATE__WORKER_IDLE: return "IDLE";
  case DIPACO__V1__WORKER_STATE__WORKER_TRAINING: return "TRAINING";
  case DIPACO__V1__WORKER_STATE__WORKER_DRAINING: return "DRAINING";
  case DIPACO__V1__WORKER_STATE__WORKER_GONE: return "GONE";
  case DIPACO__V1__WORKER_STATE__WORKER_STATE_UNSPECIFIED: return "UNSPECIFIED";
  default: return "UNKNOWN";
  }
}

void view_summary_fields(FILE *f, const Dipaco__V1__JobSummary *s) {
  fprintf(f, "\"job_id\":%llu,\"name\":", (unsigned long long)s->job_id);
  view_jstr(f, s->name);
  fprintf(f, ",\"state\":\"%s\",\"algorithm\":\"%s\",\"round\":%llu,\"rounds_total\":%llu,"
             "\"paths\":%u,\"replicas\":%u,\"active_leases\":%u,\"created_unix_ms\":%lld,"
             "\"updated_unix_ms\":%lld,\"last_loss\":",
          view_job_state_name(s->state), view_algorithm_name(s->algorithm), (unsigned long long)s->round,
          (unsigned long long)s->rounds_total, s->paths, s->replicas, s->active_leases,
          (long long)s->created_unix_ms, (long long)s->updated_unix_ms);
  view_jnum(f, s->last_loss);
  fprintf(f, ",\"bytes_in\":%llu,\"bytes_out\":%llu,\"peak_sync_bytes\":%llu,\"tokens\":%llu,\"bytes_per_token\":",
          (unsigned long long)s->bytes_in, (unsigned long long)s->bytes_out, (unsigned long long)s->peak_sync_bytes,
          (unsigned long long)s->tokens);
  view_jnum(f, s->tokens ? (double)(s->bytes_in + s->bytes_out) / (double)s->tokens : NAN);
  fprintf(f, ",\"bytes_in_per_token\":"); /* pushed (deltas as sent) and pulled, per token trained */
  view_jnum(f, s->tokens ? (double)s->bytes_in / (double)s->tokens : NAN);
  fprintf(f, ",\"bytes_out_per_token\":");
  view_jnum(f, s->tokens ? (double)s->bytes_out / (double)s->tokens : NAN);
  fprintf(f, ",\"last_outer_step_s\":");
  view_jnum(f, s->last_outer_step_s > 0 ? s->last_outer_step_s : NAN);
  fprintf(f, ",\"last_round_overhead_s\":");
  view_jnum(f, s->last_round_overhead_s > 0 ? s->last_round_overhead_s : NAN);
}

const Dipaco__V1__JobSummary *view_job_summary(const Dipaco__V1__Job *j) {
  static const Dipaco__V1__JobSummary empty = DIPACO__V1__JOB_SUMMARY__INIT;
  return j->summary ? j->summary : &empty;
}

/* One Job as a JSON object: summary fields, message, the spec (canonical object when it
 * parses as a job spec) and spec_json verbatim (a string). */
static void json_job(FILE *f, const Dipaco__V1__Job *j) {
  fputc('{', f);
  view_summary_fields(f, view_job_summary(j));
  fputs(",\"message\":", f);
  view_jstr(f, j->message);
  fprintf(f, ",\"steps_leased\":%llu,\"steps_merged\":%llu", (unsigned long long)j->steps_leased,
          (unsigned long long)j->steps_merged);
  if (j->steps_leased) fprintf(f, ",\"goodput\":%.6g", (double)j->steps_merged / (double)j->steps_leased);
  const char *spec = j->spec_json ? j->spec_json : "";
  jobspec *js = malloc(sizeof *js);
  char *canon = NULL;
  if (js && spec[0] && jobspec_parse_stored(spec, strlen(spec), js) == 0 && jobspec_to_json(js, &canon) == 0) {
    char origin[256];
    fprintf(f, ",\"spec\":%s,\"outer_origin\":", canon);
    view_jstr(f, jobspec_outer_origin(js, origin, sizeof origin));
  } else
    fputs(",\"spec\":null", f);
  fputs(",\"spec_json\":", f);
  view_jstr(f, spec);
  fputc('}', f);
  free(canon);
  free(js);
}

static void text_spec(FILE *f, const jobspec *js) {
  if (js->init_dir[0]) fprintf(f, "%-18s %s\n", "model.init", js->init_dir);
  if (js->has_shape)
    fprintf(f, "%-18s n_layer %d, n_head %d, n_embd %d, n_positions %d, vocab_size %d\n",
            "model", js->model.n_layer, js->model.n_head, js->model.n_embd, js->model.n_positions,
            js->model.vocab_size);
  if (js->has_shape && js->model.arch == GPT_ARCH_LLAMA)
    fprintf(f, "%-18s llama: n_kv_head %d, intermediate_size %d, %s head%s%s\n", "model.arch", js->model.n_kv_head,
            js->model.intermediate_size, js->model.tie_word_embeddings ? "tied" : "untied",
            js->model.attention_bias ? ", q/k/v biases" : "", js->model.rope_scaling == GPT_ROPE_LLAMA3 ? ", llama3 RoPE" : "");
  if (!js->init_dir[0]) fprintf(f, "%-18s %llu\n", "model.seed", (unsigned long long)js->seed);
  fprintf(f, "%-18s", "data.train");
  for (int i = 0; i < js->n_train; i++) fprintf(f, "%s%s", i ? ", " : " ", js->train[i]);
  fprintf(f, "%s\n%-18s", js->n_train ? "" : " -", "data.val");
  for (int i = 0; i < js->n_val; i++) fprintf(f, "%s%s", i ? ", " : " ", js->val[i]);
  fprintf(f, "%s\n", js->n_val ? "" : " -");
  fprintf(f, "%-18s %s\n", "spec.algorithm", jobspec_algorithm_name(js->algorithm));
  fprintf(f, "%-18s %d\n", "replicas", js->replicas);
  fprintf(f, "%-18s %d\n", "inner_steps", js->inner_steps);
  fprintf(f, "%-18s %d\n", "rounds", js->rounds);
  fprintf(f, "%-18s %d\n", "batch", js->batch);
  fprintf(f, "%-18s %d\n", "seq_len", js->seq_len);
  fprintf(f, "%-18s %.9g\n", "inner.lr", js->inner.lr);
  fprintf(f, "%-18s %d\n", "inner.warmup", js->inner.warmup);
  fprintf(f, "%-18s %.9g\n", "inner.lr_min_frac", js->inner.lr_min_frac);
  fprintf(f, "%-18s %.9g\n", "inner.weight_decay", js->inner.weight_decay);
  fprintf(f, "%-18s %.9g\n", "inner.beta1", js->inner.beta1);
  fprintf(f, "%-18s %.9g\n", "inner.beta2", js->inner.beta2);
  fprintf(f, "%-18s %.9g\n", "inner.eps", js->inner.eps);
  fprintf(f, "%-18s %.9g\n", "inner.grad_clip", js->inner.grad_clip);
  fprintf(f, "%-18s %s\n", "inner.state", jobspec_inner_state_name(js->inner.state));
  if (js->inner.optimizer == INNER_OPT_MUON)
    fprintf(f, "%-18s muon (AdamW for the rest): lr %.9g, momentum %.9g%s, ns_steps %d, weight_decay %.9g, "
            "adjust_lr %s\n", "inner.optimizer", js->inner.muon.lr, js->inner.muon.momentum,
            js->inner.muon.nesterov ? " nesterov" : "", js->inner.muon.ns_steps, jobspec_muon_weight_decay(js),
            gpt_muon_adjust_name(js->inner.muon.adjust_lr));
  else fprintf(f, "%-18s adamw\n", "inner.optimizer");
  fprintf(f, "%-18s %.9g\n", "outer.lr", js->outer.lr);
  fprintf(f, "%-18s %.9g\n", "outer.momentum", js->outer.momentum);
  fprintf(f, "%-18s %s\n", "outer.nesterov", js->outer.nesterov ? "true" : "false");
  char origin[256];
  fprintf(f, "%-18s %s\n", "outer.origin", jobspec_outer_origin(js, origin, sizeof origin));
  if (js->outer.momentum_warmup || js->outer.momentum_decay)
    fprintf(f, "%-18s warm-up over the first %d rounds, decay to 0 over the last %d (%s; docs/design.md §3.4)\n",
            "outer.schedule", js->outer.momentum_warmup, js->outer.momentum_decay,
            jobspec_schedule_is_derived(js) ? "the default: a tenth and a fifth of the rounds" : "set by the job spec");
  else if (js->algorithm != JOB_ALGO_DILOCO_ASYNC)
    fprintf(f, "%-18s none (momentum %.9g every round)\n", "outer.schedule", js->outer.momentum);
  if (js->algorithm == JOB_ALGO_DILOCO_ASYNC) {
    static const char *const rules[] = {"delayed-nesterov", "nesterov", "sgd"};
    fprintf(f, "%-18s %s\n", "outer.rule",
            (unsigned)js->outer.async_rule < 3 ? rules[js->outer.async_rule] : "?");
    if (js->outer.buffer > 0) fprintf(f, "%-18s %d\n", "outer.delay_buffer", js->outer.buffer);
    else fprintf(f, "%-18s 0 (= slots)\n", "outer.delay_buffer");
    fprintf(f, "%-18s %.9g\n", "outer.c", js->outer.c);
    fprintf(f, "%-18s %d%s\n", "max_staleness", js->max_staleness, js->max_staleness ? "" : " (no limit)");
    fprintf(f, "%-18s %s, min_steps %d\n", "dylu", js->dylu.enabled ? "on" : "off", js->dylu.min_steps);
  }
  for (int l = 0; l < js->n_levels; l++)
    fprintf(f, "level.%-12d %slayers [%d, %d), %d module%s\n", l, js->levels[l].stem ? "stem + " : "",
            js->levels[l].layer_begin, js->levels[l].layer_end, js->levels[l].n_modules,
            js->levels[l].n_modules == 1 ? "" : "s");
  if (jobspec_streaming(js))
    fprintf(f, "%-18s fragments %d, overlap_steps %d, alpha %.9g, eager %s\n", "streaming", js->streaming.fragments,
            js->streaming.overlap_steps, js->streaming.alpha, js->streaming.eager ? "true" : "false");
  if (js->sparse.enabled) {
    fprintf(f, "%-18s density %.9g, chunk %d, value_bits %d, ef_beta %.9g%s\n", "sparse", js->sparse.density,
            js->sparse.chunk, js->sparse.value_bits, js->sparse.ef_beta,
            jobspec_sparse_pull(js) ? ", sparse pulls" : "");
    fprintf(f, "%-18s sparse (top-k of the error-feedback buffer)\n", "delta codec");
  } else {
    fprintf(f, "%-18s %s", "delta codec", dpc_codec_name(js->streaming.codec));
    if (dpc_codec_is_block(js->streaming.codec)) fprintf(f, " (block %d)", js->streaming.block_floats);
    fputc('\n', f);
  }
  fprintf(f, "%-18s %.9g\n", "quorum", js->quorum);
  fprintf(f, "%-18s %.9g\n", "round_timeout_s", js->round_timeout_s);
  if (js->has_quorum_grace) fprintf(f, "%-18s %.9g\n", "quorum_grace_s", js->quorum_grace_s);
  fprintf(f, "%-18s %s\n", "weighting", js->weighting == WEIGHTING_TOKENS ? "tokens" : "uniform");
}

static void text_job(FILE *f, const Dipaco__V1__Job *j) {
  const Dipaco__V1__JobSummary *s = view_job_summary(j);
  char b1[64], b2[64], b3[32];
  fprintf(f, "%-18s %llu\n", "job", (unsigned long long)s->job_id);
  fprintf(f, "%-18s %s\n", "name", s->name ? s->name : "");
  fprintf(f, "%-18s %s\n", "state", view_job_state_name(s->state));
  if (j->message && j->message[0]) fprintf(f, "%-18s %s\n", "message", j->message);
  fprintf(f, "%-18s %s\n", "algorithm", view_algorithm_name(s->algorithm));
  fprintf(f, "%-18s %llu / %llu\n", "round", (unsigned long long)s->round,
          (unsigned long long)s->rounds_total);
  fprintf(f, "%-18s %u\n", "paths", s->paths);
  fprintf(f, "%-18s %u\n", "active_leases", s->active_leases);
  fprintf(f, "%-18s %s\n", "last_loss", view_fmt_loss(s->last_loss, b3, sizeof b3));
  fprintf(f, "%-18s in %llu, out %llu bytes; peak sync %llu bytes\n", "traffic", (unsigned long long)s->bytes_in,
          (unsigned long long)s->bytes_out, (unsigned long long)s->peak_sync_bytes);
  if (s->last_outer_step_s > 0 || s->last_round_overhead_s > 0)
    fprintf(f, "%-18s last outer step %.3f s, last round overhead %.3f s (last delta in -> every slot has the new "
               "version)\n", "data plane", (double)s->last_outer_step_s, (double)s->last_round_overhead_s);
  const char *spec = j->spec_json ? j->spec_json : "";
  jobspec *js = malloc(sizeof *js);
  int have_spec = js && spec[0] && jobspec_parse_stored(spec, strlen(spec), js) == 0;
  if (s->tokens) {
    double per_token = (double)(s->bytes_in + s->bytes_out) / (double)s->tokens;
    fprintf(f, "%-18s %llu (%.4g bytes per token, both directions: pushed %.4g, pulled %.4g", "tokens",
            (unsigned long long)s->tokens, per_token, (double)s->bytes_in / (double)s->tokens,
            (double)s->bytes_out / (double)s->tokens);
    /* Data-parallel moves 2 x 4 bytes x parameters per inner step per worker (a ring
     * all-reduce of fp32 gradients), over batch x seq_len tokens. */
    gpt_layout *lay = have_spec && js->has_shape ? malloc(sizeof *lay) : NULL;
    if (lay && jobspec_layout(js, lay) == 0 && per_token > 0) {
      double dp = 8.0 * (double)lay->n_params / ((double)js->batch * (double)js->seq_len);
      fprintf(f, "; data-parallel %.4g: %.4gx fewer", dp, dp / per_token);
    }
    free(lay);
    fputs(")\n", f);
  }
  /* Of the inner steps leases were granted (ended leases), the share an outer step merged:
   * what preemption (work lost with a worker, rounds closed without a slot) cost. */
  if (j->steps_leased)
    fprintf(f, "%-18s %.3f (inner steps merged %llu / leased %llu)\n", "goodput",
            (double)j->steps_merged / (double)j->steps_leased, (unsigned long long)j->steps_merged,
            (unsigned long long)j->steps_leased);
  fprintf(f, "%-18s %s\n", "created", view_fmt_time(s->created_unix_ms, b1, sizeof b1));
  fprintf(f, "%-18s %s\n", "updated", view_fmt_time(s->updated_unix_ms, b2, sizeof b2));
  if (have_spec) text_spec(f, js);
  else if (spec[0]) fprintf(f, "%-18s %s\n", "spec_json", spec);
  free(js);
}

void view_print_job(int json, const Dipaco__V1__Job *j) {
  if (json) {
    json_job(stdout, j);
    fputc('\n', stdout);
  } else {
    text_job(stdout, j);
  }
}


void view_progress_bar(FILE *f, uint64_t id, const Dipaco__V1__JobSummary *s) {
  const int width = 30;
  double frac = s->rounds_total ? (double)s->round / (double)s->rounds_total : 0;
  if (frac > 1) frac = 1;
  int fill = (int)(frac * width + 0.5);
  char loss[32];
  fprintf(f, "\rjob %llu %-9s [", (unsigned long long)id, view_job_state_name(s->state));
  for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', f);
  fprintf(f, "] %llu/%llu rounds (%3.0f%%) loss %s\033[K", (unsigned long long)s->round,
          (unsigned long long)s->rounds_total, 100 * frac, view_fmt_loss(s->last_loss, loss, sizeof loss));
  fflush(f);
}
