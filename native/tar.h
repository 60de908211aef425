/* What the two tar readers (unpack.c for image layers, copy.c for cp) share of the format. */
#ifndef SNAPLAB_TAR_H
#define SNAPLAB_TAR_H

#include <stdint.h>

#define TAR_BLOCK 512

/* A header's checksum as writers compute it: its bytes with the checksum field taken as spaces,
 * summed unsigned (POSIX) or signed (some old tars). A header is good if either matches. */
static inline int tar_sum_matches(const unsigned char *h, uint64_t want)
{
	uint64_t u = 0;
	int64_t s = 0;
	for (int i = 0; i < TAR_BLOCK; i++) {
		unsigned char c = (i >= 148 && i < 156) ? ' ' : h[i];
		u += c;
		s += (signed char)c;
	}
	return u == want || (uint64_t)s == want;
}

#endif
