/* From an H x W x C uint8 image to a C x H x W tensor in one pass.
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

void nano_planes_u8(const nano_view *src, uint8_t *dst) {
    int w = src->width, h = src->height, ch = src->channels;
    size_t plane = (size_t)w * h;
    for (int y = 0; y < h; y++) {
        const uint8_t *row = src->data + (ptrdiff_t)y * src->stride;
        for (int c = 0; c < ch; c++) {
            uint8_t *o = dst + c * plane + (size_t)y * w;
            for (int x = 0; x < w; x++)
                o[x] = row[(size_t)x * ch + c];
        }
    }
}
