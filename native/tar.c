/*
 * The one tar reader (tar.h says what it reads and for whom). It was two, in unpack.c and copy.c,
 * each with its own header, pax and long-name code; they had drifted (copy refused a base-256
 * checksum, a GNU long name of 4095 bytes and a malformed pax mtime; unpack took them), and
 * neither was fuzzed. Where they differed, the stricter check was kept, except that a long name
 * may fill TAR_MAX_PATH with its NUL as GNU tar writes it (fuzz/tar_fuzz.c drives this file).
 */
#define _GNU_SOURCE
#include "tar.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void tar_fail(struct tar_reader *r, const char *code, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 3, 4)));
static void tar_fail(struct tar_reader *r, const char *code, const char *fmt, ...)
{
	char msg[2 * TAR_MAX_PATH];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	r->fail(code, msg);
	abort();
}

static uint64_t padded(uint64_t size)
{
	return (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
}

/* ---- input: one buffer; data is handed out from it in place ---- */

/* bytes available, reading when the buffer is empty; 0 at the end of the input */
static size_t fill(struct tar_reader *r)
{
	if (r->pos < r->len)
		return r->len - r->pos;
	r->pos = r->len = 0;
	for (;;) {
		ssize_t n = r->read ? r->read(r, r->buf, sizeof r->buf) : read(r->fd, r->buf, sizeof r->buf);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			tar_fail(r, "IO", "reading the archive: %s", strerror(errno));
		r->len = (size_t)n;
		r->seen += (uint64_t)n;
		return r->len;
	}
}

static size_t some(struct tar_reader *r, uint64_t max)
{
	size_t n = fill(r);
	if (!n)
		tar_fail(r, "BAD_TAR", "the archive ends in the middle of an entry (truncated)");
	return n < max ? n : (size_t)max;
}

static void take(struct tar_reader *r, void *dst, size_t n)
{
	unsigned char *d = dst;
	while (n > 0) {
		size_t k = some(r, n);
		memcpy(d, r->buf + r->pos, k);
		r->pos += k;
		d += k;
		n -= k;
	}
}

static void skip(struct tar_reader *r, uint64_t n)
{
	while (n > 0) {
		size_t k = some(r, n);
		r->pos += k;
		n -= k;
	}
}

/* ---- header fields ---- */

uint64_t tar_num(struct tar_reader *r, const unsigned char *f, size_t n, const char *what)
{
	if (f[0] & 0x80) { /* base-256 (GNU) */
		if (f[0] != 0x80)
			tar_fail(r, "BAD_TAR", "the archive has a negative or oversized %s in a header", what);
		uint64_t v = 0;
		for (size_t i = 1; i < n; i++) {
			if (v >> 56)
				tar_fail(r, "BAD_TAR", "the archive has an oversized %s in a header", what);
			v = (v << 8) | f[i];
		}
		return v;
	}
	uint64_t v = 0;
	size_t i = 0;
	while (i < n && (f[i] == ' ' || f[i] == 0))
		i++;
	for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
		if (v >> 60)
			tar_fail(r, "BAD_TAR", "the archive has an oversized %s in a header", what);
		v = v * 8 + (uint64_t)(f[i] - '0');
	}
	for (; i < n; i++)
		if (f[i] != ' ' && f[i] != 0)
			tar_fail(r, "BAD_TAR", "a header's %s field is not a number (not a tar archive, or corrupt)",
				 what);
	return v;
}

/* A header's checksum as writers compute it: its bytes with the checksum field taken as spaces,
 * summed unsigned (POSIX) or signed (some old tars). A header is good if either matches. */
static int checksum_ok(struct tar_reader *r, const unsigned char *h)
{
	if (h[148] & 0x80)
		return 0; /* never base-256: random bytes, not a header */
	uint64_t want = tar_num(r, h + 148, 8, "checksum");
	uint64_t u = 0;
	int64_t s = 0;
	for (int i = 0; i < TAR_BLOCK; i++) {
		unsigned char c = (i >= 148 && i < 156) ? ' ' : h[i];
		u += c;
		s += (signed char)c;
	}
	return u == want || (uint64_t)s == want;
}

/* ---- pax records and GNU long names ---- */

/* decimal digits only (strtoull would take "-1" and wrap it) */
static uint64_t pax_num(struct tar_reader *r, const char *v, const char *what, uint64_t max)
{
	uint64_t n = 0;
	if (!*v)
		tar_fail(r, "BAD_TAR", "a pax %s record is empty", what);
	for (const char *c = v; *c; c++) {
		if (*c < '0' || *c > '9' || n > max / 10)
			tar_fail(r, "BAD_TAR", "a pax %s record is not a number in range", what);
		n = n * 10 + (uint64_t)(*c - '0');
	}
	if (n > max)
		tar_fail(r, "BAD_TAR", "a pax %s record is not a number in range", what);
	return n;
}

/* [-]SECONDS[.FRACTION] */
static struct timespec pax_time(struct tar_reader *r, const char *v)
{
	struct timespec t = { 0, 0 };
	int neg = *v == '-';
	const char *c = v + neg;
	if (*c < '0' || *c > '9')
		tar_fail(r, "BAD_TAR", "a pax mtime record is not a time");
	for (; *c >= '0' && *c <= '9'; c++) {
		if (t.tv_sec > (INT64_MAX - 9) / 10)
			tar_fail(r, "BAD_TAR", "a pax mtime record is out of range");
		t.tv_sec = t.tv_sec * 10 + (*c - '0');
	}
	if (*c == '.') {
		int d = 0;
		for (c++; *c >= '0' && *c <= '9'; c++, d++)
			if (d < 9)
				t.tv_nsec = t.tv_nsec * 10 + (*c - '0');
		for (; d < 9; d++)
			t.tv_nsec *= 10;
	}
	if (*c)
		tar_fail(r, "BAD_TAR", "a pax mtime record is not a time");
	if (neg) {
		t.tv_sec = -t.tv_sec;
		if (t.tv_nsec) {
			t.tv_sec--;
			t.tv_nsec = 1000000000 - t.tv_nsec;
		}
	}
	return t;
}

static void pax_text(struct tar_reader *r, char *to, const char *key, const char *val, size_t vlen)
{
	if (strlen(val) != vlen)
		tar_fail(r, "BAD_TAR", "a pax %s record has a NUL byte in it", key);
	if (vlen >= TAR_MAX_PATH)
		tar_fail(r, "UNSAFE_PATH", "a pax %s record is longer than %d bytes", key, TAR_MAX_PATH - 1);
	memcpy(to, val, vlen + 1);
}

static void pax_record(struct tar_reader *r, char *key, char *val, size_t vlen, struct tar_pax *p, int global)
{
	/* a global path, link or size would name every entry alike: only owners and times are taken */
	if (strcmp(key, "path") == 0 && !global) {
		pax_text(r, p->path, key, val, vlen);
		p->has_path = 1;
	} else if (strcmp(key, "linkpath") == 0 && !global) {
		pax_text(r, p->link, key, val, vlen);
		p->has_link = 1;
	} else if (strcmp(key, "size") == 0 && !global) {
		p->size = pax_num(r, val, key, TAR_MAX_SIZE);
		p->has_size = 1;
	} else if (strcmp(key, "uid") == 0) {
		p->uid = pax_num(r, val, key, TAR_MAX_ID);
		p->has_uid = 1;
	} else if (strcmp(key, "gid") == 0) {
		p->gid = pax_num(r, val, key, TAR_MAX_ID);
		p->has_gid = 1;
	} else if (strcmp(key, "mtime") == 0) {
		p->mtime = pax_time(r, val);
		p->has_mtime = 1;
	} else if (strncmp(key, "SCHILY.xattr.", 13) == 0 && r->keep_xattrs && !global) {
		if (p->nxattrs == TAR_MAX_XATTRS)
			tar_fail(r, "BAD_TAR", "an entry has more than %d extended attributes", TAR_MAX_XATTRS);
		p->xattrs[p->nxattrs++] = (struct tar_xattr){ key + 13, val, vlen };
	} else if (strncmp(key, "GNU.sparse.", 11) == 0) {
		tar_fail(r, "BAD_TAR",
			 "sparse files (GNU.sparse) are not supported; make the archive without --sparse");
	}
}

static void read_pax(struct tar_reader *r, uint64_t size, struct tar_pax *p, int global)
{
	if (size > TAR_MAX_PAX)
		tar_fail(r, "BAD_TAR", "a pax header of %" PRIu64 " bytes is over the limit of %u", size, TAR_MAX_PAX);
	/* extended attributes point into the body: it is kept until the entry has been handed over */
	int keep = r->keep_xattrs && !global;
	if (keep && r->nbodies == TAR_MAX_PAX_HEADERS)
		tar_fail(r, "BAD_TAR", "more than %d pax headers before one entry", TAR_MAX_PAX_HEADERS);
	char *buf = malloc((size_t)size + 1);
	if (!buf)
		tar_fail(r, "IO", "out of memory");
	if (keep)
		r->bodies[r->nbodies++] = buf;
	else
		r->body = buf; /* freed by tar_done if an error stops the reading (the fuzz harness goes on) */
	take(r, buf, (size_t)size);
	skip(r, padded(size) - size);
	buf[size] = 0;
	size_t len = (size_t)size, off = 0;
	while (off < len) {
		char *rec = buf + off;
		char *sp = memchr(rec, ' ', len - off);
		if (!sp)
			tar_fail(r, "BAD_TAR", "a pax record has no length");
		size_t n = 0;
		for (char *c = rec; c < sp; c++) {
			if (*c < '0' || *c > '9' || n > TAR_MAX_PAX)
				tar_fail(r, "BAD_TAR", "a pax record's length is not a number");
			n = n * 10 + (size_t)(*c - '0');
		}
		if (n <= (size_t)(sp - rec) + 2 || n > len - off || rec[n - 1] != '\n')
			tar_fail(r, "BAD_TAR", "a pax record's length does not fit");
		char *kv = sp + 1, *end = rec + n - 1;
		char *eq = memchr(kv, '=', (size_t)(end - kv));
		if (!eq)
			tar_fail(r, "BAD_TAR", "a pax record has no '='");
		*eq = 0;
		*end = 0;
		pax_record(r, kv, eq + 1, (size_t)(end - eq - 1), p, global);
		off += n;
	}
	if (!keep) {
		free(buf);
		r->body = NULL;
	}
}

/* GNU writes the name with its NUL: TAR_MAX_PATH bytes may hold a name of TAR_MAX_PATH - 1 */
static void read_long(struct tar_reader *r, uint64_t size, char *to, const char *what)
{
	if (size > TAR_MAX_PATH)
		tar_fail(r, "BAD_TAR", "%s of %" PRIu64 " bytes is over the limit of %d", what, size, TAR_MAX_PATH);
	take(r, to, (size_t)size);
	to[size] = 0;
	skip(r, padded(size) - size);
}

static void forget_entry(struct tar_reader *r)
{
	memset(&r->xpax, 0, sizeof r->xpax);
	r->long_name[0] = r->long_link[0] = 0;
}

void tar_done(struct tar_reader *r)
{
	free(r->body);
	r->body = NULL;
	while (r->nbodies > 0)
		free(r->bodies[--r->nbodies]);
}

/* ---- entries ---- */

static void make_entry(struct tar_reader *r, const unsigned char *h, uint64_t size, struct tar_entry *e)
{
	char name[2 * TAR_MAX_PATH];
	int ustar = memcmp(h + 257, "ustar\0", 6) == 0; /* POSIX: a prefix field; GNU's "ustar  " has none */
	if (r->xpax.has_path)
		snprintf(name, sizeof name, "%s", r->xpax.path);
	else if (r->long_name[0])
		snprintf(name, sizeof name, "%s", r->long_name);
	else if (ustar && h[345])
		snprintf(name, sizeof name, "%.155s/%.100s", (const char *)h + 345, (const char *)h);
	else
		snprintf(name, sizeof name, "%.100s", (const char *)h);
	size_t n = strlen(name);
	if (n >= TAR_MAX_PATH)
		tar_fail(r, "UNSAFE_PATH", "an entry's name is longer than %d bytes", TAR_MAX_PATH - 1);
	memcpy(e->name, name, n + 1);
	e->type = h[156] ? (char)h[156] : '0';
	if (r->xpax.has_link)
		snprintf(e->link, sizeof e->link, "%s", r->xpax.link);
	else if (r->long_link[0]) {
		size_t k = strlen(r->long_link);
		if (k >= TAR_MAX_PATH)
			tar_fail(r, "UNSAFE_PATH", "%s: its link target is longer than %d bytes", e->name,
				 TAR_MAX_PATH - 1);
		memcpy(e->link, r->long_link, k + 1);
	} else
		snprintf(e->link, sizeof e->link, "%.100s", (const char *)h + 157);
	if ((e->type == '1' || e->type == '2') && !e->link[0])
		tar_fail(r, "BAD_TAR", "the link %s has no target", e->name);
	e->mode = (mode_t)tar_num(r, h + 100, 8, "mode") & 07777;
	const struct tar_pax *x = &r->xpax, *g = &r->gpax;
	uint64_t uid = x->has_uid ? x->uid : g->has_uid ? g->uid : tar_num(r, h + 108, 8, "uid");
	uint64_t gid = x->has_gid ? x->gid : g->has_gid ? g->gid : tar_num(r, h + 116, 8, "gid");
	if (uid > TAR_MAX_ID || gid > TAR_MAX_ID)
		tar_fail(r, "BAD_TAR", "%s has an owner out of range", e->name);
	e->uid = (uid_t)uid;
	e->gid = (gid_t)gid;
	e->size = x->has_size ? x->size : size;
	if (x->has_mtime)
		e->mtime = x->mtime;
	else if (g->has_mtime)
		e->mtime = g->mtime;
	else
		e->mtime = (struct timespec){ (time_t)tar_num(r, h + 136, 12, "mtime"), 0 };
	memcpy(e->header, h, TAR_BLOCK);
	e->nxattrs = x->nxattrs;
	memcpy(e->xattrs, x->xattrs, (size_t)x->nxattrs * sizeof *x->xattrs);
}

/* EOF where a header would begin */
static int at_eof(struct tar_reader *r)
{
	if (!r->need_end || r->zeros)
		return 0; /* one end block only: taken, as GNU tar takes it */
	if (!r->seen)
		tar_fail(r, "BAD_TAR", "the archive is empty");
	tar_fail(r, "BAD_TAR", "the archive ends without its end-of-archive blocks (truncated)");
}

int tar_next(struct tar_reader *r, struct tar_entry *e)
{
	unsigned char h[TAR_BLOCK];
	if (r->ended)
		return 0;
	skip(r, r->data + r->pad);
	r->data = r->pad = 0;
	tar_done(r);
	for (;;) {
		if (!fill(r)) {
			r->ended = 1;
			return at_eof(r);
		}
		take(r, h, TAR_BLOCK);
		int zero = 1;
		for (int i = 0; i < TAR_BLOCK && zero; i++)
			zero = h[i] == 0;
		if (zero) {
			if (++r->zeros == 2) {
				r->ended = 1;
				return 0;
			}
			continue;
		}
		if (r->zeros)
			tar_fail(r, "BAD_TAR", "a header follows an end-of-archive block");
		if (!checksum_ok(r, h))
			tar_fail(r, "BAD_TAR", "a header's checksum is wrong (not a tar archive, or corrupt)");
		char type = (char)h[156];
		uint64_t size = tar_num(r, h + 124, 12, "size");
		if (size > TAR_MAX_SIZE)
			tar_fail(r, "BAD_TAR", "a header's size is out of range");
		if (type == 'x' || (type == 'g' && r->global_pax)) {
			read_pax(r, size, type == 'x' ? &r->xpax : &r->gpax, type == 'g');
			continue;
		}
		if (type == 'g') { /* nothing in it changes how this caller applies entries */
			skip(r, padded(size));
			continue;
		}
		if (type == 'L' || type == 'K') {
			read_long(r, size, type == 'L' ? r->long_name : r->long_link,
				  type == 'L' ? "a long name" : "a long link name");
			continue;
		}
		if (type == 'S')
			tar_fail(r, "BAD_TAR", "sparse files are not supported; make the archive without --sparse");
		make_entry(r, h, size, e);
		r->data = e->size;
		r->pad = padded(e->size) - e->size;
		forget_entry(r);
		return 1;
	}
}

size_t tar_data(struct tar_reader *r, const unsigned char **p)
{
	if (!r->data)
		return 0;
	size_t k = some(r, r->data);
	*p = r->buf + r->pos;
	r->pos += k;
	r->data -= k;
	return k;
}

void tar_drain(struct tar_reader *r, uint64_t limit)
{
	uint64_t dropped = r->len - r->pos;
	r->pos = r->len;
	while (dropped < limit) {
		size_t n = fill(r);
		if (!n)
			break;
		dropped += n;
		r->pos = r->len;
	}
}
