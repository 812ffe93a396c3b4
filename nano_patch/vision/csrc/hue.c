/* PIL's hue shift (RGB -> HSV, add to H modulo 256, HSV -> RGB), bit-exact and fused into one pass.
 *
 * torchvision's PIL adjust_hue converts the image to PIL's 8-bit HSV, adds to the H band and
 * converts back. PIL does both conversions per pixel in scalar float code with three divisions and
 * an fmod, about 15 ns a pixel each way. The results depend on few inputs, so most of the work is
 * done once, into tables, in the same float/double arithmetic PIL uses:
 *
 *   RGB -> HSV   V = max; S depends on (max, chroma); H depends on (which channel is the largest,
 *                the signed difference of the other two, chroma), because PIL's (max - c) / chroma
 *                terms only ever see differences.
 *   HSV -> RGB   the sector and its fraction depend on H, S/255 on S, the "p" value on (V, S); the
 *                "q" and "t" values are computed per pixel in PIL's mixed float/double arithmetic.
 *
 * Build without -ffast-math and with -ffp-contract=off: a fused multiply-add rounds differently.
 * The Python side checks this kernel against the installed PIL before using it.
 */
#include "native.h"

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

/* Shift the hue of every pixel of an RGB image by `shift` levels of PIL's 8-bit H. */
void nano_hue_shift(const nano_view *srcv, uint8_t *dst, int shift) {
    for (int y = 0; y < srcv->height; y++) {
        const uint8_t *src = srcv->data + (ptrdiff_t)y * srcv->stride;
        for (int i = 0; i < srcv->width; i++, src += 3, dst += 3) {
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
    }
}
