/* torch's CPU generator, reproduced for the draws torchvision's v1 transforms make: uniform_ on float32, randint,
 * rand(1) < p and randperm(n), from the state torch.get_rng_state() gives.
 *
 * Why: the draw step of a batch runs in the calling thread, holding the GIL; each of torch's draws there is a tensor
 * made and read (2-5 us), and a sample makes 5-15 of them. The same draws made here cost well under a microsecond.
 *
 * What torch does (ATen/core/MT19937RNGEngine.h, DistributionsHelper.h, TransformationHelper.h, and
 * native/TensorFactories.cpp's randperm_cpu at the installed version):
 * - the generator is an mt19937: one output is one 32-bit word; random64 is two words, the first one high;
 * - uniform_ on float32 keeps an output's low 24 bits, x = (v & 0xffffff) / 2^24, and returns
 *   x * (to - from) + from in float; a build may fuse that multiply and add (torch's kernels for AVX2 and AVX-512
 *   are compiled with FMA), so both are here and the Python side picks the one the installed torch matches;
 * - randint(low, high) is v % (high - low) + low, with random64 for a range of 2^28 or more;
 * - randperm(n), small n: r = 0..n-1, then r[i] swapped with r[i + random() % (n - i)] for i < n - 1.
 * The Python side (vision/torch_draws.py) checks all of it against the real generator before first use, and
 * makes torch's own draws on any difference. Where a result would hang on a value this file cannot reproduce
 * exactly (torch's float32 exp, to within its last bits), the functions say so (None) and leave the state as it
 * was: the caller then lets torch draw that step.
 *
 * The state is 626 uint32 words: the 624 of the twister, then `left` and `next` as torch keeps them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "native.h"

#define MT_N 624
#define MT_M 397
#define ST_LEFT 624
#define ST_NEXT 625
#define ST_WORDS 626

/* torch.get_rng_state()'s bytes (CPUGeneratorImplState): the seed (u64), left (i32), seeded (i32), next (u64),
 * the 624 words each as a u64, then the cached normal samples this file never touches. */
#define TORCH_STATE_BYTES 5056
#define TORCH_LEFT_AT 8
#define TORCH_NEXT_AT 16
#define TORCH_WORDS_AT 24

static void mt_twist(uint32_t *s) {
    int i;
#define MIX(u, v) ((((u) & 0x80000000u) | ((v) & 0x7fffffffu)) >> 1 ^ (((v) & 1u) ? 0x9908b0dfu : 0u))
    for (i = 0; i < MT_N - MT_M; i++)
        s[i] = s[i + MT_M] ^ MIX(s[i], s[i + 1]);
    for (; i < MT_N - 1; i++)
        s[i] = s[i + MT_M - MT_N] ^ MIX(s[i], s[i + 1]);
    s[MT_N - 1] = s[MT_M - 1] ^ MIX(s[MT_N - 1], s[0]);
#undef MIX
    s[ST_LEFT] = MT_N;
    s[ST_NEXT] = 0;
}

static uint32_t mt_next(uint32_t *s) {
    if (--s[ST_LEFT] == 0)
        mt_twist(s);
    uint32_t y = s[s[ST_NEXT]++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

static uint64_t mt_next64(uint32_t *s) {
    uint64_t hi = mt_next(s);
    return (hi << 32) | mt_next(s);
}

/* uniform_(from, to) of a float32 tensor: one draw. `fused`: the multiply and add as one fma. */
static float draw_uniform(uint32_t *s, float from, float to, int fused) {
    float x = (float)(mt_next(s) & 0xffffffu) * (1.0f / 16777216.0f);
    if (fused)
        return fmaf(x, to - from, from);
    volatile float scaled = x * (to - from); /* volatile: never fused, whatever the build's contraction */
    return scaled + from;
}

static int64_t draw_randint(uint32_t *s, int64_t low, int64_t high) {
    uint64_t range = (uint64_t)high - (uint64_t)low;
    uint64_t v = range >= (1ull << 28) ? mt_next64(s) : (uint64_t)mt_next(s);
    return (int64_t)(v % range + (uint64_t)low);
}

/* Python's round(x) for a float: to nearest, ties to even. */
static double py_round(double x) {
    double r = round(x);
    if (fabs(x - r) == 0.5)
        r = 2.0 * round(x / 2.0);
    return r;
}

/* uniform_'s checks of its bounds, as floats: where stock raises, or the bounds are not plain numbers, NaN says
 * "let torch draw" (it raises the error stock raises). */
static int uniform_bounds_ok(double from, double to) {
    return isfinite(from) && isfinite(to) && from <= to && fabs(from) <= FLT_MAX && fabs(to) <= FLT_MAX &&
           (to - from) <= FLT_MAX;
}

/* A transform's parameter as stock reads it, where it is plainly two numbers: a list or tuple of two Python floats
 * or ints (not bools, not subclasses), finite. 0: anything else (stock's own code then draws, and raises where it
 * raises). */
static int plain_number(PyObject *o, double *out) {
    if (PyFloat_CheckExact(o))
        *out = PyFloat_AsDouble(o);
    else if (PyLong_CheckExact(o)) {
        *out = PyLong_AsDouble(o);
        if (*out == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else
        return 0;
    return isfinite(*out);
}

static int plain_pair(PyObject *o, double *a, double *b) {
    PyObject *first, *second;
    if (PyTuple_CheckExact(o) && PyTuple_Size(o) == 2) {
        first = PyTuple_GetItem(o, 0);
        second = PyTuple_GetItem(o, 1);
    } else if (PyList_CheckExact(o) && PyList_Size(o) == 2) {
        first = PyList_GetItem(o, 0);
        second = PyList_GetItem(o, 1);
    } else
        return 0;
    return first && second && plain_number(first, a) && plain_number(second, b);
}

/* ---- the state as a buffer ---- */

typedef struct {
    Py_buffer buf;
    uint32_t *s;
} state_arg;

static int get_state(PyObject *obj, state_arg *out) {
    if (PyObject_GetBuffer(obj, &out->buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (out->buf.len != ST_WORDS * 4) {
        PyBuffer_Release(&out->buf);
        PyErr_Format(PyExc_ValueError, "a draw state is %d bytes, got %zd", ST_WORDS * 4, out->buf.len);
        return -1;
    }
    out->s = (uint32_t *)out->buf.buf;
    if (out->s[ST_LEFT] < 1 || out->s[ST_LEFT] > MT_N || out->s[ST_NEXT] > MT_N) {
        PyBuffer_Release(&out->buf);
        PyErr_SetString(PyExc_ValueError, "the draw state is not a valid generator state");
        return -1;
    }
    return 0;
}

/* draws_load(torch_state, st): torch.get_rng_state()'s bytes into the 626 words. */
static PyObject *py_draws_load(PyObject *self, PyObject *args) {
    PyObject *tobj, *sobj;
    if (!PyArg_ParseTuple(args, "OO", &tobj, &sobj))
        return NULL;
    Py_buffer tb;
    if (PyObject_GetBuffer(tobj, &tb, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Py_buffer sb;
    if (PyObject_GetBuffer(sobj, &sb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    PyObject *result = NULL;
    if (tb.len != TORCH_STATE_BYTES || sb.len != ST_WORDS * 4) {
        PyErr_Format(PyExc_ValueError, "expected torch's %d-byte state and a %d-byte draw state, got %zd and %zd",
                     TORCH_STATE_BYTES, ST_WORDS * 4, tb.len, sb.len);
        goto done;
    }
    const uint8_t *t = (const uint8_t *)tb.buf;
    uint32_t *s = (uint32_t *)sb.buf;
    int32_t left;
    uint64_t next, word;
    memcpy(&left, t + TORCH_LEFT_AT, 4);
    memcpy(&next, t + TORCH_NEXT_AT, 8);
    if (left < 1 || left > MT_N || next > MT_N) {
        PyErr_SetString(PyExc_ValueError, "torch's generator state is not one this version of the draws knows");
        goto done;
    }
    for (int i = 0; i < MT_N; i++) {
        memcpy(&word, t + TORCH_WORDS_AT + 8 * i, 8);
        s[i] = (uint32_t)word;
    }
    s[ST_LEFT] = (uint32_t)left;
    s[ST_NEXT] = (uint32_t)next;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&tb);
    PyBuffer_Release(&sb);
    return result;
}

/* draws_store(st, torch_state): the 626 words back into torch's bytes (its other fields kept). */
static PyObject *py_draws_store(PyObject *self, PyObject *args) {
    PyObject *sobj, *tobj;
    if (!PyArg_ParseTuple(args, "OO", &sobj, &tobj))
        return NULL;
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    Py_buffer tb;
    if (PyObject_GetBuffer(tobj, &tb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&st.buf);
        return NULL;
    }
    PyObject *result = NULL;
    if (tb.len != TORCH_STATE_BYTES) {
        PyErr_Format(PyExc_ValueError, "expected torch's %d-byte state, got %zd", TORCH_STATE_BYTES, tb.len);
        goto done;
    }
    uint8_t *t = (uint8_t *)tb.buf;
    int32_t left = (int32_t)st.s[ST_LEFT];
    uint64_t next = st.s[ST_NEXT];
    memcpy(t + TORCH_LEFT_AT, &left, 4);
    memcpy(t + TORCH_NEXT_AT, &next, 8);
    for (int i = 0; i < MT_N; i++) {
        uint64_t word = st.s[i];
        memcpy(t + TORCH_WORDS_AT + 8 * i, &word, 8);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&st.buf);
    PyBuffer_Release(&tb);
    return result;
}

/* draws_words_since(start, st) -> int: how many 32-bit outputs take the twister from the state ``start`` to the
   state ``st`` (both draw states), or -1 where ``st`` is not within ``limit`` outputs of it. The caller moves
   torch's own generator on by that many outputs in one locked operation (an int32 tensor's random_()), so that a
   draw another thread made from it meanwhile is kept rather than written over. */
static PyObject *py_draws_words_since(PyObject *self, PyObject *args) {
    PyObject *aobj, *bobj;
    long long limit;
    if (!PyArg_ParseTuple(args, "OOL", &aobj, &bobj, &limit))
        return NULL;
    state_arg a, b;
    if (get_state(aobj, &a) < 0)
        return NULL;
    if (get_state(bobj, &b) < 0) {
        PyBuffer_Release(&a.buf);
        return NULL;
    }
    uint32_t *t = (uint32_t *)PyMem_Malloc(ST_WORDS * sizeof(uint32_t));
    long long n = -1;
    if (t == NULL) {
        PyErr_NoMemory();
    } else {
        memcpy(t, a.s, ST_WORDS * sizeof(uint32_t));
        for (long long k = 0; k <= limit; k++) {
            /* (the words change only where the twister turns over: compared where the position agrees) */
            if (t[ST_LEFT] == b.s[ST_LEFT] && t[ST_NEXT] == b.s[ST_NEXT] &&
                memcmp(t, b.s, MT_N * sizeof(uint32_t)) == 0) {
                n = k;
                break;
            }
            if (--t[ST_LEFT] == 0)
                mt_twist(t);
            t[ST_NEXT]++;
        }
        PyMem_Free(t);
    }
    PyBuffer_Release(&a.buf);
    PyBuffer_Release(&b.buf);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(n);
}

/* draws_uniform(st, from, to, fused) -> float, or None where torch would raise. */
static PyObject *py_draws_uniform(PyObject *self, PyObject *args) {
    PyObject *sobj;
    double from, to;
    int fused;
    if (!PyArg_ParseTuple(args, "Oddp", &sobj, &from, &to, &fused))
        return NULL;
    if (!uniform_bounds_ok(from, to))
        Py_RETURN_NONE;
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    float v = draw_uniform(st.s, (float)from, (float)to, fused);
    PyBuffer_Release(&st.buf);
    return PyFloat_FromDouble((double)v);
}

/* draws_randint(st, low, high) -> int, or None where torch would raise (an empty range). */
static PyObject *py_draws_randint(PyObject *self, PyObject *args) {
    PyObject *sobj;
    long long low, high;
    if (!PyArg_ParseTuple(args, "OLL", &sobj, &low, &high))
        return NULL;
    if (low >= high)
        Py_RETURN_NONE;
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    int64_t v = draw_randint(st.s, low, high);
    PyBuffer_Release(&st.buf);
    return PyLong_FromLongLong(v);
}

/* draws_below(st, p) -> bool: torch.rand(1) < p, the comparison in float32 as torch makes it for a Python p;
 * None for a p that is not a plain number in [0, 1]. */
static PyObject *py_draws_below(PyObject *self, PyObject *args) {
    PyObject *sobj, *pobj;
    double p;
    if (!PyArg_ParseTuple(args, "OO", &sobj, &pobj))
        return NULL;
    if (!plain_number(pobj, &p) || p < 0.0 || p > 1.0)
        Py_RETURN_NONE;
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    float x = draw_uniform(st.s, 0.0f, 1.0f, 0);
    PyBuffer_Release(&st.buf);
    return PyBool_FromLong(x < (float)p);
}

/* draws_randperm(st, n) -> tuple, for 0 < n <= 64 (torch's small-n shuffle). */
static PyObject *py_draws_randperm(PyObject *self, PyObject *args) {
    PyObject *sobj;
    int n;
    if (!PyArg_ParseTuple(args, "Oi", &sobj, &n))
        return NULL;
    if (n < 1 || n > 64) {
        PyErr_SetString(PyExc_ValueError, "draws_randperm takes 1 <= n <= 64");
        return NULL;
    }
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    int r[64];
    for (int i = 0; i < n; i++)
        r[i] = i;
    for (int i = 0; i < n - 1; i++) {
        int z = (int)(mt_next(st.s) % (uint32_t)(n - i));
        int save = r[i];
        r[i] = r[z + i];
        r[z + i] = save;
    }
    PyBuffer_Release(&st.buf);
    PyObject *out = PyTuple_New(n);
    if (!out)
        return NULL;
    for (int i = 0; i < n; i++)
        if (PyTuple_SetItem(out, i, PyLong_FromLong(r[i])) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    return out;
}

/* RandomResizedCrop's w and h for one attempt, as stock's Python computes them from float32 draws; 0: the
 * attempt is rejected; -1: the arithmetic would raise or is not a number (torch then draws). */
static int rrc_attempt(double target_area, float aspect, long height, long width, long *w, long *h) {
    double a = (double)aspect;
    double wide = target_area * a, tall = target_area / a;
    if (!(wide >= 0) || !(tall >= 0) || !isfinite(wide) || !isfinite(tall))
        return -1;
    double wr = py_round(sqrt(wide)), hr = py_round(sqrt(tall));
    if (wr > 9e15 || hr > 9e15)
        return -1;
    *w = (long)wr;
    *h = (long)hr;
    return (*w > 0 && *w <= width && *h > 0 && *h <= height) ? 1 : 0;
}

/* torch's float32 exp of u, from exp_fn (a Python callable: torch.exp on a one-element float32 tensor, as stock's
 * get_params computes it); 0 where it gives no float (the caller gives the crop back). */
static int exact_exp(PyObject *exp_fn, float u, float *out) {
    PyObject *got = PyObject_CallFunction(exp_fn, "d", (double)u);
    if (!got) {
        PyErr_Clear();
        return 0;
    }
    double v = PyFloat_AsDouble(got);
    Py_DECREF(got);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = (float)v;
    return 1;
}

/* draws_resized_crop(st, height, width, scale, ratio, log_ratio0, log_ratio1, fused, exp_fn) -> (i, j, h, w), or
 * None (the state as it was): RandomResizedCrop.get_params. scale, ratio: the transform's own; log_ratio: torch.log
 * of the float32 ratio, as stock computes it (the caller gives torch's own values). exp_fn (optional): torch's own
 * float32 exp, asked where the exp computed here could round w or h otherwise (about one attempt in ten thousand);
 * without it such a crop is given back. */
static PyObject *py_draws_resized_crop(PyObject *self, PyObject *args) {
    PyObject *sobj, *scale, *ratio, *exp_fn = Py_None;
    long height, width;
    double s0, s1, r0, r1, lr0, lr1;
    int fused = 0;
    if (!PyArg_ParseTuple(args, "OllOOdd|pO", &sobj, &height, &width, &scale, &ratio, &lr0, &lr1, &fused, &exp_fn))
        return NULL;
    if (!plain_pair(scale, &s0, &s1) || !plain_pair(ratio, &r0, &r1))
        Py_RETURN_NONE;
    double rmin = r0 < r1 ? r0 : r1, rmax = r0 < r1 ? r1 : r0;
    if (height <= 0 || width <= 0 || height > (1l << 30) || width > (1l << 30) || !uniform_bounds_ok(s0, s1) ||
        !uniform_bounds_ok(lr0, lr1) || rmin <= 0)
        Py_RETURN_NONE;
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    uint32_t saved[ST_WORDS];
    memcpy(saved, st.s, sizeof(saved));
    double area = (double)height * (double)width;
    long i = 0, j = 0, h = 0, w = 0;
    int found = 0;
    for (int attempt = 0; attempt < 10 && !found; attempt++) {
        double target_area = area * (double)draw_uniform(st.s, (float)s0, (float)s1, fused);
        float u = draw_uniform(st.s, (float)lr0, (float)lr1, fused);
        /* torch's float32 exp is within an ulp or so of the exact value: every float within two steps of the
         * correctly rounded one must give the same w and h, else torch draws this crop itself */
        float e = (float)exp((double)u);
        int verdict = rrc_attempt(target_area, e, height, width, &w, &h);
        float lo = e, hi = e;
        for (int step = 0; step < 2 && verdict >= 0; step++) {
            long w2, h2;
            lo = nextafterf(lo, -INFINITY);
            hi = nextafterf(hi, INFINITY);
            int v_lo = rrc_attempt(target_area, lo, height, width, &w2, &h2);
            if (v_lo != verdict || w2 != w || h2 != h)
                verdict = -1;
            int v_hi = rrc_attempt(target_area, hi, height, width, &w2, &h2);
            if (v_hi != verdict || w2 != w || h2 != h)
                verdict = -1;
        }
        if (verdict < 0 && exp_fn != Py_None && rrc_attempt(target_area, e, height, width, &w, &h) >= 0) {
            /* a rounding that torch's own exp decides (the arithmetic itself is sound) */
            float exact;
            verdict = exact_exp(exp_fn, u, &exact) ? rrc_attempt(target_area, exact, height, width, &w, &h) : -1;
        }
        if (verdict < 0) {
            memcpy(st.s, saved, sizeof(saved));
            PyBuffer_Release(&st.buf);
            Py_RETURN_NONE;
        }
        if (verdict == 1) {
            i = (long)draw_randint(st.s, 0, height - h + 1);
            j = (long)draw_randint(st.s, 0, width - w + 1);
            found = 1;
        }
    }
    PyBuffer_Release(&st.buf);
    if (!found) { /* stock's fallback: a central crop */
        double in_ratio = (double)width / (double)height;
        if (in_ratio < rmin) {
            w = width;
            h = (long)py_round((double)w / rmin);
        } else if (in_ratio > rmax) {
            h = height;
            w = (long)py_round((double)h * rmax);
        } else {
            w = width;
            h = height;
        }
        i = (height - h) >= 0 ? (height - h) / 2 : -((h - height + 1) / 2);
        j = (width - w) >= 0 ? (width - w) / 2 : -((w - width + 1) / 2);
    }
    return Py_BuildValue("(llll)", i, j, h, w);
}

/* draws_crop(st, height, width, size) -> (i, j, th, tw), or None where stock raises or size is not two plain ints:
 * RandomCrop.get_params. */
static PyObject *py_draws_crop(PyObject *self, PyObject *args) {
    PyObject *sobj, *size;
    long height, width, th, tw;
    double a, b;
    if (!PyArg_ParseTuple(args, "OllO", &sobj, &height, &width, &size))
        return NULL;
    if (!plain_pair(size, &a, &b) || a != floor(a) || b != floor(b) || fabs(a) > 1e15 || fabs(b) > 1e15)
        Py_RETURN_NONE;
    PyObject *first = PySequence_GetItem(size, 0), *second = PySequence_GetItem(size, 1);
    int ints = first && second && PyLong_CheckExact(first) && PyLong_CheckExact(second);
    Py_XDECREF(first);
    Py_XDECREF(second);
    if (!ints) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    th = (long)a;
    tw = (long)b;
    if (height < th || width < tw || th < 0 || tw < 0)
        Py_RETURN_NONE;
    if (height == th && width == tw)
        return Py_BuildValue("(llll)", 0l, 0l, height, width);
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    long i = (long)draw_randint(st.s, 0, height - th + 1);
    long j = (long)draw_randint(st.s, 0, width - tw + 1);
    PyBuffer_Release(&st.buf);
    return Py_BuildValue("(llll)", i, j, th, tw);
}

/* draws_jitter(st, brightness, contrast, saturation, hue, fused) -> (order, b, c, s, h), or None (the state as it
 * was): ColorJitter.get_params. Each range: the transform's own, None or two plain numbers. */
static PyObject *py_draws_jitter(PyObject *self, PyObject *args) {
    PyObject *sobj, *ranges[4];
    int fused = 0;
    if (!PyArg_ParseTuple(args, "OOOOO|p", &sobj, &ranges[0], &ranges[1], &ranges[2], &ranges[3], &fused))
        return NULL;
    double lo[4], hi[4];
    int present[4];
    for (int k = 0; k < 4; k++) {
        present[k] = ranges[k] != Py_None;
        if (present[k] && (!plain_pair(ranges[k], &lo[k], &hi[k]) || !uniform_bounds_ok(lo[k], hi[k])))
            Py_RETURN_NONE;
    }
    state_arg st;
    if (get_state(sobj, &st) < 0)
        return NULL;
    int order[4] = {0, 1, 2, 3};
    for (int i = 0; i < 3; i++) {
        int z = (int)(mt_next(st.s) % (uint32_t)(4 - i));
        int save = order[i];
        order[i] = order[z + i];
        order[z + i] = save;
    }
    double factor[4];
    for (int k = 0; k < 4; k++)
        if (present[k])
            factor[k] = (double)draw_uniform(st.s, (float)lo[k], (float)hi[k], fused);
    PyBuffer_Release(&st.buf);
    PyObject *out = PyTuple_New(5);
    if (!out)
        return NULL;
    if (PyTuple_SetItem(out, 0, Py_BuildValue("(iiii)", order[0], order[1], order[2], order[3])) < 0)
        goto fail;
    for (int k = 0; k < 4; k++)
        if (PyTuple_SetItem(out, k + 1, present[k] ? PyFloat_FromDouble(factor[k]) : Py_NewRef(Py_None)) < 0)
            goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* draws_batch(st, program, n) -> bytes: ``n`` samples' draws in a row, each sample drawing the program's steps in
 * order, as stock's loop draws them sample after sample. ``program``: float64 triples (kind, a, b): kind 0,
 * ``torch.randint(a, b, (1,))``; kind 1, ``torch.rand(1) < a``. The results: one int64 per step per sample (0 or 1 for
 * kind 1). An array dataset's batch (its samples all of one size, so all drawing the same kinds): one call. A
 * program stock would reject (a range that is empty, a probability outside [0, 1]) raises ValueError, having drawn
 * nothing. */
static PyObject *py_draws_batch(PyObject *self, PyObject *args) {
    PyObject *sobj, *pobj;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOn", &sobj, &pobj, &n))
        return NULL;
    Py_buffer pb;
    if (PyObject_GetBuffer(pobj, &pb, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (pb.len % (3 * (Py_ssize_t)sizeof(double)) != 0 || n < 0) {
        PyBuffer_Release(&pb);
        PyErr_SetString(PyExc_ValueError, "draws_batch: the program is float64 triples, n >= 0");
        return NULL;
    }
    Py_ssize_t steps = pb.len / (3 * (Py_ssize_t)sizeof(double));
    const double *prog = (const double *)pb.buf;
    for (Py_ssize_t k = 0; k < steps; k++) {
        double kind = prog[3 * k], a = prog[3 * k + 1], b = prog[3 * k + 2];
        int ok = kind == 0.0 ? (a == floor(a) && b == floor(b) && a < b && fabs(a) < 1e15 && fabs(b) < 1e15)
                             : kind == 1.0 ? (a >= 0.0 && a <= 1.0) : 0;
        if (!ok) {
            PyBuffer_Release(&pb);
            PyErr_Format(PyExc_ValueError, "draws_batch: step %zd is not a draw it makes", k);
            return NULL;
        }
    }
    if (steps && n > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t) / steps) {
        PyBuffer_Release(&pb);
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * steps * (Py_ssize_t)sizeof(int64_t));
    if (!out) {
        PyBuffer_Release(&pb);
        return NULL;
    }
    state_arg st;
    if (get_state(sobj, &st) < 0) {
        PyBuffer_Release(&pb);
        Py_DECREF(out);
        return NULL;
    }
    int64_t *res = (int64_t *)PyBytes_AsString(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        for (Py_ssize_t k = 0; k < steps; k++) {
            const double *step = prog + 3 * k;
            if (step[0] == 0.0)
                *res++ = draw_randint(st.s, (int64_t)step[1], (int64_t)step[2]);
            else
                *res++ = draw_uniform(st.s, 0.0f, 1.0f, 0) < (float)step[1];
        }
    }
    PyBuffer_Release(&st.buf);
    PyBuffer_Release(&pb);
    return out;
}

PyMethodDef nano_draws_methods[] = {
    {"draws_load", py_draws_load, METH_VARARGS, "draws_load(torch_state, st): torch.get_rng_state()'s bytes in."},
    {"draws_store", py_draws_store, METH_VARARGS, "draws_store(st, torch_state): the state back into torch's bytes."},
    {"draws_words_since", py_draws_words_since, METH_VARARGS,
     "draws_words_since(start, st, limit): the 32-bit outputs from state start to st, or -1 beyond limit."},
    {"draws_uniform", py_draws_uniform, METH_VARARGS, "draws_uniform(st, from, to, fused): a float32 uniform_."},
    {"draws_randint", py_draws_randint, METH_VARARGS, "draws_randint(st, low, high): torch.randint(low, high)."},
    {"draws_below", py_draws_below, METH_VARARGS, "draws_below(st, p): torch.rand(1) < p."},
    {"draws_randperm", py_draws_randperm, METH_VARARGS, "draws_randperm(st, n): torch.randperm(n), n <= 64."},
    {"draws_resized_crop", py_draws_resized_crop, METH_VARARGS,
     "draws_resized_crop(st, h, w, scale, ratio, lr0, lr1, fused, exp_fn): RandomResizedCrop.get_params, or None."},
    {"draws_crop", py_draws_crop, METH_VARARGS, "draws_crop(st, h, w, size): RandomCrop.get_params, or None."},
    {"draws_batch", py_draws_batch, METH_VARARGS,
     "draws_batch(st, program, n): n samples' draws in a row (program: float64 (kind, a, b); 0 randint, 1 rand < a)."},
    {"draws_jitter", py_draws_jitter, METH_VARARGS,
     "draws_jitter(st, brightness, contrast, saturation, hue, fused): ColorJitter.get_params, or None."},
    {NULL, NULL, 0, NULL},
};
