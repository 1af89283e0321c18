/* C accelerator for streamrec.format.framing: scan TFRecord frames out of one buffer.
 *
 * scan(buffer, start, verify, large_crc, large_threshold)
 *     -> (records: list[bytes], pos: int, status: int, stored: int, computed: int)
 *
 * Parses complete records from buffer[start:], verifying both masked CRC32Cs when `verify`.
 * It stops at the first record that is incomplete (status 0, `pos` = its header offset) or
 * damaged (status 1: bad length CRC, status 2: bad payload CRC; `pos` = its header offset,
 * `stored` / `computed` the masked CRCs).  Payloads of at least `large_threshold` bytes are
 * copied into their record and checked there in cache-sized steps (copy_crc: the CRC reads
 * what the copy just wrote) with the hardware CRC run as three interleaved streams (or, on
 * CPUs with VPCLMULQDQ, folded 256 bytes at a time by carry-less multiplies: crc32c_fold);
 * without SSE4.2 they are checksummed by `large_crc(memoryview)` (the crc32c package) instead.
 *
 * new_payload(n) / fill(payload, at, data, crc, verify): a record assembled from several
 * chunks is copied into its final bytes object piece by piece, the CRC fused with each copy.
 *
 * The capsule `crc32c` hands the CRC kernel to streamrec.storage._cread, which reads a local
 * shard's large records straight into their bytes objects and checks them with it.
 *
 * The pure-Python twin in framing.py has the same contract; the tests run both.
 * No I/O; the GIL is held throughout (every record becomes a Python object).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MASK_DELTA 0xa282ead8u

static uint32_t crc_table[8][256];

static void init_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

/* Software CRC32C, slicing-by-8 (little-endian loads assembled bytewise: portable). */
static uint32_t crc32c_sw(uint32_t crc, const unsigned char *p, size_t n) {
    uint32_t c = ~crc;
    while (n >= 8) {
        uint32_t lo = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                      ((uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | ((uint32_t)p[5] << 8) | ((uint32_t)p[6] << 16) |
                      ((uint32_t)p[7] << 24);
        lo ^= c;
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p,
                                                            size_t n) {
    uint64_t c = (uint32_t)~crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

/* GF(2) arithmetic modulo the CRC32C polynomial (reflected), as zlib's crc32_combine:
 * crc(A || B) = multmodp(x^(8 |B|), crc(A)) ^ crc(B). */
#define POLY 0x82f63b78u
static uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

static uint32_t x2n_table[32];

static void init_x2n(void) {
    uint32_t p = (uint32_t)1 << 30; /* x^1 */
    x2n_table[0] = p;
    for (int n = 1; n < 32; n++) x2n_table[n] = p = multmodp(p, p);
}

/* x^(8 n) modulo the polynomial: the operator that moves a CRC past n zero bytes. */
static uint32_t shift_bytes(size_t n) {
    uint32_t p = (uint32_t)1 << 31; /* x^0 */
    unsigned k = 3;
    while (n) {
        if (n & 1) p = multmodp(x2n_table[k & 31], p);
        n >>= 1;
        k++;
    }
    return p;
}

/* Lanes of the three-stream hardware CRC: long ones for large payloads, short ones for
 * records of a few hundred bytes and more, tiny ones for what is left of them (a 1 KiB
 * record: 3 short lanes, 3 tiny, 64 bytes on one stream, not 256: 202 -> ~165 cycles), and
 * for each the shift past one lane as four byte tables (the operator is linear: shifting a
 * CRC is four lookups, not a multiply). */
#define LANE_BYTES 8192
#define SHORT_LANE_BYTES 256
#define TINY_LANE_BYTES 64
static uint32_t long_shift[4][256], short_shift[4][256], tiny_shift[4][256];

static void init_shift(uint32_t table[4][256], size_t lane_bytes) {
    uint32_t op = shift_bytes(lane_bytes);
    for (unsigned k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) table[k][b] = multmodp(op, b << (8 * k));
}

static inline uint32_t shift_crc(uint32_t table[4][256], uint32_t c) {
    return table[0][c & 0xff] ^ table[1][(c >> 8) & 0xff] ^ table[2][(c >> 16) & 0xff] ^
           table[3][c >> 24];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Three independent streams over three consecutive lanes hide the instruction's latency
 * (~3x one stream); their CRCs are joined as crc(A || B || C). */
#define CRC_LANES(lane, table)                                                              \
    while (n >= 3 * (lane)) {                                                               \
        uint64_t a = (uint32_t)~crc, b = 0xffffffffu, c = 0xffffffffu;                      \
        const unsigned char *pb = p + (lane), *pc = p + 2 * (lane);                         \
        for (size_t i = 0; i < (lane); i += 8) {                                            \
            uint64_t va, vb, vc;                                                            \
            memcpy(&va, p + i, 8);                                                          \
            memcpy(&vb, pb + i, 8);                                                         \
            memcpy(&vc, pc + i, 8);                                                         \
            a = _mm_crc32_u64(a, va);                                                       \
            b = _mm_crc32_u64(b, vb);                                                       \
            c = _mm_crc32_u64(c, vc);                                                       \
        }                                                                                   \
        uint32_t ca = ~(uint32_t)a, cb = ~(uint32_t)b, cc = ~(uint32_t)c;                   \
        crc = shift_crc(table, shift_crc(table, ca) ^ cb) ^ cc;                             \
        p += 3 * (lane);                                                                    \
        n -= 3 * (lane);                                                                    \
    }

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw3(uint32_t crc, const unsigned char *p,
                                                             size_t n) {
    CRC_LANES(LANE_BYTES, long_shift)
    CRC_LANES(SHORT_LANE_BYTES, short_shift)
    CRC_LANES(TINY_LANE_BYTES, tiny_shift)
    return crc32c_hw(crc, p, n);
}
#endif

#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 10))
#include <immintrin.h>
#define HAVE_FOLD_CRC 1
/* Folding with carry-less multiplies (VPCLMULQDQ, 512 bits at a time): ~4x the three-stream
 * CRC instruction's 8 bytes a cycle, so the CRC pass costs about what reading the bytes does.
 * The bytes so far stand for a 16-byte lane A = H x^64 + L (H: its first 8 bytes; reflected:
 * the first byte holds the highest powers); moving A d bytes further is
 * H x^(8d + 64) + L x^(8d) mod P, two 64 x 32-bit products (the reflected product comes out
 * 33 bits low, so the constants are x^(8d + 31) and x^(8d - 33) mod P). What is left at the
 * end is one lane, whose CRC the CRC instruction finishes. */
#define FOLD_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))
#define FOLD_MIN_BYTES 256
/* (x^(8d + 31), x^(8d - 33)) mod P, reflected, for d = 256, 192, 128, 64, 48, 32, 16 */
static uint64_t fold_k[7][2];
static const unsigned fold_d[7] = {256, 192, 128, 64, 48, 32, 16};

static uint32_t x_pow(uint64_t k) { /* x^k mod P */
    uint32_t p = (uint32_t)1 << 31; /* x^0 */
    for (unsigned i = 0; k; k >>= 1, i++)
        if (k & 1) p = multmodp(x2n_table[i & 31], p);
    return p;
}

static void init_fold(void) {
    for (int i = 0; i < 7; i++) {
        fold_k[i][0] = x_pow(8 * (uint64_t)fold_d[i] + 31);
        fold_k[i][1] = x_pow(8 * (uint64_t)fold_d[i] - 33);
    }
}

FOLD_TARGET static inline __m512i fold512(__m512i a, __m512i k, __m512i b) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                     _mm512_clmulepi64_epi128(a, k, 0x11), b, 0x96);
}

FOLD_TARGET static inline __m128i fold128(__m128i a, int which, __m128i b) {
    __m128i k = _mm_loadu_si128((const __m128i *)fold_k[which]);
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00),
                                       _mm_clmulepi64_si128(a, k, 0x11)), b);
}

FOLD_TARGET static uint32_t crc32c_fold(uint32_t crc, const unsigned char *p, size_t n) {
    if (n < FOLD_MIN_BYTES) return crc32c_hw3(crc, p, n);
#define K512(i) _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)fold_k[i]))
    __m512i a0 = _mm512_loadu_si512((const void *)p), a1 = _mm512_loadu_si512((const void *)(p + 64)),
            a2 = _mm512_loadu_si512((const void *)(p + 128)),
            a3 = _mm512_loadu_si512((const void *)(p + 192));
    /* the register goes into the first 4 bytes; from there on it is 0 */
    a0 = _mm512_xor_si512(a0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)~crc)));
    p += 256;
    n -= 256;
    const __m512i k256 = K512(0);
    while (n >= 256) {
        a0 = fold512(a0, k256, _mm512_loadu_si512((const void *)p));
        a1 = fold512(a1, k256, _mm512_loadu_si512((const void *)(p + 64)));
        a2 = fold512(a2, k256, _mm512_loadu_si512((const void *)(p + 128)));
        a3 = fold512(a3, k256, _mm512_loadu_si512((const void *)(p + 192)));
        p += 256;
        n -= 256;
    }
    __m512i z = _mm512_xor_si512(fold512(a0, K512(1), a3),
                                 fold512(a1, K512(2), fold512(a2, K512(3), _mm512_setzero_si512())));
    const __m512i k64 = K512(3);
    while (n >= 64) {
        z = fold512(z, k64, _mm512_loadu_si512((const void *)p));
        p += 64;
        n -= 64;
    }
#undef K512
    __m128i x = fold128(_mm512_extracti32x4_epi32(z, 0), 4, _mm512_extracti32x4_epi32(z, 3));
    x = _mm_xor_si128(x, fold128(_mm512_extracti32x4_epi32(z, 1), 5, _mm_setzero_si128()));
    x = fold128(_mm512_extracti32x4_epi32(z, 2), 6, x);
    while (n >= 16) {
        x = fold128(x, 6, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
    return crc32c_hw(~(uint32_t)c, p, n);
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);
static crc_fn crc32c_impl = crc32c_sw;

static inline uint32_t masked_crc(const unsigned char *p, size_t n) {
    uint32_t c = crc32c_impl(0, p, n);
    return ((c >> 15) | (c << 17)) + MASK_DELTA;
}

static inline uint64_t load_u64le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t load_u32le(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* Masked CRC of a large payload through the Python callable; -1 on a Python error. */
static int64_t masked_crc_large(PyObject *large_crc, const unsigned char *p, Py_ssize_t n) {
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) return -1;
    PyObject *res = PyObject_CallOneArg(large_crc, view);
    Py_DECREF(view);
    if (res == NULL) return -1;
    unsigned long c = PyLong_AsUnsignedLong(res);
    Py_DECREF(res);
    if (c == (unsigned long)-1 && PyErr_Occurred()) return -1;
    uint32_t c32 = (uint32_t)c;
    return (int64_t)(uint32_t)(((c32 >> 15) | (c32 << 17)) + MASK_DELTA);
}

/* Append one int64 to a growable buffer (lengths mode). */
static int push_length(int64_t **out, Py_ssize_t *count, Py_ssize_t *cap, int64_t value) {
    if (*count == *cap) {
        Py_ssize_t grown = *cap ? *cap * 2 : 1024;
        int64_t *bigger = PyMem_Realloc(*out, (size_t)grown * sizeof(int64_t));
        if (bigger == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *out = bigger;
        *cap = grown;
    }
    (*out)[(*count)++] = value;
    return 0;
}

/* Copy n bytes to dst, continuing the (unmasked) CRC32C `crc` over them when `verify`: in
 * steps small enough that each step's CRC reads what the copy just left in the cache. */
#define STEP_BYTES (96 * 1024)
static uint32_t copy_crc(unsigned char *dst, const unsigned char *src, size_t n, uint32_t crc,
                         int verify) {
    while (n) {
        size_t step = n < STEP_BYTES ? n : STEP_BYTES;
        memcpy(dst, src, step);
        if (verify) crc = crc32c_impl(crc, dst, step);
        dst += step;
        src += step;
        n -= step;
    }
    return crc;
}

/* scan(buf, start, verify, large_crc, large_threshold[, lengths_only]):
 * (records, pos, status, stored, computed). With lengths_only, records is a bytes object of
 * the payload lengths as native int64 instead of a list of payloads: the same checks, no
 * payload copied (what a record index needs). lengths_only=2 ("spans"): the same, as native
 * int64 (payload offset in buf, length) pairs: the records stay in buf, where a batch
 * decoder reads them (no bytes object per record). lengths_only=3: (0, offset, length)
 * triples, the rows of a RecordSpans over buf alone, used as they are (not copied into a
 * wider array: that copy cost ~6 % of parse().batch()'s CPU at 1 KiB records). */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, large_threshold;
    int verify, lengths_only = 0;
    PyObject *large_crc;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*npOn|i", &view, &start, &verify, &large_crc,
                          &large_threshold, &lengths_only))
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = start < 0 ? 0 : start;
    int status = 0;
    uint32_t stored = 0, computed = 0;
    PyObject *records = NULL;
    int64_t *lengths = NULL;
    Py_ssize_t count = 0, cap = 0;
    if (!lengths_only) {
        records = PyList_New(0);
        if (records == NULL) goto fail;
    }

    while (end - pos >= 12) {
        const unsigned char *h = buf + pos;
        uint64_t length = load_u64le(h);
        if (verify) {
            uint32_t want = load_u32le(h + 8);
            uint32_t got = masked_crc(h, 8);
            if (want != got) {
                status = 1;
                stored = want;
                computed = got;
                break;
            }
        }
        /* Compare without overflow: the length is untrusted when CRCs are off. */
        if (length > (uint64_t)(end - pos - 16) || end - pos < 16) break;
        const unsigned char *payload = h + 12;
        Py_ssize_t n = (Py_ssize_t)length;
        if (!lengths_only && n >= large_threshold && crc32c_impl != crc32c_sw) {
            /* Copied into the record and checked there in cache-sized steps: one pass over
             * the source, the CRC reads what was just written (still in cache). */
            PyObject *rec = PyBytes_FromStringAndSize(NULL, n);
            if (rec == NULL) goto fail;
            uint32_t c = copy_crc((unsigned char *)PyBytes_AS_STRING(rec), payload, (size_t)n, 0,
                                  verify);
            if (verify) {
                uint32_t want = load_u32le(payload + n);
                uint32_t got = ((c >> 15) | (c << 17)) + MASK_DELTA;
                if (want != got) {
                    Py_DECREF(rec);
                    status = 2;
                    stored = want;
                    computed = got;
                    break;
                }
            }
            if (PyList_Append(records, rec) < 0) {
                Py_DECREF(rec);
                goto fail;
            }
            Py_DECREF(rec);
            pos += 16 + n;
            continue;
        }
        if (verify) {
            uint32_t want = load_u32le(payload + n);
            uint32_t got;
            if (n >= large_threshold && large_crc != Py_None) {
                int64_t r = masked_crc_large(large_crc, payload, n);
                if (r < 0) goto fail;
                got = (uint32_t)r;
            } else {
                got = masked_crc(payload, (size_t)n);
            }
            if (want != got) {
                status = 2;
                stored = want;
                computed = got;
                break;
            }
        }
        if (lengths_only) {
            if (lengths_only == 3 && push_length(&lengths, &count, &cap, 0) < 0) goto fail;
            if (lengths_only >= 2 && push_length(&lengths, &count, &cap, (int64_t)pos + 12) < 0)
                goto fail;
            if (push_length(&lengths, &count, &cap, (int64_t)n) < 0) goto fail;
        } else {
            PyObject *rec = PyBytes_FromStringAndSize((const char *)payload, n);
            if (rec == NULL) goto fail;
            if (PyList_Append(records, rec) < 0) {
                Py_DECREF(rec);
                goto fail;
            }
            Py_DECREF(rec);
        }
        pos += 16 + n;
    }
    PyBuffer_Release(&view);
    if (lengths_only) {
        records = PyBytes_FromStringAndSize((const char *)lengths, count * (Py_ssize_t)sizeof(int64_t));
        PyMem_Free(lengths);
        if (records == NULL) return NULL;
    }
    return Py_BuildValue("(NniII)", records, pos, status, (unsigned int)stored,
                         (unsigned int)computed);
fail:
    Py_XDECREF(records);
    PyMem_Free(lengths);
    PyBuffer_Release(&view);
    return NULL;
}

/* One decimal number, as str(int) writes it; returns the bytes written (at most 20). */
static Py_ssize_t put_int(char *out, int64_t value) {
    char digits[20];
    Py_ssize_t k = 0, at = 0;
    uint64_t u = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    do {
        digits[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (value < 0) out[at++] = '-';
    while (k) out[at++] = digits[--k];
    return at;
}

/* index_text(column, ...): the lines of a record index sidecar: row i is the i-th int64 of
 * every column (buffers of native int64, equally long), separated by spaces, ended by a
 * newline - what "".join(" ".join(map(str, row)) + "\n" for row in rows) gives. */
static PyObject *index_text(PyObject *self, PyObject *args) {
    enum { MAX_COLUMNS = 8 };
    Py_buffer views[MAX_COLUMNS];
    Py_ssize_t ncols = PyTuple_GET_SIZE(args), got = 0, rows = 0;
    PyObject *result = NULL;
    (void)self;
    if (ncols < 1 || ncols > MAX_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "index_text takes 1 to 8 columns");
        return NULL;
    }
    for (; got < ncols; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, got), &views[got], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        Py_ssize_t n = views[got].len / (Py_ssize_t)sizeof(int64_t);
        if (views[got].len % (Py_ssize_t)sizeof(int64_t) || (got && n != rows)) {
            PyErr_SetString(PyExc_ValueError, "columns must be equally long int64 buffers");
            got++;
            goto done;
        }
        rows = n;
    }
    if (rows > PY_SSIZE_T_MAX / (21 * ncols)) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, rows * 21 * ncols);
    if (result == NULL) goto done;
    char *out = PyBytes_AS_STRING(result);
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < rows; i++) {
        for (Py_ssize_t c = 0; c < ncols; c++) {
            int64_t v;
            memcpy(&v, (const char *)views[c].buf + i * (Py_ssize_t)sizeof(int64_t), sizeof v);
            at += put_int(out + at, v);
            out[at++] = c + 1 < ncols ? ' ' : '\n';
        }
    }
    if (_PyBytes_Resize(&result, at) < 0) result = NULL;
done:
    for (Py_ssize_t c = 0; c < got; c++) PyBuffer_Release(&views[c]);
    return result;
}

/* new_payload(n) -> bytes: an uninitialised bytes object of n bytes for fill() to write. */
static PyObject *py_new_payload(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative length");
        return NULL;
    }
    return PyBytes_FromStringAndSize(NULL, n);
}

/* fill(payload, at, data, crc, verify) -> crc: copy data into payload[at:] (a bytes object
 * from new_payload() that nobody else has seen yet), continuing the unmasked CRC32C `crc`
 * over the bytes copied (when verify), fused with the copy. */
static PyObject *py_fill(PyObject *self, PyObject *args) {
    PyObject *payload;
    Py_ssize_t at;
    Py_buffer data;
    unsigned long crc;
    int verify;
    (void)self;
    if (!PyArg_ParseTuple(args, "Sny*kp", &payload, &at, &data, &crc, &verify)) return NULL;
    if (at < 0 || data.len > PyBytes_GET_SIZE(payload) - at) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "fill() past the end of the payload");
        return NULL;
    }
    uint32_t c = (uint32_t)crc;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(payload) + at;
    if (data.len >= (1 << 20)) {
        Py_BEGIN_ALLOW_THREADS
        c = copy_crc(dst, (const unsigned char *)data.buf, (size_t)data.len, c, verify);
        Py_END_ALLOW_THREADS
    } else {
        c = copy_crc(dst, (const unsigned char *)data.buf, (size_t)data.len, c, verify);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_masked_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer view;
    (void)self;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = masked_crc((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* framed_bytes(records): the bytes the records take framed (payload + 16 each), for a list
 * of bytes objects in C (a Take event per chunk: sum(map(len, ...)) was ~20 ns a record). */
static PyObject *py_framed_bytes(PyObject *self, PyObject *records) {
    (void)self;
    PyObject *seq = PySequence_Fast(records, "framed_bytes() needs a sequence of payloads");
    if (seq == NULL) return NULL;
    Py_ssize_t total = 0;
    /* the size and items read again each step: another object's __len__ may change a list */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t size;
        if (PyBytes_CheckExact(item)) {
            size = PyBytes_GET_SIZE(item);
        } else {
            Py_INCREF(item);
            size = PyObject_Size(item);
            Py_DECREF(item);
            if (size < 0) {
                Py_DECREF(seq);
                return NULL;
            }
        }
        total += size + 16;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(total);
}

/* crc32c_kernels(data) -> tuple: the unmasked CRC32C of data by every kernel this CPU can run
 * (software, then the three-stream CRC instruction, then the folding one): the tests hold each
 * to the others, not only the one picked. */
static PyObject *py_crc32c_kernels(PyObject *self, PyObject *arg) {
    Py_buffer view;
    uint32_t got[3];
    Py_ssize_t k = 0;
    (void)self;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    got[k++] = crc32c_sw(0, p, (size_t)view.len);
#ifdef HAVE_HW_CRC
    if (__builtin_cpu_supports("sse4.2")) got[k++] = crc32c_hw3(0, p, (size_t)view.len);
#endif
#ifdef HAVE_FOLD_CRC
    if (crc32c_impl == crc32c_fold) got[k++] = crc32c_fold(0, p, (size_t)view.len);
#endif
    PyBuffer_Release(&view);
    PyObject *out = PyTuple_New(k);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *v = PyLong_FromUnsignedLong(got[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *py_has_hardware_crc(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(crc32c_impl != crc32c_sw);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Scan complete TFRecord frames out of a buffer."},
    {"index_text", index_text, METH_VARARGS, "The text lines of a record index's columns."},
    {"new_payload", py_new_payload, METH_O, "An uninitialised bytes object for fill()."},
    {"fill", py_fill, METH_VARARGS, "Copy into a new payload, CRC32C fused with the copy."},
    {"masked_crc32c", py_masked_crc32c, METH_O, "TFRecord's masked CRC32C of a buffer."},
    {"framed_bytes", py_framed_bytes, METH_O, "Bytes the payloads take framed (16 more each)."},
    {"has_hardware_crc", py_has_hardware_crc, METH_NOARGS, "True when SSE4.2 CRC32 is used."},
    {"crc32c_kernels", py_crc32c_kernels, METH_O, "CRC32C by every kernel this CPU runs."},
    {NULL, NULL, 0, NULL},
};

/* The CRC32C kernel (unmasked, continued from crc) for other C extensions: streamrec.storage's
 * _cread checks the records it reads with it (PyCapsule "streamrec.format._cframing.crc32c"). */
static uint32_t crc32c_exported(uint32_t crc, const unsigned char *p, size_t n) {
    return crc32c_impl(crc, p, n);
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cframing", "C accelerator for TFRecord framing.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cframing(void) {
    init_tables();
    init_x2n();
    init_shift(long_shift, LANE_BYTES);
    init_shift(short_shift, SHORT_LANE_BYTES);
    init_shift(tiny_shift, TINY_LANE_BYTES);
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) crc32c_impl = crc32c_hw3;
#ifdef HAVE_FOLD_CRC
    init_fold();
    if (__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("vpclmulqdq"))
        crc32c_impl = crc32c_fold;
#endif
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *capsule =
        PyCapsule_New((void *)crc32c_exported, "streamrec.format._cframing.crc32c", NULL);
    if (capsule == NULL || PyModule_AddObject(m, "crc32c", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
