/* The batch executor: a batch's samples as one native call per loader thread (run_batch).
 *
 * prepare_batch parses every sample's ops once (the GIL held once per batch, not per sample); then each loader
 * thread calls run_batch, which releases the GIL and takes the next sample (an atomic counter) until none is left:
 * its source (the cache's array, or the JPEG file read, checked and window-decoded by _jpeg's file_api), its ops,
 * and its tail into its slot of the batch tensor; run_batch_on does the same on the caller and native helper
 * threads (helpers.c) at once. batch_result(k) says how sample k went, once every thread has returned. The samples
 * are independent: each is written by the one thread that took it. Its functions join the module _native at its
 * creation (module.c). */
#include "module.h" /* first: Python.h sets the feature macros the C library's headers read */

#include <stdlib.h>
#include <string.h>

#include "jpeg_file.h"
#include "native.h"

enum { ITEM_PENDING = 0, ITEM_DONE, ITEM_LEFT };

typedef struct {
    char *path;             /* a file to load (malloc'd), or NULL: `src` */
    nano_image_arg src;     /* the cache's array */
    long long expect_h, expect_w;
    nano_op *ops;           /* ops[0] is the window's crop where `path` is set */
    int n_ops;
    void *dst;
    int state, rc;          /* ITEM_*; nano_run_ops' result */
    nano_jpeg_file f;       /* a file left to the caller keeps its bytes here */
    int loaded;
} batch_item;

typedef struct {
    batch_item *items;
    Py_ssize_t n;
    nano_tail tail; /* its dst unused: each item's own */
    nano_op_settings s;
    Py_buffer tb, db;
    int have_table, have_dst;
    const nano_jpeg_file_api *api;
    int check_rest, allow_multiscan;
    size_t max_bytes;
    int next; /* the next item to take (atomic) */
    int running;
} op_batch;

#define OP_BATCH_CAPSULE "nano_patch.vision._native.op_batch"

static void op_batch_free(op_batch *b) {
    if (!b)
        return;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        batch_item *it = &b->items[i];
        free(it->path);
        nano_release_image(&it->src);
        PyMem_Free(it->ops);
        if (b->api)
            b->api->release(&it->f);
    }
    PyMem_Free(b->items);
    if (b->have_table)
        PyBuffer_Release(&b->tb);
    if (b->have_dst)
        PyBuffer_Release(&b->db);
    PyMem_Free(b);
}

static void op_batch_destroy(PyObject *capsule) {
    op_batch_free(PyCapsule_GetPointer(capsule, OP_BATCH_CAPSULE));
}

/* prepare_batch(file_api or None, items, kind, table, dst, (h, w, c), settings, (check_rest, allow_multiscan),
 * max_bytes) -> a batch for run_batch. items: per sample (source, ops, offset): source an H x W (x 3) uint8 array
 * or (path, (expect_h, expect_w)) of a JPEG file (its ops[0] the window's crop); offset, in bytes, of the sample's
 * slot in dst (a C-contiguous buffer holding every slot). */
static PyObject *py_prepare_batch(PyObject *self, PyObject *args) {
    PyObject *api_obj, *items_obj, *table_obj, *dst_obj;
    unsigned long long max_bytes;
    op_batch *b = PyMem_Calloc(1, sizeof(op_batch));
    if (!b)
        return PyErr_NoMemory();
    if (!PyArg_ParseTuple(args, "OO!iOO(iii)(iiii)(ii)K:prepare_batch", &api_obj, &PyList_Type, &items_obj,
                          &b->tail.kind, &table_obj, &dst_obj, &b->tail.height, &b->tail.width, &b->tail.channels,
                          &b->s.order_rule, &b->s.weights, &b->s.grey_mode, &b->s.saturation_mode, &b->check_rest,
                          &b->allow_multiscan, &max_bytes))
        goto fail;
    b->max_bytes = max_bytes > SIZE_MAX ? SIZE_MAX : (size_t)max_bytes;
    if (api_obj != Py_None) {
        b->api = PyCapsule_GetPointer(api_obj, NANO_JPEG_FILE_CAPSULE);
        if (!b->api)
            goto fail;
        if (b->api->abi != NANO_JPEG_FILE_ABI) {
            PyErr_SetString(PyExc_ValueError, "prepare_batch: _jpeg's file_api is not this build's");
            goto fail;
        }
    }
    Py_ssize_t n = PyList_Size(items_obj);
    if (n <= 0 || n > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "prepare_batch: no samples, or too many");
        goto fail;
    }
    if (PyObject_GetBuffer(dst_obj, &b->db, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        goto fail;
    b->have_dst = 1;
    b->items = PyMem_Calloc((size_t)n, sizeof(batch_item));
    if (!b->items) {
        PyErr_NoMemory();
        goto fail;
    }
    b->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        batch_item *it = &b->items[i];
        PyObject *source, *ops_obj;
        Py_ssize_t offset;
        if (!PyArg_ParseTuple(PyList_GetItem(items_obj, i), "OO!n:prepare_batch item", &source, &PyTuple_Type,
                              &ops_obj, &offset))
            goto fail;
        if (PyTuple_Check(source)) {
            PyObject *path;
            if (b->api == NULL) {
                PyErr_SetString(PyExc_ValueError, "prepare_batch: a file sample needs _jpeg's file_api");
                goto fail;
            }
            if (!PyArg_ParseTuple(source, "O&(LL):prepare_batch file", PyUnicode_FSConverter, &path, &it->expect_h,
                                  &it->expect_w))
                goto fail;
            const char *bytes = PyBytes_AsString(path);
            it->path = bytes ? strdup(bytes) : NULL;
            Py_DECREF(path);
            if (!it->path) {
                if (!PyErr_Occurred())
                    PyErr_NoMemory();
                goto fail;
            }
        } else if (nano_get_image(source, "src", 0, 0, &it->src) < 0) {
            goto fail;
        }
        /* the ops and the tail, checked as run_ops checks them (the tail's buffers held once, by the batch) */
        nano_op_run r;
        memset(&r, 0, sizeof(r));
        r.tail = b->tail;
        r.s = b->s;
        if (it->path) {
            PyObject *window = PyTuple_Size(ops_obj) > 0 ? PyTuple_GetItem(ops_obj, 0) : NULL;
            nano_op first;
            PyObject *unused;
            if (window == NULL || nano_parse_op(window, &first, &unused) < 0 || first.code != NANO_OP_CROP) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "prepare_batch: a file sample's ops start with its crop");
                goto fail;
            }
            it->f.top = first.a;
            it->f.left = first.b;
            it->f.height = first.c;
            it->f.width = first.d;
        }
        if (nano_op_run_parse(&r, ops_obj, it->path ? 1 : 0, table_obj, dst_obj, &b->db,
                         b->have_table ? &b->tb : NULL) < 0)
            goto fail;
        if (offset < 0 || offset > b->db.len - r.slot_bytes || offset % b->db.itemsize != 0) {
            nano_op_run_release(&r);
            PyErr_SetString(PyExc_ValueError, "prepare_batch: a slot outside dst");
            goto fail;
        }
        it->ops = r.ops;
        it->n_ops = r.n_ops;
        r.ops = NULL;
        if (!b->have_table && r.have_table) { /* keep the first item's table buffer for the batch */
            b->tb = r.tb;
            b->have_table = 1;
            r.have_table = 0;
            b->tail.table = b->tb.buf;
            b->tail.table_rows = r.tail.table_rows;
        }
        nano_op_run_release(&r);
        it->dst = (char *)b->db.buf + offset;
    }
    b->s.isa = nano_current_isa();
    PyObject *capsule = PyCapsule_New(b, OP_BATCH_CAPSULE, op_batch_destroy);
    if (!capsule)
        goto fail;
    return capsule;
fail:
    op_batch_free(b);
    return NULL;
}

static void run_item(op_batch *b, batch_item *it) {
    nano_tail tail = b->tail;
    tail.dst = it->dst;
    if (it->path) {
        it->f.path = it->path;
        it->f.expect_h = it->expect_h;
        it->f.expect_w = it->expect_w;
        it->f.check_rest = b->check_rest;
        it->f.allow_multiscan = b->allow_multiscan;
        it->f.max_bytes = b->max_bytes;
        it->loaded = b->api->load(&it->f);
        if (it->loaded != NANO_JPEG_OK) {
            if (it->loaded != NANO_JPEG_REFUSED) /* nothing to hand back: free it now */
                b->api->release(&it->f);
            it->state = ITEM_LEFT;
            return;
        }
        nano_view v = {it->f.window, it->f.stride, (int)it->f.width, (int)it->f.height, 3};
        it->rc = nano_run_ops(&v, it->ops, it->n_ops, &tail, &b->s);
        free(it->f.pixels); /* the decoded window is not needed any more */
        it->f.pixels = NULL;
    } else {
        it->rc = nano_run_ops(&it->src.v, it->ops, it->n_ops, &tail, &b->s);
    }
    it->state = ITEM_DONE;
}

typedef struct {
    op_batch *b;
    Py_ssize_t ran; /* (atomic) */
} shared_run;

static void take_items(void *arg) {
    shared_run *run = arg;
    op_batch *b = run->b;
    for (;;) {
        int k = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (k >= b->n)
            break;
        run_item(b, &b->items[k]);
        __atomic_fetch_add(&run->ran, 1, __ATOMIC_RELAXED);
    }
}

/* The batch a capsule holds (PyArg_ParseTuple's "O&" converter: 1, or 0 with an exception set). */
static int batch_arg(PyObject *capsule, void *out) {
    op_batch *b = PyCapsule_GetPointer(capsule, OP_BATCH_CAPSULE);
    *(op_batch **)out = b;
    return b != NULL;
}

/* run_batch(batch): take samples until none is left, the GIL released; returns how many this call ran. */
static PyObject *py_run_batch(PyObject *self, PyObject *capsule) {
    op_batch *b;
    if (!batch_arg(capsule, &b))
        return NULL;
    shared_run run = {b, 0};
    Py_BEGIN_ALLOW_THREADS
    take_items(&run);
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(run.ran);
}

/* run_batch_on(batch, n_threads) -> (threads, samples): the batch's samples on n_threads threads at once (the
 * caller and native helpers, helpers.c), the GIL released once; returns how many threads ran and samples this call
 * took (every sample left, unless another run_batch takes some meanwhile). */
static PyObject *py_run_batch_on(PyObject *self, PyObject *args) {
    op_batch *b;
    int n_threads;
    if (!PyArg_ParseTuple(args, "O&i:run_batch_on", batch_arg, &b, &n_threads))
        return NULL;
    if (n_threads < 1) {
        PyErr_SetString(PyExc_ValueError, "run_batch_on: n_threads must be at least 1");
        return NULL;
    }
    if (n_threads > b->n)
        n_threads = (int)b->n;
    shared_run run = {b, 0};
    int used;
    Py_BEGIN_ALLOW_THREADS
    used = nano_run_shared(take_items, &run, n_threads);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(in)", used, run.ran);
}

static PyObject *py_helpers_started(PyObject *self, PyObject *noargs) {
    return PyLong_FromLong(nano_helpers_started());
}

/* batch_done(batch) -> bytes: per sample, 1 where it was written to its slot, else 0 (ask batch_result). */
static PyObject *py_batch_done(PyObject *self, PyObject *capsule) {
    op_batch *b;
    if (!batch_arg(capsule, &b))
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, b->n);
    if (!out)
        return NULL;
    char *flags = PyBytes_AsString(out);
    for (Py_ssize_t i = 0; i < b->n; i++)
        flags[i] = (char)(b->items[i].state == ITEM_DONE && b->items[i].rc == 0);
    return out;
}

/* batch_result(batch, k): True (sample k written to its slot); its file's bytes (read but left to the caller);
 * False (its file not read, or never taken); raises what run_ops raises for its ops. Call once every run_batch
 * call has returned. */
static PyObject *py_batch_result(PyObject *self, PyObject *args) {
    op_batch *b;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "O&n:batch_result", batch_arg, &b, &k))
        return NULL;
    if (k < 0 || k >= b->n) {
        PyErr_SetString(PyExc_IndexError, "batch_result: no such sample");
        return NULL;
    }
    batch_item *it = &b->items[k];
    if (it->state == ITEM_DONE)
        return nano_op_run_error(it->rc) ? NULL : Py_NewRef(Py_True);
    if (it->state == ITEM_LEFT && it->loaded == NANO_JPEG_REFUSED)
        return PyBytes_FromStringAndSize((const char *)it->f.data, (Py_ssize_t)it->f.size);
    if (it->state == ITEM_LEFT && it->loaded == NANO_JPEG_NOMEM)
        return PyErr_NoMemory();
    return Py_NewRef(Py_False);
}

PyMethodDef nano_batch_methods[] = {
    {"prepare_batch", py_prepare_batch, METH_VARARGS,
     "prepare_batch(file_api, items, kind, table, dst, (h, w, c), settings, (check_rest, allow_multiscan), "
     "max_bytes): a batch's samples (each an array or a JPEG file, its ops, its slot's offset in dst) parsed once."},
    {"run_batch", py_run_batch, METH_O,
     "run_batch(batch) -> int: take the batch's samples until none is left, the GIL released (call it from each "
     "loader thread)."},
    {"run_batch_on", py_run_batch_on, METH_VARARGS,
     "run_batch_on(batch, n_threads) -> (threads, samples): the batch's samples on n_threads threads, the caller and "
     "native helper threads (helpers.c), the GIL released once."},
    {"helpers_started", py_helpers_started, METH_NOARGS, "Native helper threads started in this process."},
    {"batch_done", py_batch_done, METH_O,
     "batch_done(batch) -> bytes: 1 per sample written to its slot, 0 for the others (see batch_result)."},
    {"batch_result", py_batch_result, METH_VARARGS,
     "batch_result(batch, k) -> True | bytes | False: how sample k went (raises run_ops' errors)."},
    {NULL, NULL, 0, NULL},
};
