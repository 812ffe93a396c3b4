/* The op runner: one sample's recorded operations (crop, resize, flips, colour and point operations), then its
 * tensor tail, as one call, on the decoded array or the cache's view.
 *
 * It computes nothing of its own: every operation is one of the other files' kernels (resample.c, color.c,
 * hue.c, tensor.c), called as the Python side (pixels.py's Pixels) calls them, with the same deferred geometry:
 * a crop is a view, or a window of a pending resize; a resize waits, so that a flip after it is written into its
 * output; a flip waits through per-pixel operations. So the pixels are the Python path's, bit for bit, and that
 * path is stock's.
 */
#include <stdlib.h>
#include <string.h>

#include "native.h"

typedef struct {
    nano_view v;   /* the image as it is now */
    uint8_t *own;  /* v's buffer where this run made it (NULL: the caller's array) */
    int resize;    /* a pending resize of v to rw x rh with PIL's filter rf */
    int rw, rh, rf;
    int window;    /* a pending window (wl, wt, ww x wh) of that resize's output: only it is computed */
    int wt, wl, wh, ww;
    int flip;      /* a pending left-right mirror, applied last */
} pixels;

/* v becomes `buf` (packed rows of w x channels), which this run owns. */
static void take(pixels *p, uint8_t *buf, int w, int h, int channels) {
    free(p->own);
    p->own = buf;
    p->v.data = buf;
    p->v.stride = (ptrdiff_t)w * channels;
    p->v.width = w;
    p->v.height = h;
    p->v.channels = channels;
}

static uint8_t *new_image(int w, int h, int channels) { return malloc((size_t)w * h * channels); }

static void current_size(const pixels *p, int *h, int *w) {
    if (p->window) {
        *h = p->wh;
        *w = p->ww;
    } else if (p->resize) {
        *h = p->rh;
        *w = p->rw;
    } else {
        *h = p->v.height;
        *w = p->v.width;
    }
}

/* Pixels.array(): everything pending applied. */
static int apply_all(pixels *p, const nano_op_settings *s) {
    int ch = p->v.channels;
    if (p->resize) {
        int x0 = 0, y0 = 0, out_w = p->rw, out_h = p->rh;
        if (p->window) {
            x0 = p->wl;
            y0 = p->wt;
            out_w = p->ww;
            out_h = p->wh;
        }
        uint8_t *buf = new_image(out_w, out_h, ch);
        if (!buf)
            return NANO_OPS_NOMEM;
        float box[4] = {0.0f, 0.0f, (float)p->v.width, (float)p->v.height};
        int rc = nano_resample(&p->v, buf, (ptrdiff_t)out_w * ch, p->rw, p->rh, x0, y0, out_w, out_h, p->rf, box,
                               p->flip, s->order_rule, s->weights, s->isa);
        if (rc) {
            free(buf);
            return rc == -1 ? NANO_OPS_NOMEM : NANO_OPS_BAD;
        }
        take(p, buf, out_w, out_h, ch);
        p->resize = p->window = p->flip = 0;
    } else if (p->flip) {
        int w = p->v.width, h = p->v.height;
        uint8_t *buf = new_image(w, h, ch);
        if (!buf)
            return NANO_OPS_NOMEM;
        for (int y = 0; y < h; y++) {
            const uint8_t *row = p->v.data + (ptrdiff_t)y * p->v.stride;
            uint8_t *out = buf + (size_t)y * w * ch;
            for (int x = 0; x < w; x++)
                memcpy(out + (size_t)(w - 1 - x) * ch, row + (size_t)x * ch, (size_t)ch);
        }
        take(p, buf, w, h, ch);
        p->flip = 0;
    }
    return 0;
}

/* Pixels.unflipped(): any resize applied; a flip may stay pending. */
static int unflipped(pixels *p, const nano_op_settings *s) { return p->resize ? apply_all(p, s) : 0; }

static int crop(pixels *p, const nano_op *op, const nano_op_settings *s) {
    int top = op->a, left = op->b, height = op->c, width = op->d, h, w;
    current_size(p, &h, &w);
    if (!(top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= h && left + width <= w))
        return NANO_OPS_BAD; /* the draw sends crops reaching outside the image to the Python path */
    if (p->flip) /* the crop of the mirror is the mirror of the mirrored crop */
        left = w - left - width;
    if (p->resize) {
        int wt = p->window ? p->wt : 0, wl = p->window ? p->wl : 0;
        p->window = 1;
        p->wt = wt + top;
        p->wl = wl + left;
        p->wh = height;
        p->ww = width;
        return 0;
    }
    p->v.data += (ptrdiff_t)top * p->v.stride + (ptrdiff_t)left * p->v.channels;
    p->v.height = height;
    p->v.width = width;
    (void)s;
    return 0;
}

/* A kernel from the image as it is to a new image of its size and `out_channels` channels. */
typedef void (*kernel_fn)(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s);

static int run_kernel(pixels *p, kernel_fn fn, int out_channels, const nano_op *op, const nano_op_settings *s) {
    uint8_t *buf = new_image(p->v.width, p->v.height, out_channels);
    if (!buf)
        return NANO_OPS_NOMEM;
    fn(&p->v, buf, op, s);
    take(p, buf, p->v.width, p->v.height, out_channels);
    return 0;
}

static void k_brightness(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s) {
    nano_blend_const(src, dst, 0, (float)op->factor, s->isa);
}

static void k_contrast(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s) {
    /* ImageEnhance.Contrast's grey level: int(mean of convert("L") + 0.5), the sum exact, the division a
     * double's (as Python's int / int is, the sum being far below 2 ** 53) */
    uint64_t total = nano_gray_sum(src, s->grey_mode, s->isa);
    int mean = (int)((double)total / ((double)src->width * (double)src->height) + 0.5);
    nano_blend_const(src, dst, mean, (float)op->factor, s->isa);
}

static void k_saturation(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s) {
    nano_blend_gray(src, dst, (float)op->factor, s->saturation_mode, s->isa);
}

static void k_hue(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s) {
    nano_hue_shift(src, dst, op->a & 255, s->isa);
}

static void k_grey(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s) {
    (void)op;
    nano_rgb_to_l(src, dst, s->grey_mode, s->isa);
}

static void k_lut(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s) {
    uint8_t tables[3 * 256];
    for (int c = 0; c < src->channels; c++)
        memcpy(tables + c * 256, op->table, 256);
    nano_lut(src, dst, tables, s->isa);
}

static void k_sharpness(const nano_view *src, uint8_t *dst, const nano_op *op, const nano_op_settings *s) {
    (void)s;
    nano_sharpness(src, dst, (float)op->factor);
}

static int grey(pixels *p, int channels, const nano_op *op, const nano_op_settings *s) {
    if (p->v.channels == 3) {
        int rc = run_kernel(p, k_grey, 1, op, s);
        if (rc)
            return rc;
    }
    if (channels == 3) { /* the grey plane three times */
        int w = p->v.width, h = p->v.height;
        uint8_t *buf = new_image(w, h, 3);
        if (!buf)
            return NANO_OPS_NOMEM;
        for (int y = 0; y < h; y++) {
            const uint8_t *row = p->v.data + (ptrdiff_t)y * p->v.stride;
            uint8_t *out = buf + (size_t)y * w * 3;
            for (int x = 0; x < w; x++)
                out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = row[x];
        }
        take(p, buf, w, h, 3);
    }
    return 0;
}

static int vflip(pixels *p, const nano_op_settings *s) {
    int rc = apply_all(p, s);
    if (rc)
        return rc;
    int w = p->v.width, h = p->v.height, ch = p->v.channels;
    uint8_t *buf = new_image(w, h, ch);
    if (!buf)
        return NANO_OPS_NOMEM;
    for (int y = 0; y < h; y++)
        memcpy(buf + (size_t)y * w * ch, p->v.data + (ptrdiff_t)(h - 1 - y) * p->v.stride, (size_t)w * ch);
    take(p, buf, w, h, ch);
    return 0;
}

static int run_op(pixels *p, const nano_op *op, const nano_op_settings *s) {
    int rc = 0;
    switch (op->code) {
    case NANO_OP_CROP:
        return crop(p, op, s);
    case NANO_OP_RESIZE:
        if (op->a <= 0 || op->b <= 0)
            return NANO_OPS_BAD;
        if (p->resize || p->flip) /* resize(flip(x)) need not equal flip(resize(x)) to the bit */
            rc = apply_all(p, s);
        p->resize = 1;
        p->rh = op->a;
        p->rw = op->b;
        p->rf = op->c;
        return rc;
    case NANO_OP_HFLIP:
        p->flip = !p->flip;
        return 0;
    case NANO_OP_VFLIP:
        return vflip(p, s);
    case NANO_OP_SHARPNESS: /* not per pixel: a pending flip is applied first */
        return (rc = apply_all(p, s)) ? rc : run_kernel(p, k_sharpness, p->v.channels, op, s);
    case NANO_OP_GREY:
        if (op->a != 1 && op->a != 3)
            return NANO_OPS_BAD;
        return (rc = unflipped(p, s)) ? rc : grey(p, op->a, op, s);
    default:
        break;
    }
    /* per-pixel operations: a pending flip waits through them */
    if ((rc = unflipped(p, s)))
        return rc;
    int ch = p->v.channels;
    switch (op->code) {
    case NANO_OP_BRIGHTNESS:
        return run_kernel(p, k_brightness, ch, op, s);
    case NANO_OP_CONTRAST:
        return run_kernel(p, k_contrast, ch, op, s);
    case NANO_OP_SATURATION: /* a grey image is its own saturation */
        return ch == 3 ? run_kernel(p, k_saturation, 3, op, s) : 0;
    case NANO_OP_HUE: /* stock returns a grey image unchanged */
        return ch == 3 ? run_kernel(p, k_hue, 3, op, s) : 0;
    case NANO_OP_LUT:
        return run_kernel(p, k_lut, ch, op, s);
    default:
        return NANO_OPS_BAD;
    }
}

int nano_run_ops(const nano_view *src, const nano_op *ops, int n_ops, const nano_tail *tail,
                 const nano_op_settings *s) {
    pixels p;
    memset(&p, 0, sizeof(p));
    p.v = *src;
    int rc = 0;
    for (int i = 0; i < n_ops && !rc; i++)
        rc = run_op(&p, &ops[i], s);
    if (!rc)
        rc = apply_all(&p, s);
    if (!rc && (p.v.width != tail->width || p.v.height != tail->height || p.v.channels != tail->channels))
        rc = NANO_OPS_SIZE; /* not what the draw worked out: the caller redoes the batch */
    if (!rc) {
        const nano_view *v = &p.v;
        switch (tail->kind) {
        case NANO_TAIL_BYTES: /* PILToTensor: H x W x C, as it is */
            for (int y = 0; y < v->height; y++)
                memcpy((uint8_t *)tail->dst + (size_t)y * v->width * v->channels, v->data + (ptrdiff_t)y * v->stride,
                       (size_t)v->width * v->channels);
            break;
        case NANO_TAIL_PLANES_F32:
            nano_planes_lut_f32(v, (const float *)tail->table, (float *)tail->dst, tail->table_rows);
            break;
        case NANO_TAIL_PLANES_F64:
            nano_planes_lut_f64(v, (const double *)tail->table, (double *)tail->dst, tail->table_rows);
            break;
        case NANO_TAIL_PIXELS_F32:
            nano_pixels_lut_f32(v, (const float *)tail->table, (float *)tail->dst);
            break;
        case NANO_TAIL_PIXELS_F64:
            nano_pixels_lut_f64(v, (const double *)tail->table, (double *)tail->dst);
            break;
        default:
            rc = NANO_OPS_BAD;
        }
    }
    free(p.own);
    return rc;
}
