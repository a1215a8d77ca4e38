/*
 * svtagg.mpc._gc — the native core of the garbled-circuit engine.
 *
 * The same operations as the numpy backend (mpc/aes.py, mpc/garble.py,
 * mpc/ot.py), byte for byte: fixed-key AES π, the tweakable hash
 * H(x, i) = π(π(x) ⊕ i) ⊕ π(x), half-gates AND layers on both sides, the
 * fused carry chain of the comparison circuit, and the 128 × m bit transpose
 * of the IKNP extension.  The numpy backend is the reference; the tests run
 * both on the same inputs and compare every byte.
 *
 * Blocks are 16 bytes: a row of a C-contiguous (n, 2) uint64 array, word 0 the
 * low 8 bytes.  A tweak is the block (lo, hi) = (L·2^32 + 2k + h, tweak_hi)
 * for half h of the gate in lane k of AND layer L (see garble.py).
 *
 * Built for baseline x86-64 with AES-NI (-maes -msse4.1); the four-block
 * VAES path (AVX-512) is compiled with a target attribute and chosen at run
 * time when the CPU has it.  Secret data never selects a branch or an
 * address: point-and-permute bits act through all-zero/all-one masks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <immintrin.h>
#include <wmmintrin.h>
#include <pthread.h>
#include <stdlib.h>

#include "_aesni.h"

/* ------------------------------------------------------------------ AES-128 */

static block round_keys[11];
static int have_vaes = 0;
static int use_vaes = 0;

/* π over n blocks in place (the engine's one fixed key). */
static inline void aes_n_128(block *x, size_t n) { aes_n_keyed(round_keys, x, n); }

#if defined(__GNUC__) && !defined(__clang__) && (__GNUC__ >= 8)
#define HAVE_VAES_TARGET 1
__attribute__((target("avx512f,vaes")))
static void aes_n_vaes(block *x, size_t n) {
    __m512i k[11];
    for (int r = 0; r < 11; r++) k[r] = _mm512_broadcast_i32x4(round_keys[r]);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i b0 = _mm512_xor_si512(_mm512_loadu_si512((void *)(x + i)), k[0]);
        __m512i b1 = _mm512_xor_si512(_mm512_loadu_si512((void *)(x + i + 4)), k[0]);
        __m512i b2 = _mm512_xor_si512(_mm512_loadu_si512((void *)(x + i + 8)), k[0]);
        __m512i b3 = _mm512_xor_si512(_mm512_loadu_si512((void *)(x + i + 12)), k[0]);
        for (int r = 1; r < 10; r++) {
            b0 = _mm512_aesenc_epi128(b0, k[r]); b1 = _mm512_aesenc_epi128(b1, k[r]);
            b2 = _mm512_aesenc_epi128(b2, k[r]); b3 = _mm512_aesenc_epi128(b3, k[r]);
        }
        _mm512_storeu_si512((void *)(x + i), _mm512_aesenclast_epi128(b0, k[10]));
        _mm512_storeu_si512((void *)(x + i + 4), _mm512_aesenclast_epi128(b1, k[10]));
        _mm512_storeu_si512((void *)(x + i + 8), _mm512_aesenclast_epi128(b2, k[10]));
        _mm512_storeu_si512((void *)(x + i + 12), _mm512_aesenclast_epi128(b3, k[10]));
    }
    for (; i + 4 <= n; i += 4) {
        __m512i b = _mm512_xor_si512(_mm512_loadu_si512((void *)(x + i)), k[0]);
        for (int r = 1; r < 10; r++) b = _mm512_aesenc_epi128(b, k[r]);
        _mm512_storeu_si512((void *)(x + i), _mm512_aesenclast_epi128(b, k[10]));
    }
    _mm256_zeroupper();
    if (i < n) aes_n_128(x + i, n - i);
}
#endif

static inline void aes_n(block *x, size_t n) {
#ifdef HAVE_VAES_TARGET
    if (use_vaes) {
        aes_n_vaes(x, n);
        return;
    }
#endif
    aes_n_128(x, n);
}

/* H(x_j, t_j) for n blocks: p = π(x); out = π(p ⊕ t) ⊕ p.  `p` is scratch. */
static inline void tccr_n(const block *x, const block *t, block *out, block *p, size_t n) {
    memcpy(p, x, n * sizeof(block));
    aes_n(p, n);
    for (size_t j = 0; j < n; j++) out[j] = _mm_xor_si128(p[j], t[j]);
    aes_n(out, n);
    for (size_t j = 0; j < n; j++) out[j] = _mm_xor_si128(out[j], p[j]);
}

static inline block mask_of(block x) {
    /* all-ones when the point-and-permute bit (bit 0 of word 0) is set */
    int64_t b = _mm_cvtsi128_si64(x) & 1;
    return _mm_set1_epi64x(-b);
}

static inline block tweak(uint64_t layer, uint64_t lane, uint64_t half, uint64_t hi) {
    return _mm_set_epi64x((long long)hi, (long long)((layer << 32) | (2 * lane + half)));
}

/* ------------------------------------------------------------------ buffers */

/* A buffer argument: a C-contiguous view, and with get_blocks a 16-byte-aligned
 * pointer to it.  The block loops load and store __m128i through plain pointers
 * (aligned accesses), so a block buffer that does not start on a 16-byte
 * boundary (a numpy view at an odd offset) is worked on through an aligned copy,
 * written back on release if it is an output. */
typedef struct {
    Py_buffer view;
    int held;
    int writable;
    void *p;      /* view.buf, or the aligned copy */
    void *shadow; /* the aligned copy, if one was needed */
} buf_t;

static int get_buf(PyObject *obj, buf_t *b, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    b->held = 0;
    b->shadow = NULL;
    if (PyObject_GetBuffer(obj, &b->view, flags) != 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous%s buffer", name,
                     writable ? " writable" : "");
        return -1;
    }
    b->held = 1;
    b->writable = writable;
    b->p = b->view.buf;
    return 0;
}

static int get_blocks(PyObject *obj, buf_t *b, int writable, const char *name) {
    if (get_buf(obj, b, writable, name)) return -1;
    if (((uintptr_t)b->view.buf & 15) && b->view.len > 0) {
        size_t size = ((size_t)b->view.len + 15) & ~(size_t)15;
        b->shadow = aligned_alloc(16, size);
        if (!b->shadow) {
            PyBuffer_Release(&b->view);
            b->held = 0;
            PyErr_NoMemory();
            return -1;
        }
        memcpy(b->shadow, b->view.buf, (size_t)b->view.len);
        b->p = b->shadow;
    }
    return 0;
}

static void release(buf_t *b) {
    if (b->shadow) {
        if (b->writable) memcpy(b->view.buf, b->shadow, (size_t)b->view.len);
        free(b->shadow);
        b->shadow = NULL;
    }
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

static int need(buf_t *b, Py_ssize_t bytes, const char *name) {
    if (b->view.len < bytes) {
        PyErr_Format(PyExc_ValueError, "%s: buffer has %zd bytes, needs %zd", name,
                     b->view.len, bytes);
        return -1;
    }
    return 0;
}

/* Scratch for lane groups (aligned, grown on demand; the GIL is held). */
#define GROUP 16
static block *scratch = NULL;
static size_t scratch_n = 0;

static block *get_scratch(size_t n) {
    if (scratch_n < n) {
        free(scratch);
        scratch = (block *)aligned_alloc(64, ((n * sizeof(block) + 63) / 64) * 64);
        scratch_n = scratch ? n : 0;
    }
    return scratch;
}

/* ------------------------------------------------------------------ threads
 *
 * The fused carry chains (and transposes wider than 2^17 columns) split their
 * lanes over `n_threads` POSIX threads with the interpreter lock released; the
 * IKNP PRG releases the lock but stays on one thread (measured no faster).  Every lane's
 * tweaks and table positions depend only on its index, so the output is the
 * same bytes for any thread count.  Each thread has its own scratch.
 */
static int n_threads = 1;

typedef void (*range_fn)(void *ctx, size_t lo, size_t hi);
typedef struct {
    range_fn fn;
    void *ctx;
    size_t lo, hi;
} range_job;

static void *run_range(void *arg) {
    range_job *j = (range_job *)arg;
    j->fn(j->ctx, j->lo, j->hi);
    return NULL;
}

/* fn over [0, total) in up to n_threads pieces aligned to `align`. */
static void parallel_for(size_t total, size_t align, size_t min_piece, range_fn fn, void *ctx) {
    int t = n_threads;
    if (t > 64) t = 64;
    size_t per = (total + (size_t)t - 1) / (size_t)(t > 0 ? t : 1);
    per = (per + align - 1) / align * align;
    if (t <= 1 || total < 2 * min_piece || per == 0) {
        fn(ctx, 0, total);
        return;
    }
    pthread_t th[64];
    range_job jobs[64];
    int started = 0;
    for (int i = 0; i < t; i++) {
        size_t lo = (size_t)i * per, hi = lo + per < total ? lo + per : total;
        if (lo >= total) break;
        jobs[i] = (range_job){fn, ctx, lo, hi};
        if (i == 0) continue; /* piece 0 runs on this thread */
        if (pthread_create(&th[i], NULL, run_range, &jobs[i]) != 0) {
            run_range(&jobs[i]); /* no thread: run it here */
            th[i] = 0;
        }
        started = i + 1;
    }
    run_range(&jobs[0]);
    for (int i = 1; i < started; i++)
        if (th[i]) pthread_join(th[i], NULL);
}

static PyObject *py_set_threads(PyObject *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    if (n < 1 || n > 64) {
        PyErr_SetString(PyExc_ValueError, "threads must be in [1, 64]");
        return NULL;
    }
    n_threads = n;
    return PyLong_FromLong(n_threads);
}

/* ------------------------------------------------------------------ hash API */

static PyObject *py_tccr(PyObject *self, PyObject *args) {
    PyObject *xo, *to, *oo;
    if (!PyArg_ParseTuple(args, "OOO", &xo, &to, &oo)) return NULL;
    buf_t x = {0}, t = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_blocks(xo, &x, 0, "x") || get_blocks(to, &t, 0, "tweaks") ||
        get_blocks(oo, &o, 1, "out"))
        goto done;
    if (x.view.len % 16) {
        PyErr_SetString(PyExc_ValueError, "x: not a whole number of blocks");
        goto done;
    }
    size_t n = (size_t)x.view.len / 16;
    if (need(&t, x.view.len, "tweaks") || need(&o, x.view.len, "out")) goto done;
    if (n == 0) { /* nothing to hash (and no scratch to get) */
        ret = Py_NewRef(Py_None);
        goto done;
    }
    block *p = get_scratch(n);
    if (!p) { PyErr_NoMemory(); goto done; }
    tccr_n((const block *)x.p, (const block *)t.p, (block *)o.p, p, n);
    ret = Py_NewRef(Py_None);
done:
    release(&x); release(&t); release(&o);
    return ret;
}

/* ------------------------------------------------------------------ AND layers
 *
 * garble_and(a0, b0, delta, tweak_hi, layer, c0_out, tables_out):
 *   tables_out[k] = T_G, tables_out[n + k] = T_E, c0_out[k] = W_G ⊕ W_E
 * eval_and(a, b, tables, tweak_hi, layer, c_out)
 * garble_and_const(bits u8[n], b0, delta, tweak_hi, layer, out, tables_out)
 * eval_and_const(b, tables, tweak_hi, layer, out)
 */

static void garble_and_group(const block *a0, const block *b0, block d, uint64_t hi,
                             uint64_t layer, uint64_t lane0, size_t g, block *c0, block *tg,
                             block *te, block *s) {
    /* s: 8·GROUP scratch blocks: x[4g] then tweaks... computed in place */
    block *x = s, *t = s + 4 * GROUP, *p = s + 8 * GROUP;
    for (size_t j = 0; j < g; j++) {
        x[j] = a0[j];
        x[g + j] = _mm_xor_si128(a0[j], d);
        x[2 * g + j] = b0[j];
        x[3 * g + j] = _mm_xor_si128(b0[j], d);
        block t0 = tweak(layer, lane0 + j, 0, hi), t1 = tweak(layer, lane0 + j, 1, hi);
        t[j] = t0; t[g + j] = t0; t[2 * g + j] = t1; t[3 * g + j] = t1;
    }
    tccr_n(x, t, x, p, 4 * g);
    for (size_t j = 0; j < g; j++) {
        block ha0 = x[j], ha1 = x[g + j], hb0 = x[2 * g + j], hb1 = x[3 * g + j];
        block ma = mask_of(a0[j]), mb = mask_of(b0[j]);
        block tgj = _mm_xor_si128(_mm_xor_si128(ha0, ha1), _mm_and_si128(mb, d));
        block hb = _mm_xor_si128(hb0, hb1);
        block tej = _mm_xor_si128(hb, a0[j]);
        block wg = _mm_xor_si128(ha0, _mm_and_si128(ma, tgj));
        block we = _mm_xor_si128(hb0, _mm_and_si128(mb, hb));
        tg[j] = tgj;
        te[j] = tej;
        c0[j] = _mm_xor_si128(wg, we);
    }
}

static void eval_and_group(const block *a, const block *b, const block *tg, const block *te,
                           uint64_t hi, uint64_t layer, uint64_t lane0, size_t g, block *c,
                           block *s) {
    block *x = s, *t = s + 2 * GROUP, *p = s + 4 * GROUP;
    for (size_t j = 0; j < g; j++) {
        x[j] = a[j];
        x[g + j] = b[j];
        t[j] = tweak(layer, lane0 + j, 0, hi);
        t[g + j] = tweak(layer, lane0 + j, 1, hi);
    }
    tccr_n(x, t, x, p, 2 * g);
    for (size_t j = 0; j < g; j++) {
        block wg = _mm_xor_si128(x[j], _mm_and_si128(mask_of(a[j]), tg[j]));
        block we = _mm_xor_si128(x[g + j],
                                 _mm_and_si128(mask_of(b[j]), _mm_xor_si128(te[j], a[j])));
        c[j] = _mm_xor_si128(wg, we);
    }
}

static void garble_and_const_group(const uint8_t *bits, const block *b0, block d, uint64_t hi,
                                   uint64_t layer, uint64_t lane0, size_t g, block *out,
                                   block *tab, block *s) {
    block *x = s, *t = s + 2 * GROUP, *p = s + 4 * GROUP;
    for (size_t j = 0; j < g; j++) {
        x[j] = b0[j];
        x[g + j] = _mm_xor_si128(b0[j], d);
        t[j] = t[g + j] = tweak(layer, lane0 + j, 0, hi);
    }
    tccr_n(x, t, x, p, 2 * g);
    for (size_t j = 0; j < g; j++) {
        block bm = _mm_set1_epi64x(-(int64_t)(bits[j] & 1));
        block tt = _mm_xor_si128(_mm_xor_si128(x[j], x[g + j]), _mm_and_si128(bm, d));
        tab[j] = tt;
        out[j] = _mm_xor_si128(x[j], _mm_and_si128(mask_of(b0[j]), tt));
    }
}

static void eval_and_const_group(const block *b, const block *tab, uint64_t hi, uint64_t layer,
                                 uint64_t lane0, size_t g, block *out, block *s) {
    block *x = s, *t = s + GROUP, *p = s + 2 * GROUP;
    for (size_t j = 0; j < g; j++) {
        x[j] = b[j];
        t[j] = tweak(layer, lane0 + j, 0, hi);
    }
    tccr_n(x, t, x, p, g);
    for (size_t j = 0; j < g; j++)
        out[j] = _mm_xor_si128(x[j], _mm_and_si128(mask_of(b[j]), tab[j]));
}

/* Whether b holds n blocks; n * 16 past PY_SSIZE_T_MAX is refused, not wrapped. */
static int check_blocks(buf_t *b, size_t n, const char *name) {
    if (n > (size_t)(PY_SSIZE_T_MAX / 16)) {
        PyErr_Format(PyExc_ValueError, "%s: %zu blocks overflow the address space", name, n);
        return -1;
    }
    return need(b, (Py_ssize_t)(16 * n), name);
}

static int get_delta(PyObject *o, block *d) {
    buf_t b = {0};
    if (get_buf(o, &b, 0, "delta")) return -1;
    if (b.view.len != 16) {
        release(&b);
        PyErr_SetString(PyExc_ValueError, "delta: expected one 16-byte block");
        return -1;
    }
    *d = _mm_loadu_si128((const block *)b.p);
    release(&b);
    return 0;
}

static PyObject *py_garble_and(PyObject *self, PyObject *args) {
    PyObject *ao, *bo, *dob, *co, *to;
    unsigned long long hi, layer;
    if (!PyArg_ParseTuple(args, "OOOKKOO", &ao, &bo, &dob, &hi, &layer, &co, &to)) return NULL;
    block d;
    if (get_delta(dob, &d)) return NULL;
    buf_t a = {0}, b = {0}, c = {0}, t = {0};
    PyObject *ret = NULL;
    if (get_blocks(ao, &a, 0, "a0") || get_blocks(bo, &b, 0, "b0") ||
        get_blocks(co, &c, 1, "out") || get_blocks(to, &t, 1, "tables"))
        goto done;
    size_t n = (size_t)a.view.len / 16;
    if (check_blocks(&b, n, "b0") || check_blocks(&c, n, "out") || check_blocks(&t, 2 * n, "tables"))
        goto done;
    block *s = get_scratch(12 * GROUP);
    if (!s) { PyErr_NoMemory(); goto done; }
    const block *A = a.p, *B = b.p;
    block *C = c.p, *T = t.p;
    for (size_t k = 0; k < n; k += GROUP) {
        size_t g = n - k < GROUP ? n - k : GROUP;
        garble_and_group(A + k, B + k, d, hi, layer, k, g, C + k, T + k, T + n + k, s);
    }
    ret = Py_NewRef(Py_None);
done:
    release(&a); release(&b); release(&c); release(&t);
    return ret;
}

static PyObject *py_eval_and(PyObject *self, PyObject *args) {
    PyObject *ao, *bo, *to, *co;
    unsigned long long hi, layer;
    if (!PyArg_ParseTuple(args, "OOOKKO", &ao, &bo, &to, &hi, &layer, &co)) return NULL;
    buf_t a = {0}, b = {0}, c = {0}, t = {0};
    PyObject *ret = NULL;
    if (get_blocks(ao, &a, 0, "a") || get_blocks(bo, &b, 0, "b") ||
        get_blocks(to, &t, 0, "tables") || get_blocks(co, &c, 1, "out"))
        goto done;
    size_t n = (size_t)a.view.len / 16;
    if (check_blocks(&b, n, "b") || check_blocks(&c, n, "out") || check_blocks(&t, 2 * n, "tables"))
        goto done;
    block *s = get_scratch(8 * GROUP);
    if (!s) { PyErr_NoMemory(); goto done; }
    const block *A = a.p, *B = b.p, *T = t.p;
    block *C = c.p;
    for (size_t k = 0; k < n; k += GROUP) {
        size_t g = n - k < GROUP ? n - k : GROUP;
        eval_and_group(A + k, B + k, T + k, T + n + k, hi, layer, k, g, C + k, s);
    }
    ret = Py_NewRef(Py_None);
done:
    release(&a); release(&b); release(&c); release(&t);
    return ret;
}

static PyObject *py_garble_and_const(PyObject *self, PyObject *args) {
    PyObject *bitso, *bo, *dob, *oo, *to;
    unsigned long long hi, layer;
    if (!PyArg_ParseTuple(args, "OOOKKOO", &bitso, &bo, &dob, &hi, &layer, &oo, &to)) return NULL;
    block d;
    if (get_delta(dob, &d)) return NULL;
    buf_t bits = {0}, b = {0}, o = {0}, t = {0};
    PyObject *ret = NULL;
    if (get_buf(bitso, &bits, 0, "bits") || get_blocks(bo, &b, 0, "b0") ||
        get_blocks(oo, &o, 1, "out") || get_blocks(to, &t, 1, "tables"))
        goto done;
    size_t n = (size_t)b.view.len / 16;
    if (need(&bits, (Py_ssize_t)n, "bits") || check_blocks(&o, n, "out") ||
        check_blocks(&t, n, "tables"))
        goto done;
    block *s = get_scratch(8 * GROUP);
    if (!s) { PyErr_NoMemory(); goto done; }
    const uint8_t *BT = bits.p;
    const block *B = b.p;
    block *O = o.p, *T = t.p;
    for (size_t k = 0; k < n; k += GROUP) {
        size_t g = n - k < GROUP ? n - k : GROUP;
        garble_and_const_group(BT + k, B + k, d, hi, layer, k, g, O + k, T + k, s);
    }
    ret = Py_NewRef(Py_None);
done:
    release(&bits); release(&b); release(&o); release(&t);
    return ret;
}

static PyObject *py_eval_and_const(PyObject *self, PyObject *args) {
    PyObject *bo, *to, *oo;
    unsigned long long hi, layer;
    if (!PyArg_ParseTuple(args, "OOKKO", &bo, &to, &hi, &layer, &oo)) return NULL;
    buf_t b = {0}, t = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_blocks(bo, &b, 0, "b") || get_blocks(to, &t, 0, "tables") ||
        get_blocks(oo, &o, 1, "out"))
        goto done;
    size_t n = (size_t)b.view.len / 16;
    if (check_blocks(&t, n, "tables") || check_blocks(&o, n, "out")) goto done;
    block *s = get_scratch(4 * GROUP);
    if (!s) { PyErr_NoMemory(); goto done; }
    const block *B = b.p, *T = t.p;
    block *O = o.p;
    for (size_t k = 0; k < n; k += GROUP) {
        size_t g = n - k < GROUP ? n - k : GROUP;
        eval_and_const_group(B + k, T + k, hi, layer, k, g, O + k, s);
    }
    ret = Py_NewRef(Py_None);
done:
    release(&b); release(&t); release(&o);
    return ret;
}

/* ------------------------------------------------------------------ carry chain
 *
 * The comparison's carry chain over one lane batch of n lanes and width w
 * (circuits._sign_yes_batch), fused: each group of lanes runs through all
 * w − 1 AND layers with its carries in cache, and writes its tables at their
 * layer-major positions — the same message the per-layer backend produces.
 *
 * garble_sign(a u8 (w, n), b0 (w, n) blocks, delta, tweak_hi, layer0, w, yes0_out, tables_out)
 *   a: the garbler's bit planes (a[i·n + k] is its constant for bit i of lane k);
 *   yes0_out[k]: 0-label of YES_k; tables_out: (2w − 3)·n blocks.
 * eval_sign(b (w, n) blocks, tables, tweak_hi, layer0, w, yes_out)
 */

typedef struct {
    const uint8_t *A; /* garbler only */
    const block *B, *T_in;
    block *Y, *T;
    block d;
    uint64_t hi, layer0;
    size_t n;
    int w;
    int failed;
} sign_ctx;

static void garble_sign_range(void *arg, size_t k0, size_t k1) {
    sign_ctx *x = (sign_ctx *)arg;
    block *s = (block *)aligned_alloc(64, 16 * GROUP * sizeof(block));
    if (!s) { x->failed = 1; return; }
    const uint8_t *A = x->A;
    const block *B = x->B;
    block *Y = x->Y, *T = x->T, d = x->d;
    size_t n = x->n;
    int w = x->w;
    block *c = s + 12 * GROUP, *xx = s + 13 * GROUP, *yy = s + 14 * GROUP, *gg = s + 15 * GROUP;
    uint8_t bits[GROUP];
    for (size_t k = k0; k < k1; k += GROUP) {
        size_t g = k1 - k < GROUP ? k1 - k : GROUP;
        for (size_t j = 0; j < g; j++) bits[j] = (uint8_t)(A[k + j] & 1);
        garble_and_const_group(bits, B + k, d, x->hi, x->layer0, k, g, c, T + k, s);
        for (int i = 1; i < w - 1; i++) {
            const block *bi = B + (size_t)i * n + k;
            for (size_t j = 0; j < g; j++) {
                block am = _mm_set1_epi64x(-(int64_t)(A[(size_t)i * n + k + j] & 1));
                xx[j] = _mm_xor_si128(c[j], _mm_and_si128(am, d));
                yy[j] = _mm_xor_si128(bi[j], c[j]);
            }
            block *base = T + n + (size_t)(i - 1) * 2 * n;
            garble_and_group(xx, yy, d, x->hi, x->layer0 + (uint64_t)i, k, g, gg, base + k,
                             base + n + k, s);
            for (size_t j = 0; j < g; j++) c[j] = _mm_xor_si128(c[j], gg[j]);
        }
        const block *top = B + (size_t)(w - 1) * n + k;
        for (size_t j = 0; j < g; j++) {
            block am = _mm_set1_epi64x(-(int64_t)(A[(size_t)(w - 1) * n + k + j] & 1));
            block sign = _mm_xor_si128(_mm_xor_si128(top[j], c[j]), _mm_and_si128(am, d));
            Y[k + j] = _mm_xor_si128(sign, d); /* NOT: the garbler relabels */
        }
    }
    free(s);
}

static void eval_sign_range(void *arg, size_t k0, size_t k1) {
    sign_ctx *x = (sign_ctx *)arg;
    block *s = (block *)aligned_alloc(64, 16 * GROUP * sizeof(block));
    if (!s) { x->failed = 1; return; }
    const block *B = x->B, *T = x->T_in;
    block *Y = x->Y;
    size_t n = x->n;
    int w = x->w;
    block *c = s + 12 * GROUP, *yy = s + 13 * GROUP, *gg = s + 14 * GROUP;
    for (size_t k = k0; k < k1; k += GROUP) {
        size_t g = k1 - k < GROUP ? k1 - k : GROUP;
        eval_and_const_group(B + k, T + k, x->hi, x->layer0, k, g, c, s);
        for (int i = 1; i < w - 1; i++) {
            const block *bi = B + (size_t)i * n + k;
            for (size_t j = 0; j < g; j++) yy[j] = _mm_xor_si128(bi[j], c[j]);
            const block *base = T + n + (size_t)(i - 1) * 2 * n;
            eval_and_group(c, yy, base + k, base + n + k, x->hi, x->layer0 + (uint64_t)i, k, g,
                           gg, s);
            for (size_t j = 0; j < g; j++) c[j] = _mm_xor_si128(c[j], gg[j]);
        }
        const block *top = B + (size_t)(w - 1) * n + k;
        for (size_t j = 0; j < g; j++) Y[k + j] = _mm_xor_si128(top[j], c[j]);
    }
    free(s);
}

/* Below this many lanes a carry chain runs on the calling thread alone. */
#define MIN_PARALLEL_LANES 1024

static PyObject *py_garble_sign(PyObject *self, PyObject *args) {
    PyObject *ao, *bo, *dob, *yo, *to;
    unsigned long long hi, layer0;
    int w;
    if (!PyArg_ParseTuple(args, "OOOKKiOO", &ao, &bo, &dob, &hi, &layer0, &w, &yo, &to))
        return NULL;
    if (w < 2 || w > 64) {
        PyErr_SetString(PyExc_ValueError, "width must be in [2, 64]");
        return NULL;
    }
    block d;
    if (get_delta(dob, &d)) return NULL;
    buf_t a = {0}, b = {0}, y = {0}, t = {0};
    PyObject *ret = NULL;
    if (get_buf(ao, &a, 0, "a") || get_blocks(bo, &b, 0, "b0") || get_blocks(yo, &y, 1, "out") ||
        get_blocks(to, &t, 1, "tables"))
        goto done;
    size_t n = (size_t)y.view.len / 16;
    if (need(&a, (Py_ssize_t)((size_t)w * n), "a") || check_blocks(&b, (size_t)w * n, "b0") ||
        check_blocks(&y, n, "out") || check_blocks(&t, (size_t)(2 * w - 3) * n, "tables"))
        goto done;
    sign_ctx x = {a.p, b.p, NULL, y.p, t.p, d, hi, layer0, n, w, 0};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, GROUP, MIN_PARALLEL_LANES, garble_sign_range, &x);
    Py_END_ALLOW_THREADS
    if (x.failed) { PyErr_NoMemory(); goto done; }
    ret = Py_NewRef(Py_None);
done:
    release(&a); release(&b); release(&y); release(&t);
    return ret;
}

static PyObject *py_eval_sign(PyObject *self, PyObject *args) {
    PyObject *bo, *to, *yo;
    unsigned long long hi, layer0;
    int w;
    if (!PyArg_ParseTuple(args, "OOKKiO", &bo, &to, &hi, &layer0, &w, &yo)) return NULL;
    if (w < 2 || w > 64) {
        PyErr_SetString(PyExc_ValueError, "width must be in [2, 64]");
        return NULL;
    }
    buf_t b = {0}, t = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_blocks(bo, &b, 0, "b") || get_blocks(to, &t, 0, "tables") ||
        get_blocks(yo, &y, 1, "out"))
        goto done;
    size_t n = (size_t)y.view.len / 16;
    if (check_blocks(&b, (size_t)w * n, "b") ||
        check_blocks(&t, (size_t)(2 * w - 3) * n, "tables"))
        goto done;
    sign_ctx x = {NULL, b.p, t.p, y.p, NULL, _mm_setzero_si128(),
                  hi, layer0, n, w, 0};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, GROUP, MIN_PARALLEL_LANES, eval_sign_range, &x);
    Py_END_ALLOW_THREADS
    if (x.failed) { PyErr_NoMemory(); goto done; }
    ret = Py_NewRef(Py_None);
done:
    release(&b); release(&t); release(&y);
    return ret;
}

/* ------------------------------------------------------------------ transpose
 *
 * transpose128(rows, out): rows is a 128 × nb uint8 matrix (rows may be
 * strided); out receives 8·nb blocks with bit i of block j = bit j of row i
 * (bit j of a row at byte j/8, bit j%8).
 */
typedef struct {
    const uint8_t *R;
    uint16_t *O; /* block j = 8 uint16 words, word g = rows 16g..16g+15 */
    Py_ssize_t stride;
} tr_ctx;

/* One byte column c of rows 16g..16g+15 gathered byte by byte (the tail of a
 * matrix narrower than a tile), its 8 bits peeled with movemask. */
static void transpose_column(const tr_ctx *x, size_t c) {
    Py_ssize_t stride = x->stride;
    for (int g = 0; g < 8; g++) {
        const uint8_t *p = x->R + (size_t)(16 * g) * stride + c;
        block v = _mm_set_epi8(
            (char)p[15 * stride], (char)p[14 * stride], (char)p[13 * stride],
            (char)p[12 * stride], (char)p[11 * stride], (char)p[10 * stride],
            (char)p[9 * stride], (char)p[8 * stride], (char)p[7 * stride],
            (char)p[6 * stride], (char)p[5 * stride], (char)p[4 * stride],
            (char)p[3 * stride], (char)p[2 * stride], (char)p[1 * stride], (char)p[0]);
        for (int bit = 7; bit >= 0; bit--) {
            x->O[(size_t)(8 * c + bit) * 8 + g] = (uint16_t)_mm_movemask_epi8(v);
            v = _mm_slli_epi64(v, 1);
        }
    }
}

/* Transposes a 16 × 16 byte matrix in place (row i of the input in a[i]; row j
 * of the result, i.e. input column j, in a[j]): four rounds of the perfect
 * shuffle, each interleaving row i with row i + 8. */
#define TR16_ROUNDS(T, LO, HI)                                                    \
    for (int round_ = 0; round_ < 4; round_++) {                                  \
        T b_[16];                                                                 \
        for (int i_ = 0; i_ < 8; i_++) {                                          \
            b_[2 * i_] = LO(a[i_], a[i_ + 8]);                                    \
            b_[2 * i_ + 1] = HI(a[i_], a[i_ + 8]);                                \
        }                                                                         \
        for (int i_ = 0; i_ < 16; i_++) a[i_] = b_[i_];                           \
    }

/* Columns [c, c + 16) of rows 16g..16g+15: 16 row loads, a 16 × 16 byte
 * transpose in registers, then 8 movemasks per column (the same words as
 * transpose_column, from contiguous loads instead of 256 scattered bytes). */
static void transpose_tile16(const tr_ctx *x, size_t c) {
    Py_ssize_t stride = x->stride;
    for (int g = 0; g < 8; g++) {
        const uint8_t *p = x->R + (size_t)(16 * g) * stride + c;
        block a[16];
        for (int r = 0; r < 16; r++) a[r] = _mm_loadu_si128((const block *)(p + r * stride));
        TR16_ROUNDS(block, _mm_unpacklo_epi8, _mm_unpackhi_epi8)
        for (int j = 0; j < 16; j++) {
            block v = a[j];
            uint16_t *o = x->O + (size_t)(8 * (c + j)) * 8 + g;
            for (int bit = 7; bit >= 0; bit--) {
                o[8 * bit] = (uint16_t)_mm_movemask_epi8(v);
                v = _mm_slli_epi64(v, 1);
            }
        }
    }
}

#ifdef HAVE_VAES_TARGET
static int have_bw = 0;

/* transpose_tile16 on four tiles at once (columns [c, c + 64)): 512-bit
 * unpacks work per 128-bit lane, so lane L ends up holding column c + 16L + j. */
__attribute__((target("avx512f,avx512bw")))
static void transpose_tile64(const tr_ctx *x, size_t c) {
    Py_ssize_t stride = x->stride;
    for (int g = 0; g < 8; g++) {
        const uint8_t *p = x->R + (size_t)(16 * g) * stride + c;
        __m512i a[16];
        for (int r = 0; r < 16; r++) a[r] = _mm512_loadu_si512((const void *)(p + r * stride));
        TR16_ROUNDS(__m512i, _mm512_unpacklo_epi8, _mm512_unpackhi_epi8)
        for (int j = 0; j < 16; j++) {
            __m512i v = a[j];
            for (int bit = 7; bit >= 0; bit--) {
                uint64_t m = (uint64_t)_mm512_movepi8_mask(v);
                for (int lane = 0; lane < 4; lane++)
                    x->O[(size_t)(8 * (c + 16 * lane + j) + bit) * 8 + g] =
                        (uint16_t)(m >> (16 * lane));
                v = _mm512_add_epi8(v, v); /* each byte's next bit to its top */
            }
        }
    }
    _mm256_zeroupper();
}
#endif

static void transpose_range(void *arg, size_t c0, size_t c1) {
    tr_ctx *x = (tr_ctx *)arg;
    size_t c = c0;
#ifdef HAVE_VAES_TARGET
    if (use_vaes && have_bw)
        for (; c + 64 <= c1; c += 64) transpose_tile64(x, c);
#endif
    for (; c + 16 <= c1; c += 16) transpose_tile16(x, c);
    for (; c < c1; c++) transpose_column(x, c);
}

static PyObject *py_transpose128(PyObject *self, PyObject *args) {
    PyObject *ro, *oo;
    if (!PyArg_ParseTuple(args, "OO", &ro, &oo)) return NULL;
    Py_buffer r;
    /* rows: a 128 × nb byte matrix whose rows may be strided (a view of the PRG buffer) */
    if (PyObject_GetBuffer(ro, &r, PyBUF_STRIDED_RO) != 0) return NULL;
    buf_t o = {0};
    PyObject *ret = NULL;
    if (r.ndim != 2 || r.itemsize != 1 || r.shape[0] != 128 || r.strides[1] != 1 ||
        r.strides[0] < r.shape[1]) {
        PyErr_SetString(PyExc_ValueError, "rows: expected a 128 x m uint8 matrix, rows contiguous");
        goto done;
    }
    Py_ssize_t nb = r.shape[1], stride = r.strides[0];
    if (get_blocks(oo, &o, 1, "out") || need(&o, 128 * nb, "out")) goto done;
    tr_ctx x = {r.buf, o.p, stride};
    Py_BEGIN_ALLOW_THREADS
    /* threads only for very wide matrices (measured: no gain at one lane batch) */
    parallel_for((size_t)nb, 64, 1 << 16, transpose_range, &x);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&r);
    release(&o);
    return ret;
}

/* ------------------------------------------------------------------ IKNP row PRG
 *
 * expand_keys(keys: 16·m bytes) -> bytes: the m AES-128 key schedules (176 bytes each).
 * prg_rows(schedules, nonce, first, nblk, out, stride): for each row r < m,
 *   out[r·stride + 16j ...] = AES_{k_r}(nonce ‖ first + j) for j < nblk, the
 *   counter block big-endian (mpc/ot.py's _RowStream, which uses OpenSSL ECB).
 */
static PyObject *py_expand_keys(PyObject *self, PyObject *args) {
    Py_buffer k;
    if (!PyArg_ParseTuple(args, "y*", &k)) return NULL;
    if (k.len % 16) {
        PyBuffer_Release(&k);
        PyErr_SetString(PyExc_ValueError, "keys: a whole number of 16-byte keys");
        return NULL;
    }
    Py_ssize_t m = k.len / 16;
    PyObject *out = PyBytes_FromStringAndSize(NULL, m * 176);
    if (out) {
        block *rk = (block *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < m; i++) {
            block tmp[11];
            expand_key((const uint8_t *)k.buf + 16 * i, tmp);
            memcpy(rk + 11 * i, tmp, sizeof tmp);
        }
    }
    PyBuffer_Release(&k);
    return out;
}

typedef struct {
    const uint8_t *S;
    uint8_t *O;
    uint64_t nb, first;
    Py_ssize_t nblk, stride;
} prg_ctx;

static void prg_range(void *arg, size_t r0, size_t r1) {
    prg_ctx *x = (prg_ctx *)arg;
    block rk[11];
    uint64_t nb = x->nb, first = x->first;
    Py_ssize_t nblk = x->nblk;
    for (size_t r = r0; r < r1; r++) {
        memcpy(rk, x->S + 176 * r, sizeof rk);
        block *row = (block *)(x->O + (Py_ssize_t)r * x->stride);
        Py_ssize_t j = 0;
        for (; j + 4 <= nblk; j += 4) {
            block b[4];
            for (int q = 0; q < 4; q++)
                b[q] = _mm_xor_si128(
                    _mm_set_epi64x((long long)__builtin_bswap64(first + (uint64_t)(j + q)),
                                   (long long)nb),
                    rk[0]);
            for (int i = 1; i < 10; i++)
                for (int q = 0; q < 4; q++) b[q] = _mm_aesenc_si128(b[q], rk[i]);
            for (int q = 0; q < 4; q++)
                _mm_storeu_si128(row + j + q, _mm_aesenclast_si128(b[q], rk[10]));
        }
        for (; j < nblk; j++) {
            block b = _mm_xor_si128(
                _mm_set_epi64x((long long)__builtin_bswap64(first + (uint64_t)j), (long long)nb),
                rk[0]);
            for (int i = 1; i < 10; i++) b = _mm_aesenc_si128(b, rk[i]);
            _mm_storeu_si128(row + j, _mm_aesenclast_si128(b, rk[10]));
        }
    }
}

static PyObject *py_prg_rows(PyObject *self, PyObject *args) {
    PyObject *so, *oo;
    unsigned long long nonce, first;
    Py_ssize_t nblk, stride;
    if (!PyArg_ParseTuple(args, "OKKnOn", &so, &nonce, &first, &nblk, &oo, &stride)) return NULL;
    buf_t sch = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(so, &sch, 0, "schedules") || get_buf(oo, &o, 1, "out")) goto done;
    /* small operands first (16·nblk cannot overflow); the rows' span is checked below */
    if (sch.view.len % 176 || nblk < 0 || nblk > ((Py_ssize_t)1 << 32) || stride < 0 ||
        stride > ((Py_ssize_t)1 << 40) || stride < 16 * nblk) {
        PyErr_SetString(PyExc_ValueError, "bad PRG shape");
        goto done;
    }
    /* the span of the rows written, (m − 1)·stride + 16·nblk, checked for overflow */
    Py_ssize_t m = sch.view.len / 176, span = 0;
    if (m && (__builtin_mul_overflow(m - 1, stride, &span) ||
              __builtin_add_overflow(span, 16 * nblk, &span))) {
        PyErr_SetString(PyExc_ValueError, "bad PRG shape: the rows overflow the address space");
        goto done;
    }
    if (m && need(&o, span, "out")) goto done;
    prg_ctx x = {sch.p, o.p, __builtin_bswap64(nonce), first, nblk, stride};
    Py_BEGIN_ALLOW_THREADS
    /* one thread: measured no faster on two (memory-bound; a thread costs tens of µs) */
    prg_range(&x, 0, (size_t)m);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    release(&sch); release(&o);
    return ret;
}

/* ------------------------------------------------------------------ SoftSpoken OT
 *
 * ss_expand(schedules, k, skip0, nonce, first, nblk, v_out, v_stride, u_out, u_stride):
 *   the leaf streams of mpc/softspoken.py, fused with their sums.  The schedules
 *   are n = 128/k blocks of (2^k − skip0) leaf keys; leaf x of block i (x from
 *   skip0 on; a skipped leaf 0 counts as zero) streams G = AES_key(nonce ‖ first + j)
 *   for j < nblk (the IKNP row PRG's counter blocks).  Writes
 *   v_out[(i·k + b)·v_stride + 16j…] = ⊕_{x: bit b of x} G_{i,x}, and, unless
 *   u_out is None, u_out[i·u_stride + 16j…] = ⊕_x G_{i,x}.  The leaf index x is
 *   public (the garbler's leaves are relabelled), so its bits may pick rows.
 */
typedef struct {
    const uint8_t *S;
    uint8_t *V, *U;
    uint64_t nb;
    unsigned long long first;
    Py_ssize_t nblk, vs, us;
    int k, skip0;
} ss_ctx;

#define SS_TILE 64 /* counter blocks summed in L1 before they are stored */

/* g[q] = AES_rk(ctr[q]) for q < m (m a multiple of 4, ≤ SS_TILE). */
static void ss_ctr_128(const uint8_t *sched, const block *ctr, int m, block *g) {
    block rk[11];
    memcpy(rk, sched, sizeof rk);
    for (int j = 0; j < m; j += 4) {
        /* 4 in flight: with the 11 round keys, 15 of the 16 xmm registers */
        block b0 = _mm_xor_si128(ctr[j], rk[0]), b1 = _mm_xor_si128(ctr[j + 1], rk[0]);
        block b2 = _mm_xor_si128(ctr[j + 2], rk[0]), b3 = _mm_xor_si128(ctr[j + 3], rk[0]);
        for (int r = 1; r < 10; r++) {
            b0 = _mm_aesenc_si128(b0, rk[r]); b1 = _mm_aesenc_si128(b1, rk[r]);
            b2 = _mm_aesenc_si128(b2, rk[r]); b3 = _mm_aesenc_si128(b3, rk[r]);
        }
        g[j] = _mm_aesenclast_si128(b0, rk[10]); g[j + 1] = _mm_aesenclast_si128(b1, rk[10]);
        g[j + 2] = _mm_aesenclast_si128(b2, rk[10]); g[j + 3] = _mm_aesenclast_si128(b3, rk[10]);
    }
}

#ifdef HAVE_VAES_TARGET
__attribute__((target("avx512f,vaes")))
static void ss_ctr_vaes(const uint8_t *sched, const block *ctr, int m, block *g) {
    __m512i k[11];
    for (int r = 0; r < 11; r++)
        k[r] = _mm512_broadcast_i32x4(_mm_loadu_si128((const block *)(sched + 16 * r)));
    int j = 0;
    for (; j + 16 <= m; j += 16) {
        __m512i b0 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(ctr + j)), k[0]);
        __m512i b1 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(ctr + j + 4)), k[0]);
        __m512i b2 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(ctr + j + 8)), k[0]);
        __m512i b3 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(ctr + j + 12)), k[0]);
        for (int r = 1; r < 10; r++) {
            b0 = _mm512_aesenc_epi128(b0, k[r]); b1 = _mm512_aesenc_epi128(b1, k[r]);
            b2 = _mm512_aesenc_epi128(b2, k[r]); b3 = _mm512_aesenc_epi128(b3, k[r]);
        }
        _mm512_storeu_si512((void *)(g + j), _mm512_aesenclast_epi128(b0, k[10]));
        _mm512_storeu_si512((void *)(g + j + 4), _mm512_aesenclast_epi128(b1, k[10]));
        _mm512_storeu_si512((void *)(g + j + 8), _mm512_aesenclast_epi128(b2, k[10]));
        _mm512_storeu_si512((void *)(g + j + 12), _mm512_aesenclast_epi128(b3, k[10]));
    }
    for (; j < m; j += 4) {
        __m512i b = _mm512_xor_si512(_mm512_loadu_si512((const void *)(ctr + j)), k[0]);
        for (int r = 1; r < 10; r++) b = _mm512_aesenc_epi128(b, k[r]);
        _mm512_storeu_si512((void *)(g + j), _mm512_aesenclast_epi128(b, k[10]));
    }
    _mm256_zeroupper();
}

/* ss_tree_tile for a tile of at most 4 blocks, one 512-bit register per leaf:
 * the sums stay in registers and are stored once, where adding each leaf's
 * blocks into acc in memory (ss_add_vaes) made half of a short piece's time. */
__attribute__((target("avx512f,vaes")))
static void ss_tree_tile4_vaes(const uint8_t *keys, int k, int skip0, const block *ctr,
                               block (*acc)[SS_TILE]) {
    const __m512i c = _mm512_loadu_si512((const void *)ctr);
    __m512i a[8], all = _mm512_setzero_si512();
    for (int b = 0; b < 8; b++) a[b] = _mm512_setzero_si512();
    for (int leaf = skip0; leaf < 1 << k; leaf++) {
        const uint8_t *s = keys + 176 * (leaf - skip0);
        __m512i g = _mm512_xor_si512(c, _mm512_broadcast_i32x4(_mm_loadu_si128((const block *)s)));
        for (int r = 1; r < 10; r++)
            g = _mm512_aesenc_epi128(g, _mm512_broadcast_i32x4(_mm_loadu_si128((const block *)(s + 16 * r))));
        g = _mm512_aesenclast_epi128(g, _mm512_broadcast_i32x4(_mm_loadu_si128((const block *)(s + 160))));
        all = _mm512_xor_si512(all, g);
        for (int b = 0; b < 8; b++) /* public leaf index; bits ≥ k are never set */
            if ((leaf >> b) & 1) a[b] = _mm512_xor_si512(a[b], g);
    }
    for (int b = 0; b < k; b++) _mm512_storeu_si512((void *)acc[b], a[b]);
    _mm512_storeu_si512((void *)acc[8], all);
    _mm256_zeroupper();
}

/* ss_add_128 with 512-bit XORs (m a multiple of 4). */
__attribute__((target("avx512f")))
static void ss_add_vaes(block (*acc)[SS_TILE], const block *g, int m, int leaf, int k) {
    for (int b = 0; b < k; b++) {
        if (!((leaf >> b) & 1)) continue; /* public leaf index */
        for (int q = 0; q < m; q += 4)
            _mm512_storeu_si512((void *)(acc[b] + q),
                                _mm512_xor_si512(_mm512_loadu_si512((const void *)(acc[b] + q)),
                                                 _mm512_loadu_si512((const void *)(g + q))));
    }
    for (int q = 0; q < m; q += 4)
        _mm512_storeu_si512((void *)(acc[8] + q),
                            _mm512_xor_si512(_mm512_loadu_si512((const void *)(acc[8] + q)),
                                             _mm512_loadu_si512((const void *)(g + q))));
    _mm256_zeroupper();
}
#endif

/* acc[b] ^= g where bit b of the leaf index is set, acc[8] ^= g always. */
static void ss_add_128(block (*acc)[SS_TILE], const block *g, int m, int leaf, int k) {
    for (int b = 0; b < k; b++) {
        if (!((leaf >> b) & 1)) continue; /* public leaf index */
        for (int q = 0; q < m; q++) acc[b][q] = _mm_xor_si128(acc[b][q], g[q]);
    }
    for (int q = 0; q < m; q++) acc[8][q] = _mm_xor_si128(acc[8][q], g[q]);
}

/* One tile of m counter blocks from ctr0 through every leaf's PRG: acc[b] the
 * XOR of the leaves with bit b set, acc[8] of all of them (ss_expand, ss_labels);
 * only each row's first m blocks (rounded up to 4) are written. */
static void ss_tree_tile(const uint8_t *keys, int k, int skip0, uint64_t nonce_be,
                         uint64_t ctr0, int m, block (*acc)[SS_TILE]) {
    const int leaves = 1 << k;
    block ctr[SS_TILE], g[SS_TILE];
    void (*ctr_fn)(const uint8_t *, const block *, int, block *) = ss_ctr_128;
    void (*add_fn)(block (*)[SS_TILE], const block *, int, int, int) = ss_add_128;
#ifdef HAVE_VAES_TARGET
    if (use_vaes) {
        ctr_fn = ss_ctr_vaes;
        add_fn = ss_add_vaes;
    }
#endif
    int m4 = (m + 3) & ~3; /* a short tail computes (and drops) spare blocks */
    for (int q = 0; q < m4; q++)
        ctr[q] = _mm_set_epi64x((long long)__builtin_bswap64(ctr0 + (uint64_t)q),
                                (long long)nonce_be);
#ifdef HAVE_VAES_TARGET
    if (use_vaes && m4 == 4) {
        ss_tree_tile4_vaes(keys, k, skip0, ctr, acc);
        return;
    }
#endif
    for (int b = 0; b < 9; b++) memset(acc[b], 0, sizeof(block) * (size_t)m4); /* the tile's only */
    for (int leaf = skip0; leaf < leaves; leaf++) {
        ctr_fn(keys + 176 * (leaf - skip0), ctr, m4, g);
        add_fn(acc, g, m4, leaf, k);
    }
}

static void ss_range(void *arg, size_t i0, size_t i1) {
    ss_ctx *x = (ss_ctx *)arg;
    const int k = x->k, per = (1 << k) - x->skip0;
    const Py_ssize_t nblk = x->nblk;
    block acc[9][SS_TILE]; /* v[0..k−1], then u */
    for (size_t i = i0; i < i1; i++) {
        const uint8_t *keys = x->S + 176 * (Py_ssize_t)i * per;
        for (Py_ssize_t j0 = 0; j0 < nblk; j0 += SS_TILE) {
            int m = nblk - j0 < SS_TILE ? (int)(nblk - j0) : SS_TILE;
            ss_tree_tile(keys, k, x->skip0, x->nb, x->first + (uint64_t)j0, m, acc);
            for (int b = 0; b < k; b++)
                memcpy(x->V + ((Py_ssize_t)i * k + b) * x->vs + 16 * j0, acc[b], (size_t)(16 * m));
            if (x->U) memcpy(x->U + (Py_ssize_t)i * x->us + 16 * j0, acc[8], (size_t)(16 * m));
        }
    }
}

static PyObject *py_ss_expand(PyObject *self, PyObject *args) {
    PyObject *so, *vo, *uo;
    int k, skip0;
    unsigned long long nonce, first;
    Py_ssize_t nblk, vs, us;
    if (!PyArg_ParseTuple(args, "OipKKnOnOn", &so, &k, &skip0, &nonce, &first, &nblk, &vo, &vs,
                          &uo, &us))
        return NULL;
    buf_t sch = {0}, v = {0}, u = {0};
    PyObject *ret = NULL;
    if (k != 1 && k != 2 && k != 4 && k != 8) {
        PyErr_SetString(PyExc_ValueError, "SoftSpoken k must be 1, 2, 4 or 8");
        return NULL;
    }
    int n = 128 / k, per = (1 << k) - (skip0 ? 1 : 0);
    if (get_buf(so, &sch, 0, "schedules") || get_buf(vo, &v, 1, "v_out")) goto done;
    if (uo != Py_None && get_buf(uo, &u, 1, "u_out")) goto done;
    if (sch.view.len != (Py_ssize_t)176 * n * per || nblk < 0 || nblk > ((Py_ssize_t)1 << 32) ||
        vs < 16 * nblk || vs > ((Py_ssize_t)1 << 40) ||
        (uo != Py_None && (us < 16 * nblk || us > ((Py_ssize_t)1 << 40)))) {
        PyErr_SetString(PyExc_ValueError, "bad SoftSpoken expansion shape");
        goto done;
    }
    /* rows are at most 128 × 2^40 bytes apart: no overflow in 64 bits */
    if (nblk && need(&v, 127 * vs + 16 * nblk, "v_out")) goto done;
    if (nblk && uo != Py_None && need(&u, (Py_ssize_t)(n - 1) * us + 16 * nblk, "u_out")) goto done;
    ss_ctx x = {sch.p, v.p, uo != Py_None ? u.p : NULL, __builtin_bswap64(nonce), first,
                nblk, vs, us, k, skip0 ? 1 : 0};
    if (nblk) {
        Py_BEGIN_ALLOW_THREADS
        ss_range(&x, 0, (size_t)n);
        Py_END_ALLOW_THREADS
    }
    ret = Py_NewRef(Py_None);
done:
    release(&sch); release(&v);
    if (uo != Py_None) release(&u);
    return ret;
}

/* ------------------------------------------------------------------ SoftSpoken labels
 *
 * ss_labels(schedules, k, skip0, nonce, first, w, c, s, u_out, r, out): one
 * piece of w bytes (8w OTs) from counter block `first`, expanded, corrected
 * and transposed column tile by column tile, so that a tile's 128 rows are
 * still in cache when they are transposed (ss_expand + transpose128 write and
 * read back 128 rows of the whole piece).
 *   garbler (skip0 = 1): c = the piece of the evaluator's message (n rows of w
 *     bytes), s = the 128 choice bits Δ (16 bytes, bit j at byte j/8, bit j%8);
 *     row j = v_j ⊕ s_j·c_{j/k}; u_out, r None.
 *   evaluator (skip0 = 0): u_out = the message piece to fill (n rows of w
 *     bytes), r = the packed choice bits (w bytes): u_out_i = u_i ⊕ r; row j = v_j;
 *     c, s None.
 * out: 8w blocks, the transposed rows (block j = bit j of every row).  The same
 * bytes as ss_expand, the correction and transpose128.
 */
#define SSL_TILE_BLOCKS SS_TILE /* 1 KiB of every row per tile */


typedef struct {
    const uint8_t *S, *C, *s, *r;
    uint8_t *U;
    uint16_t *O;
    uint64_t nonce_be, first;
    Py_ssize_t w;
    int k, skip0;
} ssl_ctx;

typedef struct {
    const ssl_ctx *x;
    int failed;
} ssl_job;

/* Column tiles [t0, t1) of the piece (each thread its own rows and sums). */
static void ss_labels_range(void *arg, size_t t0, size_t t1) {
    ssl_job *job = (ssl_job *)arg;
    const ssl_ctx *x = job->x;
    const int k = x->k, n = 128 / k, per = (1 << k) - x->skip0;
    const Py_ssize_t w = x->w, tw = 16 * SSL_TILE_BLOCKS;
    uint8_t *rows = (uint8_t *)aligned_alloc(64, (size_t)(128 * tw));
    block(*acc)[SS_TILE] = (block(*)[SS_TILE])aligned_alloc(64, sizeof(block) * 9 * SS_TILE);
    if (!rows || !acc) {
        free(rows);
        free(acc);
        job->failed = 1;
        return;
    }
    for (size_t t = t0; t < t1; t++) {
        Py_ssize_t col0 = (Py_ssize_t)t * tw;
        Py_ssize_t tc = w - col0 < tw ? w - col0 : tw; /* bytes of this tile */
        int m = (int)((tc + 15) / 16);
        for (int i = 0; i < n; i++) {
            ss_tree_tile(x->S + 176 * (Py_ssize_t)i * per, k, x->skip0, x->nonce_be,
                         x->first + (uint64_t)(col0 / 16), m, acc);
            for (int b = 0; b < k; b++) {
                int j = i * k + b;
                uint8_t *row = rows + (Py_ssize_t)j * tw;
                memcpy(row, acc[b], (size_t)(16 * m));
                if (x->C && ((x->s[j >> 3] >> (j & 7)) & 1)) {
                    const uint8_t *c = x->C + (Py_ssize_t)i * w + col0;
                    for (Py_ssize_t q = 0; q < tc; q++) row[q] ^= c[q];
                }
            }
            if (x->U) {
                const uint8_t *u = (const uint8_t *)acc[8], *r = x->r + col0;
                uint8_t *dst = x->U + (Py_ssize_t)i * w + col0;
                for (Py_ssize_t q = 0; q < tc; q++) dst[q] = u[q] ^ r[q];
            }
        }
        tr_ctx tr = {rows, x->O + (size_t)(8 * col0) * 8, tw};
        transpose_range(&tr, 0, (size_t)tc);
    }
    free(rows);
    free(acc);
}

/* The tiles split over the core's threads (a whole chunk's message is made
 * before the garbler can start, so the evaluator uses both cores for it). */
static int ss_labels_run(const ssl_ctx *x) {
    const Py_ssize_t tw = 16 * SSL_TILE_BLOCKS;
    size_t tiles = (size_t)((x->w + tw - 1) / tw);
    ssl_job job = {x, 0};
    parallel_for(tiles, 1, 2, ss_labels_range, &job);
    return job.failed ? -1 : 0;
}

static PyObject *py_ss_labels(PyObject *self, PyObject *args) {
    PyObject *so, *co, *sbo, *uo, *ro, *oo;
    int k, skip0;
    unsigned long long nonce, first;
    Py_ssize_t w;
    if (!PyArg_ParseTuple(args, "OipKKnOOOOO", &so, &k, &skip0, &nonce, &first, &w, &co, &sbo,
                          &uo, &ro, &oo))
        return NULL;
    if (k != 1 && k != 2 && k != 4 && k != 8) {
        PyErr_SetString(PyExc_ValueError, "SoftSpoken k must be 1, 2, 4 or 8");
        return NULL;
    }
    int garbler = co != Py_None, n = 128 / k, per = (1 << k) - (skip0 ? 1 : 0);
    if (w <= 0 || w > ((Py_ssize_t)1 << 32) || garbler != (sbo != Py_None) ||
        garbler == (uo != Py_None) || (uo != Py_None) != (ro != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "bad SoftSpoken labels arguments");
        return NULL;
    }
    buf_t sch = {0}, c = {0}, sb = {0}, u = {0}, r = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(so, &sch, 0, "schedules") || get_blocks(oo, &o, 1, "out")) goto done;
    if (garbler && (get_buf(co, &c, 0, "c") || get_buf(sbo, &sb, 0, "s"))) goto done;
    if (!garbler && (get_buf(uo, &u, 1, "u_out") || get_buf(ro, &r, 0, "r"))) goto done;
    if (sch.view.len != (Py_ssize_t)176 * n * per) {
        PyErr_SetString(PyExc_ValueError, "bad SoftSpoken schedules");
        goto done;
    }
    if (need(&o, 128 * w, "out")) goto done;
    if (garbler && (need(&c, (Py_ssize_t)n * w, "c") || need(&sb, 16, "s"))) goto done;
    if (!garbler && (need(&u, (Py_ssize_t)n * w, "u_out") || need(&r, w, "r"))) goto done;
    ssl_ctx x = {sch.p, garbler ? c.p : NULL, garbler ? sb.p : NULL, garbler ? NULL : r.p,
                 garbler ? NULL : u.p, o.p, __builtin_bswap64(nonce), first, w, k,
                 skip0 ? 1 : 0};
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = ss_labels_run(&x);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    release(&sch); release(&o);
    if (garbler) { release(&c); release(&sb); }
    else { release(&u); release(&r); }
    return ret;
}

/* ------------------------------------------------------------------ Ferret GGM trees
 *
 * fr_ggm_send(seeds, depth, hi, leaves, sums): for each tree i, the GGM tree of
 * `depth` levels from seeds[i] (children H(x, (side, hi | level)) with the
 * tweakable hash, left child of node p at 2p): its leaves and, per level, the
 * XOR of the left and of the right children (mpc/ferret.py, `ggm_send`).
 * fr_ggm_recv(known, alphas, phi, depth, hi, leaves): the evaluator's trees
 * from the off-path level sums, every leaf but α_i, then leaf α_i set to
 * φ_i ⊕ (XOR of the others) (`ggm_receive` and the fill in `finish`).  The
 * path is followed with masks over every node, so α picks no address.
 * One level computes π(x) once for both children: the same bytes as H.
 */
static void fr_level(block *nodes, size_t w, uint64_t hi, block *p, block *c, block sums[2]) {
    memcpy(p, nodes, w * sizeof(block));
    aes_n(p, w);
    block t0 = _mm_set_epi64x((long long)hi, 0), t1 = _mm_set_epi64x((long long)hi, 1);
    for (size_t j = 0; j < w; j++) {
        c[2 * j] = _mm_xor_si128(p[j], t0);
        c[2 * j + 1] = _mm_xor_si128(p[j], t1);
    }
    aes_n(c, 2 * w);
    block s0 = _mm_setzero_si128(), s1 = _mm_setzero_si128();
    for (size_t j = 0; j < w; j++) {
        block l = _mm_xor_si128(c[2 * j], p[j]), r = _mm_xor_si128(c[2 * j + 1], p[j]);
        nodes[2 * j] = l;
        nodes[2 * j + 1] = r;
        s0 = _mm_xor_si128(s0, l);
        s1 = _mm_xor_si128(s1, r);
    }
    sums[0] = s0;
    sums[1] = s1;
}

typedef struct {
    int depth, recv;
    uint64_t hi;
    const block *seeds, *known, *phi;
    const unsigned char *alphas; /* int64 each, at any alignment: read with load_i64 */
    block *leaves, *sums;
    int failed;
} fr_ggm_ctx;

/* The int64 at p, which need not be 8-byte aligned (memcpy: one plain load). */
static inline int64_t load_i64(const unsigned char *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline block eq_mask(uint64_t a, uint64_t b) {
    return _mm_set1_epi64x(-(long long)(a == b));
}

static void fr_ggm_range(void *arg, size_t i0, size_t i1) {
    fr_ggm_ctx *x = (fr_ggm_ctx *)arg;
    size_t n = (size_t)1 << x->depth;
    block *p = (block *)aligned_alloc(64, ((n / 2 * sizeof(block) + 63) / 64) * 64 + 64);
    block *c = (block *)aligned_alloc(64, ((n * sizeof(block) + 63) / 64) * 64);
    if (!p || !c) {
        free(p); free(c);
        x->failed = 1;
        return;
    }
    for (size_t i = i0; i < i1; i++) {
        block *nodes = x->leaves + i * n;
        uint64_t path = 0, alpha = x->recv ? (uint64_t)load_i64(x->alphas + 8 * i) : 0;
        nodes[0] = x->recv ? _mm_setzero_si128() : _mm_loadu_si128(x->seeds + i);
        for (int level = 1; level <= x->depth; level++) {
            size_t w = (size_t)1 << (level - 1);
            block s[2];
            fr_level(nodes, w, x->hi | (uint64_t)level, p, c, s);
            if (!x->recv) {
                x->sums[(i * (size_t)x->depth + (size_t)(level - 1)) * 2] = s[0];
                x->sums[(i * (size_t)x->depth + (size_t)(level - 1)) * 2 + 1] = s[1];
                continue;
            }
            /* drop the unknown node's children from the nodes and the sums */
            for (size_t j = 0; j < 2 * w; j++) {
                block m = eq_mask(j >> 1, path);
                s[j & 1] = _mm_xor_si128(s[j & 1], _mm_and_si128(nodes[j], m));
                nodes[j] = _mm_andnot_si128(m, nodes[j]);
            }
            uint64_t a = (alpha >> (x->depth - level)) & 1;
            block ma = _mm_set1_epi64x(-(long long)a); /* off side is 0 when a = 1 */
            block s_off = _mm_or_si128(_mm_and_si128(ma, s[0]), _mm_andnot_si128(ma, s[1]));
            block val = _mm_xor_si128(_mm_loadu_si128(x->known + i * (size_t)x->depth + (size_t)(level - 1)), s_off);
            uint64_t off = 2 * path + (1 - a);
            for (size_t j = 0; j < 2 * w; j++)
                nodes[j] = _mm_xor_si128(nodes[j], _mm_and_si128(val, eq_mask(j, off)));
            path = 2 * path + a;
        }
        if (x->recv) {
            block acc = _mm_loadu_si128(x->phi + i);
            for (size_t j = 0; j < n; j++) acc = _mm_xor_si128(acc, nodes[j]);
            for (size_t j = 0; j < n; j++)
                nodes[j] = _mm_xor_si128(nodes[j], _mm_and_si128(acc, eq_mask(j, alpha)));
        }
    }
    free(p);
    free(c);
}

static PyObject *py_fr_ggm(PyObject *self, PyObject *args) {
    /* fr_ggm(recv, depth, hi, seeds_or_known, alphas_or_None, phi_or_None, leaves, sums_or_None) */
    int recv, depth;
    unsigned long long hi;
    PyObject *so, *ao, *po, *lo, *uo;
    if (!PyArg_ParseTuple(args, "piKOOOOO", &recv, &depth, &hi, &so, &ao, &po, &lo, &uo))
        return NULL;
    buf_t sb = {0}, ab = {0}, pb = {0}, lb = {0}, ub = {0};
    PyObject *ret = NULL;
    if (depth < 1 || depth > 24) {
        PyErr_SetString(PyExc_ValueError, "fr_ggm: depth in [1, 24]");
        return NULL;
    }
    if (get_buf(so, &sb, 0, recv ? "known" : "seeds") || get_buf(lo, &lb, 1, "leaves")) goto done;
    Py_ssize_t per = recv ? 16 * (Py_ssize_t)depth : 16;
    if (sb.view.len % per) {
        PyErr_SetString(PyExc_ValueError, "fr_ggm: seeds or sums of a whole number of trees");
        goto done;
    }
    Py_ssize_t trees = sb.view.len / per, leaf_bytes;
    /* trees * 16 * 2^depth bytes of leaves (trees <= len / 16: the other sizes cannot overflow) */
    if (__builtin_mul_overflow(trees, (Py_ssize_t)16 << depth, &leaf_bytes)) {
        PyErr_SetString(PyExc_ValueError, "fr_ggm: the leaves overflow the address space");
        goto done;
    }
    if (need(&lb, leaf_bytes, "leaves")) goto done;
    if (recv) {
        if (get_buf(ao, &ab, 0, "alphas") || get_buf(po, &pb, 0, "phi")) goto done;
        if (need(&ab, 8 * trees, "alphas") || need(&pb, 16 * trees, "phi")) goto done;
        for (Py_ssize_t i = 0; i < trees; i++) {
            int64_t a = load_i64((const unsigned char *)ab.p + 8 * i);
            if (a < 0 || a >= ((int64_t)1 << depth)) {
                PyErr_SetString(PyExc_ValueError, "fr_ggm: a noise position outside its bin");
                goto done;
            }
        }
    } else {
        if (get_buf(uo, &ub, 1, "sums") || need(&ub, trees * 32 * depth, "sums")) goto done;
    }
    fr_ggm_ctx x = {depth, recv, hi, (const block *)sb.p, (const block *)sb.p,
                    recv ? (const block *)pb.p : NULL, recv ? (const unsigned char *)ab.p : NULL,
                    (block *)lb.p, recv ? NULL : (block *)ub.p, 0};
    if (((uintptr_t)lb.p & 15) || (!recv && ((uintptr_t)ub.p & 15))) {
        PyErr_SetString(PyExc_ValueError, "fr_ggm: outputs must be 16-byte aligned");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    parallel_for((size_t)trees, 1, 4, fr_ggm_range, &x);
    Py_END_ALLOW_THREADS
    if (x.failed) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    release(&sb); release(&ab); release(&pb); release(&lb); release(&ub);
    return ret;
}

/* ------------------------------------------------------------------ Ferret LPN
 *
 * fr_lpn(schedule, first, count, mask, base, noise, out[, base_bits, noise_bits,
 * out_bits]): the local-linear expansion of a Ferret extension (mpc/ferret.py,
 * `lpn_indices` and `lpn_encode`).  Output i (first ≤ i < first + count, first
 * even) XORs base[j] for the 10 indices j read as little-endian 32-bit words
 * from bytes [40i, 40i + 40) of the AES-128-CTR stream under `schedule` (the
 * 128-bit counter big-endian from 0), each and-ed with `mask` = k − 1, into
 * noise[i]; with the bit arrays, the same for the receiver's choice bits.
 * The indices are public: the addresses they pick depend on no secret.
 */
#define FR_D 10
typedef struct {
    uint8_t sched[176];
    uint64_t first;
    uint32_t mask;
    const block *base, *noise;
    block *out;
    const uint8_t *bb, *nb;
    uint8_t *ob;
} fr_ctx;

/* 16 pairs of outputs per AES batch: 80 counter blocks, VAES or AES-NI. */
#define FR_PAIRS 16
static void fr_range(void *arg, size_t p0, size_t p1) {
    /* pairs of outputs [2·p0, 2·p1) counted from first: 80 bytes = 5 blocks each */
    fr_ctx *x = (fr_ctx *)arg;
    block ctr[5 * FR_PAIRS], ks[5 * FR_PAIRS];
    for (size_t p = p0; p < p1; p += FR_PAIRS) {
        size_t np = p1 - p < FR_PAIRS ? p1 - p : FR_PAIRS;
        uint64_t c0 = (x->first / 2 + p) * 5;
        for (int q = 0; q < 5 * FR_PAIRS; q++)
            ctr[q] = _mm_set_epi64x((long long)__builtin_bswap64(c0 + (uint64_t)q), 0);
#ifdef HAVE_VAES_TARGET
        if (use_vaes)
            ss_ctr_vaes(x->sched, ctr, 5 * FR_PAIRS, ks);
        else
#endif
            ss_ctr_128(x->sched, ctr, 5 * FR_PAIRS, ks);
        const uint32_t *idx = (const uint32_t *)ks;
        for (size_t h = 0; h < 2 * np; h++) {
            size_t i = 2 * p + h;
            const uint32_t *ix = idx + FR_D * h;
            block acc = _mm_loadu_si128(x->noise + i);
            for (int j = 0; j < FR_D; j++)
                acc = _mm_xor_si128(acc, _mm_loadu_si128(x->base + (ix[j] & x->mask)));
            _mm_storeu_si128(x->out + i, acc);
            if (x->ob) {
                uint8_t bit = x->nb[i];
                for (int j = 0; j < FR_D; j++) bit ^= x->bb[ix[j] & x->mask];
                x->ob[i] = bit;
            }
        }
    }
}

static PyObject *py_fr_lpn(PyObject *self, PyObject *args) {
    Py_buffer sch;
    unsigned long long first;
    Py_ssize_t count;
    unsigned int mask;
    PyObject *bo, *no, *oo, *bbo = Py_None, *nbo = Py_None, *obo = Py_None;
    if (!PyArg_ParseTuple(args, "y*KnIOOO|OOO", &sch, &first, &count, &mask, &bo, &no, &oo, &bbo,
                          &nbo, &obo))
        return NULL;
    buf_t base = {0}, noise = {0}, out = {0}, bb = {0}, nb = {0}, ob = {0};
    PyObject *ret = NULL;
    int bits = bbo != Py_None;
    if (sch.len != 176 || first % 2 || count < 0 || count % 2 || count > ((Py_ssize_t)1 << 40) ||
        first > ((unsigned long long)1 << 40) || (mask & (mask + 1u))) {
        PyErr_SetString(PyExc_ValueError, "fr_lpn: bad shape (even first and count, k a power of 2)");
        goto done;
    }
    if (get_buf(bo, &base, 0, "base") || get_buf(no, &noise, 0, "noise") ||
        get_buf(oo, &out, 1, "out"))
        goto done;
    if (need(&base, 16 * ((Py_ssize_t)mask + 1), "base") || need(&noise, 16 * count, "noise") ||
        need(&out, 16 * count, "out"))
        goto done;
    if (bits) {
        if (get_buf(bbo, &bb, 0, "base_bits") || get_buf(nbo, &nb, 0, "noise_bits") ||
            get_buf(obo, &ob, 1, "out_bits"))
            goto done;
        if (need(&bb, (Py_ssize_t)mask + 1, "base_bits") || need(&nb, count, "noise_bits") ||
            need(&ob, count, "out_bits"))
            goto done;
    }
    fr_ctx x;
    memcpy(x.sched, sch.buf, sizeof x.sched);
    x.first = first;
    x.mask = mask;
    x.base = (const block *)base.p;
    x.noise = (const block *)noise.p;
    x.out = (block *)out.p;
    x.bb = bits ? (const uint8_t *)bb.p : NULL;
    x.nb = bits ? (const uint8_t *)nb.p : NULL;
    x.ob = bits ? (uint8_t *)ob.p : NULL;
    Py_BEGIN_ALLOW_THREADS
    parallel_for((size_t)count / 2, FR_PAIRS, 4096, fr_range, &x);
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&sch);
    release(&base); release(&noise); release(&out);
    release(&bb); release(&nb); release(&ob);
    return ret;
}


/* ================================================================== three-halves
 *
 * Three-halves AND gates (Rosulek–Roy 2021; mpc/threehalves.py is the reference
 * and states the construction).  A label's halves are its two 64-bit words;
 * per gate the garbler hashes six labels (A, A ⊕ Δ, B, B ⊕ Δ, A ⊕ B, A ⊕ B ⊕ Δ
 * for the colour-0 labels A, B) under the tweaks (L·2^32 + 3k + h, hi),
 * h = 0, 0, 1, 1, 2, 2, and the evaluator three.  A layer of n gates writes
 * G_0 of every gate (n words), then G_1, then G_2, then the 5n control bits
 * (gate-major, little-endian), zero-padded to whole blocks.  Lanes are taken in
 * groups of 16, whose 80 control bits are exactly 10 bytes, so groups (and
 * threads) write disjoint bytes.
 *
 * th_tables(q, r): the garbler's Q and the evaluator's R lookups (16 × u64
 *   each, computed in Python from the construction's matrices).
 * th_garble_and(a0, b0, delta, tweak_hi, layer, rho u8[n], c0_out, tables_out)
 * th_eval_and(a, b, tables, tweak_hi, layer, c_out)
 * th_garble_sign(a u8 (w, n), b0, delta, tweak_hi, layer0, w, rho u8[(w−2)·n],
 *   yes0_out, tables_out) and th_eval_sign(b, tables, tweak_hi, layer0, w, yes_out):
 *   the fused carry chain, tables n + (w − 2)·th_layer_blocks(n) blocks.
 * The garbler's Q is an affine function of its secret colours and coins,
 * evaluated with masks (th_qx; no table indexed by a secret).
 */

static uint64_t th_q[16], th_r[16];

/* z = Q_{a,b,ρ}·(y_0..y_3 = A_L, A_R, B_L, B_R, Δ_L, Δ_R) for the garbler's masks
 * ma = −a, mb = −b, m0 = −ρ_0, m1 = −ρ_1, mab = −ab.  Q is affine in (a, b, ρ)
 * plus an ab term; this is the matrices `threehalves.garbler_matrix` solves for,
 * written out (th_tables checks them against Python's table at load). */
static inline void th_qx(uint64_t ma, uint64_t mb, uint64_t m0, uint64_t m1, uint64_t mab,
                         uint64_t y0, uint64_t y1, uint64_t y2, uint64_t y3, uint64_t dl,
                         uint64_t dh, uint64_t z[5]) {
    uint64_t y03 = y0 ^ y3, y12 = y1 ^ y2, dd = dl ^ dh;
    uint64_t mall = ma ^ mb ^ mab;
    z[0] = y2 ^ dl ^ (mall & dl) ^ (m0 & (y0 ^ y12)) ^ (m1 & y03);
    z[1] = y1 ^ dh ^ (mall & dh) ^ (m0 & y03) ^ (m1 & (y12 ^ y3));
    z[2] = y2 ^ dl ^ (ma & (y0 ^ y12 ^ dd)) ^ (mb & (y03 ^ dh)) ^ (m0 & dh) ^ (m1 & dd);
    z[3] = y1 ^ dh ^ (ma & (y03 ^ dl)) ^ (mb & (y12 ^ y3 ^ dd)) ^ (m0 & dd) ^ (m1 & dl);
    z[4] = (ma & (y12 ^ y3 ^ dh)) ^ (mb & (y0 ^ y12 ^ dl)) ^ (m0 & dl) ^ (m1 & dh);
}
static int th_ready = 0;

static inline size_t th_ctl_bytes(size_t n) { return (5 * n + 7) / 8; }
static inline size_t th_layer_blocks(size_t n) { return (24 * n + th_ctl_bytes(n) + 15) / 16; }

static inline block tweak3(uint64_t layer, uint64_t lane, uint64_t h, uint64_t hi) {
    return _mm_set_epi64x((long long)hi, (long long)((layer << 32) | (3 * lane + h)));
}

static inline uint64_t lo64(block x) { return (uint64_t)_mm_cvtsi128_si64(x); }
static inline uint64_t hi64(block x) { return (uint64_t)_mm_extract_epi64(x, 1); }

/* One group of g ≤ 16 gates at lane0 (a multiple of 16) of a layer of n gates
 * whose table starts at `tab` (bytes).  s: 18·GROUP scratch blocks.  The
 * per-gate linear algebra runs over arrays of the group's gates (one word per
 * gate), so the compiler vectorizes it. */
static void th_garble_group(const block *a0, const block *b0, block d, uint64_t hi,
                            uint64_t layer, uint64_t lane0, size_t g, const uint8_t *rho,
                            size_t n, uint8_t *tab, block *c0, block *s) {
    block *x = s, *t = s + 6 * GROUP, *p = s + 12 * GROUP;
    uint64_t X[4][GROUP], ta[GROUP], tb[GROUP], rr[GROUP];
    for (size_t j = 0; j < g; j++) {
        block as = _mm_xor_si128(a0[j], _mm_and_si128(mask_of(a0[j]), d));
        block bs = _mm_xor_si128(b0[j], _mm_and_si128(mask_of(b0[j]), d));
        block xs = _mm_xor_si128(as, bs);
        x[j] = as;
        x[g + j] = _mm_xor_si128(as, d);
        x[2 * g + j] = bs;
        x[3 * g + j] = _mm_xor_si128(bs, d);
        x[4 * g + j] = xs;
        x[5 * g + j] = _mm_xor_si128(xs, d);
        for (uint64_t h = 0; h < 3; h++)
            t[2 * h * g + j] = t[(2 * h + 1) * g + j] = tweak3(layer, lane0 + j, h, hi);
        X[0][j] = lo64(as); X[1][j] = hi64(as); X[2][j] = lo64(bs); X[3][j] = hi64(bs);
        ta[j] = (lo64(a0[j]) & 1) ^ 1;
        tb[j] = (lo64(b0[j]) & 1) ^ 1;
        rr[j] = rho[j] & 3;
    }
    tccr_n(x, t, x, p, 6 * g);
    const uint64_t dl = lo64(d), dh = hi64(d);
    uint64_t z[GROUP][5];
    for (size_t j = 0; j < g; j++) {
        uint64_t ma = 0 - ta[j], mb = 0 - tb[j];
        th_qx(ma, mb, 0 - (rr[j] >> 1), 0 - (rr[j] & 1), ma & mb, X[0][j], X[1][j], X[2][j],
              X[3][j], dl, dh, z[j]);
    }
    uint64_t *G = (uint64_t *)tab;
    uint8_t ctl[10] = {0};
    for (size_t j = 0; j < g; j++) {
        uint64_t w[6], m[6];
        for (int k = 0; k < 6; k++) {
            w[k] = lo64(x[(size_t)k * g + j]);
            m[k] = hi64(x[(size_t)k * g + j]) & 1;
        }
        c0[j] = _mm_set_epi64x((long long)(z[j][1] ^ w[2] ^ w[4]),
                               (long long)(z[j][0] ^ w[0] ^ w[4]));
        size_t k = lane0 + j;
        G[k] = z[j][2] ^ w[0] ^ w[1];
        G[n + k] = z[j][3] ^ w[2] ^ w[3];
        G[2 * n + k] = z[j][4] ^ w[4] ^ w[5];
        uint64_t r = rr[j];
        uint64_t bits = ((r >> 1) ^ m[0] ^ m[4]) | (((r & 1) ^ m[2] ^ m[4]) << 1) |
                        ((ta[j] ^ m[0] ^ m[1]) << 2) | ((tb[j] ^ m[2] ^ m[3]) << 3) |
                        ((ta[j] ^ tb[j] ^ m[4] ^ m[5]) << 4);
        size_t at = 5 * j;
        ctl[at / 8] |= (uint8_t)(bits << (at % 8));
        if (at % 8 > 3) ctl[at / 8 + 1] |= (uint8_t)(bits >> (8 - at % 8));
    }
    memcpy(tab + 24 * n + 10 * (lane0 / GROUP), ctl, (5 * g + 7) / 8);
}

static void th_eval_group(const block *a, const block *b, const uint8_t *tab, uint64_t hi,
                          uint64_t layer, uint64_t lane0, size_t g, size_t n, block *c, block *s) {
    block *x = s, *t = s + 3 * GROUP, *p = s + 6 * GROUP;
    for (size_t j = 0; j < g; j++) {
        x[j] = a[j];
        x[g + j] = b[j];
        x[2 * g + j] = _mm_xor_si128(a[j], b[j]);
        for (uint64_t h = 0; h < 3; h++) t[h * g + j] = tweak3(layer, lane0 + j, h, hi);
    }
    tccr_n(x, t, x, p, 3 * g);
    const uint64_t *G = (const uint64_t *)tab + lane0;
    /* The group's 5g control bits, g ≤ 16: at most 10 bytes. */
    uint8_t raw[16] = {0};
    memcpy(raw, tab + 24 * n + 10 * (lane0 / GROUP), (5 * g + 7) / 8);
    unsigned __int128 ctl = 0;
    for (int k = 9; k >= 0; k--) ctl = (ctl << 8) | raw[k];
    for (size_t j = 0; j < g; j++) {
        uint64_t z = (uint64_t)(ctl >> (5 * j)) & 31;
        uint64_t i = lo64(a[j]) & 1, jj = lo64(b[j]) & 1, ij = i ^ jj;
        uint64_t mA = hi64(x[j]) & 1, mB = hi64(x[g + j]) & 1, mX = hi64(x[2 * g + j]) & 1;
        uint64_t r0 = (z & 1) ^ (i & (z >> 2)) ^ (ij & (z >> 4)) ^ mA ^ mX;
        uint64_t r1 = ((z >> 1) & 1) ^ (jj & (z >> 3)) ^ (ij & (z >> 4)) ^ mB ^ mX;
        uint64_t rb = th_r[(i << 3) | (jj << 2) | ((r0 & 1) << 1) | (r1 & 1)];
        uint64_t al = lo64(a[j]), ah = hi64(a[j]), bl = lo64(b[j]), bh = hi64(b[j]);
        uint64_t l0 = ((0 - (rb & 1)) & al) ^ ((0 - ((rb >> 1) & 1)) & ah) ^
                      ((0 - ((rb >> 2) & 1)) & bl) ^ ((0 - ((rb >> 3) & 1)) & bh);
        uint64_t l1 = ((0 - ((rb >> 4) & 1)) & al) ^ ((0 - ((rb >> 5) & 1)) & ah) ^
                      ((0 - ((rb >> 6) & 1)) & bl) ^ ((0 - ((rb >> 7) & 1)) & bh);
        uint64_t hx = lo64(x[2 * g + j]);
        uint64_t g2 = (0 - ij) & G[2 * n + j];
        uint64_t cl = ((0 - i) & G[j]) ^ g2 ^ lo64(x[j]) ^ hx ^ l0;
        uint64_t cr = ((0 - jj) & G[n + j]) ^ g2 ^ lo64(x[g + j]) ^ hx ^ l1;
        c[j] = _mm_set_epi64x((long long)cr, (long long)cl);
    }
}

/* Zero the padding after a layer's control bits (the table buffer is reused). */
static void th_zero_pad(uint8_t *tab, size_t n) {
    size_t used = 24 * n + th_ctl_bytes(n);
    memset(tab + used, 0, 16 * th_layer_blocks(n) - used);
}

/* A table's padding must be zero: bits past the 5n control bits, and bytes after. */
static int th_check_pad(const uint8_t *tab, size_t n) {
    size_t used = 24 * n + th_ctl_bytes(n), end = 16 * th_layer_blocks(n);
    if ((5 * n) % 8 && (tab[used - 1] >> ((5 * n) % 8))) return -1;
    for (size_t k = used; k < end; k++)
        if (tab[k]) return -1;
    return 0;
}

static int th_check_ready(void) {
    if (!th_ready) {
        PyErr_SetString(PyExc_RuntimeError, "three-halves tables not set (th_tables)");
        return -1;
    }
    return 0;
}

static PyObject *py_th_tables(PyObject *self, PyObject *args) {
    Py_buffer q, r;
    if (!PyArg_ParseTuple(args, "y*y*", &q, &r)) return NULL;
    if (q.len != 128 || r.len != 128) {
        PyBuffer_Release(&q); PyBuffer_Release(&r);
        PyErr_SetString(PyExc_ValueError, "expected two tables of 16 u64");
        return NULL;
    }
    /* checked in locals: a refused pair leaves the tables in use as they were */
    uint64_t new_q[16], new_r[16];
    memcpy(new_q, q.buf, 128);
    memcpy(new_r, r.buf, 128);
    PyBuffer_Release(&q); PyBuffer_Release(&r);
    /* th_qx must be the Q of Python's table, column by column (case = 8a + 4b + 2ρ_0 + ρ_1). */
    for (uint64_t e = 0; e < 16; e++) {
        uint64_t a = e >> 3, b = (e >> 2) & 1, r0 = (e >> 1) & 1, r1 = e & 1, v = 0;
        for (int c = 0; c < 6; c++) {
            uint64_t u[6] = {0, 0, 0, 0, 0, 0}, z[5];
            u[c] = 1;
            th_qx(0 - a, 0 - b, 0 - r0, 0 - r1, 0 - (a & b), u[0], u[1], u[2], u[3], u[4], u[5], z);
            for (int row = 0; row < 5; row++) v |= (z[row] & 1) << (6 * row + c);
        }
        if (v != new_q[e]) {
            PyErr_SetString(PyExc_ValueError, "the core's three-halves Q differs from the table");
            return NULL;
        }
    }
    memcpy(th_q, new_q, sizeof th_q);
    memcpy(th_r, new_r, sizeof th_r);
    th_ready = 1;
    Py_RETURN_NONE;
}

static PyObject *py_th_garble_and(PyObject *self, PyObject *args) {
    PyObject *ao, *bo, *dob, *ro, *co, *to;
    unsigned long long hi, layer;
    if (!PyArg_ParseTuple(args, "OOOKKOOO", &ao, &bo, &dob, &hi, &layer, &ro, &co, &to)) return NULL;
    if (th_check_ready()) return NULL;
    block d;
    if (get_delta(dob, &d)) return NULL;
    buf_t a = {0}, b = {0}, rr = {0}, c = {0}, t = {0};
    PyObject *ret = NULL;
    if (get_blocks(ao, &a, 0, "a0") || get_blocks(bo, &b, 0, "b0") || get_buf(ro, &rr, 0, "rho") ||
        get_blocks(co, &c, 1, "out") || get_blocks(to, &t, 1, "tables"))
        goto done;
    size_t n = (size_t)a.view.len / 16;
    if (check_blocks(&b, n, "b0") || check_blocks(&c, n, "out") || need(&rr, (Py_ssize_t)n, "rho") ||
        check_blocks(&t, th_layer_blocks(n), "tables"))
        goto done;
    block *s = get_scratch(18 * GROUP);
    if (!s) { PyErr_NoMemory(); goto done; }
    uint8_t *T = t.p;
    th_zero_pad(T, n);
    for (size_t k = 0; k < n; k += GROUP) {
        size_t g = n - k < GROUP ? n - k : GROUP;
        th_garble_group((const block *)a.p + k, (const block *)b.p + k, d, hi, layer, k, g,
                        (const uint8_t *)rr.p + k, n, T, (block *)c.p + k, s);
    }
    ret = Py_NewRef(Py_None);
done:
    release(&a); release(&b); release(&rr); release(&c); release(&t);
    return ret;
}

static PyObject *py_th_eval_and(PyObject *self, PyObject *args) {
    PyObject *ao, *bo, *to, *co;
    unsigned long long hi, layer;
    if (!PyArg_ParseTuple(args, "OOOKKO", &ao, &bo, &to, &hi, &layer, &co)) return NULL;
    if (th_check_ready()) return NULL;
    buf_t a = {0}, b = {0}, c = {0}, t = {0};
    PyObject *ret = NULL;
    if (get_blocks(ao, &a, 0, "a") || get_blocks(bo, &b, 0, "b") ||
        get_blocks(to, &t, 0, "tables") || get_blocks(co, &c, 1, "out"))
        goto done;
    size_t n = (size_t)a.view.len / 16;
    if (check_blocks(&b, n, "b") || check_blocks(&c, n, "out") ||
        check_blocks(&t, th_layer_blocks(n), "tables"))
        goto done;
    const uint8_t *T = t.p;
    if (th_check_pad(T, n)) {
        PyErr_SetString(PyExc_ValueError, "three-halves table padding is not zero");
        goto done;
    }
    block *s = get_scratch(9 * GROUP);
    if (!s) { PyErr_NoMemory(); goto done; }
    for (size_t k = 0; k < n; k += GROUP) {
        size_t g = n - k < GROUP ? n - k : GROUP;
        th_eval_group((const block *)a.p + k, (const block *)b.p + k, T, hi, layer, k, g, n,
                      (block *)c.p + k, s);
    }
    ret = Py_NewRef(Py_None);
done:
    release(&a); release(&b); release(&c); release(&t);
    return ret;
}

typedef struct {
    const uint8_t *A, *rho; /* garbler only */
    const block *B;
    const uint8_t *T_in;
    block *Y;
    uint8_t *T;
    block d;
    uint64_t hi, layer0;
    size_t n;
    int w;
    int failed;
} th_sign_ctx;

static void th_garble_sign_range(void *arg, size_t k0, size_t k1) {
    th_sign_ctx *x = (th_sign_ctx *)arg;
    block *s = (block *)aligned_alloc(64, 22 * GROUP * sizeof(block));
    if (!s) { x->failed = 1; return; }
    const uint8_t *A = x->A;
    const block *B = x->B;
    block d = x->d;
    size_t n = x->n, lb = 16 * th_layer_blocks(n);
    int w = x->w;
    block *c = s + 18 * GROUP, *xx = s + 19 * GROUP, *yy = s + 20 * GROUP, *gg = s + 21 * GROUP;
    uint8_t bits[GROUP];
    for (size_t k = k0; k < k1; k += GROUP) {
        size_t g = k1 - k < GROUP ? k1 - k : GROUP;
        for (size_t j = 0; j < g; j++) bits[j] = (uint8_t)(A[k + j] & 1);
        garble_and_const_group(bits, B + k, d, x->hi, x->layer0, k, g, c, (block *)x->T + k, s);
        for (int i = 1; i < w - 1; i++) {
            const block *bi = B + (size_t)i * n + k;
            for (size_t j = 0; j < g; j++) {
                block am = _mm_set1_epi64x(-(int64_t)(A[(size_t)i * n + k + j] & 1));
                xx[j] = _mm_xor_si128(c[j], _mm_and_si128(am, d));
                yy[j] = _mm_xor_si128(bi[j], c[j]);
            }
            uint8_t *base = x->T + 16 * n + (size_t)(i - 1) * lb;
            th_garble_group(xx, yy, d, x->hi, x->layer0 + (uint64_t)i, k, g,
                            x->rho + (size_t)(i - 1) * n + k, n, base, gg, s);
            for (size_t j = 0; j < g; j++) c[j] = _mm_xor_si128(c[j], gg[j]);
        }
        const block *top = B + (size_t)(w - 1) * n + k;
        for (size_t j = 0; j < g; j++) {
            block am = _mm_set1_epi64x(-(int64_t)(A[(size_t)(w - 1) * n + k + j] & 1));
            block sign = _mm_xor_si128(_mm_xor_si128(top[j], c[j]), _mm_and_si128(am, d));
            x->Y[k + j] = _mm_xor_si128(sign, d); /* NOT: the garbler relabels */
        }
    }
    free(s);
}

static void th_eval_sign_range(void *arg, size_t k0, size_t k1) {
    th_sign_ctx *x = (th_sign_ctx *)arg;
    block *s = (block *)aligned_alloc(64, 12 * GROUP * sizeof(block));
    if (!s) { x->failed = 1; return; }
    const block *B = x->B;
    size_t n = x->n, lb = 16 * th_layer_blocks(n);
    int w = x->w;
    block *c = s + 9 * GROUP, *yy = s + 10 * GROUP, *gg = s + 11 * GROUP;
    for (size_t k = k0; k < k1; k += GROUP) {
        size_t g = k1 - k < GROUP ? k1 - k : GROUP;
        eval_and_const_group(B + k, (const block *)x->T_in + k, x->hi, x->layer0, k, g, c, s);
        for (int i = 1; i < w - 1; i++) {
            const block *bi = B + (size_t)i * n + k;
            for (size_t j = 0; j < g; j++) yy[j] = _mm_xor_si128(bi[j], c[j]);
            const uint8_t *base = x->T_in + 16 * n + (size_t)(i - 1) * lb;
            th_eval_group(c, yy, base, x->hi, x->layer0 + (uint64_t)i, k, g, n, gg, s);
            for (size_t j = 0; j < g; j++) c[j] = _mm_xor_si128(c[j], gg[j]);
        }
        const block *top = B + (size_t)(w - 1) * n + k;
        for (size_t j = 0; j < g; j++) x->Y[k + j] = _mm_xor_si128(top[j], c[j]);
    }
    free(s);
}

static PyObject *py_th_garble_sign(PyObject *self, PyObject *args) {
    PyObject *ao, *bo, *dob, *ro, *yo, *to;
    unsigned long long hi, layer0;
    int w;
    if (!PyArg_ParseTuple(args, "OOOKKiOOO", &ao, &bo, &dob, &hi, &layer0, &w, &ro, &yo, &to))
        return NULL;
    if (th_check_ready()) return NULL;
    if (w < 2 || w > 64) {
        PyErr_SetString(PyExc_ValueError, "width must be in [2, 64]");
        return NULL;
    }
    block d;
    if (get_delta(dob, &d)) return NULL;
    buf_t a = {0}, b = {0}, rr = {0}, y = {0}, t = {0};
    PyObject *ret = NULL;
    if (get_buf(ao, &a, 0, "a") || get_blocks(bo, &b, 0, "b0") || get_buf(ro, &rr, 0, "rho") ||
        get_blocks(yo, &y, 1, "out") || get_blocks(to, &t, 1, "tables"))
        goto done;
    size_t n = (size_t)y.view.len / 16;
    size_t lb = 16 * th_layer_blocks(n);
    if (need(&a, (Py_ssize_t)((size_t)w * n), "a") || check_blocks(&b, (size_t)w * n, "b0") ||
        need(&rr, (Py_ssize_t)((size_t)(w - 2) * n), "rho") || check_blocks(&y, n, "out") ||
        need(&t, (Py_ssize_t)(16 * n + (size_t)(w - 2) * lb), "tables"))
        goto done;
    for (int i = 1; i < w - 1; i++) th_zero_pad((uint8_t *)t.p + 16 * n + (size_t)(i - 1) * lb, n);
    th_sign_ctx x = {a.p, rr.p, b.p, NULL, y.p, t.p, d, hi, layer0, n, w, 0};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, GROUP, MIN_PARALLEL_LANES, th_garble_sign_range, &x);
    Py_END_ALLOW_THREADS
    if (x.failed) { PyErr_NoMemory(); goto done; }
    ret = Py_NewRef(Py_None);
done:
    release(&a); release(&b); release(&rr); release(&y); release(&t);
    return ret;
}

static PyObject *py_th_eval_sign(PyObject *self, PyObject *args) {
    PyObject *bo, *to, *yo;
    unsigned long long hi, layer0;
    int w;
    if (!PyArg_ParseTuple(args, "OOKKiO", &bo, &to, &hi, &layer0, &w, &yo)) return NULL;
    if (th_check_ready()) return NULL;
    if (w < 2 || w > 64) {
        PyErr_SetString(PyExc_ValueError, "width must be in [2, 64]");
        return NULL;
    }
    buf_t b = {0}, t = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_blocks(bo, &b, 0, "b") || get_blocks(to, &t, 0, "tables") ||
        get_blocks(yo, &y, 1, "out"))
        goto done;
    size_t n = (size_t)y.view.len / 16;
    size_t lb = 16 * th_layer_blocks(n);
    if (check_blocks(&b, (size_t)w * n, "b") ||
        need(&t, (Py_ssize_t)(16 * n + (size_t)(w - 2) * lb), "tables"))
        goto done;
    for (int i = 1; i < w - 1; i++)
        if (th_check_pad((const uint8_t *)t.p + 16 * n + (size_t)(i - 1) * lb, n)) {
            PyErr_SetString(PyExc_ValueError, "three-halves table padding is not zero");
            goto done;
        }
    th_sign_ctx x = {NULL, NULL, b.p, t.p, y.p, NULL, _mm_setzero_si128(), hi, layer0, n, w, 0};
    Py_BEGIN_ALLOW_THREADS
    parallel_for(n, GROUP, MIN_PARALLEL_LANES, th_eval_sign_range, &x);
    Py_END_ALLOW_THREADS
    if (x.failed) { PyErr_NoMemory(); goto done; }
    ret = Py_NewRef(Py_None);
done:
    release(&b); release(&t); release(&y);
    return ret;
}

static PyMethodDef th_methods[] = {
    {"th_tables", py_th_tables, METH_VARARGS, "Set the three-halves Q and R lookups."},
    {"th_garble_and", py_th_garble_and, METH_VARARGS, "One garbled AND layer (three halves)."},
    {"th_eval_and", py_th_eval_and, METH_VARARGS, "One evaluated AND layer (three halves)."},
    {"th_garble_sign", py_th_garble_sign, METH_VARARGS, "Fused carry chain, garbler (three halves)."},
    {"th_eval_sign", py_th_eval_sign, METH_VARARGS, "Fused carry chain, evaluator (three halves)."},
    {NULL, NULL, 0, NULL},
};
/* ============================================================== end three-halves */

/* ================================================================== prefix chain
 * The linear prefix OR p_0 = x_0, p_j = p_{j−1} ∨ x_j (mpc/chain.py): K − 1 OR
 * gates ¬(¬p_{j−1} ∧ ¬x_j) forming ONE AND layer (gate j − 1 in lane j − 1, its
 * tweaks and table slots those of the scheme's layer code), garbled gate after
 * gate since each needs the previous output.
 *
 * chain_garble(x0 (K blocks), delta, tweak_hi, layer, p0_out (K), tables_out 2(K−1))
 * chain_eval(x (K), tables, tweak_hi, layer, p_out (K))
 * th_chain_garble(x0, delta, tweak_hi, layer, rho u8[K−1], p0_out, tables_out)
 * th_chain_eval(x, tables, tweak_hi, layer, p_out); three-halves tables
 *   th_layer_blocks(K − 1) blocks.
 */

/* One three-halves gate in lane k of a layer of n gates (th_garble_group for a
 * single gate at any lane): output 0-label, G words and 5 control bits. */
static block th_chain_garble_gate(block a0, block b0, block d, uint64_t hi, uint64_t layer,
                                  uint64_t k, uint64_t rho, size_t n, uint8_t *tab, block *s) {
    block *x = s, *t = s + 6, *p = s + 12;
    block as = _mm_xor_si128(a0, _mm_and_si128(mask_of(a0), d));
    block bs = _mm_xor_si128(b0, _mm_and_si128(mask_of(b0), d));
    block xs = _mm_xor_si128(as, bs);
    x[0] = as; x[1] = _mm_xor_si128(as, d);
    x[2] = bs; x[3] = _mm_xor_si128(bs, d);
    x[4] = xs; x[5] = _mm_xor_si128(xs, d);
    for (uint64_t h = 0; h < 3; h++) t[2 * h] = t[2 * h + 1] = tweak3(layer, k, h, hi);
    tccr_n(x, t, x, p, 6);
    uint64_t ta = (lo64(a0) & 1) ^ 1, tb = (lo64(b0) & 1) ^ 1, ma = 0 - ta, mb = 0 - tb;
    uint64_t z[5], w[6], m[6];
    th_qx(ma, mb, 0 - (rho >> 1), 0 - (rho & 1), ma & mb, lo64(as), hi64(as), lo64(bs), hi64(bs),
          lo64(d), hi64(d), z);
    for (int c = 0; c < 6; c++) {
        w[c] = lo64(x[c]);
        m[c] = hi64(x[c]) & 1;
    }
    uint64_t *G = (uint64_t *)tab;
    G[k] = z[2] ^ w[0] ^ w[1];
    G[n + k] = z[3] ^ w[2] ^ w[3];
    G[2 * n + k] = z[4] ^ w[4] ^ w[5];
    uint64_t bits = ((rho >> 1) ^ m[0] ^ m[4]) | (((rho & 1) ^ m[2] ^ m[4]) << 1) |
                    ((ta ^ m[0] ^ m[1]) << 2) | ((tb ^ m[2] ^ m[3]) << 3) |
                    ((ta ^ tb ^ m[4] ^ m[5]) << 4);
    uint8_t *ctl = tab + 24 * n;
    size_t at = 5 * k;
    ctl[at / 8] |= (uint8_t)(bits << (at % 8));
    if (at % 8 > 3) ctl[at / 8 + 1] |= (uint8_t)(bits >> (8 - at % 8));
    return _mm_set_epi64x((long long)(z[1] ^ w[2] ^ w[4]), (long long)(z[0] ^ w[0] ^ w[4]));
}

static block th_chain_eval_gate(block a, block b, const uint8_t *tab, uint64_t hi, uint64_t layer,
                                uint64_t k, size_t n, block *s) {
    block *x = s, *t = s + 3, *p = s + 6;
    x[0] = a; x[1] = b; x[2] = _mm_xor_si128(a, b);
    for (uint64_t h = 0; h < 3; h++) t[h] = tweak3(layer, k, h, hi);
    tccr_n(x, t, x, p, 3);
    const uint64_t *G = (const uint64_t *)tab;
    const uint8_t *ctl = tab + 24 * n;
    size_t at = 5 * k;
    uint64_t pair = ctl[at / 8] | (at / 8 + 1 < th_ctl_bytes(n) ? (uint64_t)ctl[at / 8 + 1] << 8 : 0);
    uint64_t z = (pair >> (at % 8)) & 31;
    uint64_t i = lo64(a) & 1, jj = lo64(b) & 1, ij = i ^ jj;
    uint64_t mA = hi64(x[0]) & 1, mB = hi64(x[1]) & 1, mX = hi64(x[2]) & 1;
    uint64_t r0 = (z & 1) ^ (i & (z >> 2)) ^ (ij & (z >> 4)) ^ mA ^ mX;
    uint64_t r1 = ((z >> 1) & 1) ^ (jj & (z >> 3)) ^ (ij & (z >> 4)) ^ mB ^ mX;
    uint64_t rb = th_r[(i << 3) | (jj << 2) | ((r0 & 1) << 1) | (r1 & 1)];
    uint64_t al = lo64(a), ah = hi64(a), bl = lo64(b), bh = hi64(b);
    uint64_t l0 = ((0 - (rb & 1)) & al) ^ ((0 - ((rb >> 1) & 1)) & ah) ^
                  ((0 - ((rb >> 2) & 1)) & bl) ^ ((0 - ((rb >> 3) & 1)) & bh);
    uint64_t l1 = ((0 - ((rb >> 4) & 1)) & al) ^ ((0 - ((rb >> 5) & 1)) & ah) ^
                  ((0 - ((rb >> 6) & 1)) & bl) ^ ((0 - ((rb >> 7) & 1)) & bh);
    uint64_t hx = lo64(x[2]);
    uint64_t g2 = (0 - ij) & G[2 * n + k];
    uint64_t cl = ((0 - i) & G[k]) ^ g2 ^ lo64(x[0]) ^ hx ^ l0;
    uint64_t cr = ((0 - jj) & G[n + k]) ^ g2 ^ lo64(x[1]) ^ hx ^ l1;
    return _mm_set_epi64x((long long)cr, (long long)cl);
}

/* Shared argument handling: x (K blocks), p (K blocks), tables of `tab_blocks(K − 1)`. */
static PyObject *chain_run(PyObject *args, int garbler, int three) {
    PyObject *xo, *dob = NULL, *ro = NULL, *po, *to;
    unsigned long long hi, layer;
    int ok = garbler ? (three ? PyArg_ParseTuple(args, "OOKKOOO", &xo, &dob, &hi, &layer, &ro, &po, &to)
                              : PyArg_ParseTuple(args, "OOKKOO", &xo, &dob, &hi, &layer, &po, &to))
                     : PyArg_ParseTuple(args, "OOKKO", &xo, &to, &hi, &layer, &po);
    if (!ok) return NULL;
    if (three && th_check_ready()) return NULL;
    block d = _mm_setzero_si128();
    if (garbler && get_delta(dob, &d)) return NULL;
    buf_t x = {0}, p = {0}, t = {0}, rr = {0};
    PyObject *ret = NULL;
    if (get_blocks(xo, &x, 0, "x") || get_blocks(po, &p, 1, "out") ||
        get_blocks(to, &t, garbler, "tables") || (ro && get_buf(ro, &rr, 0, "rho")))
        goto done;
    size_t K = (size_t)x.view.len / 16;
    if (K < 1) { PyErr_SetString(PyExc_ValueError, "empty chain"); goto done; }
    size_t n = K - 1;
    if (check_blocks(&p, K, "out") ||
        check_blocks(&t, three ? th_layer_blocks(n) : 2 * n, "tables") ||
        (ro && need(&rr, (Py_ssize_t)n, "rho")))
        goto done;
    if (three && !garbler && th_check_pad(t.p, n)) {
        PyErr_SetString(PyExc_ValueError, "three-halves table padding is not zero");
        goto done;
    }
    block s[12 * GROUP]; /* the half-gates group helpers' scratch layout */
    const block *X = x.p;
    block *P = p.p;
    Py_BEGIN_ALLOW_THREADS
    if (three && garbler) { /* control bits are OR-ed in gate by gate */
        memset((uint8_t *)t.p + 24 * n, 0, th_ctl_bytes(n));
        th_zero_pad(t.p, n);
    }
    P[0] = X[0];
    for (size_t k = 0; k < n; k++) {
        block c;
        if (three && garbler) {
            c = th_chain_garble_gate(_mm_xor_si128(P[k], d), _mm_xor_si128(X[k + 1], d), d, hi,
                                     layer, k, ((const uint8_t *)rr.p)[k] & 3, n, t.p, s);
        } else if (three) {
            c = th_chain_eval_gate(P[k], X[k + 1], t.p, hi, layer, k, n, s);
        } else if (garbler) {
            block a0 = _mm_xor_si128(P[k], d), b0 = _mm_xor_si128(X[k + 1], d), *T = t.p;
            garble_and_group(&a0, &b0, d, hi, layer, k, 1, &c, T + k, T + n + k, s);
        } else {
            const block *T = t.p;
            eval_and_group(&P[k], &X[k + 1], T + k, T + n + k, hi, layer, k, 1, &c, s);
        }
        P[k + 1] = _mm_xor_si128(c, d); /* NOT: ⊕Δ on the garbler, nothing on the evaluator */
    }
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    release(&x); release(&p); release(&t);
    if (ro) release(&rr);
    return ret;
}

static PyObject *py_chain_garble(PyObject *self, PyObject *args) { return chain_run(args, 1, 0); }
static PyObject *py_chain_eval(PyObject *self, PyObject *args) { return chain_run(args, 0, 0); }
static PyObject *py_th_chain_garble(PyObject *self, PyObject *args) { return chain_run(args, 1, 1); }
static PyObject *py_th_chain_eval(PyObject *self, PyObject *args) { return chain_run(args, 0, 1); }

static PyMethodDef chain_methods[] = {
    {"chain_garble", py_chain_garble, METH_VARARGS, "Linear prefix OR, garbler (half gates)."},
    {"chain_eval", py_chain_eval, METH_VARARGS, "Linear prefix OR, evaluator (half gates)."},
    {"th_chain_garble", py_th_chain_garble, METH_VARARGS, "Linear prefix OR, garbler (three halves)."},
    {"th_chain_eval", py_th_chain_eval, METH_VARARGS, "Linear prefix OR, evaluator (three halves)."},
    {NULL, NULL, 0, NULL},
};
/* ============================================================== end prefix chain */

/* ------------------------------------------------------------------ module */

static PyObject *py_set_key(PyObject *self, PyObject *args) {
    Py_buffer k;
    if (!PyArg_ParseTuple(args, "y*", &k)) return NULL;
    if (k.len != 16) {
        PyBuffer_Release(&k);
        PyErr_SetString(PyExc_ValueError, "AES-128 key must be 16 bytes");
        return NULL;
    }
    expand_key((const uint8_t *)k.buf, round_keys);
    PyBuffer_Release(&k);
    Py_RETURN_NONE;
}

static PyObject *py_set_vaes(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    use_vaes = on && have_vaes;
    return PyBool_FromLong(use_vaes);
}

static PyObject *py_features(PyObject *self, PyObject *noargs) {
    return Py_BuildValue("{s:O,s:O}", "vaes", have_vaes ? Py_True : Py_False, "active_vaes",
                         use_vaes ? Py_True : Py_False);
}

/* ------------------------------------------------------------------ OT-based comparison
 *
 * The millionaires' leaves of mpc/millionaire.py for one lane batch, in one pass
 * per group of lanes (the same bytes as the numpy reference, tested):
 *
 * mill_garbler(q, delta, tweak_hi, lane0, blocks, x, gt, eq, table, t0, t1)
 *   q: planes × L blocks (plane-major); blocks: int32 (first, s, eq) per leaf;
 *   x: L uint64; gt, eq: nb × L uint8 (the garbler's shares);
 *   table: per leaf j, (1 + eq_j) × 2^s_j × L uint8 (entry-major), end to end;
 *   t0, t1: (planes − n) × L uint8, the two low bits of H(q) and H(q ⊕ Δ) of the
 *   triple planes.
 * mill_evaluator(t, tweak_hi, lane0, blocks, ybar, pads, t0)
 *   pads: nb × L uint64, the low word of entry ȳ_j's mask; t0: H(t) & 3.
 * Tweaks: (lane·planes + plane, hi) for the OT keys, (2^63 | (lane·nb + j)·2^8 | u,
 * hi) for the masks, lane = lane0 + the lane's index in the batch.
 */
#define MILL_GROUP 16
#define MILL_MAX_S 6

typedef struct {
    const block *q;
    block delta;
    uint64_t hi, lane0;
    size_t planes, nbits, nb, L;
    const int32_t *blk;
    const uint64_t *x;
    const uint8_t *gt, *eq;
    uint8_t *table, *t0, *t1;
    uint64_t *pads;
    int garbler;
    /* mill_garbler_slots: x and the shares are zero, and `table` is the slots'
     * masks, slot-major: M = Σ 2^s_j bytes per lane, entry u of leaf j at
     * row0_j + u holding its mask's gt bit (and eq bit, in bit 1). */
    int slot_major;
    size_t M;
    int failed;
} mill_job;

static void mill_range(void *ctx, size_t lo, size_t hi_lane) {
    mill_job *m = (mill_job *)ctx;
    size_t P = m->planes, G = MILL_GROUP, E_MAX = (size_t)1 << MILL_MAX_S;
    size_t keys = P * G, combs = E_MAX * G;
    size_t scr = keys > combs ? keys : combs;
    block *buf = (block *)aligned_alloc(64, sizeof(block) * (4 * keys + 3 * combs + scr) + 64);
    if (!buf) { m->failed = 1; return; }
    block *in = buf, *tw = in + keys, *k0 = tw + keys, *k1 = k0 + keys;
    block *comb = k1 + keys, *tw2 = comb + combs, *pad = tw2 + combs, *p = pad + combs;
    for (size_t g0 = lo; g0 < hi_lane; g0 += G) {
        size_t n = hi_lane - g0 < G ? hi_lane - g0 : G;
        for (size_t pl = 0; pl < P; pl++)
            for (size_t i = 0; i < n; i++) {
                uint64_t lane = m->lane0 + g0 + i;
                in[pl * n + i] = m->q[pl * m->L + g0 + i];
                tw[pl * n + i] = _mm_set_epi64x((long long)m->hi, (long long)(lane * P + pl));
            }
        tccr_n(in, tw, k0, p, P * n);
        if (m->garbler) {
            for (size_t j = 0; j < P * n; j++) in[j] = _mm_xor_si128(in[j], m->delta);
            tccr_n(in, tw, k1, p, P * n);
        }
        for (size_t pl = m->nbits; pl < P; pl++)
            for (size_t i = 0; i < n; i++) {
                size_t at = (pl - m->nbits) * m->L + g0 + i;
                m->t0[at] = (uint8_t)(_mm_cvtsi128_si64(k0[pl * n + i]) & 3);
                if (m->garbler) m->t1[at] = (uint8_t)(_mm_cvtsi128_si64(k1[pl * n + i]) & 3);
            }
        size_t off = 0;
        for (size_t j = 0; j < m->nb; j++) {
            size_t first = (size_t)m->blk[3 * j], s = (size_t)m->blk[3 * j + 1];
            int eqf = m->blk[3 * j + 2];
            size_t E = (size_t)1 << s;
            if (m->garbler) {
                for (size_t i = 0; i < n; i++) { /* entry-major: comb[u·n + i] */
                    comb[i] = k0[first * n + i];
                    comb[n + i] = k1[first * n + i];
                }
                for (size_t b = 1; b < s; b++) {
                    size_t w = (size_t)1 << b;
                    for (size_t u = 0; u < w; u++)
                        for (size_t i = 0; i < n; i++) {
                            block c = comb[u * n + i];
                            comb[(w + u) * n + i] = _mm_xor_si128(c, k1[(first + b) * n + i]);
                            comb[u * n + i] = _mm_xor_si128(c, k0[(first + b) * n + i]);
                        }
                }
                for (size_t u = 0; u < E; u++)
                    for (size_t i = 0; i < n; i++) {
                        uint64_t lane = m->lane0 + g0 + i;
                        uint64_t low = (1ULL << 63) | ((lane * m->nb + j) << 8) | u;
                        tw2[u * n + i] = _mm_set_epi64x((long long)m->hi, (long long)low);
                    }
                tccr_n(comb, tw2, pad, p, E * n);
                if (m->slot_major) {
                    uint8_t keep = eqf ? 3 : 1;
                    for (size_t i = 0; i < n; i++) {
                        uint8_t *row = m->table + (g0 + i) * m->M + off;
                        for (size_t u = 0; u < E; u++)
                            row[u] = (uint8_t)_mm_cvtsi128_si64(pad[u * n + i]) & keep;
                    }
                    off += E;
                    continue;
                }
                /* Entry-major rows: each entry's n lanes are n consecutive bytes. */
                const size_t L = m->L;
                uint8_t *const tab = m->table + off + g0;
                uint64_t xj[MILL_GROUP];
                uint8_t gs[MILL_GROUP], es[MILL_GROUP];
                for (size_t i = 0; i < n; i++) {
                    xj[i] = (m->x[g0 + i] >> first) & (E - 1);
                    gs[i] = m->gt[j * L + g0 + i];
                    es[i] = m->eq[j * L + g0 + i];
                }
                for (size_t u = 0; u < E; u++) {
                    uint8_t *row = tab + u * L, *erow = tab + (E + u) * L;
                    for (size_t i = 0; i < n; i++) {
                        uint64_t w = (uint64_t)_mm_cvtsi128_si64(pad[u * n + i]);
                        row[i] = (uint8_t)((w & 1) ^ (xj[i] > u) ^ gs[i]);
                        if (eqf) erow[i] = (uint8_t)(((w >> 1) & 1) ^ (xj[i] == u) ^ es[i]);
                    }
                }
                off += (size_t)(1 + eqf) * E * L;
            } else {
                for (size_t i = 0; i < n; i++) {
                    block c = k0[first * n + i];
                    for (size_t b = 1; b < s; b++) c = _mm_xor_si128(c, k0[(first + b) * n + i]);
                    comb[i] = c;
                    uint64_t lane = m->lane0 + g0 + i;
                    uint64_t v = (m->x[g0 + i] >> first) & (E - 1);
                    uint64_t low = (1ULL << 63) | ((lane * m->nb + j) << 8) | v;
                    tw2[i] = _mm_set_epi64x((long long)m->hi, (long long)low);
                }
                tccr_n(comb, tw2, pad, p, n);
                for (size_t i = 0; i < n; i++)
                    m->pads[j * m->L + g0 + i] = (uint64_t)_mm_cvtsi128_si64(pad[i]);
            }
        }
    }
    free(buf);
}

static int mill_blocks(buf_t *b, size_t *nb, size_t *nbits) {
    if (b->view.len % 12 || b->view.len == 0) {
        PyErr_SetString(PyExc_ValueError, "blocks: int32 triples (first, s, eq)");
        return -1;
    }
    const int32_t *v = (const int32_t *)b->p;
    *nb = (size_t)b->view.len / 12;
    *nbits = 0;
    for (size_t j = 0; j < *nb; j++) {
        if (v[3 * j + 1] < 1 || v[3 * j + 1] > MILL_MAX_S || v[3 * j] < 0 || v[3 * j] > 63) {
            PyErr_SetString(PyExc_ValueError, "blocks: a leaf of 1..6 bits within 64");
            return -1;
        }
        *nbits += (size_t)v[3 * j + 1];
    }
    return 0;
}

static PyObject *py_mill(PyObject *args, int garbler) {
    PyObject *qo, *bo, *xo, *go = NULL, *eo = NULL, *to = NULL, *t0o, *t1o = NULL, *po = NULL;
    PyObject *delta_o = NULL;
    unsigned long long hi, lane0;
    mill_job m = {0};
    buf_t q = {0}, d = {0}, bl = {0}, x = {0}, gt = {0}, eq = {0}, tab = {0}, t0 = {0},
          t1 = {0}, pads = {0};
    PyObject *ret = NULL;
    int slot_major = garbler == 2;
    if (slot_major) {
        /* (q, delta, tweak_hi, lane0, blocks, x, masks, t0, t1): x only gives L */
        if (!PyArg_ParseTuple(args, "OOKKOOOOO", &qo, &delta_o, &hi, &lane0, &bo, &xo, &to, &t0o,
                              &t1o))
            return NULL;
        garbler = 1;
    } else if (garbler) {
        if (!PyArg_ParseTuple(args, "OOKKOOOOOOO", &qo, &delta_o, &hi, &lane0, &bo, &xo, &go, &eo,
                              &to, &t0o, &t1o))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "OKKOOOO", &qo, &hi, &lane0, &bo, &xo, &po, &t0o)) {
        return NULL;
    }
    if (get_blocks(qo, &q, 0, "q") || get_buf(bo, &bl, 0, "blocks") || get_buf(xo, &x, 0, "x") ||
        get_buf(t0o, &t0, 1, "t0"))
        goto done;
    size_t nb, nbits;
    if (mill_blocks(&bl, &nb, &nbits)) goto done;
    size_t L = (size_t)x.view.len / 8;
    if (L == 0 || q.view.len % (Py_ssize_t)(16 * L)) {
        PyErr_SetString(PyExc_ValueError, "q: planes × lanes blocks");
        goto done;
    }
    size_t planes = (size_t)q.view.len / (16 * L);
    if (planes < nbits || need(&t0, (Py_ssize_t)((planes - nbits) * L), "t0")) goto done;
    m = (mill_job){.q = (const block *)q.p, .hi = hi, .lane0 = lane0, .planes = planes,
                   .nbits = nbits, .nb = nb, .L = L, .blk = (const int32_t *)bl.p,
                   .x = (const uint64_t *)x.p, .t0 = (uint8_t *)t0.p, .garbler = garbler};
    if (slot_major) {
        if (get_blocks(delta_o, &d, 0, "delta") || need(&d, 16, "delta") ||
            get_buf(to, &tab, 1, "masks") || get_buf(t1o, &t1, 1, "t1"))
            goto done;
        size_t M = 0;
        for (size_t j = 0; j < nb; j++) M += (size_t)1 << m.blk[3 * j + 1];
        if (need(&tab, (Py_ssize_t)(M * L), "masks") ||
            need(&t1, (Py_ssize_t)((planes - nbits) * L), "t1"))
            goto done;
        m.slot_major = 1;
        m.M = M;
        m.delta = *(const block *)d.p;
        m.table = (uint8_t *)tab.p;
        m.t1 = (uint8_t *)t1.p;
    } else if (garbler) {
        if (get_blocks(delta_o, &d, 0, "delta") || need(&d, 16, "delta") ||
            get_buf(go, &gt, 0, "gt") || get_buf(eo, &eq, 0, "eq") ||
            get_buf(to, &tab, 1, "table") || get_buf(t1o, &t1, 1, "t1"))
            goto done;
        size_t tb = 0;
        for (size_t j = 0; j < nb; j++)
            tb += (size_t)(1 + m.blk[3 * j + 2]) * ((size_t)1 << m.blk[3 * j + 1]) * L;
        if (need(&gt, (Py_ssize_t)(nb * L), "gt") || need(&eq, (Py_ssize_t)(nb * L), "eq") ||
            need(&tab, (Py_ssize_t)tb, "table") ||
            need(&t1, (Py_ssize_t)((planes - nbits) * L), "t1"))
            goto done;
        m.delta = *(const block *)d.p;
        m.gt = (const uint8_t *)gt.p;
        m.eq = (const uint8_t *)eq.p;
        m.table = (uint8_t *)tab.p;
        m.t1 = (uint8_t *)t1.p;
    } else {
        if (get_buf(po, &pads, 1, "pads") || need(&pads, (Py_ssize_t)(8 * nb * L), "pads"))
            goto done;
        m.pads = (uint64_t *)pads.p;
    }
    Py_BEGIN_ALLOW_THREADS
    parallel_for(L, MILL_GROUP, 1024, mill_range, &m);
    Py_END_ALLOW_THREADS
    if (m.failed) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    release(&q); release(&d); release(&bl); release(&x); release(&gt); release(&eq);
    release(&tab); release(&t0); release(&t1); release(&pads);
    return ret;
}

static PyObject *py_mill_garbler(PyObject *self, PyObject *args) { return py_mill(args, 1); }
static PyObject *py_mill_evaluator(PyObject *self, PyObject *args) { return py_mill(args, 0); }
static PyObject *py_mill_garbler_slots(PyObject *self, PyObject *args) { return py_mill(args, 2); }

/* mill_tables(m, d, x, gt, eq, blocks, out): the garbler's tables of one chunk on
 * precomputed slots.  m: L × M uint8, slot-major (the two mask bits of every entry
 * of every leaf block, blocks end to end); d, x: L uint64 (the evaluator's
 * d = ȳ ⊕ r, the garbler's x); gt, eq: nb × L uint8 (its fresh shares); out: per
 * leaf j, (1 + eq_j) × 2^s_j rows of L bits, entry u's row holding mask(u ⊕ d_j) ⊕
 * [x_j > u] ⊕ gt_j (and the eq half likewise), the rows end to end as one bit
 * string packed little-endian (bit i in byte i / 8, bit i % 8: numpy's
 * packbits(…, bitorder="little") of the rows' concatenation). */
static inline void or_bits(uint8_t *out, size_t pos, uint64_t w, size_t n) {
    /* OR the n low bits of w into out at bit position pos. */
    size_t at = pos >> 3, sh = pos & 7, bytes = (n + sh + 7) >> 3;
    unsigned __int128 v = (unsigned __int128)w << sh;
    for (size_t b = 0; b < bytes; b++) out[at + b] |= (uint8_t)(v >> (8 * b));
}

static inline uint32_t xor_permute(uint32_t v, uint32_t d, int s) {
    /* Bit u of the result is bit u ⊕ d of v (u < 2^s): a swap of the halves
     * of every 2^(b+1)-bit group for each set bit b of d. */
    static const uint32_t lo[5] = {0x55555555u, 0x33333333u, 0x0F0F0F0Fu, 0x00FF00FFu,
                                   0x0000FFFFu};
    for (int b = 0; b < s; b++) { /* branch-free: d is secret-dependent and random */
        uint32_t take = 0u - ((d >> b) & 1), w = ((v & lo[b]) << (1 << b)) | ((v >> (1 << b)) & lo[b]);
        v ^= (v ^ w) & take;
    }
    return v;
}

static void transpose64(uint64_t a[64]) {
    /* a[i] bit u becomes a[u] bit i (least significant bit first). */
    uint64_t m = 0x00000000FFFFFFFFull;
    for (int j = 32; j; j >>= 1, m ^= m << j)
        for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {
            uint64_t t = ((a[k] >> j) ^ a[k | j]) & m;
            a[k | j] ^= t;
            a[k] ^= t << j;
        }
}

typedef struct {
    const uint8_t *m, *gt, *eq;
    const uint64_t *d, *x;
    const int32_t *blk;
    size_t L, M;
    const size_t *off, *row0; /* per leaf: its table's first bit, its first mask column */
} tables_job;

/* Leaves [jlo, jhi) of mill_tables into `op` (zeroed), whose bit 0 is the
 * tables' bit `base`. */
static void tables_leaves(const tables_job *t, size_t jlo, size_t jhi, uint8_t *op, size_t base) {
    const size_t L = t->L, M = t->M;
    for (size_t j = jlo; j < jhi; j++) {
        size_t first = (size_t)t->blk[3 * j], E = (size_t)1 << t->blk[3 * j + 1];
        int s = t->blk[3 * j + 1], eqf = t->blk[3 * j + 2];
        size_t off = t->off[j] - base, row0 = t->row0[j];
        uint32_t all = E == 32 ? 0xFFFFFFFFu : (uint32_t)((1u << E) - 1);
        for (size_t l0 = 0; l0 < L; l0 += 64) {
            size_t n = L - l0 < 64 ? L - l0 : 64;
            /* Per lane, its entries' bits as masks over u, then turned into a
             * row of lane bits per entry. */
            uint64_t g[64] = {0}, e[64] = {0};
            for (size_t i = 0; i < n; i++) {
                const uint8_t *row = t->m + (l0 + i) * M + row0;
                uint32_t b0 = 0, b1 = 0;
                if (E >= 16) {
                    for (size_t q = 0; q < E; q += 16) {
                        __m128i v = _mm_loadu_si128((const __m128i *)(row + q));
                        b0 |= (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(v, 7)) << q;
                        b1 |= (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(v, 6)) << q;
                    }
                } else {
                    for (size_t u = 0; u < E; u++) {
                        b0 |= (uint32_t)(row[u] & 1) << u;
                        b1 |= (uint32_t)((row[u] >> 1) & 1) << u;
                    }
                }
                uint32_t dj = (uint32_t)((t->d[l0 + i] >> first) & (E - 1));
                uint32_t xj = (uint32_t)((t->x[l0 + i] >> first) & (E - 1));
                uint32_t below = xj ? (uint32_t)((1ull << xj) - 1) : 0; /* u < x_j */
                g[i] = (xor_permute(b0, dj, s) ^ below ^ (t->gt[j * L + l0 + i] ? all : 0)) & all;
                e[i] = (xor_permute(b1, dj, s) ^ (1u << xj) ^ (t->eq[j * L + l0 + i] ? all : 0)) & all;
            }
            transpose64(g);
            for (size_t u = 0; u < E; u++) or_bits(op, off + u * L + l0, g[u], n);
            if (eqf) {
                transpose64(e);
                for (size_t u = 0; u < E; u++) or_bits(op, off + (E + u) * L + l0, e[u], n);
            }
        }
    }
}

typedef struct {
    const tables_job *t;
    size_t jlo, jhi, base;
    uint8_t *out;
} tables_part;

static void *tables_part_run(void *arg) {
    tables_part *p = (tables_part *)arg;
    tables_leaves(p->t, p->jlo, p->jhi, p->out, p->base);
    return NULL;
}

static PyObject *py_mill_tables(PyObject *self, PyObject *args) {
    PyObject *mo, *dox, *xo, *go, *eo, *bo, *oo;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &mo, &dox, &xo, &go, &eo, &bo, &oo)) return NULL;
    buf_t m = {0}, d = {0}, x = {0}, gt = {0}, eq = {0}, bl = {0}, out = {0};
    PyObject *ret = NULL;
    if (get_buf(mo, &m, 0, "m") || get_buf(dox, &d, 0, "d") || get_buf(xo, &x, 0, "x") ||
        get_buf(go, &gt, 0, "gt") || get_buf(eo, &eq, 0, "eq") || get_buf(bo, &bl, 0, "blocks") ||
        get_buf(oo, &out, 1, "out"))
        goto done;
    size_t nb, nbits;
    if (mill_blocks(&bl, &nb, &nbits)) goto done;
    size_t L = (size_t)x.view.len / 8;
    const int32_t *blk = (const int32_t *)bl.p;
    size_t M = 0, tb = 0, offs[64], row0s[64];
    if (nb > 64) {
        PyErr_SetString(PyExc_ValueError, "blocks: at most 64 leaves");
        goto done;
    }
    for (size_t j = 0; j < nb; j++) {
        offs[j] = tb * L;
        row0s[j] = M;
        M += (size_t)1 << blk[3 * j + 1];
        tb += (size_t)(1 + blk[3 * j + 2]) << blk[3 * j + 1];
    }
    if (L == 0 || need(&d, (Py_ssize_t)(8 * L), "d") || need(&m, (Py_ssize_t)(L * M), "m") ||
        need(&gt, (Py_ssize_t)(nb * L), "gt") || need(&eq, (Py_ssize_t)(nb * L), "eq") ||
        need(&out, (Py_ssize_t)((tb * L + 7) / 8), "out"))
        goto done;
    tables_job t = {(const uint8_t *)m.p, (const uint8_t *)gt.p, (const uint8_t *)eq.p,
                    (const uint64_t *)d.p, (const uint64_t *)x.p, blk, L, M, offs, row0s};
    uint8_t *op = (uint8_t *)out.p;
    size_t bytes = (tb * L + 7) / 8;
    Py_BEGIN_ALLOW_THREADS
    memset(op, 0, bytes);
    /* Two threads for a large chunk: the later leaves (about half the bits) into
     * a buffer of their own from the byte holding their first bit, merged after
     * (that byte may hold the earlier leaves' last bits too). */
    size_t jm = nb;
    if (n_threads > 1 && L >= 2048 && nb >= 2)
        for (jm = 1; jm < nb - 1 && 2 * offs[jm] < tb * L; jm++) {}
    uint8_t *tmp = NULL;
    size_t base = jm < nb ? offs[jm] & ~(size_t)7 : 0;
    if (jm < nb) tmp = (uint8_t *)calloc(bytes - base / 8, 1);
    pthread_t th;
    tables_part late = {&t, jm, nb, base, tmp};
    int started = tmp != NULL && pthread_create(&th, NULL, tables_part_run, &late) == 0;
    tables_leaves(&t, 0, tmp != NULL ? jm : nb, op, 0);
    if (tmp != NULL) {
        if (started) pthread_join(th, NULL);
        else tables_part_run(&late);
        op[base / 8] |= tmp[0];
        memcpy(op + base / 8 + 1, tmp + 1, bytes - base / 8 - 1);
        free(tmp);
    }
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    release(&m); release(&d); release(&x); release(&gt); release(&eq); release(&bl); release(&out);
    return ret;
}

static PyMethodDef methods[] = {
    {"set_key", py_set_key, METH_VARARGS, "Set the fixed AES-128 key of π."},
    {"set_threads", py_set_threads, METH_VARARGS, "Threads for the carry chains and wide transposes."},
    {"set_vaes", py_set_vaes, METH_VARARGS, "Use the VAES path if the CPU has it; returns the state."},
    {"features", py_features, METH_NOARGS, "CPU features detected and in use."},
    {"tccr", py_tccr, METH_VARARGS, "tccr(x, tweaks, out): H(x_j, tweaks_j) into out."},
    {"garble_and", py_garble_and, METH_VARARGS, "One garbled AND layer (half gates)."},
    {"eval_and", py_eval_and, METH_VARARGS, "One evaluated AND layer."},
    {"garble_and_const", py_garble_and_const, METH_VARARGS, "Garbler-half AND layer."},
    {"eval_and_const", py_eval_and_const, METH_VARARGS, "Evaluated garbler-half AND layer."},
    {"garble_sign", py_garble_sign, METH_VARARGS, "Fused comparison carry chain, garbler."},
    {"eval_sign", py_eval_sign, METH_VARARGS, "Fused comparison carry chain, evaluator."},
    {"transpose128", py_transpose128, METH_VARARGS, "IKNP 128 x m bit transpose."},
    {"expand_keys", py_expand_keys, METH_VARARGS, "AES-128 key schedules of 16-byte keys."},
    {"prg_rows", py_prg_rows, METH_VARARGS, "AES-CTR rows of the IKNP PRG."},
    {"ss_expand", py_ss_expand, METH_VARARGS, "SoftSpoken leaf streams and their sums."},
    {"ss_labels", py_ss_labels, METH_VARARGS, "SoftSpoken labels of one piece, tile by tile."},
    {"fr_lpn", py_fr_lpn, METH_VARARGS, "Ferret LPN expansion (10 indices per output)."},
    {"fr_ggm", py_fr_ggm, METH_VARARGS, "Ferret GGM trees (garbler's, or the evaluator's punctured ones)."},
    {"mill_garbler", py_mill_garbler, METH_VARARGS, "OT-based comparison: the garbler's leaf tables and triple bits."},
    {"mill_garbler_slots", py_mill_garbler_slots, METH_VARARGS, "OT-based comparison: a fill's garbler masks, slot-major, and triple bits."},
    {"mill_tables", py_mill_tables, METH_VARARGS, "OT-based comparison: the garbler's tables on precomputed slots."},
    {"mill_evaluator", py_mill_evaluator, METH_VARARGS, "OT-based comparison: the evaluator's masks and triple bits."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_gc", "Native garbled-circuit core (AES-NI).", -1, methods,
};

PyMODINIT_FUNC PyInit__gc(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("aes") || !__builtin_cpu_supports("sse4.1")) {
        PyErr_SetString(PyExc_ImportError, "this CPU has no AES-NI");
        return NULL;
    }
#ifdef HAVE_VAES_TARGET
    have_vaes = __builtin_cpu_supports("vaes") && __builtin_cpu_supports("avx512f");
    have_bw = __builtin_cpu_supports("avx512bw");
#endif
    use_vaes = have_vaes;
    PyObject *m = PyModule_Create(&moduledef);
    if (m && PyModule_AddFunctions(m, th_methods) < 0) Py_CLEAR(m);
    if (m && PyModule_AddFunctions(m, chain_methods) < 0) Py_CLEAR(m);
    return m;
}
