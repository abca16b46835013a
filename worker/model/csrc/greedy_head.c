/*
 * The greedy token of each row from a bfloat16 screen of the LM head: the rows' logits computed
 * with bfloat16 weights and inputs (`approx`, oneDNN on the CPU's bfloat16 units), a proven bound
 * on how far each can be from the float32 logit, and float32 dot products for the few tokens the
 * bound cannot rule out. worker.model.greedy_head builds and calls this; its docstring derives
 * the bound (`screen`, `margin`).
 *
 * A row's answer is the token the float32 head would pick (the first maximum of its logits,
 * whatever order the float32 GEMM sums in), or -1 where this cannot be proven here: a non-finite
 * value, more than `cap` candidates, or two candidates too close for float32 rounding to order.
 * The caller computes those rows' full logits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vector_math.h"

typedef uint16_t vh __attribute__((vector_size(32), aligned(2)));

/* 16 bfloat16 values as floats (a bfloat16 is a float's upper half) */
static inline vf widen(const uint16_t *p)
{
    const vi bits = __builtin_convertvector(*(const vh *)p, vi);
    return (vf)(bits << 16);
}

static inline float widen1(uint16_t x)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)x << 16};
    return v.f;
}

/* dot = sum h[k] w[k], mass = sum |h[k] w[k]| (float32, 16 lanes) */
static void dot_and_mass(const float *h, const float *w, int64_t k, float *dot, float *mass)
{
    vf d = splat(0.f), m = splat(0.f);
    int64_t i = 0;
    for (; i + W <= k; i += W) {
        const vf p = load(h + i) * load(w + i);
        d += p;
        m += pick(p < 0.f, -p, p);
    }
    float ds = 0.f, ms = 0.f;
    for (int l = 0; l < W; l++) {
        ds += d[l];
        ms += m[l];
    }
    for (; i < k; i++) {
        const float p = h[i] * w[i];
        ds += p;
        ms += fabsf(p);
    }
    *dot = ds;
    *mass = ms;
}

enum { BLOCK = 256 }; /* tokens per block maximum kept by pass 1 */

static float hmax(vf v)
{
    float m = v[0];
    for (int l = 1; l < W; l++)
        m = fmaxf(m, v[l]);
    return m;
}

static int64_t screen_row(const uint16_t *approx, const float *h, const float *weight, int64_t vocab,
                          int64_t k, float w_norm_max, float screen, float relative, float margin,
                          int64_t cap, float *dots, float *masses, int64_t *ids, float *block_max)
{
    double sq = 0.0;
    for (int64_t i = 0; i < k; i++)
        sq += (double)h[i] * h[i];
    const double h_norm = sqrt(sq);
    if (!isfinite(h_norm))
        return -1;

    /* pass 1: each block's largest screened logit, the largest magnitude, and a NaN or an
     * infinity anywhere (x * 0 is NaN for both) */
    const int64_t blocks = (vocab + BLOCK - 1) / BLOCK;
    float a_max = -INFINITY, a_big = 0.f;
    vf poison = splat(0.f);
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t lo = b * BLOCK, hi = lo + BLOCK < vocab ? lo + BLOCK : vocab;
        vf top = splat(-INFINITY), low = splat(INFINITY);
        int64_t j = lo;
        for (; j + W <= hi; j += W) {
            const vf a = widen(approx + j);
            top = vmax(top, a);
            low = pick(a < low, a, low);
            poison += a * 0.f;
        }
        float most = hmax(top), least = -hmax(-low);
        for (; j < hi; j++) {
            const float a = widen1(approx[j]);
            most = fmaxf(most, a);
            least = fminf(least, a);
            poison[0] += a * 0.f;
        }
        block_max[b] = most;
        a_max = fmaxf(a_max, most);
        a_big = fmaxf(a_big, fmaxf(fabsf(most), fabsf(least)));
    }
    for (int l = 0; l < W; l++)
        if (poison[l] != poison[l])
            return -1;

    /* every token's float32 logit is within `err` of its screened one (module doc of
     * worker.model.greedy_head), so a token below a_max - 2 err cannot be the maximum */
    const double err = screen * h_norm * w_norm_max + relative * (double)a_big + 1e-30;
    const double floor_exact = (double)a_max - 2.0 * err;
    float floor_ = (float)floor_exact;
    if ((double)floor_ > floor_exact) /* rounded up: one step down keeps every candidate */
        floor_ = nextafterf(floor_, -INFINITY);

    /* pass 2: float32 logits of the candidates, in vocabulary order, in the blocks that
     * reach the floor */
    int64_t n = 0, best = -1;
    for (int64_t b = 0; b < blocks; b++) {
        if (block_max[b] < floor_)
            continue;
        const int64_t lo = b * BLOCK, hi = lo + BLOCK < vocab ? lo + BLOCK : vocab;
        for (int64_t j = lo; j < hi; j++) {
            if (widen1(approx[j]) < floor_)
                continue;
            if (n == cap)
                return -1;
            dot_and_mass(h, weight + j * k, k, &dots[n], &masses[n]);
            ids[n] = j;
            if (!isfinite(dots[n]) || !isfinite(masses[n]))
                return -1;
            if (best < 0 || dots[n] > dots[best])
                best = n;
            n++;
        }
    }
    if (best < 0)
        return -1;
    /* the winner must beat every other candidate by more than the two dot products' rounding
     * (any float32 order of summation): then the float32 head's first maximum is it too */
    for (int64_t c = 0; c < n; c++) {
        if (c == best)
            continue;
        if (!(dots[best] - dots[c] > margin * (masses[best] + masses[c])))
            return -1;
    }
    return ids[best];
}

/* out[r]: row r's greedy token or -1. approx: [rows, vocab] bfloat16 bits, rows approx_stride
 * apart; h: [rows, k] float32 contiguous; weight: [vocab, k] float32 contiguous. */
void greedy_screen(const uint16_t *approx, int64_t approx_stride, const float *h,
                   const float *weight, int64_t rows, int64_t vocab, int64_t k, float w_norm_max,
                   float screen, float relative, float margin, int64_t cap, int64_t *out,
                   int num_threads)
{
#pragma omp parallel num_threads(num_threads) if (rows >= 2)
    {
        /* per thread: candidates' ids, dot products and masses, and the block maxima */
        const int64_t blocks = (vocab + BLOCK - 1) / BLOCK;
        int64_t *ids = (int64_t *)malloc((size_t)cap * sizeof(int64_t));
        float *scratch = (float *)malloc((size_t)(2 * cap + blocks) * sizeof(float));
#pragma omp for schedule(dynamic)
        for (int64_t r = 0; r < rows; r++)
            out[r] = ids == NULL || scratch == NULL
                         ? -1
                         : screen_row(approx + r * approx_stride, h + r * k, weight, vocab, k,
                                      w_norm_max, screen, relative, margin, cap, scratch,
                                      scratch + cap, ids, scratch + 2 * cap);
        free(ids);
        free(scratch);
    }
}
