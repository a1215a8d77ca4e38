/* SHAKE128 over many equal-length messages at once (vdaf/_keccak.c). */
#ifndef SVTAGG_VDAF_KECCAK_H
#define SVTAGG_VDAF_KECCAK_H

#include <stddef.h>

/* One piece of every row's message: row r's bytes are
 * data[offset + r*stride, offset + r*stride + width) (stride 0: the same
 * bytes for every row).  A message is its pieces in order. */
typedef struct {
    const unsigned char *data;
    ptrdiff_t offset, width, stride;
} xof_seg;

/* Detect the CPU's widths; call once before shake128_rows. */
void keccak_init(void);

/* The width in use (1, 4 or 8 streams per permutation).  want: -1 to ask,
 * 0 for the widest this CPU runs, 1/4/8 to choose one; -1 if unavailable. */
int keccak_width(int want);

/* out[r*out_len, (r+1)*out_len) = SHAKE128(message of row r), r < rows. */
void shake128_rows(const xof_seg *segs, int nsegs, ptrdiff_t rows, unsigned char *out,
                   ptrdiff_t out_len);

#endif
