/* A JPEG stream's markers, checked for the lazy image (lazy_jpeg.py): a decode is put off only where stock's
 * decode, put off or not, cannot fail on the stream's markers.
 *
 * marker_after(data, start) -> int: where the first 0xFF at or after `start` is that is followed by a byte other
 * than 0x00 (a stuffed byte), 0xD0-0xD7 (a restart marker) or 0xFF (a fill byte); -1 where there is none. The same
 * answer as re.search(rb"\xff[^\x00\xd0-\xd7\xff]", data, start), by memchr over the data: a few microseconds per
 * photo where the regular expression takes tens, all of it holding the GIL in the thread that calls convert.
 *
 * stream_end(data, width, height, components, progressive_ok) -> int: where the end-of-image marker ends, in a
 * whole JPEG every one of whose marker segments, from the start-of-image marker to the end-of-image marker, passes
 * each check libjpeg-turbo makes of it before and while it decodes rows (jdmarker.c as it reads each segment;
 * jdinput.c, jdhuff.c and jdphuff.c at the start of each scan; jdsample.c as decoding starts); else 0, also where a
 * check cannot decide. Conservative by design: 0 only means "let PIL's decoder run now, at stock's moment", so
 * whatever libjpeg merely warns about, or what this code does not model, answers 0 rather than being modelled:
 *
 *   - the markers: SOI first; then only APPn, COM, DQT, DHT, DRI, one SOF0/SOF1/SOF2, SOS and EOI, each right after
 *     the one before (fill bytes allowed), each segment's length within the data and fully used;
 *   - DQT: 8-bit tables (precision 0), table ids 0-3, 64 entries each;
 *   - DHT: classes 0 (DC) and 1 (AC), ids 0-3; counts at most 256 and within the segment; at least one code; a legal
 *     code tree (no code of all ones: jdhuff.c's Figure C.2 check); a DC table's symbols at most 15;
 *   - SOF: 8-bit precision, the size and component count the caller expects (PIL's), at most 65500 a side,
 *     distinct component ids, sampling factors 1-4 that upsample by whole ratios, quantization table ids 0-3;
 *   - DRI: length 4;
 *   - SOS: after the SOF, 1-4 components named in frame order among the frame's first four, each with the
 *     quantization table it latches already defined, at most 10 blocks in an interleaved MCU; a second scan only
 *     where the first did not hold every component or the frame is progressive; sequential scans with Ss=0, Se=63,
 *     Ah=Al=0 and both their Huffman tables defined (libjpeg's standard tables for missing ones are not relied on);
 *     progressive scans with a legal band (DC: Se=0; AC: Ss<=Se<=63, one component), Al=Ah-1 for refinements,
 *     Al<=13, and the table the scan decodes with defined; and no progressive DC scan long enough (more than 65535
 *     blocks of a component between restarts) that its DC sum could reach jdphuff.c's overflow error;
 *   - the entropy-coded data after each scan ends at a marker (else the stream is truncated).
 */
#include <Python.h>
#include <string.h>

static Py_ssize_t find_marker(const unsigned char *data, Py_ssize_t n, Py_ssize_t start) {
    if (start < 0)
        start = 0;
    Py_ssize_t i = start;
    while (i + 1 < n) {
        const unsigned char *p = memchr(data + i, 0xFF, (size_t)(n - 1 - i));
        if (p == NULL)
            break;
        Py_ssize_t at = p - data;
        unsigned char next = data[at + 1];
        if (next != 0x00 && next != 0xFF && !(next >= 0xD0 && next <= 0xD7))
            return at;
        i = at + 1;
    }
    return -1;
}

static PyObject *py_marker_after(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &start))
        return NULL;
    Py_ssize_t found = find_marker((const unsigned char *)buf.buf, buf.len, start);
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(found);
}

enum { TABLES = 4, MAX_SIDE = 65500, MAX_SAMP = 4, MAX_SCAN_COMPS = 4, MAX_MCU_BLOCKS = 10,
       MAX_DC_BLOCKS = 65535 };

typedef struct {
    int width, height, components, progressive_ok;
    int saw_sof, progressive, nc, scans, multiple_scans, restart_interval;
    int id[MAX_SCAN_COMPS], h[MAX_SCAN_COMPS], v[MAX_SCAN_COMPS], tq[MAX_SCAN_COMPS], latched[MAX_SCAN_COMPS];
    int max_h, max_v;
    int quant[TABLES], dc[TABLES], ac[TABLES];
} stream;

/* One DHT table: a legal code tree (jdhuff.c's jpeg_make_d_derived_tbl, Figures C.1 and C.2), with DC symbols of
 * at most 15; at least one code (an empty table decodes nothing: not modelled). */
static int huffman_table_ok(const unsigned char *bits, const unsigned char *vals, int count, int is_dc) {
    if (count < 1)
        return 0;
    /* libjpeg's own walk: codes of one length numbered on, each length's last code below all ones */
    long code = 0;
    int si = 0, p = 0, sizes[257];
    for (int length = 1; length <= 16; length++)
        for (int k = 0; k < bits[length - 1]; k++)
            sizes[p++] = length;
    sizes[p] = 0;
    si = sizes[0];
    p = 0;
    while (sizes[p]) {
        while (sizes[p] == si) {
            p++;
            code++;
        }
        if (code >= (1L << si))
            return 0;
        code <<= 1;
        si++;
    }
    if (is_dc)
        for (int k = 0; k < count; k++)
            if (vals[k] > 15)
                return 0;
    return 1;
}

static int dht_ok(stream *s, const unsigned char *seg, long length) {
    while (length > 16) {
        int index = seg[0];
        const unsigned char *bits = seg + 1;
        int count = 0;
        for (int k = 0; k < 16; k++)
            count += bits[k];
        length -= 17;
        if (count > 256 || count > length)
            return 0;
        int is_dc = !(index & 0x10), id = index & ~0x10;
        if (id < 0 || id >= TABLES || !huffman_table_ok(bits, seg + 17, count, is_dc))
            return 0;
        (is_dc ? s->dc : s->ac)[id] = 1;
        seg += 17 + count;
        length -= count;
    }
    return length == 0;
}

static int dqt_ok(stream *s, const unsigned char *seg, long length) {
    while (length > 0) {
        int precision = seg[0] >> 4, id = seg[0] & 15;
        if (precision != 0 || id >= TABLES || length < 65)
            return 0;
        s->quant[id] = 1;
        seg += 65;
        length -= 65;
    }
    return length == 0;
}

static int sof_ok(stream *s, const unsigned char *seg, long length, int code) {
    if (s->saw_sof || length < 6)
        return 0;
    int precision = seg[0], height = (seg[1] << 8) | seg[2], width = (seg[3] << 8) | seg[4], nc = seg[5];
    if (precision != 8 || height != s->height || width != s->width || nc != s->components || nc < 1 ||
        nc > MAX_SCAN_COMPS || height < 1 || width < 1 || height > MAX_SIDE || width > MAX_SIDE ||
        length != 6 + 3L * nc)
        return 0;
    s->nc = nc;
    s->max_h = s->max_v = 1;
    for (int c = 0; c < nc; c++) {
        const unsigned char *comp = seg + 6 + 3 * c;
        s->id[c] = comp[0];
        s->h[c] = comp[1] >> 4;
        s->v[c] = comp[1] & 15;
        s->tq[c] = comp[2];
        s->latched[c] = 0;
        if (s->h[c] < 1 || s->h[c] > MAX_SAMP || s->v[c] < 1 || s->v[c] > MAX_SAMP || s->tq[c] >= TABLES)
            return 0;
        for (int d = 0; d < c; d++)
            if (s->id[d] == s->id[c])
                return 0;
        if (s->h[c] > s->max_h)
            s->max_h = s->h[c];
        if (s->v[c] > s->max_v)
            s->max_v = s->v[c];
    }
    for (int c = 0; c < nc; c++) /* jdsample.c upsamples by whole ratios only */
        if (s->max_h % s->h[c] || s->max_v % s->v[c])
            return 0;
    s->saw_sof = 1;
    s->progressive = code == 0xC2;
    return !s->progressive || s->progressive_ok;
}

static long ceil_div(long a, long b) { return (a + b - 1) / b; }

static int sos_ok(stream *s, const unsigned char *seg, long length) {
    if (!s->saw_sof || length < 1)
        return 0;
    int ns = seg[0];
    if (ns < 1 || ns > MAX_SCAN_COMPS || length != 4 + 2L * ns)
        return 0;
    int comps[MAX_SCAN_COMPS], td[MAX_SCAN_COMPS], ta[MAX_SCAN_COMPS], last = -1, blocks = 0;
    int limit = s->nc < MAX_SCAN_COMPS ? s->nc : MAX_SCAN_COMPS;
    for (int k = 0; k < ns; k++) {
        int id = seg[1 + 2 * k], tables = seg[2 + 2 * k], found = -1;
        for (int c = 0; c < limit; c++)
            if (s->id[c] == id)
                found = c;
        if (found <= last) /* not in the frame, repeated, or out of frame order */
            return 0;
        last = comps[k] = found;
        td[k] = tables >> 4;
        ta[k] = tables & 15;
        blocks += s->h[found] * s->v[found];
    }
    int ss = seg[1 + 2 * ns], se = seg[2 + 2 * ns], ah = seg[3 + 2 * ns] >> 4, al = seg[3 + 2 * ns] & 15;
    if (s->scans > 0 && !s->multiple_scans)
        return 0; /* jdinput.c: another scan where the first held everything (JERR_EOI_EXPECTED) */
    if (s->scans == 0)
        s->multiple_scans = ns < s->nc || s->progressive;
    if (ns > 1 && blocks > MAX_MCU_BLOCKS)
        return 0;
    for (int k = 0; k < ns; k++) { /* jdinput.c: the quantization table latched at a component's first scan */
        int c = comps[k];
        if (!s->latched[c]) {
            if (!s->quant[s->tq[c]])
                return 0;
            s->latched[c] = 1;
        }
    }
    if (!s->progressive) {
        if (ss != 0 || se != 63 || ah != 0 || al != 0)
            return 0;
        for (int k = 0; k < ns; k++)
            if (td[k] >= TABLES || ta[k] >= TABLES || !s->dc[td[k]] || !s->ac[ta[k]])
                return 0;
    } else {
        int dc_band = ss == 0;
        if (dc_band ? se != 0 : (ss > se || se > 63 || ns != 1))
            return 0;
        if ((ah != 0 && al != ah - 1) || al > 13)
            return 0;
        for (int k = 0; k < ns; k++) {
            if (dc_band && ah == 0 && (td[k] >= TABLES || !s->dc[td[k]]))
                return 0;
            if (!dc_band && (ta[k] >= TABLES || !s->ac[ta[k]]))
                return 0;
        }
        if (dc_band && ah == 0) { /* jdphuff.c: a DC sum that could pass INT_MAX raises JERR_BAD_DCT_COEF */
            long mcus = ceil_div(s->width, 8L * s->max_h) * ceil_div(s->height, 8L * s->max_v);
            for (int k = 0; k < ns; k++) {
                int c = comps[k];
                long per_mcu = (long)s->h[c] * s->v[c];
                long run = mcus * per_mcu;
                if (s->restart_interval > 0 && (long)s->restart_interval * per_mcu < run)
                    run = (long)s->restart_interval * per_mcu;
                if (run > MAX_DC_BLOCKS)
                    return 0;
            }
        }
    }
    s->scans++;
    return 1;
}

static Py_ssize_t check_stream(stream *s, const unsigned char *d, Py_ssize_t n) {
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8)
        return 0;
    Py_ssize_t i = 2;
    for (;;) {
        if (i + 2 > n || d[i] != 0xFF)
            return 0;
        while (d[i + 1] == 0xFF) /* fill bytes before a marker */
            if (++i + 2 > n)
                return 0;
        int code = d[i + 1];
        if (code == 0xD9)
            return s->scans > 0 ? i + 2 : 0;
        if (i + 4 > n)
            return 0;
        long length = ((long)d[i + 2] << 8) | d[i + 3];
        if (length < 2 || i + 2 + length > n)
            return 0;
        const unsigned char *seg = d + i + 4;
        long left = length - 2;
        int ok;
        if ((code >= 0xE0 && code <= 0xEF) || code == 0xFE)
            ok = 1;
        else if (code == 0xDB)
            ok = dqt_ok(s, seg, left);
        else if (code == 0xC4)
            ok = dht_ok(s, seg, left);
        else if (code == 0xDD) {
            ok = length == 4;
            if (ok)
                s->restart_interval = (seg[0] << 8) | seg[1];
        } else if (code == 0xC0 || code == 0xC1 || code == 0xC2)
            ok = sof_ok(s, seg, left, code);
        else if (code == 0xDA)
            ok = sos_ok(s, seg, left);
        else
            ok = 0; /* a marker libjpeg rejects, warns of or ignores: not modelled */
        if (!ok)
            return 0;
        i += 2 + length;
        if (code == 0xDA) { /* the entropy-coded data, to the next marker */
            i = find_marker(d, n, i);
            if (i < 0)
                return 0;
        }
    }
}

static PyObject *py_stream_end(PyObject *self, PyObject *args) {
    Py_buffer buf;
    stream s;
    (void)self;
    memset(&s, 0, sizeof(s));
    if (!PyArg_ParseTuple(args, "y*iiip", &buf, &s.width, &s.height, &s.components, &s.progressive_ok))
        return NULL;
    Py_ssize_t end;
    Py_BEGIN_ALLOW_THREADS
    end = check_stream(&s, (const unsigned char *)buf.buf, buf.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(end);
}

PyMethodDef nano_marker_methods[] = {
    {"marker_after", py_marker_after, METH_VARARGS,
     "marker_after(data, start) -> int: the first JPEG marker at or after start in entropy-coded data, or -1."},
    {"stream_end", py_stream_end, METH_VARARGS,
     "stream_end(data, width, height, components, progressive_ok) -> int: where a whole JPEG's end-of-image "
     "marker ends, where every marker segment passes libjpeg-turbo's checks; else 0."},
    {NULL, NULL, 0, NULL},
};
