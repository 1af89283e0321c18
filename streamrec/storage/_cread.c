/* C reads of a local shard's large records straight into their final bytes objects.
 *
 * walk(fd, offset, end, min_record_bytes, max_records, max_bytes)
 *     -> (plans: bytes, offset: int, status: int)
 *   Reads 12-byte record headers from `offset` on, hopping from record to record, and lists
 *   (header offset, payload length) as native int64 pairs. It stops at the object's end
 *   (status 1: `offset` == end), at a header that is not a clean large record (status 2: its
 *   length CRC fails, it is shorter than min_record_bytes with framing, it claims more than
 *   the object holds, or the file is short), after max_records records or once max_bytes
 *   are listed (status 0). An OSError is raised for a failed read; MemoryError when the
 *   plans of max_records records (as many as fit between offset and end) cannot be held.
 *
 * read(fd, offset, payloads, verify, step, stop) -> (complete: int, clean: int)
 *   `payloads` are fresh bytes objects (streamrec.format._cframing.new_payload) of the
 *   consecutive records whose first header is at `offset`: each payload is read by pread
 *   straight into its object in `step`-byte steps, the CRC32C of each step computed right
 *   after it was read (still in the cache), then its footer and the next header. `complete`:
 *   records fully read; `clean`: records before the first whose CRC does not match. `stop`,
 *   a bytearray, is polled between steps (non-zero: give up). OSError on a failed read.
 *
 * Receiver(n, kept=None, max_kept=0): a bytes object of n bytes (`payload`, uninitialised)
 *   behind a writable buffer: a network read lands straight in the bytes it is handed out as
 *   (streamrec.storage.http.range_get). Nobody may see `payload` before it is filled and every
 *   view of the receiver is released. With `kept` (a list), a bytes object of n bytes in it
 *   that nothing but the list refers to is filled again instead of a fresh one (fresh
 *   megabytes from malloc are often fresh pages: a page fault per 4 KiB); a fresh one is
 *   added to the list while it holds fewer than `max_kept`.
 *
 * walk and read run with the GIL released. The CRC kernel is the format core's (its capsule): this
 * module does the I/O, the format core the checking.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define MASK_DELTA 0xa282ead8u
#define HEADER_BYTES 12
#define FOOTER_BYTES 4

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);
static crc_fn crc32c;

static inline uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + MASK_DELTA; }

static inline uint64_t load_u64le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t load_u32le(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* Read exactly n bytes at offset (fewer only at the end of the file); -1 with errno set. */
static Py_ssize_t read_full(int fd, unsigned char *dst, size_t n, int64_t offset) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, dst + done, n - done, (off_t)(offset + (int64_t)done));
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (got == 0) break;
        done += (size_t)got;
    }
    return (Py_ssize_t)done;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    int fd;
    long long offset, end, min_record_bytes, max_bytes;
    Py_ssize_t max_records;
    (void)self;
    if (!PyArg_ParseTuple(args, "iLLLnL", &fd, &offset, &end, &min_record_bytes, &max_records,
                          &max_bytes))
        return NULL;
    if (max_records < 1) max_records = 1;
    /* No more records fit between offset and end than records of the smallest size listed:
     * plans for more would never be filled. */
    long long smallest = min_record_bytes > HEADER_BYTES + FOOTER_BYTES
                             ? min_record_bytes
                             : HEADER_BYTES + FOOTER_BYTES;
    long long fit = offset >= 0 && end > offset ? (end - offset) / smallest + 1 : 1;
    if ((long long)max_records > fit) max_records = (Py_ssize_t)fit;
    /* 16 bytes of plan per record must not overflow (as index_text checks its rows) */
    if (max_records > PY_SSIZE_T_MAX / (Py_ssize_t)(2 * sizeof(int64_t))) return PyErr_NoMemory();
    int64_t *plans = PyMem_Malloc((size_t)max_records * 2 * sizeof(int64_t));
    if (plans == NULL) return PyErr_NoMemory();
    Py_ssize_t count = 0;
    int status = 0, failed = 0, saved_errno = 0;
    long long total = 0;
    Py_BEGIN_ALLOW_THREADS
    unsigned char header[HEADER_BYTES];
    while (count < max_records && total < max_bytes) {
        if (offset == end) {
            status = 1;
            break;
        }
        Py_ssize_t got = read_full(fd, header, HEADER_BYTES, offset);
        if (got < 0) {
            failed = 1;
            saved_errno = errno;
            break;
        }
        if (got < HEADER_BYTES) { /* a short file: the block path says so */
            status = 2;
            break;
        }
        uint64_t length = load_u64le(header);
        if (mask(crc32c(0, header, 8)) != load_u32le(header + 8) ||
            length > (uint64_t)(end - offset) ||
            (long long)length + HEADER_BYTES + FOOTER_BYTES > end - offset ||
            (long long)length + HEADER_BYTES + FOOTER_BYTES < min_record_bytes) {
            status = 2;
            break;
        }
        plans[2 * count] = offset;
        plans[2 * count + 1] = (int64_t)length;
        count++;
        offset += (long long)length + HEADER_BYTES + FOOTER_BYTES;
        total += (long long)length + HEADER_BYTES + FOOTER_BYTES;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyMem_Free(plans);
        errno = saved_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *packed =
        PyBytes_FromStringAndSize((const char *)plans, count * 2 * (Py_ssize_t)sizeof(int64_t));
    PyMem_Free(plans);
    if (packed == NULL) return NULL;
    return Py_BuildValue("(NLi)", packed, offset, status);
}

static PyObject *read_records(PyObject *self, PyObject *args) {
    int fd, verify;
    long long offset;
    PyObject *payloads;
    Py_ssize_t step;
    Py_buffer stop;
    (void)self;
    if (!PyArg_ParseTuple(args, "iLO!pnw*", &fd, &offset, &PyList_Type, &payloads, &verify,
                          &step, &stop))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(payloads);
    unsigned char **dst = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(unsigned char *));
    size_t *lengths = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(size_t));
    if (dst == NULL || lengths == NULL) {
        PyMem_Free(dst);
        PyMem_Free(lengths);
        PyBuffer_Release(&stop);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *payload = PyList_GET_ITEM(payloads, i);
        /* only the list holds it (a new payload, or one handed back to a pool by its last
           user): nobody sees its bytes change */
        if (!PyBytes_CheckExact(payload) || Py_REFCNT(payload) != 1) {
            PyMem_Free(dst);
            PyMem_Free(lengths);
            PyBuffer_Release(&stop);
            PyErr_SetString(PyExc_TypeError,
                            "read() needs bytes objects only its list holds (new_payload())");
            return NULL;
        }
        _Py_COMP_DIAG_PUSH
        _Py_COMP_DIAG_IGNORE_DEPR_DECLS
        ((PyBytesObject *)payload)->ob_shash = -1; /* a reused one's content changes */
        _Py_COMP_DIAG_POP
        dst[i] = (unsigned char *)PyBytes_AS_STRING(payload);
        lengths[i] = (size_t)PyBytes_GET_SIZE(payload);
    }
    if (step < 1) step = 1;
    volatile unsigned char *stopped = (volatile unsigned char *)stop.buf;
    Py_ssize_t complete = 0, clean = -1;
    int failed = 0, saved_errno = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t at = offset + HEADER_BYTES;
    unsigned char gap[FOOTER_BYTES + HEADER_BYTES];
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t length = lengths[i], done = 0;
        uint32_t crc = 0;
        int short_read = 0;
        while (done < length) {
            if (stop.len > 0 && *stopped) {
                short_read = 1;
                break;
            }
            size_t take = length - done < (size_t)step ? length - done : (size_t)step;
            Py_ssize_t got = read_full(fd, dst[i] + done, take, at + (int64_t)done);
            if (got < 0) {
                failed = 1;
                saved_errno = errno;
                break;
            }
            if ((size_t)got < take) {
                short_read = 1;
                break;
            }
            if (verify) crc = crc32c(crc, dst[i] + done, take);
            done += take;
        }
        if (failed || short_read) break;
        /* the footer, and the next record's header (walked already: skipped) */
        size_t want = i + 1 < n ? FOOTER_BYTES + HEADER_BYTES : FOOTER_BYTES;
        Py_ssize_t got = read_full(fd, gap, want, at + (int64_t)length);
        if (got < 0) {
            failed = 1;
            saved_errno = errno;
            break;
        }
        if ((size_t)got < want) break;
        complete = i + 1;
        if (clean < 0 && verify && mask(crc) != load_u32le(gap)) clean = i;
        if (clean >= 0) break;
        at += (int64_t)length + FOOTER_BYTES + HEADER_BYTES;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(dst);
    PyMem_Free(lengths);
    PyBuffer_Release(&stop);
    if (failed) {
        errno = saved_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (clean < 0) clean = complete;
    return Py_BuildValue("(nn)", complete, clean);
}

typedef struct {
    PyObject_HEAD
    PyObject *payload;
} Receiver;

static PyObject *receiver_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Py_ssize_t n, max_kept = 0;
    PyObject *kept = NULL;
    static char *names[] = {"n", "kept", "max_kept", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|O!n", names, &n, &PyList_Type, &kept,
                                     &max_kept))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative length");
        return NULL;
    }
    Receiver *self = (Receiver *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (kept != NULL) {
        /* A kept bytes object of this size that only the list refers to: nobody else can
         * see it, so its memory (resident, likely cached) is filled again. */
        Py_ssize_t count = PyList_GET_SIZE(kept);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *item = PyList_GET_ITEM(kept, i);
            if (PyBytes_CheckExact(item) && PyBytes_GET_SIZE(item) == n && Py_REFCNT(item) == 1) {
                Py_INCREF(item);
                _Py_COMP_DIAG_PUSH
                _Py_COMP_DIAG_IGNORE_DEPR_DECLS
                ((PyBytesObject *)item)->ob_shash = -1; /* its content is about to change */
                _Py_COMP_DIAG_POP
                self->payload = item;
                return (PyObject *)self;
            }
        }
    }
    self->payload = PyBytes_FromStringAndSize(NULL, n);
    if (self->payload == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    if (kept != NULL && PyList_GET_SIZE(kept) < max_kept && PyList_Append(kept, self->payload) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void receiver_dealloc(Receiver *self) {
    Py_XDECREF(self->payload);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int receiver_getbuffer(Receiver *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->payload),
                             PyBytes_GET_SIZE(self->payload), 0, flags);
}

static PyBufferProcs receiver_as_buffer = {(getbufferproc)receiver_getbuffer, NULL};

static PyObject *receiver_payload(Receiver *self, void *closure) {
    (void)closure;
    Py_INCREF(self->payload);
    return self->payload;
}

static PyGetSetDef receiver_getset[] = {
    {"payload", (getter)receiver_payload, NULL, "The bytes object being filled.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamrec.storage._cread.Receiver",
    .tp_basicsize = sizeof(Receiver),
    .tp_dealloc = (destructor)receiver_dealloc,
    .tp_as_buffer = &receiver_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A fresh bytes object behind a writable buffer, for a read to land in.",
    .tp_new = receiver_new,
    .tp_getset = receiver_getset,
};

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "Walk record headers of a local file."},
    {"read", read_records, METH_VARARGS, "Read payloads straight into their bytes objects."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cread", "C reads of large records of local files.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cread(void) {
    crc32c = (crc_fn)PyCapsule_Import("streamrec.format._cframing.crc32c", 0);
    if (crc32c == NULL) return NULL;
    if (PyType_Ready(&ReceiverType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ReceiverType);
    if (PyModule_AddObject(m, "Receiver", (PyObject *)&ReceiverType) < 0) {
        Py_DECREF(&ReceiverType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
