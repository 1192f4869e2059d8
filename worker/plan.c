/* plan.c — check a granted lease and turn it into a lease_plan (plan.h). */
#include "worker/plan.h"
#include "common/codec.h"
#include "common/sparse.h"
#include "common/errors.h"
#include "common/log.h"
#include "worker/data.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAGMENTS 4096

static int finite_pos(float x) { return isfinite(x) && x > 0; }

static int check_model(const Dipaco__V1__ModelShape *m, lease_plan *p) {
  if (m->num_layers > 256 || m->num_heads > 4096 || m->channels > 65536 || m->max_seq_len > 1048576 ||
      m->vocab_size > 16777216)
    return dpc_err(DPC_ERANGE, "lease: model shape out of range (L=%u NH=%u C=%u maxT=%u V=%u)", m->num_layers,
                   m->num_heads, m->channels, m->max_seq_len, m->vocab_size);
  p->cfg = (gpt_config){.n_layer = (int)m->num_layers, .n_head = (int)m->num_heads, .n_embd = (int)m->channels,
                        .n_positions = (int)m->max_seq_len, .vocab_size = (int)m->vocab_size};
  if (m->arch > GPT_ARCH_LLAMA) return dpc_err(DPC_EUNSUPPORTED, "lease: model family %u is not known to this worker", m->arch);
  if (m->arch == GPT_ARCH_LLAMA) { /* GPT-2 leases leave the Llama fields zero, as gpt_config does */
    if (m->num_key_value_heads > 4096 || m->intermediate_size > (1u << 24) || m->rope_scaling > GPT_ROPE_LLAMA3 ||
        m->rope_original_max_position_embeddings > (1u << 30))
      return dpc_err(DPC_ERANGE, "lease: Llama shape out of range (NKV=%u I=%u)", m->num_key_value_heads,
                     m->intermediate_size);
    p->cfg.arch = GPT_ARCH_LLAMA;
    p->cfg.n_kv_head = (int)m->num_key_value_heads;
    p->cfg.intermediate_size = (int)m->intermediate_size;
    p->cfg.tie_word_embeddings = m->tie_word_embeddings;
    p->cfg.attention_bias = m->attention_bias;
    p->cfg.rms_norm_eps = m->rms_norm_eps;
    p->cfg.rope_theta = m->rope_theta;
    p->cfg.rope_scaling = (int)m->rope_scaling;
    if (p->cfg.rope_scaling == GPT_ROPE_LLAMA3) {
      p->cfg.rope_factor = m->rope_factor;
      p->cfg.rope_low_freq_factor = m->rope_low_freq_factor;
      p->cfg.rope_high_freq_factor = m->rope_high_freq_factor;
      p->cfg.rope_original_max_position_embeddings = (int)m->rope_original_max_position_embeddings;
    }
  }
  return gpt_config_validate(&p->cfg);
}

/* hyper.total_steps, or when it is not filled in the job spec's rounds × inner_steps (0 if
 * neither says). */
static uint64_t total_steps_of(const Dipaco__V1__Lease *L) {
  uint64_t total_steps = L->hyper->total_steps;
  if (total_steps != 0) return total_steps;
  cJSON *root = L->spec_json ? cJSON_Parse(L->spec_json) : NULL;
  const cJSON *ro = cJSON_GetObjectItemCaseSensitive(root, "rounds");
  const cJSON *hs = cJSON_GetObjectItemCaseSensitive(root, "inner_steps");
  if (cJSON_IsNumber(ro) && cJSON_IsNumber(hs) && ro->valuedouble >= 1 && hs->valuedouble >= 1 &&
      ro->valuedouble * hs->valuedouble <= INT32_MAX) {
    total_steps = (uint64_t)ro->valuedouble * (uint64_t)hs->valuedouble;
    DPC_WARN("lease %" PRIu64 ": hyper.total_steps is 0; using the spec's rounds x inner_steps = %" PRIu64,
             L->lease_id, total_steps);
  }
  cJSON_Delete(root);
  return total_steps;
}

/* Batch shape, AdamW and the schedule; *total_steps receives the schedule's length. */
static int check_hyper(const Dipaco__V1__Lease *L, uint64_t *total_steps) {
  const Dipaco__V1__ModelShape *m = L->model;
  const Dipaco__V1__Hyper *h = L->hyper;
  if (h->batch_size < 1 || h->batch_size > 65536 || h->seq_len < 1 || h->seq_len > m->max_seq_len)
    return dpc_err(DPC_EINVAL, "lease: batch_size %u / seq_len %u invalid (seq_len ≤ max_seq_len %u)", h->batch_size,
                   h->seq_len, m->max_seq_len);
  if (h->grad_accum > 1)
    return dpc_err(DPC_EUNSUPPORTED, "lease: grad_accum %u is not supported by this worker", h->grad_accum);
  if (!finite_pos(h->lr) || !isfinite(h->lr_min_frac) || h->lr_min_frac < 0 || h->lr_min_frac > 1 ||
      !isfinite(h->weight_decay) || h->weight_decay < 0 || !isfinite(h->beta1) || h->beta1 < 0 || h->beta1 >= 1 ||
      !isfinite(h->beta2) || h->beta2 < 0 || h->beta2 >= 1 || !finite_pos(h->eps) || !isfinite(h->grad_clip) ||
      h->grad_clip < 0)
    return dpc_err(DPC_EINVAL, "lease: hyperparameters out of range (lr %g, lr_min_frac %g, wd %g, betas %g %g, "
                   "eps %g, clip %g)", h->lr, h->lr_min_frac, h->weight_decay, h->beta1, h->beta2, h->eps,
                   h->grad_clip);
  *total_steps = total_steps_of(L);
  if (*total_steps < 1 || *total_steps > INT32_MAX || h->warmup_steps > *total_steps)
    return dpc_err(DPC_EINVAL, "lease: total_steps %" PRIu64 " / warmup_steps %" PRIu64 " invalid", *total_steps,
                   h->warmup_steps);
  /* The schedule position of the first step lies on the schedule (first_step is bounded by
   * check_window). */
  if (L->first_step <= INT32_MAX &&
      (L->schedule_shift < -(int64_t)L->first_step || L->schedule_shift > (int64_t)*total_steps - (int64_t)L->first_step))
    return dpc_err(DPC_EINVAL, "lease: schedule_shift %" PRId64 " puts step %" PRIu64 " outside the LR schedule [0, %" PRIu64 "]",
                   L->schedule_shift, L->first_step, *total_steps);
  return 0;
}

/* The inner optimizer (Lease fields 40-46, docs/design.md §3.2) into o. */
static int check_muon(const Dipaco__V1__Lease *L, trainer_opts *o) {
  if (L->inner_optimizer == DIPACO__V1__INNER_OPTIMIZER__INNER_OPTIMIZER_ADAMW) return 0;
  if (L->inner_optimizer != DIPACO__V1__INNER_OPTIMIZER__INNER_OPTIMIZER_MUON)
    return dpc_err(DPC_EUNSUPPORTED, "lease: inner optimizer %d is not supported by this worker", L->inner_optimizer);
  if (!finite_pos(L->muon_lr) || !(L->muon_momentum >= 0 && L->muon_momentum < 1) || L->muon_ns_steps < 1 ||
      L->muon_ns_steps > 20 || !(L->muon_weight_decay >= 0 && isfinite(L->muon_weight_decay)) ||
      (L->muon_adjust_lr != DIPACO__V1__MUON_ADJUST_LR__MUON_ADJUST_LR_ORIGINAL &&
       L->muon_adjust_lr != DIPACO__V1__MUON_ADJUST_LR__MUON_ADJUST_LR_MATCH_RMS_ADAMW))
    return dpc_err(DPC_EINVAL, "lease: Muon settings out of range (lr %g, momentum %g, ns_steps %u, weight_decay %g, "
                   "adjust_lr %d)", L->muon_lr, L->muon_momentum, L->muon_ns_steps, L->muon_weight_decay,
                   (int)L->muon_adjust_lr);
  o->muon = 1;
  o->muon_lr = L->muon_lr;
  o->mu = (gpt_muon_hparams){.momentum = L->muon_momentum, .weight_decay = L->muon_weight_decay,
                             .nesterov = L->muon_nesterov, .ns_steps = (int)L->muon_ns_steps,
                             .adjust = L->muon_adjust_lr == DIPACO__V1__MUON_ADJUST_LR__MUON_ADJUST_LR_MATCH_RMS_ADAMW
                                           ? GPT_MUON_ADJUST_MATCH_RMS_ADAMW : GPT_MUON_ADJUST_ORIGINAL};
  return 0;
}

/* The steps and the data window: what this worker's data order can serve. */
static int check_window(const Dipaco__V1__Lease *L) {
  const Dipaco__V1__DataWindow *d = L->data;
  if (L->inner_steps < 1 || L->inner_steps > 10000000 || L->first_step > INT32_MAX)
    return dpc_err(DPC_EINVAL, "lease: inner_steps %u / first_step %" PRIu64 " invalid", L->inner_steps,
                   L->first_step);
  if (d->replicas < 1 || d->replica >= d->replicas || d->replicas > 1000000)
    return dpc_err(DPC_EINVAL, "lease: data replica %u of %u invalid", d->replica, d->replicas);
  if (d->first_batch != L->first_step)
    return dpc_err(DPC_EUNSUPPORTED, "lease: data.first_batch %" PRIu64 " differs from first_step %" PRIu64
                   " (not supported: the batch index is the slot's step)", d->first_batch, L->first_step);
  if (d->shuffle) return dpc_err(DPC_EUNSUPPORTED, "lease: shuffled data order is not supported by this worker");
  if (d->path_index && d->path_index[0])
    return dpc_err(DPC_EUNSUPPORTED, "lease: DiPaCo routing index \"%s\" is not supported by this worker",
                   d->path_index);
  if (L->delta_codec == (Dipaco__V1__Codec)DPC_CODEC_SPARSE) {
    dpc_sparse_cfg sc = {.density = L->sparse_density, .chunk = L->sparse_chunk, .value_bits = L->sparse_value_bits};
    if (dpc_sparse_cfg_check(&sc) < 0) return dpc_err(DPC_EINVAL, "lease: sparse codec: %s", dpc_errmsg());
    if (!(L->sparse_ef_beta >= 0.0 && L->sparse_ef_beta < 1.0))
      return dpc_err(DPC_EINVAL, "lease: sparse_ef_beta %g outside [0, 1)", L->sparse_ef_beta);
    if (L->streaming) return dpc_err(DPC_EUNSUPPORTED, "lease: a streaming lease with sparse deltas is not supported");
    if (L->algorithm != DIPACO__V1__ALGORITHM__ALGORITHM_SYNC)
      return dpc_err(DPC_EUNSUPPORTED, "lease: sparse deltas are for sync rounds");
  } else if (!dpc_codec_supported((int)L->delta_codec))
    return dpc_err(DPC_EUNSUPPORTED, "lease: delta codec %d is not supported by this worker", L->delta_codec);
  size_t bytes;
  if (L->delta_codec != (Dipaco__V1__Codec)DPC_CODEC_SPARSE &&
      (dpc_codec_bytes((int)L->delta_codec, 1, L->delta_block_floats, &bytes) < 0 ||
       (dpc_codec_is_block((int)L->delta_codec) && L->delta_block_floats > (1u << 20))))
    return dpc_err(DPC_EINVAL, "lease: delta codec %s with block_floats %u", dpc_codec_name((int)L->delta_codec),
                   L->delta_block_floats);
  if (L->n_fragments < 1 || L->n_fragments > MAX_FRAGMENTS)
    return dpc_err(DPC_ERANGE, "lease: %zu fragments (need 1..%d)", L->n_fragments, MAX_FRAGMENTS);
  return 0;
}

/* The path's parameter count (from the canonical layout) and each fragment's place in it. */
static int place_fragments(const Dipaco__V1__Lease *L, lease_plan *p) {
  gpt_layout *lay = malloc(sizeof *lay);
  if (!lay) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  int rc = gpt_layout_build(&p->cfg, lay);
  p->n_params = lay->n_params;
  free(lay);
  if (rc) return rc;
  size_t n = L->n_fragments;
  uint32_t *lv = malloc(n * sizeof *lv);
  uint64_t *mo = malloc(n * sizeof *mo), *of = malloc(n * sizeof *of), *ln = malloc(n * sizeof *ln);
  p->abs_off = malloc(n * sizeof *p->abs_off);
  if (!lv || !mo || !of || !ln || !p->abs_off) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
  for (size_t i = 0; i < n && !rc; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    if ((f->sync_offset || f->overlap_steps || f->merge_alpha != 0) && !L->streaming)
      rc = dpc_err(DPC_EFORMAT, "lease: fragment %" PRIu64 " has streaming settings in a lease that is not streaming",
                   f->fragment_id);
    if (L->streaming && (f->sync_offset >= L->inner_steps || f->overlap_steps >= L->inner_steps ||
                         !isfinite(f->merge_alpha) || f->merge_alpha < 0 || f->merge_alpha >= 1))
      rc = dpc_err(DPC_EINVAL, "lease: fragment %" PRIu64 ": sync_offset %u / overlap_steps %u / merge_alpha %g out of "
                   "range for H = %u", f->fragment_id, f->sync_offset, f->overlap_steps, f->merge_alpha, L->inner_steps);
    for (size_t j = 0; j < i && !rc; j++)
      if (L->fragments[j]->fragment_id == f->fragment_id)
        rc = dpc_err(DPC_EFORMAT, "lease: fragment id %" PRIu64 " listed twice", f->fragment_id);
    lv[i] = f->level;
    mo[i] = f->module_id;
    of[i] = f->offset_floats;
    ln[i] = f->num_floats;
  }
  if (!rc) rc = worker_place_fragments(n, lv, mo, of, ln, p->n_params, p->abs_off);
  free(lv);
  free(mo);
  free(of);
  free(ln);
  return rc;
}

int lease_plan_build(const Dipaco__V1__Lease *L, lease_plan *p) {
  memset(p, 0, sizeof *p);
  if (!L->model || !L->hyper || !L->data || !L->slot)
    return dpc_err(DPC_EFORMAT, "lease: model, hyper, data or slot missing");
  uint64_t total_steps = 0;
  int rc = check_model(L->model, p);
  if (!rc) rc = check_hyper(L, &total_steps);
  if (!rc) rc = check_window(L);
  if (rc) return rc;
  const Dipaco__V1__Hyper *h = L->hyper;
  const Dipaco__V1__DataWindow *d = L->data;
  p->opts = (trainer_opts){.B = (int)h->batch_size, .T = (int)h->seq_len, .total_steps = (long)total_steps,
                           .lr = h->lr, .lr_min_frac = h->lr_min_frac, .warmup = (int)h->warmup_steps,
                           .hp = {.beta1 = h->beta1, .beta2 = h->beta2, .eps = h->eps,
                                  .weight_decay = h->weight_decay, .grad_clip = h->grad_clip},
                           .replica = (int)d->replica, .n_replicas = (int)d->replicas};
  if ((rc = check_muon(L, &p->opts))) return rc;
  return place_fragments(L, p);
}

void lease_plan_free(lease_plan *p) {
  free(p->abs_off);
  p->abs_off = NULL;
}
