/* PIL's convolution resize (libImaging/Resample.c) on packed 8-bit RGB or L arrays, bit-exact.
 *
 * PIL resizes in two separable passes. For each output pixel it computes a window of input
 * pixels and double-precision filter weights, normalises them to sum to one, and rounds them to
 * 22-bit fixed point. Each pass sums pixel x weight in 32-bit integers from 1 << 21 (rounding),
 * shifts right by 22 and clips to 0..255; the first pass's result is rounded to 8 bits before the
 * second pass reads it. Which pass runs first is part of the result: Pillow 13 runs the vertical
 * pass first when the height shrinks much more than the width (``order_rule``).
 *
 * What is PIL's here: the weights (same expressions, in double, with libm's sin and cos), their
 * fixed-point rounding, the windows, the pass order and the 8-bit rounding in between. What is
 * not: the order in which a pass adds its integer products, which cannot change an exact integer
 * sum, and the memory layout (3 bytes a pixel instead of PIL's 4, no copy into PIL).
 *
 * pillow-simd rounds its weights to 16 bits instead, at a precision chosen per pass, and otherwise
 * sums alike; ``weights`` selects its arithmetic, so that the kernel matches whichever is installed.
 *
 * The wide variants (AVX2; AVX-512 with VNNI) split each 23-bit weight w into hi = w >> 11 and
 * lo = w & 2047, both 16-bit, so that pixel * w = (pixel * hi << 11) + pixel * lo can be summed
 * with 16-bit multiply-adds; (hi_sum + ((lo_sum + 2^21) >> 11)) >> 11 is then exactly PIL's
 * (sum + 2^21) >> 22. (pillow-simd instead rounds the weights to 16 bits, which is why its output
 * differs from Pillow's.) The RGB horizontal pass runs two (AVX2) or four (AVX-512) rows at once,
 * a 128-bit lane per row, and writes four output pixels per step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

#if NANO_X86
#include <immintrin.h>
#endif

#define PRECISION_BITS (32 - 8 - 2)
#define NANO_PI 3.14159265358979323846

/* --- filters: PIL's expressions, in PIL's order of operations --- */

static double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

static double bilinear_filter(double x) {
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double hamming_filter(double x) {
    if (x < 0.0)
        x = -x;
    if (x == 0.0)
        return 1.0;
    if (x >= 1.0)
        return 0.0;
    x = x * NANO_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x));
}

static double bicubic_filter(double x) {
    const double a = -0.5;
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc_filter(double x) {
    if (x == 0.0)
        return 1.0;
    x = x * NANO_PI;
    return sin(x) / x;
}

static double lanczos_filter(double x) {
    if (-3.0 <= x && x < 3.0)
        return sinc_filter(x) * sinc_filter(x / 3);
    return 0.0;
}

static double mks2013_filter(double x) {
    if (x < 0)
        x = -x;
    if (x < 0.5)
        return 17.0 / 16.0 - 7.0 / 4.0 * pow(x, 2);
    if (x < 1.5)
        return (1.0 - x) * (7.0 / 4.0 - x);
    if (x < 2.5)
        return -1.0 / 8.0 * pow(x - 5.0 / 2.0, 2);
    return 0;
}

static double mks2021_filter(double x) {
    if (x < 0)
        x = -x;
    if (x < 0.5)
        return 577.0 / 576.0 - 239.0 / 144.0 * pow(x, 2);
    if (x < 1.5)
        return 35.0 / 36.0 * (x - 1.0) * (x - 239.0 / 140.0);
    if (x < 2.5)
        return 1.0 / 6.0 * (x - 2.0) * (65.0 / 24.0 - x);
    if (x < 3.5)
        return 1.0 / 36.0 * (x - 3.0) * (x - 15.0 / 4.0);
    if (x < 4.5)
        return -1.0 / 288.0 * pow(x - 9.0 / 2.0, 2);
    return 0;
}

typedef struct {
    double (*fn)(double);
    double support;
} filter_def;

static int find_filter(int filter, filter_def *out) {
    switch (filter) {
    case NANO_BOX: *out = (filter_def){box_filter, 0.5}; return 0;
    case NANO_BILINEAR: *out = (filter_def){bilinear_filter, 1.0}; return 0;
    case NANO_HAMMING: *out = (filter_def){hamming_filter, 1.0}; return 0;
    case NANO_BICUBIC: *out = (filter_def){bicubic_filter, 2.0}; return 0;
    case NANO_LANCZOS: *out = (filter_def){lanczos_filter, 3.0}; return 0;
    case NANO_MKS2013: *out = (filter_def){mks2013_filter, 2.5}; return 0;
    case NANO_MKS2021: *out = (filter_def){mks2021_filter, 4.5}; return 0;
    default: return -2;
    }
}

/* --- weights --- */

typedef struct {
    int out_size, ksize;
    int *bounds;   /* per output: first input index, number of inputs */
    int32_t *kk;   /* out_size x ksize fixed-point weights, zero past each window */
    int precision; /* fixed-point bits of the weights: 22 (Pillow), or pillow-simd's per-pass choice */
} coeffs;

static inline int32_t rounding_of(const coeffs *c) { return (int32_t)1 << (c->precision - 1); }

static void coeffs_free(coeffs *c) {
    free(c->bounds);
    free(c->kk);
    c->bounds = NULL;
    c->kk = NULL;
}

/* pillow-simd's 16-bit weights: the most precision (at most 22 bits) at which the largest weight,
 * doubled, stays below 2^15 (its normalize_coeffs_8bpc). */
static int simd_precision(const double *k, size_t n) {
    double maxkk = k[0];
    for (size_t x = 0; x < n; x++)
        if (maxkk < k[x])
            maxkk = k[x];
    int p;
    for (p = 0; p < PRECISION_BITS; p += 1) {
        int next_value = (int)(0.5 + maxkk * (1 << (p + 1)));
        if (next_value >= (1 << 15))
            break;
    }
    return p;
}

/* precompute_coeffs + normalize_coeffs_8bpc. in0 and in1 are PIL's float box edges. ``weights``:
 * NANO_WEIGHTS_PILLOW (22-bit) or NANO_WEIGHTS_PILLOW_SIMD (16-bit, precision per pass). */
static int coeffs_compute(int in_size, float in0, float in1, int out_size, const filter_def *f, int weights,
                          coeffs *c) {
    double support, scale, filterscale;
    int xx, x, ksize, xmin, xmax;
    double *kd;

    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = f->support * filterscale;
    ksize = (int)ceil(support) * 2 + 1;
    if (ksize <= 0 || out_size > (1 << 28) / ksize)
        return -1;
    c->out_size = out_size;
    c->ksize = ksize;
    c->bounds = malloc((size_t)out_size * 2 * sizeof(int));
    c->kk = malloc((size_t)out_size * ksize * sizeof(int32_t));
    kd = malloc((size_t)out_size * ksize * sizeof(double));
    if (!c->bounds || !c->kk || !kd) {
        free(kd);
        coeffs_free(c);
        return -1;
    }
    double inv_filterscale = 1.0 / filterscale;
    for (xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        double *k = kd + (size_t)xx * ksize;
        xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        for (x = 0; x < xmax; x++) {
            double w = f->fn((x + xmin - center + 0.5) * inv_filterscale);
            k[x] = w;
            ww += w;
        }
        if (ww != 0.0)
            for (x = 0; x < xmax; x++)
                k[x] /= ww;
        for (; x < ksize; x++)
            k[x] = 0;
        c->bounds[xx * 2 + 0] = xmin;
        c->bounds[xx * 2 + 1] = xmax;
    }
    size_t n = (size_t)out_size * ksize;
    c->precision = weights == NANO_WEIGHTS_PILLOW_SIMD ? simd_precision(kd, n) : PRECISION_BITS;
    if (c->precision < 1) /* no weight fits: nothing sensible to compute */
        c->precision = 1;
    for (size_t i = 0; i < n; i++) {
        double w = kd[i];
        c->kk[i] = w < 0 ? (int)(-0.5 + w * (1 << c->precision)) : (int)(0.5 + w * (1 << c->precision));
    }
    free(kd);
    return 0;
}

static inline uint8_t clip8(int32_t ss, int precision) {
    int32_t v = ss >> precision;
    return v < 0 ? 0 : (v > 255 ? 255 : (uint8_t)v);
}

/* --- portable passes --- */

/* rows of src (row_bytes each) -> rows of dst, each output pixel a window of input pixels. */
static void hpass_generic(const uint8_t *src, ptrdiff_t sstride, int rows, int channels, uint8_t *dst,
                          ptrdiff_t dstride, const coeffs *c, int flip) {
    int out_w = c->out_size, prec = c->precision;
    const int32_t r = rounding_of(c);
    for (int y = 0; y < rows; y++) {
        const uint8_t *line = src + (ptrdiff_t)y * sstride;
        uint8_t *out = dst + (ptrdiff_t)y * dstride;
        for (int xx = 0; xx < out_w; xx++) {
            int xmin = c->bounds[xx * 2], n = c->bounds[xx * 2 + 1];
            const int32_t *k = c->kk + (size_t)xx * c->ksize;
            uint8_t *o = out + (size_t)(flip ? out_w - 1 - xx : xx) * channels;
            if (channels == 3) {
                int32_t s0 = r, s1 = r, s2 = r;
                const uint8_t *p = line + (size_t)xmin * 3;
                for (int x = 0; x < n; x++, p += 3) {
                    s0 += p[0] * k[x];
                    s1 += p[1] * k[x];
                    s2 += p[2] * k[x];
                }
                o[0] = clip8(s0, prec);
                o[1] = clip8(s1, prec);
                o[2] = clip8(s2, prec);
            } else {
                int32_t s0 = r;
                const uint8_t *p = line + xmin;
                for (int x = 0; x < n; x++)
                    s0 += p[x] * k[x];
                o[0] = clip8(s0, prec);
            }
        }
    }
}

/* Each output row is a weighted sum of input rows; the same for every byte of the row. */
static void vpass_generic(const uint8_t *src, ptrdiff_t sstride, int row_bytes, uint8_t *dst, ptrdiff_t dstride,
                          const coeffs *c, int32_t *acc) {
    const int32_t r = rounding_of(c);
    for (int yy = 0; yy < c->out_size; yy++) {
        int ymin = c->bounds[yy * 2], n = c->bounds[yy * 2 + 1];
        const int32_t *k = c->kk + (size_t)yy * c->ksize;
        for (int x = 0; x < row_bytes; x++)
            acc[x] = r;
        for (int y = 0; y < n; y++) {
            const uint8_t *line = src + (ptrdiff_t)(ymin + y) * sstride;
            int32_t w = k[y];
            for (int x = 0; x < row_bytes; x++)
                acc[x] += line[x] * w;
        }
        uint8_t *out = dst + (ptrdiff_t)yy * dstride;
        for (int x = 0; x < row_bytes; x++)
            out[x] = clip8(acc[x], c->precision);
    }
}

#if NANO_X86

/* A weight as the two 16-bit halves the wide passes multiply: Pillow's 23-bit weights as
 * (w >> 11, w & 2047); pillow-simd's 16-bit weights whole, in the lo half. The sums recombine
 * as (hi_sum + ((lo_sum + rounding) >> lo_shift)) >> hi_shift, which is (sum + rounding) >> precision. */
static inline void split_weight(const coeffs *c, int32_t w, uint32_t *hi, uint32_t *lo) {
    if (c->precision == PRECISION_BITS) {
        *hi = (uint16_t)(int16_t)(w >> 11);
        *lo = (uint32_t)(w & 2047);
    } else {
        *hi = 0;
        *lo = (uint16_t)(int16_t)w;
    }
}

static inline int lo_shift_of(const coeffs *c) { return c->precision == PRECISION_BITS ? 11 : c->precision; }
static inline int hi_shift_of(const coeffs *c) { return c->precision == PRECISION_BITS ? 11 : 0; }

/* The weights of a pass as 16-bit (hi, lo) halves, two taps to a 32-bit word, for madd. */
typedef struct {
    int pairs;        /* pairs of taps per output, padded */
    int32_t *hi, *lo; /* out_size x pairs words: (w[2p+1] part << 16) | (w[2p] part & 0xffff) */
} split_coeffs;

static int split_make(const coeffs *c, int pair_multiple, split_coeffs *s) {
    int max_n = 0;
    for (int i = 0; i < c->out_size; i++)
        if (c->bounds[i * 2 + 1] > max_n)
            max_n = c->bounds[i * 2 + 1];
    int pairs = (max_n + 1) / 2;
    pairs = (pairs + pair_multiple - 1) / pair_multiple * pair_multiple;
    if (pairs == 0)
        pairs = pair_multiple;
    s->pairs = pairs;
    s->hi = malloc((size_t)c->out_size * pairs * sizeof(int32_t));
    s->lo = malloc((size_t)c->out_size * pairs * sizeof(int32_t));
    if (!s->hi || !s->lo) {
        free(s->hi);
        free(s->lo);
        return -1;
    }
    for (int i = 0; i < c->out_size; i++) {
        int n = c->bounds[i * 2 + 1];
        const int32_t *k = c->kk + (size_t)i * c->ksize;
        for (int p = 0; p < pairs; p++) {
            int32_t w0 = 2 * p < n ? k[2 * p] : 0, w1 = 2 * p + 1 < n ? k[2 * p + 1] : 0;
            uint32_t h0, h1, l0, l1;
            split_weight(c, w0, &h0, &l0);
            split_weight(c, w1, &h1, &l1);
            s->hi[(size_t)i * pairs + p] = (int32_t)(h0 | (h1 << 16));
            s->lo[(size_t)i * pairs + p] = (int32_t)(l0 | (l1 << 16));
        }
    }
    return 0;
}

static void split_free(split_coeffs *s) {
    free(s->hi);
    free(s->lo);
}

#define HLOAD2(p0, p1, off) \
    _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((p0) + (off)))), \
                            _mm_loadu_si128((const __m128i *)((p1) + (off))), 1)

/* (hi << lo_shift) + lo + rounding, shifted right by the precision: the same floor, taken in two
 * steps so the rounding term joins the lo sum first (split_weight). */
NANO_TARGET("avx2")
static inline __m256i hfinish_avx2(__m256i acc_hi, __m256i acc_lo_rounded, __m128i lo_shift, __m128i hi_shift) {
    return _mm256_sra_epi32(_mm256_add_epi32(acc_hi, _mm256_sra_epi32(acc_lo_rounded, lo_shift)), hi_shift);
}

/* Two rows at a time (a lane each), four output pixels per step, G groups of four taps for every
 * output (weights zero past a window). `kw`: per output, in writing order, G x {hi01, hi23, lo01,
 * lo23}. Outputs [begin, end) only: their 16-byte loads stay inside the row. */
#define HMAC_AVX2(G, l0, l1, off, k, res)                                                                  \
    do {                                                                                                   \
        __m256i h_ = _mm256_setzero_si256(), w_ = rounding;                                                \
        for (int g = 0; g < G; g++) {                                                                      \
            __m256i v_ = HLOAD2(l0, l1, (off) + 12 * g);                                                   \
            __m256i a0_ = _mm256_shuffle_epi8(v_, taps01), a1_ = _mm256_shuffle_epi8(v_, taps23);          \
            h_ = _mm256_add_epi32(h_, _mm256_add_epi32(_mm256_madd_epi16(a0_, _mm256_set1_epi32((k)[4 * g])),         \
                                                       _mm256_madd_epi16(a1_, _mm256_set1_epi32((k)[4 * g + 1])))); \
            w_ = _mm256_add_epi32(w_, _mm256_add_epi32(_mm256_madd_epi16(a0_, _mm256_set1_epi32((k)[4 * g + 2])),     \
                                                       _mm256_madd_epi16(a1_, _mm256_set1_epi32((k)[4 * g + 3])))); \
        }                                                                                                  \
        res = hfinish_avx2(h_, w_, lo_shift, hi_shift);                                                    \
    } while (0)

#define DEFINE_HPASS3_AVX2(NAME, G)                                                                        \
    NANO_TARGET("avx2")                                                                                    \
    static void NAME(const uint8_t *src, ptrdiff_t sstride, int rows, uint8_t *dst, ptrdiff_t dstride,    \
                     int out_w, int begin, int end, const int *offsets, const int32_t *kw, int groups,     \
                     int32_t r, const int *shifts) {                                                       \
        (void)groups;                                                                                      \
        const __m256i taps01 = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,   \
                                                0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);  \
        const __m256i taps23 = _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, \
                                                6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);\
        const __m256i compact = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,    \
                                                 0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);   \
        const __m256i rounding = _mm256_set1_epi32(r);                                                     \
        const __m128i lo_shift = _mm_cvtsi32_si128(shifts[0]), hi_shift = _mm_cvtsi32_si128(shifts[1]);    \
        for (int y = 0; y < rows; y += 2) {                                                                \
            const uint8_t *l0 = src + (ptrdiff_t)y * sstride, *l1 = y + 1 < rows ? l0 + sstride : l0;    \
            uint8_t *o0 = dst + (ptrdiff_t)y * dstride, *o1 = o0 + dstride;                                \
            for (int i = begin; i < end; i += 4) {                                                         \
                int i1 = i + 1 < end ? i + 1 : i, i2 = i + 2 < end ? i + 2 : i, i3 = i + 3 < end ? i + 3 : i; \
                __m256i r0, r1, r2, r3;                                                                    \
                HMAC_AVX2(G, l0, l1, offsets[i], kw + (size_t)i * 4 * G, r0);                              \
                HMAC_AVX2(G, l0, l1, offsets[i1], kw + (size_t)i1 * 4 * G, r1);                            \
                HMAC_AVX2(G, l0, l1, offsets[i2], kw + (size_t)i2 * 4 * G, r2);                            \
                HMAC_AVX2(G, l0, l1, offsets[i3], kw + (size_t)i3 * 4 * G, r3);                            \
                /* a lane per row: four pixels, RGB, then four spare bytes */                              \
                __m256i px = _mm256_packus_epi16(_mm256_packs_epi32(r0, r1), _mm256_packs_epi32(r2, r3));   \
                px = _mm256_shuffle_epi8(px, compact);                                                     \
                __m128i row0 = _mm256_castsi256_si128(px), row1 = _mm256_extracti128_si256(px, 1);        \
                size_t at = (size_t)i * 3;                                                                 \
                if (i + 6 <= out_w && i + 4 <= end) { /* the spare bytes are written again later */        \
                    _mm_storeu_si128((__m128i *)(o0 + at), row0);                                          \
                    if (y + 1 < rows)                                                                      \
                        _mm_storeu_si128((__m128i *)(o1 + at), row1);                                      \
                } else {                                                                                   \
                    uint8_t t_[2][16];                                                                     \
                    size_t n_ = (size_t)((end - i < 4 ? end - i : 4) * 3);                                 \
                    _mm_storeu_si128((__m128i *)t_[0], row0);                                              \
                    _mm_storeu_si128((__m128i *)t_[1], row1);                                              \
                    memcpy(o0 + at, t_[0], n_);                                                            \
                    if (y + 1 < rows)                                                                      \
                        memcpy(o1 + at, t_[1], n_);                                                        \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }

DEFINE_HPASS3_AVX2(hpass3_avx2_g1, 1)
DEFINE_HPASS3_AVX2(hpass3_avx2_g2, 2)
DEFINE_HPASS3_AVX2(hpass3_avx2_g3, 3)
DEFINE_HPASS3_AVX2(hpass3_avx2_gn, groups)

#define NANO_AVX512 "avx512f,avx512bw,avx512vl,avx512vnni"

/* Four rows at a time (a 128-bit lane each), four output pixels per step; as the AVX2 pass, with
 * VNNI's fused multiply-add-accumulate. */
#define HMAC_AVX512(G, off, k, res)                                                                        \
    do {                                                                                                   \
        __m512i h_ = _mm512_setzero_si512(), w_ = rounding;                                                \
        for (int g = 0; g < G; g++) {                                                                      \
            size_t o_ = (size_t)(off) + 12 * g;                                                            \
            __m512i v_ = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(l0 + o_)));             \
            v_ = _mm512_inserti32x4(v_, _mm_loadu_si128((const __m128i *)(l1 + o_)), 1);                  \
            v_ = _mm512_inserti32x4(v_, _mm_loadu_si128((const __m128i *)(l2 + o_)), 2);                  \
            v_ = _mm512_inserti32x4(v_, _mm_loadu_si128((const __m128i *)(l3 + o_)), 3);                  \
            __m512i a0_ = _mm512_shuffle_epi8(v_, taps01), a1_ = _mm512_shuffle_epi8(v_, taps23);          \
            h_ = _mm512_dpwssd_epi32(h_, a0_, _mm512_set1_epi32((k)[4 * g]));                              \
            h_ = _mm512_dpwssd_epi32(h_, a1_, _mm512_set1_epi32((k)[4 * g + 1]));                          \
            w_ = _mm512_dpwssd_epi32(w_, a0_, _mm512_set1_epi32((k)[4 * g + 2]));                          \
            w_ = _mm512_dpwssd_epi32(w_, a1_, _mm512_set1_epi32((k)[4 * g + 3]));                          \
        }                                                                                                  \
        res = _mm512_sra_epi32(_mm512_add_epi32(h_, _mm512_sra_epi32(w_, lo_shift)), hi_shift);            \
    } while (0)

#define DEFINE_HPASS3_AVX512(NAME, G)                                                                      \
    NANO_TARGET(NANO_AVX512)                                                                               \
    static void NAME(const uint8_t *src, ptrdiff_t sstride, int rows, uint8_t *dst, ptrdiff_t dstride,    \
                     int out_w, int begin, int end, const int *offsets, const int32_t *kw, int groups,     \
                     int32_t r, const int *shifts) {                                                       \
        (void)groups;                                                                                      \
        const __m512i taps01 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1)); \
        const __m512i taps23 = _mm512_broadcast_i32x4(_mm_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1)); \
        const __m512i compact = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1)); \
        const __m512i rounding = _mm512_set1_epi32(r);                                                     \
        const __m128i lo_shift = _mm_cvtsi32_si128(shifts[0]), hi_shift = _mm_cvtsi32_si128(shifts[1]);    \
        for (int y = 0; y < rows; y += 4) {                                                                \
            int live = rows - y < 4 ? rows - y : 4;                                                        \
            const uint8_t *l0 = src + (ptrdiff_t)y * sstride;                                              \
            const uint8_t *l1 = live > 1 ? l0 + sstride : l0, *l2 = live > 2 ? l0 + 2 * sstride : l0;     \
            const uint8_t *l3 = live > 3 ? l0 + 3 * sstride : l0;                                          \
            uint8_t *o[4];                                                                                 \
            for (int r = 0; r < 4; r++)                                                                    \
                o[r] = dst + (ptrdiff_t)(y + r) * dstride;                                                 \
            for (int i = begin; i < end; i += 4) {                                                         \
                int i1 = i + 1 < end ? i + 1 : i, i2 = i + 2 < end ? i + 2 : i, i3 = i + 3 < end ? i + 3 : i; \
                __m512i r0, r1, r2, r3;                                                                    \
                HMAC_AVX512(G, offsets[i], kw + (size_t)i * 4 * G, r0);                                    \
                HMAC_AVX512(G, offsets[i1], kw + (size_t)i1 * 4 * G, r1);                                  \
                HMAC_AVX512(G, offsets[i2], kw + (size_t)i2 * 4 * G, r2);                                  \
                HMAC_AVX512(G, offsets[i3], kw + (size_t)i3 * 4 * G, r3);                                  \
                __m512i px = _mm512_packus_epi16(_mm512_packs_epi32(r0, r1), _mm512_packs_epi32(r2, r3));   \
                px = _mm512_shuffle_epi8(px, compact);                                                     \
                __m128i q[4] = {_mm512_castsi512_si128(px), _mm512_extracti32x4_epi32(px, 1),             \
                                _mm512_extracti32x4_epi32(px, 2), _mm512_extracti32x4_epi32(px, 3)};      \
                size_t at = (size_t)i * 3;                                                                 \
                if (i + 6 <= out_w && i + 4 <= end) {                                                      \
                    for (int r = 0; r < live; r++)                                                         \
                        _mm_storeu_si128((__m128i *)(o[r] + at), q[r]);                                    \
                } else {                                                                                   \
                    uint8_t t_[16];                                                                        \
                    size_t n_ = (size_t)((end - i < 4 ? end - i : 4) * 3);                                 \
                    for (int r = 0; r < live; r++) {                                                       \
                        _mm_storeu_si128((__m128i *)t_, q[r]);                                             \
                        memcpy(o[r] + at, t_, n_);                                                         \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }

DEFINE_HPASS3_AVX512(hpass3_avx512_g1, 1)
DEFINE_HPASS3_AVX512(hpass3_avx512_g2, 2)
DEFINE_HPASS3_AVX512(hpass3_avx512_g3, 3)
DEFINE_HPASS3_AVX512(hpass3_avx512_gn, groups)

typedef void (*hpass3_fn)(const uint8_t *, ptrdiff_t, int, uint8_t *, ptrdiff_t, int, int, int, const int *,
                          const int32_t *, int, int32_t, const int *);

/* The RGB horizontal pass with the widest kernels: weights split and laid out in writing order;
 * the few outputs at the right edge of the input, whose loads would run past the row, in C. */
static int hpass3_simd(const uint8_t *src, ptrdiff_t sstride, int rows, int in_w, uint8_t *dst, ptrdiff_t dstride,
                       const coeffs *c, int flip, int isa) {
    int out_w = c->out_size, max_n = 0;
    for (int i = 0; i < out_w; i++)
        if (c->bounds[i * 2 + 1] > max_n)
            max_n = c->bounds[i * 2 + 1];
    int G = (max_n + 3) / 4;
    if (G < 1)
        G = 1;
    int *offsets = malloc((size_t)out_w * sizeof(int));
    int32_t *kw = malloc((size_t)out_w * 4 * G * sizeof(int32_t));
    if (!offsets || !kw) {
        free(offsets);
        free(kw);
        return -1;
    }
    /* Outputs in writing order. Those whose 16-byte loads would run past the end of the row are
     * at one end (the right edge of the input), and are left to the portable code. */
    size_t row_bytes = (size_t)in_w * 3;
    int begin = 0, end = out_w;
    for (int i = 0; i < out_w; i++) {
        int xx = flip ? out_w - 1 - i : i;
        int xmin = c->bounds[xx * 2], n = c->bounds[xx * 2 + 1];
        const int32_t *k = c->kk + (size_t)xx * c->ksize;
        offsets[i] = xmin * 3;
        for (int t = 0; t < 4 * G; t += 2) {
            int32_t w0 = t < n ? k[t] : 0, w1 = t + 1 < n ? k[t + 1] : 0;
            uint32_t h0, h1, l0, l1;
            split_weight(c, w0, &h0, &l0);
            split_weight(c, w1, &h1, &l1);
            uint32_t h = h0 | (h1 << 16), l = l0 | (l1 << 16);
            int g = t / 4, j = (t / 2) % 2;
            kw[(size_t)i * 4 * G + 4 * g + j] = (int32_t)h;
            kw[(size_t)i * 4 * G + 4 * g + 2 + j] = (int32_t)l;
        }
        if ((size_t)xmin * 3 + 12 * (size_t)(G - 1) + 16 > row_bytes) {
            if (flip)
                begin = i + 1;
            else if (end == out_w)
                end = i;
        }
    }
    static const hpass3_fn avx2[4] = {hpass3_avx2_g1, hpass3_avx2_g2, hpass3_avx2_g3, hpass3_avx2_gn};
    static const hpass3_fn avx512[4] = {hpass3_avx512_g1, hpass3_avx512_g2, hpass3_avx512_g3, hpass3_avx512_gn};
    int simd = begin < end ? end - begin : 0;
    const int shifts[2] = {lo_shift_of(c), hi_shift_of(c)};
    const int32_t r = rounding_of(c);
    if (simd)
        (isa >= NANO_ISA_AVX512 ? avx512 : avx2)[G < 4 ? G - 1 : 3](src, sstride, rows, dst, dstride, out_w, begin,
                                                                    end, offsets, kw, G, r, shifts);
    /* the edge outputs, after the wide stores that spilled spare bytes into them */
    for (int y = 0; y < rows; y++) {
        const uint8_t *line = src + (ptrdiff_t)y * sstride;
        uint8_t *out = dst + (ptrdiff_t)y * dstride;
        for (int j = 0; j < out_w - simd; j++) {
            int i = j < begin ? j : j + simd;
            int xx = flip ? out_w - 1 - i : i;
            int xmin = c->bounds[xx * 2], n = c->bounds[xx * 2 + 1];
            const int32_t *k = c->kk + (size_t)xx * c->ksize;
            int32_t s0 = r, s1 = r, s2 = r;
            const uint8_t *p = line + (size_t)xmin * 3;
            for (int x = 0; x < n; x++, p += 3) {
                s0 += p[0] * k[x];
                s1 += p[1] * k[x];
                s2 += p[2] * k[x];
            }
            out[i * 3 + 0] = clip8(s0, c->precision);
            out[i * 3 + 1] = clip8(s1, c->precision);
            out[i * 3 + 2] = clip8(s2, c->precision);
        }
    }
    free(offsets);
    free(kw);
    return 0;
}

/* 16 bytes of two rows -> the two madd inputs (lo and hi eight bytes, rows interleaved). */
#define VPASS_ACC(k, a, b, acc_lh, acc_ll, acc_hh, acc_hl)                                  \
    do {                                                                                    \
        __m256i lo_ = _mm256_unpacklo_epi16(a, b), hi_ = _mm256_unpackhi_epi16(a, b);      \
        acc_lh = _mm256_add_epi32(acc_lh, _mm256_madd_epi16(lo_, k##_h));                  \
        acc_ll = _mm256_add_epi32(acc_ll, _mm256_madd_epi16(lo_, k##_l));                  \
        acc_hh = _mm256_add_epi32(acc_hh, _mm256_madd_epi16(hi_, k##_h));                  \
        acc_hl = _mm256_add_epi32(acc_hl, _mm256_madd_epi16(hi_, k##_l));                  \
    } while (0)

NANO_TARGET("avx2")
static inline __m256i vfinish_avx2(__m256i acc_h, __m256i acc_l_rounded, __m128i lo_shift, __m128i hi_shift) {
    return _mm256_sra_epi32(_mm256_add_epi32(acc_h, _mm256_sra_epi32(acc_l_rounded, lo_shift)), hi_shift);
}

NANO_TARGET("avx2")
static int vpass_avx2(const uint8_t *src, ptrdiff_t sstride, int row_bytes, uint8_t *dst, ptrdiff_t dstride,
                      const coeffs *c) {
    split_coeffs s;
    if (split_make(c, 1, &s))
        return -1;
    const __m128i ls = _mm_cvtsi32_si128(lo_shift_of(c)), hs = _mm_cvtsi32_si128(hi_shift_of(c));
    for (int yy = 0; yy < c->out_size; yy++) {
        int ymin = c->bounds[yy * 2], n = c->bounds[yy * 2 + 1];
        const int32_t *hi = s.hi + (size_t)yy * s.pairs, *lo = s.lo + (size_t)yy * s.pairs;
        int pairs = (n + 1) / 2;
        uint8_t *out = dst + (ptrdiff_t)yy * dstride;
        int x = 0;
        for (; x + 32 <= row_bytes; x += 32) {
            const __m256i r = _mm256_set1_epi32(rounding_of(c));
            __m256i a_lh = _mm256_setzero_si256(), a_hh = a_lh, b_lh = a_lh, b_hh = a_lh;
            __m256i a_ll = r, a_hl = r, b_ll = r, b_hl = r;
            for (int p = 0; p < pairs; p++) {
                const uint8_t *r0 = src + (ptrdiff_t)(ymin + 2 * p) * sstride + x;
                const uint8_t *r1 = 2 * p + 1 < n ? r0 + sstride : r0; /* its weight is 0 then */
                __m256i k_h = _mm256_set1_epi32(hi[p]), k_l = _mm256_set1_epi32(lo[p]);
                __m256i a0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)r0));
                __m256i a1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)r1));
                __m256i b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(r0 + 16)));
                __m256i b1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(r1 + 16)));
                VPASS_ACC(k, a0, a1, a_lh, a_ll, a_hh, a_hl);
                VPASS_ACC(k, b0, b1, b_lh, b_ll, b_hh, b_hl);
            }
            __m256i a = _mm256_packs_epi32(vfinish_avx2(a_lh, a_ll, ls, hs), vfinish_avx2(a_hh, a_hl, ls, hs));
            __m256i b = _mm256_packs_epi32(vfinish_avx2(b_lh, b_ll, ls, hs), vfinish_avx2(b_hh, b_hl, ls, hs));
            __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
            _mm256_storeu_si256((__m256i *)(out + x), bytes);
        }
        if (x < row_bytes) {
            const int32_t *k = c->kk + (size_t)yy * c->ksize;
            for (; x < row_bytes; x++) {
                int32_t ss = rounding_of(c);
                for (int y = 0; y < n; y++)
                    ss += src[(ptrdiff_t)(ymin + y) * sstride + x] * k[y];
                out[x] = clip8(ss, c->precision);
            }
        }
    }
    split_free(&s);
    return 0;
}

NANO_TARGET(NANO_AVX512)
static inline __m512i vfinish_avx512(__m512i h, __m512i l, __m128i lo_shift, __m128i hi_shift) {
    return _mm512_sra_epi32(_mm512_add_epi32(h, _mm512_sra_epi32(l, lo_shift)), hi_shift);
}

/* The vertical pass, 64 bytes of a row per step, VNNI multiply-accumulates; the rest of each row
 * (fewer than 64 bytes) goes through the AVX2 code. */
NANO_TARGET(NANO_AVX512)
static int vpass_avx512(const uint8_t *src, ptrdiff_t sstride, int row_bytes, uint8_t *dst, ptrdiff_t dstride,
                        const coeffs *c) {
    split_coeffs s;
    if (split_make(c, 1, &s))
        return -1;
    const __m512i rounding = _mm512_set1_epi32(rounding_of(c));
    const __m128i ls = _mm_cvtsi32_si128(lo_shift_of(c)), hs = _mm_cvtsi32_si128(hi_shift_of(c));
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    int wide = row_bytes / 64 * 64;
    for (int yy = 0; yy < c->out_size; yy++) {
        int ymin = c->bounds[yy * 2], n = c->bounds[yy * 2 + 1];
        const int32_t *hi = s.hi + (size_t)yy * s.pairs, *lo = s.lo + (size_t)yy * s.pairs;
        int pairs = (n + 1) / 2;
        uint8_t *out = dst + (ptrdiff_t)yy * dstride;
        for (int x = 0; x < wide; x += 64) {
            __m512i h0 = _mm512_setzero_si512(), h1 = h0, h2 = h0, h3 = h0;
            __m512i l0 = rounding, l1 = rounding, l2 = rounding, l3 = rounding;
            for (int p = 0; p < pairs; p++) {
                const uint8_t *r0 = src + (ptrdiff_t)(ymin + 2 * p) * sstride + x;
                const uint8_t *r1 = 2 * p + 1 < n ? r0 + sstride : r0;
                __m512i kh = _mm512_set1_epi32(hi[p]), kl = _mm512_set1_epi32(lo[p]);
                __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)r0));
                __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)r1));
                __m512i u = _mm512_unpacklo_epi16(a, b), v = _mm512_unpackhi_epi16(a, b);
                h0 = _mm512_dpwssd_epi32(h0, u, kh);
                l0 = _mm512_dpwssd_epi32(l0, u, kl);
                h1 = _mm512_dpwssd_epi32(h1, v, kh);
                l1 = _mm512_dpwssd_epi32(l1, v, kl);
                a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(r0 + 32)));
                b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(r1 + 32)));
                u = _mm512_unpacklo_epi16(a, b);
                v = _mm512_unpackhi_epi16(a, b);
                h2 = _mm512_dpwssd_epi32(h2, u, kh);
                l2 = _mm512_dpwssd_epi32(l2, u, kl);
                h3 = _mm512_dpwssd_epi32(h3, v, kh);
                l3 = _mm512_dpwssd_epi32(l3, v, kl);
            }
            __m512i p0 = _mm512_packs_epi32(vfinish_avx512(h0, l0, ls, hs), vfinish_avx512(h1, l1, ls, hs));
            __m512i p1 = _mm512_packs_epi32(vfinish_avx512(h2, l2, ls, hs), vfinish_avx512(h3, l3, ls, hs));
            _mm512_storeu_si512((void *)(out + x), _mm512_permutexvar_epi64(order, _mm512_packus_epi16(p0, p1)));
        }
    }
    split_free(&s);
    if (wide < row_bytes) /* the last bytes of every row */
        return vpass_avx2(src + wide, sstride, row_bytes - wide, dst + wide, dstride, c);
    return 0;
}

#endif /* NANO_X86 */

static int hpass(const uint8_t *src, ptrdiff_t sstride, int rows, int in_w, int channels, uint8_t *dst,
                 ptrdiff_t dstride, const coeffs *c, int flip, int isa) {
#if NANO_X86
    if (isa >= NANO_ISA_AVX2 && channels == 3) {
        return hpass3_simd(src, sstride, rows, in_w, dst, dstride, c, flip, isa);
    }
#else
    (void)in_w;
    (void)isa;
#endif
    hpass_generic(src, sstride, rows, channels, dst, dstride, c, flip);
    return 0;
}

static int vpass(const uint8_t *src, ptrdiff_t sstride, int row_bytes, uint8_t *dst, ptrdiff_t dstride,
                 const coeffs *c, int isa) {
#if NANO_X86
    if (isa >= NANO_ISA_AVX512)
        return vpass_avx512(src, sstride, row_bytes, dst, dstride, c);
    if (isa >= NANO_ISA_AVX2)
        return vpass_avx2(src, sstride, row_bytes, dst, dstride, c);
#else
    (void)isa;
#endif
    int32_t *acc = malloc((size_t)row_bytes * sizeof(int32_t));
    if (!acc)
        return -1;
    vpass_generic(src, sstride, row_bytes, dst, dstride, c, acc);
    free(acc);
    return 0;
}

static void flip_rows(uint8_t *dst, ptrdiff_t dstride, int w, int h, int channels) {
    for (int y = 0; y < h; y++) {
        uint8_t *row = dst + (ptrdiff_t)y * dstride;
        for (int a = 0, b = w - 1; a < b; a++, b--)
            for (int ch = 0; ch < channels; ch++) {
                uint8_t t = row[a * channels + ch];
                row[a * channels + ch] = row[b * channels + ch];
                row[b * channels + ch] = t;
            }
    }
}

/* The weights of outputs [first, first + count) of a pass, sharing the full table's memory. */
static coeffs coeffs_window(const coeffs *c, int first, int count) {
    coeffs w = {count, c->ksize, c->bounds + 2 * (size_t)first, c->kk + (size_t)first * c->ksize, c->precision};
    return w;
}

int nano_resample(const nano_view *src, uint8_t *dst, ptrdiff_t dst_stride, int full_w, int full_h, int x0, int y0,
                  int out_w, int out_h, int filter, const float box[4], int flip, int order_rule, int weights,
                  int isa) {
    filter_def f;
    int in_w = src->width, in_h = src->height, ch = src->channels;
    if (find_filter(filter, &f))
        return -2;
    if (in_w <= 0 || in_h <= 0 || full_w <= 0 || full_h <= 0 || out_w <= 0 || out_h <= 0 || x0 < 0 || y0 < 0 ||
        x0 + out_w > full_w || y0 + out_h > full_h || (ch != 1 && ch != 3))
        return -3;
    /* PIL's own checks on the box (_imaging.c), and no NaN */
    if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= in_w && box[3] <= in_h && box[2] - box[0] > 0 &&
          box[3] - box[1] > 0))
        return -3;

    /* PIL's decisions, on the full output size */
    int need_h = full_w != in_w || box[0] || box[2] != full_w;
    int need_v = full_h != in_h || box[1] || box[3] != full_h;
    int h_first = order_rule == NANO_ORDER_HORIZONTAL_FIRST ||
                  !((in_h - full_h) > 0 && (in_h - full_h) > (in_w - full_w) * 2);
    coeffs cv = {0}, chz = {0}, vw = {0}, hw = {0};
    uint8_t *tmp = NULL;
    int rc = 0;

    if (need_v || (need_h && h_first)) {
        if (coeffs_compute(in_h, box[1], box[3], full_h, &f, weights, &cv))
            return -1;
        vw = coeffs_window(&cv, y0, out_h);
    }
    if (need_h) {
        if (coeffs_compute(in_w, box[0], box[2], full_w, &f, weights, &chz)) {
            rc = -1;
            goto end;
        }
        hw = coeffs_window(&chz, x0, out_w);
    }

    /* Only the output window is computed, from only the input it reads: each output pixel (and each
     * pixel of the intermediate image) is the same sum whatever else is computed. */
    if (need_h && need_v && h_first) {
        int first = vw.bounds[0], last = vw.bounds[out_h * 2 - 2] + vw.bounds[out_h * 2 - 1];
        for (int i = 0; i < out_h; i++)
            vw.bounds[i * 2] -= first;
        ptrdiff_t tstride = (ptrdiff_t)out_w * ch;
        tmp = malloc((size_t)tstride * (last - first) + 64);
        if (!tmp) {
            rc = -1;
            goto end;
        }
        rc = hpass(src->data + (ptrdiff_t)first * src->stride, src->stride, last - first, in_w, ch, tmp, tstride, &hw,
                   flip, isa);
        if (!rc)
            rc = vpass(tmp, tstride, out_w * ch, dst, dst_stride, &vw, isa);
    } else if (need_h && need_v) { /* vertical first, over the input columns the window reads */
        int first = in_w, last = 0;
        for (int i = 0; i < out_w; i++) {
            int lo = hw.bounds[i * 2], hi = lo + hw.bounds[i * 2 + 1];
            first = lo < first ? lo : first;
            last = hi > last ? hi : last;
        }
        if (last <= first)
            first = 0, last = 1;
        for (int i = 0; i < out_w; i++)
            hw.bounds[i * 2] -= first;
        ptrdiff_t tstride = (ptrdiff_t)(last - first) * ch;
        tmp = malloc((size_t)tstride * out_h + 64);
        if (!tmp) {
            rc = -1;
            goto end;
        }
        rc = vpass(src->data + (ptrdiff_t)first * ch, src->stride, (last - first) * ch, tmp, tstride, &vw, isa);
        if (!rc)
            rc = hpass(tmp, tstride, out_h, last - first, ch, dst, dst_stride, &hw, flip, isa);
    } else if (need_h) { /* the rows are the input's */
        rc = hpass(src->data + (ptrdiff_t)y0 * src->stride, src->stride, out_h, in_w, ch, dst, dst_stride, &hw, flip,
                   isa);
    } else {
        const uint8_t *at = src->data + (ptrdiff_t)x0 * ch; /* the columns are the input's */
        if (need_v)
            rc = vpass(at, src->stride, out_w * ch, dst, dst_stride, &vw, isa);
        else
            for (int y = 0; y < out_h; y++)
                memcpy(dst + (ptrdiff_t)y * dst_stride, at + (ptrdiff_t)(y0 + y) * src->stride, (size_t)out_w * ch);
        if (!rc && flip)
            flip_rows(dst, dst_stride, out_w, out_h, ch);
    }

end:
    free(tmp);
    coeffs_free(&cv);
    coeffs_free(&chz);
    return rc;
}
