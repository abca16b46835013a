/* Vectors of 16 floats and 16 int32 in GCC/Clang's generic vector extension (one AVX-512
 * register; two AVX2 or four NEON ones), and the exponential the kernels share. Only explicit
 * vector operations: the same code whatever the library's floating-point flags. Included by
 * the kernels in this directory (worker.model.native_build keys their cache on it too). */
#ifndef PLATFORM_VECTOR_MATH_H
#define PLATFORM_VECTOR_MATH_H

#include <stdint.h>

typedef float vf __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi __attribute__((vector_size(64), aligned(4)));
enum { W = 16 }; /* floats per vector */

static inline vf load(const float *p) { return *(const vf *)p; }
static inline void store(float *p, vf v) { *(vf *)p = v; }
static inline vf splat(float x) { return (vf){0} + x; }
/* lanes of a where mask is set (all ones), of b elsewhere */
static inline vi pick_i(vi mask, vi a, vi b) { return (a & mask) | (b & ~mask); }
static inline vf pick(vi mask, vf a, vf b) { return (vf)pick_i(mask, (vi)a, (vi)b); }
static inline vf vmax(vf a, vf b) { return pick(a > b, a, b); }

/* e^x for x <= 0: e^x = 2^n e^r with n = round(x / ln 2) and |r| <= ln(2) / 2, e^r by its
 * Taylor series to r^7 (relative error below 1e-8); 0 below -87, where float's normal range
 * ends */
static inline vf exp_nonpositive(vf x)
{
    const vi under = x < -87.f;
    x = pick(under, splat(-87.f), x);
    /* round half away from zero (x <= 0: truncate x / ln 2 - 0.5 toward zero) */
    const vi n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);
    const vf f = __builtin_convertvector(n, vf);
    /* ln 2 in two parts: r exact to float rounding even for n near -126 */
    const vf r = (x - f * 0.693145751953125f) - f * 1.42860682030941723e-6f;
    vf p = splat(1.f / 5040);
    p = p * r + 1.f / 720;
    p = p * r + 1.f / 120;
    p = p * r + 1.f / 24;
    p = p * r + 1.f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    const vf scale = (vf)((n + 127) << 23);
    return pick(under, splat(0.f), p * scale);
}

#endif
