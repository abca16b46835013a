/* Row-wise operations of a Llama layer on CPU, one pass over memory each where torch runs
 * several ops (each with its own temporary): RMSNorm (with the residual sum before it), rotary
 * embeddings, SwiGLU's silu(gate) * up, and the argmax of greedy sampling. float32.
 * worker.model.native_ops builds and calls this.
 *
 * Built WITHOUT -ffast-math and with -ffp-contract=off: every product and sum is rounded as in
 * the torch code it replaces (rope bit for bit; RMSNorm up to the order of its sum of squares;
 * SwiGLU up to its exponential's last place), so the engine keeps transformers' greedy tokens.
 */
#include <math.h>
#include <stdint.h>

#include "vector_math.h"

/* o = weight * (x * (1 / sqrt(mean(x^2) + eps))), one row */
static void norm_row(const float *xr, const float *weight, float *o, int64_t hidden, float eps)
{
    /* eight partial sums (vectorisable without reassociation flags) */
    float part[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= hidden; j += 8)
        for (int k = 0; k < 8; k++)
            part[k] += xr[j + k] * xr[j + k];
    float sum = ((part[0] + part[4]) + (part[1] + part[5])) +
                ((part[2] + part[6]) + (part[3] + part[7]));
    for (; j < hidden; j++)
        sum += xr[j] * xr[j];
    const float inv = 1.f / sqrtf(sum / (float)hidden + eps);
    for (j = 0; j < hidden; j++)
        o[j] = weight[j] * (xr[j] * inv);
}

/* out[r] = weight * (x[r] * (1 / sqrt(mean(x[r]^2) + eps))); x rows x_stride apart, out
 * contiguous [rows, hidden] */
void rms_norm_f32(const float *x, int64_t x_stride, const float *weight, float *out, int64_t rows,
                  int64_t hidden, float eps, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * x_stride, weight, out + r * hidden, hidden, eps);
}

/* A layer's residual sum and the next norm in one pass: residual[r] = branch[r] + residual[r]
 * (in place), out[r] = the norm of it as rms_norm_f32; all [rows, hidden] contiguous */
void add_rms_norm_f32(const float *branch, float *residual, const float *weight, float *out,
                      int64_t rows, int64_t hidden, float eps, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++) {
        float *xr = residual + r * hidden;
        const float *br = branch + r * hidden;
        for (int64_t j = 0; j < hidden; j++)
            xr[j] = br[j] + xr[j];
        norm_row(xr, weight, out + r * hidden, hidden, eps);
    }
}

/* In place, heads [0, num_heads) of each token: x = x * cos + rotate_half(x) * sin, where
 * rotate_half(x) = [-x2, x1]; x: tokens token_stride apart, heads head_dim apart;
 * cos, sin: [tokens, head_dim] contiguous */
void rope_f32(float *x, int64_t token_stride, const float *cos_t, const float *sin_t,
              int64_t tokens, int64_t num_heads, int64_t head_dim, int num_threads)
{
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_t + t * head_dim, *s = sin_t + t * head_dim;
        for (int64_t h = 0; h < num_heads; h++) {
            float *v = x + t * token_stride + h * head_dim;
            for (int64_t j = 0; j < half; j++) {
                const float x1 = v[j], x2 = v[j + half];
                const float a = x1 * c[j], b = (-x2) * s[j];
                const float a2 = x2 * c[j + half], b2 = x1 * s[j + half];
                v[j] = a + b;
                v[j + half] = a2 + b2;
            }
        }
    }
}

/* index of row r's first maximum, NaN counting as the greatest (torch.max(dim=-1)); rows
 * stride apart, 0 < cols < 2^31 */
static int64_t argmax_row(const float *x, int64_t cols)
{
    int64_t j = 0, at = 0;
    float top = x[0];
    if (cols >= 32) {
        /* two sets of 16 lanes, each lane the first maximum of its own columns so far */
        const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        vf b0 = *(const vf *)x, b1 = *(const vf *)(x + 16);
        vi i0 = lane, i1 = lane + 16, nan = (b0 != b0) | (b1 != b1);
        for (j = 32; j + 32 <= cols; j += 32) {
            const vf v0 = *(const vf *)(x + j), v1 = *(const vf *)(x + j + 16);
            const vi g0 = v0 > b0, g1 = v1 > b1;
            b0 = pick(g0, v0, b0);
            b1 = pick(g1, v1, b1);
            i0 = pick_i(g0, lane + (int32_t)j, i0);
            i1 = pick_i(g1, lane + (int32_t)(j + 16), i1);
            nan |= (v0 != v0) | (v1 != v1);
        }
        int any_nan = 0;
        for (int k = 0; k < 16; k++)
            any_nan |= nan[k] != 0;
        if (any_nan) {
            for (int64_t t = 0;; t++)
                if (x[t] != x[t])
                    return t;
        }
        top = b0[0];
        at = i0[0];
        for (int k = 0; k < 16; k++) {
            const float v[2] = {b0[k], b1[k]};
            const int32_t i[2] = {i0[k], i1[k]};
            for (int s = 0; s < 2; s++)
                if (v[s] > top || (v[s] == top && i[s] < at)) {
                    top = v[s];
                    at = i[s];
                }
        }
    }
    /* the columns past the last whole 32 (all of them in a short row) */
    for (; j < cols; j++) {
        if (x[j] != x[j])
            return j;
        if (x[j] > top) {
            top = x[j];
            at = j;
        }
    }
    return at;
}

void argmax_rows_f32(const float *x, int64_t stride, int64_t rows, int64_t cols, int64_t *out,
                     int num_threads)
{
#pragma omp parallel for num_threads(num_threads) if (rows >= 4)
    for (int64_t r = 0; r < rows; r++)
        out[r] = argmax_row(x + r * stride, cols);
}

/* SwiGLU's product: out[r][j] = silu(gate[r][j]) * up[r][j] with silu(x) = x * sigmoid(x);
 * gate and up rows x_stride apart (the halves of the fused gate_up projection), out contiguous
 * [rows, width]. sigmoid through e = e^-|x|, which never overflows: 1 / (1 + e) for x >= 0,
 * e / (1 + e) below. Within a few units in the last place of torch's x / (1 + e^-x). */
void silu_mul_f32(const float *gate, const float *up, int64_t x_stride, float *out, int64_t rows,
                  int64_t width, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) if (rows * width >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate + r * x_stride, *u = up + r * x_stride;
        float *o = out + r * width;
        int64_t j = 0;
        for (; j + W <= width; j += W) {
            const vf x = load(g + j);
            const vi negative = x < 0.f;
            const vf e = exp_nonpositive(pick(negative, x, -x));
            const vf sigmoid = pick(negative, e, splat(1.f)) / (1.f + e);
            store(o + j, x * sigmoid * load(u + j));
        }
        for (; j < width; j++) {
            const float e = expf(-fabsf(g[j]));
            o[j] = g[j] * ((g[j] < 0.f ? e : 1.f) / (1.f + e)) * u[j];
        }
    }
}
