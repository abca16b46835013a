/* Paged attention for prompts on CPU: several new tokens per sequence, each attending causally
 * to every cached position up to its own (within the sliding window), keys and values read in
 * place from the paged KV cache (the step's own keys were written there first). The semantics
 * are worker.model.attention's paged_attention_ref; worker.model.native_attention builds and
 * calls this.
 *
 * Layouts (float32):
 *   q             [tokens, num_heads, head_dim], tokens q_stride apart (a view of a fused
 *                 projection), heads contiguous
 *   out           [tokens, num_heads, head_dim], contiguous
 *   k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], contiguous
 *   query_start_loc [n + 1] int32: sequence i's new tokens are [query_start_loc[i], [i+1])
 *   seq_lens      [n] int32: tokens cached for sequence i, this step's included
 *   block_tables  [n, table_stride] int32: token p of sequence i is at
 *                 block block_tables[i][p / block_size], offset p % block_size
 *   window        > 0: only the last `window` positions are visible (sliding window)
 *
 * The algorithm is flash attention's: a tile of ROWS query rows (the query heads of one kv head
 * for consecutive tokens of one sequence) walks its visible keys KEYS at a time, keeping a
 * running max, sum and output per row, so scores never exist for a whole sequence. Scores are
 * computed key-major (a vector holds one key's score for 16 rows): a key is then broadcast from
 * its row in the cache and nothing is transposed but the tile's queries, once. Jobs (sequence,
 * kv head, tile) run on OpenMP threads (torch's runtime), the most expensive first.
 *
 * Built with -ffast-math for the vectorised exp (glibc's libmvec) and reassociated sums; the
 * code therefore never relies on infinities or NaNs: masked scores are a large negative number.
 * Returns 0, or -1 if a buffer could not be allocated.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

enum {
    ROWS = 2 * W,  /* query rows per tile */
    KEYS = 64,     /* keys per softmax update */
    KEY_STEP = 8,  /* keys per score micro-kernel call (accumulators in registers) */
    MAX_DIM = 256, /* widest head supported (the caller checks) */
};
/* a masked score, and the running max before any key: exp(MASKED - START) == 0 and
 * exp(START - START) == 1 keep a row that has seen no key yet at zero weight */
static const float START = -1e30f, MASKED = -2e30f;

struct job {
    int64_t seq, kv_head, tile, cost;
};

static int by_cost(const void *a, const void *b)
{
    const int64_t x = ((const struct job *)a)->cost, y = ((const struct job *)b)->cost;
    return (x < y) - (x > y);
}

/* st[j][r] = qt[.][r] . keys[j], for KEY_STEP keys (fewer at the end: `count`) and all ROWS
 * rows; qt is the tile's queries transposed, [d][ROWS] */
static void scores(const float *restrict qt, const float *restrict const *keys, int count,
                   int64_t d, float *restrict st)
{
    vf a[KEY_STEP][2];
    for (int j = 0; j < KEY_STEP; j++)
        a[j][0] = a[j][1] = (vf){0};
    if (count == KEY_STEP) {
        for (int64_t x = 0; x < d; x++) {
            const vf q0 = load(qt + x * ROWS), q1 = load(qt + x * ROWS + W);
#pragma GCC unroll 8
            for (int j = 0; j < KEY_STEP; j++) {
                const vf k = splat(keys[j][x]);
                a[j][0] += q0 * k;
                a[j][1] += q1 * k;
            }
        }
    } else {
        for (int64_t x = 0; x < d; x++) {
            const vf q0 = load(qt + x * ROWS), q1 = load(qt + x * ROWS + W);
            for (int j = 0; j < count; j++) {
                const vf k = splat(keys[j][x]);
                a[j][0] += q0 * k;
                a[j][1] += q1 * k;
            }
        }
    }
    for (int j = 0; j < count; j++) {
        store(st + j * ROWS, a[j][0]);
        store(st + j * ROWS + W, a[j][1]);
    }
}

/* o[r] += sum_j p[j][r] * values[j] for 4 rows from `row`, 4 vectors (64 columns) from `col` */
static void weigh4(const float *restrict p, const float *restrict const *values, int count,
                   int row, int64_t col, int64_t d, float *restrict o)
{
    vf a[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++)
            a[r][c] = load(o + (row + r) * d + col + c * W);
    for (int j = 0; j < count; j++) {
        const float *v = values[j] + col;
        const vf v0 = load(v), v1 = load(v + W), v2 = load(v + 2 * W), v3 = load(v + 3 * W);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const vf pr = splat(p[j * ROWS + row + r]);
            a[r][0] += pr * v0;
            a[r][1] += pr * v1;
            a[r][2] += pr * v2;
            a[r][3] += pr * v3;
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++)
            store(o + (row + r) * d + col + c * W, a[r][c]);
}

/* the same for one vector (16 columns) from `col`: the last columns of a head not a multiple
 * of 64 wide */
static void weigh1(const float *restrict p, const float *restrict const *values, int count,
                   int row, int64_t col, int64_t d, float *restrict o)
{
    vf a[4];
    for (int r = 0; r < 4; r++)
        a[r] = load(o + (row + r) * d + col);
    for (int j = 0; j < count; j++) {
        const vf v = load(values[j] + col);
        for (int r = 0; r < 4; r++)
            a[r] += splat(p[j * ROWS + row + r]) * v;
    }
    for (int r = 0; r < 4; r++)
        store(o + (row + r) * d + col, a[r]);
}

/* one tile: rows [first_row, first_row + ROWS) of sequence `seq`'s (token, query head of kv
 * head h) pairs, token-major */
static void tile(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                 const int32_t *table, int64_t q_first, int64_t q_len, int64_t seq_len,
                 float *out, int64_t num_heads, int64_t h, int64_t group, int64_t d,
                 int64_t block_size, int64_t token_stride, float scale, int64_t window,
                 int64_t first_row, float *restrict buf)
{
    /* buf: qt [d][ROWS] | o [ROWS][d] | st [KEYS][ROWS] | m, l [ROWS] */
    float *qt = buf, *o = qt + d * ROWS, *st = o + ROWS * d, *m = st + KEYS * ROWS;
    float *l = m + ROWS;
    const float *keys[KEYS], *values[KEYS];
    int32_t pos[ROWS];
    const int64_t rows = q_len * group, past = seq_len - q_len;
    for (int r = 0; r < ROWS; r++) {
        const int64_t flat = first_row + r;
        pos[r] = flat < rows ? (int32_t)(past + flat / group) : -1;
        if (flat < rows) {
            const float *src = q + (q_first + flat / group) * q_stride + (h * group + flat % group) * d;
            for (int64_t x = 0; x < d; x++)
                qt[x * ROWS + r] = src[x] * scale;
        } else {
            for (int64_t x = 0; x < d; x++)
                qt[x * ROWS + r] = 0.f;
        }
        m[r] = START;
        l[r] = 0.f;
    }
    memset(o, 0, sizeof(float) * (size_t)(ROWS * d));
    const int64_t last = first_row + ROWS <= rows ? ROWS - 1 : rows - 1 - first_row;
    const int64_t hi = pos[last];
    const int64_t lo = (window > 0 && pos[0] - window + 1 > 0) ? pos[0] - window + 1 : 0;
    const vi p0 = *(const vi *)pos, p1 = *(const vi *)(pos + W);
    for (int64_t k0 = lo; k0 <= hi; k0 += KEYS) {
        const int count = (int)(hi + 1 - k0 < KEYS ? hi + 1 - k0 : KEYS);
        /* the keys' rows: a division per block, not per key */
        for (int64_t t = k0; t < k0 + count;) {
            const int64_t b = t / block_size;
            const int64_t base = (int64_t)table[b] * block_size * token_stride + h * d;
            const int64_t end = (b + 1) * block_size < k0 + count ? (b + 1) * block_size : k0 + count;
            for (; t < end; t++) {
                keys[t - k0] = k_cache + base + (t - b * block_size) * token_stride;
                values[t - k0] = v_cache + base + (t - b * block_size) * token_stride;
            }
        }
        for (int j = 0; j < count; j += KEY_STEP)
            scores(qt, keys + j, count - j < KEY_STEP ? count - j : KEY_STEP, d, st + j * ROWS);
        /* mask, running max, probabilities, running sum: 16 rows per vector */
        /* every row sees every key of this step (no mask): most steps of a long prompt */
        const int clear = last == ROWS - 1 && k0 + count - 1 <= pos[0] &&
                          (window <= 0 || pos[last] - k0 < window);
        for (int half = 0; half < 2; half++) {
            const vi pr = half ? p1 : p0;
            vf top = splat(MASKED);
            if (clear) {
                for (int j = 0; j < count; j++)
                    top = vmax(top, load(st + j * ROWS + half * W));
            } else {
                for (int j = 0; j < count; j++) {
                    const vi kp = (vi){0} + (int32_t)(k0 + j);
                    vi ok = kp <= pr;
                    if (window > 0)
                        ok &= (pr - kp) < (int32_t)window;
                    vf s = pick(ok, load(st + j * ROWS + half * W), splat(MASKED));
                    store(st + j * ROWS + half * W, s);
                    top = vmax(top, s);
                }
            }
            float *mh = m + half * W, *lh = l + half * W;
            const vf before = load(mh);
            const vf now = vmax(before, top);
            const vf alpha = exp_nonpositive(before - now);
            vf sum = {0};
            for (int j = 0; j < count; j++) {
                float *sj = st + j * ROWS + half * W;
                const vf e = exp_nonpositive(load(sj) - now);
                store(sj, e);
                sum += e;
            }
            store(lh, load(lh) * alpha + sum);
            store(mh, now);
            for (int r = 0; r < W; r++) {
                if (alpha[r] != 1.f) {
                    float *orow = o + (half * W + r) * d;
                    for (int64_t x = 0; x < d; x += W)
                        store(orow + x, load(orow + x) * alpha[r]);
                }
            }
        }
        /* o += p v */
        for (int row = 0; row < ROWS; row += 4) {
            if (pos[row] < 0)
                break;
            int64_t col = 0;
            for (; col + 4 * W <= d; col += 4 * W)
                weigh4(st, values, count, row, col, d, o);
            for (; col < d; col += W)
                weigh1(st, values, count, row, col, d, o);
        }
    }
    for (int r = 0; r < ROWS && pos[r] >= 0; r++) {
        const int64_t flat = first_row + r;
        float *dst = out + ((q_first + flat / group) * num_heads + h * group + flat % group) * d;
        const float inv = 1.f / l[r];
        for (int64_t x = 0; x < d; x++)
            dst[x] = o[r * d + x] * inv;
    }
}

/* paged_decode_f32's arguments, then where each sequence's new tokens start */
int paged_prefill_f32(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                      const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
                      float *out, int64_t n, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_dim, int64_t block_size, float scale, int64_t window,
                      int num_threads, const int32_t *query_start_loc)
{
    const int64_t group = num_heads / num_kv_heads, d = head_dim;
    if (d % W != 0 || d > MAX_DIM)
        return -2;
    int64_t count = 0;
    if (n <= 0)
        return 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t rows = (query_start_loc[i + 1] - query_start_loc[i]) * group;
        count += num_kv_heads * ((rows + ROWS - 1) / ROWS);
    }
    struct job *jobs = malloc(sizeof(struct job) * (size_t)(count ? count : 1));
    if (jobs == NULL)
        return -1;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t q_len = query_start_loc[i + 1] - query_start_loc[i];
        const int64_t tiles = (q_len * group + ROWS - 1) / ROWS;
        for (int64_t t = 0; t < tiles; t++) {
            /* keys this tile reads: up to its last token's position, from its window */
            int64_t end_tok = ((t + 1) * ROWS - 1) / group;
            end_tok = end_tok < q_len ? end_tok : q_len - 1;
            const int64_t hi = seq_lens[i] - q_len + end_tok;
            const int64_t lo_tok = seq_lens[i] - q_len + (t * ROWS) / group;
            const int64_t lo = (window > 0 && lo_tok - window + 1 > 0) ? lo_tok - window + 1 : 0;
            for (int64_t h = 0; h < num_kv_heads; h++)
                jobs[at++] = (struct job){i, h, t, hi + 1 - lo};
        }
    }
    qsort(jobs, (size_t)count, sizeof(struct job), by_cost);
    /* per thread: a tile's buffers (a whole number of 64-byte lines, as aligned_alloc wants) */
    const size_t floats = (size_t)(d * ROWS * 2 + KEYS * ROWS + 2 * ROWS + W - 1) / W * W;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        float *buf = aligned_alloc(64, sizeof(float) * floats);
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < count; k++) {
            if (buf == NULL)
                continue;
            const struct job *job = jobs + k;
            const int64_t i = job->seq;
            tile(q, q_stride, k_cache, v_cache, block_tables + i * table_stride,
                 query_start_loc[i], query_start_loc[i + 1] - query_start_loc[i], seq_lens[i],
                 out, num_heads, job->kv_head, group, d, block_size, num_kv_heads * d, scale,
                 window, job->tile * ROWS, buf);
        }
        free(buf);
    }
    free(jobs);
    return failed ? -1 : 0;
}
