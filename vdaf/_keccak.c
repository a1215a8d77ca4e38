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

/* 24 rounds on A[25] (lane (x, y) at A[x + 5y]) of element type T.
 * theta: C[x] = xor of column x, D[x] = C[x-1] ^ rol(C[x+1], 1), A ^= D;
 * rho + pi: B[y, 2x + 3y] = rol(A[x, y], r[x, y]);
 * chi: A[x, y] = B[x, y] ^ (~B[x+1, y] & B[x+2, y]);  iota: A[0] ^= RC. */
#define KECCAK_ROUNDS(T, A, RCV)                                                           \
    do {                                                                                   \
        for (int round = 0; round < 24; round++) {                                         \
            T C0 = A[0] ^ A[5] ^ A[10] ^ A[15] ^ A[20];                                    \
            T C1 = A[1] ^ A[6] ^ A[11] ^ A[16] ^ A[21];                                    \
            T C2 = A[2] ^ A[7] ^ A[12] ^ A[17] ^ A[22];                                    \
            T C3 = A[3] ^ A[8] ^ A[13] ^ A[18] ^ A[23];                                    \
            T C4 = A[4] ^ A[9] ^ A[14] ^ A[19] ^ A[24];                                    \
            T D0 = C4 ^ ROL(C1, 1), D1 = C0 ^ ROL(C2, 1), D2 = C1 ^ ROL(C3, 1);            \
            T D3 = C2 ^ ROL(C4, 1), D4 = C3 ^ ROL(C0, 1);                                  \
            /* B[i] holds lane i of pi(rho(A)), i = x + 5y */                              \
            T B0 = A[0] ^ D0;                                                              \
            T B1 = ROL(A[6] ^ D1, 44);                                                     \
            T B2 = ROL(A[12] ^ D2, 43);                                                    \
            T B3 = ROL(A[18] ^ D3, 21);                                                    \
            T B4 = ROL(A[24] ^ D4, 14);                                                    \
            T B5 = ROL(A[3] ^ D3, 28);                                                     \
            T B6 = ROL(A[9] ^ D4, 20);                                                     \
            T B7 = ROL(A[10] ^ D0, 3);                                                     \
            T B8 = ROL(A[16] ^ D1, 45);                                                    \
            T B9 = ROL(A[22] ^ D2, 61);                                                    \
            T B10 = ROL(A[1] ^ D1, 1);                                                     \
            T B11 = ROL(A[7] ^ D2, 6);                                                     \
            T B12 = ROL(A[13] ^ D3, 25);                                                   \
            T B13 = ROL(A[19] ^ D4, 8);                                                    \
            T B14 = ROL(A[20] ^ D0, 18);                                                   \
            T B15 = ROL(A[4] ^ D4, 27);                                                    \
            T B16 = ROL(A[5] ^ D0, 36);                                                    \
            T B17 = ROL(A[11] ^ D1, 10);                                                   \
            T B18 = ROL(A[17] ^ D2, 15);                                                   \
            T B19 = ROL(A[23] ^ D3, 56);                                                   \
            T B20 = ROL(A[2] ^ D2, 62);                                                    \
            T B21 = ROL(A[8] ^ D3, 55);                                                    \
            T B22 = ROL(A[14] ^ D4, 39);                                                   \
            T B23 = ROL(A[15] ^ D0, 41);                                                   \
            T B24 = ROL(A[21] ^ D1, 2);                                                    \
            A[0] = B0 ^ (~B1 & B2) ^ RCV(RC[round]);                                       \
            A[1] = B1 ^ (~B2 & B3);                                                        \
            A[2] = B2 ^ (~B3 & B4);                                                        \
            A[3] = B3 ^ (~B4 & B0);                                                        \
            A[4] = B4 ^ (~B0 & B1);                                                        \
            A[5] = B5 ^ (~B6 & B7);                                                        \
            A[6] = B6 ^ (~B7 & B8);                                                        \
            A[7] = B7 ^ (~B8 & B9);                                                        \
            A[8] = B8 ^ (~B9 & B5);                                                        \
            A[9] = B9 ^ (~B5 & B6);                                                        \
            A[10] = B10 ^ (~B11 & B12);                                                    \
            A[11] = B11 ^ (~B12 & B13);                                                    \
            A[12] = B12 ^ (~B13 & B14);                                                    \
            A[13] = B13 ^ (~B14 & B10);                                                    \
            A[14] = B14 ^ (~B10 & B11);                                                    \
            A[15] = B15 ^ (~B16 & B17);                                                    \
            A[16] = B16 ^ (~B17 & B18);                                                    \
            A[17] = B17 ^ (~B18 & B19);                                                    \
            A[18] = B18 ^ (~B19 & B15);                                                    \
            A[19] = B19 ^ (~B15 & B16);                                                    \
            A[20] = B20 ^ (~B21 & B22);                                                    \
            A[21] = B21 ^ (~B22 & B23);                                                    \
            A[22] = B22 ^ (~B23 & B24);                                                    \
            A[23] = B23 ^ (~B24 & B20);                                                    \
            A[24] = B24 ^ (~B20 & B21);                                                    \
        }                                                                                  \
    } while (0)

/* The lane-interleaved states of W streams: word j of stream s at s + W*j. */
typedef struct {
    u64 w[25 * MAXW];
} states;

#define RC_SCALAR(c) (c)
static void permute1(states *st) {
    u64 *A = st->w;
    KECCAK_ROUNDS(u64, A, RC_SCALAR);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_X86_PATHS 1

#define RC_V4(c) ((v4){(c), (c), (c), (c)})
__attribute__((target("avx2"))) static void permute4(states *st) {
    v4 A[25];
    memcpy(A, st->w, sizeof A);
    KECCAK_ROUNDS(v4, A, RC_V4);
    memcpy(st->w, A, sizeof A);
}

#define RC_V8(c) ((v8){(c), (c), (c), (c), (c), (c), (c), (c)})
__attribute__((target("avx512f"))) static void permute8(states *st) {
    v8 A[25];
    memcpy(A, st->w, sizeof A);
    KECCAK_ROUNDS(v8, A, RC_V8);
    memcpy(st->w, A, sizeof A);
}
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

static inline u64 load_le64(const unsigned char *p) {
    u64 x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

static inline void store_le64(unsigned char *p, u64 x) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
}

/* SHAKE128 of `width` rows at once (rows[s] for lane s; a group shorter than
 * the width repeats its last row in the spare lanes, whose output is dropped). */
static void shake_group(const xof_seg *segs, int nsegs, ptrdiff_t msg_len, const ptrdiff_t *rows,
                        int nrows, int width, unsigned char *out, ptrdiff_t out_len) {
    states st;
    unsigned char block[RATE];
    void (*perm)(states *) = permute1;
#ifdef HAVE_X86_PATHS
    if (width == 4) perm = permute4;
    if (width == 8) perm = permute8;
#endif
    memset(&st, 0, sizeof st);
    ptrdiff_t pos = 0;
    for (;;) {
        ptrdiff_t take = msg_len - pos < RATE ? msg_len - pos : RATE;
        int last = take < RATE; /* the padding goes into a block with room for it */
        for (int s = 0; s < width; s++) {
            ptrdiff_t row = rows[s < nrows ? s : nrows - 1];
            gather(segs, nsegs, row, pos, block, take);
            if (last) {
                memset(block + take, 0, (size_t)(RATE - take));
                block[take] ^= 0x1F;       /* SHAKE's domain bits, then pad10*1 */
                block[RATE - 1] ^= 0x80;
            }
            for (int j = 0; j < RATE_WORDS; j++) st.w[s + width * j] ^= load_le64(block + 8 * j);
        }
        perm(&st);
        pos += take;
        if (last) break;
    }
    for (ptrdiff_t done = 0; done < out_len;) {
        ptrdiff_t take = out_len - done < RATE ? out_len - done : RATE;
        for (int s = 0; s < nrows; s++) {
            for (int j = 0; j < RATE_WORDS; j++) store_le64(block + 8 * j, st.w[s + width * j]);
            memcpy(out + rows[s] * out_len + done, block, (size_t)take);
        }
        done += take;
        if (done < out_len) perm(&st);
    }
}

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
        shake_group(segs, nsegs, msg_len, idx, n, w, out, out_len);
    }
}
