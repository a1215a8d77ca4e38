/*
 * svtagg.vdaf._sparse — the native expansion of a sparse one-hot report's DPF
 * key over its whole domain (vdaf/sparse.py is the reference and says what
 * each step is for; the tests compare both byte for byte).
 *
 * expand(tree_key, proof_key0, proof_key1, digest_key, agg_id, seed_cws,
 *        ctrl_cws, proof_cw, output_cw, key, negate, acc[, fold, weighted])
 *        -> digest ‖ total [‖ weight]
 *
 *   tree_key, proof_key{0,1}, digest_key: 16-byte AES keys (the report's);
 *   seed_cws: n × 16 bytes; ctrl_cws: 2n bytes of 0/1 (left, right per level);
 *   proof_cw, key: 16 bytes; output_cw: a Field128 element, 16 bytes LE;
 *   acc: d ≤ 2^n wide accumulators of three uint64 limbs (lo, hi, top: a
 *   192-bit integer each), to which this server's output share is added on
 *   [0, d) without reduction: y' = conv(s_x) + t_x·CW (< 2p), or 2p − y' for
 *   server 1 — the other way round when `negate` (taking a refused report
 *   out again).  The caller reduces mod p once per batch.
 *   Returns 40 bytes: the digest ⊕_x AES_digest_key(π̃_x ⊕ x) over the leaves
 *   x < d (the tree is expanded only where it meets [0, d)), then Σ_{x<d} y'
 *   as three uint64 limbs (not negated: the caller reduces and signs it).
 *   fold = 0 leaves acc untouched (a key checked, not counted); weighted = 1
 *   appends Σ_{x<d} x·y' in three limbs (64 bytes in all): a valid key's
 *   index, which a sparse multi-hot report's gap checks take.  cw2 (16
 *   bytes, or empty for none): a second payload on the same leaves, output
 *   conv(s ⊕ WEIGHT) + t·cw2, evaluated in the same pass; it, not the first,
 *   is folded, and Σ_{x<d} of it is appended in three limbs (88 bytes).
 *
 * gen(tree_key, proof_key0, proof_key1, n, alpha, rand, weight[, weight2])
 *   -> the public share; with weight2, a second payload's output correction
 *   (tweak WEIGHT) appended, 16 more bytes.
 *
 * H(x ⊕ tweak) = AES(σ) ⊕ σ with σ = (x.hi, x.hi ⊕ x.lo ⊕ tweak) on the two
 * 64-bit words of a block.  The tree is expanded level by level in place
 * (children 2j, 2j+1 of node j), every AES call of a level in one batch.
 * Runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../mpc/_aesni.h"

enum { LEFT = 1, RIGHT = 2, CONVERT = 3, WEIGHT = 4, PROOF = 5, MAX_BITS = 24 };

static inline block sigma(block x, uint64_t tweak) {
    /* (lo, hi) ↦ (hi, hi ⊕ lo ⊕ tweak), in the vector unit */
    block hh = _mm_unpackhi_epi64(x, x);
    block lo_up = _mm_slli_si128(x, 8);
    return _mm_xor_si128(_mm_xor_si128(hh, lo_up), _mm_set_epi64x((long long)tweak, 0));
}

/* out[i] = H(x_i ⊕ tweak_i) = AES(σ_i) ⊕ σ_i with σ computed in registers,
 * 8 blocks in flight: x_i = in[idx ? idx[i] : i >> shift], tweak_i =
 * (shift ? (i & 1 ? RIGHT : LEFT) : tweak).  One pass, no scratch copies. */
static inline void sigma_mmo(const block *rk, const block *in, const size_t *idx, int shift,
                             uint64_t tweak, block *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        block sg[8], b[8];
        for (int j = 0; j < 8; j++) {
            size_t at = i + (size_t)j;
            block x = in[idx ? idx[at] : at >> shift];
            sg[j] = sigma(x, shift ? ((at & 1) ? RIGHT : LEFT) : tweak);
            b[j] = _mm_xor_si128(sg[j], rk[0]);
        }
        for (int r = 1; r < 10; r++) {
            block k = rk[r];
            for (int j = 0; j < 8; j++) b[j] = _mm_aesenc_si128(b[j], k);
        }
        for (int j = 0; j < 8; j++)
            out[i + j] = _mm_xor_si128(_mm_aesenclast_si128(b[j], rk[10]), sg[j]);
    }
    for (; i < n; i++) {
        block x = in[idx ? idx[i] : i >> shift];
        block sg = sigma(x, shift ? ((i & 1) ? RIGHT : LEFT) : tweak);
        block b = _mm_xor_si128(sg, rk[0]);
        for (int r = 1; r < 10; r++) b = _mm_aesenc_si128(b, rk[r]);
        out[i] = _mm_xor_si128(_mm_aesenclast_si128(b, rk[10]), sg);
    }
}

/* Field128: p = 2^128 − 7·2^66 + 1. */
typedef unsigned __int128 u128;
static const u128 P128 = (((u128)0xffffffffffffffe4ULL) << 64) | 1ULL;

static inline u128 f_add(u128 a, u128 b) { /* branch-free: the operands are random */
    unsigned long long slo, shi, rlo, rhi;
    unsigned char c = _addcarry_u64(0, (uint64_t)a, (uint64_t)b, &slo);
    c = _addcarry_u64(c, (uint64_t)(a >> 64), (uint64_t)(b >> 64), &shi);
    unsigned char br = _subborrow_u64(0, slo, 1, &rlo);
    br = _subborrow_u64(br, shi, 0xffffffffffffffe4ULL, &rhi);
    uint64_t m = 0 - (uint64_t)(c | !br); /* a carry out, or s ≥ p: take s − p */
    return ((u128)((rhi & m) | (shi & ~m)) << 64) | ((rlo & m) | (slo & ~m));
}
static inline u128 f_neg(u128 a) { return (P128 - a) & ((u128)0 - (u128)(a != 0)); }
static inline u128 load128(const uint8_t *p) {
    uint64_t lo, hi;
    memcpy(&lo, p, 8);
    memcpy(&hi, p + 8, 8);
    return ((u128)hi << 64) | lo;
}
static inline void store128(uint8_t *p, u128 v) {
    uint64_t lo = (uint64_t)v, hi = (uint64_t)(v >> 64);
    memcpy(p, &lo, 8);
    memcpy(p + 8, &hi, 8);
}

#define TILE 32 /* parents per batch: 64 children, 64 AES blocks in flight */

/* The children of m parents (seed, t): seeds and bits into kid / kt (2m
 * entries, children 2j, 2j + 1 of parent j), the level's corrections applied
 * where the parent's bit is 1.  Both the full-domain expansion (a tile of
 * parents at a time) and the crawl (a step's nodes) take children here. */
static inline void children(const block *rk, const block *seed, const uint8_t *t, size_t m,
                            block cw, uint8_t cl, uint8_t cr, block *kid, uint8_t *kt) {
    sigma_mmo(rk, seed, NULL, 1, 0, kid, 2 * m);
    const block notone = _mm_set_epi64x(-1, ~(long long)1);
    for (size_t c = 0; c < 2 * m; c++) {
        uint8_t pt = t[c >> 1];
        block h = kid[c];
        uint8_t bit = (uint8_t)(_mm_cvtsi128_si64(h) & 1);
        block mask = _mm_set1_epi8((char)(0 - pt));
        kid[c] = _mm_xor_si128(_mm_and_si128(h, notone), _mm_and_si128(cw, mask));
        kt[c] = bit ^ (pt & ((c & 1) ? cr : cl));
    }
}

typedef struct {
    const block *rk, *rk0, *rk1, *rkd;
    block proof_cw;
    size_t d;
    u128 out_cw;
    int flip;       /* negate the output share: server 1, xor `negate` */
    uint64_t *acc;  /* d × 3 limbs */
    uint64_t total[3];
    block digest;
    int fold;          /* add the outputs into acc (0: check only) */
    int weighted;      /* also sum x·y'_x into weight */
    uint64_t weight[3];
    int second;        /* a second payload (cw2): folded instead of the first */
    u128 cw2;
    uint64_t total2[3];
} leaf_ctx;

/* Outputs, proofs and the digest of leaves [x0, x0 + m).  Branch-free on
 * the control bits (random: a branch on them mispredicts half the time), and
 * on locals (the accumulator is bytes, which may alias the context). */
static inline void leaves_tile(leaf_ctx *L, const block *s, const uint8_t *t, size_t x0,
                               size_t m) {
    block buf[2 * TILE], b0[2 * TILE];
    const u128 out_cw = L->out_cw;
    const u128 two_p = P128 << 1; /* 2p mod 2^128 (2p = 2^128 + two_p) */
    const uint64_t flip = 0 - (uint64_t)L->flip;
    unsigned long long t0 = L->total[0], t1 = L->total[1], t2 = L->total[2];
    unsigned long long s0 = L->total2[0], s1 = L->total2[1], s2 = L->total2[2];
    const u128 cw2 = L->cw2;
    uint64_t *acc = L->acc + 3 * x0;
    block buf2[2 * TILE];
    sigma_mmo(L->rk, s, NULL, 0, CONVERT, buf, m);
    if (L->second) sigma_mmo(L->rk, s, NULL, 0, WEIGHT, buf2, m);
    for (size_t i = 0; i < m; i++) {
        uint8_t raw[16];
        _mm_storeu_si128((block *)raw, buf[i]);
        u128 y = load128(raw);
        if (y >= P128) y -= P128; /* probability 7·2^-62 */
        /* y' = y + t·CW < 2p: 129 bits, the top one in c */
        u128 add = out_cw & ((u128)0 - (u128)t[i]);
        u128 yp = y + add;
        uint64_t c = yp < y;
        unsigned char k = _addcarry_u64(0, t0, (uint64_t)yp, &t0);
        k = _addcarry_u64(k, t1, (uint64_t)(yp >> 64), &t1);
        _addcarry_u64(k, t2, c, &t2);
        /* the folded value: y', or the second payload's y'' (the same per call) */
        u128 yf = yp;
        uint64_t cf = c;
        if (L->second) {
            _mm_storeu_si128((block *)raw, buf2[i]);
            u128 z = load128(raw);
            if (z >= P128) z -= P128;
            u128 zp = z + (cw2 & ((u128)0 - (u128)t[i]));
            uint64_t cz = zp < z;
            k = _addcarry_u64(0, s0, (uint64_t)zp, &s0);
            k = _addcarry_u64(k, s1, (uint64_t)(zp >> 64), &s1);
            _addcarry_u64(k, s2, cz, &s2);
            yf = zp;
            cf = cz;
        }
        /* server 1 (or a take-out) adds 2p − y' instead: 2p = 2^128 + two_p,
         * and 0 < 2p − y' < 2^129 */
        u128 dlo = two_p - yf;
        uint64_t dtop = 1 - cf - (uint64_t)(two_p < yf);
        u128 fm = ((u128)flip << 64) | flip;
        u128 v = (fm & dlo) | (~fm & yf);
        uint64_t vtop = (flip & dtop) | (~flip & cf);
        if (L->fold) { /* the same for every leaf of a call: predicted */
            unsigned long long a0 = acc[3 * i], a1 = acc[3 * i + 1], a2 = acc[3 * i + 2];
            k = _addcarry_u64(0, a0, (uint64_t)v, &a0);
            k = _addcarry_u64(k, a1, (uint64_t)(v >> 64), &a1);
            _addcarry_u64(k, a2, vtop, &a2);
            acc[3 * i] = a0;
            acc[3 * i + 1] = a1;
            acc[3 * i + 2] = a2;
        }
        if (L->weighted) {
            /* x·y' = x·lo + x·hi·2^64 + x·c·2^128 with x < 2^24: below 2^153
             * a leaf, 2^177 over 2^24 leaves, within three limbs */
            uint64_t x = (uint64_t)(x0 + i);
            u128 plo = (u128)x * (uint64_t)yp, phi = (u128)x * (uint64_t)(yp >> 64);
            unsigned long long w0 = L->weight[0], w1 = L->weight[1], w2 = L->weight[2];
            k = _addcarry_u64(0, w0, (uint64_t)plo, &w0);
            k = _addcarry_u64(k, w1, (uint64_t)(plo >> 64), &w1);
            _addcarry_u64(k, w2, x * c, &w2);
            k = _addcarry_u64(0, w1, (uint64_t)phi, &w1);
            _addcarry_u64(k, w2, (uint64_t)(phi >> 64), &w2);
            L->weight[0] = w0;
            L->weight[1] = w1;
            L->weight[2] = w2;
        }
    }
    L->total[0] = t0;
    L->total[1] = t1;
    L->total[2] = t2;
    L->total2[0] = s0;
    L->total2[1] = s1;
    L->total2[2] = s2;
    /* leaf proofs: compacted by control bit (branch-free), each group hashed
     * under its bit's key, scattered back */
    size_t idx[2][2 * TILE], k0 = 0, k1 = 0;
    for (size_t i = 0; i < m; i++) {
        size_t b = t[i] & 1;
        idx[0][k0] = i;
        idx[1][k1] = i;
        k0 += 1 - b;
        k1 += b;
    }
    const block pcw = L->proof_cw;
    size_t kk[2] = {k0, k1};
    for (int bit = 0; bit < 2; bit++) {
        size_t n = kk[bit];
        sigma_mmo(bit ? L->rk1 : L->rk0, s, idx[bit], 0, PROOF, b0, n);
        block corr = bit ? pcw : _mm_setzero_si128();
        for (size_t q = 0; q < n; q++) {
            size_t i = idx[bit][q];
            block v = _mm_xor_si128(b0[q], corr);
            buf[i] = _mm_xor_si128(v, _mm_set_epi64x(0, (long long)(x0 + i)));
        }
    }
    aes_n_keyed(L->rkd, buf, m);
    block dg = L->digest;
    for (size_t i = 0; i < m; i++) dg = _mm_xor_si128(dg, buf[i]);
    L->digest = dg;
}

static PyObject *py_expand(PyObject *self, PyObject *args) {
    Py_buffer tk, pk0, pk1, dk, cws, ctrl, pcw, ocw, key, acc;
    const char *cw2 = NULL;
    Py_ssize_t cw2_len = 0;
    int agg_id, negate, fold = 1, weighted = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*y*iy*y*y*y*y*pw*|ppy#", &tk, &pk0, &pk1, &dk, &agg_id,
                          &cws, &ctrl, &pcw, &ocw, &key, &negate, &acc, &fold, &weighted, &cw2,
                          &cw2_len))
        return NULL;
    int second = cw2_len > 0;
    PyObject *result = NULL;
    Py_ssize_t n = cws.len / 16, d = acc.len / 24;
    if (tk.len != 16 || pk0.len != 16 || pk1.len != 16 || dk.len != 16 || pcw.len != 16 ||
        ocw.len != 16 || key.len != 16 || cws.len % 16 || n < 1 || n > MAX_BITS ||
        ctrl.len != 2 * n || acc.len % 24 || d < 1 || d > ((Py_ssize_t)1 << n) ||
        load128(ocw.buf) >= P128 ||
        (second && (cw2_len != 16 || load128((const uint8_t *)cw2) >= P128))) {
        PyErr_SetString(PyExc_ValueError, "sparse expand: arguments of the wrong sizes");
        goto done;
    }
    /* the tree's last inner level holds 2^(n-1) nodes */
    size_t inner = (size_t)1 << (n - 1);
    /* a per-thread scratch kept between calls: a fresh 2^(n-1)-node buffer
     * per report costs an mmap and its page faults */
    static _Thread_local block *seed_cache = NULL;
    static _Thread_local uint8_t *t_cache = NULL;
    static _Thread_local size_t cached = 0;
    if (cached < inner) {
        free(seed_cache);
        free(t_cache);
        seed_cache = aligned_alloc(64, inner * sizeof(block));
        t_cache = malloc(inner);
        cached = (seed_cache && t_cache) ? inner : 0;
        if (!cached) {
            free(seed_cache);
            free(t_cache);
            seed_cache = NULL;
            t_cache = NULL;
            PyErr_NoMemory();
            goto done;
        }
    }
    block *seed = seed_cache;
    uint8_t *t = t_cache;
    block rk[11], rk0[11], rk1[11], rkd[11];
    expand_key(tk.buf, rk);
    expand_key(pk0.buf, rk0);
    expand_key(pk1.buf, rk1);
    expand_key(dk.buf, rkd);
    const uint8_t *cb = ctrl.buf;
    leaf_ctx L = {rk, rk0, rk1, rkd, _mm_loadu_si128((const block *)pcw.buf), (size_t)d,
                  load128(ocw.buf), (agg_id & 1) ^ (negate != 0), acc.buf, {0, 0, 0},
                  _mm_setzero_si128(), fold, weighted, {0, 0, 0}, second,
                  second ? load128((const uint8_t *)cw2) : 0, {0, 0, 0}};

    Py_BEGIN_ALLOW_THREADS
    seed[0] = _mm_loadu_si128((const block *)key.buf);
    t[0] = (uint8_t)(agg_id & 1);
    block kid[2 * TILE];
    uint8_t kt[2 * TILE];
    for (Py_ssize_t lv = 0; lv < n; lv++) {
        /* only the nodes whose subtree meets [0, d): the leaves past d are
         * never folded, so they need no output and no proof */
        size_t span = (size_t)1 << (n - lv);
        size_t m = ((size_t)d + span - 1) / span;
        block cw = _mm_loadu_si128((const block *)((const uint8_t *)cws.buf + 16 * lv));
        uint8_t cl = cb[2 * lv] & 1, cr = cb[2 * lv + 1] & 1;
        int last = lv == n - 1;
        /* parents in tiles, backwards: a tile's children overwrite only
         * parents already read (children of j sit at 2j, 2j + 1 ≥ j) */
        size_t tiles = (m + TILE - 1) / TILE;
        for (size_t k = 0; k < tiles; k++) {
            size_t tile = last ? k : tiles - 1 - k;
            size_t j0 = tile * TILE, cnt = m - j0 < TILE ? m - j0 : TILE;
            children(rk, seed + j0, t + j0, cnt, cw, cl, cr, kid, kt);
            if (last) {
                size_t x0 = 2 * j0, mm = 2 * cnt;
                if (x0 + mm > (size_t)d) mm = (size_t)d - x0;
                leaves_tile(&L, kid, kt, x0, mm);
            } else {
                memcpy(seed + 2 * j0, kid, 2 * cnt * sizeof(block));
                memcpy(t + 2 * j0, kt, 2 * cnt);
            }
        }
    }
    Py_END_ALLOW_THREADS

    uint8_t out[88];
    _mm_storeu_si128((block *)out, L.digest);
    memcpy(out + 16, L.total, 24);
    memcpy(out + 40, L.weight, 24);
    memcpy(out + 64, L.total2, 24);
    result = PyBytes_FromStringAndSize((const char *)out, second ? 88 : weighted ? 64 : 40);
done:
    PyBuffer_Release(&tk); PyBuffer_Release(&pk0); PyBuffer_Release(&pk1);
    PyBuffer_Release(&dk); PyBuffer_Release(&cws); PyBuffer_Release(&ctrl);
    PyBuffer_Release(&pcw); PyBuffer_Release(&ocw); PyBuffer_Release(&key);
    PyBuffer_Release(&acc);
    return result;
}

/* H(x ⊕ tweak) for one block. */
static inline block hash1(const block *rk, block x, uint64_t tweak) {
    block sg = sigma(x, tweak), b = sg;
    aes_n_keyed(rk, &b, 1);
    return _mm_xor_si128(b, sg);
}

/* One level of key generation on α's path (vdaf/sparse.py `gen_level`): both
 * servers' kept child (s, t updated in place), the level's seed correction and
 * its two control corrections (left, right). */
static inline void gen_step(const block *rk, block s[2], uint8_t t[2], int bit, block *seed_cw,
                            uint8_t *cl, uint8_t *cr) {
    const block notone = _mm_set_epi64x(-1, ~(long long)1);
    block kid[2][2];
    uint8_t kt[2][2];
    for (int c = 0; c < 2; c++)
        for (int dir = 0; dir < 2; dir++) {
            block h = hash1(rk, s[c], dir ? RIGHT : LEFT);
            kt[c][dir] = (uint8_t)(_mm_cvtsi128_si64(h) & 1);
            kid[c][dir] = _mm_and_si128(h, notone);
        }
    *seed_cw = _mm_xor_si128(kid[0][1 - bit], kid[1][1 - bit]);
    *cl = kt[0][0] ^ kt[1][0] ^ (bit == 0);
    *cr = kt[0][1] ^ kt[1][1] ^ (bit == 1);
    uint8_t ck = bit ? *cr : *cl;
    for (int c = 0; c < 2; c++) {
        block k = kid[c][bit];
        uint8_t kb = kt[c][bit];
        if (t[c]) {
            k = _mm_xor_si128(k, *seed_cw);
            kb ^= ck;
        }
        s[c] = k;
        t[c] = kb;
    }
}

/* gen(tree_key, proof_key0, proof_key1, n, alpha, rand, weight) -> public share
 * The client's side (vdaf/sparse.py `gen` is the reference): the two keys
 * are rand's halves; walk α's path on both, then the leaf corrections. */
static PyObject *py_gen(PyObject *self, PyObject *args) {
    Py_buffer tk, pk0, pk1, rnd, wt, wt2 = {0};
    int n;
    unsigned long long alpha;
    if (!PyArg_ParseTuple(args, "y*y*y*iKy*y*|y*", &tk, &pk0, &pk1, &n, &alpha, &rnd, &wt, &wt2))
        return NULL;
    PyObject *result = NULL;
    int second = PyTuple_GET_SIZE(args) > 7; /* the optional wt2 was given */
    if (tk.len != 16 || pk0.len != 16 || pk1.len != 16 || rnd.len != 32 || wt.len != 16 ||
        n < 1 || n > MAX_BITS || alpha >= (1ULL << n) || load128(wt.buf) >= P128 ||
        (second && (wt2.len != 16 || load128(wt2.buf) >= P128))) {
        PyErr_SetString(PyExc_ValueError, "sparse gen: arguments of the wrong sizes");
        goto done;
    }
    block rk[11], rk0[11], rk1[11];
    expand_key(tk.buf, rk);
    expand_key(pk0.buf, rk0);
    expand_key(pk1.buf, rk1);
    block s[2] = {_mm_loadu_si128((const block *)rnd.buf),
                  _mm_loadu_si128((const block *)((const uint8_t *)rnd.buf + 16))};
    uint8_t t[2] = {0, 1};
    size_t head = (size_t)(2 * n + 7) / 8;
    size_t size = head + 16 * (size_t)n + 32 + (second ? 16 : 0);
    uint8_t out[(2 * MAX_BITS + 7) / 8 + 16 * MAX_BITS + 48];
    memset(out, 0, size);
    for (int i = 0; i < n; i++) {
        block seed_cw;
        uint8_t cl, cr;
        gen_step(rk, s, t, (int)((alpha >> (n - 1 - i)) & 1), &seed_cw, &cl, &cr);
        out[(2 * i) / 8] |= (uint8_t)(cl << ((2 * i) % 8));
        out[(2 * i + 1) / 8] |= (uint8_t)(cr << ((2 * i + 1) % 8));
        _mm_storeu_si128((block *)(out + head + 16 * i), seed_cw);
    }
    uint8_t raw[16];
    u128 conv[2];
    block proof[2];
    for (int b = 0; b < 2; b++) {
        _mm_storeu_si128((block *)raw, hash1(rk, s[b], CONVERT));
        conv[b] = load128(raw);
        if (conv[b] >= P128) conv[b] -= P128;
        proof[b] = hash1(t[b] ? rk1 : rk0, s[b], PROOF);
    }
    _mm_storeu_si128((block *)(out + head + 16 * n), _mm_xor_si128(proof[0], proof[1]));
    u128 cw = f_add(f_add(load128(wt.buf), f_neg(conv[0])), conv[1]);
    if (!t[0]) cw = f_neg(cw); /* the sign t₀ − t₁ */
    store128(out + head + 16 * n + 16, cw);
    if (second) { /* a second payload on the same leaf: its own tweak, its own correction */
        u128 c2[2];
        for (int b = 0; b < 2; b++) {
            _mm_storeu_si128((block *)raw, hash1(rk, s[b], WEIGHT));
            c2[b] = load128(raw);
            if (c2[b] >= P128) c2[b] -= P128;
        }
        u128 cw2 = f_add(f_add(load128(wt2.buf), f_neg(c2[0])), c2[1]);
        if (!t[0]) cw2 = f_neg(cw2);
        store128(out + head + 16 * n + 32, cw2);
    }
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)size);
done:
    PyBuffer_Release(&tk); PyBuffer_Release(&pk0); PyBuffer_Release(&pk1);
    PyBuffer_Release(&rnd); PyBuffer_Release(&wt);
    if (second) PyBuffer_Release(&wt2);
    return result;
}

/* ------------------------------------------------------------------ the prefix crawl
 *
 * vdaf/crawl.py's PrefixDpf in one pass per call (the numpy reference says
 * what each step is for; the tests compare both byte for byte).
 *
 * crawl_gen(tree_key, proof_key0, proof_key1, n, alpha, rand, weight) -> public share
 *   alpha: the string, ⌈n/8⌉ bytes big-endian (its low n bits); every level
 *   gets its seed, control, proof and output corrections.
 *
 * crawl_expand_many(keys, base_keys, first, agg_id, bodies, ctrls, seeds, bits,
 *                   totals, which, negate, acc, prep_out)
 *   Per report (R of them, K kept nodes each): `steps` = ctrls' width / 2
 *   binary levels from binary level `first` on (each level's digest key
 *   AES_base_key(its number)), from the nodes (seeds, bits 0/1, this server's
 *   Field128 share of their total), every child kept between them; the
 *   corrections are 48 bytes a level (seed, proof, output) and two control
 *   bits.  Adds this server's Field128 output shares of the last binary
 *   level's K·2^steps nodes to acc (three uint64 limbs each, unreduced: each
 *   addition < p), or their negatives when `negate` (a refused report taken
 *   out), and writes each binary level's prep share (digest ‖ Σ y − previous
 *   total, 32 bytes).  One report is R = 1.
 *
 * crawl_descend_many(keys, agg_id, bodies, ctrls, seeds, bits, parents, exts, which,
 *                    seeds_out, bits_out, totals_out)
 *   The nodes a walk keeps after such a step: node i of every report is the
 *   descendant of its node parents[i] (int32) along the steps bits of exts[i]
 *   (uint32, most significant first); their seeds, bits and this server's
 *   share of their outputs' total.
 */
enum { CRAWL_MAX_BITS = 256, CRAWL_MAX_NODES = 1 << 17 };

static inline u128 f_reduce(u128 y) { return y >= P128 ? y - P128 : y; }

static inline void acc_add(uint64_t *acc, u128 v) {
    unsigned long long a0 = acc[0], a1 = acc[1];
    unsigned char k = _addcarry_u64(0, a0, (uint64_t)v, &a0);
    k = _addcarry_u64(k, a1, (uint64_t)(v >> 64), &a1);
    acc[0] = a0;
    acc[1] = a1;
    acc[2] += k;
}

/* Scratch of one expansion: two node buffers, their bits, the hashes. */
typedef struct {
    block *a, *b, *tmp;
    uint8_t *ta, *tb;
} crawl_scratch;

static int scratch_alloc(crawl_scratch *w, size_t n) {
    w->a = aligned_alloc(64, 16 * n);
    w->b = aligned_alloc(64, 16 * n);
    w->tmp = aligned_alloc(64, 16 * n);
    w->ta = malloc(n);
    w->tb = malloc(n);
    return w->a && w->b && w->tmp && w->ta && w->tb;
}

static void scratch_free(crawl_scratch *w) {
    free(w->a); free(w->b); free(w->tmp); free(w->ta); free(w->tb);
}

/* One report's step (see crawl_expand above): keys = tree ‖ proof0 ‖ proof1
 * (48 bytes), base: the digest keys' key, first: the first binary level,
 * body: steps × 48, ctrl: 2·steps, K nodes. */
static void crawl_expand_core(const uint8_t *keys, const uint8_t *base, size_t first, int agg_id,
                              const uint8_t *body, const uint8_t *ctrl, size_t steps,
                              const uint8_t *seeds, const uint8_t *bits, size_t K, u128 prev,
                              int negate, uint64_t *acc, uint8_t *prep, crawl_scratch *w) {
    block rk[11], rk0[11], rk1[11], rkd[11], rkb[11];
    expand_key(keys, rk);
    expand_key(keys + 16, rk0);
    expand_key(keys + 32, rk1);
    expand_key(base, rkb);
    block *a = w->a, *b = w->b, *tmp = w->tmp;
    uint8_t *ta = w->ta, *tb = w->tb;
    memcpy(a, seeds, 16 * K);
    for (size_t i = 0; i < K; i++) ta[i] = bits[i] & 1;
    int neg = agg_id & 1;
    size_t m = K;
    for (size_t s = 0; s < steps; s++) {
        block cw = _mm_loadu_si128((const block *)(body + 48 * s));
        block pcw = _mm_loadu_si128((const block *)(body + 48 * s + 16));
        u128 ocw = load128(body + 48 * s + 32);
        children(rk, a, ta, m, cw, ctrl[2 * s] & 1, ctrl[2 * s + 1] & 1, b, tb);
        m *= 2;
        /* outputs: y = conv(s) + t·CW, negated on server 1; their sum */
        sigma_mmo(rk, b, NULL, 0, CONVERT, tmp, m);
        u128 sum = 0;
        int last = s + 1 == steps;
        for (size_t x = 0; x < m; x++) {
            uint8_t raw[16];
            _mm_storeu_si128((block *)raw, tmp[x]);
            u128 y = f_reduce(load128(raw));
            if (tb[x]) y = f_add(y, ocw);
            if (neg) y = f_neg(y);
            sum = f_add(sum, y);
            if (last) acc_add(acc + 3 * x, negate ? f_neg(y) : y);
        }
        /* proofs keyed by the control bit, the correction where it is 1, the
         * node's index XORed into the low word, compressed under the level's key */
        for (int bit = 0; bit < 2; bit++) {
            sigma_mmo(bit ? rk1 : rk0, b, NULL, 0, PROOF, tmp, m);
            for (size_t x = 0; x < m; x++) {
                if ((tb[x] & 1) != bit) continue;
                block v = bit ? _mm_xor_si128(tmp[x], pcw) : tmp[x];
                a[x] = _mm_xor_si128(v, _mm_set_epi64x(0, (long long)x)); /* a: scratch */
            }
        }
        /* the level's digest key: AES under the report's base key of its number */
        block lk = _mm_set_epi64x(0, (long long)(first + s));
        aes_n_keyed(rkb, &lk, 1);
        uint8_t lkey[16];
        _mm_storeu_si128((block *)lkey, lk);
        expand_key(lkey, rkd);
        aes_n_keyed(rkd, a, m);
        block dg = _mm_setzero_si128();
        for (size_t x = 0; x < m; x++) dg = _mm_xor_si128(dg, a[x]);
        _mm_storeu_si128((block *)(prep + 32 * s), dg);
        store128(prep + 32 * s + 16, f_add(sum, f_neg(prev)));
        prev = sum;
        block *sw = a; a = b; b = sw; /* the children become the next parents */
        uint8_t *tw = ta; ta = tb; tb = tw;
    }
}

/* Corrections of every step: output corrections below p. */
static int crawl_body_ok(const uint8_t *body, size_t steps) {
    for (size_t i = 0; i < steps; i++)
        if (load128(body + 48 * i + 32) >= P128) return 0;
    return 1;
}

/* crawl_expand_many(keys, base_keys, first, agg_id, bodies, ctrls, seeds, bits, totals,
 *                   which, negate, acc, prep_out): crawl_expand over R reports with K
 * nodes each, into one accumulator: keys R × 48 (tree, proof0, proof1),
 * base_keys R × 16, bodies R × steps × 48, ctrls R × 2·steps, seeds
 * R × K × 16, bits R × K, totals R × 16, which: R bytes (0: skip the report);
 * prep_out: R × steps × 32 (written for the reports done). */
static PyObject *py_crawl_expand_many(PyObject *self, PyObject *args) {
    Py_buffer ks, dks, lv, ctrl, sd, bt, tot, wh, acc, po;
    int agg_id, negate, first;
    if (!PyArg_ParseTuple(args, "y*y*iiy*y*y*y*y*y*pw*w*", &ks, &dks, &first, &agg_id, &lv, &ctrl,
                          &sd, &bt, &tot, &wh, &negate, &acc, &po))
        return NULL;
    PyObject *result = NULL;
    crawl_scratch w = {0};
    size_t R = (size_t)wh.len;
    size_t steps = R ? (size_t)ctrl.len / (2 * R) : 0;
    size_t K = R ? (size_t)bt.len / R : 0;
    size_t out_n = steps >= 1 && steps < 20 ? K << steps : 0;
    if (R < 1 || ks.len != (Py_ssize_t)(48 * R) || steps < 1 || steps > 16 || first < 1 ||
        dks.len != (Py_ssize_t)(16 * R) || lv.len != (Py_ssize_t)(48 * steps * R) ||
        ctrl.len != (Py_ssize_t)(2 * steps * R) || K < 1 || bt.len != (Py_ssize_t)(K * R) ||
        sd.len != (Py_ssize_t)(16 * K * R) || tot.len != (Py_ssize_t)(16 * R) ||
        out_n > CRAWL_MAX_NODES || acc.len != (Py_ssize_t)(24 * out_n) ||
        po.len != (Py_ssize_t)(32 * steps * R)) {
        PyErr_SetString(PyExc_ValueError, "crawl expand_many: arguments of the wrong sizes");
        goto done;
    }
    const uint8_t *W = wh.buf, *T = tot.buf, *B = lv.buf;
    for (size_t r = 0; r < R; r++)
        if (W[r] && (load128(T + 16 * r) >= P128 || !crawl_body_ok(B + 48 * steps * r, steps))) {
            PyErr_SetString(PyExc_ValueError, "crawl expand_many: a field element ≥ p");
            goto done;
        }
    if (!scratch_alloc(&w, out_n)) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (size_t r = 0; r < R; r++) {
        if (!W[r]) continue;
        crawl_expand_core((const uint8_t *)ks.buf + 48 * r, (const uint8_t *)dks.buf + 16 * r,
                          (size_t)first, agg_id, B + 48 * steps * r,
                          (const uint8_t *)ctrl.buf + 2 * steps * r,
                          steps, (const uint8_t *)sd.buf + 16 * K * r,
                          (const uint8_t *)bt.buf + K * r, K, load128(T + 16 * r), negate,
                          acc.buf, (uint8_t *)po.buf + 32 * steps * r, &w);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    scratch_free(&w);
    PyBuffer_Release(&ks); PyBuffer_Release(&dks); PyBuffer_Release(&lv);
    PyBuffer_Release(&ctrl); PyBuffer_Release(&sd); PyBuffer_Release(&bt);
    PyBuffer_Release(&tot); PyBuffer_Release(&wh); PyBuffer_Release(&acc);
    PyBuffer_Release(&po);
    return result;
}

/* One report's descent (see crawl_descend above); returns its total. */
static u128 crawl_descend_core(const block *rk, const uint8_t *body, const uint8_t *ctrl,
                               size_t steps, int agg_id, const uint8_t *seeds,
                               const uint8_t *bits, const int32_t *pp, const uint32_t *ep,
                               size_t M, uint8_t *so, uint8_t *bo) {
    const block notone = _mm_set_epi64x(-1, ~(long long)1);
    u128 ocw = load128(body + 48 * (steps - 1) + 32);
    u128 total = 0;
    for (size_t i = 0; i < M; i++) {
        block node = _mm_loadu_si128((const block *)(seeds + 16 * (size_t)pp[i]));
        uint8_t t = bits[pp[i]] & 1;
        for (size_t s = 0; s < steps; s++) {
            int dir = (int)((ep[i] >> (steps - 1 - s)) & 1);
            block h = hash1(rk, node, dir ? RIGHT : LEFT);
            uint8_t bit = (uint8_t)(_mm_cvtsi128_si64(h) & 1);
            block cw = _mm_loadu_si128((const block *)(body + 48 * s));
            block mask = _mm_set1_epi8((char)(0 - t));
            node = _mm_xor_si128(_mm_and_si128(h, notone), _mm_and_si128(cw, mask));
            t = bit ^ (t & (ctrl[2 * s + dir] & 1));
        }
        uint8_t raw[16];
        _mm_storeu_si128((block *)raw, hash1(rk, node, CONVERT));
        u128 y = f_reduce(load128(raw));
        if (t) y = f_add(y, ocw);
        if (agg_id & 1) y = f_neg(y);
        total = f_add(total, y);
        _mm_storeu_si128((block *)(so + 16 * i), node);
        bo[i] = t;
    }
    return total;
}

static int descend_paths_ok(const int32_t *pp, const uint32_t *ep, size_t M, size_t K,
                            size_t steps) {
    for (size_t i = 0; i < M; i++)
        if (pp[i] < 0 || (size_t)pp[i] >= K || (ep[i] >> steps)) return 0;
    return 1;
}

/* crawl_descend_many(keys, agg_id, bodies, ctrls, seeds, bits, parents, exts, which,
 *                    seeds_out, bits_out, totals_out): crawl_descend over R
 * reports of K nodes, M kept paths each (the same paths for all): keys R × 48
 * (the tree key first), bodies R × steps × 48, ctrls R × 2·steps, seeds
 * R × K × 16, bits R × K; writes seeds_out R × M × 16, bits_out R × M,
 * totals_out R × 16 for the reports `which` marks. */
static PyObject *py_crawl_descend_many(PyObject *self, PyObject *args) {
    Py_buffer ks, lv, ctrl, sd, bt, par, ext, wh, so, bo, to;
    int agg_id;
    if (!PyArg_ParseTuple(args, "y*iy*y*y*y*y*y*y*w*w*w*", &ks, &agg_id, &lv, &ctrl, &sd, &bt,
                          &par, &ext, &wh, &so, &bo, &to))
        return NULL;
    PyObject *result = NULL;
    size_t R = (size_t)wh.len, M = (size_t)par.len / 4;
    size_t steps = R ? (size_t)ctrl.len / (2 * R) : 0, K = R ? (size_t)bt.len / R : 0;
    if (R < 1 || ks.len != (Py_ssize_t)(48 * R) || steps < 1 || steps > 16 ||
        ctrl.len != (Py_ssize_t)(2 * steps * R) || lv.len != (Py_ssize_t)(48 * steps * R) ||
        K < 1 || bt.len != (Py_ssize_t)(K * R) || sd.len != (Py_ssize_t)(16 * K * R) ||
        par.len % 4 || ext.len != par.len || M > CRAWL_MAX_NODES ||
        so.len != (Py_ssize_t)(16 * M * R) || bo.len != (Py_ssize_t)(M * R) ||
        to.len != (Py_ssize_t)(16 * R)) {
        PyErr_SetString(PyExc_ValueError, "crawl descend_many: arguments of the wrong sizes");
        goto done;
    }
    if (!descend_paths_ok(par.buf, ext.buf, M, K, steps)) {
        PyErr_SetString(PyExc_ValueError, "crawl descend_many: a parent or extension out of range");
        goto done;
    }
    const uint8_t *W = wh.buf, *B = lv.buf;
    for (size_t r = 0; r < R; r++)
        if (W[r] && !crawl_body_ok(B + 48 * steps * r, steps)) {
            PyErr_SetString(PyExc_ValueError, "crawl descend_many: an output correction ≥ p");
            goto done;
        }
    Py_BEGIN_ALLOW_THREADS
    for (size_t r = 0; r < R; r++) {
        if (!W[r]) continue;
        block rk[11];
        expand_key((const uint8_t *)ks.buf + 48 * r, rk);
        u128 total = crawl_descend_core(
            rk, B + 48 * steps * r, (const uint8_t *)ctrl.buf + 2 * steps * r, steps, agg_id,
            (const uint8_t *)sd.buf + 16 * K * r, (const uint8_t *)bt.buf + K * r, par.buf, ext.buf,
            M, (uint8_t *)so.buf + 16 * M * r, (uint8_t *)bo.buf + M * r);
        store128((uint8_t *)to.buf + 16 * r, total);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&ks); PyBuffer_Release(&lv); PyBuffer_Release(&ctrl);
    PyBuffer_Release(&sd); PyBuffer_Release(&bt); PyBuffer_Release(&par);
    PyBuffer_Release(&ext); PyBuffer_Release(&wh); PyBuffer_Release(&so);
    PyBuffer_Release(&bo); PyBuffer_Release(&to);
    return result;
}

static PyObject *py_crawl_gen(PyObject *self, PyObject *args) {
    Py_buffer tk, pk0, pk1, al, rnd, wt;
    int n;
    if (!PyArg_ParseTuple(args, "y*y*y*iy*y*y*", &tk, &pk0, &pk1, &n, &al, &rnd, &wt))
        return NULL;
    PyObject *result = NULL;
    uint8_t *out = NULL;
    if (tk.len != 16 || pk0.len != 16 || pk1.len != 16 || rnd.len != 32 || wt.len != 16 ||
        n < 1 || n > CRAWL_MAX_BITS || al.len != (n + 7) / 8 || load128(wt.buf) >= P128) {
        PyErr_SetString(PyExc_ValueError, "crawl gen: arguments of the wrong sizes");
        goto done;
    }
    const uint8_t *ab = al.buf;
    size_t head = (size_t)(2 * n + 7) / 8, size = head + 48 * (size_t)n;
    out = calloc(size, 1);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    block rk[11], rk0[11], rk1[11];
    expand_key(tk.buf, rk);
    expand_key(pk0.buf, rk0);
    expand_key(pk1.buf, rk1);
    block s[2] = {_mm_loadu_si128((const block *)rnd.buf),
                  _mm_loadu_si128((const block *)((const uint8_t *)rnd.buf + 16))};
    uint8_t t[2] = {0, 1};
    u128 w = load128(wt.buf);
    size_t pad = 8 * (size_t)al.len - (size_t)n; /* alpha's leading unused bits */
    for (int i = 0; i < n; i++) {
        size_t at = pad + (size_t)i;
        block seed_cw;
        uint8_t cl, cr;
        gen_step(rk, s, t, (ab[at / 8] >> (7 - at % 8)) & 1, &seed_cw, &cl, &cr);
        out[(2 * i) / 8] |= (uint8_t)(cl << ((2 * i) % 8));
        out[(2 * i + 1) / 8] |= (uint8_t)(cr << ((2 * i + 1) % 8));
        uint8_t *lvl = out + head + 48 * (size_t)i;
        _mm_storeu_si128((block *)lvl, seed_cw);
        uint8_t raw[16];
        u128 conv[2];
        block proof[2];
        for (int c = 0; c < 2; c++) {
            _mm_storeu_si128((block *)raw, hash1(rk, s[c], CONVERT));
            conv[c] = f_reduce(load128(raw));
            proof[c] = hash1(t[c] ? rk1 : rk0, s[c], PROOF);
        }
        _mm_storeu_si128((block *)(lvl + 16), _mm_xor_si128(proof[0], proof[1]));
        u128 cw = f_add(f_add(w, f_neg(conv[0])), conv[1]);
        if (!t[0]) cw = f_neg(cw); /* the sign t₀ − t₁ */
        store128(lvl + 32, cw);
    }
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)size);
done:
    free(out);
    PyBuffer_Release(&tk); PyBuffer_Release(&pk0); PyBuffer_Release(&pk1);
    PyBuffer_Release(&al); PyBuffer_Release(&rnd); PyBuffer_Release(&wt);
    return result;
}

static PyMethodDef methods[] = {
    {"expand", py_expand, METH_VARARGS,
     "Expand a sparse one-hot DPF key over its domain (see vdaf/sparse.py)."},
    {"gen", py_gen, METH_VARARGS, "Make a sparse one-hot report's public share."},
    {"crawl_gen", py_crawl_gen, METH_VARARGS, "Make a prefix-crawl report's public share."},
    {"crawl_expand_many", py_crawl_expand_many, METH_VARARGS,
     "crawl_expand over many reports into one accumulator."},
    {"crawl_descend_many", py_crawl_descend_many, METH_VARARGS,
     "crawl_descend over many reports along the same kept paths."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sparse", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sparse(void) { return PyModule_Create(&module); }
