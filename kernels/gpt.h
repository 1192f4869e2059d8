/* gpt.h — the model families (GPT-2 and Llama-class) and the compute-backend interface
 * (docs/design.md §3).
 *
 * The model's parameters have one canonical flat layout, the same on every backend and on
 * the wire: the stem first, then each layer's tensors in order, every tensor in its Hugging
 * Face shape and under its HF name (docs/design.md §6.2). GPT-2: wte, wpe, ln_f, then per
 * layer h.l.* with linear weights in Conv1D [in, out] layout. Llama: model.embed_tokens,
 * model.norm, lm_head (only when untied), then per layer model.layers.l.* with linear weights
 * in nn.Linear [out, in] layout, q/k/v and gate/up stored back to back so each pair of
 * products runs as one. So a layer, a level of consecutive layers, or the stem is one
 * contiguous float range, a delta is a flat array, and safetensors export is a straight copy.
 * Backends may pad internally (e.g. the vocab on CUDA) but take and give parameters,
 * gradients and optimizer state in this layout.
 *
 * A gpt_model is created for one backend and a maximum batch shape (B, T); it owns its
 * parameters, gradients, AdamW moments and activations. It is not thread-safe: one thread
 * drives a model (backends use their own threads inside a call). */
#ifndef DPC_GPT_H
#define DPC_GPT_H

#include <stddef.h>
#include <stdint.h>

#define GPT_MAX_TENSORS (4 + 12 * 256)
#define GPT_NAME_MAX 64

typedef enum { GPT_ARCH_GPT2 = 0, GPT_ARCH_LLAMA = 1 } gpt_arch;
typedef enum { GPT_ROPE_DEFAULT = 0, GPT_ROPE_LLAMA3 = 1 } gpt_rope_scaling;

/* The first five fields describe both families (a GPT-2 config is just those, the rest zero:
 * positional initialisers {L, NH, C, maxT, V} stay GPT-2). The Llama fields mirror HF
 * LlamaConfig's keys; head_dim is C/NH. Fields are ordered so the struct has no padding:
 * configs are compared with memcmp. */
typedef struct {
  int n_layer;     /* L (num_hidden_layers) */
  int n_head;      /* NH (num_attention_heads) */
  int n_embd;      /* C (hidden_size) */
  int n_positions; /* maxT (max_position_embeddings) */
  int vocab_size;  /* V */
  int arch;        /* gpt_arch */
  /* Llama only (zero for GPT-2): */
  int n_kv_head;         /* NKV (num_key_value_heads); NH a multiple of NKV */
  int intermediate_size; /* I, the MLP's inner width */
  int tie_word_embeddings; /* 1: lm_head is embed_tokens (no lm_head.weight tensor) */
  int attention_bias;    /* 1: q/k/v projections have biases (Qwen2) */
  int rope_scaling;      /* gpt_rope_scaling */
  int rope_original_max_position_embeddings; /* LLAMA3 scaling only */
  double rms_norm_eps;
  double rope_theta;
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* LLAMA3 scaling only */
} gpt_config;

/* One tensor of the canonical layout. */
typedef struct {
  char name[GPT_NAME_MAX]; /* HF name: "wte.weight", "h.3.mlp.c_fc.bias" (GPT-2, without the
                            * "transformer." prefix), "model.layers.3.self_attn.q_proj.weight" */
  int ndim;                /* 1 or 2 */
  int shape[2];            /* HF shape; GPT-2 Conv1D weights are [in, out], Llama's [out, in] */
  size_t offset;           /* in floats, into the flat parameter array */
  size_t numel;
  int decay;               /* 1: AdamW weight decay applies (2-D tensors: matrices and
                            * embeddings, never a norm's gain or a bias) */
  int layer;               /* -1 for the stem, else the transformer layer index */
  int muon;                /* 1: a transformer block's matrix, which the Muon inner optimizer
                            * steps (gpt_muon_step); everything else stays with AdamW */
} gpt_tensor;

typedef struct {
  gpt_config cfg;
  int n_tensors;
  gpt_tensor tensors[GPT_MAX_TENSORS];
  size_t n_params;     /* total floats */
  size_t stem_end;     /* stem tensors are [0, stem_end) */
  size_t layer_off[257]; /* layer l is [layer_off[l], layer_off[l+1]); layer_off[L] = n_params */
} gpt_layout;

/* Validate a config (positive sizes, C divisible by NH, bounds; for Llama also NH divisible by
 * NKV, an even head size, eps, rope_theta and the llama3 scaling numbers); DPC_EINVAL with
 * detail naming the field. */
int gpt_config_validate(const gpt_config *cfg);

/* "gpt2" or "llama" for cfg->arch. */
const char *gpt_arch_name(int arch);

/* Fill `lay` for `cfg` (validates cfg).
 * GPT-2 order: wte.weight [V,C], wpe.weight [maxT,C], ln_f.weight [C], ln_f.bias [C]; then per
 * layer l: h.l.ln_1.weight, h.l.ln_1.bias, h.l.attn.c_attn.weight [C,3C], h.l.attn.c_attn.bias
 * [3C], h.l.attn.c_proj.weight [C,C], h.l.attn.c_proj.bias [C], h.l.ln_2.weight, h.l.ln_2.bias,
 * h.l.mlp.c_fc.weight [C,4C], h.l.mlp.c_fc.bias [4C], h.l.mlp.c_proj.weight [4C,C],
 * h.l.mlp.c_proj.bias [C].
 * Llama order (D = C/NH, P = model.layers.l.): model.embed_tokens.weight [V,C],
 * model.norm.weight [C], lm_head.weight [V,C] (untied only); then per layer
 * P input_layernorm.weight [C], P self_attn.q_proj.weight [NH*D,C], P self_attn.k_proj.weight
 * [NKV*D,C], P self_attn.v_proj.weight [NKV*D,C], with attention_bias P self_attn.q_proj.bias
 * [NH*D], P self_attn.k_proj.bias [NKV*D], P self_attn.v_proj.bias [NKV*D]; then
 * P self_attn.o_proj.weight [C,NH*D], P post_attention_layernorm.weight [C],
 * P mlp.gate_proj.weight [I,C], P mlp.up_proj.weight [I,C], P mlp.down_proj.weight [C,I]. */
int gpt_layout_build(const gpt_config *cfg, gpt_layout *lay);

/* A Llama layer's tensor groups. q/k/v (and, with attention_bias, their biases) and gate/up
 * are adjacent in the layout, so each group is one range: GPT_LL_QKV is [NH*D + 2*NKV*D, C],
 * GPT_LL_QKV_B [NH*D + 2*NKV*D], GPT_LL_GU [2*I, C]. */
enum { GPT_LL_LN1, GPT_LL_QKV, GPT_LL_QKV_B, GPT_LL_O, GPT_LL_LN2, GPT_LL_GU, GPT_LL_DOWN, GPT_LL_N };

/* Pointers into base (any array in the canonical layout of a Llama `lay`: parameters,
 * gradients, optimizer state) to layer l's groups; w[GPT_LL_QKV_B] is NULL without
 * attention_bias. Both backends read the layout through this one function. */
void gpt_llama_layer_ptrs(const gpt_layout *lay, float *base, int l, float *w[GPT_LL_N]);

/* Index of the tensor called `name` (for GPT-2 an optional "transformer." prefix is
 * accepted), or -1. */
int gpt_layout_find(const gpt_layout *lay, const char *name);

/* Initialisation of docs/design.md §3 into params[n_params], deterministic in `seed`:
 * weights and embeddings N(0, 0.02), the residual projections (GPT-2 attn.c_proj and
 * mlp.c_proj, Llama o_proj and down_proj) N(0, 0.02/sqrt(2L)), biases 0, norm gains 1 and
 * LayerNorm biases 0. */
void gpt_init_params(const gpt_layout *lay, float *params, uint64_t seed);

/* The lengths of the tensors that make up the flat range [off, off + len) (a fragment), in
 * layout order, into tlen[0..cap); returns how many (which may exceed cap), or DPC_EINVAL if
 * the range does not start and end on tensor boundaries. SparseLoCo chunks each of them. */
int gpt_layout_range_tensors(const gpt_layout *lay, size_t off, size_t len, uint64_t *tlen, int cap);

/* Per-float weight-decay mask helper: 1 if flat index i lies in a decayed tensor. */
int gpt_layout_decays(const gpt_layout *lay, size_t i);

/* The matrix Muon orthogonalises for a tensor with t->muon set, in nn.Linear orientation
 * [out, in] = [A, B]: Llama's weights are stored that way; GPT-2's Conv1D weights are stored
 * [in, out], so Muon sees their transpose. GPT-2's fused c_attn is one matrix (A = 3C, B = C);
 * Llama's q/k/v and gate/up are one matrix each. Newton-Schulz works on that matrix, or on its
 * transpose when it is taller than wide: the work matrix is p x q with p <= q, and flip says
 * whether it is the stored tensor transposed. Both backends take their shapes from here. */
typedef struct {
  int A, B, p, q, flip;
} gpt_muon_shape;
gpt_muon_shape gpt_muon_shape_of(const gpt_layout *lay, const gpt_tensor *t);

typedef enum { GPT_BACKEND_CPU = 0, GPT_BACKEND_CUDA = 1 } gpt_backend_kind;

typedef struct {
  gpt_backend_kind kind;
  int threads;   /* CPU: worker threads (OpenMP and OpenBLAS); 0 = all cores */
  int device;    /* CUDA: device ordinal */
  int precision; /* CUDA: 0 fp32, 1 tf32, 2 bf16 */
} gpt_backend_opts;

typedef struct {
  float beta1, beta2, eps, weight_decay;
  float grad_clip; /* global L2 norm bound, 0 disables */
} gpt_adamw_hparams;

/* The per-step AdamW scalars, computed as torch does (Python floats, i.e. double, rounded once
 * to float); every backend's AdamW takes them from gpt_adamw_scalars_at. */
typedef struct {
  float decay_mul;        /* 1 - lr * weight_decay (decayed tensors only) */
  float one_minus_beta1, one_minus_beta2;
  float neg_step_size;    /* -lr / (1 - beta1^t) */
  float bc2_sqrt;         /* sqrt(1 - beta2^t) */
} gpt_adamw_scalars;
void gpt_adamw_scalars_at(const gpt_adamw_hparams *hp, float lr, int t, gpt_adamw_scalars *s);

/* Muon, the inner optimizer of the transformer blocks' matrices (docs/design.md §3), exactly
 * torch.optim.Muon's step with its Newton-Schulz iteration run in fp32. */
enum { GPT_MUON_ADJUST_ORIGINAL = 0, GPT_MUON_ADJUST_MATCH_RMS_ADAMW = 1 };
typedef struct {
  float momentum;     /* mu in [0, 1) */
  float weight_decay; /* decoupled: theta *= 1 - lr * weight_decay */
  int nesterov;       /* 1: the update is lerp(g, buf, mu); 0: buf */
  int ns_steps;       /* Newton-Schulz iterations, 1..20 */
  int adjust;         /* GPT_MUON_ADJUST_*: the lr multiplier sqrt(max(1, A/B)) or 0.2 sqrt(max(A, B)) */
} gpt_muon_hparams;

/* The Newton-Schulz coefficients (a, b, c) of torch.optim.Muon. */
#define GPT_MUON_NS_A 3.4445f
#define GPT_MUON_NS_B (-4.7750f)
#define GPT_MUON_NS_C 2.0315f

/* The learning-rate multiplier of an A x B Muon matrix under `adjust` (computed in double, as
 * torch's Python floats). */
double gpt_muon_adjust(int adjust, int A, int B);

/* Parse "original" or "match_rms_adamw"; DPC_EINVAL otherwise. gpt_muon_adjust_name inverts it. */
int gpt_muon_adjust_parse(const char *s, int *out);
const char *gpt_muon_adjust_name(int adjust);

typedef struct gpt_model gpt_model;

/* The backend vtable; kernels/cpu and kernels/cuda each provide one. */
typedef struct {
  const char *name;
  int (*create)(gpt_model *m);
  void (*destroy)(gpt_model *m);
  int (*set_params)(gpt_model *m, const float *src, size_t off, size_t n);
  int (*get_params)(gpt_model *m, float *dst, size_t off, size_t n);
  int (*get_grads)(gpt_model *m, float *dst, size_t off, size_t n);
  int (*forward)(gpt_model *m, const int *inputs, const int *targets, int B, int T, float *loss);
  int (*logits)(gpt_model *m, int b, int t, float *dst);
  int (*zero_grad)(gpt_model *m);
  int (*backward)(gpt_model *m);
  int (*adamw_step)(gpt_model *m, const gpt_adamw_hparams *hp, float lr, int t, float *grad_norm);
  int (*get_opt_state)(gpt_model *m, float *m_dst, float *v_dst);
  int (*set_opt_state)(gpt_model *m, const float *m_src, const float *v_src);
  int (*reset_opt_state)(gpt_model *m);
  int (*describe)(gpt_model *m, char *name, size_t len, uint64_t *mem_bytes);
  int (*hidden)(gpt_model *m, int b, int t, float *dst);
  /* NULL where the backend has no Muon (gpt_muon_step then fails saying so). */
  int (*muon_step)(gpt_model *m, const gpt_adamw_hparams *hp, const gpt_muon_hparams *mu, float lr, float muon_lr,
                   int t, float *grad_norm);
} gpt_backend_ops;

struct gpt_model {
  gpt_layout lay;
  gpt_backend_opts opts;
  int maxB, maxT;               /* activation buffers are sized for these */
  const gpt_backend_ops *ops;
  void *impl;                   /* backend-private state */
};

/* Create a model for `cfg` on the backend in `opts` with activations for up to B x T
 * (T <= n_positions). Parameters start at zero; load or init them with gpt_set_params.
 * The caller frees with gpt_free. DPC_EUNSUPPORTED if the backend was not built. */
int gpt_create(gpt_model **out, const gpt_config *cfg, const gpt_backend_opts *opts, int B, int T);
void gpt_free(gpt_model *m);

/* Copy the flat range [off, off+n) of parameters in or out (canonical layout). */
int gpt_set_params(gpt_model *m, const float *src, size_t off, size_t n);
int gpt_get_params(gpt_model *m, float *dst, size_t off, size_t n);
/* Gradients of the last backward, same layout. */
int gpt_get_grads(gpt_model *m, float *dst, size_t off, size_t n);

/* Forward pass on token ids inputs[B*T] (each in [0, V)). With targets (B*T ids) it computes
 * the mean cross-entropy into *loss; targets may be NULL (then *loss is untouched and only
 * logits are available). B <= maxB, T <= maxT. */
int gpt_forward(gpt_model *m, const int *inputs, const int *targets, int B, int T, float *loss);
/* Copy the V logits at position (b, t) of the last forward into dst[V]. */
int gpt_logits(gpt_model *m, int b, int t, float *dst);
/* Copy the C floats of the final hidden state (after ln_f / model.norm) at position (b, t) of the last
 * forward into dst[C] (DiPaCo routing features); DPC_EUNSUPPORTED if the backend lacks it. */
int gpt_hidden(gpt_model *m, int b, int t, float *dst);
int gpt_zero_grad(gpt_model *m);
/* Backward of the last forward (which must have had targets); accumulates into gradients. */
int gpt_backward(gpt_model *m);
/* Clip gradients by global L2 norm (hp->grad_clip, PyTorch clip_grad_norm_ semantics) and take
 * one torch.optim.AdamW step with learning rate lr and 1-based step count t. Weight decay only
 * on decayed tensors. *grad_norm (may be NULL) receives the pre-clip global norm. */
int gpt_adamw_step(gpt_model *m, const gpt_adamw_hparams *hp, float lr, int t, float *grad_norm);
/* The MuLoCo inner step (docs/design.md §3): clip all gradients by their global L2 norm as
 * gpt_adamw_step does, then one AdamW step (lr, step count t, hp) on the tensors without the
 * muon flag and one torch.optim.Muon step (learning rate muon_lr, mu) on those with it. Muon's
 * momentum buffer lives in the AdamW first-moment array at the Muon tensors' positions (their
 * second-moment positions stay zero), so gpt_get/set/reset_opt_state carry it unchanged.
 * DPC_EUNSUPPORTED on a backend without Muon. */
int gpt_muon_step(gpt_model *m, const gpt_adamw_hparams *hp, const gpt_muon_hparams *mu, float lr, float muon_lr,
                  int t, float *grad_norm);
/* 1 if the model's backend has gpt_muon_step (callers refuse Muon work up front). */
int gpt_has_muon(const gpt_model *m);
/* AdamW first/second moments in canonical layout (n_params floats each); with Muon, m holds
 * the Muon tensors' momentum buffers and v is zero there. */
int gpt_get_opt_state(gpt_model *m, float *m_dst, float *v_dst);
int gpt_set_opt_state(gpt_model *m, const float *m_src, const float *v_src);
int gpt_reset_opt_state(gpt_model *m);
/* What the model runs on, for operators: name[len] gets e.g. "NVIDIA H100 80GB HBM3 (sm_90)"
 * or "AMD EPYC 7B13 (16 threads)", *mem_bytes the device's (or host's) memory (may be NULL). */
int gpt_describe(gpt_model *m, char *name, size_t len, uint64_t *mem_bytes);

/* Learning rate at global inner step s (0-based) per docs/design.md §3: linear warmup, then cosine
 * to lr_min_frac·lr at total_steps (lr_min_frac = 1 gives a constant rate). */
float gpt_lr_at(float lr, int warmup, int total_steps, float lr_min_frac, long s);

/* Parse "cpu" or "cuda"; DPC_EINVAL otherwise. */
int gpt_backend_parse(const char *s, gpt_backend_kind *out);

enum { GPT_PREC_FP32 = 0, GPT_PREC_TF32 = 1, GPT_PREC_BF16 = 2 };
/* Parse "fp32", "tf32" or "bf16" into a gpt_backend_opts.precision; DPC_EINVAL otherwise. */
int gpt_precision_parse(const char *s, int *out);

#endif
