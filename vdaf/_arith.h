/* Field64 and Field128 element arithmetic for the native core of svtagg.vdaf
 * (vdaf/_field.c, vdaf/_flp.c): canonical elements in [0, p), little-endian
 * words, and no data-dependent branches (the elements are shares: random, so
 * a branch on a carry would be mispredicted half the time).
 *
 * Field64, p = 2^64 - 2^32 + 1: products reduce with 2^64 = 2^32 - 1 and
 * 2^96 = -1 (mod p).  Field128, p = 2^128 - 28*2^64 + 1: products reduce by
 * Montgomery multiplication with R = 2^128; since p = 1 (mod 2^64) each
 * round's factor is just the negated low word.  A canonical product a*b is
 * mont(mont(a, b), R^2 mod p), or mont(a, b*R) when b is kept as b*R.
 *
 * Sums of many Field128 products are accumulated unreduced in five words
 * (acc5: up to 2^64 products of elements < p) and reduced once (acc5_redc);
 * sums of many elements likewise in three (acc3).
 */
#ifndef SVTAGG_VDAF_ARITH_H
#define SVTAGG_VDAF_ARITH_H

#include <stdint.h>

typedef uint64_t u64;
typedef unsigned __int128 u128;

/* ------------------------------------------------------------------ Field64 */

static const u64 P64 = 0xFFFFFFFF00000001ULL;
static const u64 EPS64 = 0xFFFFFFFFULL; /* 2^64 mod p */

static inline u64 add64(u64 a, u64 b) {
    u64 s = a + b;
    u64 carry = s < a;
    /* a + b < 2p: subtract p once if the sum wrapped or is >= p */
    u64 d = s - P64;
    u64 use_d = carry | (s >= P64);
    return use_d ? d : s;
}

static inline u64 sub64(u64 a, u64 b) {
    u64 d = a - b;
    return d + (P64 & (0 - (u64)(a < b)));
}

static inline u64 red64(u128 x) {
    u64 lo = (u64)x, hi = (u64)(x >> 64);
    u64 hh = hi >> 32, hl = hi & EPS64;
    u64 t0 = lo - hh;
    t0 -= EPS64 & (0 - (u64)(lo < hh)); /* borrowed 2^64 = 2^32 - 1: take it back */
    u64 t1 = hl * EPS64;                 /* hl * 2^64 = hl * (2^32 - 1) */
    u64 r = t0 + t1;
    r += EPS64 & (0 - (u64)(r < t0));    /* carried 2^64 */
    return r >= P64 ? r - P64 : r;
}

static inline u64 mul64(u64 a, u64 b) { return red64((u128)a * b); }

/* ----------------------------------------------------------------- Field128 */

/* Add and subtract with carry: the x86-64 intrinsics where there are some (a
 * plain chain of adc/sbb; GCC makes poor code of the same in __int128), the
 * portable version elsewhere. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <x86intrin.h>
static inline u64 adc(u64 a, u64 b, unsigned char cin, unsigned char *cout) {
    unsigned long long r;
    *cout = _addcarry_u64(cin, a, b, &r);
    return r;
}
static inline u64 sbb(u64 a, u64 b, unsigned char bin, unsigned char *bout) {
    unsigned long long r;
    *bout = _subborrow_u64(bin, a, b, &r);
    return r;
}
#else
static inline u64 adc(u64 a, u64 b, unsigned char cin, unsigned char *cout) {
    u128 s = (u128)a + b + cin;
    *cout = (unsigned char)(s >> 64);
    return (u64)s;
}
static inline u64 sbb(u64 a, u64 b, unsigned char bin, unsigned char *bout) {
    u128 d = (u128)a - b - bin;
    *bout = (unsigned char)((d >> 64) & 1);
    return (u64)d;
}
#endif

typedef struct {
    u64 lo, hi;
} e128;

static const u64 P128_HI = 0xFFFFFFFFFFFFFFE4ULL; /* p = P128_HI * 2^64 + 1 */
/* R^2 mod p = 2^256 mod p */
static const e128 R2_128 = {0xFFFFFFFFFFFFFCF1ULL, 0x5587ULL};

static inline int ge_p128(u64 lo, u64 hi) { return hi > P128_HI || (hi == P128_HI && lo >= 1); }

/* top*2^128 + (hi, lo) < 2p, reduced: minus p where that is the value. */
static inline e128 csub128(u64 top, u64 lo, u64 hi) {
    unsigned char b;
    u64 d0 = sbb(lo, 1, 0, &b);
    u64 d1 = sbb(hi, P128_HI, b, &b);
    int use = (int)top | (b ^ 1); /* the value is >= p */
    /* selects the compilers make conditional moves (a mask and and/or gets
     * turned into slow vector code by GCC's SLP pass) */
    e128 r;
    r.lo = use ? d0 : lo;
    r.hi = use ? d1 : hi;
    return r;
}

static inline e128 add128(e128 a, e128 b) {
    unsigned char c;
    u64 lo = adc(a.lo, b.lo, 0, &c);
    u64 hi = adc(a.hi, b.hi, c, &c);
    return csub128(c, lo, hi);
}

static inline e128 sub128(e128 a, e128 b) {
    unsigned char bw, c;
    u64 lo = sbb(a.lo, b.lo, 0, &bw);
    u64 hi = sbb(a.hi, b.hi, bw, &bw);
    /* wrapped: add p back */
    lo = adc(lo, bw ? 1 : 0, 0, &c);
    hi = adc(hi, bw ? P128_HI : 0, c, &c);
    return (e128){lo, hi};
}

/* Montgomery reduction of T = (t3, t2, t1, t0) < 2^256, with t4 the carry
 * word of the rounds: T * 2^-128 mod p.  Each round adds m*p with m the
 * negated low word (p = 1 mod 2^64, so -p^-1 = -1), m*p = m + m*P128_HI*2^64.
 * The result is below 2^128 + p = 2p + c (c = 2^128 - p) in general and below
 * 2p for T < p*2^128 (a product of two elements): `twice` says whether a
 * second subtraction may be needed. */
static inline e128 redc4(u64 t0, u64 t1, u64 t2, u64 t3, int twice) {
    unsigned char c;
    u64 m = (u64)0 - t0;
    u128 mp = (u128)m * P128_HI;
    adc(t0, m, 0, &c); /* t0 + m = 0 mod 2^64; only the carry remains */
    t1 = adc(t1, (u64)mp, c, &c);
    t2 = adc(t2, (u64)(mp >> 64), c, &c);
    t3 = adc(t3, 0, c, &c);
    u64 t4 = c;
    m = (u64)0 - t1;
    mp = (u128)m * P128_HI;
    adc(t1, m, 0, &c);
    t2 = adc(t2, (u64)mp, c, &c);
    t3 = adc(t3, (u64)(mp >> 64), c, &c);
    t4 += c;
    e128 r = csub128(t4, t2, t3);
    return twice ? csub128(0, r.lo, r.hi) : r;
}

/* (t3, t2, t1, t0) = x*y. */
#define MUL256(x, y, t0, t1, t2, t3)                                                  \
    do {                                                                              \
        u128 p00_ = (u128)(x).lo * (y).lo, p01_ = (u128)(x).lo * (y).hi;              \
        u128 p10_ = (u128)(x).hi * (y).lo, p11_ = (u128)(x).hi * (y).hi;              \
        unsigned char c_;                                                             \
        t0 = (u64)p00_;                                                               \
        t1 = (u64)(p00_ >> 64);                                                       \
        t2 = (u64)p11_;                                                               \
        t3 = (u64)(p11_ >> 64);                                                       \
        t1 = adc(t1, (u64)p01_, 0, &c_);                                              \
        t2 = adc(t2, (u64)(p01_ >> 64), c_, &c_);                                     \
        t3 = adc(t3, 0, c_, &c_);                                                     \
        t1 = adc(t1, (u64)p10_, 0, &c_);                                              \
        t2 = adc(t2, (u64)(p10_ >> 64), c_, &c_);                                     \
        t3 = adc(t3, 0, c_, &c_);                                                     \
    } while (0)

/* a*b*2^-128 mod p, for a, b < p. */
static inline e128 mont128(e128 a, e128 b) {
    u64 t0, t1, t2, t3;
    MUL256(a, b, t0, t1, t2, t3);
    return redc4(t0, t1, t2, t3, 0);
}

static inline e128 mul128(e128 a, e128 b) { return mont128(mont128(a, b), R2_128); }
static inline e128 tomont128(e128 a) { return mont128(a, R2_128); }

/* Unreduced sum of products. */
typedef struct {
    u64 w0, w1, w2, w3, w4;
} acc5;

static inline void acc5_zero(acc5 *a) { a->w0 = a->w1 = a->w2 = a->w3 = a->w4 = 0; }

/* a += x*y (x, y < 2^128). */
static inline void acc5_mac(acc5 *a, e128 x, e128 y) {
    u64 t0, t1, t2, t3;
    unsigned char c;
    MUL256(x, y, t0, t1, t2, t3);
    a->w0 = adc(a->w0, t0, 0, &c);
    a->w1 = adc(a->w1, t1, c, &c);
    a->w2 = adc(a->w2, t2, c, &c);
    a->w3 = adc(a->w3, t3, c, &c);
    a->w4 += c;
}

/* T*2^-128 mod p for the accumulated T (canonical).  T = w4*2^256 + L; the
 * top word is folded in as w4 * (2^256 mod p) (R2_128) until T < 2^256
 * (twice at most: w4*R2_128 < 2^143). */
static inline e128 acc5_redc(const acc5 *a) {
    u64 w0 = a->w0, w1 = a->w1, w2 = a->w2, w3 = a->w3, w4 = a->w4;
    while (w4) {
        u128 f0 = (u128)w4 * R2_128.lo, f1 = (u128)w4 * R2_128.hi;
        unsigned char c;
        w0 = adc(w0, (u64)f0, 0, &c);
        w1 = adc(w1, (u64)(f0 >> 64), c, &c);
        w2 = adc(w2, 0, c, &c);
        w3 = adc(w3, 0, c, &c);
        w4 = c;
        w1 = adc(w1, (u64)f1, 0, &c);
        w2 = adc(w2, (u64)(f1 >> 64), c, &c);
        w3 = adc(w3, 0, c, &c);
        w4 += c;
    }
    return redc4(w0, w1, w2, w3, 1);
}

/* Unreduced sum of elements (up to 2^64 of them). */
typedef struct {
    u64 w0, w1, w2;
} acc3;

static inline void acc3_add(acc3 *a, e128 x) {
    unsigned char c;
    a->w0 = adc(a->w0, x.lo, 0, &c);
    a->w1 = adc(a->w1, x.hi, c, &c);
    a->w2 += c;
}

/* The accumulated sum mod p: with T = w2*2^128 + L and 2^128 = c (mod p),
 * c = 2^128 - p = 27*2^64 + (2^64 - 1), w2*c is folded in until T < 2^128,
 * then one correction. */
static inline e128 acc3_reduce(const acc3 *a) {
    u64 w0 = a->w0, w1 = a->w1, w2 = a->w2;
    while (w2) {
        u128 f = (u128)w2 * 0xFFFFFFFFFFFFFFFFULL; /* w2*(2^64 - 1) */
        u128 g = (u128)w2 * 27;                     /* w2*27, at 2^64 */
        unsigned char c;
        w0 = adc(w0, (u64)f, 0, &c);
        w1 = adc(w1, (u64)(f >> 64), c, &c);
        u64 top = c;
        w1 = adc(w1, (u64)g, 0, &c);
        w2 = top + c + (u64)(g >> 64);
    }
    return csub128(0, w0, w1);
}

#endif
