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
 * is loaded after torch). Keys and values are read through per-token row pointers (a division
 * per block, not per token), each row once for up to four query heads of the kv head's group,
 * with software prefetch a few rows ahead: a decode's attention is bound by memory, and this
 * keeps it streaming.
 *
 * Built with -ffast-math for the vectorised exp (glibc's libmvec) and reassociated sums; the
 * code therefore never relies on infinities or NaNs (the running max starts at a real score).
 * Returns 0, or -1 if a score buffer could not be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* GCC/Clang generic vectors: 8 floats (AVX2 registers, two NEON registers); unaligned */
typedef float vf __attribute__((vector_size(32), aligned(4)));
/* W: floats per vector; AHEAD: rows prefetched ahead of the one being read (the rows of a
 * sequence are pieces of its blocks: the hardware's stream prefetch alone falls behind) */
enum { W = 8, AHEAD = 8 };

static inline vf load(const float *p) { return *(const vf *)p; }
static inline void store(float *p, vf v) { *(vf *)p = v; }
static inline vf splat(float x) { return (vf){0} + x; }
static inline float hsum(vf v)
{
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* s[g][t] = scale * q[g] . keys[t] for the heads g < HEADS of a group at once (queries
 * q_stride apart, scores s_stride apart), so each key row crosses memory once however many
 * heads share it. HEADS is a constant at every call (the accumulators stay in registers). */
static inline __attribute__((always_inline)) void
scores(const float *restrict q, int64_t q_stride, const int HEADS,
       const float *restrict const *keys, int64_t count, int64_t d, float scale,
       float *restrict s, int64_t s_stride)
{
    if (d % W != 0) {
        for (int64_t t = 0; t < count; t++)
            for (int g = 0; g < HEADS; g++) {
                float acc = 0.f;
                for (int64_t x = 0; x < d; x++)
                    acc += q[g * q_stride + x] * keys[t][x];
                s[g * s_stride + t] = acc * scale;
            }
        return;
    }
    for (int64_t t = 0; t < count; t++) {
        vf a[4] = {{0}, {0}, {0}, {0}};
        const float *k = keys[t];
        if (t + AHEAD < count)
            for (int64_t x = 0; x < d; x += 2 * W) /* a 64-byte line each */
                __builtin_prefetch(keys[t + AHEAD] + x);
        for (int64_t x = 0; x < d; x += W) {
            const vf kx = load(k + x);
            for (int g = 0; g < HEADS; g++)
                a[g] += load(q + g * q_stride + x) * kx;
        }
        for (int g = 0; g < HEADS; g++)
            s[g * s_stride + t] = hsum(a[g]) * scale;
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

/* o[g] = sum_t p[g][t] * values[t] for the heads g < HEADS at once (probabilities p_stride
 * apart, outputs d apart): 32 columns of each head in registers, each value row read once */
static inline __attribute__((always_inline)) void
weighted_sum(const float *restrict p, int64_t p_stride, const int HEADS,
             const float *restrict const *values, int64_t count, int64_t d, float *restrict o)
{
    if (d % W != 0) {
        for (int g = 0; g < HEADS; g++) {
            float *og = o + g * d;
            for (int64_t x = 0; x < d; x++)
                og[x] = 0.f;
            for (int64_t t = 0; t < count; t++)
                for (int64_t x = 0; x < d; x++)
                    og[x] += p[g * p_stride + t] * values[t][x];
        }
        return;
    }
    for (int64_t x0 = 0; x0 < d; x0 += 4 * W) {
        /* the last columns of a head not a multiple of 32 wide: 1-3 vectors */
        const int width = d - x0 < 4 * W ? (int)((d - x0) / W) : 4;
        vf a[4][4];
        for (int g = 0; g < HEADS; g++)
            for (int c = 0; c < 4; c++)
                a[g][c] = (vf){0};
        if (width == 4) {
            for (int64_t t = 0; t < count; t++) {
                const float *v = values[t] + x0;
                if (t + AHEAD < count) {
                    __builtin_prefetch(values[t + AHEAD] + x0);
                    __builtin_prefetch(values[t + AHEAD] + x0 + 2 * W);
                }
                const vf v0 = load(v), v1 = load(v + W), v2 = load(v + 2 * W), v3 = load(v + 3 * W);
                for (int g = 0; g < HEADS; g++) {
                    const vf pg = splat(p[g * p_stride + t]);
                    a[g][0] += pg * v0;
                    a[g][1] += pg * v1;
                    a[g][2] += pg * v2;
                    a[g][3] += pg * v3;
                }
            }
        } else {
            for (int64_t t = 0; t < count; t++)
                for (int g = 0; g < HEADS; g++)
                    for (int c = 0; c < width; c++)
                        a[g][c] += splat(p[g * p_stride + t]) * load(values[t] + x0 + c * W);
        }
        for (int g = 0; g < HEADS; g++)
            for (int c = 0; c < width; c++)
                store(o + g * d + x0 + c * W, a[g][c]);
    }
}

/* the heads [g0, g0 + HEADS) of kv head h's group: scores, softmax, weighted sums */
static inline __attribute__((always_inline)) void
heads(const float *q, const int HEADS, const float *const *keys, const float *const *values,
      int64_t count, int64_t d, float scale, float *s, float *o)
{
    scores(q, d, HEADS, keys, count, d, scale, s, count);
    for (int g = 0; g < HEADS; g++)
        softmax(s + g * count, count);
    weighted_sum(s, count, HEADS, values, count, d, o);
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
        /* a division per block, not per token */
        for (int64_t t = first; t < len;) {
            const int64_t b = t / block_size;
            const int64_t base = (int64_t)table[b] * block_stride + h * d;
            const int64_t end = (b + 1) * block_size < len ? (b + 1) * block_size : len;
            for (; t < end; t++) {
                const int64_t at = base + (t - b * block_size) * token_stride;
                keys[t - first] = k_cache + at;
                values[t - first] = v_cache + at;
            }
        }
        /* the query heads of kv head h (GQA) are consecutive: four at a time */
        for (int64_t g = 0; g < group; g += 4) {
            const int64_t head = h * group + g;
            const float *qg = q + i * q_stride + head * d;
            float *sg = s + g * count, *og = out + (i * num_heads + head) * d;
            switch (group - g < 4 ? group - g : 4) {
            case 4:
                heads(qg, 4, keys, values, count, d, scale, sg, og);
                break;
            case 3:
                heads(qg, 3, keys, values, count, d, scale, sg, og);
                break;
            case 2:
                heads(qg, 2, keys, values, count, d, scale, sg, og);
                break;
            default:
                heads(qg, 1, keys, values, count, d, scale, sg, og);
            }
        }
        free(rows);
        free(s);
    }
    return failed ? -1 : 0;
}

/* The step's new keys and values into the cache: token t's rows (row_floats floats: every kv
 * head) go to slot slots[t] of the flattened caches; slots < 0 are skipped. k and v rows are
 * k_stride / v_stride floats apart (views of a fused projection). */
void store_kv_f32(const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                  float *k_cache, float *v_cache, const int64_t *slots, int64_t tokens,
                  int64_t row_floats, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) if (tokens >= 256)
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0)
            continue;
        memcpy(k_cache + slots[t] * row_floats, k + t * k_stride, sizeof(float) * (size_t)row_floats);
        memcpy(v_cache + slots[t] * row_floats, v + t * v_stride, sizeof(float) * (size_t)row_floats);
    }
}
