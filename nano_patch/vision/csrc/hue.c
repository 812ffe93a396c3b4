/* PIL's hue shift (RGB -> HSV, add to H modulo 256, HSV -> RGB), bit-exact and fused into one pass.
 *
 * torchvision's PIL adjust_hue converts the image to PIL's 8-bit HSV, adds to the H band and
 * converts back. PIL does both conversions per pixel in scalar float code with three divisions and
 * an fmod, about 15 ns a pixel each way.
 *
 * The portable code does most of the work once, into tables, in the same float/double arithmetic
 * PIL uses:
 *
 *   RGB -> HSV   V = max; S depends on (max, chroma); H depends on (which channel is the largest,
 *                the signed difference of the other two, chroma), because PIL's (max - c) / chroma
 *                terms only ever see differences.
 *   HSV -> RGB   the sector and its fraction depend on H, S/255 on S, the "p" value on (V, S); the
 *                "q" and "t" values are computed per pixel in PIL's mixed float/double arithmetic.
 *
 * The AVX2 code computes eight pixels at a time in PIL's own operations instead (below).
 *
 * Build without -ffast-math and with -ffp-contract=off: a fused multiply-add rounds differently.
 * The Python side checks this kernel against the installed PIL before using it.
 */
#include "native.h"

#if NANO_X86
#include <immintrin.h>
#endif

static uint8_t sat_of[256][256];       /* [max][chroma] */
static uint8_t hue_of[3][511][256];    /* [largest channel][other two's difference + 255][chroma] */
static uint8_t sector_of[256];          /* [H] -> 0..5 */
static float frac_of[256];              /* [H] */
static float fs_of[256];                /* [S] -> S / 255 as PIL keeps it, in float */
static uint8_t p_of[256][256];         /* [V][S] */
static int ready;

static int clip8(int x) { return x < 0 ? 0 : (x > 255 ? 255 : x); }

/* C's round() (half away from zero) for x >= 0, without a libm call. */
static int round_pos(double x) {
    int r = (int)x;
    return (x - (double)r >= 0.5) ? r + 1 : r;
}

/* One pixel of PIL's RGB -> HSV, in its arithmetic; used only to fill the tables. */
static void rgb_to_hsv_ref(int r, int g, int b, uint8_t *h, uint8_t *s) {
    int hi = r > g ? (r > b ? r : b) : (g > b ? g : b);
    int lo = r < g ? (r < b ? r : b) : (g < b ? g : b);
    if (hi == lo) {
        *h = 0;
        *s = 0;
        return;
    }
    float chroma = (float)(hi - lo);
    float sat = chroma / (float)hi;
    float rd = (float)(hi - r) / chroma, gd = (float)(hi - g) / chroma, bd = (float)(hi - b) / chroma;
    float hue;
    if (r == hi)
        hue = bd - gd;
    else if (g == hi)
        hue = 2.0 + rd - bd;
    else
        hue = 4.0 + gd - rd;
    double turn = hue / 6.0 + 1.0;
    float frac = (float)(turn - (double)(int)turn); /* fmod(turn, 1.0) for 0 <= turn < 2, exact; PIL keeps a float */
    *h = (uint8_t)clip8((int)(frac * 255.0));
    *s = (uint8_t)clip8((int)(sat * 255.0));
}

void nano_hue_init(void) {
    if (ready)
        return;
    uint8_t h, s;
    for (int v = 0; v < 256; v++)
        for (int c = 0; c <= v; c++) {
            rgb_to_hsv_ref(v, v - c, v - c, &h, &s);
            sat_of[v][c] = s;
        }
    for (int c = 1; c < 256; c++)
        for (int d = -c; d <= c; d++) {
            /* the largest channel is 255; of the other two, the lower is 255 - c and the difference d */
            int lo = 255 - c;
            int x = d >= 0 ? lo : lo - d, y = d >= 0 ? lo + d : lo; /* y - x == d */
            rgb_to_hsv_ref(255, x, y, &h, &s); /* red largest: d = b - g */
            hue_of[0][d + 255][c] = h;
            if (d != c) { /* with d == c red would tie green, and PIL takes red first */
                rgb_to_hsv_ref(y, 255, x, &h, &s); /* green largest (red below it): d = r - b */
                hue_of[1][d + 255][c] = h;
            }
            if (d != c && d != -c) {
                rgb_to_hsv_ref(x, y, 255, &h, &s); /* blue largest (red, green below it): d = g - r */
                hue_of[2][d + 255][c] = h;
            }
        }
    for (int i = 0; i < 256; i++) {
        int sector = (int)((float)i * 6.0 / 255.0);
        frac_of[i] = (float)((float)i * 6.0 / 255.0 - (float)sector);
        sector_of[i] = (uint8_t)(sector % 6);
        fs_of[i] = (float)((float)i / 255.0);
    }
    for (int v = 0; v < 256; v++)
        for (int s = 0; s < 256; s++)
            p_of[v][s] = (uint8_t)clip8(round_pos((float)v * (1.0 - fs_of[s])));
    ready = 1;
}

/* Which of V, p, q, t each output channel takes, by sector (PIL's switch, as data: no branch). */
static const uint8_t pick[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};

/* One pixel of the hue shift, from the tables. */
static inline void hue_pixel(const uint8_t *src, uint8_t *dst, int shift) {
    int r = src[0], g = src[1], b = src[2];
    int hi = r > g ? r : g, lo = r < g ? r : g;
    hi = hi > b ? hi : b;
    lo = lo < b ? lo : b;
    int which = r == hi ? 0 : (g == hi ? 1 : 2);
    int d = which == 0 ? b - g : (which == 1 ? r - b : g - r);
    int c = hi - lo;
    int s = sat_of[hi][c]; /* 0 for grey, where the hue table is never read */
    int h = (hue_of[which][d + 255][c] + shift) & 255;
    float fs = fs_of[s], f = frac_of[h];
    double v = (double)hi;
    double qx = v * (1.0 - fs * f), tx = v * (1.0 - fs * (1.0 - f));
    int q = (int)qx, t = (int)tx;
    q += qx - (double)q >= 0.5; /* C's round() for x >= 0 */
    t += tx - (double)t >= 0.5;
    uint8_t vals[4] = {(uint8_t)hi, p_of[hi][s], (uint8_t)q, (uint8_t)t};
    const uint8_t *k = pick[sector_of[h]];
    /* S == 0: PIL returns V on all three channels, which is what p, q and t are then */
    dst[0] = vals[k[0]];
    dst[1] = vals[k[1]];
    dst[2] = vals[k[2]];
}

#if NANO_X86

/* Eight pixels at a time, in PIL's float and double operations rather than the tables: the same
 * IEEE operations on the same values round the same in a vector lane as in PIL's scalar code, and
 * the divider beats scattered reads of the hue table. Where this code takes a shorter route than
 * PIL's, the route was checked equal to PIL's on every input it can see (tests/test_native_kernels.py
 * checks every colour; the reasons are given where they are taken):
 *   - S / 255 and the sector fraction, which PIL divides in double and keeps as floats, are one
 *     float division each (every one of the 256 inputs);
 *   - PIL truncates float * 255.0 in double for S and H; float * 255.0f truncates the same (all
 *     32640 saturations, all 196605 hues);
 *   - p is integer arithmetic: v (255 - S) / 255 is never within PIL's float error of a half;
 *   - each sector uses p and one of q and t, never both: one double multiply serves both;
 *   - C's round(x) for x >= 0 is floor(x + 0.5) on every q and t PIL can compute.
 * A row goes in chunks through two loops, RGB -> (V, S, shifted H), then back to RGB, each with a
 * dependency chain short enough for the core to overlap its iterations. */

#define HUE_CHUNK 64

/* PIL's H of four pixels before the 8-bit step: x, y the float quotients (max - a) / chroma and
 * (max - b) / chroma that its branch subtracts, k the constant it adds (0, 2 or 4). */
NANO_TARGET("avx2")
static inline __m128 hue_frac4(__m128 x, __m128 y, __m128i k) {
    const __m256d one = _mm256_set1_pd(1.0);
    /* PIL rounds k + x - y (in float on its red branch, in double then to float on the others) to
     * a float: the exact value fits a double, so one rounding to float gives the same */
    __m256d h = _mm256_add_pd(_mm256_sub_pd(_mm256_cvtps_pd(x), _mm256_cvtps_pd(y)), _mm256_cvtepi32_pd(k));
    /* PIL divides by 6.0; multiplying by 1 / 6.0 differs in the last bit of some doubles, but never
     * in the float PIL keeps of the result (every reachable H checked) */
    __m256d turn = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_cvtpd_ps(h)), _mm256_set1_pd(1.0 / 6.0)), one);
    /* fmod(turn, 1.0) for 5/6 <= turn < 2: subtract one where it is at least one (exact) */
    turn = _mm256_sub_pd(turn, _mm256_and_pd(_mm256_cmp_pd(turn, one, _CMP_GE_OQ), one));
    return _mm256_cvtpd_ps(turn);
}

/* RGB -> V | S << 8 | (H + shift) << 16, eight pixels (24 bytes at p; 32 are read). */
NANO_TARGET("avx2")
static inline __m256i to_hsv8(const uint8_t *p, __m256i shift) {
    const __m256i spread = _mm256_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5); /* pixels 0-3 in lane 0, 4-7 in lane 1 */
    const __m256i pick_r = _mm256_setr_epi8(0, -1, -1, -1, 3, -1, -1, -1, 6, -1, -1, -1, 9, -1, -1, -1,
                                            0, -1, -1, -1, 3, -1, -1, -1, 6, -1, -1, -1, 9, -1, -1, -1);
    const __m256i pick_g = _mm256_setr_epi8(1, -1, -1, -1, 4, -1, -1, -1, 7, -1, -1, -1, 10, -1, -1, -1,
                                            1, -1, -1, -1, 4, -1, -1, -1, 7, -1, -1, -1, 10, -1, -1, -1);
    const __m256i pick_b = _mm256_setr_epi8(2, -1, -1, -1, 5, -1, -1, -1, 8, -1, -1, -1, 11, -1, -1, -1,
                                            2, -1, -1, -1, 5, -1, -1, -1, 8, -1, -1, -1, 11, -1, -1, -1);
    const __m256i ones = _mm256_set1_epi32(1);
    const __m256 c255 = _mm256_set1_ps(255.0f);
    __m256i px = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)p), spread);
    __m256i r = _mm256_shuffle_epi8(px, pick_r), g = _mm256_shuffle_epi8(px, pick_g);
    __m256i b = _mm256_shuffle_epi8(px, pick_b);
    __m256i hi = _mm256_max_epi32(_mm256_max_epi32(r, g), b);
    __m256i c = _mm256_sub_epi32(hi, _mm256_min_epi32(_mm256_min_epi32(r, g), b));
    /* PIL's branch: red largest (first on ties), else green, else blue; each subtracts the
     * quotients of the other two channels and adds 0, 2 or 4 */
    __m256i red = _mm256_cmpeq_epi32(r, hi), green = _mm256_andnot_si256(red, _mm256_cmpeq_epi32(g, hi));
    __m256i xa = _mm256_blendv_epi8(_mm256_blendv_epi8(g, r, green), b, red);
    __m256i ya = _mm256_blendv_epi8(_mm256_blendv_epi8(r, b, green), g, red);
    __m256i k = _mm256_andnot_si256(red, _mm256_blendv_epi8(_mm256_set1_epi32(4), _mm256_set1_epi32(2), green));
    /* grey (chroma 0) divides by one instead of zero; its S is set to 0 below, and S 0 gives V on
     * every channel whatever H is */
    __m256i grey = _mm256_cmpeq_epi32(c, _mm256_setzero_si256());
    __m256 cf = _mm256_cvtepi32_ps(_mm256_max_epi32(c, ones));
    __m256 xq = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, xa)), cf);
    __m256 yq = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, ya)), cf);
    __m256 sat = _mm256_div_ps(_mm256_cvtepi32_ps(c), _mm256_cvtepi32_ps(_mm256_max_epi32(hi, ones)));
    __m256 frac = _mm256_set_m128(
        hue_frac4(_mm256_extractf128_ps(xq, 1), _mm256_extractf128_ps(yq, 1), _mm256_extracti128_si256(k, 1)),
        hue_frac4(_mm256_castps256_ps128(xq), _mm256_castps256_ps128(yq), _mm256_castsi256_si128(k)));
    __m256i h = _mm256_cvttps_epi32(_mm256_mul_ps(frac, c255));
    __m256i s = _mm256_andnot_si256(grey, _mm256_cvttps_epi32(_mm256_mul_ps(sat, c255)));
    h = _mm256_and_si256(_mm256_add_epi32(h, shift), _mm256_set1_epi32(255));
    return _mm256_or_si256(_mm256_or_si256(hi, _mm256_slli_epi32(s, 8)), _mm256_slli_epi32(h, 16));
}

/* PIL's q (odd sectors) or t (even sectors) of four pixels from V, fs = S / 255, the sector
 * fraction f and the odd-sector mask: round(V (1 - fs f)) with fs f rounded to float, or
 * round(V (1 - fs (1 - f))) in double. */
NANO_TARGET("avx2")
static inline __m128i q_or_t4(__m128i v, __m128 fs, __m128 f, __m128i odd) {
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d fd = _mm256_cvtps_pd(f), odd_d = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(odd));
    __m256d prod = _mm256_mul_pd(_mm256_cvtps_pd(fs), _mm256_blendv_pd(_mm256_sub_pd(one, fd), fd, odd_d));
    /* fs f is exact in double; PIL's float product is its rounding to float */
    prod = _mm256_blendv_pd(prod, _mm256_cvtps_pd(_mm256_cvtpd_ps(prod)), odd_d);
    __m256d x = _mm256_mul_pd(_mm256_cvtepi32_pd(v), _mm256_sub_pd(one, prod));
    return _mm256_cvttpd_epi32(_mm256_add_pd(x, _mm256_set1_pd(0.5)));
}

/* V | S << 8 | H << 16 -> RGB, eight pixels, 24 bytes stored at out. by_sector: per sector (0-6, 6
 * being 0 again), the shuffle indices that pick R, G and B out of V | p | q-or-t. */
NANO_TARGET("avx2")
static inline void to_rgb8(__m256i hsv, __m256i by_sector, uint8_t *out) {
    const __m256i pixel_base = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c,
                                                 0, 0x04040404, 0x08080808, 0x0c0c0c0c);
    const __m256i compact = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                             0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m256i bytes = _mm256_set1_epi32(255), ones = _mm256_set1_epi32(1);
    const __m256 c255 = _mm256_set1_ps(255.0f);
    __m256i v = _mm256_and_si256(hsv, bytes), s = _mm256_and_si256(_mm256_srli_epi32(hsv, 8), bytes);
    __m256i h = _mm256_srli_epi32(hsv, 16);
    /* PIL's floor(H * 6.0 / 255.0) (0..6), exactly in integers, and its fraction (6 H - 255 i) / 255 */
    __m256i sector = _mm256_srli_epi32(_mm256_add_epi32(_mm256_mullo_epi32(h, _mm256_set1_epi32(1542)),
                                                        _mm256_set1_epi32(257)), 16);
    __m256i m = _mm256_sub_epi32(_mm256_mullo_epi32(h, _mm256_set1_epi32(6)), _mm256_mullo_epi32(sector, bytes));
    __m256 f = _mm256_div_ps(_mm256_cvtepi32_ps(m), c255), fs = _mm256_div_ps(_mm256_cvtepi32_ps(s), c255);
    __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(sector, ones), ones);
    /* p = round(V (1 - fs)) = (V (255 - S) + 127) / 255 */
    __m256i pv = _mm256_add_epi32(_mm256_mullo_epi16(v, _mm256_sub_epi32(bytes, s)), _mm256_set1_epi32(127));
    __m256i p = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(pv, ones), _mm256_srli_epi32(pv, 8)), 8);
    __m256i w = _mm256_set_m128i(
        q_or_t4(_mm256_extracti128_si256(v, 1), _mm256_extractf128_ps(fs, 1), _mm256_extractf128_ps(f, 1),
                _mm256_extracti128_si256(odd, 1)),
        q_or_t4(_mm256_castsi256_si128(v), _mm256_castps256_ps128(fs), _mm256_castps256_ps128(f),
                _mm256_castsi256_si128(odd)));
    __m256i vals = _mm256_or_si256(_mm256_or_si256(v, _mm256_slli_epi32(p, 8)), _mm256_slli_epi32(w, 16));
    __m256i order = _mm256_add_epi32(_mm256_permutevar8x32_epi32(by_sector, sector), pixel_base);
    __m256i rgb = _mm256_shuffle_epi8(_mm256_shuffle_epi8(vals, order), compact);
    rgb = _mm256_permutevar8x32_epi32(rgb, _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7));
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(rgb));
    _mm_storel_epi64((__m128i *)(out + 16), _mm256_extracti128_si256(rgb, 1));
}

NANO_TARGET("avx2")
static void hue_shift_avx2(const nano_view *srcv, uint8_t *dst, int shift) {
    /* which of V, p and q-or-t (bytes 0, 1, 2) each channel takes, by sector: pick[] with q and t
     * merged; sector 6 (H 255) is sector 0 */
    static const uint8_t pick_vpw[6][3] = {{0, 2, 1}, {2, 0, 1}, {1, 0, 2}, {1, 2, 0}, {2, 1, 0}, {0, 1, 2}};
    int32_t sectors[8];
    for (int i = 0; i < 8; i++) {
        const uint8_t *k = pick_vpw[i % 6];
        sectors[i] = k[0] | k[1] << 8 | k[2] << 16 | 0x80 << 24;
    }
    const __m256i by_sector = _mm256_loadu_si256((const __m256i *)sectors), shiftv = _mm256_set1_epi32(shift);
    int w = srcv->width;
    /* whole steps of eight whose 32-byte loads stay inside the row; the rest one by one */
    int vec_end = w * 3 >= 32 ? ((w * 3 - 32) / 24 + 1) * 8 : 0;
    __m256i hsv[HUE_CHUNK / 8];
    for (int y = 0; y < srcv->height; y++) {
        const uint8_t *row = srcv->data + (ptrdiff_t)y * srcv->stride;
        uint8_t *out = dst + (size_t)y * w * 3;
        for (int x0 = 0; x0 < vec_end; x0 += HUE_CHUNK) {
            int n = (vec_end - x0 < HUE_CHUNK ? vec_end - x0 : HUE_CHUNK) / 8;
            for (int i = 0; i < n; i++)
                hsv[i] = to_hsv8(row + (size_t)(x0 + 8 * i) * 3, shiftv);
            for (int i = 0; i < n; i++)
                to_rgb8(hsv[i], by_sector, out + (size_t)(x0 + 8 * i) * 3);
        }
        for (int x = vec_end; x < w; x++)
            hue_pixel(row + x * 3, out + x * 3, shift);
    }
}

#endif /* NANO_X86 */

/* Shift the hue of every pixel of an RGB image by `shift` levels of PIL's 8-bit H. */
void nano_hue_shift(const nano_view *srcv, uint8_t *dst, int shift, int isa) {
#if NANO_X86
    if (isa >= NANO_ISA_AVX2) {
        hue_shift_avx2(srcv, dst, shift);
        return;
    }
#endif
    (void)isa;
    for (int y = 0; y < srcv->height; y++) {
        const uint8_t *src = srcv->data + (ptrdiff_t)y * srcv->stride;
        for (int x = 0; x < srcv->width; x++, src += 3, dst += 3)
            hue_pixel(src, dst, shift);
    }
}
