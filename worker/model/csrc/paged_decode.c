/* Paged attention for decodes on CPU: one new token per sequence, reading the paged KV cache in
 * place (no gather into a scratch buffer). The semantics are worker.model.attention's
 * paged_attention_ref for query length 1; worker.model.native_attention builds and calls this.
 *
 * Layouts (float32):
 *   q             [n, num_heads, head_dim], rows q_stride apart: sequence i's one query
 *   out           [n, num_heads, head_dim], contiguous
 *   k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], contiguous
 *   block_tables  [n, table_stride] int32: token p of sequence i is at
 *                 block block_tables[i][p / block_size], offset p % block_size
 *   seq_lens      [n] int32: tokens cached for sequence i, this step's included (>= 1)
 *   window        > 0: only the last `window` positions are visible (sliding window)
 *
 * Work is split over (sequence, kv head) pairs on OpenMP threads (torch's runtime: the library
 * is loaded after torch). Keys and values are read through per-token row pointers, once per
 * query head from cache-resident rows. The loops keep several independent accumulators so that
 * they are bound by memory, not by the latency of one chain of multiply-adds.
 *
 * Built with -ffast-math for the vectorised exp (glibc's libmvec) and reassociated sums; the
 * code therefore never relies on infinities or NaNs (the running max starts at a real score).
 * Returns 0, or -1 if a score buffer could not be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* GCC/Clang generic vectors: 8 floats (AVX2 registers, two NEON registers); unaligned */
typedef float vf __attribute__((vector_size(32), aligned(4)));
enum { W = 8 };

static inline vf load(const float *p) { return *(const vf *)p; }
static inline void store(float *p, vf v) { *(vf *)p = v; }
static inline vf splat(float x) { return (vf){0} + x; }
static inline float hsum(vf v)
{
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* s[t] = scale * q . keys[t]; four keys at a time (four independent sums) when d % W == 0 */
static void scores(const float *restrict q, const float *restrict const *keys, int64_t count,
                   int64_t d, float scale, float *restrict s)
{
    int64_t t = 0;
    if (d % W == 0) {
        for (; t + 4 <= count; t += 4) {
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t x = 0; x < d; x += W) {
                const vf qx = load(q + x);
                a0 += qx * load(keys[t] + x);
                a1 += qx * load(keys[t + 1] + x);
                a2 += qx * load(keys[t + 2] + x);
                a3 += qx * load(keys[t + 3] + x);
            }
            s[t] = hsum(a0) * scale;
            s[t + 1] = hsum(a1) * scale;
            s[t + 2] = hsum(a2) * scale;
            s[t + 3] = hsum(a3) * scale;
        }
    }
    for (; t < count; t++) {
        float acc = 0.f;
        for (int64_t x = 0; x < d; x++)
            acc += q[x] * keys[t][x];
        s[t] = acc * scale;
    }
}

/* s <- softmax(s), in place */
static void softmax(float *restrict s, int64_t count)
{
    float top = s[0];
    for (int64_t j = 1; j < count; j++)
        top = s[j] > top ? s[j] : top;
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < count; j++) {
        const float e = expf(s[j] - top);
        s[j] = e;
        total += e;
    }
    const float inv = 1.f / total;
#pragma omp simd
    for (int64_t j = 0; j < count; j++)
        s[j] *= inv;
}

/* o = sum_t p[t] * values[t]: 32 output columns at a time in registers when d % W == 0 */
static void weighted_sum(const float *restrict p, const float *restrict const *values,
                         int64_t count, int64_t d, float *restrict o)
{
    if (d % W != 0) {
        for (int64_t x = 0; x < d; x++)
            o[x] = 0.f;
        for (int64_t t = 0; t < count; t++)
            for (int64_t x = 0; x < d; x++)
                o[x] += p[t] * values[t][x];
        return;
    }
    for (int64_t x0 = 0; x0 < d; x0 += 4 * W) {
        const int64_t width = d - x0 < 4 * W ? d - x0 : 4 * W;
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t t = 0; t < count; t++) {
            const vf pt = splat(p[t]);
            const float *v = values[t] + x0;
            a0 += pt * load(v);
            if (width > W)
                a1 += pt * load(v + W);
            if (width > 2 * W)
                a2 += pt * load(v + 2 * W);
            if (width > 3 * W)
                a3 += pt * load(v + 3 * W);
        }
        store(o + x0, a0);
        if (width > W)
            store(o + x0 + W, a1);
        if (width > 2 * W)
            store(o + x0 + 2 * W, a2);
        if (width > 3 * W)
            store(o + x0 + 3 * W, a3);
    }
}

int paged_decode_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                     const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
                     float *out, int64_t n, int64_t num_heads, int64_t num_kv_heads,
                     int64_t head_dim, int64_t block_size, float scale, int64_t window,
                     int num_threads)
{
    const int64_t group = num_heads / num_kv_heads;
    const int64_t d = head_dim;
    const int64_t token_stride = num_kv_heads * d;
    const int64_t block_stride = block_size * token_stride;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t job = 0; job < n * num_kv_heads; job++) {
        const int64_t i = job / num_kv_heads, h = job % num_kv_heads;
        const int64_t len = seq_lens[i];
        const int64_t first = (window > 0 && len > window) ? len - window : 0;
        const int64_t count = len - first;
        /* scores then probabilities [group][count]; key and value row pointers [count] each */
        float *s = malloc(sizeof(float) * (size_t)(group * count));
        const float **rows = malloc(sizeof(float *) * (size_t)(2 * count));
        if (s == NULL || rows == NULL) {
            free(s);
            free(rows);
#pragma omp atomic write
            failed = 1;
            continue;
        }
        const float **keys = rows, **values = rows + count;
        const int32_t *table = block_tables + i * table_stride;
        for (int64_t t = first; t < len; t++) {
            const int64_t at = (int64_t)table[t / block_size] * block_stride +
                               (t % block_size) * token_stride + h * d;
            keys[t - first] = k_cache + at;
            values[t - first] = v_cache + at;
        }
        /* the query heads of kv head h (GQA) are consecutive */
        for (int64_t g = 0; g < group; g++) {
            const int64_t head = h * group + g;
            float *sg = s + g * count;
            scores(q + i * q_stride + head * d, keys, count, d, scale, sg);
            softmax(sg, count);
            weighted_sum(sg, values, count, d, out + (i * num_heads + head) * d);
        }
        free(rows);
        free(s);
    }
    return failed ? -1 : 0;
}
