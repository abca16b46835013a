/* Row-wise operations of a Llama layer on CPU, one pass over memory each where torch runs
 * several ops (each with its own temporary): RMSNorm and rotary embeddings. float32.
 * worker.model.native_ops builds and calls this.
 *
 * Built WITHOUT -ffast-math and with -ffp-contract=off: every product and sum is rounded as in
 * the torch code it replaces (rope bit for bit; RMSNorm up to the order of its sum of squares),
 * so the engine keeps transformers' greedy tokens.
 */
#include <math.h>
#include <stdint.h>

/* out[r] = weight * (x[r] * (1 / sqrt(mean(x[r]^2) + eps))); x rows x_stride apart, out
 * contiguous [rows, hidden] */
void rms_norm_f32(const float *x, int64_t x_stride, const float *weight, float *out, int64_t rows,
                  int64_t hidden, float eps, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * hidden;
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
