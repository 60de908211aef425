#include "frame.h"

#include <stdlib.h>
#include <string.h>

uint8_t *buf_reserve(struct buf *b, size_t n)
{
	/* a buf not allocated yet allocates even for n = 0: NULL + 0 is undefined behaviour, and the
	 * NULL it gave read as out of memory (the relay's buf_append of nothing after HELLO did it) */
	if (b->data && b->cap - b->len >= n)
		return b->data + b->len;
	/* Compact first: cheaper than growing when most of the queue has been consumed. */
	if (b->off > 0) {
		memmove(b->data, b->data + b->off, b->len - b->off);
		b->len -= b->off;
		b->off = 0;
		if (b->cap - b->len >= n)
			return b->data + b->len;
	}
	size_t cap = b->cap ? b->cap : 4096;
	while (cap - b->len < n)
		cap *= 2;
	uint8_t *d = realloc(b->data, cap);
	if (!d)
		return NULL;
	b->data = d;
	b->cap = cap;
	return d + b->len;
}

void buf_consume(struct buf *b, size_t n)
{
	b->off += n;
	if (b->off >= b->len) {
		b->off = b->len = 0;
		/* Give memory back after a big transfer (e.g. a 64 MiB file). */
		if (b->cap > (1u << 20)) {
			free(b->data);
			b->data = NULL;
			b->cap = 0;
		}
	}
}

void buf_free(struct buf *b)
{
	free(b->data);
	b->data = NULL;
	b->off = b->len = b->cap = 0;
}

int buf_append(struct buf *b, const void *p, size_t n)
{
	uint8_t *d = buf_reserve(b, n);
	if (!d)
		return -1;
	if (n)
		memcpy(d, p, n);
	b->len += n;
	return 0;
}

long frame_parse(const uint8_t *p, size_t n, struct frame *f)
{
	if (n < FRAME_HDR)
		return 0;
	f->len = get_u32(p);
	f->type = get_u16(p + 4);
	f->flags = get_u16(p + 6);
	f->id = get_u32(p + 8);
	if (f->len > FRAME_MAX_PAYLOAD)
		return -1;
	if (n - FRAME_HDR < f->len)
		return 0;
	f->payload = p + FRAME_HDR;
	return (long)(FRAME_HDR + f->len);
}

long frame_begin(struct buf *b, uint16_t type, uint32_t id)
{
	uint8_t *h = buf_reserve(b, FRAME_HDR);
	if (!h)
		return -1;
	put_u32(h, 0);
	put_u16(h + 4, type);
	put_u16(h + 6, 0);
	put_u32(h + 8, id);
	long off = (long)b->len;
	b->len += FRAME_HDR;
	return off;
}

void frame_end(struct buf *b, long off)
{
	put_u32(b->data + off, (uint32_t)(b->len - (size_t)off - FRAME_HDR));
}

int frame_put(struct buf *b, uint16_t type, uint32_t id, const void *payload, size_t n)
{
	uint8_t *h = buf_reserve(b, FRAME_HDR + n);
	if (!h)
		return -1;
	put_u32(h, (uint32_t)n);
	put_u16(h + 4, type);
	put_u16(h + 6, 0);
	put_u32(h + 8, id);
	if (n)
		memcpy(h + FRAME_HDR, payload, n);
	b->len += FRAME_HDR + n;
	return 0;
}

int frame_error(struct buf *b, uint32_t id, int err, const char *msg)
{
	size_t m = strlen(msg);
	uint8_t *h = buf_reserve(b, FRAME_HDR + 4 + m);
	if (!h)
		return -1;
	put_u32(h, (uint32_t)(4 + m));
	put_u16(h + 4, T_ERROR);
	put_u16(h + 6, 0);
	put_u32(h + 8, id);
	put_u32(h + 12, (uint32_t)err);
	memcpy(h + 16, msg, m);
	b->len += FRAME_HDR + 4 + m;
	return 0;
}

const uint8_t *rd_bytes(struct rd *r, size_t n)
{
	if (r->bad || r->n < n) {
		r->bad = 1;
		return NULL;
	}
	const uint8_t *p = r->p;
	r->p += n;
	r->n -= n;
	return p;
}

uint8_t rd_u8(struct rd *r)
{
	const uint8_t *p = rd_bytes(r, 1);
	return p ? p[0] : 0;
}

uint32_t rd_u32(struct rd *r)
{
	const uint8_t *p = rd_bytes(r, 4);
	return p ? get_u32(p) : 0;
}

uint64_t rd_u64(struct rd *r)
{
	const uint8_t *p = rd_bytes(r, 8);
	return p ? get_u64(p) : 0;
}
