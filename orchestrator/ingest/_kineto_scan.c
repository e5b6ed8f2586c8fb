/* One sub-block of Kineto's JSON events reduced to columns in C (rankscope.orchestrator.ingest).
 *
 * Why C: the reader's Python reduction of msgspec's decoded events (attribute reads, string
 * interning, per-event generators) was ~60 % of the reader's time on a 54 MB rank; this scanner
 * reads the JSON text once and emits the columns of the complete ("X") events directly
 * (docs/performance.md, issue 31's twelfth pass).
 *
 * Exactness by refusal: scan() returns None for ANY input it does not reduce exactly as
 * msgspec's decode followed by event_columns.EventColumns.extract would, and the caller then
 * takes that path (which also produces the error message for bad input). It refuses: any JSON
 * syntax error; a string with a control character, an invalid escape, a \u escape of a
 * surrogate, or invalid UTF-8 (anywhere, also where msgspec would skip it: refusing more is
 * safe); a float that is not finite; an object key written with an escape; a repeated key among
 * the ones read here; a known field of the wrong type (ph/name/cat not a string, pid/tid not an
 * int or string, ts not a number, dur not a number or null, args not an object or null); an
 * integer ts/dur/pid/tid outside int64; a fractional ts >= the exact limit (the caller decodes
 * such a block with Decimal stamps, kineto_json.needs_exact); nesting deeper than MAX_DEPTH.
 *
 * What it returns for the events it accepts (units: ts/dur in the trace's microseconds, as
 * float64, exactly the values msgspec's int | float gives after float()):
 *   (n_x, n_far, n_bad, ts, dur, name, name_uniq, cat, cat_uniq, pid, pid_uniq, tid, tid_uniq,
 *    corr, starts, ends, dims, shape_spans, others, memory, sign)
 * n_x: complete events; n_far/n_bad: of those, dropped as out of range / bad duration (the rule
 * of EventColumns.extract); the arrays (bytearrays: float64 ts/dur, int32 name/cat codes, int64
 * pid/tid codes, int64 correlation or -1, int64 [start, end) byte spans of each kept event,
 * int8 1 where args."Input Dims" is present and not null) are over the kept complete events, in
 * order; shape_spans: int64 [start, end) of the "Input Dims" and "Input type" values' text of
 * each event flagged in dims, in order (-1, -1: no "Input type"); *_uniq: the distinct values in first-seen order (codes index them); others: the "M"
 * and "i" events' text as one JSON array, in order (bytes, empty when none: the caller decodes
 * those few with msgspec), without the "[memory]" events when memory holds them; memory: None,
 * or, when every "[memory]" event is well-formed (memory_columns._memory_event's test, with the
 * limits passed in), (ts, device_type, device_id, addr, bytes, total_allocated, total_reserved,
 * pid codes, pid_uniq, tid codes, tid_uniq): float64 µs and int64 columns; sign: an event with
 * a non-null args.rank or an integer pid >= pid_block (multirank.block_signs).
 *
 * A batch (scan_start / scan_take / scan_finish) scans the sub-blocks of one block in order on
 * a thread of its own, without the GIL, while the caller reduces the ones before in Python: the
 * interning keeps bytes and ints (Python objects are made at the take), the allocations are
 * PyMem_Raw's, and what only Python's float parser settles (a number it must read, a skipped
 * one whose digits leave its finiteness open) sends the span back to a scan with the GIL.
 * The 54 MB df_index_resolver rank reads in ~0.075 s instead of ~0.097 s (docs/performance.md).
 *
 * Why one file of ~1,200 lines: one parser; its strings, numbers, events, interning and
 * refusal rules share the parser's state and must refuse alike, and split each part would
 * restate them; the batch runs that same parser, on another thread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_NUMBER_CHARS 400

/* Outcomes: OK, REFUSE (return None, no Python error set), FAIL (a Python error is set, or,
 * without one, memory ran out), NEED_GIL (a worker thread met what only Python's parser reads:
 * the text is scanned again with the GIL, scan()'s way). */
enum { OK = 0, REFUSE = 1, FAIL = 2, NEED_GIL = 3 };

typedef struct {
    const unsigned char *p, *end;
    char *scratch; /* decoded text of strings with escapes */
    Py_ssize_t scratch_cap;
    int nogil; /* on a thread without the GIL: no Python call (NEED_GIL where one is needed) */
} Parser;

/* A JSON string: its decoded UTF-8 bytes (ptr into the text, or into scratch when escaped). */
typedef struct {
    const char *s;
    Py_ssize_t n;
} Str;

typedef enum { NUM_INT, NUM_BIG, NUM_FLOAT } NumKind;

typedef struct {
    NumKind kind;
    int64_t i;
    double d;
} Num;

/* ---- growable arrays --------------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap; /* bytes */
} Buf;

/* *data (PyMem_Raw: usable without the GIL) grown to hold at least need bytes, its capacity
 * doubled from first; FAIL without a Python error when memory runs out. */
static int grow(char **data, Py_ssize_t *cap, Py_ssize_t need, Py_ssize_t first) {
    if (need <= *cap) return OK;
    Py_ssize_t c = *cap ? *cap : first;
    while (c < need) c *= 2;
    char *d = PyMem_RawRealloc(*data, c);
    if (!d) return FAIL;
    *data = d;
    *cap = c;
    return OK;
}

static int buf_push(Buf *b, const void *item, Py_ssize_t size) {
    if (grow(&b->data, &b->cap, b->len + size, 4096) != OK) return FAIL;
    if (size) memcpy(b->data + b->len, item, size);
    b->len += size;
    return OK;
}

static PyObject *buf_take(Buf *b) {
    return PyByteArray_FromStringAndSize(b->data ? b->data : "", b->len);
}

/* ---- first-seen interning ---------------------------------------------------------------- */

/* The values are kept as bytes (a str's UTF-8, valid: the parser refuses any other) or int64,
 * and made Python objects only by table_uniq, with the GIL: a worker thread interns too. */
typedef struct {
    uint64_t hash;
    int64_t off; /* the key's UTF-8 in the table's keys */
    Py_ssize_t n;
    int64_t ival;
    int is_int;
    int64_t code; /* -1: empty slot */
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t cap, used;
    Buf keys;    /* the string keys' bytes, one after the other */
    Buf entries; /* a Slot (without code) per code, in code order: the distinct values */
} Table;

static int table_init(Table *t) {
    memset(t, 0, sizeof(*t));
    t->cap = 64;
    t->slots = PyMem_RawMalloc(sizeof(Slot) * t->cap);
    if (!t->slots) return FAIL;
    for (Py_ssize_t i = 0; i < t->cap; i++) t->slots[i].code = -1;
    return OK;
}

static void table_free(Table *t) {
    PyMem_RawFree(t->slots);
    PyMem_RawFree(t->keys.data);
    PyMem_RawFree(t->entries.data);
    memset(t, 0, sizeof(*t));
}

static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    /* 8 bytes a step, multiply-xorshift mixing (a hash of the table's only: any spread will do) */
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, s + i, (size_t)(n - i));
        h = (h ^ w) * 0x94D049BB133111EBULL;
        h ^= h >> 29;
    }
    return h;
}

static uint64_t hash_int(int64_t v) {
    uint64_t x = (uint64_t)v * 0x9E3779B97F4A7C15ULL;
    return (x ^ (x >> 29)) | 1; /* never equal to a string hash by chance alone: is_int decides */
}

static int table_grow(Table *t) {
    Py_ssize_t cap = t->cap * 2;
    Slot *slots = PyMem_RawMalloc(sizeof(Slot) * cap);
    if (!slots) return FAIL;
    for (Py_ssize_t i = 0; i < cap; i++) slots[i].code = -1;
    for (Py_ssize_t i = 0; i < t->cap; i++) {
        if (t->slots[i].code < 0) continue;
        Py_ssize_t j = (Py_ssize_t)(t->slots[i].hash & (uint64_t)(cap - 1));
        while (slots[j].code >= 0) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    PyMem_RawFree(t->slots);
    t->slots = slots;
    t->cap = cap;
    return OK;
}

/* The code of a string (is_int 0) or an int (is_int 1) in t, kept as a new value when new. */
static int table_code(Table *t, int is_int, const char *s, Py_ssize_t n, int64_t ival,
                      int64_t *code) {
    uint64_t h = is_int ? hash_int(ival) : hash_bytes(s, n);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(t->cap - 1));
    while (t->slots[j].code >= 0) {
        Slot *sl = &t->slots[j];
        if (sl->hash == h && sl->is_int == is_int &&
            (is_int ? sl->ival == ival
                    : (sl->n == n && (n == 0 || memcmp(t->keys.data + sl->off, s, n) == 0)))) {
            *code = sl->code;
            return OK;
        }
        j = (j + 1) & (t->cap - 1);
    }
    Slot sl = {h, is_int ? 0 : t->keys.len, is_int ? 0 : n, ival, is_int, t->used};
    if (!is_int && buf_push(&t->keys, s, n) != OK) return FAIL; /* s may be scratch: copied */
    if (buf_push(&t->entries, &sl, sizeof(sl)) != OK) return FAIL;
    t->slots[j] = sl;
    *code = t->used++;
    if (t->used * 2 > t->cap) return table_grow(t);
    return OK;
}

/* The distinct values in code order, as a new list of str / int (with the GIL). */
static PyObject *table_uniq(const Table *t) {
    PyObject *list = PyList_New(t->used);
    if (!list) return NULL;
    const Slot *e = (const Slot *)t->entries.data;
    for (Py_ssize_t i = 0; i < t->used; i++) {
        PyObject *obj = e[i].is_int ? PyLong_FromLongLong(e[i].ival)
                                    : PyUnicode_DecodeUTF8(e[i].n ? t->keys.data + e[i].off : "",
                                                           e[i].n, "strict");
        if (!obj) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, obj);
    }
    return list;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

/* 1 for a byte that a string holds as is (not a quote, backslash, control or non-ASCII). */
static unsigned char plain[256];

static void init_tables(void) {
    for (int c = 0; c < 256; c++) plain[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

static void skip_ws(Parser *ps) {
    const unsigned char *p = ps->p;
    while (p < ps->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    ps->p = p;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Length of a valid UTF-8 sequence at p (1-4), 0 when invalid (overlong, surrogate, > U+10FFFF,
 * truncated): the rules of Python's strict decoder. */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        if (end - p < 2 || (p[1] & 0xC0) != 0x80) return 0;
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

static int scratch_reserve(Parser *ps, Py_ssize_t n) {
    return grow(&ps->scratch, &ps->scratch_cap, n, 256);
}

/* A string at ps->p (its opening quote). With out: its decoded bytes (escapes decoded into
 * scratch, valid until the next decoded string); escaped is set when it held an escape. */
static int parse_string(Parser *ps, Str *out, int *escaped) {
    const unsigned char *p = ps->p + 1, *end = ps->end, *start = p;
    int esc = 0;
    while (1) {
        while (p < end && plain[*p]) p++;
        if (p >= end) return REFUSE;
        unsigned char c = *p;
        if (c == '"') break;
        if (c < 0x20) return REFUSE;
        if (c == '\\') {
            esc = 1;
            if (p + 1 >= end) return REFUSE;
            unsigned char e = p[1];
            if (e == 'u') {
                if (end - p < 6) return REFUSE;
                int v = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hexval(p[k]);
                    if (h < 0) return REFUSE;
                    v = v * 16 + h;
                }
                if (v >= 0xD800 && v <= 0xDFFF) return REFUSE;
                p += 6;
            } else if (strchr("\"\\/bfnrt", e) && e) {
                p += 2;
            } else {
                return REFUSE;
            }
            continue;
        }
        if (c < 0x80) {
            p++;
            continue;
        }
        int k = utf8_len(p, end);
        if (!k) return REFUSE;
        p += k;
    }
    ps->p = p + 1;
    if (escaped) *escaped = esc;
    if (!out) return OK;
    if (!esc) {
        out->s = (const char *)start;
        out->n = p - start;
        return OK;
    }
    if (scratch_reserve(ps, p - start) != OK) return FAIL; /* decoded is never longer */
    char *w = ps->scratch;
    for (const unsigned char *q = start; q < p;) {
        if (*q != '\\') {
            *w++ = (char)*q++;
            continue;
        }
        unsigned char e = q[1];
        q += 2;
        switch (e) {
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            int v = 0;
            for (int k = 0; k < 4; k++) v = v * 16 + hexval(q[k]);
            q += 4;
            if (v < 0x80) {
                *w++ = (char)v;
            } else if (v < 0x800) {
                *w++ = (char)(0xC0 | (v >> 6));
                *w++ = (char)(0x80 | (v & 0x3F));
            } else {
                *w++ = (char)(0xE0 | (v >> 12));
                *w++ = (char)(0x80 | ((v >> 6) & 0x3F));
                *w++ = (char)(0x80 | (v & 0x3F));
            }
            break;
        }
        default: *w++ = (char)e; /* " \ / */
        }
    }
    out->s = ps->scratch;
    out->n = w - ps->scratch;
    return OK;
}

/* 10**k for k = 0..22: every one exactly a double (5**22 < 2**53). */
static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The value of the decimal [q, p) (digits, a '.' at int_end, digits up to p: no sign, no
 * exponent) into *d when it can be had with one IEEE division, exactly what a correctly
 * rounded parser gives (Clinger's fast path): all its digits make an integer M <= 2**53 and it
 * has at most 22 after the point, so M and 10**k are doubles and M / 10**k is rounded once.
 * Kineto's fractional stamps the scanner takes (below 2**43 us, 3 decimals: at most 16 digits)
 * all are. Returns 0 (nothing set) otherwise (more digits); the caller then asks Python's
 * parser, as for an exponent. */
static int fast_decimal(const unsigned char *q, const unsigned char *int_end,
                        const unsigned char *p, int neg, double *d) {
    Py_ssize_t frac = p - int_end - 1;
    if (frac > 22 || (int_end - q) + frac > 16) return 0; /* 16 digits < 10**16 < 2**64 */
    uint64_t m = 0;
    for (; q < int_end; q++) m = m * 10 + (unsigned)(*q - '0');
    for (q = int_end + 1; q < p; q++) m = m * 10 + (unsigned)(*q - '0');
    if (m > ((uint64_t)1 << 53)) return 0;
    double v = (double)m / POW10[frac];
    *d = neg ? -v : v;
    return 1;
}

/* A number at ps->p (JSON's grammar). Integers: NUM_INT when within int64, else NUM_BIG;
 * decimals and exponents: NUM_FLOAT, converted by Python's own correctly rounded parser
 * (refused when not finite: msgspec refuses those as out of range). */
static int parse_number(Parser *ps, Num *out, int need) {
    const unsigned char *p = ps->p, *end = ps->end, *start = p;
    int neg = 0, is_float = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end) return REFUSE;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return REFUSE;
    }
    const unsigned char *int_end = p, *frac_end = NULL;
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') return REFUSE;
        while (p < end && *p >= '0' && *p <= '9') p++;
        frac_end = p;
    }
    int has_exp = 0, exp_neg = 0;
    const unsigned char *exp_digits = NULL;
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        has_exp = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) exp_neg = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9') return REFUSE;
        exp_digits = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    ps->p = p;
    if (!is_float) {
        const unsigned char *q = start + neg;
        Py_ssize_t digits = int_end - q;
        uint64_t v = 0;
        int big = 0;
        if (digits <= 19) { /* < 10**19 < 2**64: no overflow on the way */
            for (; q < int_end; q++) v = v * 10 + (unsigned)(*q - '0');
        } else {
            big = 1; /* no leading zeros in JSON: >= 10**19 > INT64_MAX */
        }
        if (!big && (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX)) big = 1;
        if (big) {
            out->kind = NUM_BIG;
            return OK;
        }
        out->kind = NUM_INT;
        out->i = neg ? (int64_t)(0 - v) : (int64_t)v;
        return OK;
    }
    if (frac_end && !has_exp && fast_decimal(start + neg, int_end, frac_end, neg, &out->d)) {
        out->kind = NUM_FLOAT;
        return OK;
    }
    Py_ssize_t n = p - start;
    if (n > MAX_NUMBER_CHARS) return REFUSE;
    if (ps->nogil) {
        /* Python's correctly rounded parser needs the GIL. A value skipped (need 0) is only
         * checked to be finite, which its digits show: below 10**300 whatever its rounding
         * (at most 300 digits before the point, exponent included; a negative exponent only
         * makes it smaller). Else the GIL's path decides (NEED_GIL), as for a value read. */
        if (need) return NEED_GIL;
        Py_ssize_t int_digits = int_end - (start + neg);
        if (!has_exp) return int_digits <= 300 ? OK : NEED_GIL;
        if (exp_neg) return OK;
        if (p - exp_digits > 4) return NEED_GIL;
        long e = 0;
        for (const unsigned char *q = exp_digits; q < p; q++) e = e * 10 + (*q - '0');
        return int_digits + e <= 300 ? OK : NEED_GIL;
    }
    char tmp[MAX_NUMBER_CHARS + 1];
    memcpy(tmp, start, n);
    tmp[n] = 0;
    char *stop = NULL;
    double d = PyOS_string_to_double(tmp, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred()) return FAIL;
    if (stop != tmp + n || !isfinite(d)) return REFUSE;
    out->kind = NUM_FLOAT;
    out->d = d;
    return OK;
}

static int skip_value(Parser *ps, int depth);

/* Past a container's opening byte: 1 when it closes at once ("{}", "[]"), else 0. */
static int container_open(Parser *ps, unsigned char close) {
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* An object member's `"key":` (decoded into key when given, escaped set when it held an
 * escape); ps is left at the value. */
static int object_key(Parser *ps, Str *key, int *escaped) {
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') return REFUSE;
    int r = parse_string(ps, key, escaped);
    if (r != OK) return r;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') return REFUSE;
    ps->p++;
    skip_ws(ps);
    return OK;
}

/* After a member: past a ',' (*more = 1) or the closing byte (*more = 0); REFUSE otherwise. */
static int container_next(Parser *ps, unsigned char close, int *more) {
    skip_ws(ps);
    if (ps->p < ps->end && (*ps->p == ',' || *ps->p == close)) {
        *more = *ps->p == ',';
        ps->p++;
        return OK;
    }
    return REFUSE;
}

static int skip_container(Parser *ps, int depth, unsigned char close) {
    if (depth > MAX_DEPTH) return REFUSE;
    if (container_open(ps, close)) return OK;
    int more = 1, r;
    while (more) {
        if (close == '}' && (r = object_key(ps, NULL, NULL)) != OK) return r;
        if ((r = skip_value(ps, depth + 1)) != OK) return r;
        if ((r = container_next(ps, close, &more)) != OK) return r;
    }
    return OK;
}

static int literal(Parser *ps, const char *word, Py_ssize_t n) {
    if (ps->end - ps->p < n || memcmp(ps->p, word, n) != 0) return REFUSE;
    ps->p += n;
    return OK;
}

/* Any JSON value, validated and skipped. */
static int skip_value(Parser *ps, int depth) {
    skip_ws(ps);
    if (ps->p >= ps->end) return REFUSE;
    switch (*ps->p) {
    case '"': return parse_string(ps, NULL, NULL);
    case '{': return skip_container(ps, depth, '}');
    case '[': return skip_container(ps, depth, ']');
    case 't': return literal(ps, "true", 4);
    case 'f': return literal(ps, "false", 5);
    case 'n': return literal(ps, "null", 4);
    default: {
        Num num;
        return parse_number(ps, &num, 0);
    }
    }
}

/* ---- events -------------------------------------------------------------------------------- */

typedef struct {
    Str ph, name, cat; /* decoded: may point into scratch copies owned by the event */
    int pid_is_str, tid_is_str;
    int64_t pid, tid;
    Str pid_s, tid_s;
    Num ts, dur;
    int dur_null;
    int has_corr;
    int64_t corr;
    int rank_set, dims_set;
    /* the text of args' "Input Dims" and "Input type" values (NULL: absent) */
    const unsigned char *dims_at, *dims_end, *type_at, *type_end;
    int has_args;    /* args is an object */
    int mem_int;     /* bit k: MEMORY_KEYS[k] holds an integer within int64 (value in mem[k]) */
    int64_t mem[6];
} Event;

/* The [memory] events' args read here, in the order of memory_columns._MEMORY_ARGS. */
static const char *MEMORY_KEYS[6] = {"Device Type", "Device Id", "Addr", "Bytes",
                                     "Total Allocated", "Total Reserved"};
static const Py_ssize_t MEMORY_KEY_LENS[6] = {11, 9, 4, 5, 15, 14};

/* Copies of an event's escaped strings: scratch holds one string at a time. */
typedef struct {
    char *data[5];
    Py_ssize_t cap[5];
} Owned;

static int keep_string(Owned *own, int slot, Str *s, int escaped) {
    if (!escaped) return OK;
    if (grow(&own->data[slot], &own->cap[slot], s->n, 64) != OK) return FAIL;
    if (s->n) memcpy(own->data[slot], s->s, s->n);
    s->s = own->data[slot];
    return OK;
}

enum { K_PH = 1, K_NAME = 2, K_CAT = 4, K_PID = 8, K_TID = 16, K_TS = 32, K_DUR = 64, K_ARGS = 128 };

#define key_is(k, word) ((k)->n == (Py_ssize_t)sizeof(word) - 1 && memcmp((k)->s, word, sizeof(word) - 1) == 0)

static int parse_str_field(Parser *ps, Owned *own, int slot, Str *out) {
    if (ps->p >= ps->end || *ps->p != '"') return REFUSE;
    int esc = 0, r = parse_string(ps, out, &esc);
    if (r != OK) return r;
    return keep_string(own, slot, out, esc);
}

static int parse_id_field(Parser *ps, Owned *own, int slot, int *is_str, int64_t *ival, Str *s) {
    if (ps->p < ps->end && *ps->p == '"') {
        *is_str = 1;
        return parse_str_field(ps, own, slot, s);
    }
    Num num;
    if (ps->p >= ps->end || !(*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'))) return REFUSE;
    int r = parse_number(ps, &num, 1);
    if (r != OK) return r;
    if (num.kind != NUM_INT) return REFUSE;
    *is_str = 0;
    *ival = num.i;
    return OK;
}

static int is_number_start(Parser *ps) {
    return ps->p < ps->end && (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'));
}

/* An object member's key as written: refused when it holds an escape (it may spell a field). */
static int plain_key(Parser *ps, Str *key) {
    int esc = 0, r = object_key(ps, key, &esc);
    return r == OK && esc ? REFUSE : r;
}

/* ts or dur: a number (msgspec's int | float), an integer within int64. */
static int parse_stamp(Parser *ps, Num *out) {
    if (!is_number_start(ps)) return REFUSE;
    int r = parse_number(ps, out, 1);
    return r == OK && out->kind == NUM_BIG ? REFUSE : r;
}

/* One member of an object: its key as written, ps at its value; *seen holds the bits of the
 * keys read so far (a repeated one is refused: msgspec keeps the last of repeated keys). */
typedef int (*Member)(Parser *ps, Event *ev, Owned *own, const Str *key, int *seen);

/* The object at ps (its '{'), each member handed to member. */
static int walk_object(Parser *ps, Event *ev, Owned *own, Member member) {
    if (ps->p >= ps->end || *ps->p != '{') return REFUSE;
    int seen = 0, more = !container_open(ps, '}');
    while (more) {
        Str key;
        int r = plain_key(ps, &key);
        if (r == OK) r = member(ps, ev, own, &key, &seen);
        if (r == OK) r = container_next(ps, '}', &more);
        if (r != OK) return r;
    }
    return OK;
}

/* A member of an event's args: correlation, rank, Input Dims / Input type (their text) and the
 * [memory] values are read, the rest skipped. Bits: 1 correlation, 2 rank, 4 Input Dims,
 * 8 << k the memory key k, 512 Input type. */
static int args_member(Parser *ps, Event *ev, Owned *own, const Str *key, int *seen) {
    (void)own;
    int bit = key_is(key, "correlation") ? 1 : key_is(key, "rank") ? 2
              : key_is(key, "Input Dims") ? 4 : key_is(key, "Input type") ? 512 : 0;
    int mem_k = -1, r;
    for (int k = 0; k < 6 && !bit; k++)
        if (key->n == MEMORY_KEY_LENS[k] && memcmp(key->s, MEMORY_KEYS[k], key->n) == 0) {
            bit = 8 << k;
            mem_k = k;
        }
    if (bit & *seen) return REFUSE;
    *seen |= bit;
    int null = ps->p < ps->end && *ps->p == 'n';
    const unsigned char *value_at = ps->p;
    if ((mem_k >= 0 || bit == 1) && is_number_start(ps)) {
        Num num;
        if ((r = parse_number(ps, &num, 1)) != OK) return r;
        if (num.kind == NUM_INT && mem_k >= 0) {
            ev->mem_int |= 1 << mem_k;
            ev->mem[mem_k] = num.i;
        } else if (num.kind == NUM_INT) {
            ev->has_corr = 1;
            ev->corr = num.i;
        }
    } else if ((r = skip_value(ps, 2)) != OK) {
        return r;
    }
    if (bit == 2) ev->rank_set = !null;
    if (bit == 4) {
        ev->dims_set = !null;
        ev->dims_at = value_at;
        ev->dims_end = ps->p;
    }
    if (bit == 512) {
        ev->type_at = value_at;
        ev->type_end = ps->p;
    }
    return OK;
}

/* A member of an event: its known fields read and typed, the rest skipped. */
static int event_member(Parser *ps, Event *ev, Owned *own, const Str *key, int *seen) {
    int bit = 0;
    if (key->n <= 4) {
        bit = key_is(key, "ph") ? K_PH : key_is(key, "name") ? K_NAME
              : key_is(key, "cat") ? K_CAT : key_is(key, "pid") ? K_PID
              : key_is(key, "tid") ? K_TID : key_is(key, "ts") ? K_TS
              : key_is(key, "dur") ? K_DUR : key_is(key, "args") ? K_ARGS : 0;
    }
    if (bit & *seen) return REFUSE;
    *seen |= bit;
    int null = ps->p < ps->end && *ps->p == 'n';
    switch (bit) {
    case K_PH: return parse_str_field(ps, own, 0, &ev->ph);
    case K_NAME: return parse_str_field(ps, own, 1, &ev->name);
    case K_CAT: return parse_str_field(ps, own, 2, &ev->cat);
    case K_PID: return parse_id_field(ps, own, 3, &ev->pid_is_str, &ev->pid, &ev->pid_s);
    case K_TID: return parse_id_field(ps, own, 4, &ev->tid_is_str, &ev->tid, &ev->tid_s);
    case K_TS: return parse_stamp(ps, &ev->ts);
    case K_DUR:
        ev->dur_null = null;
        return null ? literal(ps, "null", 4) : parse_stamp(ps, &ev->dur);
    case K_ARGS:
        if (null) return literal(ps, "null", 4);
        ev->has_args = 1;
        return walk_object(ps, ev, own, args_member);
    default: return skip_value(ps, 1);
    }
}

static int parse_event(Parser *ps, Event *ev, Owned *own) {
    memset(ev, 0, sizeof(*ev));
    ev->ph.s = ev->name.s = ev->cat.s = "";
    ev->ts.kind = NUM_INT;
    ev->dur.kind = NUM_INT;
    return walk_object(ps, ev, own, event_member);
}

static double num_value(const Num *n) { return n->kind == NUM_FLOAT ? n->d : (double)n->i; }

typedef struct {
    Buf ts, dur, name, cat, pid, tid, corr, starts, ends, dims, shape_spans, others;
    Table names, cats, pids, tids;
    /* [memory] events: columns while every one is well-formed (mem_ok), and the "M"/"i" text
     * with them (others_all) for when one is not */
    Buf mem_ts, mem_vals[6], mem_pid, mem_tid, others_all;
    Table mem_pids, mem_tids;
    int mem_ok;
} Out;

/* Limits (inclusive) of the memory args, as memory_columns._MEMORY_LIMITS (int64 here). */
typedef struct {
    int64_t lo[6], hi[6];
} MemLimits;

/* A [memory] event is well-formed as memory_columns._memory_event judges it: args present,
 * -limit < ts < limit, the six values ints within their limits. */
static int memory_well_formed(const Event *ev, double t, double ts_limit, const MemLimits *lim) {
    if (!ev->has_args || !(t > -ts_limit && t < ts_limit) || ev->mem_int != 63) return 0;
    for (int k = 0; k < 6; k++)
        if (ev->mem[k] < lim->lo[k] || ev->mem[k] > lim->hi[k]) return 0;
    return 1;
}

static int push_other(Buf *b, const unsigned char *text, Py_ssize_t n) {
    int r = buf_push(b, b->len ? "," : "[", 1);
    return r != OK ? r : buf_push(b, text, n);
}

static int scan_events(Parser *ps, Out *o, long long pid_block, double ts_limit,
                       double exact_limit, const MemLimits *lim, Py_ssize_t *counts, int *sign) {
    Owned own;
    memset(&own, 0, sizeof(own));
    const unsigned char *base = ps->p;
    int r = OK;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '[') {
        r = REFUSE;
        goto done;
    }
    int more = !container_open(ps, ']');
    while (more) {
        skip_ws(ps);
        int64_t start = ps->p - base;
        Event ev;
        if ((r = parse_event(ps, &ev, &own)) != OK) goto done;
        int64_t stop = ps->p - base;
        if (ev.ts.kind == NUM_FLOAT && fabs(ev.ts.d) >= exact_limit) {
            r = REFUSE; /* exact (Decimal) stamps: the caller's path */
            goto done;
        }
        if (ev.rank_set || (!ev.pid_is_str && ev.pid >= pid_block)) *sign = 1;
        if (ev.ph.n == 1 && ev.ph.s[0] == 'X') {
            counts[0]++;
            double t = num_value(&ev.ts), d = ev.dur_null ? NAN : num_value(&ev.dur);
            int far = !(fabs(t) < ts_limit) || (d >= ts_limit);
            if (far) {
                counts[1]++;
            } else if (!(d >= 0)) {
                counts[2]++;
            } else {
                int64_t code, corr = ev.has_corr ? ev.corr : -1;
                int32_t c32;
                int8_t dims = (int8_t)ev.dims_set;
                if ((r = buf_push(&o->ts, &t, 8)) != OK || (r = buf_push(&o->dur, &d, 8)) != OK)
                    goto done;
                if ((r = table_code(&o->names, 0, ev.name.s, ev.name.n, 0, &code)) != OK) goto done;
                c32 = (int32_t)code;
                if ((r = buf_push(&o->name, &c32, 4)) != OK) goto done;
                if ((r = table_code(&o->cats, 0, ev.cat.s, ev.cat.n, 0, &code)) != OK) goto done;
                c32 = (int32_t)code;
                if ((r = buf_push(&o->cat, &c32, 4)) != OK) goto done;
                if ((r = table_code(&o->pids, !ev.pid_is_str, ev.pid_s.s, ev.pid_s.n, ev.pid,
                                    &code)) != OK ||
                    (r = buf_push(&o->pid, &code, 8)) != OK)
                    goto done;
                if ((r = table_code(&o->tids, !ev.tid_is_str, ev.tid_s.s, ev.tid_s.n, ev.tid,
                                    &code)) != OK ||
                    (r = buf_push(&o->tid, &code, 8)) != OK)
                    goto done;
                if ((r = buf_push(&o->corr, &corr, 8)) != OK ||
                    (r = buf_push(&o->starts, &start, 8)) != OK ||
                    (r = buf_push(&o->ends, &stop, 8)) != OK ||
                    (r = buf_push(&o->dims, &dims, 1)) != OK)
                    goto done;
                if (dims) { /* the shapes' text: grouped by it, decoded once per group */
                    int64_t at[4] = {ev.dims_at - base, ev.dims_end - base, -1, -1};
                    if (ev.type_at) {
                        at[2] = ev.type_at - base;
                        at[3] = ev.type_end - base;
                    }
                    if ((r = buf_push(&o->shape_spans, at, sizeof(at))) != OK) goto done;
                }
            }
        } else if (ev.ph.n == 1 && (ev.ph.s[0] == 'M' || ev.ph.s[0] == 'i')) {
            int memory = ev.ph.s[0] == 'i' && ev.name.n == 8 && memcmp(ev.name.s, "[memory]", 8) == 0;
            if ((r = push_other(&o->others_all, base + start, stop - start)) != OK) goto done;
            if (!memory) {
                if ((r = push_other(&o->others, base + start, stop - start)) != OK) goto done;
            } else if (o->mem_ok) {
                double t = num_value(&ev.ts);
                if (!memory_well_formed(&ev, t, ts_limit, lim)) {
                    o->mem_ok = 0; /* the caller judges this block's memory events (others_all) */
                } else {
                    int64_t code;
                    if ((r = buf_push(&o->mem_ts, &t, 8)) != OK) goto done;
                    for (int k = 0; k < 6; k++)
                        if ((r = buf_push(&o->mem_vals[k], &ev.mem[k], 8)) != OK) goto done;
                    if ((r = table_code(&o->mem_pids, !ev.pid_is_str, ev.pid_s.s, ev.pid_s.n,
                                        ev.pid, &code)) != OK ||
                        (r = buf_push(&o->mem_pid, &code, 8)) != OK)
                        goto done;
                    if ((r = table_code(&o->mem_tids, !ev.tid_is_str, ev.tid_s.s, ev.tid_s.n,
                                        ev.tid, &code)) != OK ||
                        (r = buf_push(&o->mem_tid, &code, 8)) != OK)
                        goto done;
                }
            }
        }
        if ((r = container_next(ps, ']', &more)) != OK) goto done;
    }
    skip_ws(ps);
    if (ps->p != ps->end) r = REFUSE; /* trailing characters */
    if (r == OK && o->others.len) r = buf_push(&o->others, "]", 1);
    if (r == OK && o->others_all.len) r = buf_push(&o->others_all, "]", 1);
done:
    for (int k = 0; k < 5; k++) PyMem_RawFree(own.data[k]);
    return r;
}

/* The scanner's limits, as scan() takes them. */
typedef struct {
    long long pid_block;
    double ts_limit, exact_limit;
    MemLimits lim;
} Rules;

/* One scan's state and outcome (scan() or a job of a batch). */
typedef struct {
    Out o;
    Py_ssize_t counts[3];
    int sign;
    int r;
    char *scratch;
} Scan;

static void scan_free(Scan *sc) {
    Out *o = &sc->o;
    Buf *bufs[] = {&o->ts,     &o->dur,         &o->name,        &o->cat,         &o->pid,
                   &o->tid,    &o->corr,        &o->starts,      &o->ends,        &o->dims,
                   &o->shape_spans, &o->others, &o->others_all,  &o->mem_ts,      &o->mem_pid,
                   &o->mem_tid, &o->mem_vals[0], &o->mem_vals[1], &o->mem_vals[2],
                   &o->mem_vals[3], &o->mem_vals[4], &o->mem_vals[5]};
    for (size_t k = 0; k < sizeof(bufs) / sizeof(bufs[0]); k++) {
        PyMem_RawFree(bufs[k]->data);
        bufs[k]->data = NULL;
    }
    Table *tables[] = {&o->names, &o->cats, &o->pids, &o->tids, &o->mem_pids, &o->mem_tids};
    for (size_t k = 0; k < sizeof(tables) / sizeof(tables[0]); k++) table_free(tables[k]);
    PyMem_RawFree(sc->scratch);
    sc->scratch = NULL;
}

/* Scan [text, text + len) into sc (nogil: on a thread without the GIL). */
static void scan_run(Scan *sc, const unsigned char *text, Py_ssize_t len, const Rules *ru,
                     int nogil) {
    Parser ps = {text, text + len, NULL, 0, nogil};
    memset(sc, 0, sizeof(*sc));
    sc->o.mem_ok = 1;
    Out *o = &sc->o;
    if (table_init(&o->names) != OK || table_init(&o->cats) != OK || table_init(&o->pids) != OK ||
        table_init(&o->tids) != OK || table_init(&o->mem_pids) != OK ||
        table_init(&o->mem_tids) != OK) {
        sc->r = FAIL;
    } else {
        sc->r = scan_events(&ps, o, ru->pid_block, ru->ts_limit, ru->exact_limit, &ru->lim,
                            sc->counts, &sc->sign);
    }
    sc->scratch = ps.scratch;
}

/* What scan() returns for a scan that ended OK or REFUSE (None), with the GIL. */
static PyObject *scan_result(Scan *sc) {
    if (sc->r == REFUSE) Py_RETURN_NONE;
    Out *o = &sc->o;
    Buf *others = o->mem_ok ? &o->others : &o->others_all;
    PyObject *memory = Py_None, *result = NULL;
    Py_INCREF(memory);
    if (o->mem_ok && o->mem_ts.len) {
        Py_DECREF(memory);
        memory = Py_BuildValue("NNNNNNNNNNN", buf_take(&o->mem_ts), buf_take(&o->mem_vals[0]),
                               buf_take(&o->mem_vals[1]), buf_take(&o->mem_vals[2]),
                               buf_take(&o->mem_vals[3]), buf_take(&o->mem_vals[4]),
                               buf_take(&o->mem_vals[5]), buf_take(&o->mem_pid),
                               table_uniq(&o->mem_pids), buf_take(&o->mem_tid),
                               table_uniq(&o->mem_tids));
    }
    if (memory)
        result = Py_BuildValue(
            "nnnNNNNNNNNNNNNNNNNOO", sc->counts[0], sc->counts[1], sc->counts[2],
            buf_take(&o->ts), buf_take(&o->dur), buf_take(&o->name), table_uniq(&o->names),
            buf_take(&o->cat), table_uniq(&o->cats), buf_take(&o->pid), table_uniq(&o->pids),
            buf_take(&o->tid), table_uniq(&o->tids), buf_take(&o->corr), buf_take(&o->starts),
            buf_take(&o->ends), buf_take(&o->dims), buf_take(&o->shape_spans),
            PyBytes_FromStringAndSize(others->data ? others->data : "", others->len), memory,
            sc->sign ? Py_True : Py_False);
    Py_XDECREF(memory);
    return result;
}

/* scan()'s arguments after the text: the limits. */
static int parse_rules(PyObject *args, Py_ssize_t first, Rules *ru) {
    PyObject *rest = PyTuple_GetSlice(args, first, PyTuple_GET_SIZE(args));
    if (!rest) return FAIL;
    MemLimits *lim = &ru->lim;
    int ok = PyArg_ParseTuple(rest, "Ldd(LLLLLLLLLLLL)", &ru->pid_block, &ru->ts_limit,
                              &ru->exact_limit, &lim->lo[0], &lim->hi[0], &lim->lo[1], &lim->hi[1],
                              &lim->lo[2], &lim->hi[2], &lim->lo[3], &lim->hi[3], &lim->lo[4],
                              &lim->hi[4], &lim->lo[5], &lim->hi[5]);
    Py_DECREF(rest);
    return ok ? OK : FAIL;
}

/* A scan with the GIL held: its result, None, or NULL with an error set. */
static PyObject *scan_here(const unsigned char *text, Py_ssize_t len, const Rules *ru) {
    Scan sc;
    scan_run(&sc, text, len, ru, 0);
    PyObject *result = NULL;
    if (sc.r == OK || sc.r == REFUSE)
        result = scan_result(&sc);
    else if (!PyErr_Occurred())
        PyErr_NoMemory();
    scan_free(&sc);
    return result;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Rules ru;
    if (PyTuple_GET_SIZE(args) < 1 || PyObject_GetBuffer(PyTuple_GET_ITEM(args, 0), &view,
                                                          PyBUF_SIMPLE) < 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "scan(text, ...)");
    PyObject *result = NULL;
    if (parse_rules(args, 1, &ru) == OK)
        result = scan_here((const unsigned char *)view.buf, view.len, &ru);
    PyBuffer_Release(&view);
    return result;
}

/* ---- a batch: the sub-blocks of one block scanned by a thread beside the caller ------------ */

/* Why: the caller (decode._add_sub_blocks) reduces each scanned sub-block in Python while the
 * next ones are scanned here on another core, without the GIL (no Python object is touched:
 * the tables keep bytes, table_uniq makes the objects at take). A job that needs Python's float
 * parser (NEED_GIL) or ran out of memory is scanned again at its take, as scan() would. */
typedef struct {
    Py_buffer view;
    Rules ru;
    Py_ssize_t n;
    Py_ssize_t *spans; /* 2n: [start, stop) of each sub-block in the text */
    Scan *jobs;
    int *done;         /* per job, under mu */
    int cancel;        /* under mu: the thread stops before its next job */
    pthread_t thread;
    int started, joined, finished;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Batch;

static void *batch_thread(void *arg) {
    Batch *b = arg;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        pthread_mutex_lock(&b->mu);
        int cancel = b->cancel;
        pthread_mutex_unlock(&b->mu);
        if (!cancel) {
            const unsigned char *text = (const unsigned char *)b->view.buf + b->spans[2 * i];
            scan_run(&b->jobs[i], text, b->spans[2 * i + 1] - b->spans[2 * i], &b->ru, 1);
        } else {
            memset(&b->jobs[i], 0, sizeof(Scan));
            b->jobs[i].r = NEED_GIL; /* not scanned: a take scans it here */
        }
        pthread_mutex_lock(&b->mu);
        b->done[i] = 1;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

/* Stop the thread after its current job and wait for it (with the GIL released). */
static void batch_join(Batch *b) {
    if (!b->started || b->joined) return;
    pthread_mutex_lock(&b->mu);
    b->cancel = 1;
    pthread_mutex_unlock(&b->mu);
    Py_BEGIN_ALLOW_THREADS;
    pthread_join(b->thread, NULL);
    Py_END_ALLOW_THREADS;
    b->joined = 1;
}

static void batch_free(Batch *b) {
    batch_join(b);
    if (b->jobs)
        for (Py_ssize_t i = 0; i < b->n; i++) scan_free(&b->jobs[i]);
    PyMem_RawFree(b->jobs);
    PyMem_RawFree(b->done);
    PyMem_RawFree(b->spans);
    if (b->started) {
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->cv);
    }
    if (b->view.obj) PyBuffer_Release(&b->view);
    PyMem_RawFree(b);
}

static const char *BATCH_NAME = "rankscope._kineto_scan.batch";

static void batch_capsule_free(PyObject *capsule) {
    Batch *b = PyCapsule_GetPointer(capsule, BATCH_NAME);
    if (b) batch_free(b);
}

/* scan_start(text, spans, *limits) -> capsule: the thread begins scanning text[start:stop]
 * of each (start, stop) of spans, in order. */
static PyObject *scan_start(PyObject *self, PyObject *args) {
    (void)self;
    if (PyTuple_GET_SIZE(args) < 2) return PyErr_Format(PyExc_TypeError, "scan_start(text, spans, ...)");
    Batch *b = PyMem_RawCalloc(1, sizeof(Batch));
    if (!b) return PyErr_NoMemory();
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, 0), &b->view, PyBUF_SIMPLE) < 0) {
        PyMem_RawFree(b);
        return NULL;
    }
    PyObject *spans = PySequence_Fast(PyTuple_GET_ITEM(args, 1), "spans: a sequence");
    if (!spans || parse_rules(args, 2, &b->ru) != OK) {
        Py_XDECREF(spans);
        batch_free(b);
        return NULL;
    }
    b->n = PySequence_Fast_GET_SIZE(spans);
    b->spans = PyMem_RawCalloc(2 * b->n + 1, sizeof(Py_ssize_t));
    b->jobs = PyMem_RawCalloc(b->n + 1, sizeof(Scan));
    b->done = PyMem_RawCalloc(b->n + 1, sizeof(int));
    if (!b->spans || !b->jobs || !b->done) {
        Py_DECREF(spans);
        batch_free(b);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < b->n; i++) {
        Py_ssize_t a, z;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(spans, i), "nn", &a, &z) || a < 0 ||
            z < a || z > b->view.len) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a span outside the text");
            Py_DECREF(spans);
            batch_free(b);
            return NULL;
        }
        b->spans[2 * i] = a;
        b->spans[2 * i + 1] = z;
    }
    Py_DECREF(spans);
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        batch_free(b);
        return PyErr_Format(PyExc_OSError, "cannot make the scanner's lock");
    }
    if (pthread_cond_init(&b->cv, NULL) != 0) {
        pthread_mutex_destroy(&b->mu);
        batch_free(b);
        return PyErr_Format(PyExc_OSError, "cannot make the scanner's condition");
    }
    b->started = 1;
    if (pthread_create(&b->thread, NULL, batch_thread, b) != 0) {
        b->joined = 1; /* no thread: every take scans here */
        for (Py_ssize_t i = 0; i < b->n; i++) {
            b->jobs[i].r = NEED_GIL;
            b->done[i] = 1;
        }
    }
    PyObject *capsule = PyCapsule_New(b, BATCH_NAME, batch_capsule_free);
    if (!capsule) batch_free(b);
    return capsule;
}

/* scan_take(batch, i) -> scan()'s result for the i-th span, once its scan is done. */
static PyObject *scan_take(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "On", &capsule, &i)) return NULL;
    Batch *b = PyCapsule_GetPointer(capsule, BATCH_NAME);
    if (!b) return NULL;
    if (b->finished) return PyErr_Format(PyExc_ValueError, "the batch is finished");
    if (i < 0 || i >= b->n) return PyErr_Format(PyExc_IndexError, "no span %zd", i);
    pthread_mutex_lock(&b->mu);
    int done = b->done[i];
    pthread_mutex_unlock(&b->mu);
    if (!done) {
        Py_BEGIN_ALLOW_THREADS;
        pthread_mutex_lock(&b->mu);
        while (!b->done[i]) pthread_cond_wait(&b->cv, &b->mu);
        pthread_mutex_unlock(&b->mu);
        Py_END_ALLOW_THREADS;
    }
    Scan *sc = &b->jobs[i];
    PyObject *result;
    if (sc->r == OK || sc->r == REFUSE) {
        result = scan_result(sc);
    } else {
        const unsigned char *text = (const unsigned char *)b->view.buf + b->spans[2 * i];
        result = scan_here(text, b->spans[2 * i + 1] - b->spans[2 * i], &b->ru);
    }
    scan_free(sc);
    return result;
}

/* scan_finish(batch): the thread stopped and waited for, the text released (no longer read). */
static PyObject *scan_finish(PyObject *self, PyObject *capsule) {
    (void)self;
    Batch *b = PyCapsule_GetPointer(capsule, BATCH_NAME);
    if (!b) return NULL;
    batch_join(b);
    if (b->view.obj) PyBuffer_Release(&b->view);
    b->finished = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan_start", scan_start, METH_VARARGS,
     "scan_start(text, spans, pid_block, ts_limit_us, exact_limit_us, limits) -> batch: "
     "text[start:stop] of each (start, stop) of spans scanned in order by a thread of its own, "
     "without the GIL (the text must not change until scan_finish)."},
    {"scan_take", scan_take, METH_VARARGS,
     "scan_take(batch, i) -> scan()'s result for the i-th span, waiting for its scan."},
    {"scan_finish", scan_finish, METH_O,
     "scan_finish(batch): the thread stopped after its current span and waited for."},
    {"scan", scan, METH_VARARGS,
     "scan(text, pid_block, ts_limit_us, exact_limit_us) -> tuple | None: one JSON array of "
     "Kineto events reduced to the columns of its complete events (see the C source's header); "
     "None where the text is anything this scanner does not reduce exactly as msgspec + "
     "EventColumns.extract would."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kineto_scan",
                                    "Kineto JSON events to columns, in C (see scan).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kineto_scan(void) {
    init_tables();
    return PyModule_Create(&module);
}
