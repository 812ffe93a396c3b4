/* nano_patch.vision._jpeg: decode only a window of a JPEG, with the pixels the full decode gives.
 *
 * A separate extension from _native because it links the system's libjpeg-turbo: where that is
 * missing (at build or at run time) only crop decoding is lost, never the other kernels.
 *
 * libjpeg-turbo decodes a band of columns (jpeg_crop_scanline) and starts at a given row
 * (jpeg_skip_scanlines). Its fancy chroma upsampling treats the edges of the band as image edges,
 * so the band's edge pixels may differ from the full decode. We therefore decode NANO_JPEG_MARGIN
 * extra pixels on every side (where the image has them) and hand back offsets that leave them out.
 * The settings are those of simplejpeg's and PIL's decode: islow integer DCT, fancy upsampling,
 * RGB out. The Python side (native_checks.py) compares the result with the full decode before first use.
 *
 * Strict: every libjpeg error and every warning (corrupt data, premature end, extraneous bytes)
 * fails the call, so damaged files go to the caller's full decode and its rules. By default the
 * rows below the window are entropy-decoded to the end of the image as well, so that the call
 * fails exactly where the strict full decode would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t declared first */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jpeg_file.h"

#include <jpeglib.h>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#define NANO_HAVE_DLADDR 1
#endif

/* jpeg_skip_scanlines and jpeg_crop_scanline are libjpeg-turbo's; before 2.0 they hung or
 * misdecoded on some files, which a pixel check cannot always catch. */
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2000000
#error "nano-patch's crop decode needs the libjpeg-turbo >= 2.0 headers (jpeglib.h of IJG libjpeg lacks it)"
#endif
#if !defined(MEM_SRCDST_SUPPORTED) && JPEG_LIB_VERSION < 80
#error "nano-patch's crop decode needs libjpeg-turbo built with jpeg_mem_src"
#endif

/* Extra pixels decoded on each side of the window. 1 suffices for the 1-sample reach of libjpeg's
 * fancy upsampling; a build with 0 is what the tests use to see the check refuse a wrong kernel. */
#ifndef NANO_JPEG_MARGIN
#define NANO_JPEG_MARGIN 1
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

enum { OK = 0, FAIL_LIBJPEG, FAIL_REFUSED, FAIL_WINDOW, FAIL_PYTHON };

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} strict_errors;

typedef struct {
    struct jpeg_decompress_struct cinfo; /* zeroed: jpeg_destroy_decompress is safe at any point */
    strict_errors err;
    /* the request */
    const unsigned char *data;
    unsigned long size;
    long long top, left, height, width;
    long long expect_h, expect_w; /* where > 0: the size the header must give (checked before anything is set up) */
    int check_rest, allow_multiscan;
    /* what is decoded: image rows y0..y1-1, columns x0..x0+out_w-1, into `pixels` (out_w * 3 a row) */
    JDIMENSION x0, y0, y1, out_w;
    unsigned char *pixels;
    char why[240];
} region_job;

static void strict_exit(j_common_ptr cinfo) {
    strict_errors *err = (strict_errors *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

/* Level -1 is a warning: libjpeg would go on with made-up data. Levels >= 0 are trace output. */
static void strict_message(j_common_ptr cinfo, int msg_level) {
    if (msg_level < 0)
        strict_exit(cinfo);
}

static void no_output(j_common_ptr cinfo) { (void)cinfo; }

/* The luma sampling factors (chroma 1x1) the check at load covers: 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1. */
static int covered_sampling(const struct jpeg_decompress_struct *c) {
    const jpeg_component_info *comp = c->comp_info;
    if (c->num_components == 1)
        return comp[0].h_samp_factor == 1 && comp[0].v_samp_factor == 1;
    if (c->num_components != 3)
        return 0;
    for (int i = 1; i < 3; i++)
        if (comp[i].h_samp_factor != 1 || comp[i].v_samp_factor != 1)
            return 0;
    int h = comp[0].h_samp_factor, v = comp[0].v_samp_factor;
    return (h == 1 && v == 1) || (h == 2 && v == 1) || (h == 2 && v == 2) || (h == 1 && v == 2) ||
           (h == 4 && v == 1);
}

/* Read the header, refuse what the check does not cover, validate the window, start the decode and
 * set up the column band. No Python calls: runs without the GIL. */
static int open_region(region_job *j) {
    struct jpeg_decompress_struct *c = &j->cinfo;
    c->err = jpeg_std_error(&j->err.pub);
    j->err.pub.error_exit = strict_exit;
    j->err.pub.emit_message = strict_message;
    j->err.pub.output_message = no_output;
    if (setjmp(j->err.escape))
        return FAIL_LIBJPEG;
    /* also checks that the library loaded at run time has this header's struct layout */
    jpeg_create_decompress(c);
    jpeg_mem_src(c, j->data, j->size);
    if (jpeg_read_header(c, TRUE) != JPEG_HEADER_OK) {
        snprintf(j->why, sizeof(j->why), "no image in this JPEG data stream");
        return FAIL_REFUSED;
    }
    if (j->expect_h > 0 && ((long long)c->image_height != j->expect_h || (long long)c->image_width != j->expect_w)) {
        /* before jpeg_start_decompress: a file grown since its draw allocates nothing for its new size */
        snprintf(j->why, sizeof(j->why), "the file is %u x %u, not the %lld x %lld its draw used",
                 (unsigned)c->image_height, (unsigned)c->image_width, j->expect_h, j->expect_w);
        return FAIL_REFUSED;
    }
    if (c->jpeg_color_space != JCS_YCbCr && c->jpeg_color_space != JCS_GRAYSCALE) {
        static const char *names[] = {"unknown", "grayscale", "RGB", "YCbCr", "CMYK", "YCCK"};
        int cs = (int)c->jpeg_color_space;
        snprintf(j->why, sizeof(j->why), "%s JPEG: only YCbCr and grayscale files are region-decoded",
                 cs >= 0 && cs < 6 ? names[cs] : "unusual colour space");
        return FAIL_REFUSED;
    }
    if (c->data_precision != 8 || c->arith_code || !covered_sampling(c)) {
        snprintf(j->why, sizeof(j->why), "%s: not region-decoded (outside what the check at load covers)",
                 c->data_precision != 8 ? "not an 8-bit JPEG"
                 : c->arith_code        ? "arithmetic-coded JPEG"
                                        : "unusual chroma sampling");
        return FAIL_REFUSED;
    }
    /* Progressive files, and sequential ones whose first scan leaves components out, are decoded from a
     * whole-image coefficient buffer: a different path, which the check may have refused. */
    if (!j->allow_multiscan && (c->progressive_mode || c->comps_in_scan < c->num_components)) {
        snprintf(j->why, sizeof(j->why), "%s JPEG: not region-decoded here (the check at load refused them)",
                 c->progressive_mode ? "progressive" : "multi-scan");
        return FAIL_REFUSED;
    }
    long long H = c->image_height, W = c->image_width;
    if (j->height <= 0 || j->width <= 0) {
        snprintf(j->why, sizeof(j->why), "the window must have a positive size, got %lld x %lld", j->height,
                 j->width);
        return FAIL_WINDOW;
    }
    if (j->top < 0 || j->left < 0 || j->top > H - j->height || j->left > W - j->width) {
        snprintf(j->why, sizeof(j->why),
                 "the window (top %lld, left %lld, %lld x %lld) is not inside the %lld x %lld image", j->top,
                 j->left, j->height, j->width, H, W);
        return FAIL_WINDOW;
    }
    c->out_color_space = JCS_EXT_RGB; /* a grey file comes out with its value in all three channels */
    c->dct_method = JDCT_ISLOW;
    c->do_fancy_upsampling = TRUE;
    c->do_block_smoothing = TRUE; /* libjpeg's default, which simplejpeg and PIL keep */
    c->quantize_colors = FALSE;
    c->scale_num = c->scale_denom = 1;
    c->buffered_image = FALSE;
    jpeg_start_decompress(c);
    if (c->output_components != 3 || (long long)c->output_width != W || (long long)c->output_height != H) {
        snprintf(j->why, sizeof(j->why), "libjpeg set up an unexpected output (%d components, %u x %u)",
                 c->output_components, (unsigned)c->output_height, (unsigned)c->output_width);
        return FAIL_REFUSED;
    }
    long long m = NANO_JPEG_MARGIN;
    JDIMENSION x_lo = (JDIMENSION)(j->left > m ? j->left - m : 0);
    JDIMENSION x_hi = (JDIMENSION)(j->left + j->width + m < W ? j->left + j->width + m : W);
    j->y0 = (JDIMENSION)(j->top > m ? j->top - m : 0);
    j->y1 = (JDIMENSION)(j->top + j->height + m < H ? j->top + j->height + m : H);
    /* A band one chroma sample wide comes out wrong with 4:2:0 (libjpeg's h2v2 fancy upsampling of a
     * single sample), even where the margin reaches the image edge: make every band at least one iMCU
     * wide, which costs nothing, as libjpeg decodes whole iMCU columns anyway. */
    JDIMENSION min_band = (JDIMENSION)(c->max_h_samp_factor * DCTSIZE);
    if (x_hi - x_lo < min_band) {
        x_hi = x_lo + min_band < (JDIMENSION)W ? x_lo + min_band : (JDIMENSION)W;
        x_lo = x_hi > min_band ? x_hi - min_band : 0;
    }
    j->x0 = 0;
    j->out_w = (JDIMENSION)W;
    if (x_lo > 0 || x_hi < (JDIMENSION)W) {
        /* libjpeg moves the band's left edge down to an iMCU boundary and widens it to match */
        JDIMENSION xoff = x_lo, width = x_hi - x_lo;
        jpeg_crop_scanline(c, &xoff, &width);
        j->x0 = xoff;
        j->out_w = c->output_width;
        if (xoff > x_lo || (long long)xoff + c->output_width < (long long)x_hi) {
            snprintf(j->why, sizeof(j->why), "libjpeg cropped columns %u..%u for %u..%u", (unsigned)xoff,
                     (unsigned)(xoff + c->output_width), (unsigned)x_lo, (unsigned)x_hi);
            return FAIL_REFUSED;
        }
    }
    return OK;
}

/* Decode rows y0..y1-1 of the band into j->pixels; then, with check_rest, entropy-decode the rest of the
 * image and read up to its end-of-image marker. Runs without the GIL. */
static int read_region(region_job *j) {
    struct jpeg_decompress_struct *c = &j->cinfo;
    if (setjmp(j->err.escape))
        return FAIL_LIBJPEG;
    size_t stride = (size_t)j->out_w * 3;
    JDIMENSION rows = j->y1 - j->y0;
    /* row pointers from libjpeg's own pool: freed with the decompressor on every path */
    JSAMPARRAY ptrs = (JSAMPARRAY)(*c->mem->alloc_small)((j_common_ptr)c, JPOOL_IMAGE, rows * sizeof(JSAMPROW));
    for (JDIMENSION i = 0; i < rows; i++)
        ptrs[i] = j->pixels + i * stride;
    if (j->y0 > 0)
        jpeg_skip_scanlines(c, j->y0);
    if (c->output_scanline != j->y0) {
        snprintf(j->why, sizeof(j->why), "libjpeg skipped to row %u, not %u", (unsigned)c->output_scanline,
                 (unsigned)j->y0);
        return FAIL_REFUSED;
    }
    while (c->output_scanline < j->y1) {
        JDIMENSION done = c->output_scanline - j->y0;
        /* a whole batch at once: libjpeg then upsamples straight into our rows, no spare-row copy */
        if (jpeg_read_scanlines(c, ptrs + done, rows - done) == 0) {
            snprintf(j->why, sizeof(j->why), "libjpeg returned no rows at row %u", (unsigned)c->output_scanline);
            return FAIL_REFUSED;
        }
    }
    if (!j->check_rest) {
        jpeg_abort_decompress(c);
        return OK;
    }
    JDIMENSION height = c->output_height;
    if (c->output_scanline < height) {
        /* Skip all but the last row: skipping whole iMCU rows entropy-decodes them (for a single-scan
         * file) without the IDCT. The last row is read rather than skipped, because a skip to the end
         * marks the input finished without reading it, and the end-of-image marker would go unchecked. */
        if (height - c->output_scanline > 1)
            jpeg_skip_scanlines(c, height - c->output_scanline - 1);
        JSAMPROW spare = (JSAMPROW)(*c->mem->alloc_small)((j_common_ptr)c, JPOOL_IMAGE, stride);
        while (c->output_scanline < height)
            if (jpeg_read_scanlines(c, &spare, 1) == 0) {
                snprintf(j->why, sizeof(j->why), "libjpeg returned no rows at row %u", (unsigned)c->output_scanline);
                return FAIL_REFUSED;
            }
    }
    jpeg_finish_decompress(c);
    return OK;
}

static PyObject *region_error; /* _jpeg.Error, a ValueError: this file cannot be region-decoded */

static PyObject *py_decode_region(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "top", "left", "height", "width", "check_rest", "allow_multiscan", NULL};
    Py_buffer data;
    region_job *j = PyMem_Calloc(1, sizeof(region_job));
    if (j == NULL)
        return PyErr_NoMemory();
    j->check_rest = 1;
    j->allow_multiscan = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*LLLL|pp:decode_region", kwlist, &data, &j->top, &j->left,
                                     &j->height, &j->width, &j->check_rest, &j->allow_multiscan)) {
        PyMem_Free(j);
        return NULL;
    }
    int rc;
    PyObject *out = NULL;
    if ((unsigned long long)data.len > ULONG_MAX) {
        snprintf(j->why, sizeof(j->why), "JPEG data too large");
        rc = FAIL_REFUSED;
    } else {
        j->data = (const unsigned char *)data.buf;
        j->size = (unsigned long)data.len;
        Py_BEGIN_ALLOW_THREADS
        rc = open_region(j);
        Py_END_ALLOW_THREADS
    }
    if (rc == OK) {
        size_t stride = (size_t)j->out_w * 3, rows = j->y1 - j->y0;
        if (rows && stride > (size_t)PY_SSIZE_T_MAX / rows) {
            PyErr_NoMemory();
            rc = FAIL_PYTHON;
        } else if ((out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(stride * rows))) == NULL) {
            rc = FAIL_PYTHON;
        } else {
            /* nobody else holds `out` yet, so writing into it without the GIL is safe */
            /* the function, not the macro: the macro is not in the stable ABI the wheels are built for */
            j->pixels = (unsigned char *)PyByteArray_AsString(out);
            Py_BEGIN_ALLOW_THREADS
            rc = read_region(j);
            Py_END_ALLOW_THREADS
        }
    }
    jpeg_destroy_decompress(&j->cinfo);
    PyBuffer_Release(&data);
    PyObject *result = NULL;
    if (rc == OK) {
        result = Py_BuildValue("(Nnnn)", out, (Py_ssize_t)j->out_w * 3, (Py_ssize_t)(j->top - j->y0),
                               (Py_ssize_t)(j->left - j->x0));
        out = NULL; /* stolen by "N" (even on failure) */
    } else if (rc == FAIL_LIBJPEG) {
        PyErr_Format(region_error, "libjpeg: %s", j->err.message);
    } else if (rc == FAIL_REFUSED) {
        PyErr_SetString(region_error, j->why);
    } else if (rc == FAIL_WINDOW) {
        PyErr_SetString(PyExc_ValueError, j->why);
    }
    Py_XDECREF(out); /* never hand back a partly decoded buffer */
    PyMem_Free(j);
    return result;
}

/* --- a file's window without the GIL (jpeg_file.h): read, checked as the Python path checks, decoded --- */

/* The whole file, read to its end as Python's f.read() reads it. 0, or -1 (errno's failure, or too large). */
static int read_file(const char *path, size_t max_bytes, unsigned char **out, size_t *out_len) {
    int fd;
    /* O_NONBLOCK: a FIFO (or a device) must not block here, without the GIL; it is not a regular file, and the
     * caller's own read then decides (for a regular file the flag changes nothing) */
    do
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (unsigned long long)st.st_size > max_bytes) {
        close(fd);
        return -1;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0; /* one spare byte: a file that grew is read on to its end */
    unsigned char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return -1;
    }
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes / 2) {
                free(buf);
                close(fd);
                return -1;
            }
            unsigned char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                close(fd);
                return -1;
            }
            buf = grown;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            free(buf);
            close(fd);
            return -1;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    *out = buf;
    *out_len = n;
    return 0;
}

/* decode.looks_truncated: no end-of-image marker after the first start-of-scan (searched from byte 2). */
static int looks_truncated(const unsigned char *d, size_t n) {
    size_t sos = 0;
    int found = 0;
    for (size_t i = 2; i + 1 < n; i++)
        if (d[i] == 0xFF && d[i + 1] == 0xDA) {
            sos = i;
            found = 1;
            break;
        }
    if (!found)
        return 1;
    for (size_t i = n - 1; i > sos; i--)
        if (d[i - 1] == 0xFF && d[i] == 0xD9)
            return 0; /* the last end-of-image marker is after it */
    return 1;
}

static int file_load(nano_jpeg_file *f) {
    f->data = f->pixels = NULL;
    f->window = NULL;
    f->size = 0;
    f->stride = 0;
    f->why[0] = 0;
    if (read_file(f->path, f->max_bytes, &f->data, &f->size) != 0)
        return NANO_JPEG_UNREAD;
    if (f->size < 2 || f->data[0] != 0xFF || f->data[1] != 0xD8) {
        snprintf(f->why, sizeof(f->why), "not a JPEG");
        return NANO_JPEG_REFUSED;
    }
    if (f->size > ULONG_MAX) {
        snprintf(f->why, sizeof(f->why), "JPEG data too large");
        return NANO_JPEG_REFUSED;
    }
    if (looks_truncated(f->data, f->size)) {
        snprintf(f->why, sizeof(f->why), "a truncated JPEG");
        return NANO_JPEG_REFUSED;
    }
    if (f->expect_h <= 0 || f->expect_w <= 0) {
        snprintf(f->why, sizeof(f->why), "no size to check the file against");
        return NANO_JPEG_REFUSED;
    }
    region_job *j = calloc(1, sizeof(region_job)); /* zeroed: jpeg_destroy_decompress is safe at any point */
    if (!j)
        return NANO_JPEG_NOMEM;
    j->data = f->data;
    j->size = (unsigned long)f->size;
    j->top = f->top;
    j->left = f->left;
    j->height = f->height;
    j->width = f->width;
    j->check_rest = f->check_rest;
    j->allow_multiscan = f->allow_multiscan;
    j->expect_h = f->expect_h; /* (checked positive above: the size is always compared) */
    j->expect_w = f->expect_w;
    int rc = open_region(j);
    int out = NANO_JPEG_REFUSED;
    if (rc == OK) {
        size_t stride = (size_t)j->out_w * 3, rows = j->y1 - j->y0;
        j->pixels = rows && stride > SIZE_MAX / rows ? NULL : malloc(rows && stride ? stride * rows : 1);
        if (!j->pixels) {
            out = NANO_JPEG_NOMEM;
        } else if ((rc = read_region(j)) == OK) {
            f->pixels = j->pixels;
            f->stride = (ptrdiff_t)stride;
            f->window = j->pixels + (size_t)(j->top - j->y0) * stride + (size_t)(j->left - j->x0) * 3;
            out = NANO_JPEG_OK;
        } else {
            free(j->pixels);
        }
    }
    if (out == NANO_JPEG_REFUSED) {
        if (rc == FAIL_LIBJPEG)
            snprintf(f->why, sizeof(f->why), "libjpeg: %s", j->err.message);
        else
            memcpy(f->why, j->why, sizeof(f->why));
    }
    jpeg_destroy_decompress(&j->cinfo);
    free(j);
    if (out == NANO_JPEG_OK) { /* the bytes are not needed any more */
        free(f->data);
        f->data = NULL;
        f->size = 0;
    }
    return out;
}

static void file_release(nano_jpeg_file *f) {
    free(f->data);
    free(f->pixels);
    f->data = f->pixels = NULL;
    f->window = NULL;
}

static const nano_jpeg_file_api file_api = {NANO_JPEG_FILE_ABI, file_load, file_release};

/* Where the libjpeg this module runs with was loaded from: another libjpeg already in the process can
 * shadow the system one, and the status line should say which one is checked. */
static PyObject *py_library(PyObject *self, PyObject *noargs) {
#ifdef NANO_HAVE_DLADDR
    Dl_info info;
    if (dladdr((void *)&jpeg_read_header, &info) && info.dli_fname)
        return PyUnicode_DecodeFSDefault(info.dli_fname);
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_region", (PyCFunction)(void (*)(void))py_decode_region, METH_VARARGS | METH_KEYWORDS,
     "decode_region(data, top, left, height, width, check_rest=True, allow_multiscan=True)\n"
     "-> (bytearray, row_stride, offset_y, offset_x)\n\n"
     "Decode the RGB window of height x width at (top, left) of a JPEG. The bytearray holds a slightly larger "
     "block (rows of row_stride bytes); the window starts offset_y rows and offset_x pixels into it. Raises "
     "Error (a ValueError) for data it cannot region-decode, ValueError for a window outside the image."},
    {"library", py_library, METH_NOARGS, "The file the libjpeg in use was loaded from, or None if unknown."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg",
                                    "Crop-region JPEG decoding with the system's libjpeg-turbo.", -1, methods};

static int add_file_api(PyObject *m) {
    PyObject *capsule = PyCapsule_New((void *)&file_api, NANO_JPEG_FILE_CAPSULE, NULL);
    if (capsule == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(m, "file_api", capsule);
    Py_DECREF(capsule);
    return rc;
}

PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    region_error = PyErr_NewExceptionWithDoc("nano_patch.vision._jpeg.Error",
                                             "This JPEG cannot be region-decoded: decode it whole.", PyExc_ValueError,
                                             NULL);
    if (region_error == NULL || PyModule_AddObjectRef(m, "Error", region_error) < 0 ||
        PyModule_AddStringConstant(m, "LIBJPEG_VERSION", "libjpeg-turbo " STR(LIBJPEG_TURBO_VERSION)) < 0 ||
        PyModule_AddIntConstant(m, "JPEG_LIB_VERSION", JPEG_LIB_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "MARGIN", NANO_JPEG_MARGIN) < 0 || add_file_api(m) < 0) {
        Py_CLEAR(region_error);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
