/* nano_patch.vision._native: the Python face of the kernels.
 *
 * Images come in through the buffer protocol (NumPy arrays, any row stride, packed pixels) and go
 * out into buffers the caller allocated. Arguments are checked here and the GIL is released while
 * a kernel runs; a sample's recorded ops (run_ops, run_ops_file) are parsed here too, and a batch of
 * samples runs in batch.c. The instruction set is chosen once from the CPU's features; ``set_isa``
 * narrows it (for tests and benchmarks). The Python side (native.py, native_checks.py) checks every
 * kernel against the installed PIL before it is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "jpeg_file.h"
#include "module.h"
#include "native.h"

/* Added to the module at its creation: torch's generator reproduced (torch_draws.c), the batch executor (batch.c) */
extern PyMethodDef nano_draws_methods[];
extern PyMethodDef nano_batch_methods[];
extern PyMethodDef nano_marker_methods[];
extern PyMethodDef nano_stat_methods[];
extern PyMethodDef nano_gather_methods[];

#if NANO_X86
#include <cpuid.h>
#endif

static int best_isa = NANO_ISA_GENERIC;
static int current_isa = NANO_ISA_GENERIC;
static const char *isa_names[] = {"generic", "avx2", "avx512"};

int nano_current_isa(void) { return current_isa; }

/* CPUID and XGETBV read directly rather than through __builtin_cpu_supports: that builtin needs the
 * compiler's runtime (libgcc, compiler-rt) to fill in __cpu_model, and some toolchains ship a stub there
 * (zig 0.17's, which the release wheels are built with, reports no feature at all). The tests are GCC's:
 * the CPU has the instructions, and the OS saves their registers (XCR0: SSE+AVX, then opmask+ZMM). */
static int detect_isa(void) {
#if NANO_X86
    unsigned int a, b, c, d, xcr0_lo, xcr0_hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX))
        return NANO_ISA_GENERIC;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 0x6) != 0x6 || __get_cpuid_max(0, NULL) < 7)
        return NANO_ISA_GENERIC;
    __cpuid_count(7, 0, a, b, c, d);
    if ((xcr0_lo & 0xe6) == 0xe6 && (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) &&
        (c & bit_AVX512VNNI))
        return NANO_ISA_AVX512;
    if (b & bit_AVX2)
        return NANO_ISA_AVX2;
#endif
    return NANO_ISA_GENERIC;
}

void nano_release_image(nano_image_arg *a) {
    if (a->held)
        PyBuffer_Release(&a->buf);
    a->held = 0;
}

/* An 8-bit H x W (channels 1) or H x W x C image with packed pixels; `contiguous`: rows packed too. */
int nano_get_image(PyObject *obj, const char *name, int writable, int contiguous, nano_image_arg *out) {
    memset(out, 0, sizeof(*out));
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &out->buf, flags) < 0)
        return -1;
    out->held = 1;
    Py_buffer *b = &out->buf;
    if (b->itemsize != 1 || (b->format && strcmp(b->format, "B") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be a uint8 array, got format %s", name, b->format ? b->format : "?");
        goto fail;
    }
    int channels;
    if (b->ndim == 2)
        channels = 1;
    else if (b->ndim == 3 && (b->shape[2] == 1 || b->shape[2] == 3))
        channels = (int)b->shape[2];
    else {
        PyErr_Format(PyExc_ValueError, "%s must be H x W or H x W x 3 (or x 1), got %d dimensions", name, b->ndim);
        goto fail;
    }
    if (b->shape[0] <= 0 || b->shape[1] <= 0 || b->shape[0] > INT32_MAX / 4 || b->shape[1] > INT32_MAX / 4 / channels) {
        PyErr_Format(PyExc_ValueError, "%s has an unsupported size", name);
        goto fail;
    }
    if (b->strides[b->ndim - 1] != 1 || (b->ndim == 3 && b->strides[1] != channels)) {
        PyErr_Format(PyExc_ValueError, "%s must have packed pixels (each row contiguous)", name);
        goto fail;
    }
    if (contiguous && b->strides[0] != b->shape[1] * channels) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous", name);
        goto fail;
    }
    out->v.data = (const uint8_t *)b->buf;
    out->v.stride = b->strides[0];
    out->v.height = (int)b->shape[0];
    out->v.width = (int)b->shape[1];
    out->v.channels = channels;
    return 0;
fail:
    nano_release_image(out);
    return -1;
}

static PyObject *py_resample(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    int filter, flip, order_rule, weights, full_w, full_h, x0, y0;
    float box[4];
    if (!PyArg_ParseTuple(args, "OOi(ffff)p(ii)(ii)(ii):resample", &src_obj, &dst_obj, &filter, &box[0], &box[1],
                          &box[2], &box[3], &flip, &order_rule, &weights, &full_w, &full_h, &x0, &y0))
        return NULL;
    nano_image_arg src, dst;
    if (nano_get_image(src_obj, "src", 0, 0, &src) < 0)
        return NULL;
    if (nano_get_image(dst_obj, "dst", 1, 0, &dst) < 0) {
        nano_release_image(&src);
        return NULL;
    }
    int rc;
    if (dst.v.channels != src.v.channels) {
        PyErr_SetString(PyExc_ValueError, "src and dst must have the same number of channels");
        rc = 1;
    } else {
        int isa = current_isa;
        Py_BEGIN_ALLOW_THREADS
        rc = nano_resample(&src.v, (uint8_t *)dst.v.data, dst.v.stride, full_w, full_h, x0, y0, dst.v.width,
                           dst.v.height, filter, box, flip, order_rule, weights, isa);
        Py_END_ALLOW_THREADS
        if (rc == -1)
            PyErr_NoMemory();
        else if (rc == -2)
            PyErr_Format(PyExc_ValueError, "unsupported resampling filter %d", filter);
        else if (rc)
            PyErr_SetString(PyExc_ValueError, "bad resample sizes, window or box");
    }
    nano_release_image(&src);
    nano_release_image(&dst);
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

/* src (RGB unless `gray_ok`) and a C-contiguous dst of `dst_channels` channels and src's size. */
static int src_dst(PyObject *src_obj, PyObject *dst_obj, int dst_channels, int gray_ok, nano_image_arg *src,
                   nano_image_arg *dst) {
    if (nano_get_image(src_obj, "src", 0, 0, src) < 0)
        return -1;
    if (!gray_ok && src->v.channels != 3) {
        PyErr_SetString(PyExc_ValueError, "src must be an RGB (H x W x 3) array");
        nano_release_image(src);
        return -1;
    }
    if (nano_get_image(dst_obj, "dst", 1, 1, dst) < 0) {
        nano_release_image(src);
        return -1;
    }
    int want = dst_channels ? dst_channels : src->v.channels;
    if (dst->v.width != src->v.width || dst->v.height != src->v.height || dst->v.channels != want) {
        PyErr_SetString(PyExc_ValueError, "dst has the wrong shape");
        nano_release_image(src);
        nano_release_image(dst);
        return -1;
    }
    return 0;
}

static PyObject *py_rgb_to_l(PyObject *self, PyObject *args) {
    PyObject *s, *d;
    int mode;
    if (!PyArg_ParseTuple(args, "OOi:rgb_to_l", &s, &d, &mode))
        return NULL;
    nano_image_arg src, dst;
    if (src_dst(s, d, 1, 0, &src, &dst) < 0)
        return NULL;
    int isa = current_isa;
    Py_BEGIN_ALLOW_THREADS
    nano_rgb_to_l(&src.v, (uint8_t *)dst.v.data, mode, isa);
    Py_END_ALLOW_THREADS
    nano_release_image(&src);
    nano_release_image(&dst);
    Py_RETURN_NONE;
}

static PyObject *py_gray_sum(PyObject *self, PyObject *args) {
    PyObject *s;
    int mode;
    if (!PyArg_ParseTuple(args, "Oi:gray_sum", &s, &mode))
        return NULL;
    nano_image_arg src;
    if (nano_get_image(s, "src", 0, 0, &src) < 0)
        return NULL;
    uint64_t total;
    int isa = current_isa;
    Py_BEGIN_ALLOW_THREADS
    total = nano_gray_sum(&src.v, mode, isa);
    Py_END_ALLOW_THREADS
    nano_release_image(&src);
    return PyLong_FromUnsignedLongLong(total);
}

static PyObject *py_blend_gray(PyObject *self, PyObject *args) {
    PyObject *s, *d;
    float alpha;
    int mode;
    if (!PyArg_ParseTuple(args, "OOfi:blend_gray", &s, &d, &alpha, &mode))
        return NULL;
    nano_image_arg src, dst;
    if (src_dst(s, d, 3, 0, &src, &dst) < 0)
        return NULL;
    int isa = current_isa;
    Py_BEGIN_ALLOW_THREADS
    nano_blend_gray(&src.v, (uint8_t *)dst.v.data, alpha, mode, isa);
    Py_END_ALLOW_THREADS
    nano_release_image(&src);
    nano_release_image(&dst);
    Py_RETURN_NONE;
}

static PyObject *py_blend_const(PyObject *self, PyObject *args) {
    PyObject *s, *d;
    int in1;
    float alpha;
    if (!PyArg_ParseTuple(args, "OOif:blend_const", &s, &d, &in1, &alpha))
        return NULL;
    if (in1 < 0 || in1 > 255) {
        PyErr_SetString(PyExc_ValueError, "blend_const: the constant must be 0..255");
        return NULL;
    }
    nano_image_arg src, dst;
    if (src_dst(s, d, 0, 1, &src, &dst) < 0)
        return NULL;
    int isa = current_isa;
    Py_BEGIN_ALLOW_THREADS
    nano_blend_const(&src.v, (uint8_t *)dst.v.data, in1, alpha, isa);
    Py_END_ALLOW_THREADS
    nano_release_image(&src);
    nano_release_image(&dst);
    Py_RETURN_NONE;
}

static PyObject *py_sharpness(PyObject *self, PyObject *args) {
    PyObject *s, *d;
    float alpha;
    if (!PyArg_ParseTuple(args, "OOf:sharpness", &s, &d, &alpha))
        return NULL;
    nano_image_arg src, dst;
    if (src_dst(s, d, 0, 1, &src, &dst) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    nano_sharpness(&src.v, (uint8_t *)dst.v.data, alpha);
    Py_END_ALLOW_THREADS
    nano_release_image(&src);
    nano_release_image(&dst);
    Py_RETURN_NONE;
}

static PyObject *py_lut(PyObject *self, PyObject *args) {
    PyObject *s, *d;
    Py_buffer tables;
    if (!PyArg_ParseTuple(args, "OOy*:lut", &s, &d, &tables))
        return NULL;
    nano_image_arg src, dst;
    if (src_dst(s, d, 0, 1, &src, &dst) < 0) {
        PyBuffer_Release(&tables);
        return NULL;
    }
    if (tables.len != 256 * src.v.channels) {
        PyErr_SetString(PyExc_ValueError, "tables must hold 256 bytes per channel");
        nano_release_image(&src);
        nano_release_image(&dst);
        PyBuffer_Release(&tables);
        return NULL;
    }
    int isa = current_isa;
    Py_BEGIN_ALLOW_THREADS
    nano_lut(&src.v, (uint8_t *)dst.v.data, (const uint8_t *)tables.buf, isa);
    Py_END_ALLOW_THREADS
    nano_release_image(&src);
    nano_release_image(&dst);
    PyBuffer_Release(&tables);
    Py_RETURN_NONE;
}

static PyObject *py_hue_shift(PyObject *self, PyObject *args) {
    PyObject *s, *d;
    int shift;
    if (!PyArg_ParseTuple(args, "OOi:hue_shift", &s, &d, &shift))
        return NULL;
    nano_image_arg src, dst;
    if (src_dst(s, d, 3, 0, &src, &dst) < 0)
        return NULL;
    int isa = current_isa;
    Py_BEGIN_ALLOW_THREADS
    nano_hue_shift(&src.v, (uint8_t *)dst.v.data, shift & 255, isa);
    Py_END_ALLOW_THREADS
    nano_release_image(&src);
    nano_release_image(&dst);
    Py_RETURN_NONE;
}

/* warp(src, dst, coeffs, perspective, filter, fill) -> bool: PIL's Image.transform of src into dst
 * (its size is the output's), coeffs 8 doubles (an affine map's last two unused), fill one byte per
 * channel. False where PIL's own result is undefined in C: the caller runs PIL's code. */
static PyObject *py_warp(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    double a[8];
    int perspective, filter;
    const char *fill;
    Py_ssize_t fill_len;
    if (!PyArg_ParseTuple(args, "OO(dddddddd)piy#:warp", &src_obj, &dst_obj, &a[0], &a[1], &a[2], &a[3], &a[4],
                          &a[5], &a[6], &a[7], &perspective, &filter, &fill, &fill_len))
        return NULL;
    nano_image_arg src, dst;
    if (nano_get_image(src_obj, "src", 0, 0, &src) < 0)
        return NULL;
    if (nano_get_image(dst_obj, "dst", 1, 0, &dst) < 0) {
        nano_release_image(&src);
        return NULL;
    }
    int rc;
    if (dst.v.channels != src.v.channels || fill_len != src.v.channels) {
        PyErr_SetString(PyExc_ValueError, "src, dst and fill must have the same number of channels");
        rc = 1;
    } else {
        int isa = current_isa;
        Py_BEGIN_ALLOW_THREADS
        rc = nano_warp(&src.v, (uint8_t *)dst.v.data, dst.v.stride, dst.v.width, dst.v.height, a, perspective, filter,
                       (const uint8_t *)fill, isa);
        Py_END_ALLOW_THREADS
        if (rc == -1)
            PyErr_NoMemory();
        else if (rc == -2)
            PyErr_Format(PyExc_ValueError, "unsupported transform filter %d", filter);
        else if (rc && rc != NANO_WARP_UNDEFINED)
            PyErr_SetString(PyExc_ValueError, "bad warp sizes");
    }
    nano_release_image(&src);
    nano_release_image(&dst);
    if (rc == NANO_WARP_UNDEFINED)
        Py_RETURN_FALSE;
    if (rc)
        return NULL;
    Py_RETURN_TRUE;
}

/* The uint8 image through one float table per channel, into dst: C x H x W (``planar``, what
 * ToTensor gives) or H x W x C. tables: C x 256 float32 or float64, C-contiguous; dst of its type. */
static PyObject *float_tables(PyObject *args, int planar) {
    PyObject *s, *t, *d;
    if (!PyArg_ParseTuple(args, planar ? "OOO:planes_lut" : "OOO:pixels_lut", &s, &t, &d))
        return NULL;
    nano_image_arg src;
    Py_buffer tb, db;
    if (nano_get_image(s, "src", 0, 0, &src) < 0)
        return NULL;
    if (PyObject_GetBuffer(t, &tb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        nano_release_image(&src);
        return NULL;
    }
    if (PyObject_GetBuffer(d, &db, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&tb);
        nano_release_image(&src);
        return NULL;
    }
    int ok = tb.ndim == 2 && tb.shape[1] == 256 && tb.itemsize == db.itemsize && tb.format && db.format &&
             strcmp(tb.format, db.format) == 0 && (strcmp(tb.format, "f") == 0 || strcmp(tb.format, "d") == 0);
    if (planar) /* one grey plane may broadcast to several table rows, as stock's Normalize does */
        ok = ok && db.ndim == 3 && db.shape[0] == tb.shape[0] && db.shape[1] == src.v.height &&
             db.shape[2] == src.v.width && (src.v.channels == 1 || tb.shape[0] == src.v.channels);
    else
        ok = ok && tb.shape[0] == src.v.channels &&
             db.len == (Py_ssize_t)src.v.width * src.v.height * src.v.channels * tb.itemsize;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: tables must be C x 256 and dst %s, of one float type",
                     planar ? "planes_lut" : "pixels_lut", planar ? "C x H x W" : "H x W x C");
    } else {
        int out_c = (int)tb.shape[0], is_f32 = strcmp(tb.format, "f") == 0;
        Py_BEGIN_ALLOW_THREADS
        if (planar && is_f32)
            nano_planes_lut_f32(&src.v, (const float *)tb.buf, (float *)db.buf, out_c);
        else if (planar)
            nano_planes_lut_f64(&src.v, (const double *)tb.buf, (double *)db.buf, out_c);
        else if (is_f32)
            nano_pixels_lut_f32(&src.v, (const float *)tb.buf, (float *)db.buf);
        else
            nano_pixels_lut_f64(&src.v, (const double *)tb.buf, (double *)db.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&tb);
    PyBuffer_Release(&db);
    nano_release_image(&src);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_planes_lut(PyObject *self, PyObject *args) { return float_tables(args, 1); }

static PyObject *py_pixels_lut(PyObject *self, PyObject *args) { return float_tables(args, 0); }

void nano_op_run_release(nano_op_run *r) {
    if (r->have_table)
        PyBuffer_Release(&r->tb);
    if (r->have_dst)
        PyBuffer_Release(&r->db);
    PyMem_Free(r->ops);
    r->ops = NULL;
    r->have_table = r->have_dst = 0;
}

/* An int field of an op record (which must fit an int). */
static int op_int(PyObject *item, int *out) {
    long v = PyLong_AsLong(item);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "run_ops: an op's parameter does not fit an int");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* One op record, (code, a, b, c, d, factor, table), read field by field: PyArg_ParseTuple's format parse cost
 * more than the rest of a sample's call with the GIL held. 0, or -1 with an exception set. */
int nano_parse_op(PyObject *record, nano_op *op, PyObject **table) {
    if (record == NULL || !PyTuple_Check(record) || PyTuple_Size(record) != 7) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "run_ops: an op must be a tuple (code, a, b, c, d, factor, table)");
        return -1;
    }
    int *fields[5] = {&op->code, &op->a, &op->b, &op->c, &op->d};
    for (int k = 0; k < 5; k++)
        if (op_int(PyTuple_GetItem(record, k), fields[k]) < 0)
            return -1;
    op->factor = PyFloat_AsDouble(PyTuple_GetItem(record, 5));
    if (op->factor == -1.0 && PyErr_Occurred())
        return -1;
    *table = PyTuple_GetItem(record, 6);
    return 0;
}

/* ops[skip:] of `ops_obj`, and the tail; 0, or -1 with an exception set (r released). `batch_dst`: the batch's
 * buffer, which holds every sample's slot (dst_obj is then not taken: only its format is checked here, and the
 * slots' places by the caller). */
int nano_op_run_parse(nano_op_run *r, PyObject *ops_obj, Py_ssize_t skip, PyObject *table_obj, PyObject *dst_obj,
                        const Py_buffer *batch_dst, const Py_buffer *batch_table) {
    Py_ssize_t n = PyTuple_Size(ops_obj) - skip;
    if (n < 0 || n > 4096) {
        PyErr_SetString(PyExc_ValueError, "run_ops: too many ops");
        return -1;
    }
    r->n_ops = (int)n;
    r->ops = PyMem_Calloc(n ? (size_t)n : 1, sizeof(nano_op));
    if (!r->ops) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        nano_op *op = &r->ops[i];
        PyObject *table = NULL;
        if (nano_parse_op(PyTuple_GetItem(ops_obj, i + skip), op, &table) < 0)
            goto fail;
        if (op->code == NANO_OP_LUT) {
            char *bytes;
            Py_ssize_t len;
            if (PyBytes_AsStringAndSize(table, &bytes, &len) < 0 || len != 256) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "run_ops: a table op needs 256 bytes");
                goto fail;
            }
            memcpy(op->table, bytes, 256);
        }
    }
    nano_tail *tail = &r->tail;
    const Py_buffer *db = batch_dst;
    if (db == NULL) {
        if (PyObject_GetBuffer(dst_obj, &r->db, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
            goto fail;
        r->have_dst = 1;
        db = &r->db;
    }
    Py_ssize_t item = tail->kind == NANO_TAIL_BYTES ? 1
                      : (tail->kind == NANO_TAIL_PLANES_F32 || tail->kind == NANO_TAIL_PIXELS_F32) ? 4 : 8;
    const char *want_format = item == 1 ? "B" : item == 4 ? "f" : "d";
    int ok = tail->kind >= NANO_TAIL_BYTES && tail->kind <= NANO_TAIL_PIXELS_F64 && tail->width > 0 &&
             tail->height > 0 && (tail->channels == 1 || tail->channels == 3) && db->itemsize == item &&
             db->format && strcmp(db->format, want_format) == 0;
    Py_ssize_t rows = 1;
    if (ok && tail->kind != NANO_TAIL_BYTES) {
        const Py_buffer *tb = batch_table;
        if (tb == NULL) { /* (a batch's later samples share its first sample's table, held by the batch) */
            if (PyObject_GetBuffer(table_obj, &r->tb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
                goto fail;
            r->have_table = 1;
            tb = &r->tb;
        }
        ok = tb->ndim == 2 && tb->shape[1] == 256 && tb->itemsize == item && tb->format &&
             strcmp(tb->format, want_format) == 0;
        rows = ok ? tb->shape[0] : 0;
        /* planes: one grey plane may broadcast to several rows (stock's Normalize); pixels: a row per channel */
        ok = ok && (tail->kind == NANO_TAIL_PLANES_F32 || tail->kind == NANO_TAIL_PLANES_F64
                        ? (rows == tail->channels || (tail->channels == 1 && rows >= 1 && rows <= 3))
                        : rows == tail->channels);
        tail->table = tb->buf;
        tail->table_rows = (int)rows;
    } else {
        rows = tail->channels;
    }
    r->slot_bytes = (Py_ssize_t)tail->width * tail->height * rows * item;
    ok = ok && (batch_dst ? db->len >= r->slot_bytes : db->len == r->slot_bytes);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "run_ops: the tail's kind, table and dst do not agree");
        goto fail;
    }
    tail->dst = db->buf;
    r->s.isa = current_isa;
    return 0;
fail:
    nano_op_run_release(r);
    return -1;
}

/* nano_run_ops' failure as an exception (0: none). */
int nano_op_run_error(int rc) {
    if (rc == NANO_OPS_NOMEM)
        PyErr_NoMemory();
    else if (rc == NANO_OPS_SIZE)
        PyErr_SetString(PyExc_ValueError, "run_ops: the ops end in another size than the tail's");
    else if (rc)
        PyErr_SetString(PyExc_ValueError, "run_ops: an op with bad parameters");
    return rc;
}

/* run_ops(src, ops, kind, table, dst, (height, width, channels), (order_rule, weights, grey_mode, saturation_mode)):
 * a sample's recorded ops on src, then its tail into dst, with the GIL released once (oplist.c). */
static PyObject *py_run_ops(PyObject *self, PyObject *args) {
    PyObject *src_obj, *ops_obj, *table_obj, *dst_obj;
    nano_op_run r;
    memset(&r, 0, sizeof(r));
    if (!PyArg_ParseTuple(args, "OO!iOO(iii)(iiii):run_ops", &src_obj, &PyTuple_Type, &ops_obj, &r.tail.kind,
                          &table_obj, &dst_obj, &r.tail.height, &r.tail.width, &r.tail.channels, &r.s.order_rule,
                          &r.s.weights, &r.s.grey_mode, &r.s.saturation_mode))
        return NULL;
    nano_image_arg src;
    if (nano_get_image(src_obj, "src", 0, 0, &src) < 0)
        return NULL;
    if (nano_op_run_parse(&r, ops_obj, 0, table_obj, dst_obj, NULL, NULL) < 0) {
        nano_release_image(&src);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = nano_run_ops(&src.v, r.ops, r.n_ops, &r.tail, &r.s);
    Py_END_ALLOW_THREADS
    nano_op_run_error(rc);
    nano_op_run_release(&r);
    nano_release_image(&src);
    if (rc)
        return NULL;
    Py_RETURN_NONE;
}

/* run_ops_file(file_api, path, (expect_h, expect_w), (check_rest, allow_multiscan), max_bytes, ops, kind, table, dst,
 * (h, w, c), settings): the sample's file read, checked and decoded by _jpeg's file_api (jpeg_file.h), then its ops
 * and tail as run_ops runs them, all with the GIL released once. ops[0] is a crop, the window decoded (its other
 * ops run on that window); for the whole image, pass a crop of all of it. Returns True (dst written); the file's
 * bytes where they were read but left to the caller (another size, truncated, damaged, not region-decoded here);
 * False where the file could not be read (the caller's read meets the error). */
static PyObject *py_run_ops_file(PyObject *self, PyObject *args) {
    PyObject *api_obj, *path_obj, *ops_obj, *table_obj, *dst_obj;
    nano_jpeg_file f;
    nano_op_run r;
    memset(&f, 0, sizeof(f));
    memset(&r, 0, sizeof(r));
    unsigned long long max_bytes;
    if (!PyArg_ParseTuple(args, "OO&(LL)(ii)KO!iOO(iii)(iiii):run_ops_file", &api_obj, PyUnicode_FSConverter,
                          &path_obj, &f.expect_h, &f.expect_w, &f.check_rest, &f.allow_multiscan, &max_bytes,
                          &PyTuple_Type, &ops_obj, &r.tail.kind, &table_obj, &dst_obj, &r.tail.height,
                          &r.tail.width, &r.tail.channels, &r.s.order_rule, &r.s.weights, &r.s.grey_mode,
                          &r.s.saturation_mode))
        return NULL;
    f.max_bytes = max_bytes > SIZE_MAX ? SIZE_MAX : (size_t)max_bytes;
    const nano_jpeg_file_api *api = PyCapsule_GetPointer(api_obj, NANO_JPEG_FILE_CAPSULE);
    PyObject *window = PyTuple_Size(ops_obj) > 0 ? PyTuple_GetItem(ops_obj, 0) : NULL;
    int code = -1;
    double unused_factor;
    PyObject *unused_table;
    if (api == NULL || window == NULL ||
        !PyArg_ParseTuple(window, "iLLLL|dO:run_ops_file window", &code, &f.top, &f.left, &f.height, &f.width,
                          &unused_factor, &unused_table)) {
        Py_DECREF(path_obj);
        return NULL;
    }
    if (api->abi != NANO_JPEG_FILE_ABI || code != NANO_OP_CROP) {
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_ValueError, "run_ops_file: needs _jpeg's file_api of this build and a crop first");
        return NULL;
    }
    if (nano_op_run_parse(&r, ops_obj, 1, table_obj, dst_obj, NULL, NULL) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    f.path = PyBytes_AsString(path_obj);
    int loaded, rc = 0;
    Py_BEGIN_ALLOW_THREADS
    loaded = api->load(&f);
    if (loaded == NANO_JPEG_OK) {
        nano_view v = {f.window, f.stride, (int)f.width, (int)f.height, 3};
        rc = nano_run_ops(&v, r.ops, r.n_ops, &r.tail, &r.s);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    nano_op_run_release(&r);
    PyObject *result = NULL;
    if (loaded == NANO_JPEG_OK) {
        if (!nano_op_run_error(rc))
            result = Py_NewRef(Py_True);
    } else if (loaded == NANO_JPEG_REFUSED) {
        result = PyBytes_FromStringAndSize((const char *)f.data, (Py_ssize_t)f.size);
    } else if (loaded == NANO_JPEG_UNREAD) {
        result = Py_NewRef(Py_False);
    } else {
        PyErr_NoMemory();
    }
    api->release(&f);
    return result;
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(isa_names[current_isa]); }

static PyObject *py_best_isa(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(isa_names[best_isa]); }

static PyObject *py_set_isa(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s:set_isa", &name))
        return NULL;
    for (int i = 0; i <= best_isa; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            current_isa = i;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "instruction set '%s' is not available here: choose from 'generic' up to '%s'",
                 name, isa_names[best_isa]);
    return NULL;
}

static PyMethodDef methods[] = {
    {"resample", py_resample, METH_VARARGS,
     "resample(src, dst, filter, box, flip, (order_rule, weights), (full_w, full_h), (x0, y0)): the window of "
     "dst's size at (x0, y0) of PIL's convolution resize of src[box] to full_w x full_h."},
    {"rgb_to_l", py_rgb_to_l, METH_VARARGS, "rgb_to_l(src, dst, mode): PIL's convert('L') (mode 1: pillow-simd's)."},
    {"gray_sum", py_gray_sum, METH_VARARGS, "gray_sum(src, mode) -> int: the sum of PIL's L values."},
    {"blend_gray", py_blend_gray, METH_VARARGS,
     "blend_gray(src, dst, alpha, mode): ImageEnhance.Color(src).enhance(alpha)."},
    {"blend_const", py_blend_const, METH_VARARGS,
     "blend_const(src, dst, value, alpha): Image.blend(Image.new(mode, size, value), src, alpha)."},
    {"lut", py_lut, METH_VARARGS, "lut(src, dst, tables): one 256-byte table per channel."},
    {"sharpness", py_sharpness, METH_VARARGS,
     "sharpness(src, dst, alpha): ImageEnhance.Sharpness (PIL's SMOOTH filter, then Image.blend)."},
    {"hue_shift", py_hue_shift, METH_VARARGS, "hue_shift(src, dst, shift): PIL's HSV round trip with H + shift."},
    {"warp", py_warp, METH_VARARGS,
     "warp(src, dst, coeffs, perspective, filter, fill) -> bool: PIL's Image.transform (AFFINE or PERSPECTIVE) "
     "of src into dst; False where PIL's result is undefined (then run PIL's code)."},
    {"planes_lut", py_planes_lut, METH_VARARGS, "planes_lut(src, tables, dst): H x W x C uint8 -> C x H x W floats."},
    {"pixels_lut", py_pixels_lut, METH_VARARGS, "pixels_lut(src, tables, dst): H x W x C uint8 -> floats."},
    {"run_ops", py_run_ops, METH_VARARGS,
     "run_ops(src, ops, kind, table, dst, (h, w, c), settings): a sample's recorded ops, then its tail into dst, "
     "in one call with the GIL released (oplist.c)."},
    {"run_ops_file", py_run_ops_file, METH_VARARGS,
     "run_ops_file(file_api, path, (h, w), (check_rest, allow_multiscan), max_bytes, ops, kind, table, dst, shape, "
     "settings) -> True | bytes | False: the file's window (ops[0], a crop) decoded by _jpeg, then run_ops, with the "
     "GIL released once."},
    {"isa", py_isa, METH_NOARGS, "The instruction set the kernels use now."},
    {"best_isa", py_best_isa, METH_NOARGS, "The widest instruction set this CPU and build support."},
    {"set_isa", py_set_isa, METH_VARARGS, "set_isa(name): use 'generic', 'avx2', ... (at most best_isa())."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "nano-patch's native image kernels.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__native(void) {
    best_isa = current_isa = detect_isa();
    nano_hue_init();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddFunctions(m, nano_draws_methods) < 0 || PyModule_AddFunctions(m, nano_batch_methods) < 0 ||
              PyModule_AddFunctions(m, nano_marker_methods) < 0 || PyModule_AddFunctions(m, nano_stat_methods) < 0 ||
              PyModule_AddFunctions(m, nano_gather_methods) < 0))
        Py_CLEAR(m);
    return m;
}
