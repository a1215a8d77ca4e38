/* SHAKE128 (FIPS 202) over many equal-length messages at once, for the XOF
 * of svtagg.vdaf (draft-irtf-cfrg-vdaf-07 6.2.1: XofShake128).
 *
 * A server verifies a batch of reports, and every report runs the same XOF
 * usages on messages of the same length (one DST, a 16-byte seed, a binder of
 * one length).  So the streams are computed W at a time in lock step: the
 * Keccak-f[1600] state of W streams is kept lane-interleaved (25 vectors of W
 * 64-bit words) and one permutation advances all of them.  W is 8 with
 * AVX-512F, 4 with AVX2, 1 otherwise (portable C); the widths are compiled
 * under target attributes and chosen at run time, and all of them give the
 * bytes hashlib's SHAKE128 gives (tests/test_vdaf_keccak.py).
 *
 * The permutation is written once (KECCAK_ROUNDS below) over a type T with
 * GCC/Clang vector operators: for W = 1 T is uint64_t, otherwise a vector of
 * W uint64_t, where the compiler turns the rotations into vprolq (AVX-512)
 * or shift pairs (AVX2).
 */
#include "_keccak.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint64_t u64;
typedef u64 v4 __attribute__((vector_size(32)));
typedef u64 v8 __attribute__((vector_size(64)));

#define RATE 168            /* SHAKE128: 1600 - 2*128 bits */
#define RATE_WORDS (RATE / 8)
#define MAXW 8

static const u64 RC[24] = {
    0x0000000000000001ULL, 0x0000000000008082ULL, 0x800000000000808AULL, 0x8000000080008000ULL,
    0x000000000000808BULL, 0x0000000080000001ULL, 0x8000000080008081ULL, 0x8000000000008009ULL,
    0x000000000000008AULL, 0x0000000000000088ULL, 0x0000000080008009ULL, 0x000000008000000AULL,
    0x000000008000808BULL, 0x800000000000008BULL, 0x8000000000008089ULL, 0x8000000000008003ULL,
    0x8000000000008002ULL, 0x8000000000000080ULL, 0x000000000000800AULL, 0x800000008000000AULL,
    0x8000000080008081ULL, 0x8000000000008080ULL, 0x0000000080000001ULL, 0x8000000080008008ULL,
};

/* Rotation by a constant 1..63 (every rho offset but lane (0, 0)'s 0). */
#define ROL(x, n) (((x) << (n)) | ((x) >> (64 - (n))))

/* One round from A[25] into E[25] (lane (x, y) at index x + 5y), of element
 * type T: theta (C[x] = xor of column x, D[x] = C[x-1] ^ rol(C[x+1], 1),
 * A ^= D), rho and pi (B[y, 2x + 3y] = rol(A[x, y], r[x, y])), chi
 * (E[x, y] = B[x, y] ^ (~B[x+1, y] & B[x+2, y])) and iota (E[0] ^= RC).
 * Each output row is finished before the next is started, so only its five
 * B values are live at a time (the registers hold A, E and D). */
#define KECCAK_ROUND(T, A, E, RCV, rc)                                                     \
    do {                                                                                   \
        T C0 = A[0] ^ A[5] ^ A[10] ^ A[15] ^ A[20];                                        \
        T C1 = A[1] ^ A[6] ^ A[11] ^ A[16] ^ A[21];                                        \
        T C2 = A[2] ^ A[7] ^ A[12] ^ A[17] ^ A[22];                                        \
        T C3 = A[3] ^ A[8] ^ A[13] ^ A[18] ^ A[23];                                        \
        T C4 = A[4] ^ A[9] ^ A[14] ^ A[19] ^ A[24];                                        \
        T D0 = C4 ^ ROL(C1, 1), D1 = C0 ^ ROL(C2, 1), D2 = C1 ^ ROL(C3, 1);                \
        T D3 = C2 ^ ROL(C4, 1), D4 = C3 ^ ROL(C0, 1);                                      \
        T B0, B1, B2, B3, B4;                                                              \
        B0 = A[0] ^ D0;                                                                    \
        B1 = ROL(A[6] ^ D1, 44);                                                           \
        B2 = ROL(A[12] ^ D2, 43);                                                          \
        B3 = ROL(A[18] ^ D3, 21);                                                          \
        B4 = ROL(A[24] ^ D4, 14);                                                          \
        E[0] = B0 ^ (~B1 & B2) ^ RCV(rc);                                                  \
        E[1] = B1 ^ (~B2 & B3);                                                            \
        E[2] = B2 ^ (~B3 & B4);                                                            \
        E[3] = B3 ^ (~B4 & B0);                                                            \
        E[4] = B4 ^ (~B0 & B1);                                                            \
        B0 = ROL(A[3] ^ D3, 28);                                                           \
        B1 = ROL(A[9] ^ D4, 20);                                                           \
        B2 = ROL(A[10] ^ D0, 3);                                                           \
        B3 = ROL(A[16] ^ D1, 45);                                                          \
        B4 = ROL(A[22] ^ D2, 61);                                                          \
        E[5] = B0 ^ (~B1 & B2);                                                            \
        E[6] = B1 ^ (~B2 & B3);                                                            \
        E[7] = B2 ^ (~B3 & B4);                                                            \
        E[8] = B3 ^ (~B4 & B0);                                                            \
        E[9] = B4 ^ (~B0 & B1);                                                            \
        B0 = ROL(A[1] ^ D1, 1);                                                            \
        B1 = ROL(A[7] ^ D2, 6);                                                            \
        B2 = ROL(A[13] ^ D3, 25);                                                          \
        B3 = ROL(A[19] ^ D4, 8);                                                           \
        B4 = ROL(A[20] ^ D0, 18);                                                          \
        E[10] = B0 ^ (~B1 & B2);                                                           \
        E[11] = B1 ^ (~B2 & B3);                                                           \
        E[12] = B2 ^ (~B3 & B4);                                                           \
        E[13] = B3 ^ (~B4 & B0);                                                           \
        E[14] = B4 ^ (~B0 & B1);                                                           \
        B0 = ROL(A[4] ^ D4, 27);                                                           \
        B1 = ROL(A[5] ^ D0, 36);                                                           \
        B2 = ROL(A[11] ^ D1, 10);                                                          \
        B3 = ROL(A[17] ^ D2, 15);                                                          \
        B4 = ROL(A[23] ^ D3, 56);                                                          \
        E[15] = B0 ^ (~B1 & B2);                                                           \
        E[16] = B1 ^ (~B2 & B3);                                                           \
        E[17] = B2 ^ (~B3 & B4);                                                           \
        E[18] = B3 ^ (~B4 & B0);                                                           \
        E[19] = B4 ^ (~B0 & B1);                                                           \
        B0 = ROL(A[2] ^ D2, 62);                                                           \
        B1 = ROL(A[8] ^ D3, 55);                                                           \
        B2 = ROL(A[14] ^ D4, 39);                                                          \
        B3 = ROL(A[15] ^ D0, 41);                                                          \
        B4 = ROL(A[21] ^ D1, 2);                                                           \
        E[20] = B0 ^ (~B1 & B2);                                                           \
        E[21] = B1 ^ (~B2 & B3);                                                           \
        E[22] = B2 ^ (~B3 & B4);                                                           \
        E[23] = B3 ^ (~B4 & B0);                                                           \
        E[24] = B4 ^ (~B0 & B1);                                                           \
    } while (0)

/* Keccak-f[1600] on A[25], two rounds at a time through the scratch E[25]. */
#define KECCAK_ROUNDS(T, A, E, RCV)                                                        \
    do {                                                                                   \
        for (int round = 0; round < 24; round += 2) {                                      \
            KECCAK_ROUND(T, A, E, RCV, RC[round]);                                         \
            KECCAK_ROUND(T, E, A, RCV, RC[round + 1]);                                     \
        }                                                                                  \
    } while (0)

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_X86_PATHS 1
#endif

/* ---------------------------------------------------------- width choice */

static int max_width = 1; /* what this CPU runs */
static int use_width = 1; /* what is used (tests narrow it) */

void keccak_init(void) {
    max_width = 1;
#ifdef HAVE_X86_PATHS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        max_width = 4;
        if (__builtin_cpu_supports("avx512f")) max_width = 8;
    }
#endif
    use_width = max_width;
}

int keccak_width(int want) {
    if (want == 1 || want == 4 || want == 8) {
        if (want > max_width) return -1;
        use_width = want;
    } else if (want == 0) {
        use_width = max_width;
    } else if (want != -1) {
        return -1;
    }
    return use_width;
}

/* ---------------------------------------------------------- messages */

/* Bytes [pos, pos + len) of row `row`'s message into dst. */
static void gather(const xof_seg *segs, int nsegs, ptrdiff_t row, ptrdiff_t pos,
                   unsigned char *dst, ptrdiff_t len) {
    ptrdiff_t seg_start = 0;
    for (int i = 0; i < nsegs && len > 0; i++) {
        ptrdiff_t w = segs[i].width, seg_end = seg_start + w;
        if (pos < seg_end) {
            ptrdiff_t off = pos - seg_start, take = seg_end - pos < len ? seg_end - pos : len;
            memcpy(dst, segs[i].data + segs[i].offset + row * segs[i].stride + off, (size_t)take);
            dst += take;
            pos += take;
            len -= take;
        }
        seg_start = seg_end;
    }
}

/* Row `row`'s bytes [pos, pos + RATE) where they lie inside one piece (no
 * copy needed), else NULL. */
static const unsigned char *direct(const xof_seg *segs, int nsegs, ptrdiff_t row, ptrdiff_t pos) {
    ptrdiff_t seg_start = 0;
    for (int i = 0; i < nsegs; i++) {
        ptrdiff_t seg_end = seg_start + segs[i].width;
        if (pos < seg_end) {
            if (pos + RATE > seg_end) return NULL;
            return segs[i].data + segs[i].offset + row * segs[i].stride + (pos - seg_start);
        }
        seg_start = seg_end;
    }
    return NULL;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline u64 load_le64(const unsigned char *p) {
    u64 x;
    memcpy(&x, p, 8);
    return x;
}

static inline void store_le64(unsigned char *p, u64 x) { memcpy(p, &x, 8); }
#else
static inline u64 load_le64(const unsigned char *p) {
    u64 x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

static inline void store_le64(unsigned char *p, u64 x) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
}
#endif

/* The block at `pos` of each lane's message: a pointer into the message where
 * it lies in one piece, else its bytes gathered into buf[s] (with SHAKE's
 * padding in the last block).  Returns whether this is the last block. */
static int next_blocks(const xof_seg *segs, int nsegs, ptrdiff_t msg_len, ptrdiff_t pos,
                       const ptrdiff_t *rows, int nrows, int width, unsigned char (*buf)[RATE],
                       const unsigned char **src) {
    ptrdiff_t take = msg_len - pos < RATE ? msg_len - pos : RATE;
    int last = take < RATE; /* the padding goes into a block with room for it */
    for (int s = 0; s < width; s++) {
        ptrdiff_t row = rows[s < nrows ? s : nrows - 1];
        src[s] = last ? NULL : direct(segs, nsegs, row, pos);
        if (!src[s]) {
            gather(segs, nsegs, row, pos, buf[s], take);
            if (last) {
                memset(buf[s] + take, 0, (size_t)(RATE - take));
                buf[s][take] ^= 0x1F; /* SHAKE's domain bits, then pad10*1 */
                buf[s][RATE - 1] ^= 0x80;
            }
            src[s] = buf[s];
        }
    }
    return last;
}

/* SHAKE128 of W rows at once (rows[s] for lane s; a group shorter than W
 * repeats its last row in the spare lanes, whose output is dropped).  The
 * state stays in 25 values of T, lane s of stream s in element s, from the
 * first absorbed block to the last squeezed one. */
#define SHAKE_GROUP(NAME, T, W, RCV, ATTR)                                                  \
    ATTR static void NAME(const xof_seg *segs, int nsegs, ptrdiff_t msg_len,               \
                          const ptrdiff_t *rows, int nrows, unsigned char *out,            \
                          ptrdiff_t out_len) {                                             \
        T A[25], E[25];                                                                    \
        unsigned char buf[W][RATE];                                                        \
        const unsigned char *src[W];                                                       \
        memset(A, 0, sizeof A);                                                            \
        for (ptrdiff_t pos = 0;; pos += RATE) {                                            \
            int last = next_blocks(segs, nsegs, msg_len, pos, rows, nrows, W, buf, src);   \
            for (int j = 0; j < RATE_WORDS; j++) {                                         \
                u64 lane[W];                                                               \
                for (int s = 0; s < W; s++) lane[s] = load_le64(src[s] + 8 * j);           \
                T v;                                                                       \
                memcpy(&v, lane, sizeof v);                                                \
                A[j] ^= v;                                                                 \
            }                                                                              \
            KECCAK_ROUNDS(T, A, E, RCV);                                                      \
            if (last) break;                                                               \
        }                                                                                  \
        for (ptrdiff_t done = 0; done < out_len;) {                                        \
            ptrdiff_t take = out_len - done < RATE ? out_len - done : RATE;                \
            u64 words[RATE_WORDS][W];                                                      \
            memcpy(words, A, sizeof words);                                                \
            for (int s = 0; s < nrows; s++) {                                              \
                unsigned char *o = out + rows[s] * out_len + done;                         \
                ptrdiff_t j = 0;                                                           \
                for (; 8 * j + 8 <= take; j++) store_le64(o + 8 * j, words[j][s]);         \
                if (8 * j < take) {                                                        \
                    unsigned char tail[8];                                                 \
                    store_le64(tail, words[j][s]);                                         \
                    memcpy(o + 8 * j, tail, (size_t)(take - 8 * j));                       \
                }                                                                          \
            }                                                                              \
            done += take;                                                                  \
            if (done < out_len) KECCAK_ROUNDS(T, A, E, RCV);                                  \
        }                                                                                  \
    }

#define RC_SCALAR(c) (c)
SHAKE_GROUP(shake_group1, u64, 1, RC_SCALAR, )

#ifdef HAVE_X86_PATHS
#define RC_V4(c) ((v4){(c), (c), (c), (c)})
SHAKE_GROUP(shake_group4, v4, 4, RC_V4, __attribute__((target("avx2"))))
#define RC_V8(c) ((v8){(c), (c), (c), (c), (c), (c), (c), (c)})
SHAKE_GROUP(shake_group8, v8, 8, RC_V8, __attribute__((target("avx512f"))))
#endif

void shake128_rows(const xof_seg *segs, int nsegs, ptrdiff_t rows, unsigned char *out,
                   ptrdiff_t out_len) {
    ptrdiff_t msg_len = 0;
    for (int i = 0; i < nsegs; i++) msg_len += segs[i].width;
    int width = use_width;
    ptrdiff_t idx[MAXW];
    for (ptrdiff_t r = 0; r < rows; r += width) {
        int n = rows - r < width ? (int)(rows - r) : width;
        for (int s = 0; s < n; s++) idx[s] = r + s;
        /* a short tail goes through the narrowest width that holds it */
        int w = width;
        if (w == 8 && n <= 4) w = 4;
        if (w == 4 && n == 1) w = 1;
#ifdef HAVE_X86_PATHS
        if (w == 8) {
            shake_group8(segs, nsegs, msg_len, idx, n, out, out_len);
            continue;
        }
        if (w == 4) {
            shake_group4(segs, nsegs, msg_len, idx, n, out, out_len);
            continue;
        }
#endif
        shake_group1(segs, nsegs, msg_len, idx, n, out, out_len);
    }
}
