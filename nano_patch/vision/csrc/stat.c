/* A batch's files, stat'ed in one call with the GIL released once (file_index.py, batches_ahead.py).
 *
 * stat_identities(paths) -> bytes: for each path (str, bytes or os.PathLike, converted as os.fsencode converts it),
 * five little-endian int64s: st_dev, st_ino, st_size, st_mtime in ns, st_ctime in ns (os.stat's fields, following
 * links); five zeros where the file cannot be stat'ed (missing, unreadable, a name that does not convert). The loader
 * asks this for every sample of every batch: one call instead of one os.stat per file, each holding the GIL around
 * its system call. */
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

static PyObject *py_stat_identities(PyObject *self, PyObject *arg) {
    (void)self;
    /* (the stable ABI has no PySequence_Fast_ITEMS: one new reference per item, as the limited API reads them) */
    Py_ssize_t n = PySequence_Size(arg);
    if (n < 0)
        return NULL;
    const char **names = PyMem_Calloc(n ? (size_t)n : 1, sizeof(const char *));
    Py_ssize_t *lengths = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_ssize_t));
    PyObject **held = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 5 * (Py_ssize_t)sizeof(int64_t));
    if (!names || !lengths || !held || !out) {
        PyMem_Free(names);
        PyMem_Free(lengths);
        PyMem_Free(held);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_GetItem(arg, k);
        PyObject *converted = NULL;
        if (!item) {
            for (Py_ssize_t j = 0; j < k; j++)
                Py_XDECREF(held[j]);
            PyMem_Free(names);
            PyMem_Free(lengths);
            PyMem_Free(held);
            Py_DECREF(out);
            return NULL;
        }
        if (!PyUnicode_FSConverter(item, &converted)) {
            PyErr_Clear(); /* (not a path: no identity, as os.stat raising) */
            converted = NULL;
        }
        Py_DECREF(item);
        held[k] = converted;
        if (converted) {
            names[k] = PyBytes_AsString(converted);
            lengths[k] = PyBytes_Size(converted);
        }
    }
    int64_t *rows = (int64_t *)PyBytes_AsString(out);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t *row = rows + 5 * k;
        struct stat st;
        const char *name = names[k];
        if (name && strlen(name) == (size_t)lengths[k] && stat(name, &st) == 0) {
            row[0] = (int64_t)st.st_dev;
            row[1] = (int64_t)st.st_ino;
            row[2] = (int64_t)st.st_size;
            row[3] = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
            row[4] = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
        } else {
            memset(row, 0, 5 * sizeof(int64_t));
        }
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++)
        Py_XDECREF(held[k]);
    PyMem_Free(names);
    PyMem_Free(lengths);
    PyMem_Free(held);
    return out;
}

PyMethodDef nano_stat_methods[] = {
    {"stat_identities", py_stat_identities, METH_O,
     "stat_identities(paths) -> bytes: five int64s per path (device, inode, size, mtime_ns, ctime_ns; zeros where "
     "it cannot be stat'ed), the GIL released once."},
    {NULL, NULL, 0, NULL},
};
