/* llama_kernels.h — the CPU backend's single-threaded leaf kernels of the Llama-class layers
 * (docs/design.md §3.12): RMSNorm, rotary position embeddings (RoPE, with the "llama3"
 * frequency scaling), SwiGLU and grouped-query causal attention, forward and backward, in fp32.
 * Like cpu_kernels.h, each call handles one row or one head of one sequence; the caller splits
 * the work across threads and owns every buffer (no kernel allocates). All functions are pure
 * and thread-safe, and every reduction runs in a fixed order, so results are deterministic.
 *
 * Dimension letters: T positions of one sequence, C the model width, NH query heads, NKV
 * key/value heads (NH a multiple of NKV), D the head size, I the MLP's inner width. */
#ifndef DPC_LLAMA_KERNELS_H
#define DPC_LLAMA_KERNELS_H

/* ---- RMSNorm -------------------------------------------------------------------------- */

/* One row x [C]: rstd = 1/sqrt(mean(x^2) + eps); out = w * (x * rstd) (out [C], w [C]), the
 * order of Hugging Face's LlamaRMSNorm in fp32. Stores rstd for the backward. out may alias x. */
void llamak_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int C, float eps);

/* Backward of one row, with the forward's rstd: dx = rstd * (w*dout - xhat * mean(w*dout*xhat))
 * where xhat = x * rstd (dx += that instead when dx_acc); dw_acc += dout * xhat. dx must not
 * alias x or dout. */
void llamak_rmsnorm_bwd(float *dx, float *dw_acc, const float *dout, const float *x, const float *w, float rstd,
                        int C, int dx_acc);

/* ---- Rotary position embeddings ------------------------------------------------------- */

typedef enum { LLAMAK_ROPE_DEFAULT = 0, LLAMAK_ROPE_LLAMA3 = 1 } llamak_rope_type;

/* config.json's rope_theta and rope_scaling; the four numbers are read only for LLAMA3. */
typedef struct {
  llamak_rope_type type;
  double theta;            /* rope_theta */
  double factor;           /* rope_scaling.factor */
  double low_freq_factor;  /* rope_scaling.low_freq_factor */
  double high_freq_factor; /* rope_scaling.high_freq_factor */
  double original_max_position_embeddings;
} llamak_rope;

/* The D/2 inverse frequencies inv_freq [D/2]: 1 / theta^(2i/D), then for LLAMA3 the
 * wavelength bands of docs/design.md §3.12. Computed in double. Returns 0, or -1 (nothing
 * written) when D is not even and positive, theta <= 0, or for LLAMA3 factor < 1,
 * high_freq_factor <= low_freq_factor (where Hugging Face's _validate_llama3_parameters
 * warns), low_freq_factor <= 0 or original_max_position_embeddings <= 0 (a division by zero). */
int llamak_rope_inv_freq(double *inv_freq, int D, const llamak_rope *r);

/* Tables for positions [0, T): cos_t, sin_t [T, D/2] with cos_t[t*(D/2) + i] = cos(t *
 * inv_freq[i]), angle and cosine in double, rounded once to float. Position p of a sequence that
 * starts at p0 uses row p0 + p: pass cos_t + p0*(D/2). */
void llamak_rope_table(float *cos_t, float *sin_t, const double *inv_freq, int T, int D);

/* In place on one sequence's q or k block x [T, NH, D] (row t at x + t*ldx, heads contiguous,
 * ldx >= NH*D), rotate-half convention: for i < D/2, with (a, b) = (x[i], x[i + D/2]),
 * x[i] = a*cos - b*sin and x[i + D/2] = b*cos + a*sin, cos and sin of row t, entry i. */
void llamak_rope_fwd(float *x, int ldx, const float *cos_t, const float *sin_t, int T, int NH, int D);

/* Backward of llamak_rope_fwd, in place on the gradient dx [T, NH, D]: the same rotation with
 * -sin (a rotation's transpose is its inverse). */
void llamak_rope_bwd(float *dx, int ldx, const float *cos_t, const float *sin_t, int T, int NH, int D);

/* ---- SwiGLU --------------------------------------------------------------------------- */

/* h = silu(gate) * up over n columns, silu(g) = g / (1 + exp(-g)). h may alias gate or up. */
void llamak_swiglu_fwd(float *h, const float *gate, const float *up, int n);

/* Backward over n columns: dgate = dh * up * silu'(gate), dup = dh * silu(gate), with
 * silu'(g) = s * (1 + g * (1 - s)), s = sigmoid(g). dgate may alias gate or dh, and dup may
 * alias up (each element is read before it is written). */
void llamak_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up, int n);

/* ---- Grouped-query causal attention --------------------------------------------------- */

/* The key/value head that query head h reads: KV head j serves query heads j*rep ..
 * j*rep + rep - 1, rep = NH / NKV (Hugging Face's repeat_kv). */
static inline int llamak_kv_head(int h, int NH, int NKV) { return h / (NH / NKV); }

/* One query head of one sequence: q, out [T, D] with rows at q + t*ldq and out + t*ldo; the
 * head's KV head k, v [T, D] with rows at + t*ldkv (for [T, NH, D] and [T, NKV, D] blocks:
 * q + h*D, k + j*D, ldq = ldo = NH*D, ldkv = NKV*D). att [T, T] receives the probabilities,
 * row t = softmax_u<=t(q_t . k_u / sqrt(D)) and zeros for u > t; out_t = sum_u att[t][u] v_u. */
void llamak_attn_fwd(float *out, int ldo, float *att, const float *q, int ldq, const float *k, const float *v,
                     int ldkv, int T, int D);

/* Backward of llamak_attn_fwd for that query head, with its att: dq [T, D] (rows at dq + t*ldq)
 * is overwritten; dk, dv [T, D] (rows at + t*ldkv) are ACCUMULATED, since the rep query heads
 * of one KV head all add into it: call this for them in a fixed order (h ascending) from one
 * thread, so the sums are deterministic. dout [T, D] rows at dout + t*ldo. scratch holds T
 * floats. */
void llamak_attn_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, int ldo,
                     const float *att, const float *q, int ldq, const float *k, const float *v, int ldkv, int T,
                     int D);

#endif
