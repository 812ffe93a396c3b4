/* PIL's RGB -> L conversion (libImaging/Convert.c) and the Image.blend arithmetic (Blend.c) that
 * ImageEnhance uses for brightness, contrast and saturation, on packed 8-bit arrays, bit-exact.
 *
 * RGB -> L is integer arithmetic: L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16 in Pillow;
 * pillow-simd uses (9798 R + 19235 G + 3735 B + 0x4000) >> 15 on the pixels its SIMD loop takes
 * (a row's first 4 * floor(width / 4)) and Pillow's formula on the rest (``mode``).
 * Blend computes, per byte and in float, in1 + alpha * (in2 - in1), then truncates to 0..255
 * (PIL clips only when alpha is outside [0, 1], where the value can leave that range; clipping
 * always changes nothing inside it). Saturation is blend(L broadcast to RGB, image, alpha).
 */
#include <string.h>

#include "native.h"

#if NANO_X86
#include <immintrin.h>
#endif

static inline int luma(const uint8_t *p) { return (p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16; }

/* pillow-simd's grey, which its SIMD loop uses on a row's first 4 * floor(width / 4) pixels. */
static inline int luma_simd(const uint8_t *p) { return (p[0] * 9798 + p[1] * 19235 + p[2] * 3735 + 0x4000) >> 15; }

/* Where pillow-simd's formula stops in a row (nothing uses it in Pillow's mode). */
static inline int simd_end_of(int width, int mode) { return mode == NANO_GREY_PILLOW_SIMD ? width - width % 4 : 0; }

static inline int luma_at(const uint8_t *p, int x, int simd_end) { return x < simd_end ? luma_simd(p) : luma(p); }

static inline uint8_t blend_byte(int in1, int in2, float alpha) {
    float t = (float)in1 + alpha * (float)(in2 - in1);
    if (t <= 0.0f)
        return 0;
    if (t >= 255.0f)
        return 255;
    return (uint8_t)t;
}

#if NANO_X86

/* The grey formula as multiply-add weights: (R, B) pairs, (G, G) pairs, rounding, shift. */
typedef struct {
    __m256i rb, gg, round;
    __m128i shift;
} grey_weights;

NANO_TARGET("avx2")
static inline grey_weights grey_weights_of(int mode) {
    grey_weights w;
    if (mode == NANO_GREY_PILLOW_SIMD) {
        w.rb = _mm256_set1_epi32((3735 << 16) | 9798);
        w.gg = _mm256_set1_epi32(19235);
        w.round = _mm256_set1_epi32(0x4000);
        w.shift = _mm_cvtsi32_si128(15);
    } else { /* 38470 does not fit a signed 16-bit weight: G is taken twice at 19235 */
        w.rb = _mm256_set1_epi32((7471 << 16) | 19595);
        w.gg = _mm256_set1_epi32((19235 << 16) | 19235);
        w.round = _mm256_set1_epi32(0x8000);
        w.shift = _mm_cvtsi32_si128(16);
    }
    return w;
}

/* Eight RGB pixels (24 bytes at p; 32 are read) as int32 lanes of R, G, B and PIL's L. */
NANO_TARGET("avx2")
static inline void load8_rgb_avx2(const uint8_t *p, const grey_weights *gw, __m256i *r, __m256i *g, __m256i *b,
                                  __m256i *l) {
    /* lane 0 gets bytes 0..11 (pixels 0..3), lane 1 bytes 12..23 (pixels 4..7) */
    __m256i v = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)p),
                                            _mm256_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5));
    const __m256i pick_r = _mm256_setr_epi8(0, -1, -1, -1, 3, -1, -1, -1, 6, -1, -1, -1, 9, -1, -1, -1,
                                            0, -1, -1, -1, 3, -1, -1, -1, 6, -1, -1, -1, 9, -1, -1, -1);
    const __m256i pick_g = _mm256_setr_epi8(1, -1, -1, -1, 4, -1, -1, -1, 7, -1, -1, -1, 10, -1, -1, -1,
                                            1, -1, -1, -1, 4, -1, -1, -1, 7, -1, -1, -1, 10, -1, -1, -1);
    const __m256i pick_b = _mm256_setr_epi8(2, -1, -1, -1, 5, -1, -1, -1, 8, -1, -1, -1, 11, -1, -1, -1,
                                            2, -1, -1, -1, 5, -1, -1, -1, 8, -1, -1, -1, 11, -1, -1, -1);
    const __m256i pick_rb = _mm256_setr_epi8(0, -1, 2, -1, 3, -1, 5, -1, 6, -1, 8, -1, 9, -1, 11, -1,
                                             0, -1, 2, -1, 3, -1, 5, -1, 6, -1, 8, -1, 9, -1, 11, -1);
    const __m256i pick_gg = _mm256_setr_epi8(1, -1, 1, -1, 4, -1, 4, -1, 7, -1, 7, -1, 10, -1, 10, -1,
                                             1, -1, 1, -1, 4, -1, 4, -1, 7, -1, 7, -1, 10, -1, 10, -1);
    __m256i rb = _mm256_madd_epi16(_mm256_shuffle_epi8(v, pick_rb), gw->rb);
    __m256i gg = _mm256_madd_epi16(_mm256_shuffle_epi8(v, pick_gg), gw->gg);
    *l = _mm256_srl_epi32(_mm256_add_epi32(_mm256_add_epi32(rb, gg), gw->round), gw->shift);
    if (r) {
        *r = _mm256_shuffle_epi8(v, pick_r);
        *g = _mm256_shuffle_epi8(v, pick_g);
        *b = _mm256_shuffle_epi8(v, pick_b);
    }
}

NANO_TARGET("avx2")
static void rgb_to_l_avx2(const nano_view *src, uint8_t *dst, int mode) {
    int w = src->width, simd_end = simd_end_of(w, mode);
    grey_weights gw = grey_weights_of(mode);
    for (int y = 0; y < src->height; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * w;
        int x = 0;
        for (; x * 3 + 32 <= w * 3; x += 8) {
            __m256i l;
            load8_rgb_avx2(row + x * 3, &gw, NULL, NULL, NULL, &l);
            __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(l, l), _mm256_setzero_si256());
            uint32_t lo = (uint32_t)_mm256_cvtsi256_si32(b);
            uint32_t hi = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(b, 1));
            memcpy(out + x, &lo, 4);
            memcpy(out + x + 4, &hi, 4);
        }
        for (; x < w; x++)
            out[x] = (uint8_t)luma_at(row + x * 3, x, simd_end);
    }
}

NANO_TARGET("avx2")
static uint64_t gray_sum_avx2(const nano_view *src, int mode) {
    uint64_t total = 0;
    int w = src->width, simd_end = simd_end_of(w, mode);
    grey_weights gw = grey_weights_of(mode);
    for (int y = 0; y < src->height; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        __m256i acc = _mm256_setzero_si256();
        int x = 0;
        for (; x * 3 + 32 <= w * 3; x += 8) {
            __m256i l;
            load8_rgb_avx2(row + x * 3, &gw, NULL, NULL, NULL, &l);
            acc = _mm256_add_epi32(acc, l);
        }
        uint32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, acc);
        for (int i = 0; i < 8; i++)
            total += lanes[i];
        for (; x < w; x++)
            total += (uint64_t)luma_at(row + x * 3, x, simd_end);
    }
    return total;
}

NANO_TARGET("avx2")
static inline __m256i blend_lanes_avx2(__m256i in1, __m256 in1f, __m256i in2, __m256 alpha) {
    __m256 t = _mm256_add_ps(in1f, _mm256_mul_ps(alpha, _mm256_cvtepi32_ps(_mm256_sub_epi32(in2, in1))));
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
    return _mm256_cvttps_epi32(t);
}

NANO_TARGET("avx2")
static void blend_gray_avx2(const nano_view *src, uint8_t *dst, float alpha, int mode) {
    const __m256i put_r = _mm256_setr_epi8(0, -1, -1, 4, -1, -1, 8, -1, -1, 12, -1, -1, -1, -1, -1, -1,
                                           0, -1, -1, 4, -1, -1, 8, -1, -1, 12, -1, -1, -1, -1, -1, -1);
    const __m256i put_g = _mm256_setr_epi8(-1, 0, -1, -1, 4, -1, -1, 8, -1, -1, 12, -1, -1, -1, -1, -1,
                                           -1, 0, -1, -1, 4, -1, -1, 8, -1, -1, 12, -1, -1, -1, -1, -1);
    const __m256i put_b = _mm256_setr_epi8(-1, -1, 0, -1, -1, 4, -1, -1, 8, -1, -1, 12, -1, -1, -1, -1,
                                           -1, -1, 0, -1, -1, 4, -1, -1, 8, -1, -1, 12, -1, -1, -1, -1);
    const __m256i gather = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
    __m256 a = _mm256_set1_ps(alpha);
    int w = src->width, simd_end = simd_end_of(w, mode);
    grey_weights gw = grey_weights_of(mode);
    for (int y = 0; y < src->height; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * w * 3;
        int x = 0;
        for (; x * 3 + 32 <= w * 3; x += 8) {
            __m256i r, g, b, l;
            load8_rgb_avx2(row + x * 3, &gw, &r, &g, &b, &l);
            __m256 lf = _mm256_cvtepi32_ps(l);
            r = blend_lanes_avx2(l, lf, r, a);
            g = blend_lanes_avx2(l, lf, g, a);
            b = blend_lanes_avx2(l, lf, b, a);
            __m256i v = _mm256_or_si256(_mm256_or_si256(_mm256_shuffle_epi8(r, put_r), _mm256_shuffle_epi8(g, put_g)),
                                        _mm256_shuffle_epi8(b, put_b));
            v = _mm256_permutevar8x32_epi32(v, gather);
            _mm_storeu_si128((__m128i *)(out + x * 3), _mm256_castsi256_si128(v));
            _mm_storel_epi64((__m128i *)(out + x * 3 + 16), _mm256_extracti128_si256(v, 1));
        }
        for (; x < w; x++) {
            const uint8_t *p = row + x * 3;
            int l = luma_at(p, x, simd_end);
            out[x * 3 + 0] = blend_byte(l, p[0], alpha);
            out[x * 3 + 1] = blend_byte(l, p[1], alpha);
            out[x * 3 + 2] = blend_byte(l, p[2], alpha);
        }
    }
}

/* blend(constant image, image, alpha) on 32 bytes at a time */
NANO_TARGET("avx2")
static void blend_const_avx2(const nano_view *src, uint8_t *dst, int in1, float alpha) {
    const __m256i c = _mm256_set1_epi32(in1);
    const __m256 cf = _mm256_set1_ps((float)in1), a = _mm256_set1_ps(alpha);
    size_t row = (size_t)src->width * src->channels;
    for (int y = 0; y < src->height; y++) {
        const uint8_t *in = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * row;
        size_t x = 0;
        for (; x + 32 <= row; x += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++) {
                __m256i p = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(in + x + 8 * k)));
                v[k] = blend_lanes_avx2(c, cf, p, a);
            }
            __m256i w = _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            /* packs work within 128-bit lanes: put the eight groups of four bytes back in order */
            w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(out + x), w);
        }
        for (; x < row; x++)
            out[x] = blend_byte(in1, in[x], alpha);
    }
}

#endif /* NANO_X86 */

void nano_blend_const(const nano_view *src, uint8_t *dst, int in1, float alpha, int isa) {
#if NANO_X86
    if (isa >= NANO_ISA_AVX2) {
        blend_const_avx2(src, dst, in1, alpha);
        return;
    }
#endif
    (void)isa;
    size_t row = (size_t)src->width * src->channels;
    for (int y = 0; y < src->height; y++) {
        const uint8_t *in = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * row;
        for (size_t x = 0; x < row; x++)
            out[x] = blend_byte(in1, in[x], alpha);
    }
}

void nano_rgb_to_l(const nano_view *src, uint8_t *dst, int mode, int isa) {
#if NANO_X86
    if (isa >= NANO_ISA_AVX2) {
        rgb_to_l_avx2(src, dst, mode);
        return;
    }
#endif
    (void)isa;
    int simd_end = simd_end_of(src->width, mode);
    for (int y = 0; y < src->height; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * src->width;
        for (int x = 0; x < src->width; x++)
            out[x] = (uint8_t)luma_at(row + x * 3, x, simd_end);
    }
}

uint64_t nano_gray_sum(const nano_view *src, int mode, int isa) {
    uint64_t total = 0;
    if (src->channels == 1) {
        for (int y = 0; y < src->height; y++) {
            const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
            uint32_t s = 0;
            for (int x = 0; x < src->width; x++)
                s += row[x];
            total += s;
        }
        return total;
    }
#if NANO_X86
    if (isa >= NANO_ISA_AVX2)
        return gray_sum_avx2(src, mode);
#endif
    (void)isa;
    int simd_end = simd_end_of(src->width, mode);
    for (int y = 0; y < src->height; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        uint32_t s = 0;
        for (int x = 0; x < src->width; x++)
            s += (uint32_t)luma_at(row + x * 3, x, simd_end);
        total += s;
    }
    return total;
}

void nano_blend_gray(const nano_view *src, uint8_t *dst, float alpha, int mode, int isa) {
#if NANO_X86
    if (isa >= NANO_ISA_AVX2) {
        blend_gray_avx2(src, dst, alpha, mode);
        return;
    }
#endif
    (void)isa;
    int simd_end = simd_end_of(src->width, mode);
    for (int y = 0; y < src->height; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * src->width * 3;
        for (int x = 0; x < src->width; x++) {
            const uint8_t *p = row + x * 3;
            int l = luma_at(p, x, simd_end);
            out[x * 3 + 0] = blend_byte(l, p[0], alpha);
            out[x * 3 + 1] = blend_byte(l, p[1], alpha);
            out[x * 3 + 2] = blend_byte(l, p[2], alpha);
        }
    }
}

void nano_lut(const nano_view *src, uint8_t *dst, const uint8_t *tables, int isa) {
    (void)isa;
    int w = src->width, ch = src->channels;
    for (int y = 0; y < src->height; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * w * ch;
        if (ch == 3) {
            const uint8_t *t0 = tables, *t1 = tables + 256, *t2 = tables + 512;
            for (int x = 0; x < w; x++) {
                out[x * 3 + 0] = t0[row[x * 3 + 0]];
                out[x * 3 + 1] = t1[row[x * 3 + 1]];
                out[x * 3 + 2] = t2[row[x * 3 + 2]];
            }
        } else {
            for (int x = 0; x < w; x++)
                out[x] = tables[row[x]];
        }
    }
}

/* ImageEnhance.Sharpness: Image.blend(image.filter(SMOOTH), image, alpha). SMOOTH is PIL's 3x3 float
 * filter (1 1 1 / 1 5 1 / 1 1 1) / 13 (Filter.c): it starts at 0.5, adds the weighted pixels in float and
 * truncates; the first and last rows and columns are copied, and images under 3 x 3 are copied whole.
 * With S the integer weighted sum, the exact value 0.5 + S / 13 = (2S + 13) / 26 is never closer than
 * 1/26 to an integer, and PIL's float arithmetic is off by less than 1e-3, so its truncation is exactly
 * (2S + 13) / 26 in integers. The blend is PIL's float blend (Blend.c). Blending a copied pixel with
 * itself gives it back, so those pixels are the source's. */
static inline uint8_t blend_sharp(int deg, int in, float alpha) {
    float t = (float)deg + alpha * (float)(in - deg);
    t = t <= 0.0f ? 0.0f : t;
    t = t >= 255.0f ? 255.0f : t;
    return (uint8_t)t;
}

void nano_sharpness(const nano_view *src, uint8_t *dst, float alpha) {
    const int w = src->width, h = src->height, c = src->channels;
    const size_t row = (size_t)w * c;
    for (int y = 0; y < h; y++) {
        const uint8_t *in0 = src->data + (ptrdiff_t)y * src->stride;
        uint8_t *out = dst + (size_t)y * row;
        if (w < 3 || h < 3 || y == 0 || y == h - 1) {
            memcpy(out, in0, row);
            continue;
        }
        const uint8_t *up = in0 - src->stride, *down = in0 + src->stride;
        memcpy(out, in0, (size_t)c);
        for (size_t m = (size_t)c; m < row - (size_t)c; m++) {
            const size_t l = m - (size_t)c, r = m + (size_t)c;
            const int sum = up[l] + up[m] + up[r] + in0[l] + 5 * in0[m] + in0[r] + down[l] + down[m] + down[r];
            out[m] = blend_sharp((2 * sum + 13) / 26, in0[m], alpha);
        }
        memcpy(out + row - (size_t)c, in0 + row - (size_t)c, (size_t)c);
    }
}
