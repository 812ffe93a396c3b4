/* PIL's Image.transform (libImaging/Geometry.c) for affine and perspective maps, with the nearest,
 * bilinear and bicubic filters, on packed 8-bit RGB or L arrays, bit-exact.
 *
 * What PIL computes, and so what this file must:
 *  - Output pixel (x, y) reads the input at (X, Y), from its centre (x + 0.5, y + 0.5), in doubles
 *    with the operations in C's order: X = a0 xc + a1 yc + a2 (affine) or that over
 *    a6 xc + a7 yc + 1 (perspective). A pixel whose X or Y lies outside [0, size) keeps the fill
 *    colour (Image.transform first fills the new image with it).
 *  - Bilinear: from (X - 0.5, Y - 0.5), floor and fraction d; each of the two rows blends
 *    a + (b - a) dx, in double from the bytes, then the rows blend alike with dy; truncated to a
 *    byte. Bicubic: four taps around the floor, each row's cubic in PIL's Horner form from integer
 *    differences, then the four row values the same way in double; clipped, truncated. Indices
 *    past an edge repeat the edge pixel (PIL clips columns, and its row fallbacks amount to the same).
 *  - Nearest affine does not run that per-pixel code: PIL scales through a table of columns
 *    (no rotation or shear), or steps 16.16 fixed-point coordinates along each row (when all four
 *    corners map inside +-32768), or else steps double coordinates; each is reproduced as it is,
 *    accumulation included. Nearest perspective runs the per-pixel code.
 * Where PIL's own result is undefined behaviour in C (a NaN coordinate, a fixed-point value past
 * 32 bits) the kernel says so (NANO_WARP_UNDEFINED) and the caller runs PIL's code.
 *
 * The AVX2 variant of bilinear and bicubic makes one padded copy of the input (edge pixels
 * repeated, RGB as four bytes a pixel) so that every tap window is a plain load, maps four output
 * pixels at a time, and interpolates an RGB pixel's channels side by side in one vector of four
 * doubles (L: four pixels side by side). Every double operation is PIL's, in PIL's order: doubles
 * give the same bits whatever the vector width. Built without -ffast-math and with
 * -ffp-contract=off: a fused multiply-add would round differently.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

#if NANO_X86
#include <immintrin.h>
#endif

typedef struct {
    const nano_view *src;
    uint8_t *dst;
    ptrdiff_t dst_stride;
    int out_w, out_h;
    const double *a; /* 6 (affine) or 8 (perspective) coefficients */
    int perspective;
    const uint8_t *fill; /* one byte per channel */
} warp_job;

#if defined(__GNUC__) || defined(__clang__)
#define NANO_NOINLINE __attribute__((noinline))
#else
#define NANO_NOINLINE
#endif

static inline int clampi(int v, int size) { return v < 0 ? 0 : (v < size ? v : size - 1); }

static inline void put_fill(uint8_t *o, const uint8_t *fill, int ch) {
    for (int c = 0; c < ch; c++)
        o[c] = fill[c];
}

/* One pixel of `ch` (1 or 3) bytes: fixed-size copies, which the compiler inlines. */
static inline void copy_pixel(uint8_t *o, const uint8_t *p, int ch) {
    if (ch == 3)
        memcpy(o, p, 3);
    else
        o[0] = p[0];
}

/* The input point of the output pixel centre (xc, yc): PIL's affine_transform / perspective_transform. */
static inline void map_point(const warp_job *j, double xc, double yc, double *X, double *Y) {
    const double *a = j->a;
    if (j->perspective) {
        *X = (a[0] * xc + a[1] * yc + a[2]) / (a[6] * xc + a[7] * yc + 1);
        *Y = (a[3] * xc + a[4] * yc + a[5]) / (a[6] * xc + a[7] * yc + 1);
    } else {
        *X = a[0] * xc + a[1] * yc + a[2];
        *Y = a[3] * xc + a[4] * yc + a[5];
    }
}

/* PIL's cubic through four values at fraction d, from integer differences (a row of bytes). */
static inline double cubic_bytes(int v1, int v2, int v3, int v4, double d) {
    int p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
    return v2 + d * (p2 + d * (p3 + d * p4));
}

/* The same cubic through four doubles (the row values), each step rounded as PIL's is. */
static inline double cubic_doubles(double v1, double v2, double v3, double v4, double d) {
    double p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
    return v2 + d * (p2 + d * (p3 + d * p4));
}

static inline uint8_t clip_truncate(double v) {
    if (v <= 0.0)
        return 0;
    if (v >= 255.0)
        return 255;
    return (uint8_t)(int)v;
}

/* --- the per-pixel engine (PIL's ImagingGenericTransform), portable --- */

static int warp_generic(const warp_job *j, int filter) {
    const nano_view *s = j->src;
    const int W = s->width, H = s->height, ch = s->channels;
    for (int y = 0; y < j->out_h; y++) {
        uint8_t *o = j->dst + (ptrdiff_t)y * j->dst_stride;
        double yc = y + 0.5;
        for (int x = 0; x < j->out_w; x++, o += ch) {
            double X, Y;
            map_point(j, x + 0.5, yc, &X, &Y);
            if (isnan(X) || isnan(Y))
                return NANO_WARP_UNDEFINED;
            if (!(X >= 0.0 && X < W && Y >= 0.0 && Y < H)) {
                put_fill(o, j->fill, ch);
                continue;
            }
            if (filter == NANO_NEAREST) {
                copy_pixel(o, s->data + (ptrdiff_t)(int)Y * s->stride + (ptrdiff_t)(int)X * ch, ch);
                continue;
            }
            double xs = X - 0.5, ys = Y - 0.5;
            int xi = (int)floor(xs), yi = (int)floor(ys);
            double dx = xs - xi, dy = ys - yi;
            if (filter == NANO_BILINEAR) {
                const uint8_t *r0 = s->data + (ptrdiff_t)clampi(yi, H) * s->stride;
                const uint8_t *r1 = s->data + (ptrdiff_t)clampi(yi + 1, H) * s->stride;
                int c0 = clampi(xi, W) * ch, c1 = clampi(xi + 1, W) * ch;
                for (int c = 0; c < ch; c++) {
                    double v1 = r0[c0 + c] + (r0[c1 + c] - r0[c0 + c]) * dx;
                    double v2 = r1[c0 + c] + (r1[c1 + c] - r1[c0 + c]) * dx;
                    o[c] = (uint8_t)(int)(v1 + (v2 - v1) * dy);
                }
            } else {
                const uint8_t *r[4];
                int cols[4];
                for (int k = 0; k < 4; k++) {
                    r[k] = s->data + (ptrdiff_t)clampi(yi - 1 + k, H) * s->stride;
                    cols[k] = clampi(xi - 1 + k, W) * ch;
                }
                for (int c = 0; c < ch; c++) {
                    double v[4];
                    for (int k = 0; k < 4; k++)
                        v[k] = cubic_bytes(r[k][cols[0] + c], r[k][cols[1] + c], r[k][cols[2] + c],
                                           r[k][cols[3] + c], dx);
                    o[c] = clip_truncate(cubic_doubles(v[0], v[1], v[2], v[3], dy));
                }
            }
        }
    }
    return 0;
}

/* --- nearest affine: PIL's three special cases (ImagingScaleAffine, affine_fixed, the double stepper) --- */

/* Pixel xin of a row of W pixels (ch bytes each) as a word: RGB through one 4-byte load where the
 * fourth byte is still in the row. */
static inline uint32_t load_pixel(const uint8_t *row, int xin, int W, int ch) {
    if (ch == 1)
        return row[xin];
    const uint8_t *p = row + (ptrdiff_t)xin * 3;
    uint32_t v;
    if (xin + 1 < W)
        memcpy(&v, p, 4);
    else
        v = p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
    return v;
}

/* Store a pixel word: RGB as four bytes (the next pixel overwrites the fourth) unless `last`. */
static inline void store_pixel(uint8_t *o, uint32_t v, int ch, int last) {
    if (ch == 1)
        o[0] = (uint8_t)v;
    else if (!last)
        memcpy(o, &v, 4);
    else
        memcpy(o, &v, 3);
}

static inline uint32_t fill_word(const warp_job *j) {
    return j->src->channels == 1 ? j->fill[0] : j->fill[0] | (uint32_t)j->fill[1] << 8 | (uint32_t)j->fill[2] << 16;
}

/* PIL's scale-only case: a table of input columns, stepped in double; rows stepped alike. */
#define SCALE_ROWS(CH)                                                                                            \
    for (int y = 0; y < j->out_h; y++, yo += a[4]) {                                                              \
        uint8_t *o = j->dst + (ptrdiff_t)y * j->dst_stride;                                                       \
        const uint8_t *row = yo >= 0.0 && yo < H ? s->data + (ptrdiff_t)(int)yo * s->stride : NULL;               \
        /* PIL copies the span [xmin, xmax) (a stepped sequence is monotonic: the tabulated columns) */          \
        for (int x = 0; x < j->out_w; x++, o += (CH)) {                                                           \
            uint32_t v = row && x >= xmin && x < xmax ? load_pixel(row, cols[x], W, (CH)) : fill;                \
            store_pixel(o, v, (CH), x + 1 == j->out_w);                                                           \
        }                                                                                                         \
    }

static int nearest_scale(const warp_job *j) {
    const nano_view *s = j->src;
    const double *a = j->a;
    const int W = s->width, H = s->height;
    const uint32_t fill = fill_word(j);
    int *cols = calloc((size_t)j->out_w, sizeof(int)); /* zero where no column was tabulated, as PIL's */
    if (!cols)
        return -1;
    int xmin = j->out_w, xmax = 0;
    double xo = a[2] + a[0] * 0.5;
    for (int x = 0; x < j->out_w; x++, xo += a[0]) {
        if (xo >= 0.0 && xo < W) { /* COORD(xo) inside the image */
            cols[x] = (int)xo;
            xmax = x + 1;
            if (x < xmin)
                xmin = x;
        }
    }
    double yo = a[5] + a[4] * 0.5;
    if (s->channels == 3) {
        SCALE_ROWS(3)
    } else {
        SCALE_ROWS(1)
    }
    free(cols);
    return 0;
}

static inline int fits_fixed(const double *a, int x, int y) {
    return fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

/* PIL's FIX: floor(v * 65536 + 0.5) as an int, or 0 with *bad set where C's conversion is undefined. */
static inline int32_t to_fixed(double v, int *bad) {
    double t = floor(v * 65536.0 + 0.5);
    if (!(t >= -2147483648.0 && t <= 2147483647.0)) {
        *bad = 1;
        return 0;
    }
    return (int32_t)t;
}

/* The fixed-point rows, with the pixel size a constant; everything the loop reads is a local, so
 * that the compiler keeps the steppers in registers. */
#define FIXED_ROWS(CH)                                                                                            \
    NANO_NOINLINE static void fixed_rows##CH(const uint8_t *data, ptrdiff_t stride, int W, int H, uint8_t *dst,    \
                                             ptrdiff_t dst_stride, int out_w, int out_h, const int32_t k[6],       \
                                             uint32_t fill) {                                                      \
        /* unsigned steps: the one past the last pixel may wrap, harmlessly, as PIL's does */                     \
        const uint32_t a0 = (uint32_t)k[0], a1 = (uint32_t)k[1], a3 = (uint32_t)k[3], a4 = (uint32_t)k[4];        \
        uint32_t row_x = (uint32_t)k[2], row_y = (uint32_t)k[5];                                                  \
        for (int y = 0; y < out_h; y++, row_x += a1, row_y += a4) {                                               \
            uint8_t *o = dst + (ptrdiff_t)y * dst_stride;                                                         \
            uint32_t xx = row_x, yy = row_y;                                                                      \
            for (int x = 0; x < out_w; x++, o += (CH), xx += a0, yy += a3) {                                      \
                int xin = (int32_t)xx >> 16, yin = (int32_t)yy >> 16; /* arithmetic shift: floor, as PIL's */     \
                uint32_t v = (unsigned)xin < (unsigned)W && (unsigned)yin < (unsigned)H                           \
                                 ? load_pixel(data + (ptrdiff_t)yin * stride, xin, W, (CH))                       \
                                 : fill;                                                                          \
                store_pixel(o, v, (CH), x + 1 == out_w);                                                          \
            }                                                                                                     \
        }                                                                                                         \
    }
FIXED_ROWS(1)
FIXED_ROWS(3)
#undef FIXED_ROWS

static int nearest_fixed(const warp_job *j) {
    const nano_view *s = j->src;
    const double *a = j->a;
    int bad = 0;
    int32_t k[6] = {to_fixed(a[0], &bad), to_fixed(a[1], &bad), to_fixed(a[2] + a[0] * 0.5 + a[1] * 0.5, &bad),
                    to_fixed(a[3], &bad), to_fixed(a[4], &bad), to_fixed(a[5] + a[3] * 0.5 + a[4] * 0.5, &bad)};
    if (bad)
        return NANO_WARP_UNDEFINED;
    /* PIL steps in int and would overflow (undefined in C) where a used value leaves 32 bits; the
     * values are linear in x and y, so the corners bound them */
    for (int c = 0; c < 4; c++) {
        int64_t x = (c & 1) ? j->out_w - 1 : 0, y = (c & 2) ? j->out_h - 1 : 0;
        int64_t xx = k[2] + y * k[1] + x * k[0], yy = k[5] + y * k[4] + x * k[3];
        if (xx < INT32_MIN || xx > INT32_MAX || yy < INT32_MIN || yy > INT32_MAX)
            return NANO_WARP_UNDEFINED;
    }
    (s->channels == 3 ? fixed_rows3 : fixed_rows1)(s->data, s->stride, s->width, s->height, j->dst, j->dst_stride,
                                                   j->out_w, j->out_h, k, fill_word(j));
    return 0;
}

static int nearest_stepped(const warp_job *j) {
    const nano_view *s = j->src;
    const double *a = j->a;
    const int W = s->width, H = s->height, ch = s->channels;
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    for (int y = 0; y < j->out_h; y++, xo += a[1], yo += a[4]) {
        uint8_t *o = j->dst + (ptrdiff_t)y * j->dst_stride;
        double xx = xo, yy = yo;
        for (int x = 0; x < j->out_w; x++, o += ch, xx += a[0], yy += a[3]) {
            if (isnan(xx) || isnan(yy))
                return NANO_WARP_UNDEFINED;
            if (xx >= 0.0 && xx < W && yy >= 0.0 && yy < H)
                copy_pixel(o, s->data + (ptrdiff_t)(int)yy * s->stride + (ptrdiff_t)(int)xx * ch, ch);
            else
                put_fill(o, j->fill, ch);
        }
    }
    return 0;
}

static int nearest_affine(const warp_job *j) {
    const double *a = j->a;
    if (a[1] == 0 && a[3] == 0)
        return nearest_scale(j);
    int w = j->out_w, h = j->out_h;
    if (fits_fixed(a, 0, 0) && fits_fixed(a, w, h) && fits_fixed(a, 0, h) && fits_fixed(a, w, 0))
        return nearest_fixed(j);
    return nearest_stepped(j);
}

#if NANO_X86

/* --- AVX2: bilinear and bicubic --- */

/* The input with `pad` edge pixels repeated on every side, `bpp` bytes a pixel (RGB as RGB0), plus
 * slack for the over-reads of the wide loads. */
NANO_TARGET("avx2")
static uint8_t *padded_copy(const nano_view *s, int pad, int bpp, ptrdiff_t *stride_out) {
    const int W = s->width, H = s->height, ch = s->channels;
    const ptrdiff_t ps = (ptrdiff_t)(W + 2 * pad) * bpp;
    uint8_t *buf = malloc((size_t)ps * (H + 2 * pad) + 64);
    if (!buf)
        return NULL;
    *stride_out = ps;
    const __m128i expand = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    for (int y = 0; y < H; y++) {
        const uint8_t *in = s->data + (ptrdiff_t)y * s->stride;
        uint8_t *o = buf + (ptrdiff_t)(y + pad) * ps + (ptrdiff_t)pad * bpp;
        int x = 0;
        if (ch == 3) {
            for (; x * 3 + 16 <= W * 3; x += 4) /* four pixels per 16-byte load, inside the row */
                _mm_storeu_si128((__m128i *)(o + x * 4),
                                 _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(in + x * 3)), expand));
            for (; x < W; x++) {
                o[x * 4 + 0] = in[x * 3 + 0];
                o[x * 4 + 1] = in[x * 3 + 1];
                o[x * 4 + 2] = in[x * 3 + 2];
                o[x * 4 + 3] = 0;
            }
        } else {
            memcpy(o, in, (size_t)W);
        }
        for (int k = 1; k <= pad; k++) {
            memcpy(o - (ptrdiff_t)k * bpp, o, (size_t)bpp);
            memcpy(o + (ptrdiff_t)(W - 1 + k) * bpp, o + (ptrdiff_t)(W - 1) * bpp, (size_t)bpp);
        }
    }
    for (int k = 0; k < pad; k++) {
        memcpy(buf + (ptrdiff_t)k * ps, buf + (ptrdiff_t)pad * ps, (size_t)ps);
        memcpy(buf + (ptrdiff_t)(pad + H + k) * ps, buf + (ptrdiff_t)(pad + H - 1) * ps, (size_t)ps);
    }
    return buf;
}

/* Four output pixels' input points, PIL's expressions lane by lane; xc holds the four x + 0.5. */
NANO_TARGET("avx2")
static inline void map4(const warp_job *j, __m256d xc, double yc, __m256d *X, __m256d *Y) {
    const double *a = j->a;
    const __m256d y = _mm256_set1_pd(yc);
    __m256d xn = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(a[0]), xc),
                                             _mm256_mul_pd(_mm256_set1_pd(a[1]), y)), _mm256_set1_pd(a[2]));
    __m256d yn = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(a[3]), xc),
                                             _mm256_mul_pd(_mm256_set1_pd(a[4]), y)), _mm256_set1_pd(a[5]));
    if (j->perspective) {
        __m256d den = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(a[6]), xc),
                                                  _mm256_mul_pd(_mm256_set1_pd(a[7]), y)), _mm256_set1_pd(1.0));
        xn = _mm256_div_pd(xn, den);
        yn = _mm256_div_pd(yn, den);
    }
    *X = xn;
    *Y = yn;
}

/* A block of four output pixels, mapped: which lanes are inside, their fractions, and the byte
 * offset of their first tap in the padded copy. That tap is (floor + 1) in each axis: for bicubic
 * (pad 2) the tap before the floor, for bilinear (pad 1) the floor itself. */
typedef struct {
    __m256d dx, dy;
    __m128i off;
    int inside; /* a bit per lane */
} block4;

/* Returns 0, or NANO_WARP_UNDEFINED if a lane below `n` has a NaN coordinate. */
NANO_TARGET("avx2")
static inline __attribute__((always_inline)) int map_block(const warp_job *j, int x, double yc, int n, int bpp,
                                                           int ps, block4 *b) {
    const __m256d half = _mm256_set1_pd(0.5);
    __m256d X, Y;
    map4(j, _mm256_add_pd(_mm256_set1_pd((double)x), _mm256_setr_pd(0.5, 1.5, 2.5, 3.5)), yc, &X, &Y);
    int lanes = (1 << n) - 1;
    __m256d nan = _mm256_or_pd(_mm256_cmp_pd(X, X, _CMP_UNORD_Q), _mm256_cmp_pd(Y, Y, _CMP_UNORD_Q));
    if (_mm256_movemask_pd(nan) & lanes)
        return NANO_WARP_UNDEFINED;
    __m256d in = _mm256_and_pd(
        _mm256_and_pd(_mm256_cmp_pd(X, _mm256_setzero_pd(), _CMP_GE_OQ),
                      _mm256_cmp_pd(X, _mm256_set1_pd((double)j->src->width), _CMP_LT_OQ)),
        _mm256_and_pd(_mm256_cmp_pd(Y, _mm256_setzero_pd(), _CMP_GE_OQ),
                      _mm256_cmp_pd(Y, _mm256_set1_pd((double)j->src->height), _CMP_LT_OQ)));
    b->inside = _mm256_movemask_pd(in) & lanes;
    /* outside lanes are computed but not used: park them at the origin, inside the copy */
    __m256d xs = _mm256_and_pd(_mm256_sub_pd(X, half), in), ys = _mm256_and_pd(_mm256_sub_pd(Y, half), in);
    __m256d fx = _mm256_floor_pd(xs), fy = _mm256_floor_pd(ys);
    b->dx = _mm256_sub_pd(xs, fx);
    b->dy = _mm256_sub_pd(ys, fy);
    const __m128i one = _mm_set1_epi32(1);
    __m128i ix = _mm_add_epi32(_mm256_cvttpd_epi32(fx), one), iy = _mm_add_epi32(_mm256_cvttpd_epi32(fy), one);
    b->off = _mm_add_epi32(_mm_mullo_epi32(iy, _mm_set1_epi32(ps)), _mm_mullo_epi32(ix, _mm_set1_epi32(bpp)));
    return 0;
}

/* a + (b - a) d for the four channels of two neighbouring RGB0 pixels (8 bytes at p). */
NANO_TARGET("avx2")
static inline __m256d lerp_rgb(const uint8_t *p, __m256d d) {
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i a = _mm_cvtepu8_epi32(v), b = _mm_cvtepu8_epi32(_mm_srli_si128(v, 4));
    return _mm256_add_pd(_mm256_cvtepi32_pd(a), _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(b, a)), d));
}

/* PIL's cubic along a row from its four taps t0..t3 (int32 lanes), at fraction d: the integer
 * differences p2 = -t0 + t2, p3 = 2 (t0 - t1) + t2 - t3, p4 = -t0 + t1 - t2 + t3, then Horner. */
NANO_TARGET("avx2")
static inline __m256d cubic_taps(__m128i t0, __m128i t1, __m128i t2, __m128i t3, __m256d d) {
    __m128i p2 = _mm_sub_epi32(t2, t0);
    __m128i p3 = _mm_sub_epi32(_mm_add_epi32(_mm_slli_epi32(_mm_sub_epi32(t0, t1), 1), t2), t3);
    __m128i p4 = _mm_add_epi32(_mm_sub_epi32(t1, t0), _mm_sub_epi32(t3, t2));
    __m256d r = _mm256_add_pd(_mm256_cvtepi32_pd(p3), _mm256_mul_pd(d, _mm256_cvtepi32_pd(p4)));
    r = _mm256_add_pd(_mm256_cvtepi32_pd(p2), _mm256_mul_pd(d, r));
    return _mm256_add_pd(_mm256_cvtepi32_pd(t1), _mm256_mul_pd(d, r));
}

/* The cubic along two rows of four RGB0 pixels at once (16 bytes at p and at p + ps): the integer
 * differences of both rows in one 256-bit vector, then each row's Horner in doubles. */
NANO_TARGET("avx2")
static inline void cubic_rgb2(const uint8_t *p, ptrdiff_t ps, __m256d d, __m256d *first, __m256d *second) {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                              _mm_loadu_si128((const __m128i *)(p + ps)), 1);
    /* tap k of the four channels, as int32, in each row's half */
#define TAP(k) _mm256_shuffle_epi8(v, _mm256_setr_epi8(4 * (k), -1, -1, -1, 4 * (k) + 1, -1, -1, -1, 4 * (k) + 2, -1, \
                                                       -1, -1, 4 * (k) + 3, -1, -1, -1, 4 * (k), -1, -1, -1,         \
                                                       4 * (k) + 1, -1, -1, -1, 4 * (k) + 2, -1, -1, -1, 4 * (k) + 3, \
                                                       -1, -1, -1))
    const __m256i t0 = TAP(0), t1 = TAP(1), t2 = TAP(2), t3 = TAP(3);
#undef TAP
    const __m256i p2 = _mm256_sub_epi32(t2, t0);
    const __m256i p3 = _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(_mm256_sub_epi32(t0, t1), 1), t2), t3);
    const __m256i p4 = _mm256_add_epi32(_mm256_sub_epi32(t1, t0), _mm256_sub_epi32(t3, t2));
#define HORNER(half)                                                                                          \
    _mm256_add_pd(                                                                                            \
        _mm256_cvtepi32_pd(half(t1)),                                                                         \
        _mm256_mul_pd(d, _mm256_add_pd(_mm256_cvtepi32_pd(half(p2)),                                          \
                                       _mm256_mul_pd(d, _mm256_add_pd(_mm256_cvtepi32_pd(half(p3)),           \
                                                                      _mm256_mul_pd(d, _mm256_cvtepi32_pd(half(p4))))))))
#define LOW(x) _mm256_castsi256_si128(x)
#define HIGH(x) _mm256_extracti128_si256(x, 1)
    *first = HORNER(LOW);
    *second = HORNER(HIGH);
#undef LOW
#undef HIGH
#undef HORNER
}

/* The cubic through four row values, in PIL's order: p2 = -v1 + v3, p3 = 2 (v1 - v2) + v3 - v4,
 * p4 = -v1 + v2 - v3 + v4 (negating and adding is exactly subtracting; doubling, adding twice). */
NANO_TARGET("avx2")
static inline __m256d cubic_pd(__m256d v1, __m256d v2, __m256d v3, __m256d v4, __m256d d) {
    __m256d p2 = _mm256_sub_pd(v3, v1), diff = _mm256_sub_pd(v1, v2);
    __m256d p3 = _mm256_sub_pd(_mm256_add_pd(_mm256_add_pd(diff, diff), v3), v4);
    __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(v2, v1), v3), v4);
    __m256d r = _mm256_add_pd(p3, _mm256_mul_pd(d, p4));
    r = _mm256_add_pd(p2, _mm256_mul_pd(d, r));
    return _mm256_add_pd(v2, _mm256_mul_pd(d, r));
}

/* Bicubic's clip to 0..255 and truncation (both exact), four lanes to int32. */
NANO_TARGET("avx2")
static inline __m128i clip_truncate4(__m256d v) {
    return _mm256_cvttpd_epi32(_mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(255.0)));
}

/* Lane k of a block as one RGB pixel: int32 R, G, B, 0. */
NANO_TARGET("avx2")
static inline __attribute__((always_inline)) __m128i rgb_pixel(const uint8_t *buf, int ps, const block4 *b, int k,
                                                               int bicubic) {
    const uint8_t *p = buf + (uint32_t)_mm_extract_epi32(b->off, 0);
    __m256d dx, dy;
    switch (k) { /* the lane's fractions broadcast (the shuffles take constants) */
    case 0: dx = _mm256_permute4x64_pd(b->dx, 0x00); dy = _mm256_permute4x64_pd(b->dy, 0x00); break;
    case 1:
        p = buf + (uint32_t)_mm_extract_epi32(b->off, 1);
        dx = _mm256_permute4x64_pd(b->dx, 0x55);
        dy = _mm256_permute4x64_pd(b->dy, 0x55);
        break;
    case 2:
        p = buf + (uint32_t)_mm_extract_epi32(b->off, 2);
        dx = _mm256_permute4x64_pd(b->dx, 0xAA);
        dy = _mm256_permute4x64_pd(b->dy, 0xAA);
        break;
    default:
        p = buf + (uint32_t)_mm_extract_epi32(b->off, 3);
        dx = _mm256_permute4x64_pd(b->dx, 0xFF);
        dy = _mm256_permute4x64_pd(b->dy, 0xFF);
    }
    if (!bicubic) {
        __m256d h0 = lerp_rgb(p, dx), h1 = lerp_rgb(p + ps, dx);
        return _mm256_cvttpd_epi32(_mm256_add_pd(h0, _mm256_mul_pd(_mm256_sub_pd(h1, h0), dy)));
    }
    __m256d h0, h1, h2, h3;
    cubic_rgb2(p, ps, dx, &h0, &h1);
    cubic_rgb2(p + 2 * ps, ps, dx, &h2, &h3);
    return clip_truncate4(cubic_pd(h0, h1, h2, h3, dy));
}

/* For each set of inside lanes: the bytes of four RGB pixels (12 of 16) to take from the result. */
static const uint8_t rgb_lane_bytes[16][16] = {
#define B3(k, m) ((m) >> (k) & 1 ? 0xff : 0), ((m) >> (k) & 1 ? 0xff : 0), ((m) >> (k) & 1 ? 0xff : 0)
#define ROW(m) {B3(0, m), B3(1, m), B3(2, m), B3(3, m), 0, 0, 0, 0}
    ROW(0), ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6), ROW(7),
    ROW(8), ROW(9), ROW(10), ROW(11), ROW(12), ROW(13), ROW(14), ROW(15),
#undef ROW
#undef B3
};

/* For each set of inside lanes: int32 lanes all ones where inside. */
static const int32_t lane_masks[16][4] = {
    {0, 0, 0, 0},   {-1, 0, 0, 0},   {0, -1, 0, 0},   {-1, -1, 0, 0},   {0, 0, -1, 0},   {-1, 0, -1, 0},
    {0, -1, -1, 0}, {-1, -1, -1, 0}, {0, 0, 0, -1},   {-1, 0, 0, -1},   {0, -1, 0, -1},  {-1, -1, 0, -1},
    {0, 0, -1, -1}, {-1, 0, -1, -1}, {0, -1, -1, -1}, {-1, -1, -1, -1}};

NANO_TARGET("avx2")
static int warp_rgb_avx2(const warp_job *j, int bicubic) {
    const int pad = bicubic ? 2 : 1;
    if ((int64_t)(j->src->width + 2 * pad) * 4 * (j->src->height + 2 * pad) >= INT32_MAX)
        return warp_generic(j, bicubic ? NANO_BICUBIC : NANO_BILINEAR); /* the offsets are 32-bit */
    ptrdiff_t ps;
    uint8_t *buf = padded_copy(j->src, pad, 4, &ps);
    if (!buf)
        return -1;
    uint8_t fill_bytes[16];
    for (int i = 0; i < 16; i++)
        fill_bytes[i] = j->fill[i % 3];
    const __m128i fill = _mm_loadu_si128((const __m128i *)fill_bytes);
    /* four int16 RGB0 pixels, packed to bytes, to twelve bytes RGB RGB RGB RGB */
    const __m128i pack = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    int rc = 0;
    block4 b;
    for (int y = 0; y < j->out_h && !rc; y++) {
        uint8_t *row = j->dst + (ptrdiff_t)y * j->dst_stride;
        const double yc = y + 0.5;
        for (int x = 0; x < j->out_w; x += 4) {
            int n = j->out_w - x < 4 ? j->out_w - x : 4;
            if ((rc = map_block(j, x, yc, n, 4, (int)ps, &b)))
                break;
            __m128i px = fill;
            if (b.inside) {
                __m128i p0 = rgb_pixel(buf, (int)ps, &b, 0, bicubic), p1 = rgb_pixel(buf, (int)ps, &b, 1, bicubic);
                __m128i p2 = rgb_pixel(buf, (int)ps, &b, 2, bicubic), p3 = rgb_pixel(buf, (int)ps, &b, 3, bicubic);
                __m128i v = _mm_shuffle_epi8(_mm_packus_epi16(_mm_packs_epi32(p0, p1), _mm_packs_epi32(p2, p3)), pack);
                px = _mm_blendv_epi8(fill, v, _mm_loadu_si128((const __m128i *)rgb_lane_bytes[b.inside]));
            }
            uint8_t *o = row + (ptrdiff_t)x * 3;
            if (x + 6 <= j->out_w) { /* 16 bytes fit before the row's end: the next block rewrites the last 4 */
                _mm_storeu_si128((__m128i *)o, px);
            } else {
                uint8_t tmp[16];
                _mm_storeu_si128((__m128i *)tmp, px);
                memcpy(o, tmp, (size_t)n * 3);
            }
        }
    }
    free(buf);
    return rc;
}

NANO_TARGET("avx2")
static int warp_l_avx2(const warp_job *j, int bicubic) {
    const int pad = bicubic ? 2 : 1;
    if ((int64_t)(j->src->width + 2 * pad) * (j->src->height + 2 * pad) >= INT32_MAX)
        return warp_generic(j, bicubic ? NANO_BICUBIC : NANO_BILINEAR); /* the offsets are 32-bit */
    ptrdiff_t ps;
    uint8_t *buf = padded_copy(j->src, pad, 1, &ps);
    if (!buf)
        return -1;
    const __m128i fill = _mm_set1_epi32(j->fill[0]), stride = _mm_set1_epi32((int)ps), low = _mm_set1_epi32(255);
    const __m128i bytes = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const int *base = (const int *)buf;
    int rc = 0;
    block4 b;
    for (int y = 0; y < j->out_h && !rc; y++) {
        uint8_t *row = j->dst + (ptrdiff_t)y * j->dst_stride;
        const double yc = y + 0.5;
        for (int x = 0; x < j->out_w; x += 4) {
            int n = j->out_w - x < 4 ? j->out_w - x : 4;
            if ((rc = map_block(j, x, yc, n, 1, (int)ps, &b)))
                break;
            __m128i v = fill;
            if (b.inside) {
                /* four bytes from each pixel's first tap on (the copy has slack past its end) */
                if (!bicubic) {
                    __m128i g0 = _mm_i32gather_epi32(base, b.off, 1);
                    __m128i g1 = _mm_i32gather_epi32(base, _mm_add_epi32(b.off, stride), 1);
                    __m128i a0 = _mm_and_si128(g0, low), b0 = _mm_and_si128(_mm_srli_epi32(g0, 8), low);
                    __m128i a1 = _mm_and_si128(g1, low), b1 = _mm_and_si128(_mm_srli_epi32(g1, 8), low);
                    __m256d h0 = _mm256_add_pd(_mm256_cvtepi32_pd(a0),
                                               _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(b0, a0)), b.dx));
                    __m256d h1 = _mm256_add_pd(_mm256_cvtepi32_pd(a1),
                                               _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(b1, a1)), b.dx));
                    v = _mm256_cvttpd_epi32(_mm256_add_pd(h0, _mm256_mul_pd(_mm256_sub_pd(h1, h0), b.dy)));
                } else {
                    __m256d h[4];
                    __m128i off = b.off;
                    for (int k = 0; k < 4; k++, off = _mm_add_epi32(off, stride)) {
                        __m128i g = _mm_i32gather_epi32(base, off, 1);
                        h[k] = cubic_taps(_mm_and_si128(g, low), _mm_and_si128(_mm_srli_epi32(g, 8), low),
                                          _mm_and_si128(_mm_srli_epi32(g, 16), low), _mm_srli_epi32(g, 24), b.dx);
                    }
                    v = clip_truncate4(cubic_pd(h[0], h[1], h[2], h[3], b.dy));
                }
                v = _mm_blendv_epi8(fill, v, _mm_loadu_si128((const __m128i *)lane_masks[b.inside]));
            }
            uint32_t px = (uint32_t)_mm_cvtsi128_si32(_mm_shuffle_epi8(v, bytes));
            if (n == 4)
                memcpy(row + x, &px, 4);
            else
                for (int i = 0; i < n; i++)
                    row[x + i] = (uint8_t)(px >> (8 * i));
        }
    }
    free(buf);
    return rc;
}

#endif /* NANO_X86 */

int nano_warp(const nano_view *src, uint8_t *dst, ptrdiff_t dst_stride, int out_w, int out_h, const double *coeffs,
              int perspective, int filter, const uint8_t *fill, int isa) {
    if (filter != NANO_NEAREST && filter != NANO_BILINEAR && filter != NANO_BICUBIC)
        return -2;
    if (out_w <= 0 || out_h <= 0 || src->width <= 0 || src->height <= 0 || (src->channels != 1 && src->channels != 3))
        return -3;
    for (int i = 0; i < (perspective ? 8 : 6); i++)
        if (!isfinite(coeffs[i]))
            return NANO_WARP_UNDEFINED; /* PIL's conversions of such coordinates are undefined in C */
    warp_job j = {src, dst, dst_stride, out_w, out_h, coeffs, perspective, fill};
    if (filter == NANO_NEAREST && !perspective)
        return nearest_affine(&j);
#if NANO_X86
    if (isa >= NANO_ISA_AVX2 && filter != NANO_NEAREST)
        return src->channels == 3 ? warp_rgb_avx2(&j, filter == NANO_BICUBIC) : warp_l_avx2(&j, filter == NANO_BICUBIC);
#else
    (void)isa;
#endif
    return warp_generic(&j, filter);
}
