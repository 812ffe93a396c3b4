/* nano-patch's native image kernels: shared types and the instruction-set plumbing.
 *
 * Every kernel reproduces one piece of PIL's arithmetic on uint8 images held as NumPy arrays
 * (H x W x 3 RGB or H x W L), bit for bit. The Python side checks each one against the installed
 * PIL before first use. Portable C is always built; on x86-64 with GCC or clang, variants for
 * wider instruction sets are compiled into the same library with function target attributes and
 * chosen at run time from the CPU's features (module.c).
 *
 * Build without -ffast-math and with -ffp-contract=off: a fused multiply-add rounds differently
 * from PIL's separate multiply and add.
 */
#ifndef NANO_NATIVE_H
#define NANO_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define NANO_X86 1
#define NANO_TARGET(isa) __attribute__((target(isa)))
#else
#define NANO_X86 0
#endif

/* Instruction sets a kernel may have a variant for, widest last. */
enum nano_isa { NANO_ISA_GENERIC = 0, NANO_ISA_AVX2 = 1, NANO_ISA_AVX512 = 2 };

/* An 8-bit image: rows may be strided (even negatively); a row's pixels are packed. */
typedef struct {
    const uint8_t *data;
    ptrdiff_t stride; /* bytes from one row to the next */
    int width, height, channels;
} nano_view;

/* --- resample.c: PIL's convolution resize (Resample.c) --- */

/* PIL's filter numbers (Image.Resampling). NEAREST is not a convolution and is not handled here. */
enum { NANO_LANCZOS = 1, NANO_BILINEAR = 2, NANO_BICUBIC = 3, NANO_BOX = 4, NANO_HAMMING = 5,
       NANO_MKS2013 = 6, NANO_MKS2021 = 7 };

/* Which pass PIL runs first. 0: always horizontal (Pillow up to 12); 1: vertical first when the
 * height shrinks by more than twice as many pixels as the width (Pillow 13). */
enum { NANO_ORDER_HORIZONTAL_FIRST = 0, NANO_ORDER_PILLOW13 = 1 };

/* Whose fixed-point weights: Pillow's 22-bit ones, or pillow-simd's 16-bit ones. */
enum { NANO_WEIGHTS_PILLOW = 0, NANO_WEIGHTS_PILLOW_SIMD = 1 };

/* PIL's resize of src[box] to full_w x full_h, of which only the window of out_w x out_h at
 * (x0, y0) is computed, into dst (out_h rows of out_w * channels bytes, dst_stride apart).
 * ``flip`` mirrors the window left to right. Returns 0, -1 out of memory, -2 unknown filter,
 * -3 bad sizes, window or box. */
int nano_resample(const nano_view *src, uint8_t *dst, ptrdiff_t dst_stride, int full_w, int full_h, int x0, int y0,
                  int out_w, int out_h, int filter, const float box[4], int flip, int order_rule, int weights,
                  int isa);

/* --- color.c: PIL's RGB -> L (Convert.c) and Image.blend (Blend.c) as ImageEnhance uses it --- */

/* Whose grey formula: Pillow's, or pillow-simd's (different rounding on most of each row). */
enum { NANO_GREY_PILLOW = 0, NANO_GREY_PILLOW_SIMD = 1 };

void nano_rgb_to_l(const nano_view *src, uint8_t *dst, int mode, int isa);
/* The sum of PIL's L values over the image (what ImageStat's mean is built from). */
uint64_t nano_gray_sum(const nano_view *src, int mode, int isa);
/* Image.blend(image.convert("L").convert("RGB"), image, alpha): ImageEnhance.Color. */
void nano_blend_gray(const nano_view *src, uint8_t *dst, float alpha, int mode, int isa);
/* Image.blend(constant image of value in1, image, alpha): ImageEnhance.Brightness (in1 0) and
 * ImageEnhance.Contrast (in1 the grey mean). */
void nano_blend_const(const nano_view *src, uint8_t *dst, int in1, float alpha, int isa);
/* ImageEnhance.Sharpness: Image.blend(image.filter(ImageFilter.SMOOTH), image, alpha). */
void nano_sharpness(const nano_view *src, uint8_t *dst, float alpha);
/* One 256-entry table per channel: dst[y][x][c] = tables[c][src[y][x][c]]. */
void nano_lut(const nano_view *src, uint8_t *dst, const uint8_t *tables, int isa);

/* --- hue.c: PIL's hue shift (RGB -> HSV, add to H, HSV -> RGB) --- */

void nano_hue_init(void);
void nano_hue_shift(const nano_view *srcv, uint8_t *dst, int shift, int isa);

/* --- tensor.c: H x W x C uint8 through one table per channel, to C x H x W or H x W x C --- */

void nano_planes_lut_f32(const nano_view *src, const float *tables, float *dst, int out_channels);
void nano_planes_lut_f64(const nano_view *src, const double *tables, double *dst, int out_channels);
void nano_pixels_lut_f32(const nano_view *src, const float *tables, float *dst);
void nano_pixels_lut_f64(const nano_view *src, const double *tables, double *dst);

/* --- geometry.c: PIL's Image.transform (Geometry.c), affine and perspective --- */

/* PIL's nearest filter number (the others are NANO_BILINEAR and NANO_BICUBIC above). */
enum { NANO_NEAREST = 0 };

/* nano_warp's answer where PIL's own result is undefined behaviour in C (a NaN coordinate, a
 * fixed-point overflow): the caller runs PIL's code. */
#define NANO_WARP_UNDEFINED (-4)

/* PIL's Image.transform((out_w, out_h), AFFINE or PERSPECTIVE, coeffs, filter) of src into dst,
 * pixels mapped outside src taking `fill` (a byte per channel). coeffs: 6 (affine) or 8. Returns 0,
 * -1 out of memory, -2 unknown filter, -3 bad sizes, NANO_WARP_UNDEFINED. */
int nano_warp(const nano_view *src, uint8_t *dst, ptrdiff_t dst_stride, int out_w, int out_h, const double *coeffs,
              int perspective, int filter, const uint8_t *fill, int isa);

/* --- oplist.c: the op runner, one sample's recorded operations and its tensor tail as one call --- */

/* Op codes (pixels.py's OP_* numbers). a..d and factor are each op's parameters; table, LUT's 256 bytes. */
enum { NANO_OP_CROP = 1, NANO_OP_RESIZE, NANO_OP_HFLIP, NANO_OP_VFLIP, NANO_OP_BRIGHTNESS, NANO_OP_CONTRAST,
       NANO_OP_SATURATION, NANO_OP_HUE, NANO_OP_GREY, NANO_OP_LUT, NANO_OP_SHARPNESS };

typedef struct {
    int code, a, b, c, d; /* crop: top, left, height, width; resize: height, width, filter; hue: shift; grey: channels */
    double factor;        /* brightness, contrast, saturation, sharpness */
    uint8_t table[256];   /* LUT */
} nano_op;

/* What the tail writes into dst: the pixels as they are (H x W x C bytes), or through one float table per channel,
 * to C x H x W planes (ToTensor) or H x W x C (PILToTensor + ConvertImageDtype). */
enum { NANO_TAIL_BYTES = 0, NANO_TAIL_PLANES_F32, NANO_TAIL_PLANES_F64, NANO_TAIL_PIXELS_F32, NANO_TAIL_PIXELS_F64 };

typedef struct {
    int kind;
    const void *table; /* table_rows x 256 floats or doubles */
    int table_rows;
    void *dst;                    /* C-contiguous, of the final image's size */
    int width, height, channels;  /* the final image the draw worked out */
} nano_tail;

/* The checked arithmetic of the installed PIL (native_checks.py) and the instruction set. */
typedef struct {
    int order_rule, weights, grey_mode, saturation_mode, isa;
} nano_op_settings;

enum { NANO_OPS_NOMEM = -1, NANO_OPS_BAD = -2, NANO_OPS_SIZE = -3 };

/* Runs ops[0..n_ops) on src, then the tail into tail->dst. Returns 0, or NANO_OPS_* (dst then undefined). */
int nano_run_ops(const nano_view *src, const nano_op *ops, int n_ops, const nano_tail *tail,
                 const nano_op_settings *s);

/* helpers.c: fn(arg) on n_threads threads at once, the caller one of them (native helpers, parked between calls;
 * call it with the GIL released: they never take it). Returns how many threads ran it (fewer where a helper could
 * not be started; 1 without POSIX threads). One call at a time: a second caller waits. */
typedef void (*nano_share_fn)(void *arg);
int nano_run_shared(nano_share_fn fn, void *arg, int n_threads);
/* Helpers started in this process. */
int nano_helpers_started(void);

#endif
