/*
 * AES-128 with AES-NI for the native cores: the key schedule and π over n
 * blocks under explicit round keys, 8 blocks at a time so the AES units stay
 * busy.  Included by mpc/_gc.c (one fixed key) and vdaf/_sparse.c (a key per
 * report).  Compile with -maes -msse4.1.
 */
#ifndef SVTAGG_AESNI_H
#define SVTAGG_AESNI_H
#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>
#include <wmmintrin.h>

typedef __m128i block;

#define EXPAND(k, rcon)                                                   \
    do {                                                                  \
        block t_ = _mm_aeskeygenassist_si128(k, rcon);                    \
        t_ = _mm_shuffle_epi32(t_, 0xff);                                 \
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));                       \
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));                       \
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));                       \
        k = _mm_xor_si128(k, t_);                                         \
    } while (0)

static void expand_key(const uint8_t key[16], block rk[11]) {
    block k = _mm_loadu_si128((const block *)key);
    rk[0] = k;
    EXPAND(k, 0x01); rk[1] = k;
    EXPAND(k, 0x02); rk[2] = k;
    EXPAND(k, 0x04); rk[3] = k;
    EXPAND(k, 0x08); rk[4] = k;
    EXPAND(k, 0x10); rk[5] = k;
    EXPAND(k, 0x20); rk[6] = k;
    EXPAND(k, 0x40); rk[7] = k;
    EXPAND(k, 0x80); rk[8] = k;
    EXPAND(k, 0x1b); rk[9] = k;
    EXPAND(k, 0x36); rk[10] = k;
}

/* AES under `round_keys` over n blocks in place, 8 at a time. */
static inline void aes_n_keyed(const block *round_keys, block *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        block b0 = _mm_xor_si128(x[i + 0], round_keys[0]);
        block b1 = _mm_xor_si128(x[i + 1], round_keys[0]);
        block b2 = _mm_xor_si128(x[i + 2], round_keys[0]);
        block b3 = _mm_xor_si128(x[i + 3], round_keys[0]);
        block b4 = _mm_xor_si128(x[i + 4], round_keys[0]);
        block b5 = _mm_xor_si128(x[i + 5], round_keys[0]);
        block b6 = _mm_xor_si128(x[i + 6], round_keys[0]);
        block b7 = _mm_xor_si128(x[i + 7], round_keys[0]);
        for (int r = 1; r < 10; r++) {
            block k = round_keys[r];
            b0 = _mm_aesenc_si128(b0, k); b1 = _mm_aesenc_si128(b1, k);
            b2 = _mm_aesenc_si128(b2, k); b3 = _mm_aesenc_si128(b3, k);
            b4 = _mm_aesenc_si128(b4, k); b5 = _mm_aesenc_si128(b5, k);
            b6 = _mm_aesenc_si128(b6, k); b7 = _mm_aesenc_si128(b7, k);
        }
        block k = round_keys[10];
        x[i + 0] = _mm_aesenclast_si128(b0, k); x[i + 1] = _mm_aesenclast_si128(b1, k);
        x[i + 2] = _mm_aesenclast_si128(b2, k); x[i + 3] = _mm_aesenclast_si128(b3, k);
        x[i + 4] = _mm_aesenclast_si128(b4, k); x[i + 5] = _mm_aesenclast_si128(b5, k);
        x[i + 6] = _mm_aesenclast_si128(b6, k); x[i + 7] = _mm_aesenclast_si128(b7, k);
    }
    for (; i < n; i++) {
        block b = _mm_xor_si128(x[i], round_keys[0]);
        for (int r = 1; r < 10; r++) b = _mm_aesenc_si128(b, round_keys[r]);
        x[i] = _mm_aesenclast_si128(b, round_keys[10]);
    }
}

#endif
