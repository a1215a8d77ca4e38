/* Native core of svtagg.vdaf: Field64 and Field128 vector arithmetic, the
 * radix-2 NTT, polynomial evaluation and the XOF's rejection sampling.
 *
 * Elements are stored canonically (in [0, p)) in their little-endian encoding:
 * Field64 as one uint64, Field128 as two (low word first).  So a vector's
 * memory is its draft encoding, and the numpy arrays the Python side keeps
 * (uint64, or a structured (lo, hi) dtype) are passed here as raw buffers.
 *
 * Field64, p = 2^64 - 2^32 + 1: products reduce with 2^64 = 2^32 - 1 and
 * 2^96 = -1 (mod p).  Field128, p = 2^128 - 28*2^64 + 1: products reduce by
 * Montgomery multiplication with R = 2^128; since p = 1 (mod 2^64) the
 * Montgomery factor of each round is just the negated low word.  A canonical
 * product a*b is mont(mont(a, b), R^2 mod p).
 *
 * Every function here computes exactly the value the Python reference
 * (vdaf/field.py on Python integers) computes; tests/test_vdaf_native.py
 * compares the two on random inputs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_keccak.h"

#include "_arith.h"

/* ------------------------------------------------------- generic dispatch */

/* Field ids: 0 = Field64 (1 word per element), 1 = Field128 (2 words).
 *
 * The entry points below trust no argument: every size and offset is checked
 * with overflow-safe arithmetic (a product past PY_SSIZE_T_MAX never matches
 * a buffer's length), every buffer against the lengths its arguments imply,
 * and a buffer an element is read from (a root, a scale, a point) must hold
 * one.  The checks run once per call, before any loop. */

typedef struct {
    Py_buffer view; /* view.buf: 8-byte aligned (an aligned copy while orig is set) */
    Py_ssize_t n;   /* elements */
    void *orig;     /* the exporter's own pointer, while view.buf is an aligned copy */
    int writable;
} vbuf;

/* *out = a * b for sizes a, b >= 0; 0 if the product fits in Py_ssize_t, else
 * -1 (no exception set). */
static inline int mul_size(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out) {
    if (a < 0 || b < 0) return -1;
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* Whether have == a * b exactly, the product computed without overflow. */
static inline int is_product(Py_ssize_t have, Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t p;
    return mul_size(a, b, &p) == 0 && p == have;
}

/* Whether have == a * b * c exactly, the product computed without overflow. */
static inline int is_product3(Py_ssize_t have, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c) {
    Py_ssize_t p;
    return mul_size(a, b, &p) == 0 && is_product(have, p, c);
}

/* A C-contiguous vector of field fid.  The loops read and write u64 and e128
 * through typed pointers, so a buffer that does not start on an 8-byte
 * boundary (a memoryview at an odd offset) is worked on through an aligned
 * copy, written back by release_vec if it is an output: no load or store in
 * this file is misaligned, and aligned buffers (every numpy array the Python
 * side makes) cost nothing more. */
static int get_vec(PyObject *obj, int fid, int writable, vbuf *out) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &out->view, flags) < 0) return -1;
    out->orig = NULL;
    out->writable = writable;
    Py_ssize_t size = fid ? 16 : 8;
    if (out->view.len % size) {
        PyBuffer_Release(&out->view);
        PyErr_SetString(PyExc_ValueError, "buffer is not a whole number of field elements");
        return -1;
    }
    out->n = out->view.len / size;
    if (((uintptr_t)out->view.buf & 7) && out->view.len > 0) {
        void *copy = PyMem_Malloc((size_t)out->view.len); /* aligned for any type */
        if (!copy) {
            PyBuffer_Release(&out->view);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(copy, out->view.buf, (size_t)out->view.len);
        out->orig = out->view.buf;
        out->view.buf = copy;
    }
    return 0;
}

/* Releases a vector from get_vec: an aligned copy goes back to the exporter's
 * memory if the vector is an output, and the exporter gets its view back as
 * it gave it. */
static void release_vec(vbuf *v) {
    if (v->orig) {
        if (v->writable) memcpy(v->orig, v->view.buf, (size_t)v->view.len);
        PyMem_Free(v->view.buf);
        v->view.buf = v->orig;
        v->orig = NULL;
    }
    PyBuffer_Release(&v->view);
}

/* Acquires n vectors of field fid, objs[i] into *bufs[i] (writable where
 * writable[i]); on a failure releases those already acquired and returns -1. */
static int get_vecs(int fid, int n, PyObject *const objs[], const int writable[],
                    vbuf *const bufs[]) {
    for (int i = 0; i < n; i++) {
        if (get_vec(objs[i], fid, writable[i], bufs[i]) < 0) {
            while (i--) release_vec(bufs[i]);
            return -1;
        }
    }
    return 0;
}

static void release_vecs(int n, vbuf *const bufs[]) {
    for (int i = 0; i < n; i++) release_vec(bufs[i]);
}

static int check_fid(int fid) {
    if (fid != 0 && fid != 1) {
        PyErr_SetString(PyExc_ValueError, "field id is 0 (Field64) or 1 (Field128)");
        return -1;
    }
    return 0;
}

/* Element i of a vector of n (n == 1 broadcasts). */
#define AT64(v, i) (((const u64 *)(v).view.buf)[(v).n == 1 ? 0 : (i)])
#define AT128(v, i) (((const e128 *)(v).view.buf)[(v).n == 1 ? 0 : (i)])

enum { OP_ADD, OP_SUB, OP_MUL };

static PyObject *binop(PyObject *args, int op) {
    int fid;
    PyObject *a_o, *b_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOOO", &fid, &a_o, &b_o, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf a, b, o;
    if (get_vecs(fid, 3, (PyObject *[]){a_o, b_o, o_o}, (int[]){0, 0, 1},
                 (vbuf *[]){&a, &b, &o}) < 0)
        return NULL;
    Py_ssize_t n = o.n;
    if ((a.n != n && a.n != 1) || (b.n != n && b.n != 1)) {
        PyErr_SetString(PyExc_ValueError, "operand lengths must match the output or be 1");
        goto fail;
    }
    if (fid == 0) {
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            u64 x = AT64(a, i), y = AT64(b, i);
            out[i] = op == OP_ADD ? add64(x, y) : op == OP_SUB ? sub64(x, y) : mul64(x, y);
        }
    } else {
        e128 *out = (e128 *)o.view.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            e128 x = AT128(a, i), y = AT128(b, i);
            out[i] = op == OP_ADD ? add128(x, y) : op == OP_SUB ? sub128(x, y) : mul128(x, y);
        }
    }
    release_vecs(3, (vbuf *[]){&a, &b, &o});
    Py_RETURN_NONE;
fail:
    release_vecs(3, (vbuf *[]){&a, &b, &o});
    return NULL;
}

static PyObject *py_add(PyObject *self, PyObject *args) { return binop(args, OP_ADD); }
static PyObject *py_sub(PyObject *self, PyObject *args) { return binop(args, OP_SUB); }
static PyObject *py_mul(PyObject *self, PyObject *args) { return binop(args, OP_MUL); }

/* sum_rows(fid, a, rows, out): out[j] = sum_i a[i, j] for a of shape (rows, cols). */
static PyObject *py_sum_rows(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t rows;
    PyObject *a_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnO", &fid, &a_o, &rows, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf a, o;
    if (get_vecs(fid, 2, (PyObject *[]){a_o, o_o}, (int[]){0, 1},
                 (vbuf *[]){&a, &o}) < 0)
        return NULL;
    Py_ssize_t cols = o.n;
    if (!is_product(a.n, rows, cols)) {
        release_vecs(2, (vbuf *[]){&a, &o});
        PyErr_SetString(PyExc_ValueError, "sum_rows: shape mismatch");
        return NULL;
    }
    if (cols == 0) rows = 0; /* no columns: nothing to sum, however many (empty) rows */
    if (fid == 0) {
        const u64 *x = (const u64 *)a.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t j = 0; j < cols; j++) out[j] = 0;
        for (Py_ssize_t i = 0; i < rows; i++)
            for (Py_ssize_t j = 0; j < cols; j++) out[j] = add64(out[j], x[i * cols + j]);
    } else {
        const e128 *x = (const e128 *)a.view.buf;
        e128 *out = (e128 *)o.view.buf;
        acc3 *acc = (acc3 *)PyMem_Calloc((size_t)(cols ? cols : 1), sizeof(acc3));
        if (!acc) {
            PyErr_NoMemory();
        } else {
            for (Py_ssize_t i = 0; i < rows; i++)
                for (Py_ssize_t j = 0; j < cols; j++) acc3_add(&acc[j], x[i * cols + j]);
            for (Py_ssize_t j = 0; j < cols; j++) out[j] = acc3_reduce(&acc[j]);
            PyMem_Free(acc);
        }
    }
    release_vecs(2, (vbuf *[]){&a, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* sum_last(fid, a, n, out): out[r] = sum_k a[r, k] for a of (rows, n). */
static PyObject *py_sum_last(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t n;
    PyObject *a_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnO", &fid, &a_o, &n, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf a, o;
    if (get_vecs(fid, 2, (PyObject *[]){a_o, o_o}, (int[]){0, 1}, (vbuf *[]){&a, &o}) < 0)
        return NULL;
    if (!is_product(a.n, o.n, n)) {
        PyErr_SetString(PyExc_ValueError, "sum_last: shape mismatch");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)a.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t r = 0; r < o.n; r++) {
            u64 acc = 0;
            for (Py_ssize_t k = 0; k < n; k++) acc = add64(acc, x[r * n + k]);
            out[r] = acc;
        }
    } else {
        const e128 *x = (const e128 *)a.view.buf;
        e128 *out = (e128 *)o.view.buf;
        for (Py_ssize_t r = 0; r < o.n; r++) {
            acc3 acc = {0, 0, 0};
            for (Py_ssize_t k = 0; k < n; k++) acc3_add(&acc, x[r * n + k]);
            out[r] = acc3_reduce(&acc);
        }
    }
    release_vecs(2, (vbuf *[]){&a, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* fold_rows(fid, a, row_len, offset, length, n, out): out[r, j] =
 * sum_b a[r, offset + b*n + j] over b*n + j < length, for a of (rows, row_len)
 * elements and out of (rows, n): each row's polynomial a[r, offset:offset+length]
 * reduced mod x^n - 1 (its values at the n-th roots of unity are then one NTT). */
static PyObject *py_fold_rows(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t row_len, offset, length, n;
    PyObject *a_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnnnnO", &fid, &a_o, &row_len, &offset, &length, &n, &o_o) ||
        check_fid(fid) < 0)
        return NULL;
    vbuf a, o;
    if (get_vecs(fid, 2, (PyObject *[]){a_o, o_o}, (int[]){0, 1}, (vbuf *[]){&a, &o}) < 0)
        return NULL;
    Py_ssize_t rows = n > 0 ? o.n / n : 0;
    if (n <= 0 || row_len <= 0 || offset < 0 || length < 0 || offset > row_len ||
        length > row_len - offset || o.n != rows * n || !is_product(a.n, rows, row_len)) {
        PyErr_SetString(PyExc_ValueError, "fold_rows: shape mismatch");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)a.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t r = 0; r < rows; r++) {
            const u64 *xr = x + r * row_len + offset;
            u64 *orow = out + r * n;
            for (Py_ssize_t j = 0; j < n; j++) orow[j] = j < length ? xr[j] : 0;
            for (Py_ssize_t k = n; k < length; k++) orow[k % n] = add64(orow[k % n], xr[k]);
        }
    } else {
        const e128 *x = (const e128 *)a.view.buf;
        e128 *out = (e128 *)o.view.buf;
        for (Py_ssize_t r = 0; r < rows; r++) {
            const e128 *xr = x + r * row_len + offset;
            e128 *orow = out + r * n;
            for (Py_ssize_t j = 0; j < n; j++) orow[j] = j < length ? xr[j] : (e128){0, 0};
            for (Py_ssize_t k = n; k < length; k++) orow[k % n] = add128(orow[k % n], xr[k]);
        }
    }
    release_vecs(2, (vbuf *[]){&a, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* bits_value(fid, a, group, count, out): out[g] = sum_{j < count} 2^j a[g*group + j]
 * for a of (G, group) elements, count <= min(group, 63): each group's leading
 * bits read as a number (the draft's truncate of Sum/SumVec, RangeVec's low
 * parts).  Shifts instead of products: x*2^j < 2^(128+j), so the sum fits in
 * three words and is reduced once. */
static PyObject *py_bits_value(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t group, count;
    PyObject *a_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnnO", &fid, &a_o, &group, &count, &o_o) || check_fid(fid) < 0)
        return NULL;
    vbuf a, o;
    if (get_vecs(fid, 2, (PyObject *[]){a_o, o_o}, (int[]){0, 1}, (vbuf *[]){&a, &o}) < 0)
        return NULL;
    if (group <= 0 || count < 0 || count > group || count > 63 || !is_product(a.n, o.n, group)) {
        PyErr_SetString(PyExc_ValueError, "bits_value: shape mismatch (count <= group, count <= 63)");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)a.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t g = 0; g < o.n; g++) {
            u128 acc = 0; /* < 2^(64 + count) */
            for (Py_ssize_t j = 0; j < count; j++) acc += (u128)x[g * group + j] << j;
            out[g] = red64(acc);
        }
    } else {
        const e128 *x = (const e128 *)a.view.buf;
        e128 *out = (e128 *)o.view.buf;
        for (Py_ssize_t g = 0; g < o.n; g++) {
            acc3 acc = {0, 0, 0};
            const e128 *xg = x + g * group;
            if (count) acc3_add(&acc, xg[0]);
            for (Py_ssize_t j = 1; j < count; j++) {
                e128 v = xg[j];
                unsigned char c;
                acc.w0 = adc(acc.w0, v.lo << j, 0, &c);
                acc.w1 = adc(acc.w1, (v.hi << j) | (v.lo >> (64 - j)), c, &c);
                acc.w2 += (v.hi >> (64 - j)) + c;
            }
            out[g] = acc3_reduce(&acc);
        }
    }
    release_vecs(2, (vbuf *[]){&a, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* powers(fid, start, step, out): out[i] = start * step^i. */
static PyObject *py_powers(PyObject *self, PyObject *args) {
    int fid;
    PyObject *s_o, *t_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOOO", &fid, &s_o, &t_o, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf s, t, o;
    if (get_vecs(fid, 3, (PyObject *[]){s_o, t_o, o_o}, (int[]){0, 0, 1},
                 (vbuf *[]){&s, &t, &o}) < 0)
        return NULL;
    if (s.n != 1 || t.n != 1) {
        PyErr_SetString(PyExc_ValueError, "powers: start and step are single elements");
    } else if (fid == 0) {
        u64 x = AT64(s, 0), step = AT64(t, 0);
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t i = 0; i < o.n; i++, x = mul64(x, step)) out[i] = x;
    } else {
        e128 x = AT128(s, 0), step = AT128(t, 0);
        e128 *out = (e128 *)o.view.buf;
        for (Py_ssize_t i = 0; i < o.n; i++, x = mul128(x, step)) out[i] = x;
    }
    release_vecs(3, (vbuf *[]){&s, &t, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- the NTT */

static Py_ssize_t bitrev(Py_ssize_t i, int bits) {
    Py_ssize_t r = 0;
    for (int b = 0; b < bits; b++) r |= ((i >> b) & 1) << (bits - 1 - b);
    return r;
}

/* Twiddles of a radix-2 transform of size n with the primitive n-th root
 * `root`, in Montgomery form: stage m's w_m^j (w_m = root^(n/m)) at
 * tw[m/2 + j], j < m/2. */
static void twiddles128(e128 root, Py_ssize_t n, e128 *tw) {
    for (Py_ssize_t m = 2; m <= n; m *= 2) {
        e128 wm = root, w = {1, 0};
        for (Py_ssize_t k = m; k < n; k *= 2) wm = mul128(wm, wm);
        for (Py_ssize_t j = 0; j < m / 2; j++, w = mul128(w, wm)) tw[m / 2 + j] = tomont128(w);
    }
}

/* Decimation in frequency: natural order in, the transform's entries in
 * bit-reversed order out (Gentleman-Sande butterflies). */
static void dif128(e128 *x, Py_ssize_t n, const e128 *tw) {
    for (Py_ssize_t m = n; m >= 2; m /= 2) {
        Py_ssize_t half = m / 2;
        const e128 *twm = tw + half;
        for (Py_ssize_t b = 0; b < n; b += m)
            for (Py_ssize_t j = 0; j < half; j++) {
                e128 u = x[b + j], v = x[b + j + half];
                x[b + j] = add128(u, v);
                x[b + j + half] = j ? mont128(sub128(u, v), twm[j]) : sub128(u, v);
            }
    }
}

/* The bit-reversal permutation of x, in place (rev: the permutation's table). */
static void permute128(e128 *x, Py_ssize_t n, const Py_ssize_t *rev) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = rev[i];
        if (j > i) {
            e128 t = x[i];
            x[i] = x[j];
            x[j] = t;
        }
    }
}


/* In-place iterative radix-2 NTT of each row (decimation in time after a
 * bit-reversal permutation), the same transform as vdaf/field.py's ntt:
 * stage m uses twiddles w_m^j, w_m = w_n^(n/m), and (u + v w, u - v w).
 * The twiddles of every stage are computed once per call (stage m's at
 * tw[m/2 + j], TWPREP'd for TWMUL), and each row goes through all stages
 * while it is in cache.  Stage 2's twiddle is 1 (no product).  `scale` (if
 * given) multiplies every output (n^-1 for the inverse). */
#define NTT_BODY(T, MUL, TWPREP, TWMUL, ADD, SUB, ONE)                                   \
    do {                                                                                 \
        T *tw = (T *)PyMem_Malloc(sizeof(T) * (size_t)n);                                \
        Py_ssize_t *rev = (Py_ssize_t *)PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n);   \
        if (!tw || !rev) {                                                               \
            PyMem_Free(tw);                                                              \
            PyMem_Free(rev);                                                             \
            PyErr_NoMemory();                                                            \
            break;                                                                       \
        }                                                                                \
        for (Py_ssize_t i = 0; i < n; i++) rev[i] = bitrev(i, bits);                     \
        T scale_tw = TWPREP(scale);                                                      \
        for (Py_ssize_t m = 2; m <= n; m *= 2) {                                         \
            Py_ssize_t half = m / 2;                                                     \
            T wm = root, w = ONE;                                                        \
            for (Py_ssize_t k = m; k < n; k *= 2) wm = MUL(wm, wm);                      \
            for (Py_ssize_t j = 0; j < half; j++, w = MUL(w, wm)) tw[half + j] = TWPREP(w); \
        }                                                                                \
        Py_BEGIN_ALLOW_THREADS                                                           \
        for (Py_ssize_t r = 0; r < rows; r++) {                                          \
            T *x = data + r * n;                                                         \
            for (Py_ssize_t i = 0; i < n; i++) {                                         \
                Py_ssize_t j = rev[i];                                                   \
                if (j > i) {                                                             \
                    T tmp = x[i];                                                        \
                    x[i] = x[j];                                                         \
                    x[j] = tmp;                                                          \
                }                                                                        \
            }                                                                            \
            for (Py_ssize_t b = 0; b + 1 < n; b += 2) {                                  \
                T u = x[b], v = x[b + 1];                                                \
                x[b] = ADD(u, v);                                                        \
                x[b + 1] = SUB(u, v);                                                    \
            }                                                                            \
            for (Py_ssize_t m = 4; m <= n; m *= 2) {                                     \
                Py_ssize_t half = m / 2;                                                 \
                const T *twm = tw + half;                                                \
                for (Py_ssize_t b = 0; b < n; b += m)                                    \
                    for (Py_ssize_t j = 0; j < half; j++) {                              \
                        T u = x[b + j], v = TWMUL(x[b + j + half], twm[j]);              \
                        x[b + j] = ADD(u, v);                                            \
                        x[b + j + half] = SUB(u, v);                                     \
                    }                                                                    \
            }                                                                            \
            if (have_scale)                                                              \
                for (Py_ssize_t i = 0; i < n; i++) x[i] = TWMUL(x[i], scale_tw);         \
        }                                                                                \
        Py_END_ALLOW_THREADS                                                             \
        PyMem_Free(tw);                                                                  \
        PyMem_Free(rev);                                                                 \
    } while (0)

/* Twiddles are multiplied in with one reduction: Field128 keeps them in
 * Montgomery form (w*R), so mont(v, w*R) = v*w. */
static inline u64 ID64(u64 x) { return x; }

/* ntt(fid, data, n, root, scale_or_None): transform the rows of data (rows*n
 * elements, in place) with the primitive n-th root `root`. */
static PyObject *py_ntt(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t n;
    PyObject *d_o, *r_o, *s_o;
    if (!PyArg_ParseTuple(args, "iOnOO", &fid, &d_o, &n, &r_o, &s_o) || check_fid(fid) < 0) return NULL;
    if (n <= 0 || (n & (n - 1))) {
        PyErr_SetString(PyExc_ValueError, "ntt: n must be a power of two");
        return NULL;
    }
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < n) bits++;
    vbuf d, rt, sc;
    int have_scale = s_o != Py_None;
    if (get_vecs(fid, 2, (PyObject *[]){d_o, r_o}, (int[]){1, 0},
                 (vbuf *[]){&d, &rt}) < 0)
        return NULL;
    if (have_scale && get_vec(s_o, fid, 0, &sc) < 0) {
        release_vecs(2, (vbuf *[]){&d, &rt});
        return NULL;
    }
    if (rt.n != 1 || (have_scale && sc.n != 1)) {
        PyErr_SetString(PyExc_ValueError, "ntt: root and scale are single elements");
    } else if (d.n % n) {
        PyErr_SetString(PyExc_ValueError, "ntt: data is not a whole number of rows");
    } else if (d.n == 0) {
        /* no rows: nothing to transform; from here on n <= d.n bounds the tables */
    } else {
        Py_ssize_t rows = d.n / n;
        if (fid == 0) {
            u64 *data = (u64 *)d.view.buf, root = AT64(rt, 0);
            u64 scale = have_scale ? AT64(sc, 0) : 1;
            NTT_BODY(u64, mul64, ID64, mul64, add64, sub64, (u64)1);
        } else {
            /* Field128: decimation in frequency, then the permutation */
            e128 *data = (e128 *)d.view.buf, root = AT128(rt, 0);
            e128 *tw = (e128 *)PyMem_Malloc(sizeof(e128) * (size_t)n);
            Py_ssize_t *rev = (Py_ssize_t *)PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n);
            if (!tw || !rev) {
                PyErr_NoMemory();
            } else {
                twiddles128(root, n, tw);
                for (Py_ssize_t i = 0; i < n; i++) rev[i] = bitrev(i, bits);
                e128 scale_m = have_scale ? tomont128(AT128(sc, 0)) : (e128){0, 0};
                Py_BEGIN_ALLOW_THREADS
                for (Py_ssize_t r = 0; r < rows; r++) {
                    e128 *x = data + r * n;
                    dif128(x, n, tw);
                    permute128(x, n, rev);
                    if (have_scale)
                        for (Py_ssize_t i = 0; i < n; i++) x[i] = mont128(x[i], scale_m);
                }
                Py_END_ALLOW_THREADS
            }
            PyMem_Free(tw);
            PyMem_Free(rev);
        }
    }
    release_vecs(2, (vbuf *[]){&d, &rt});
    if (have_scale) release_vec(&sc);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* poly_eval(fid, coeffs, n, t, out): out[r] = sum_j coeffs[r, j] t^j (Horner). */
static PyObject *py_poly_eval(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t n;
    PyObject *c_o, *t_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnOO", &fid, &c_o, &n, &t_o, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf c, t, o;
    if (get_vecs(fid, 3, (PyObject *[]){c_o, t_o, o_o}, (int[]){0, 0, 1},
                 (vbuf *[]){&c, &t, &o}) < 0)
        return NULL;
    if (t.n != 1) {
        PyErr_SetString(PyExc_ValueError, "poly_eval: the point is a single element");
    } else if (!is_product(c.n, o.n, n)) {
        PyErr_SetString(PyExc_ValueError, "poly_eval: shape mismatch");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)c.view.buf;
        u64 tt = AT64(t, 0), *out = (u64 *)o.view.buf;
        for (Py_ssize_t r = 0; r < o.n; r++) {
            u64 acc = 0;
            for (Py_ssize_t j = n; j-- > 0;) acc = add64(mul64(acc, tt), x[r * n + j]);
            out[r] = acc;
        }
    } else {
        const e128 *x = (const e128 *)c.view.buf;
        e128 tt = AT128(t, 0), *out = (e128 *)o.view.buf;
        for (Py_ssize_t r = 0; r < o.n; r++) {
            e128 acc = {0, 0};
            for (Py_ssize_t j = n; j-- > 0;) acc = add128(mul128(acc, tt), x[r * n + j]);
            out[r] = acc;
        }
    }
    release_vecs(3, (vbuf *[]){&c, &t, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* sample(fid, raw, out) -> kept: the elements of `raw` (little-endian
 * encodings) that are below p, in order, written to out (the XOF's rejection
 * sampling, draft-07 6.2; the mask is all ones for both fields). */
static PyObject *py_sample(PyObject *self, PyObject *args) {
    int fid;
    PyObject *r_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOO", &fid, &r_o, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf r, o;
    if (get_vecs(fid, 2, (PyObject *[]){r_o, o_o}, (int[]){0, 1},
                 (vbuf *[]){&r, &o}) < 0)
        return NULL;
    Py_ssize_t kept = 0;
    if (o.n < r.n) {
        PyErr_SetString(PyExc_ValueError, "sample: output shorter than input");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)r.view.buf;
        u64 *out = (u64 *)o.view.buf;
        Py_ssize_t i = 0;
        if ((const void *)out == (const void *)x) /* in place: nothing moves before a rejection */
            while (i < r.n && x[i] < P64) i++;
        kept = i;
        for (; i < r.n; i++)
            if (x[i] < P64) out[kept++] = x[i];
    } else {
        const e128 *x = (const e128 *)r.view.buf;
        e128 *out = (e128 *)o.view.buf;
        Py_ssize_t i = 0;
        if ((const void *)out == (const void *)x)
            while (i < r.n && !ge_p128(x[i].lo, x[i].hi)) i++;
        kept = i;
        for (; i < r.n; i++)
            if (!ge_p128(x[i].lo, x[i].hi)) out[kept++] = x[i];
    }
    release_vecs(2, (vbuf *[]){&r, &o});
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(kept);
}

/* copy_rows(blobs, offset, width, out): out (len(blobs) * width bytes,
 * writable) gets blob[offset, offset + width) of each blob in turn: the same
 * field of many encoded messages as the rows of one matrix, in one copy.
 * The blobs are taken into a tuple first, so the rows stay the ones counted. */
static PyObject *py_copy_rows(PyObject *self, PyObject *args) {
    PyObject *blobs_o, *out_o;
    Py_ssize_t offset, width;
    if (!PyArg_ParseTuple(args, "OnnO", &blobs_o, &offset, &width, &out_o)) return NULL;
    if (offset < 0 || width < 0) {
        PyErr_SetString(PyExc_ValueError, "copy_rows: offset and width are >= 0");
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(blobs_o);
    if (!seq) return NULL;
    Py_buffer outv;
    if (PyObject_GetBuffer(out_o, &outv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t rows = PyTuple_GET_SIZE(seq);
    if (!is_product(outv.len, rows, width)) {
        PyErr_SetString(PyExc_ValueError, "copy_rows: out is not len(blobs) x width bytes");
    } else {
        unsigned char *dst = (unsigned char *)outv.buf;
        for (Py_ssize_t i = 0; i < rows; i++) {
            Py_buffer b;
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(seq, i), &b, PyBUF_C_CONTIGUOUS) < 0) break;
            /* offset + width <= b.len, without forming the sum */
            if (offset > b.len || width > b.len - offset) {
                PyBuffer_Release(&b);
                PyErr_Format(PyExc_ValueError, "copy_rows: blob %zd is too short", i);
                break;
            }
            memcpy(dst + i * width, (const unsigned char *)b.buf + offset, (size_t)width);
            PyBuffer_Release(&b);
        }
    }
    PyBuffer_Release(&outv);
    Py_DECREF(seq);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------ batches of reports */

/* dot_rows(fid, a, b, out): out[g, r] = sum_k a[g, r, k] * b[r, k] for a of
 * (groups, rows, n) elements, b of (rows, n) and out of (groups, rows); Field128
 * sums the products unreduced and reduces once per output. */
static PyObject *py_dot_rows(PyObject *self, PyObject *args) {
    int fid;
    PyObject *a_o, *b_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOOO", &fid, &a_o, &b_o, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf a, b, o;
    if (get_vecs(fid, 3, (PyObject *[]){a_o, b_o, o_o}, (int[]){0, 0, 1},
                 (vbuf *[]){&a, &b, &o}) < 0)
        return NULL;
    /* a.n = groups * rows * n, b.n = rows * n, o.n = groups * rows */
    Py_ssize_t n = 0, rows = 0, groups = 0;
    if (o.n > 0 && b.n > 0 && a.n % b.n == 0) {
        groups = a.n / b.n;
        if (groups > 0 && o.n % groups == 0) {
            rows = o.n / groups;
            if (rows > 0 && b.n % rows == 0) n = b.n / rows;
        }
    }
    if (o.n == 0) {
        /* nothing to compute */
    } else if (n == 0 || !is_product3(a.n, groups, rows, n)) {
        PyErr_SetString(PyExc_ValueError, "dot_rows: shape mismatch");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)a.view.buf, *y = (const u64 *)b.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t g = 0; g < groups; g++)
            for (Py_ssize_t r = 0; r < rows; r++) {
                const u64 *xr = x + (g * rows + r) * n, *yr = y + r * n;
                u64 acc = 0;
                for (Py_ssize_t k = 0; k < n; k++) acc = add64(acc, mul64(xr[k], yr[k]));
                out[g * rows + r] = acc;
            }
    } else {
        const e128 *x = (const e128 *)a.view.buf, *y = (const e128 *)b.view.buf;
        e128 *out = (e128 *)o.view.buf;
        for (Py_ssize_t g = 0; g < groups; g++)
            for (Py_ssize_t r = 0; r < rows; r++) {
                const e128 *xr = x + (g * rows + r) * n, *yr = y + r * n;
                acc5 acc;
                acc5_zero(&acc);
                for (Py_ssize_t k = 0; k < n; k++) acc5_mac(&acc, xr[k], yr[k]);
                /* redc gives the sum / R; mont(., R^2) multiplies by R */
                out[g * rows + r] = mont128(acc5_redc(&acc), R2_128);
            }
    }
    release_vecs(3, (vbuf *[]){&a, &b, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* powers_rows(fid, x, first, out): out[r, i] = x[r]^(first + i) for first 0
 * or 1, out of (rows, n) elements; Field128 steps by mont(acc, x*R) = acc*x. */
static PyObject *py_powers_rows(PyObject *self, PyObject *args) {
    int fid, first;
    PyObject *x_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOiO", &fid, &x_o, &first, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf x, o;
    if (get_vecs(fid, 2, (PyObject *[]){x_o, o_o}, (int[]){0, 1},
                 (vbuf *[]){&x, &o}) < 0)
        return NULL;
    Py_ssize_t rows = x.n, n = rows ? o.n / rows : 0;
    if ((first != 0 && first != 1) || (rows ? o.n % rows != 0 : o.n != 0)) {
        PyErr_SetString(PyExc_ValueError, "powers_rows: first is 0 or 1, out is rows x n");
    } else if (fid == 0) {
        const u64 *xs = (const u64 *)x.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t r = 0; r < rows; r++) {
            u64 acc = first ? xs[r] : 1, step = xs[r];
            for (Py_ssize_t i = 0; i < n; i++, acc = mul64(acc, step)) out[r * n + i] = acc;
        }
    } else {
        const e128 *xs = (const e128 *)x.view.buf;
        e128 *out = (e128 *)o.view.buf;
        Py_ssize_t r = 0;
        /* four rows at a time: each row's chain of products waits on the last one */
        for (; r + 4 <= rows; r += 4) {
            e128 step[4], acc[4];
            for (int q = 0; q < 4; q++) {
                step[q] = tomont128(xs[r + q]);
                acc[q] = first ? xs[r + q] : (e128){1, 0};
            }
            for (Py_ssize_t i = 0; i < n; i++)
                for (int q = 0; q < 4; q++) {
                    out[(r + q) * n + i] = acc[q];
                    acc[q] = mont128(acc[q], step[q]);
                }
        }
        for (; r < rows; r++) {
            e128 step = tomont128(xs[r]);
            e128 acc = first ? xs[r] : (e128){1, 0};
            for (Py_ssize_t i = 0; i < n; i++, acc = mont128(acc, step)) out[r * n + i] = acc;
        }
    }
    release_vecs(2, (vbuf *[]){&x, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* weighted_rows(fid, m, w, out, rows): out[r, j] = sum_i w[r, i] * m[r, i, j]
 * for m of (rows, I, J) elements, w of (rows, I), out of (rows, J): per
 * report, a weighted sum of the rows of its matrix (the wire values at a
 * point, from the calls' inputs as the circuit laid them out). */
static PyObject *py_weighted_rows(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t rows;
    PyObject *m_o, *w_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOOOn", &fid, &m_o, &w_o, &o_o, &rows) || check_fid(fid) < 0)
        return NULL;
    vbuf m, w, o;
    if (get_vecs(fid, 3, (PyObject *[]){m_o, w_o, o_o}, (int[]){0, 0, 1},
                 (vbuf *[]){&m, &w, &o}) < 0)
        return NULL;
    Py_ssize_t ni = rows > 0 ? w.n / rows : 0, nj = rows > 0 ? o.n / rows : 0;
    if (rows <= 0 || w.n != rows * ni || o.n != rows * nj || !is_product3(m.n, rows, ni, nj)) {
        PyErr_SetString(PyExc_ValueError, "weighted_rows: shape mismatch");
    } else if (nj == 0) {
        /* an empty out: nothing to write, however many rows are claimed */
    } else if (fid == 0) {
        const u64 *x = (const u64 *)m.view.buf, *ws = (const u64 *)w.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t r = 0; r < rows; r++) {
            u64 *acc = out + r * nj;
            for (Py_ssize_t j = 0; j < nj; j++) acc[j] = 0;
            for (Py_ssize_t i = 0; i < ni; i++) {
                const u64 *xr = x + (r * ni + i) * nj;
                u64 wi = ws[r * ni + i];
                for (Py_ssize_t j = 0; j < nj; j++) acc[j] = add64(acc[j], mul64(xr[j], wi));
            }
        }
    } else {
        const e128 *x = (const e128 *)m.view.buf, *ws = (const e128 *)w.view.buf;
        e128 *out = (e128 *)o.view.buf;
        acc5 *acc = (acc5 *)PyMem_Malloc(sizeof(acc5) * (size_t)nj);
        if (!acc) {
            PyErr_NoMemory();
        } else {
            for (Py_ssize_t r = 0; r < rows; r++) {
                for (Py_ssize_t j = 0; j < nj; j++) acc5_zero(&acc[j]);
                for (Py_ssize_t i = 0; i < ni; i++) {
                    const e128 *xr = x + (r * ni + i) * nj;
                    e128 wi = ws[r * ni + i];
                    for (Py_ssize_t j = 0; j < nj; j++) acc5_mac(&acc[j], xr[j], wi);
                }
                for (Py_ssize_t j = 0; j < nj; j++)
                    out[r * nj + j] = mont128(acc5_redc(&acc[j]), R2_128);
            }
            PyMem_Free(acc);
        }
    }
    release_vecs(3, (vbuf *[]){&m, &w, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* bit_pairs(fid, meas, r, s, out, rows): the chunked bit check's gadget inputs
 * for a batch: meas of (rows, L), r of rows elements (one per report), s one
 * element (1/num_shares), out of (rows, K, 2) with K >= L:
 * out[q, k] = (r_q^(k+1) * m_k, m_k - s), m_k = 0 for k >= L (the padding). */
static PyObject *py_bit_pairs(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t rows;
    PyObject *m_o, *r_o, *s_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOOOOn", &fid, &m_o, &r_o, &s_o, &o_o, &rows) || check_fid(fid) < 0)
        return NULL;
    vbuf m, r, sv, o;
    if (get_vecs(fid, 4, (PyObject *[]){m_o, r_o, s_o, o_o}, (int[]){0, 0, 0, 1},
                 (vbuf *[]){&m, &r, &sv, &o}) < 0)
        return NULL;
    /* rows == r.n bounds rows (and 2 * rows) before anything is divided by it */
    int shape_ok = rows > 0 && r.n == rows && sv.n == 1;
    Py_ssize_t len = shape_ok ? m.n / rows : 0, k_all = shape_ok ? o.n / (2 * rows) : 0;
    if (!shape_ok || m.n != rows * len || o.n != 2 * rows * k_all || k_all < len) {
        PyErr_SetString(PyExc_ValueError, "bit_pairs: shape mismatch");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)m.view.buf, *rs = (const u64 *)r.view.buf;
        u64 s = AT64(sv, 0), *out = (u64 *)o.view.buf;
        for (Py_ssize_t q = 0; q < rows; q++) {
            u64 acc = rs[q], step = rs[q];
            u64 *oq = out + 2 * q * k_all;
            for (Py_ssize_t k = 0; k < k_all; k++, acc = mul64(acc, step)) {
                u64 v = k < len ? x[q * len + k] : 0;
                oq[2 * k] = mul64(v, acc);
                oq[2 * k + 1] = sub64(v, s);
            }
        }
    } else {
        const e128 *x = (const e128 *)m.view.buf, *rs = (const e128 *)r.view.buf;
        e128 s = AT128(sv, 0), *out = (e128 *)o.view.buf;
        for (Py_ssize_t q = 0; q < rows; q++) {
            e128 step = mont128(rs[q], R2_128), acc = step; /* r^(k+1) * R */
            e128 *oq = out + 2 * q * k_all;
            for (Py_ssize_t k = 0; k < k_all; k++, acc = mont128(acc, step)) {
                e128 v = k < len ? x[q * len + k] : (e128){0, 0};
                oq[2 * k] = mont128(v, acc);
                oq[2 * k + 1] = sub128(v, s);
            }
        }
    }
    release_vecs(4, (vbuf *[]){&m, &r, &sv, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* pair_products(fid, x, count, out): out[j] = sum_c x[c, 0, j] * x[c, 1, j]
 * for x of (count, 2, M) elements (ParallelSum(Mul) on a batch of calls);
 * Field128 sums the products unreduced and reduces once per output. */
static PyObject *py_pair_products(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t count;
    PyObject *x_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnO", &fid, &x_o, &count, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf x, o;
    if (get_vecs(fid, 2, (PyObject *[]){x_o, o_o}, (int[]){0, 1},
                 (vbuf *[]){&x, &o}) < 0)
        return NULL;
    Py_ssize_t nm = o.n;
    if (count <= 0 || !is_product3(x.n, count, 2, nm)) {
        PyErr_SetString(PyExc_ValueError, "pair_products: shape mismatch");
    } else if (nm == 0) {
        /* an empty out: nothing to write, however many calls are claimed */
    } else if (fid == 0) {
        const u64 *xs = (const u64 *)x.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t j = 0; j < nm; j++) out[j] = 0;
        for (Py_ssize_t c = 0; c < count; c++) {
            const u64 *a = xs + 2 * c * nm, *b = a + nm;
            for (Py_ssize_t j = 0; j < nm; j++) out[j] = add64(out[j], mul64(a[j], b[j]));
        }
    } else {
        const e128 *xs = (const e128 *)x.view.buf;
        e128 *out = (e128 *)o.view.buf;
        acc5 *acc = (acc5 *)PyMem_Malloc(sizeof(acc5) * (size_t)nm);
        if (!acc) {
            PyErr_NoMemory();
        } else {
            for (Py_ssize_t j = 0; j < nm; j++) acc5_zero(&acc[j]);
            for (Py_ssize_t c = 0; c < count; c++) {
                const e128 *a = xs + 2 * c * nm, *b = a + nm;
                for (Py_ssize_t j = 0; j < nm; j++) acc5_mac(&acc[j], a[j], b[j]);
            }
            for (Py_ssize_t j = 0; j < nm; j++) out[j] = mont128(acc5_redc(&acc[j]), R2_128);
            PyMem_Free(acc);
        }
    }
    release_vecs(2, (vbuf *[]){&x, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* pair_products_last(fid, x, count, out): out[m] = sum_c x[m, 2c] * x[m, 2c+1]
 * for x of (M, 2*count) elements: ParallelSum(Mul) with the calls' inputs in
 * rows (the layout the circuits make them in). */
static PyObject *py_pair_products_last(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t count;
    PyObject *x_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnO", &fid, &x_o, &count, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf x, o;
    if (get_vecs(fid, 2, (PyObject *[]){x_o, o_o}, (int[]){0, 1}, (vbuf *[]){&x, &o}) < 0)
        return NULL;
    Py_ssize_t nm = o.n;
    if (count <= 0 || !is_product3(x.n, nm, count, 2)) {
        PyErr_SetString(PyExc_ValueError, "pair_products_last: shape mismatch");
    } else if (fid == 0) {
        const u64 *xs = (const u64 *)x.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t j = 0; j < nm; j++) {
            u64 acc = 0;
            for (Py_ssize_t c = 0; c < count; c++)
                acc = add64(acc, mul64(xs[(j * count + c) * 2], xs[(j * count + c) * 2 + 1]));
            out[j] = acc;
        }
    } else {
        const e128 *xs = (const e128 *)x.view.buf;
        e128 *out = (e128 *)o.view.buf;
        for (Py_ssize_t j = 0; j < nm; j++) {
            acc5 acc;
            acc5_zero(&acc);
            const e128 *row = xs + j * 2 * count;
            for (Py_ssize_t c = 0; c < count; c++) acc5_mac(&acc, row[2 * c], row[2 * c + 1]);
            out[j] = mont128(acc5_redc(&acc), R2_128);
        }
    }
    release_vecs(2, (vbuf *[]){&x, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* mul_cols(fid, a, b, out): out[r, k] = a[r, k] * b[k] for a of (rows, n)
 * elements and b of n (one row shared by all); b goes to Montgomery form once. */
static PyObject *py_mul_cols(PyObject *self, PyObject *args) {
    int fid;
    PyObject *a_o, *b_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOOO", &fid, &a_o, &b_o, &o_o) || check_fid(fid) < 0) return NULL;
    vbuf a, b, o;
    if (get_vecs(fid, 3, (PyObject *[]){a_o, b_o, o_o}, (int[]){0, 0, 1},
                 (vbuf *[]){&a, &b, &o}) < 0)
        return NULL;
    Py_ssize_t n = b.n;
    if (n <= 0 || a.n % n || o.n != a.n) {
        PyErr_SetString(PyExc_ValueError, "mul_cols: shape mismatch");
    } else if (fid == 0) {
        const u64 *x = (const u64 *)a.view.buf, *y = (const u64 *)b.view.buf;
        u64 *out = (u64 *)o.view.buf;
        for (Py_ssize_t i = 0; i < a.n; i++) out[i] = mul64(x[i], y[i % n]);
    } else {
        const e128 *x = (const e128 *)a.view.buf, *y = (const e128 *)b.view.buf;
        e128 *out = (e128 *)o.view.buf;
        e128 *ym = (e128 *)PyMem_Malloc(sizeof(e128) * (size_t)n);
        if (!ym) {
            PyErr_NoMemory();
        } else {
            for (Py_ssize_t k = 0; k < n; k++) ym[k] = mont128(y[k], R2_128);
            for (Py_ssize_t r = 0; r < a.n / n; r++)
                for (Py_ssize_t k = 0; k < n; k++) out[r * n + k] = mont128(x[r * n + k], ym[k]);
            PyMem_Free(ym);
        }
    }
    release_vecs(3, (vbuf *[]){&a, &b, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------- the prover's gadget polynomial */

/* mul_gadget_poly(fid, wires, count, consts, out): the gadget polynomial of
 * ParallelSum(Mul, count) for each report, G(x) = sum_c w_2c(x) w_2c+1(x),
 * from the wire values at the P-th roots of unity alpha^k: wires of
 * (rows, P, 2*count) elements, out of (rows, 2P - 1) (G's coefficients,
 * lowest first), consts = [alpha, alpha^-1, omega, omega^-1, P^-1, (2P)^-1]
 * with omega a primitive 2P-th root (omega^2 = alpha).  Field128.
 *
 * G has degree 2P - 2, so its values at the 2P-th roots determine it: at
 * omega^2k = alpha^k they are sums of the wire values' products; at
 * omega^(2k+1) each wire polynomial is evaluated on the coset omega*<alpha>
 * (an inverse transform to its coefficients, twisted by omega^j, and a
 * forward one), and one inverse transform of size 2P gives G.  Every
 * transform is a decimation in frequency (here about twice as fast as one in
 * time), the coset values staying in bit-reversed order.  The same
 * polynomial as vdaf/flp.py's gadget_poly, per report, sums unreduced. */
static PyObject *py_mul_gadget_poly(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t count;
    PyObject *w_o, *c_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOnOO", &fid, &w_o, &count, &c_o, &o_o) || check_fid(fid) < 0)
        return NULL;
    if (fid != 1) {
        PyErr_SetString(PyExc_ValueError, "mul_gadget_poly: Field128 only");
        return NULL;
    }
    vbuf w, cs, o;
    if (get_vecs(fid, 3, (PyObject *[]){w_o, c_o, o_o}, (int[]){0, 0, 1}, (vbuf *[]){&w, &cs, &o}) < 0)
        return NULL;
    Py_ssize_t p = 0, rows = 0, arity;
    if (count > 0 && mul_size(2, count, &arity) == 0 && cs.n == 6 && o.n > 0) {
        /* out is rows x (2P - 1), wires rows x P x 2*count; P <= w.n bounds the scratch */
        for (Py_ssize_t cand = 1; cand <= w.n; cand *= 2) {
            if (o.n % (2 * cand - 1) == 0 && is_product3(w.n, arity, o.n / (2 * cand - 1), cand)) {
                p = cand;
                rows = o.n / (2 * cand - 1);
                break;
            }
        }
    }
    if (p < 2) {
        PyErr_SetString(PyExc_ValueError, "mul_gadget_poly: shape mismatch");
        release_vecs(3, (vbuf *[]){&w, &cs, &o});
        return NULL;
    }
    const e128 *c = (const e128 *)cs.view.buf, *wires = (const e128 *)w.view.buf;
    e128 *out = (e128 *)o.view.buf;
    Py_ssize_t n2 = 2 * p;
    /* scratch: twiddles (forward and inverse size P, inverse size 2P), the
     * twist, two coset rows, 2P evaluations; accumulators; a permutation */
    e128 *buf = (e128 *)PyMem_Malloc(sizeof(e128) * (size_t)(p + p + n2 + p + p + p + n2));
    acc5 *acc = (acc5 *)PyMem_Malloc(sizeof(acc5) * (size_t)(2 * p));
    Py_ssize_t *rev2 = (Py_ssize_t *)PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n2 + p));
    if (!buf || !acc || !rev2) {
        PyMem_Free(buf);
        PyMem_Free(acc);
        PyMem_Free(rev2);
        release_vecs(3, (vbuf *[]){&w, &cs, &o});
        return PyErr_NoMemory();
    }
    e128 *tw_f = buf, *tw_i = tw_f + p, *tw_i2 = tw_i + p, *twist = tw_i2 + n2;
    e128 *ca = twist + p, *cb = ca + p, *ev = cb + p;
    int bits2 = 0;
    while (((Py_ssize_t)1 << bits2) < n2) bits2++;
    for (Py_ssize_t i = 0; i < n2; i++) rev2[i] = bitrev(i, bits2);
    twiddles128(c[0], p, tw_f);
    twiddles128(c[1], p, tw_i);
    twiddles128(c[3], n2, tw_i2);
    Py_ssize_t *rev = rev2 + n2; /* over P's bits: rev(i) = rev2(2i) */
    for (Py_ssize_t i = 0; i < p; i++) rev[i] = rev2[2 * i];
    {
        e128 wj = c[4]; /* twist[j] = omega^j / P in Montgomery form */
        for (Py_ssize_t j = 0; j < p; j++, wj = mul128(wj, c[2])) twist[j] = tomont128(wj);
    }
    e128 scale2 = tomont128(c[5]);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (Py_ssize_t k = 0; k < 2 * p; k++) acc5_zero(&acc[k]);
        const e128 *wr = wires + r * p * 2 * count; /* wr[k * arity + i]: wire i at alpha^k */
        for (Py_ssize_t pair = 0; pair < count; pair++) {
            for (Py_ssize_t k = 0; k < p; k++) {
                ca[k] = wr[k * 2 * count + 2 * pair];
                cb[k] = wr[k * 2 * count + 2 * pair + 1];
                acc5_mac(&acc[k], ca[k], cb[k]);
            }
            dif128(ca, p, tw_i); /* P * coefficients, bit-reversed */
            dif128(cb, p, tw_i);
            permute128(ca, p, rev);
            permute128(cb, p, rev);
            for (Py_ssize_t j = 0; j < p; j++) {
                ca[j] = mont128(ca[j], twist[j]);
                cb[j] = mont128(cb[j], twist[j]);
            }
            dif128(ca, p, tw_f); /* values at omega*alpha^rev(i) */
            dif128(cb, p, tw_f);
            for (Py_ssize_t i = 0; i < p; i++) acc5_mac(&acc[p + i], ca[i], cb[i]);
        }
        /* the sums are x*y; redc divides by R, mont(., R^2) multiplies it back */
        for (Py_ssize_t k = 0; k < p; k++) {
            ev[2 * k] = mont128(acc5_redc(&acc[k]), R2_128);
            ev[2 * rev[k] + 1] = mont128(acc5_redc(&acc[p + k]), R2_128);
        }
        dif128(ev, n2, tw_i2);
        e128 *orow = out + r * (n2 - 1);
        for (Py_ssize_t i = 0; i < n2; i++)
            if (rev2[i] < n2 - 1) orow[rev2[i]] = mont128(ev[i], scale2);
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(buf);
    PyMem_Free(acc);
    PyMem_Free(rev2);
    release_vecs(3, (vbuf *[]){&w, &cs, &o});
    Py_RETURN_NONE;
}

/* ------------------------------------------- sums of products with AVX-512 IFMA */

/* T += v * 2^shift (v < 2^64, shift < 256) into an unreduced sum. */
static inline void acc5_add_shifted(acc5 *a, u64 v, unsigned shift) {
    u64 w[5] = {0, 0, 0, 0, 0};
    unsigned q = shift / 64, r = shift % 64;
    w[q] = v << r;
    if (r && q + 1 < 5) w[q + 1] = v >> (64 - r);
    unsigned char c;
    a->w0 = adc(a->w0, w[0], 0, &c);
    a->w1 = adc(a->w1, w[1], c, &c);
    a->w2 = adc(a->w2, w[2], c, &c);
    a->w3 = adc(a->w3, w[3], c, &c);
    a->w4 += w[4] + c;
}

/* Whether the IFMA path is used (the CPU has it and tests have not turned it off). */
static int have_ifma = 0, use_ifma = 0;

#ifdef __x86_64__
#include <immintrin.h>
#define IFMA_TARGET __attribute__((target("avx512f,avx512ifma")))

/* The 52-bit limbs of x < 2^128 (x = l0 + l1*2^52 + l2*2^104, l2 < 2^24). */
static inline void limbs52(e128 x, u64 *l) {
    const u64 m = (1ULL << 52) - 1;
    l[0] = x.lo & m;
    l[1] = ((x.lo >> 52) | (x.hi << 12)) & m;
    l[2] = x.hi >> 40;
}

/* acc[0..4] += the limb products of v (8 lanes) and e (broadcast limbs), by
 * weight 2^(52w): lo and hi halves of each 52x52-bit product (the weight-5
 * term is l2*e2 < 2^48, whose high half is 0). */
#define IFMA_MAC(acc, v0, v1, v2, e)                                                     \
    do {                                                                                 \
        acc[0] = _mm512_madd52lo_epu64(acc[0], v0, e[0]);                                \
        acc[1] = _mm512_madd52hi_epu64(acc[1], v0, e[0]);                                \
        acc[1] = _mm512_madd52lo_epu64(acc[1], v0, e[1]);                                \
        acc[1] = _mm512_madd52lo_epu64(acc[1], v1, e[0]);                                \
        acc[2] = _mm512_madd52hi_epu64(acc[2], v0, e[1]);                                \
        acc[2] = _mm512_madd52hi_epu64(acc[2], v1, e[0]);                                \
        acc[2] = _mm512_madd52lo_epu64(acc[2], v0, e[2]);                                \
        acc[2] = _mm512_madd52lo_epu64(acc[2], v1, e[1]);                                \
        acc[2] = _mm512_madd52lo_epu64(acc[2], v2, e[0]);                                \
        acc[3] = _mm512_madd52hi_epu64(acc[3], v0, e[2]);                                \
        acc[3] = _mm512_madd52hi_epu64(acc[3], v1, e[1]);                                \
        acc[3] = _mm512_madd52hi_epu64(acc[3], v2, e[0]);                                \
        acc[3] = _mm512_madd52lo_epu64(acc[3], v1, e[2]);                                \
        acc[3] = _mm512_madd52lo_epu64(acc[3], v2, e[1]);                                \
        acc[4] = _mm512_madd52hi_epu64(acc[4], v1, e[2]);                                \
        acc[4] = _mm512_madd52hi_epu64(acc[4], v2, e[1]);                                \
        acc[4] = _mm512_madd52lo_epu64(acc[4], v2, e[2]);                                \
    } while (0)

/* Lane j of the five limb sums into out[j] (an unreduced sum). */
IFMA_TARGET static void ifma_flush(const __m512i *acc, acc5 *out, int lanes) {
    u64 w[5][8];
    for (int k = 0; k < 5; k++) _mm512_storeu_si512((void *)w[k], acc[k]);
    for (int j = 0; j < lanes; j++)
        for (int k = 0; k < 5; k++) acc5_add_shifted(&out[j], w[k][j], 52 * (unsigned)k);
}

/* The chunked bit check's two sums for every column c < chunk: even[c] =
 * sum_call m[call*chunk + c] * fac[2 call], odd[c] likewise with
 * fac[2 call + 1], unreduced; facl holds the factors' limbs (6 per call), acc
 * is scratch for 10 * ceil(chunk / 8) vectors.  Eight columns per vector;
 * the calls go in blocks of 8 through every column (the measurement is read
 * in order, each block's rows staying in cache), the limb sums in memory
 * between blocks.  A limb sum grows by under 5 * 2^52 per call, so the sums
 * are flushed every 256 calls. */
IFMA_TARGET static void bit_sums_ifma(const e128 *mq, Py_ssize_t len, Py_ssize_t chunk,
                                      Py_ssize_t calls, const u64 *facl, __m512i *acc,
                                      acc5 *even, acc5 *odd) {
    const __m512i m52 = _mm512_set1_epi64((long long)((1ULL << 52) - 1));
    const __m512i lo_idx = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i hi_idx = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    Py_ssize_t groups = (chunk + 7) / 8;
    for (Py_ssize_t c = 0; c < chunk; c++) {
        acc5_zero(&even[c]);
        acc5_zero(&odd[c]);
    }
    for (Py_ssize_t k = 0; k < 10 * groups; k++) acc[k] = _mm512_setzero_si512();
    for (Py_ssize_t block = 0; block < calls; block += 8) {
        Py_ssize_t block_end = calls - block < 8 ? calls : block + 8;
        for (Py_ssize_t g = 0; g < groups; g++) {
            Py_ssize_t c0 = 8 * g;
            Py_ssize_t lanes = chunk - c0 < 8 ? chunk - c0 : 8;
            __m512i ae[5], ao[5];
            for (int k = 0; k < 5; k++) {
                ae[k] = acc[10 * g + k];
                ao[k] = acc[10 * g + 5 + k];
            }
            for (Py_ssize_t call = block; call < block_end; call++) {
                Py_ssize_t base = call * chunk + c0;
                Py_ssize_t n = len - base < lanes ? len - base : lanes; /* elements present */
                if (n <= 0) break;
                __mmask8 m0 = (__mmask8)(n >= 4 ? 0xFF : (1u << (2 * n)) - 1);
                __mmask8 m1 = (__mmask8)(n >= 8 ? 0xFF : n <= 4 ? 0 : (1u << (2 * (n - 4))) - 1);
                __m512i x0 = _mm512_maskz_loadu_epi64(m0, (const void *)(mq + base));
                __m512i x1 = _mm512_maskz_loadu_epi64(m1, (const void *)(mq + base + 4));
                __m512i lo = _mm512_permutex2var_epi64(x0, lo_idx, x1);
                __m512i hi = _mm512_permutex2var_epi64(x0, hi_idx, x1);
                __m512i v0 = _mm512_and_si512(lo, m52);
                __m512i v1 = _mm512_and_si512(
                    _mm512_or_si512(_mm512_srli_epi64(lo, 52), _mm512_slli_epi64(hi, 12)), m52);
                __m512i v2 = _mm512_srli_epi64(hi, 40);
                const u64 *f = facl + 6 * call;
                __m512i fe[3] = {_mm512_set1_epi64((long long)f[0]),
                                 _mm512_set1_epi64((long long)f[1]),
                                 _mm512_set1_epi64((long long)f[2])};
                __m512i fo[3] = {_mm512_set1_epi64((long long)f[3]),
                                 _mm512_set1_epi64((long long)f[4]),
                                 _mm512_set1_epi64((long long)f[5])};
                IFMA_MAC(ae, v0, v1, v2, fe);
                IFMA_MAC(ao, v0, v1, v2, fo);
            }
            for (int k = 0; k < 5; k++) {
                acc[10 * g + k] = ae[k];
                acc[10 * g + 5 + k] = ao[k];
            }
        }
        if ((block_end & 255) == 0 || block_end == calls) {
            for (Py_ssize_t g = 0; g < groups; g++) {
                int lanes = chunk - 8 * g < 8 ? (int)(chunk - 8 * g) : 8;
                ifma_flush(acc + 10 * g, even + 8 * g, lanes);
                ifma_flush(acc + 10 * g + 5, odd + 8 * g, lanes);
            }
            for (Py_ssize_t k = 0; k < 10 * groups; k++) acc[k] = _mm512_setzero_si512();
        }
    }
}
#endif

/* bit_check_at(fid, meas, r, s, lam, chunk, calls, out, rows): the chunked
 * bit check's wire values at a point, straight from the measurement: for
 * report q, with x_k = (r^(k+1) m_k, m_k - s) the inputs of call k / chunk
 * (m zero-padded to calls*chunk) and lam[q, 1 + call] the call's weight,
 * out[q, 2c] = sum_call lam * r^(call*chunk + c + 1) * m_k
 *            = r^c * sum_call (lam * r^(call*chunk + 1)) * m_k,
 * out[q, 2c + 1] = sum_call lam * m_k - s * sum_call lam   (k = call*chunk + c):
 * two products per element instead of four (inputs, then their weighted sum). */
static PyObject *py_bit_check_at(PyObject *self, PyObject *args) {
    int fid;
    Py_ssize_t chunk, calls, rows;
    PyObject *m_o, *r_o, *s_o, *l_o, *o_o;
    if (!PyArg_ParseTuple(args, "iOOOOnnOn", &fid, &m_o, &r_o, &s_o, &l_o, &chunk, &calls, &o_o, &rows) ||
        check_fid(fid) < 0 || fid != 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bit_check_at: Field128 only");
        return NULL;
    }
    vbuf m, r, sv, l, o;
    if (get_vecs(fid, 5, (PyObject *[]){m_o, r_o, s_o, l_o, o_o}, (int[]){0, 0, 0, 0, 1},
                 (vbuf *[]){&m, &r, &sv, &l, &o}) < 0)
        return NULL;
    /* rows == r.n, calls < np_ and 2 * chunk * rows == o.n bound every scratch size by
     * a buffer's; chunk * calls (the padded measurement) must not overflow either */
    int shape_ok = rows > 0 && r.n == rows && chunk > 0 && calls > 0 && sv.n == 1;
    Py_ssize_t len = shape_ok ? m.n / rows : 0, np_ = shape_ok ? l.n / rows : 0, padded;
    if (!shape_ok || m.n != rows * len || mul_size(chunk, calls, &padded) < 0 || len > padded ||
        l.n != rows * np_ || calls >= np_ || !is_product3(o.n, rows, 2, chunk)) {
        PyErr_SetString(PyExc_ValueError, "bit_check_at: shape mismatch");
    } else {
        const e128 *ms = (const e128 *)m.view.buf, *rs = (const e128 *)r.view.buf;
        const e128 *ls = (const e128 *)l.view.buf;
        e128 s = AT128(sv, 0), *out = (e128 *)o.view.buf;
        /* per call, its two factors in Montgomery form: lam*r^(call*chunk+1)*R, lam*R
         * (and for the IFMA path their 52-bit limbs) */
        e128 *fac = (e128 *)PyMem_Malloc(sizeof(e128) * (size_t)(2 * calls));
        u64 *facl = (u64 *)PyMem_Malloc(sizeof(u64) * (size_t)(6 * calls));
        acc5 *sums = (acc5 *)PyMem_Malloc(sizeof(acc5) * (size_t)(2 * chunk));
        /* the IFMA path's limb sums: 10 vectors of 64 bytes per 8 columns, aligned */
        Py_ssize_t groups = (chunk + 7) / 8;
        unsigned char *scratch = (unsigned char *)PyMem_Malloc((size_t)(640 * groups + 64));
        if (!fac || !facl || !sums || !scratch) {
            PyMem_Free(fac);
            PyMem_Free(facl);
            PyMem_Free(sums);
            PyMem_Free(scratch);
            PyErr_NoMemory();
            goto done;
        }
        void *limb_sums = scratch + (64 - ((uintptr_t)scratch & 63)) % 64;
        for (Py_ssize_t q = 0; q < rows; q++) {
            const e128 *mq = ms + q * len, *lq = ls + q * np_;
            e128 *oq = out + q * 2 * chunk;
            e128 rm = tomont128(rs[q]);                   /* r*R */
            e128 r_chunk_m = rm;                          /* r^chunk * R */
            for (Py_ssize_t c = 1; c < chunk; c++) r_chunk_m = mont128(r_chunk_m, rm);
            e128 r_base = rs[q];                          /* r^(call*chunk + 1) */
            acc3 lam_sum = {0, 0, 0};
            for (Py_ssize_t call = 0; call < calls; call++) {
                e128 lam = lq[call + 1];
                acc3_add(&lam_sum, lam);
                e128 lam_m = tomont128(lam);
                fac[2 * call] = tomont128(mont128(lam_m, r_base));
                fac[2 * call + 1] = lam_m;
                r_base = mont128(r_base, r_chunk_m);
            }
            e128 s_lam = mul128(s, acc3_reduce(&lam_sum));
            e128 rc_m = tomont128((e128){1, 0}); /* r^c * R, from c = 0 */
#ifdef __x86_64__
            if (use_ifma)
                for (Py_ssize_t call = 0; call < 2 * calls; call++) limbs52(fac[call], facl + 3 * call);
#endif
            /* sums of v*(u*R) over the calls, reduced once: sum v*u */
            acc5 *even = sums, *odd = sums + chunk;
#ifdef __x86_64__
            if (use_ifma) {
                bit_sums_ifma(mq, len, chunk, calls, facl, (__m512i *)limb_sums, even, odd);
            } else
#endif
            {
                for (Py_ssize_t c = 0; c < chunk; c++) {
                    /* one accumulator at a time, which keeps it in registers */
                    acc5_zero(&even[c]);
                    for (Py_ssize_t call = 0, k = c; call < calls && k < len; call++, k += chunk)
                        acc5_mac(&even[c], mq[k], fac[2 * call]);
                    acc5_zero(&odd[c]);
                    for (Py_ssize_t call = 0, k = c; call < calls && k < len; call++, k += chunk)
                        acc5_mac(&odd[c], mq[k], fac[2 * call + 1]);
                }
            }
            for (Py_ssize_t c = 0; c < chunk; c++) {
                oq[2 * c] = mont128(acc5_redc(&even[c]), rc_m);
                oq[2 * c + 1] = sub128(acc5_redc(&odd[c]), s_lam);
                rc_m = mont128(rc_m, rm);
            }
        }
        PyMem_Free(fac);
        PyMem_Free(facl);
        PyMem_Free(sums);
        PyMem_Free(scratch);
    }
done:
    release_vecs(5, (vbuf *[]){&m, &r, &sv, &l, &o});
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ the XOF */

#define MAX_SEGS 8

/* shake_rows(segs, rows, out): out (rows * L bytes, writable) gets, per row r,
 * the first L bytes of SHAKE128 of row r's message, which is the
 * concatenation of the pieces segs = ((buffer, offset, width, stride), ...):
 * buffer[offset + r*stride, + width) (stride 0: shared by every row). */
static PyObject *py_shake_rows(PyObject *self, PyObject *args) {
    PyObject *segs_o, *out_o;
    Py_ssize_t rows;
    if (!PyArg_ParseTuple(args, "O!nO", &PyTuple_Type, &segs_o, &rows, &out_o)) return NULL;
    Py_ssize_t nsegs = PyTuple_GET_SIZE(segs_o);
    if (nsegs > MAX_SEGS || rows < 0) {
        PyErr_SetString(PyExc_ValueError, "shake_rows: at most 8 pieces, rows >= 0");
        return NULL;
    }
    Py_buffer views[MAX_SEGS], outv;
    xof_seg segs[MAX_SEGS];
    int held = 0;
    if (PyObject_GetBuffer(out_o, &outv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    for (; held < nsegs; held++) {
        Py_ssize_t off, width, stride;
        PyObject *obj, *item = PyTuple_GET_ITEM(segs_o, held);
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "shake_rows: a piece is (buffer, offset, width, stride)");
            goto fail;
        }
        if (!PyArg_ParseTuple(item, "Onnn;shake_rows: a piece is (buffer, offset, width, stride)",
                              &obj, &off, &width, &stride))
            goto fail;
        if (PyObject_GetBuffer(obj, &views[held], PyBUF_C_CONTIGUOUS) < 0) goto fail;
        /* the last row's bytes end at off + (rows - 1) * stride + width <= len,
         * each step checked for overflow */
        Py_ssize_t end = 0;
        int fits = off >= 0 && width >= 0 && stride >= 0;
        if (fits && rows)
            fits = mul_size(rows - 1, stride, &end) == 0 && !__builtin_add_overflow(end, off, &end) &&
                   !__builtin_add_overflow(end, width, &end) && end <= views[held].len;
        if (!fits) {
            held++;
            PyErr_SetString(PyExc_ValueError, "shake_rows: a piece reaches past its buffer");
            goto fail;
        }
        segs[held] = (xof_seg){(const unsigned char *)views[held].buf, off, width, stride};
    }
    if (rows ? outv.len % rows != 0 : outv.len != 0) {
        PyErr_SetString(PyExc_ValueError, "shake_rows: out is not rows x length bytes");
        goto fail;
    }
    Py_ssize_t out_len = rows ? outv.len / rows : 0;
    if (out_len > 0) { /* else nothing to write, however many rows are claimed */
        Py_BEGIN_ALLOW_THREADS
        shake128_rows(segs, (int)nsegs, rows, (unsigned char *)outv.buf, out_len);
        Py_END_ALLOW_THREADS
    }
    while (held--) PyBuffer_Release(&views[held]);
    PyBuffer_Release(&outv);
    Py_RETURN_NONE;
fail:
    while (held--) PyBuffer_Release(&views[held]);
    PyBuffer_Release(&outv);
    return NULL;
}

/* simd(on=-1): whether the AVX-512 IFMA sums are used (where the CPU has
 * them); on 0/1 turns them off/on (tests compare both paths). */
static PyObject *py_simd(PyObject *self, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|i", &on)) return NULL;
    if (on < -1 || on > 1) {
        PyErr_SetString(PyExc_ValueError, "simd: on is -1 (ask), 0 (off) or 1 (on)");
        return NULL;
    }
    if (on == 1 && !have_ifma) {
        PyErr_SetString(PyExc_ValueError, "this CPU has no AVX-512 IFMA");
        return NULL;
    }
    if (on >= 0) use_ifma = on;
    return PyBool_FromLong(use_ifma);
}

/* keccak_width(want=-1): the number of SHAKE128 streams per permutation in use
 * (1, 4 or 8); want 0 picks the widest this CPU runs, 1/4/8 one of them. */
static PyObject *py_keccak_width(PyObject *self, PyObject *args) {
    int want = -1;
    if (!PyArg_ParseTuple(args, "|i", &want)) return NULL;
    int got = keccak_width(want);
    if (got < 0) {
        PyErr_Format(PyExc_ValueError, "keccak width %d is not available here", want);
        return NULL;
    }
    return PyLong_FromLong(got);
}

static PyMethodDef methods[] = {
    {"add", py_add, METH_VARARGS, "add(fid, a, b, out): out = a + b (length-1 operands broadcast)"},
    {"sub", py_sub, METH_VARARGS, "sub(fid, a, b, out): out = a - b"},
    {"mul", py_mul, METH_VARARGS, "mul(fid, a, b, out): out = a * b"},
    {"sum_rows", py_sum_rows, METH_VARARGS, "sum_rows(fid, a, rows, out): column sums of a (rows x cols)"},
    {"sum_last", py_sum_last, METH_VARARGS, "sum_last(fid, a, n, out): row sums of a (rows x n)"},
    {"fold_rows", py_fold_rows, METH_VARARGS,
     "fold_rows(fid, a, row_len, offset, length, n, out): each row's slice mod x^n - 1"},
    {"bits_value", py_bits_value, METH_VARARGS,
     "bits_value(fid, a, group, count, out): out[g] = sum_{j<count} 2^j a[g, j]"},
    {"powers", py_powers, METH_VARARGS, "powers(fid, start, step, out): out[i] = start * step^i"},
    {"ntt", py_ntt, METH_VARARGS, "ntt(fid, data, n, root, scale): in-place NTT of each row"},
    {"poly_eval", py_poly_eval, METH_VARARGS, "poly_eval(fid, coeffs, n, t, out): each row at t"},
    {"dot_rows", py_dot_rows, METH_VARARGS, "dot_rows(fid, a, b, out): out[g, r] = a[g, r, :] . b[r, :]"},
    {"powers_rows", py_powers_rows, METH_VARARGS, "powers_rows(fid, x, first, out): out[r, i] = x[r]^(first+i)"},
    {"weighted_rows", py_weighted_rows, METH_VARARGS,
     "weighted_rows(fid, m, w, out, rows): out[r, j] = sum_i w[r, i] m[r, i, j]"},
    {"bit_pairs", py_bit_pairs, METH_VARARGS,
     "bit_pairs(fid, meas, r, s, out, rows): (r^(k+1) m_k, m_k - s) per report"},
    {"pair_products", py_pair_products, METH_VARARGS,
     "pair_products(fid, x, count, out): out[j] = sum_c x[c, 0, j] x[c, 1, j]"},
    {"pair_products_last", py_pair_products_last, METH_VARARGS,
     "pair_products_last(fid, x, count, out): out[m] = sum_c x[m, 2c] x[m, 2c+1]"},
    {"mul_cols", py_mul_cols, METH_VARARGS, "mul_cols(fid, a, b, out): out[r, k] = a[r, k] b[k]"},
    {"mul_gadget_poly", py_mul_gadget_poly, METH_VARARGS,
     "mul_gadget_poly(fid, wires, count, consts, out): ParallelSum(Mul)'s gadget polynomials"},
    {"bit_check_at", py_bit_check_at, METH_VARARGS,
     "bit_check_at(fid, meas, r, s, lam, chunk, calls, out, rows): bit-check wires at t"},
    {"sample", py_sample, METH_VARARGS, "sample(fid, raw, out) -> kept: rejection sampling"},
    {"copy_rows", py_copy_rows, METH_VARARGS,
     "copy_rows(blobs, offset, width, out): blob[offset:offset+width] of each into out's rows"},
    {"shake_rows", py_shake_rows, METH_VARARGS,
     "shake_rows(pieces, rows, out): SHAKE128 of each row's message into out"},
    {"simd", py_simd, METH_VARARGS, "simd(on=-1): whether the AVX-512 IFMA sums are in use"},
    {"keccak_width", py_keccak_width, METH_VARARGS,
     "keccak_width(want=-1): SHAKE128 streams per permutation (1, 4, 8)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_field", "Native Field64/Field128 core of svtagg.vdaf", -1, methods,
};

PyMODINIT_FUNC PyInit__field(void) {
    keccak_init();
#ifdef __x86_64__
    __builtin_cpu_init();
    have_ifma = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512ifma");
#endif
    use_ifma = have_ifma;
    return PyModule_Create(&moduledef);
}
