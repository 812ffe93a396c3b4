/* A batch of an array dataset's samples in one call (data/datasets/array_datasets.py, vision/plans/array_plan.py).
 *
 * CIFAR, SVHN, STL-10 and the MNIST family hold their images as one uint8 array. Their tutorials' transforms are
 * pads, crops and flips, then ToTensor and Normalize. Each of the first kind only chooses, for every output pixel,
 * which source pixel it copies, or the pad's fill: rows and columns apart (numpy's pad works one axis at a time,
 * PIL's crop and flips too). So a sample is its source image read through a row map and a column map (-1: the
 * fill), which the Python side composes from the steps and their draws; the tail is elementwise per channel, one
 * table entry per uint8 value (stock's own float results, as tensor.c's tables).
 *
 * gather_batch(src, samples, maps, th, tw, fill, table, out):
 *   src      uint8, N x H x W (one channel) or N x H x W x C, any strides (SVHN's and STL-10's transposed views)
 *   samples  int64 triples: the source image's index, its row map's offset, its column map's offset (into maps)
 *   maps     int32 source rows or columns, -1 for the fill
 *   th, tw   the output's height and width (each row map th long, each column map tw)
 *   fill     C bytes: the fill's value per source channel
 *   table    float32 or float64, R x 256: the tail's output channel r of uint8 value v (R: 1, or C, or 3 from one)
 *   out      B x R x th x tw of the table's type, contiguous
 * Every index is checked before the GIL is released; anything out of range raises ValueError, having written
 * nothing. */
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer src, samples, maps, fill, table, out;
    int held[6];
} gather_args;

static void release_all(gather_args *g) {
    Py_buffer *bufs[6] = {&g->src, &g->samples, &g->maps, &g->fill, &g->table, &g->out};
    for (int k = 0; k < 6; k++)
        if (g->held[k])
            PyBuffer_Release(bufs[k]);
}

static int take(PyObject *obj, Py_buffer *buf, int *held, int flags) {
    if (PyObject_GetBuffer(obj, buf, flags) < 0)
        return -1;
    *held = 1;
    return 0;
}

#define GATHER(NAME, T)                                                                                          \
    static void NAME(const gather_args *g, Py_ssize_t count, int channels, int rows_out, Py_ssize_t th,        \
                     Py_ssize_t tw) {                                                                          \
        const uint8_t *base = (const uint8_t *)g->src.buf;                                                     \
        const Py_ssize_t *st = g->src.strides;                                                                 \
        Py_ssize_t sc = g->src.ndim == 4 ? st[3] : 0;                                                          \
        const int64_t *smp = (const int64_t *)g->samples.buf;                                                  \
        const int32_t *maps = (const int32_t *)g->maps.buf;                                                    \
        const uint8_t *fill = (const uint8_t *)g->fill.buf;                                                    \
        const T *table = (const T *)g->table.buf;                                                              \
        T *out = (T *)g->out.buf;                                                                              \
        Py_ssize_t plane = th * tw;                                                                            \
        for (Py_ssize_t b = 0; b < count; b++) {                                                               \
            const uint8_t *img = base + smp[3 * b] * st[0];                                                    \
            const int32_t *rmap = maps + smp[3 * b + 1], *cmap = maps + smp[3 * b + 2];                        \
            T *o = out + b * rows_out * plane;                                                                 \
            for (int r = 0; r < rows_out; r++) {                                                               \
                int c = channels == 1 ? 0 : r;                                                                 \
                const T *t = table + (Py_ssize_t)r * 256;                                                      \
                T filled = t[fill[c]];                                                                         \
                T *oc = o + r * plane;                                                                         \
                for (Py_ssize_t y = 0; y < th; y++) {                                                          \
                    int32_t sy = rmap[y];                                                                      \
                    T *orow = oc + y * tw;                                                                     \
                    if (sy < 0) {                                                                              \
                        for (Py_ssize_t x = 0; x < tw; x++)                                                    \
                            orow[x] = filled;                                                                  \
                        continue;                                                                              \
                    }                                                                                          \
                    const uint8_t *srow = img + sy * st[1] + c * sc;                                           \
                    for (Py_ssize_t x = 0; x < tw; x++) {                                                      \
                        int32_t sx = cmap[x];                                                                  \
                        orow[x] = sx < 0 ? filled : t[srow[sx * st[2]]];                                       \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

GATHER(gather_f32, float)
GATHER(gather_f64, double)

static PyObject *py_gather_batch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *src, *samples, *maps, *fill, *table, *out;
    Py_ssize_t th, tw;
    if (!PyArg_ParseTuple(args, "OOOnnOOO:gather_batch", &src, &samples, &maps, &th, &tw, &fill, &table, &out))
        return NULL;
    gather_args g;
    memset(&g, 0, sizeof(g));
    if (take(src, &g.src, &g.held[0], PyBUF_STRIDES | PyBUF_FORMAT) < 0 ||
        take(samples, &g.samples, &g.held[1], PyBUF_C_CONTIGUOUS) < 0 ||
        take(maps, &g.maps, &g.held[2], PyBUF_C_CONTIGUOUS) < 0 ||
        take(fill, &g.fill, &g.held[3], PyBUF_C_CONTIGUOUS) < 0 ||
        take(table, &g.table, &g.held[4], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0 ||
        take(out, &g.out, &g.held[5], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        release_all(&g);
        return NULL;
    }
    const char *why = NULL;
    Py_buffer *s = &g.src;
    int channels = 0;
    if (s->itemsize != 1 || (s->format && strcmp(s->format, "B") != 0))
        why = "src must be a uint8 array";
    else if (s->ndim == 3)
        channels = 1;
    else if (s->ndim == 4 && s->shape[3] >= 1 && s->shape[3] <= 4)
        channels = (int)s->shape[3];
    else
        why = "src must be N x H x W or N x H x W x C (C at most 4)";
    const char *tf = g.table.format ? g.table.format : "B";
    int is_f32 = strcmp(tf, "f") == 0 && g.table.itemsize == 4, is_f64 = strcmp(tf, "d") == 0 && g.table.itemsize == 8;
    const char *of = g.out.format ? g.out.format : "B";
    Py_ssize_t rows_out = 0, count = 0;
    if (!why && !is_f32 && !is_f64)
        why = "table must be float32 or float64";
    if (!why && (strcmp(of, tf) != 0 || g.out.itemsize != g.table.itemsize))
        why = "out must have the table's type";
    if (!why) {
        rows_out = g.table.len / g.table.itemsize / 256;
        if (rows_out * 256 * g.table.itemsize != g.table.len || rows_out < 1 || rows_out > 4 ||
            (channels != 1 && rows_out != channels))
            why = "table must be R x 256, R the source's channels (or any R up to 4 from one channel)";
    }
    if (!why && g.fill.len != channels)
        why = "fill must hold one byte per source channel";
    if (!why && (g.samples.len % (3 * 8) != 0 || g.maps.len % 4 != 0 || th < 1 || tw < 1))
        why = "samples must be int64 triples, maps int32, th and tw positive";
    if (!why) {
        count = g.samples.len / 24;
        if (g.out.len != count * rows_out * th * tw * g.out.itemsize)
            why = "out must be B x R x th x tw";
    }
    if (!why) {
        const int64_t *smp = (const int64_t *)g.samples.buf;
        const int32_t *mp = (const int32_t *)g.maps.buf;
        Py_ssize_t nmaps = g.maps.len / 4;
        for (Py_ssize_t b = 0; b < count && !why; b++) {
            int64_t idx = smp[3 * b], ro = smp[3 * b + 1], co = smp[3 * b + 2];
            if (idx < 0 || idx >= s->shape[0] || ro < 0 || ro + th > nmaps || co < 0 || co + tw > nmaps) {
                why = "a sample's index or map offset is out of range";
                break;
            }
            for (Py_ssize_t y = 0; y < th; y++)
                if (mp[ro + y] < -1 || mp[ro + y] >= s->shape[1]) {
                    why = "a row map entry is out of range";
                    break;
                }
            for (Py_ssize_t x = 0; x < tw && !why; x++)
                if (mp[co + x] < -1 || mp[co + x] >= s->shape[2])
                    why = "a column map entry is out of range";
        }
    }
    if (why) {
        release_all(&g);
        PyErr_Format(PyExc_ValueError, "gather_batch: %s", why);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (is_f32)
        gather_f32(&g, count, channels, (int)rows_out, th, tw);
    else
        gather_f64(&g, count, channels, (int)rows_out, th, tw);
    Py_END_ALLOW_THREADS
    release_all(&g);
    Py_RETURN_NONE;
}

PyMethodDef nano_gather_methods[] = {
    {"gather_batch", py_gather_batch, METH_VARARGS,
     "gather_batch(src, samples, maps, th, tw, fill, table, out): an array dataset's batch through row and column "
     "maps and the tail's table."},
    {NULL, NULL, 0, NULL},
};
