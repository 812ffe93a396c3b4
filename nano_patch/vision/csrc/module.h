/* What module.c, the Python face of the kernels, shares with batch.c, the batch executor: image arguments taken
 * through the buffer protocol, a sample's recorded ops parsed from their Python records, and the instruction set
 * in use. Internal to the extension _native. */
#ifndef NANO_MODULE_H
#define NANO_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "native.h"

/* An image argument: its buffer, held until nano_release_image, and the view the kernels take. */
typedef struct {
    Py_buffer buf;
    nano_view v;
    int held;
} nano_image_arg;

/* An 8-bit H x W (channels 1) or H x W x C image with packed pixels; `contiguous`: rows packed too. 0, or -1 with an
 * exception set. */
int nano_get_image(PyObject *obj, const char *name, int writable, int contiguous, nano_image_arg *out);
void nano_release_image(nano_image_arg *a);

/* A sample's ops and tail, parsed from run_ops' arguments: ops, a tuple of (code, a, b, c, d, factor, table bytes
 * or None); the tail's kind, its C x 256 float table (None for bytes) and dst (C-contiguous, writable, of the final
 * image's size). */
typedef struct {
    nano_op *ops;
    int n_ops;
    nano_tail tail;
    nano_op_settings s;
    Py_buffer tb, db;
    int have_table, have_dst;
    Py_ssize_t slot_bytes; /* the tail's output, in bytes */
} nano_op_run;


void nano_op_run_release(nano_op_run *r);
/* One op record, (code, a, b, c, d, factor, table); 0, or -1 with an exception set. */
int nano_parse_op(PyObject *record, nano_op *op, PyObject **table);
/* ops[skip:] of `ops_obj`, and the tail; 0, or -1 with an exception set (r released). `batch_dst`: the batch's
 * buffer, which holds every sample's slot (dst_obj is then not taken: only its format is checked here, and the
 * slots' places by the caller); `batch_table`: the batch's table, which its later samples share. */
int nano_op_run_parse(nano_op_run *r, PyObject *ops_obj, Py_ssize_t skip, PyObject *table_obj, PyObject *dst_obj,
                      const Py_buffer *batch_dst, const Py_buffer *batch_table);
/* nano_run_ops' failure as an exception (0: none); returns rc. */
int nano_op_run_error(int rc);

/* The instruction set the kernels use now (NANO_ISA_*). */
int nano_current_isa(void);

#endif
