/*
 * streamrec.format._cexample: a small, strict protobuf wire-format parser for exactly
 *
 *     Example { Features features = 1; }
 *     Features { map<string, Feature> feature = 1; }
 *     Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
 *                            Int64List int64_list = 3; } }
 *     BytesList { repeated bytes value = 1; }
 *     FloatList { repeated float value = 1 [packed = true]; }
 *     Int64List { repeated int64 value = 1 [packed = true]; }
 *
 * that decodes a batch of serialized Examples straight into preallocated output buffers
 * (numpy arrays passed in through the buffer protocol). It backs decode_batch() in
 * streamrec/format/example/batch.py. parse_examples_arrow() is its Arrow mode (to="arrow"):
 * var-length and bytes features are kept as (list, count, bytes) per record in a first pass,
 * then written in a second pass into Arrow buffers (offsets, values, data) of exactly the sizes
 * counted, allocated once per batch by the caller (Arrow's memory pool); both passes run
 * without the GIL, on the calling thread or on nthreads threads (see "Arrow mode on threads").
 * parse_sequence_arrow() is the same for the feature
 * lists of SequenceExamples (decode_sequence_batch() in example/sequence.py): pass 1 walks
 * field 2 (FeatureLists { map<string, FeatureList> feature_list = 1; }, FeatureList
 * { repeated Feature feature = 1; }) and keeps each step of a spec'd list, pass 2 writes all
 * the steps of a list as the records of one Arrow column (fixed and raw values too).
 *
 * Contract: parse_examples() either decodes the whole batch with exactly the result the
 * pure-Python (upb) path would give, or returns None, and the caller then decodes the batch
 * again in Python, which produces the values or raises the proper error. So anything this parser
 * does not handle, or any problem at all (damaged wire format, wrong kind, wrong count, missing
 * feature without default, invalid UTF-8 key, ...), simply returns None. In particular it gives
 * up on the rare constructs where upb's result is not a plain "last map entry wins" reading:
 * a map entry with unknown fields (upb drops the entry), a map entry with two values (merged),
 * a Feature with more than one kind field (merged / last oneof wins), a known field with an
 * unexpected wire type (upb treats it as unknown), and groups.
 *
 * Safety: every read is bounds-checked against the end of its (sub)message; varints are at
 * most 10 bytes, tags at most 5 bytes and 32 bits, lengths at most INT32_MAX; writes go only
 * to output buffers whose sizes were checked against the batch size up front, and each list's
 * values only to the room counted for it (checked again as they are written: a buffer payload
 * may change between the passes, which then hand the batch back).
 *
 * C99, CPython C API only (no numpy C API).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Spec modes, mirrored in example/batch.py (_C_* constants). */
enum {
    M_INT64 = 0,     /* fixed count of int64 -> int64 out[n * count] */
    M_FLOAT = 1,     /* fixed count of float -> float32 out[n * count] */
    M_BYTES = 2,     /* fixed count of bytes -> int64 out[n * count * 2] (offset, length) */
    M_RAW = 3,       /* one bytes value of exactly `count` bytes -> copied into out[n * count] */
    M_VAR_INT64 = 4, /* any count -> appended int64 values, counts[n] */
    M_VAR_FLOAT = 5, /* any count -> appended float32 values, counts[n] */
    M_VAR_BYTES = 6  /* any count -> appended (offset, length) int64 pairs, counts[n] */
};

/* Feature kinds: the field numbers of the oneof. */
enum { K_NONE = 0, K_BYTES = 1, K_FLOAT = 2, K_INT64 = 3 };

/* Arrow mode: where a record's list of one feature lies (lp NULL: none, or the default), its
 * value count and (bytes) the total length of its values. */
typedef struct {
    const uint8_t *lp, *lend;
    int64_t count, nbytes;
} Ref;

typedef struct {
    const char *key;
    Py_ssize_t keylen;
    int mode;
    int kind;          /* the kind this spec accepts */
    Py_ssize_t count;  /* values per record (fixed modes) or bytes per record (M_RAW) */
    Py_ssize_t itemsize;
    char *out;         /* fixed modes */
    const char *dflt;  /* numeric default (count * itemsize bytes) or NULL */
    int has_default;
    int64_t *counts;   /* var modes */
    char *vbuf;        /* var modes: growing buffer of values */
    size_t vlen, vcap;
    size_t rec_start;  /* var modes: where the current record's values start in vbuf */
    int seen;
    Py_buffer out_view, counts_view, dflt_view;
    int have_out, have_counts, have_dflt;
    Ref *refs;          /* Arrow mode, var and bytes modes: each record's list, for pass 2 */
    PyObject *dflt_items; /* Arrow mode, M_BYTES with a default: its count values (bytes) */
    size_t dflt_nbytes;   /* their total length */
    size_t nrefs, refcap; /* sequence mode: the steps kept in refs so far, and its room */
} Spec;

typedef struct {
    const uint8_t *base; /* start of the current payload (offsets are relative to it) */
    Py_ssize_t record;
    Spec *specs;
    Py_ssize_t nspecs;
    int arrow;           /* parse_examples_arrow: var and bytes lists are kept for pass 2;
                          * 2: parse_sequence_arrow (every step of every spec is kept) */
    Py_ssize_t hint;     /* the spec after the last one matched */
} Ctx;

/* ------------------------------------------------------------------ wire primitives */

static inline int read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int i;
    for (i = 0; i < 10; i++) {
        uint8_t b;
        if (p >= end) return 0;
        b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i); /* bits past 64 are dropped, like upb */
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 1;
        }
    }
    return 0; /* more than 10 bytes */
}

static inline int read_tag(const uint8_t **pp, const uint8_t *end, uint32_t *field, uint32_t *wt) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int i;
    for (i = 0; i < 5; i++) {
        uint8_t b;
        if (p >= end) return 0;
        b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (v > 0xFFFFFFFFu) return 0;
            *field = (uint32_t)(v >> 3);
            *wt = (uint32_t)(v & 7);
            if (*field == 0) return 0;
            *pp = p;
            return 1;
        }
    }
    return 0;
}

/* A length-delimited field's length; the bytes must lie inside [*pp, end). */
static inline int read_len(const uint8_t **pp, const uint8_t *end, size_t *len) {
    uint64_t n;
    if (!read_varint(pp, end, &n)) return 0;
    if (n > (uint64_t)INT32_MAX || n > (uint64_t)(end - *pp)) return 0;
    *len = (size_t)n;
    return 1;
}

/* Skip an unknown field of wire type wt; groups (3, 4) and wire types 6, 7 give up. */
static int skip_field(const uint8_t **pp, const uint8_t *end, uint32_t wt) {
    uint64_t v;
    size_t n;
    switch (wt) {
    case 0:
        return read_varint(pp, end, &v);
    case 1:
        if (end - *pp < 8) return 0;
        *pp += 8;
        return 1;
    case 2:
        if (!read_len(pp, end, &n)) return 0;
        *pp += n;
        return 1;
    case 5:
        if (end - *pp < 4) return 0;
        *pp += 4;
        return 1;
    default:
        return 0;
    }
}

/* Strict UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF), as upb checks proto3
 * string fields. */
static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            uint8_t c1;
            if (n - i < 3) return 0;
            c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0; /* overlong */
            if (c == 0xED && c1 > 0x9F) return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            uint8_t c1;
            if (n - i < 4) return 0;
            c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && c1 < 0x90) return 0; /* overlong */
            if (c == 0xF4 && c1 > 0x8F) return 0; /* above U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ Feature / lists */

/* Find the kind of a Feature and the span of its list; unknown fields are skipped. More than
 * one kind field (which protobuf would merge) gives up. */
static int scan_feature(const uint8_t *p, const uint8_t *end, int *kind, const uint8_t **lp,
                        const uint8_t **lend) {
    int nkinds = 0;
    *kind = K_NONE;
    *lp = *lend = p;
    while (p < end) {
        uint32_t field, wt;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field >= 1 && field <= 3) {
            size_t n;
            if (wt != 2 || ++nkinds > 1 || !read_len(&p, end, &n)) return 0;
            *kind = (int)field;
            *lp = p;
            *lend = p + n;
            p += n;
        } else if (!skip_field(&p, end, wt)) {
            return 0;
        }
    }
    return 1;
}

/* Validate a BytesList / FloatList / Int64List and count its values (and the bytes of a
 * BytesList's). Not strict: packed int64 values are counted by their last bytes, not decoded;
 * only for a list that write_values() reads next, which checks every varint. */
static int count_values(int kind, const uint8_t *p, const uint8_t *end, int strict,
                        Py_ssize_t *count, int64_t *nbytes) {
    Py_ssize_t c = 0;
    int64_t total = 0;
    while (p < end) {
        uint32_t field, wt;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field != 1) {
            if (!skip_field(&p, end, wt)) return 0;
            continue;
        }
        if (kind == K_BYTES) {
            size_t n;
            if (wt != 2 || !read_len(&p, end, &n)) return 0;
            p += n;
            total += (int64_t)n;
            c++;
        } else if (kind == K_FLOAT) {
            if (wt == 2) {
                size_t n;
                if (!read_len(&p, end, &n) || (n & 3) != 0) return 0;
                p += n;
                c += (Py_ssize_t)(n >> 2);
            } else if (wt == 5) {
                if (end - p < 4) return 0;
                p += 4;
                c++;
            } else {
                return 0;
            }
        } else { /* K_INT64 */
            uint64_t v;
            if (wt == 2) {
                size_t n;
                const uint8_t *pend;
                if (!read_len(&p, end, &n)) return 0;
                pend = p + n;
                if (!strict) { /* one value per last byte; write_values() checks the rest */
                    const uint8_t *q;
                    Py_ssize_t last = 0;
                    if (n && (pend[-1] & 0x80)) return 0;
                    for (q = p; pend - q >= 8; q += 8) { /* 8 bytes at a time */
                        uint64_t w;
                        memcpy(&w, q, 8);
                        w = ~w & 0x8080808080808080ULL; /* the high bit of each last byte */
                        w = (w >> 7) * 0x0101010101010101ULL; /* their sum in the top byte */
                        last += (Py_ssize_t)(w >> 56);
                    }
                    for (; q < pend; q++) last += *q < 0x80;
                    c += last;
                    p = pend;
                }
                while (p < pend) {
                    if (!read_varint(&p, pend, &v)) return 0;
                    c++;
                }
            } else if (wt == 0) {
                if (!read_varint(&p, end, &v)) return 0;
                c++;
            } else {
                return 0;
            }
        }
    }
    *count = c;
    *nbytes = total;
    return 1;
}

/* Write the values of a list that count_values() accepted to [dst, dst_end) (int64 / float32 /
 * (offset, length) int64 pairs relative to base), exactly filling it. Checks everything again
 * all the same (a buffer payload may have changed since it was counted). */
static int write_values(int kind, const uint8_t *p, const uint8_t *end, char *dst,
                        char *dst_end, const uint8_t *base) {
    while (p < end) {
        uint32_t field = 0, wt = 0;
        size_t n = 0;
        uint64_t v = 0;
        int64_t iv;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field != 1) {
            if (!skip_field(&p, end, wt)) return 0;
            continue;
        }
        if (kind == K_BYTES) {
            int64_t pair[2];
            if (wt != 2 || !read_len(&p, end, &n) || dst_end - dst < 16) return 0;
            pair[0] = (int64_t)(p - base);
            pair[1] = (int64_t)n;
            memcpy(dst, pair, sizeof pair);
            dst += sizeof pair;
            p += n;
        } else if (kind == K_FLOAT) {
            if (wt == 2) {
                if (!read_len(&p, end, &n)) return 0;
            } else {
                n = 4;
                if (wt != 5 || end - p < 4) return 0;
            }
            if ((size_t)(dst_end - dst) < n) return 0;
            if (n) memcpy(dst, p, n);
            dst += n;
            p += n;
        } else if (wt == 2) {
            const uint8_t *pend;
            if (!read_len(&p, end, &n)) return 0;
            pend = p + n;
            while (p < pend) {
                uint64_t b0 = p[0], more = b0 >> 7, b1 = pend - p >= 2 ? p[1] : 0x80;
                if (!(more & (b1 >> 7))) { /* most ids are below 16384: 1 or 2 bytes, decoded
                                            * without a branch on which (random ids) */
                    v = (b0 & 0x7F) | ((b1 << 7) & (0 - more));
                    p += 1 + more;
                } else if (!read_varint(&p, pend, &v)) {
                    return 0;
                }
                if (dst_end - dst < 8) return 0;
                iv = (int64_t)v;
                memcpy(dst, &iv, 8);
                dst += 8;
            }
        } else {
            if (wt != 0 || !read_varint(&p, end, &v) || dst_end - dst < 8) return 0;
            iv = (int64_t)v;
            memcpy(dst, &iv, 8);
            dst += 8;
        }
    }
    return dst == dst_end;
}

static int grow(Spec *s, size_t need) {
    size_t cap;
    char *nb;
    if (s->vlen + need <= s->vcap) return 1;
    cap = s->vcap ? s->vcap : 4096;
    while (cap < s->vlen + need) {
        if (cap > ((size_t)PY_SSIZE_T_MAX) / 2) return 0;
        cap *= 2;
    }
    nb = (char *)realloc(s->vbuf, cap);
    if (!nb) return 0;
    s->vbuf = nb;
    s->vcap = cap;
    return 1;
}

/* Apply one (validated) map entry's Feature to the spec it names. */
static int apply(Ctx *ctx, Spec *s, int kind, const uint8_t *lp, const uint8_t *lend,
                 Py_ssize_t count, int64_t nbytes) {
    int again = s->seen;
    if (kind != K_NONE && kind != s->kind) return 0;
    s->seen = 1;
    if (s->refs) { /* Arrow mode: written in pass 2, once every size is known */
        Ref *r = &s->refs[ctx->record];
        Py_ssize_t c;
        int64_t b;
        if (s->mode == M_BYTES && count != s->count) return 0;
        /* an earlier entry of the key, replaced: pass 2 will not read it, so check it here */
        if (again && r->lp && !count_values(s->kind, r->lp, r->lend, 1, &c, &b)) return 0;
        r->lp = lp;
        r->lend = lend;
        r->count = (int64_t)count;
        r->nbytes = nbytes;
        return 1;
    }
    switch (s->mode) {
    case M_INT64:
    case M_FLOAT:
    case M_BYTES: {
        char *dst = s->out + (size_t)ctx->record * (size_t)s->count * (size_t)s->itemsize;
        if (count != s->count) return 0;
        return write_values(kind, lp, lend, dst, dst + (size_t)s->count * (size_t)s->itemsize,
                            ctx->base);
    }
    case M_RAW: {
        const uint8_t *p = lp;
        uint32_t field = 0, wt = 0;
        size_t n = 0;
        if (kind != K_BYTES || count != 1) return 0;
        /* find the one value (unknown fields may come first) */
        for (;;) {
            if (!read_tag(&p, lend, &field, &wt)) return 0;
            if (field == 1) break;
            if (!skip_field(&p, lend, wt)) return 0;
        }
        if (wt != 2 || !read_len(&p, lend, &n)) return 0;
        if ((Py_ssize_t)n != s->count) return 0;
        if (n) memcpy(s->out + (size_t)ctx->record * n, p, n);
        return 1;
    }
    default: { /* var modes: last entry wins, so drop what an earlier entry appended */
        size_t width = s->mode == M_VAR_FLOAT ? 4 : s->mode == M_VAR_BYTES ? 16 : 8;
        s->vlen = s->rec_start;
        if (!grow(s, (size_t)count * width)) return 0;
        if (!write_values(kind, lp, lend, s->vbuf + s->vlen,
                          s->vbuf + s->vlen + (size_t)count * width, ctx->base))
            return 0;
        s->vlen += (size_t)count * width;
        s->counts[ctx->record] = (int64_t)count;
        return 1;
    }
    }
}

/* Feature names are short: a loop, where memcmp() would be a call (8 % of the time). */
static inline int same_bytes(const char *a, const uint8_t *b, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if ((uint8_t)a[i] != b[i]) return 0;
    }
    return 1;
}

/* One map entry of Features: key = 1, value = 2 and nothing else. */
static int parse_entry(Ctx *ctx, const uint8_t *p, const uint8_t *end) {
    const uint8_t *key = p, *val = p, *vend = p, *lp, *lend;
    size_t keylen = 0;
    int have_key = 0, have_val = 0, kind;
    Py_ssize_t count = 0, i, k;
    int64_t nbytes = 0;
    Spec *s = NULL;
    while (p < end) {
        uint32_t field, wt;
        size_t n;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (wt != 2 || field > 2 || !read_len(&p, end, &n)) return 0;
        if (field == 1) { /* (a key given twice: the first must be UTF-8 all the same) */
            if (have_key && !utf8_valid(key, keylen)) return 0;
            have_key = 1;
            key = p;
            keylen = n;
        } else {
            if (have_val) return 0;
            have_val = 1;
            val = p;
            vend = p + n;
        }
        p += n;
    }
    /* Spec keys are str.encode("utf-8"): a key equal to one is valid UTF-8. Features often
     * come in the same order in every record: the search starts after the last one found. */
    for (i = 0, k = ctx->hint; i < ctx->nspecs; i++, k++) {
        Spec *cand;
        if (k >= ctx->nspecs) k = 0;
        cand = &ctx->specs[k];
        if ((size_t)cand->keylen == keylen && same_bytes(cand->key, key, keylen)) {
            s = cand;
            ctx->hint = k + 1;
            break;
        }
    }
    if (!s && !utf8_valid(key, keylen)) return 0;
    if (!scan_feature(val, vend, &kind, &lp, &lend)) return 0;
    if (kind != K_NONE && !count_values(kind, lp, lend, s == NULL, &count, &nbytes)) return 0;
    return s ? apply(ctx, s, kind, lp, lend, count, nbytes) : 1;
}

static int parse_features(Ctx *ctx, const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint32_t field, wt;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field == 1) {
            size_t n;
            if (wt != 2 || !read_len(&p, end, &n)) return 0;
            if (!parse_entry(ctx, p, p + n)) return 0;
            p += n;
        } else if (!skip_field(&p, end, wt)) {
            return 0;
        }
    }
    return 1;
}

static int parse_example(Ctx *ctx, const uint8_t *p, const uint8_t *end) {
    Py_ssize_t i;
    for (i = 0; i < ctx->nspecs; i++) {
        Spec *s = &ctx->specs[i];
        s->seen = 0;
        s->rec_start = s->vlen;
    }
    while (p < end) {
        uint32_t field, wt;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field == 1) { /* repeated occurrences merge: their map entries add up */
            size_t n;
            if (wt != 2 || !read_len(&p, end, &n)) return 0;
            if (!parse_features(ctx, p, p + n)) return 0;
            p += n;
        } else if (!skip_field(&p, end, wt)) {
            return 0;
        }
    }
    for (i = 0; i < ctx->nspecs; i++) {
        Spec *s = &ctx->specs[i];
        if (s->seen) continue;
        switch (s->mode) {
        case M_INT64:
        case M_FLOAT: {
            size_t sz = (size_t)s->count * (size_t)s->itemsize;
            if (!s->dflt) return 0;
            if (sz) memcpy(s->out + (size_t)ctx->record * sz, s->dflt, sz);
            break;
        }
        case M_BYTES: {
            /* offset -1 marks "use the default"; Python fills it in */
            Py_ssize_t j;
            int64_t *o;
            int64_t mark[2] = {-1, 0};
            if (!s->has_default) return 0;
            if (s->refs) { /* Arrow mode: pass 2 copies the default values */
                Ref *r = &s->refs[ctx->record];
                r->lp = r->lend = NULL;
                r->count = (int64_t)s->count;
                r->nbytes = (int64_t)s->dflt_nbytes;
                break;
            }
            o = (int64_t *)(void *)(s->out + (size_t)ctx->record * (size_t)s->count * 16);
            for (j = 0; j < s->count; j++) memcpy(o + 2 * j, mark, sizeof mark);
            break;
        }
        case M_RAW:
            return 0;
        default:
            if (s->refs) {
                Ref *r = &s->refs[ctx->record];
                r->lp = r->lend = NULL;
                r->count = r->nbytes = 0;
            } else {
                s->counts[ctx->record] = 0;
            }
            break;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ SequenceExample lists */

/* Sequence mode: SequenceExample { Features context = 1; FeatureLists feature_lists = 2; },
 * FeatureLists { map<string, FeatureList> feature_list = 1; }, FeatureList { repeated Feature
 * feature = 1; }. The context is decode_batch()'s (an Example's field 1 too), so it is skipped
 * here; every FeatureList is validated and each step of a spec'd one is kept as a Ref (the
 * spec's refs grow; counts[record] counts the steps) for pass 2. A step has no default: it is
 * there, of the spec's kind (or of none: no values) and count, or the batch is handed back. */

static int keep_step(Spec *s, int kind, const uint8_t *lp, const uint8_t *lend, Py_ssize_t count,
                     int64_t nbytes) {
    Ref *r;
    if (kind != K_NONE && kind != s->kind) return 0;
    switch (s->mode) {
    case M_INT64:
    case M_FLOAT:
    case M_BYTES:
        if (count != s->count) return 0;
        break;
    case M_RAW:
        if (kind != K_BYTES || count != 1 || nbytes != (int64_t)s->count) return 0;
        break;
    default:
        break;
    }
    if (s->nrefs == s->refcap) {
        size_t cap = s->refcap ? s->refcap * 2 : 64;
        Ref *nr;
        if (cap > ((size_t)PY_SSIZE_T_MAX) / (2 * sizeof(Ref))) return 0;
        nr = (Ref *)realloc(s->refs, cap * sizeof(Ref));
        if (!nr) return 0;
        s->refs = nr;
        s->refcap = cap;
    }
    r = &s->refs[s->nrefs++];
    r->lp = lp; /* (never NULL: a kind-less step has the empty span) */
    r->lend = lend;
    r->count = (int64_t)count;
    r->nbytes = nbytes;
    return 1;
}

/* A FeatureList: its steps validated, and kept for s (NULL: a list no spec names). */
static int parse_feature_list(Ctx *ctx, Spec *s, const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint32_t field, wt;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field == 1) {
            size_t n;
            int kind;
            const uint8_t *lp, *lend;
            Py_ssize_t count = 0;
            int64_t nbytes = 0;
            if (wt != 2 || !read_len(&p, end, &n)) return 0;
            if (!scan_feature(p, p + n, &kind, &lp, &lend)) return 0;
            /* (not strict for a kept step: pass 2's write_values() checks every varint) */
            if (kind != K_NONE && !count_values(kind, lp, lend, s == NULL || s->mode == M_RAW,
                                                &count, &nbytes))
                return 0;
            if (s) {
                if (!keep_step(s, kind, lp, lend, count, nbytes)) return 0;
                s->counts[ctx->record]++;
            }
            p += n;
        } else if (!skip_field(&p, end, wt)) {
            return 0;
        }
    }
    return 1;
}

/* One map entry of FeatureLists: key = 1, value = 2 and nothing else (as parse_entry()). A
 * spec'd name given twice in a record (the last would win) hands the batch back. */
static int parse_list_entry(Ctx *ctx, const uint8_t *p, const uint8_t *end) {
    const uint8_t *key = p, *val = p, *vend = p;
    size_t keylen = 0;
    int have_key = 0, have_val = 0;
    Py_ssize_t i, k;
    Spec *s = NULL;
    while (p < end) {
        uint32_t field, wt;
        size_t n;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (wt != 2 || field > 2 || !read_len(&p, end, &n)) return 0;
        if (field == 1) {
            if (have_key && !utf8_valid(key, keylen)) return 0;
            have_key = 1;
            key = p;
            keylen = n;
        } else {
            if (have_val) return 0;
            have_val = 1;
            val = p;
            vend = p + n;
        }
        p += n;
    }
    for (i = 0, k = ctx->hint; i < ctx->nspecs; i++, k++) {
        Spec *cand;
        if (k >= ctx->nspecs) k = 0;
        cand = &ctx->specs[k];
        if ((size_t)cand->keylen == keylen && same_bytes(cand->key, key, keylen)) {
            s = cand;
            ctx->hint = k + 1;
            break;
        }
    }
    if (!s && !utf8_valid(key, keylen)) return 0;
    if (s) {
        if (s->seen) return 0;
        s->seen = 1;
    }
    return parse_feature_list(ctx, s, val, vend);
}

static int parse_sequence(Ctx *ctx, const uint8_t *p, const uint8_t *end) {
    Py_ssize_t i;
    for (i = 0; i < ctx->nspecs; i++) {
        ctx->specs[i].seen = 0;
        ctx->specs[i].counts[ctx->record] = 0;
    }
    while (p < end) {
        uint32_t field, wt;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field == 2) { /* repeated occurrences merge: their map entries add up */
            size_t n;
            const uint8_t *q, *qend;
            if (wt != 2 || !read_len(&p, end, &n)) return 0;
            q = p;
            qend = p + n;
            while (q < qend) {
                uint32_t f2, wt2;
                if (!read_tag(&q, qend, &f2, &wt2)) return 0;
                if (f2 == 1) {
                    size_t m;
                    if (wt2 != 2 || !read_len(&q, qend, &m)) return 0;
                    if (!parse_list_entry(ctx, q, q + m)) return 0;
                    q += m;
                } else if (!skip_field(&q, qend, wt2)) {
                    return 0;
                }
            }
            p = qend;
        } else if (!skip_field(&p, end, wt)) { /* the context: decode_batch()'s */
            return 0;
        }
    }
    return 1;
}

/* Sequence mode's steps (refs, 32 bytes a step: 4 MiB a list at 8,192 records) come from a
 * few arrays kept between calls: fresh ones this big are mmapped (or trimmed back to the OS)
 * by malloc on every call, and each page faulted in again as the steps are written (a quarter
 * of a fault per record, measured at 8,192; none at 1,024, whose arrays malloc keeps). Taken
 * and given back with the GIL held; at most SEQ_CACHE_BYTES are kept. */
#define SEQ_CACHE_SLOTS 8
#define SEQ_CACHE_BYTES ((size_t)48 << 20)
static Ref *seq_cache[SEQ_CACHE_SLOTS];
static size_t seq_cache_cap[SEQ_CACHE_SLOTS];

/* An array of at least want refs (its room in *cap): a kept one, else malloc's. */
static Ref *seq_refs_take(size_t want, size_t *cap) {
    int k, best = -1;
    for (k = 0; k < SEQ_CACHE_SLOTS; k++) { /* the smallest kept array that is big enough */
        if (seq_cache[k] && seq_cache_cap[k] >= want &&
            (best < 0 || seq_cache_cap[k] < seq_cache_cap[best]))
            best = k;
    }
    if (best >= 0) {
        Ref *refs = seq_cache[best];
        *cap = seq_cache_cap[best];
        seq_cache[best] = NULL;
        return refs;
    }
    *cap = want;
    return (Ref *)malloc(sizeof(Ref) * want);
}

/* Keep refs (room for cap) for a later call (in place of the smallest kept array when all
 * slots are taken and that one is smaller), or free it. */
static void seq_refs_give(Ref *refs, size_t cap) {
    int k, slot = -1, smallest = -1;
    size_t kept = 0;
    if (!refs) return;
    for (k = 0; k < SEQ_CACHE_SLOTS; k++) {
        if (!seq_cache[k]) {
            if (slot < 0) slot = k;
            continue;
        }
        kept += seq_cache_cap[k] * sizeof(Ref);
        if (smallest < 0 || seq_cache_cap[k] < seq_cache_cap[smallest]) smallest = k;
    }
    if (slot < 0 && seq_cache_cap[smallest] < cap) {
        kept -= seq_cache_cap[smallest] * sizeof(Ref);
        free(seq_cache[smallest]);
        seq_cache[smallest] = NULL;
        slot = smallest;
    }
    if (slot < 0 || cap > SEQ_CACHE_BYTES / sizeof(Ref) ||
        kept + cap * sizeof(Ref) > SEQ_CACHE_BYTES) {
        free(refs);
        return;
    }
    seq_cache[slot] = refs;
    seq_cache_cap[slot] = cap;
}

/* ------------------------------------------------------------------ shared by the entry points */

static int little_endian(void) {
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 1;
}

static void release_specs(Spec *specs, Py_ssize_t n) {
    Py_ssize_t i;
    for (i = 0; i < n; i++) {
        if (specs[i].have_out) PyBuffer_Release(&specs[i].out_view);
        if (specs[i].have_counts) PyBuffer_Release(&specs[i].counts_view);
        if (specs[i].have_dflt) PyBuffer_Release(&specs[i].dflt_view);
        Py_XDECREF(specs[i].dflt_items);
        free(specs[i].vbuf);
        free(specs[i].refs);
    }
    free(specs);
}

/* ------------------------------------------------------------------ Arrow mode, pass 2 */

/* An Arrow output of nbytes: alloc(nbytes), exported writable into *view; NULL on error. */
static PyObject *alloc_out(PyObject *alloc, int64_t nbytes, Py_buffer *view) {
    PyObject *o = PyObject_CallFunction(alloc, "L", (long long)nbytes);
    if (!o) return NULL;
    if (PyObject_GetBuffer(o, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    if (view->len < (Py_ssize_t)nbytes) {
        PyBuffer_Release(view);
        Py_DECREF(o);
        PyErr_SetString(PyExc_ValueError, "alloc returned a buffer too small");
        return NULL;
    }
    return o;
}

/* Copy the values of a BytesList to data[*at...] and their end offsets to voff[*vi + 1...]
 * (at most vmax values and cap bytes in all). */
static int fill_bytes_list(const uint8_t *p, const uint8_t *end, int64_t *voff, int64_t *vi,
                           int64_t vmax, char *data, int64_t *at, int64_t cap) {
    while (p < end) {
        uint32_t field = 0, wt = 0;
        size_t n = 0;
        if (!read_tag(&p, end, &field, &wt)) return 0;
        if (field != 1) {
            if (!skip_field(&p, end, wt)) return 0;
            continue;
        }
        if (wt != 2 || !read_len(&p, end, &n)) return 0;
        if (*vi >= vmax || (int64_t)n > cap - *at) return 0;
        if (n) memcpy(data + *at, p, n);
        *at += (int64_t)n;
        p += n;
        voff[++*vi] = *at;
    }
    return 1;
}

/* An Arrow-mode spec's outputs: up to three buffers, written in pass 2. */
typedef struct {
    PyObject *obj[3];
    Py_buffer view[3];
    int nbuf;
    int64_t values, nbytes; /* totals over the batch */
    int64_t vi, at;         /* pass 2: values and bytes written so far */
} Outs;

/* Size and allocate a spec's Arrow outputs from its refs (with the GIL). */
static int arrow_alloc(Spec *s, Py_ssize_t n, PyObject *alloc, Outs *o) {
    Py_ssize_t i;
    int64_t sizes[3];
    int k;
    o->values = o->nbytes = 0;
    for (i = 0; i < n; i++) {
        o->values += s->refs[i].count;
        o->nbytes += s->refs[i].nbytes;
        if (o->values > PY_SSIZE_T_MAX / 16 || o->nbytes > PY_SSIZE_T_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "output too large");
            return 0;
        }
    }
    if (s->mode <= M_RAW && s->mode != M_BYTES) { /* sequence mode: the values of n steps */
        o->nbuf = 1;
        sizes[0] = (int64_t)n * (int64_t)s->count * (int64_t)s->itemsize;
    } else if (s->mode == M_VAR_INT64 || s->mode == M_VAR_FLOAT) { /* list offsets, values */
        o->nbuf = 2;
        sizes[0] = ((int64_t)n + 1) * 8;
        sizes[1] = o->values * (s->mode == M_VAR_FLOAT ? 4 : 8);
    } else if (s->mode == M_VAR_BYTES) { /* list offsets, value offsets, data */
        o->nbuf = 3;
        sizes[0] = ((int64_t)n + 1) * 8;
        sizes[1] = (o->values + 1) * 8;
        sizes[2] = o->nbytes;
    } else { /* M_BYTES: value offsets, data */
        o->nbuf = 2;
        sizes[0] = (o->values + 1) * 8;
        sizes[1] = o->nbytes;
    }
    for (k = 0; k < o->nbuf; k++) {
        o->obj[k] = alloc_out(alloc, sizes[k], &o->view[k]);
        if (!o->obj[k]) return 0;
    }
    return 1;
}

/* Write record i of a spec's Arrow outputs at the cursors o->vi, o->at (no Python API: runs
 * without the GIL). The first record also writes the first offsets. */
static int arrow_fill_record(Spec *s, Py_ssize_t i, Outs *o) {
    const Ref *r = &s->refs[i];
    Py_ssize_t j;
    if (s->mode <= M_RAW && s->mode != M_BYTES) { /* sequence mode: step i's values */
        size_t sz = (size_t)s->count * (size_t)s->itemsize;
        char *dst = (char *)o->view[0].buf + (size_t)i * sz;
        if (s->mode == M_RAW) { /* the one value (unknown fields may come first) */
            const uint8_t *p = r->lp;
            uint32_t field = 0, wt = 0;
            size_t n = 0;
            for (;;) {
                if (!read_tag(&p, r->lend, &field, &wt)) return 0;
                if (field == 1) break;
                if (!skip_field(&p, r->lend, wt)) return 0;
            }
            if (wt != 2 || !read_len(&p, r->lend, &n) || n != sz) return 0;
            if (n) memcpy(dst, p, n);
        } else if (!write_values(s->kind, r->lp, r->lend, dst, dst + sz, NULL)) {
            return 0;
        }
        o->vi += r->count;
        o->at += r->nbytes;
        return 1;
    }
    if (s->mode == M_VAR_INT64 || s->mode == M_VAR_FLOAT) {
        int64_t *offsets = (int64_t *)o->view[0].buf;
        char *values = (char *)o->view[1].buf;
        size_t width = s->mode == M_VAR_FLOAT ? 4 : 8;
        if (i == 0) offsets[0] = 0;
        if (r->count > o->values - o->vi) return 0;
        if (r->lp && !write_values(s->kind, r->lp, r->lend, values + (size_t)o->vi * width,
                                   values + (size_t)(o->vi + r->count) * width, NULL))
            return 0;
        o->vi += r->count;
        offsets[i + 1] = o->vi;
        return 1;
    }
    if (s->mode == M_VAR_BYTES) {
        int64_t *offsets = (int64_t *)o->view[0].buf, *voff = (int64_t *)o->view[1].buf;
        int64_t before = o->vi; /* (not offsets[i]: another thread may be writing it) */
        if (i == 0) offsets[0] = voff[0] = 0;
        if (r->lp && !fill_bytes_list(r->lp, r->lend, voff, &o->vi, o->values,
                                      (char *)o->view[2].buf, &o->at, o->nbytes))
            return 0;
        offsets[i + 1] = o->vi;
        return o->vi == before + r->count;
    }
    { /* M_BYTES: count values a record, or the default's */
        int64_t *voff = (int64_t *)o->view[0].buf;
        char *data = (char *)o->view[1].buf;
        if (i == 0) voff[0] = 0;
        if (r->lp) {
            if (!fill_bytes_list(r->lp, r->lend, voff, &o->vi, o->values, data, &o->at,
                                 o->nbytes))
                return 0;
        } else {
            for (j = 0; j < s->count; j++) {
                PyObject *item = PyTuple_GET_ITEM(s->dflt_items, j);
                int64_t len = (int64_t)PyBytes_GET_SIZE(item);
                if (o->vi >= o->values || len > o->nbytes - o->at) return 0;
                if (len) memcpy(data + o->at, PyBytes_AS_STRING(item), (size_t)len);
                o->at += len;
                voff[++o->vi] = o->at;
            }
        }
        return o->vi == ((int64_t)i + 1) * (int64_t)s->count;
    }
}

/* Pass 2 for records [lo, hi) at the cursors outs[k].vi, .at (a thread's share). */
static int arrow_fill_range(Spec *specs, Py_ssize_t nspecs, Py_ssize_t lo, Py_ssize_t hi,
                            Outs *outs) {
    Py_ssize_t i, k;
    for (i = lo; i < hi; i++) {
        for (k = 0; k < nspecs; k++) {
            if (specs[k].refs && !arrow_fill_record(&specs[k], i, &outs[k])) return 0;
        }
    }
    return 1;
}

/* Pass 2, record by record (each record's lists lie together: read from memory once), every
 * kept spec; then every output must be exactly full. */
static int arrow_fill(Spec *specs, Py_ssize_t nspecs, Py_ssize_t n, Outs *outs) {
    Py_ssize_t k;
    for (k = 0; k < nspecs; k++) outs[k].vi = outs[k].at = 0;
    if (n == 0) { /* the first offsets still */
        for (k = 0; k < nspecs; k++) {
            if (specs[k].refs) *(int64_t *)outs[k].view[0].buf = 0;
            if (specs[k].refs && specs[k].mode == M_VAR_BYTES) *(int64_t *)outs[k].view[1].buf = 0;
        }
    }
    if (!arrow_fill_range(specs, nspecs, 0, n, outs)) return 0;
    for (k = 0; k < nspecs; k++) {
        if (specs[k].refs && (outs[k].vi != outs[k].values || outs[k].at != outs[k].nbytes))
            return 0;
    }
    return 1;
}

/* Sequence mode's pass 2, record by record (a record's lists lie together: read from memory
 * once, as in arrow_fill()), each spec's steps of that record; then every output must be
 * exactly full. */
static int seq_fill(Spec *specs, Py_ssize_t nspecs, Py_ssize_t n, Outs *outs) {
    Py_ssize_t i, k;
    for (k = 0; k < nspecs; k++) {
        Spec *s = &specs[k];
        Outs *o = &outs[k];
        o->vi = o->at = 0;
        s->rec_start = 0; /* the next step to write */
        if (s->nrefs == 0 && (s->mode == M_BYTES || s->mode > M_RAW)) { /* the first offsets */
            *(int64_t *)o->view[0].buf = 0;
            if (s->mode == M_VAR_BYTES) *(int64_t *)o->view[1].buf = 0;
        }
    }
    for (i = 0; i < n; i++) {
        for (k = 0; k < nspecs; k++) {
            Spec *s = &specs[k];
            int64_t c;
            for (c = s->counts[i]; c > 0; c--) {
                if (s->rec_start >= s->nrefs) return 0;
                if (!arrow_fill_record(s, (Py_ssize_t)s->rec_start, &outs[k])) return 0;
                s->rec_start++;
            }
        }
    }
    for (k = 0; k < nspecs; k++) {
        Spec *s = &specs[k];
        if (s->rec_start != s->nrefs || outs[k].vi != outs[k].values ||
            outs[k].at != outs[k].nbytes)
            return 0;
    }
    return 1;
}

/* The records of a batch lie anywhere in memory (a bytes object each): ask for the next one
 * while this one is parsed, or its first read waits for memory (a fifth of the time, measured
 * with perf). */
static inline void prefetch_record(const uint8_t *p, Py_ssize_t len) {
#if defined(__GNUC__) || defined(__clang__)
    Py_ssize_t at;
    for (at = 0; at < len && at < 512; at += 64) __builtin_prefetch(p + at);
#else
    (void)p;
    (void)len;
#endif
}

/* ------------------------------------------------------------------ Arrow mode on threads */

/* parse_examples_arrow(..., nthreads > 1) splits a batch into chunks of consecutive records of
 * about the same bytes (8 a thread). The calling thread and nthreads - 1 new ones take chunks
 * in turn until none is left, so a thread that a loaded machine starts late finds the work done
 * (the caller never waits for it to start; it waits only for chunks being worked on). Pass 1:
 * each thread parses with its own Ctx and copy of the specs (their per-record state), writing
 * only its records' Refs and fixed outputs. Then, with the GIL, the outputs are allocated and
 * each chunk's first value and byte of every kept spec is the sum over the chunks before it
 * (a prefix sum), so pass 2 (on new threads the same way) writes each chunk's values where the
 * one-thread pass would have: the buffers are byte for byte the same. A chunk that fails hands
 * the whole batch back (None), as on one thread: the Python path then names the first bad
 * record. No Python API is used on these threads. */

#if !defined(_WIN32)
#include <pthread.h>
#define HAVE_THREADS 1
#endif

#define MAX_THREADS 64

/* The bytes of a block of per-thread (or per-chunk) state with 64 bytes between blocks: state
 * that two threads write on the same cache line would bounce between their cores (a third more
 * time, measured). */
#define APART(bytes) ((((size_t)(bytes) + 63) / 64 + 1) * 64)

typedef union {
    Ctx ctx;
    char room[APART(sizeof(Ctx))];
} PaddedCtx;

typedef struct {
    Py_ssize_t lo, hi; /* its records */
    Outs *outs;        /* pass 2: its cursors (copies sharing the buffers) */
    int64_t *ends;     /* where its cursors must end, per spec: values, bytes */
    int ok;
} Chunk;

/* One pass's work and the threads sharing it. Freed by the last of the caller and the threads
 * started to let go of it; a thread that starts after every chunk was taken touches nothing but
 * this block. */
struct Pool;
typedef struct {
    struct Pool *pool;
    Ctx *ctx;
} Seat; /* a thread's place at a pool: the Ctx it parses with */

typedef struct Pool {
#ifdef HAVE_THREADS
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
    int pass, nchunks, next, done, stop, holders;
    Chunk *chunks;
    const uint8_t *const *starts;
    const Py_ssize_t *lens;
    Spec *specs; /* pass 2: the specs (read only) */
    Py_ssize_t nspecs;
    Seat seats[MAX_THREADS]; /* seat t: thread t's (0: the caller's) */
    char apart[64];       /* (the caller's stack after the pool: not on the seats' lines) */
} Pool;

static void pool_lock(Pool *p) {
#ifdef HAVE_THREADS
    pthread_mutex_lock(&p->mu);
#else
    (void)p;
#endif
}

static void pool_unlock(Pool *p) {
#ifdef HAVE_THREADS
    pthread_mutex_unlock(&p->mu);
#else
    (void)p;
#endif
}

static int chunk_parse(Pool *p, Chunk *c, Ctx *ctx) {
    Py_ssize_t i;
    for (i = c->lo; i < c->hi; i++) {
        if (i + 1 < c->hi) prefetch_record(p->starts[i + 1], p->lens[i + 1]);
        ctx->record = i;
        ctx->base = p->starts[i];
        if (!parse_example(ctx, p->starts[i], p->starts[i] + p->lens[i])) return 0;
    }
    return 1;
}

static int chunk_fill(Pool *p, Chunk *c) {
    Py_ssize_t k;
    if (!arrow_fill_range(p->specs, p->nspecs, c->lo, c->hi, c->outs)) return 0;
    for (k = 0; k < p->nspecs; k++) { /* each chunk ends where the next one starts */
        if (p->specs[k].refs && (c->outs[k].vi != c->ends[2 * k] ||
                                 c->outs[k].at != c->ends[2 * k + 1]))
            return 0;
    }
    return 1;
}

/* Take chunks until none is left (after a failure: skip them). */
static void pool_work(Pool *p, Ctx *ctx) {
    for (;;) {
        Chunk *c;
        int skip;
        pool_lock(p);
        if (p->next >= p->nchunks) {
            pool_unlock(p);
            return;
        }
        c = &p->chunks[p->next++];
        skip = p->stop;
        pool_unlock(p);
        c->ok = !skip && (p->pass == 1 ? chunk_parse(p, c, ctx) : chunk_fill(p, c));
        pool_lock(p);
        if (!c->ok) p->stop = 1;
        if (++p->done == p->nchunks) {
#ifdef HAVE_THREADS
            pthread_cond_broadcast(&p->cv);
#endif
        }
        pool_unlock(p);
    }
}

static void pool_release(Pool *p) {
    int last;
    pool_lock(p);
    last = --p->holders == 0;
    pool_unlock(p);
    if (last) {
#ifdef HAVE_THREADS
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
#endif
        free(p);
    }
}

#ifdef HAVE_THREADS
static void *pool_thread(void *arg) {
    Seat *seat = (Seat *)arg; /* (in the pool, which this thread holds) */
    Pool *p = seat->pool;
    pool_work(p, seat->ctx);
    pool_release(p);
    return NULL;
}
#endif

/* Run one pass over chunks on up to nthreads threads (the caller's included; GIL released by
 * the caller). 1 if every chunk succeeded, 0 if one failed, -1 out of memory. */
static int pool_run(int pass, Chunk *chunks, int nchunks, int nthreads, PaddedCtx *ctxs,
                    const uint8_t *const *starts, const Py_ssize_t *lens, Spec *specs,
                    Py_ssize_t nspecs) {
    Pool *p = (Pool *)calloc(1, sizeof(Pool));
    int t, ok = 1;
    if (!p) return -1;
#ifdef HAVE_THREADS
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return -1;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return -1;
    }
#endif
    p->pass = pass;
    p->nchunks = nchunks;
    p->chunks = chunks;
    p->starts = starts;
    p->lens = lens;
    p->specs = specs;
    p->nspecs = nspecs;
    p->holders = 1;
    for (t = 0; t < nthreads; t++) {
        p->seats[t].pool = p;
        p->seats[t].ctx = &ctxs[t].ctx;
    }
#ifdef HAVE_THREADS
    for (t = 1; t < nthreads; t++) {
        pthread_t tid;
        pthread_attr_t attr;
        int started = 0;
        pool_lock(p);
        p->holders++;
        pool_unlock(p);
        if (pthread_attr_init(&attr) == 0) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            started = pthread_create(&tid, &attr, pool_thread, &p->seats[t]) == 0;
            pthread_attr_destroy(&attr);
        }
        if (!started) { /* the caller does its share */
            pool_lock(p);
            p->holders--;
            pool_unlock(p);
            break;
        }
    }
#endif
    pool_work(p, &ctxs[0].ctx);
    pool_lock(p);
#ifdef HAVE_THREADS
    while (p->done < p->nchunks) pthread_cond_wait(&p->cv, &p->mu);
#endif
    pool_unlock(p);
    for (t = 0; t < nchunks; t++) ok &= chunks[t].ok;
    pool_release(p);
    return ok;
}

/* Arrow mode's two passes over n records on up to nthreads threads (2 <= nthreads <= 64), the
 * GIL held on entry and exit. 1: done; 0: hand the batch back (None); -1: a Python error is
 * set. */
static int arrow_threaded(Ctx *ctx, const uint8_t *const *starts, const Py_ssize_t *lens,
                          Py_ssize_t n, int nthreads, PyObject *alloc, Outs *outs) {
    Spec *specs = ctx->specs, *copies;
    Py_ssize_t nspecs = ctx->nspecs, i, k, at = 0;
    size_t per = (size_t)(nspecs ? nspecs : 1), spec_block = APART(sizeof(Spec) * per),
           outs_block = APART(sizeof(Outs) * per);
    PaddedCtx ctxs[MAX_THREADS];
    Chunk *chunks;
    char *cursors;
    int64_t *ends;
    int t, c, nchunks, ok;
    double total = 0, sofar = 0;
    nchunks = n / 2 < (Py_ssize_t)nthreads * 8 ? (int)(n / 2) : nthreads * 8;
    copies = (Spec *)malloc(spec_block * (size_t)nthreads);
    chunks = (Chunk *)calloc((size_t)nchunks, sizeof(Chunk)); /* (written once a chunk) */
    cursors = (char *)malloc(outs_block * (size_t)nchunks);
    ends = (int64_t *)malloc(sizeof(int64_t) * 2 * per * (size_t)nchunks);
    if (!copies || !chunks || !cursors || !ends) {
        ok = -1;
        goto out;
    }
    for (t = 0; t < nthreads; t++) {
        ctxs[t].ctx = *ctx;
        ctxs[t].ctx.specs = (Spec *)(void *)((char *)copies + (size_t)t * spec_block);
        ctxs[t].ctx.hint = 0;
        memcpy(ctxs[t].ctx.specs, specs, sizeof(Spec) * (size_t)nspecs);
    }
    for (i = 0; i < n; i++) total += (double)lens[i] + 16; /* (+16: a record's own cost) */
    for (c = 0; c < nchunks; c++) { /* chunks of about total / nchunks bytes each */
        chunks[c].lo = at;
        if (c == nchunks - 1) {
            at = n;
        } else {
            double goal = total * (double)(c + 1) / (double)nchunks;
            while (at < n && sofar + (double)lens[at] + 16 <= goal) sofar += (double)lens[at++] + 16;
        }
        chunks[c].hi = at;
        chunks[c].outs = (Outs *)(void *)(cursors + (size_t)c * outs_block);
        chunks[c].ends = ends + (size_t)c * 2 * per;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = pool_run(1, chunks, nchunks, nthreads, ctxs, starts, lens, specs, nspecs);
    Py_END_ALLOW_THREADS
    if (ok != 1) goto out;
    for (k = 0; k < nspecs; k++) {
        if (specs[k].refs && !arrow_alloc(&specs[k], n, alloc, &outs[k])) {
            ok = -2;
            goto out;
        }
    }
    for (k = 0; k < nspecs; k++) { /* each chunk's cursors: the sums of the chunks before */
        int64_t vi = 0, bytes = 0;
        for (c = 0; c < nchunks; c++) {
            Outs *o = &chunks[c].outs[k];
            *o = outs[k];
            o->vi = vi;
            o->at = bytes;
            if (specs[k].refs) {
                for (i = chunks[c].lo; i < chunks[c].hi; i++) {
                    vi += specs[k].refs[i].count;
                    bytes += specs[k].refs[i].nbytes;
                }
            }
            chunks[c].ends[2 * k] = vi;
            chunks[c].ends[2 * k + 1] = bytes;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    ok = pool_run(2, chunks, nchunks, nthreads, ctxs, starts, lens, specs, nspecs);
    Py_END_ALLOW_THREADS
out:
    if (ok == -1) PyErr_NoMemory();
    free(copies);
    free(chunks);
    free(cursors);
    free(ends);
    return ok < 0 ? -1 : ok;
}

/* ------------------------------------------------------------------ Python entry points */

/* parse_examples and parse_examples_arrow: arrow selects Arrow mode (alloc: its allocator). */
static PyObject *parse_common(PyObject *args, int arrow) {
    PyObject *payloads, *spec_seq, *spans_obj = Py_None, *alloc = NULL, *fast = NULL,
                                    *spec_fast = NULL, *result = NULL;
    Spec *specs = NULL;
    Outs *outs = NULL;
    Py_ssize_t n, nspecs = 0, i, nbuffers, nviews = 0;
    int64_t *spans_copy = NULL;
    const int64_t *spans = NULL;
    const uint8_t **starts = NULL;
    Py_ssize_t *lens = NULL;
    Py_buffer *views = NULL;
    Ctx ctx;
    int ok = 1;
    Py_ssize_t nthreads = 1, min_run_bytes = 0;
    int threaded = 0; /* both passes done by arrow_threaded() */

    if (arrow == 1) {
        if (!PyArg_ParseTuple(args, "OOOO|nn:parse_examples_arrow", &payloads, &spec_seq,
                              &spans_obj, &alloc, &nthreads, &min_run_bytes))
            return NULL;
        if (nthreads < 1 || min_run_bytes < 0) {
            PyErr_SetString(PyExc_ValueError, "nthreads must be at least 1, min_run_bytes >= 0");
            return NULL;
        }
    } else if (arrow) {
        if (!PyArg_ParseTuple(args, "OOOO:parse_sequence_arrow", &payloads, &spec_seq, &spans_obj,
                              &alloc))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "OO|O:parse_examples", &payloads, &spec_seq, &spans_obj)) {
        return NULL;
    }
    /* A tuple and a private copy of the spans: the spec conversions below may run Python code
     * (__index__), which must not be able to swap a payload or a span after its check. */
    fast = PySequence_Tuple(payloads);
    if (!fast) return NULL;
    spec_fast = PySequence_Fast(spec_seq, "specs must be a sequence");
    if (!spec_fast) goto done;
    n = nbuffers = PySequence_Fast_GET_SIZE(fast);
    if (spans_obj != Py_None) {
        Py_buffer spans_view;
        int int64_items;
        if (PyObject_GetBuffer(spans_obj, &spans_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        if (spans_view.itemsize == 8 && spans_view.format != NULL) {
            const char *f = spans_view.format + strspn(spans_view.format, "<=@");
            int64_items = f[0] != '\0' && strchr("qlQL", f[0]) != NULL && f[1] == '\0';
        } else {
            int64_items = 0;
        }
        if (!int64_items || spans_view.len % (Py_ssize_t)(3 * sizeof(int64_t)) != 0) {
            PyBuffer_Release(&spans_view);
            PyErr_SetString(PyExc_ValueError, "spans must be int64 (buffer, offset, length) triples");
            goto done;
        }
        n = spans_view.len / (Py_ssize_t)(3 * sizeof(int64_t));
        spans_copy = (int64_t *)malloc(spans_view.len ? (size_t)spans_view.len : 1);
        if (!spans_copy) {
            PyBuffer_Release(&spans_view);
            PyErr_NoMemory();
            goto done;
        }
        memcpy(spans_copy, spans_view.buf, (size_t)spans_view.len);
        PyBuffer_Release(&spans_view);
        spans = spans_copy;
        for (i = 0; i < nbuffers; i++) {
            if (!PyBytes_Check(PySequence_Fast_GET_ITEM(fast, i))) {
                PyErr_SetString(PyExc_TypeError, "spans index bytes objects only");
                goto done;
            }
        }
        for (i = 0; i < n; i++) {
            int64_t b = spans[3 * i], o = spans[3 * i + 1], len = spans[3 * i + 2];
            if (b < 0 || b >= nbuffers || o < 0 || len < 0 ||
                o > PyBytes_GET_SIZE(PySequence_Fast_GET_ITEM(fast, b)) - len) {
                PyErr_SetString(PyExc_ValueError, "a span lies outside its buffer");
                goto done;
            }
        }
    }
    nspecs = PySequence_Fast_GET_SIZE(spec_fast);
    specs = (Spec *)calloc((size_t)(nspecs ? nspecs : 1), sizeof(Spec));
    outs = (Outs *)calloc((size_t)(nspecs ? nspecs : 1), sizeof(Outs));
    if (!specs || !outs) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < nspecs; i++) {
        Spec *s = &specs[i];
        PyObject *t = PySequence_Fast_GET_ITEM(spec_fast, i), *out, *dflt, *counts;
        size_t need = 0;
        int kept; /* Arrow mode keeps this spec's lists for pass 2 */
        if (!PyArg_ParseTuple(t, "y#inOOO:spec", &s->key, &s->keylen, &s->mode, &s->count, &out,
                              &dflt, &counts))
            goto done;
        if (s->mode < M_INT64 || s->mode > M_VAR_BYTES || s->count < 0) {
            PyErr_SetString(PyExc_ValueError, "bad spec mode or count");
            goto done;
        }
        kept = arrow == 2 || (arrow && (s->mode == M_BYTES || s->mode > M_RAW));
        s->kind = (s->mode == M_INT64 || s->mode == M_VAR_INT64)   ? K_INT64
                  : (s->mode == M_FLOAT || s->mode == M_VAR_FLOAT) ? K_FLOAT
                                                                   : K_BYTES;
        s->itemsize = s->mode == M_FLOAT ? 4 : s->mode == M_RAW ? 1 : s->mode == M_BYTES ? 16 : 8;
        if (arrow == 2) { /* steps: refs grow as they come; counts gets the steps a record */
            if (dflt != Py_None) {
                PyErr_SetString(PyExc_ValueError, "a step has no default");
                goto done;
            }
            /* room for 16 steps a record up front (at most 8 MiB; pages are taken as they
             * are written): growing by realloc copied most of them (1.1x at 8,192 records) */
            s->refs = seq_refs_take(64 + (size_t)(n < 16384 ? n : 16384) * 16, &s->refcap);
            if (!s->refs) {
                PyErr_NoMemory();
                goto done;
            }
            if (PyObject_GetBuffer(counts, &s->counts_view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            s->have_counts = 1;
            if ((size_t)s->counts_view.len < (size_t)n * 8) {
                PyErr_SetString(PyExc_ValueError, "counts buffer too small");
                goto done;
            }
            s->counts = (int64_t *)s->counts_view.buf;
        } else if (kept) {
            s->refs = (Ref *)malloc(sizeof(Ref) * (size_t)(n ? n : 1));
            if (!s->refs) {
                PyErr_NoMemory();
                goto done;
            }
        } else if (s->mode <= M_RAW) {
            if (PyObject_GetBuffer(out, &s->out_view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            s->have_out = 1;
            s->out = (char *)s->out_view.buf;
            if (n && (size_t)s->count > ((size_t)PY_SSIZE_T_MAX / 16) / (size_t)n) {
                PyErr_SetString(PyExc_ValueError, "output too large");
                goto done;
            }
            need = (size_t)n * (size_t)s->count * (size_t)s->itemsize;
            if ((size_t)s->out_view.len < need) {
                PyErr_SetString(PyExc_ValueError, "output buffer too small");
                goto done;
            }
        } else {
            if (PyObject_GetBuffer(counts, &s->counts_view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            s->have_counts = 1;
            if ((size_t)s->counts_view.len < (size_t)n * 8) {
                PyErr_SetString(PyExc_ValueError, "counts buffer too small");
                goto done;
            }
            s->counts = (int64_t *)s->counts_view.buf;
        }
        if (dflt != Py_None) {
            s->has_default = 1;
            if (s->mode == M_INT64 || s->mode == M_FLOAT) {
                if (PyObject_GetBuffer(dflt, &s->dflt_view, PyBUF_C_CONTIGUOUS) < 0) goto done;
                s->have_dflt = 1;
                if ((size_t)s->dflt_view.len != (size_t)s->count * (size_t)s->itemsize) {
                    PyErr_SetString(PyExc_ValueError, "default has the wrong size");
                    goto done;
                }
                s->dflt = (const char *)s->dflt_view.buf;
            } else if (kept && s->mode == M_BYTES) { /* the values themselves */
                Py_ssize_t j;
                s->dflt_items = PySequence_Tuple(dflt);
                if (!s->dflt_items) goto done;
                if (PyTuple_GET_SIZE(s->dflt_items) != s->count) {
                    PyErr_SetString(PyExc_ValueError, "default has the wrong size");
                    goto done;
                }
                for (j = 0; j < s->count; j++) {
                    PyObject *item = PyTuple_GET_ITEM(s->dflt_items, j);
                    if (!PyBytes_Check(item)) {
                        PyErr_SetString(PyExc_TypeError, "bytes defaults must be bytes");
                        goto done;
                    }
                    s->dflt_nbytes += (size_t)PyBytes_GET_SIZE(item);
                }
            }
        }
    }

    /* Every record's bytes, held until the end (Arrow mode reads them again in pass 2). */
    starts = (const uint8_t **)malloc(sizeof(*starts) * (size_t)(n ? n : 1));
    lens = (Py_ssize_t *)malloc(sizeof(*lens) * (size_t)(n ? n : 1));
    if (!starts || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, spans ? spans[3 * i] : i);
        if (PyBytes_Check(item)) {
            starts[i] = (const uint8_t *)PyBytes_AS_STRING(item) + (spans ? spans[3 * i + 1] : 0);
            lens[i] = spans ? (Py_ssize_t)spans[3 * i + 2] : PyBytes_GET_SIZE(item);
            continue;
        }
        if (!views) { /* any C-contiguous buffer (without spans only) */
            views = (Py_buffer *)malloc(sizeof(Py_buffer) * (size_t)n);
            if (!views) {
                PyErr_NoMemory();
                goto done;
            }
        }
        if (PyObject_GetBuffer(item, &views[nviews], PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        starts[i] = (const uint8_t *)views[nviews].buf;
        lens[i] = views[nviews].len;
        nviews++;
    }

    ctx.specs = specs;
    ctx.nspecs = nspecs;
    ctx.arrow = arrow;
    ctx.hint = 0;
    if (!little_endian()) ok = 0;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if (nthreads > n / 2) nthreads = n / 2; /* (at least two records a thread) */
    if (nthreads > 1 && min_run_bytes > 0) { /* and at least min_run_bytes of payload each */
        Py_ssize_t total = 0;
        for (i = 0; i < n; i++) total += lens[i];
        if (nthreads > total / min_run_bytes) nthreads = total / min_run_bytes;
    }
    if (ok && arrow == 1 && nthreads > 1) {
        int done_ok = arrow_threaded(&ctx, starts, lens, n, (int)nthreads, alloc, outs);
        if (done_ok < 0) goto done;
        threaded = 1;
        if (!done_ok) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    } else if (ok) {
        Py_BEGIN_ALLOW_THREADS /* pass 1 reads held buffers and writes our own memory only */
        for (i = 0; ok && i < n; i++) {
            if (i + 1 < n) prefetch_record(starts[i + 1], lens[i + 1]);
            ctx.record = i;
            ctx.base = starts[i];
            ok = arrow == 2 ? parse_sequence(&ctx, starts[i], starts[i] + lens[i])
                            : parse_example(&ctx, starts[i], starts[i] + lens[i]);
        }
        Py_END_ALLOW_THREADS
    }
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (arrow && !threaded) { /* pass 2: outputs of the exact sizes, filled without the GIL */
        for (i = 0; i < nspecs; i++) {
            Py_ssize_t rows = arrow == 2 ? (Py_ssize_t)specs[i].nrefs : n; /* steps / records */
            if (specs[i].refs && !arrow_alloc(&specs[i], rows, alloc, &outs[i])) goto done;
        }
        Py_BEGIN_ALLOW_THREADS
        ok = arrow == 2 ? seq_fill(specs, nspecs, n, outs) : arrow_fill(specs, nspecs, n, outs);
        Py_END_ALLOW_THREADS
        if (!ok) { /* (a buffer payload changed between the passes) */
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    result = PyList_New(nspecs);
    if (!result) goto done;
    for (i = 0; i < nspecs; i++) {
        PyObject *v;
        if (specs[i].refs) {
            int k;
            v = PyTuple_New(outs[i].nbuf);
            if (v) {
                for (k = 0; k < outs[i].nbuf; k++) {
                    Py_INCREF(outs[i].obj[k]);
                    PyTuple_SET_ITEM(v, k, outs[i].obj[k]);
                }
            }
        } else if (specs[i].mode > M_RAW) {
            v = PyByteArray_FromStringAndSize(specs[i].vbuf ? specs[i].vbuf : "",
                                              (Py_ssize_t)specs[i].vlen);
        } else {
            v = Py_None;
            Py_INCREF(v);
        }
        if (!v) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, v);
    }

done:
    if (outs) {
        for (i = 0; i < nspecs; i++) {
            int k;
            for (k = 0; k < 3; k++) {
                if (outs[i].obj[k]) {
                    PyBuffer_Release(&outs[i].view[k]);
                    Py_DECREF(outs[i].obj[k]);
                }
            }
        }
        free(outs);
    }
    for (i = 0; i < nviews; i++) PyBuffer_Release(&views[i]);
    free(views);
    free(starts);
    free(lens);
    for (i = 0; specs && arrow == 2 && i < nspecs; i++) { /* steps: kept for the next call */
        seq_refs_give(specs[i].refs, specs[i].refcap);
        specs[i].refs = NULL;
    }
    if (specs) release_specs(specs, nspecs);
    free(spans_copy);
    Py_XDECREF(spec_fast);
    Py_XDECREF(fast);
    return result;
}

PyDoc_STRVAR(parse_examples_doc,
"parse_examples(payloads, specs, spans=None) -> list | None\n\n"
"Decode serialized Examples into preallocated buffers. specs is a sequence of tuples\n"
"(key: bytes, mode: int, count: int, out, default, counts): out is a writable C-contiguous\n"
"buffer for the fixed modes, default a bytes-like (numeric modes) or any non-None object\n"
"(bytes mode) or None, counts a writable int64 buffer of len(payloads) for the var modes.\n"
"Returns a list with a bytearray of appended values for each var-mode spec (None for the\n"
"others), or None when the batch must be decoded by the Python path instead. With spans\n"
"(a C-contiguous int64 buffer of (buffer index, offset, length) triples), record i is\n"
"payloads[b][o:o + n] of its triple (payloads: bytes objects; ValueError outside them).");

static PyObject *parse_examples(PyObject *self, PyObject *args) {
    (void)self;
    return parse_common(args, 0);
}

PyDoc_STRVAR(parse_examples_arrow_doc,
"parse_examples_arrow(payloads, specs, spans, alloc, nthreads=1, min_run_bytes=0)\n"
"    -> list | None\n\n"
"parse_examples() with the var-length and bytes features written as Arrow buffers of exact\n"
"sizes (a first pass counts, a second writes; the GIL is released for both). With nthreads\n"
"> 1 both passes run on up to nthreads threads (at most 64), each over a run of consecutive\n"
"records (at least 2, and min_run_bytes of payload): the same output. alloc(nbytes)\n"
"returns a writable buffer of at least nbytes. For these specs out and counts are ignored and\n"
"a bytes default is the sequence of its count values (bytes). The list holds, per spec:\n"
"var int64 / float: (list offsets, values); var bytes: (list offsets, value offsets, data);\n"
"fixed bytes: (value offsets, data) (offsets int64, from 0); None for the others (written\n"
"to out as by parse_examples). None when the Python path must decode the batch instead.");

static PyObject *parse_examples_arrow(PyObject *self, PyObject *args) {
    (void)self;
    return parse_common(args, 1);
}

PyDoc_STRVAR(parse_sequence_arrow_doc,
"parse_sequence_arrow(payloads, specs, spans, alloc) -> list | None\n\n"
"The feature lists of serialized SequenceExamples (the context is skipped: decode it as an\n"
"Example) as Arrow buffers of exact sizes, one spec tuple per list, as parse_examples_arrow's\n"
"with out ignored, default None and counts a writable int64 buffer of len(payloads) that gets\n"
"the steps of each record. Each step is decoded as one record of parse_examples_arrow (no\n"
"default: it is there). The list holds, per spec: fixed int64 / float, raw: (values,);\n"
"the others as parse_examples_arrow. None when the Python path must decode the batch instead\n"
"(anything damaged, a step of the wrong kind or count, a list named twice in a record).");

static PyObject *parse_sequence_arrow(PyObject *self, PyObject *args) {
    (void)self;
    return parse_common(args, 2);
}

PyDoc_STRVAR(shortest_bytes_doc,
"shortest_bytes(payloads) -> int\n\n"
"The length of the shortest payload when every payload is exactly bytes (PY_SSIZE_T_MAX\n"
"for none), -1 when one is any other object (the caller then makes them flat bytes).");

static PyObject *shortest_bytes(PyObject *self, PyObject *payloads) {
    PyObject *fast = PySequence_Fast(payloads, "payloads must be a sequence");
    Py_ssize_t i, n, best = PY_SSIZE_T_MAX;
    (void)self;
    if (!fast) return NULL;
    n = PySequence_Fast_GET_SIZE(fast);
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_CheckExact(item)) {
            best = -1;
            break;
        }
        if (PyBytes_GET_SIZE(item) < best) best = PyBytes_GET_SIZE(item);
    }
    Py_DECREF(fast);
    return PyLong_FromSsize_t(best);
}

PyDoc_STRVAR(gather_spans_doc,
"gather_spans(payloads, rows, spans) -> bytearray\n\n"
"The bytes of every span, one after another: span k is payloads[rows[k]][o:o + n] where\n"
"(o, n) = spans[2k], spans[2k + 1] (rows: int64, spans: int64 pairs, C-contiguous; what\n"
"parse_examples wrote for bytes features). ValueError for a span outside its payload.");

/* The byte length of a payload (bytes or any buffer); -1 with an exception set. */
static Py_ssize_t payload_size(PyObject *item) {
    Py_buffer view;
    Py_ssize_t size;
    if (PyBytes_Check(item)) return PyBytes_GET_SIZE(item);
    if (PyObject_GetBuffer(item, &view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    size = view.len;
    PyBuffer_Release(&view);
    return size;
}

static PyObject *gather_spans(PyObject *self, PyObject *args) {
    PyObject *payloads, *rows_obj, *spans_obj, *fast = NULL, *out = NULL;
    Py_buffer rows_view, spans_view, view;
    int have_rows = 0, have_spans = 0, have_view = 0;
    Py_ssize_t n, m, k, held = -1;
    size_t total = 0, at = 0;
    const int64_t *rows, *spans;
    const char *base = NULL;
    Py_ssize_t base_len = 0;
    (void)self;

    if (!PyArg_ParseTuple(args, "OOO:gather_spans", &payloads, &rows_obj, &spans_obj)) return NULL;
    fast = PySequence_Fast(payloads, "payloads must be a sequence");
    if (!fast) return NULL;
    n = PySequence_Fast_GET_SIZE(fast);
    if (PyObject_GetBuffer(rows_obj, &rows_view, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_rows = 1;
    if (PyObject_GetBuffer(spans_obj, &spans_view, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_spans = 1;
    m = rows_view.len / 8;
    if (rows_view.len % 8 || spans_view.len != rows_view.len * 2) {
        PyErr_SetString(PyExc_ValueError, "rows and spans disagree in size");
        goto done;
    }
    rows = (const int64_t *)rows_view.buf;
    spans = (const int64_t *)spans_view.buf;
    for (k = 0; k < m; k++) { /* every span checked before the one allocation */
        int64_t row = rows[k], offset = spans[2 * k], length = spans[2 * k + 1];
        Py_ssize_t size;
        if (length < 0 || (uint64_t)length > (uint64_t)PY_SSIZE_T_MAX - total) {
            PyErr_SetString(PyExc_ValueError, "bad span length");
            goto done;
        }
        if (row < 0 || row >= n) {
            PyErr_SetString(PyExc_ValueError, "span row out of range");
            goto done;
        }
        size = payload_size(PySequence_Fast_GET_ITEM(fast, row));
        if (size < 0) goto done;
        if (offset < 0 || offset > (int64_t)size || length > (int64_t)size - offset) {
            PyErr_SetString(PyExc_ValueError, "span outside its payload");
            goto done;
        }
        total += (size_t)length;
    }
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!out) goto done;
    for (k = 0; k < m; k++) {
        int64_t row = rows[k], offset = spans[2 * k], length = spans[2 * k + 1];
        if (row < 0 || row >= n) {
            PyErr_SetString(PyExc_ValueError, "span row out of range");
            Py_CLEAR(out);
            goto done;
        }
        if (row != held) {
            PyObject *item = PySequence_Fast_GET_ITEM(fast, row);
            if (have_view) {
                PyBuffer_Release(&view);
                have_view = 0;
            }
            if (PyBytes_Check(item)) {
                base = PyBytes_AS_STRING(item);
                base_len = PyBytes_GET_SIZE(item);
            } else {
                if (PyObject_GetBuffer(item, &view, PyBUF_C_CONTIGUOUS) < 0) {
                    Py_CLEAR(out);
                    goto done;
                }
                have_view = 1;
                base = (const char *)view.buf;
                base_len = view.len;
            }
            held = row;
        }
        if (offset < 0 || offset > (int64_t)base_len || length > (int64_t)base_len - offset) {
            PyErr_SetString(PyExc_ValueError, "span outside its payload");
            Py_CLEAR(out);
            goto done;
        }
        if ((size_t)length > total - at) { /* (the buffers changed between the passes) */
            PyErr_SetString(PyExc_ValueError, "spans changed while gathered");
            Py_CLEAR(out);
            goto done;
        }
        memcpy(PyByteArray_AS_STRING(out) + at, base + offset, (size_t)length);
        at += (size_t)length;
    }

done:
    if (have_view) PyBuffer_Release(&view);
    if (have_spans) PyBuffer_Release(&spans_view);
    if (have_rows) PyBuffer_Release(&rows_view);
    Py_XDECREF(fast);
    return out;
}

static PyMethodDef methods[] = {
    {"parse_examples", parse_examples, METH_VARARGS, parse_examples_doc},
    {"parse_examples_arrow", parse_examples_arrow, METH_VARARGS, parse_examples_arrow_doc},
    {"parse_sequence_arrow", parse_sequence_arrow, METH_VARARGS, parse_sequence_arrow_doc},
    {"shortest_bytes", shortest_bytes, METH_O, shortest_bytes_doc},
    {"gather_spans", gather_spans, METH_VARARGS, gather_spans_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_cexample",
    "C accelerator for streamrec.format.example.decode_batch (see _cexample.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__cexample(void) { return PyModule_Create(&module); }
