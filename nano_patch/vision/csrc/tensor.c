/* From an H x W x C uint8 image to a float tensor in one pass: C x H x W (what ToTensor gives) or
 * H x W x C (what PILToTensor + ConvertImageDtype give, a channels-last view).
 *
 * ToTensor (+ Normalize), PILToTensor + ConvertImageDtype (+ Normalize) and v2's ToImage + ToDtype
 * (+ Normalize) are elementwise and per channel, and a uint8 pixel has 256 values: the Python side
 * runs the stock transforms on every value once, and each output element is then one table entry,
 * stock's own float result. An image with one channel and more table rows broadcasts, as stock's
 * Normalize does with three means on a grey image.
 */
#include "native.h"

#define PLANES_LUT(NAME, T)                                                                         \
    void NAME(const nano_view *src, const T *tables, T *dst, int out_channels) {                    \
        int w = src->width, h = src->height, ch = src->channels;                                    \
        size_t plane = (size_t)w * h;                                                               \
        for (int y = 0; y < h; y++) {                                                               \
            const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;                            \
            T *o = dst + (size_t)y * w;                                                             \
            if (ch == 3 && out_channels == 3) {                                                     \
                const T *t0 = tables, *t1 = tables + 256, *t2 = tables + 512;                       \
                T *o0 = o, *o1 = o + plane, *o2 = o + 2 * plane;                                    \
                for (int x = 0; x < w; x++) {                                                       \
                    o0[x] = t0[row[x * 3 + 0]];                                                     \
                    o1[x] = t1[row[x * 3 + 1]];                                                     \
                    o2[x] = t2[row[x * 3 + 2]];                                                     \
                }                                                                                   \
            } else {                                                                                \
                for (int c = 0; c < out_channels; c++) {                                            \
                    const T *t = tables + (size_t)c * 256;                                          \
                    const uint8_t *p = row + (ch == 1 ? 0 : c);                                     \
                    T *oc = o + (size_t)c * plane;                                                  \
                    for (int x = 0; x < w; x++)                                                     \
                        oc[x] = t[p[(size_t)x * ch]];                                               \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

PLANES_LUT(nano_planes_lut_f32, float)
PLANES_LUT(nano_planes_lut_f64, double)

#define PIXELS_LUT(NAME, T)                                                                         \
    void NAME(const nano_view *src, const T *tables, T *dst) {                                      \
        int w = src->width, ch = src->channels;                                                     \
        for (int y = 0; y < src->height; y++) {                                                     \
            const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;                            \
            T *o = dst + (size_t)y * w * ch;                                                        \
            if (ch == 3) {                                                                          \
                const T *t0 = tables, *t1 = tables + 256, *t2 = tables + 512;                       \
                for (int x = 0; x < w * 3; x += 3) {                                                \
                    o[x] = t0[row[x]];                                                              \
                    o[x + 1] = t1[row[x + 1]];                                                      \
                    o[x + 2] = t2[row[x + 2]];                                                      \
                }                                                                                   \
            } else {                                                                                \
                for (int x = 0; x < w; x++)                                                         \
                    o[x] = tables[row[x]];                                                          \
            }                                                                                       \
        }                                                                                           \
    }

PIXELS_LUT(nano_pixels_lut_f32, float)
PIXELS_LUT(nano_pixels_lut_f64, double)
