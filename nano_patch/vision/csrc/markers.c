/* The next JPEG marker in entropy-coded data: the lazy image's check that a stream is whole (lazy_jpeg.py).
 *
 * marker_after(data, start) -> int: where the first 0xFF at or after `start` is that is followed by a byte other
 * than 0x00 (a stuffed byte), 0xD0-0xD7 (a restart marker) or 0xFF (a fill byte); -1 where there is none. The same
 * answer as re.search(rb"\xff[^\x00\xd0-\xd7\xff]", data, start), by memchr over the data: a few microseconds per
 * photo where the regular expression takes tens, all of it holding the GIL in the thread that calls convert. */
#include <Python.h>
#include <string.h>

static PyObject *py_marker_after(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &start))
        return NULL;
    const unsigned char *data = (const unsigned char *)buf.buf;
    Py_ssize_t n = buf.len, found = -1;
    if (start < 0)
        start = 0;
    Py_ssize_t i = start;
    while (i + 1 < n) {
        const unsigned char *p = memchr(data + i, 0xFF, (size_t)(n - 1 - i));
        if (p == NULL)
            break;
        Py_ssize_t at = p - data;
        unsigned char next = data[at + 1];
        if (next != 0x00 && next != 0xFF && !(next >= 0xD0 && next <= 0xD7)) {
            found = at;
            break;
        }
        i = at + 1;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(found);
}

PyMethodDef nano_marker_methods[] = {
    {"marker_after", py_marker_after, METH_VARARGS,
     "marker_after(data, start) -> int: the first JPEG marker at or after start in entropy-coded data, or -1."},
    {NULL, NULL, 0, NULL},
};
