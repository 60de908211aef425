/*
 * libFuzzer harness: the one tar reader (tar.c), which reads every image layer (snaplab-unpack)
 * and every archive `snaplab cp` receives, out of a machine too (untar --untrusted).
 *
 * Input: one flags byte, then the archive.
 *   bit 0  the checksum of every 512-byte block of the archive is made right before it is read
 *          (headers are always at multiples of 512: a mutated field behind the checksum is reached)
 *   bit 1  cp's options (global pax headers taken, the end-of-archive block required, no
 *          extended attributes), else unpack's
 *   2-4    the most one read(2) gives: 64 << n bytes (7: all that is left), so that headers, pax
 *          bodies and data cross the reader's refills
 *
 * tar.c is compiled into this file unchanged; its errors longjmp back here (the helpers exit).
 * Each archive is read twice, its entries' data read to the end the first time and left for the
 * reader to skip the second: checked beyond what ASan and UBSan see (abort() on a failure), both
 * give the same entries and the same end (an error, or the end of the archive); every entry's
 * fields are in the ranges tar.h promises; the data handed out is its entry's size, never more
 * than the input had; no record type ('x', 'g', 'L', 'K', 'S') is handed out as an entry.
 */
#include "../tar.c"

#include <setjmp.h>

static jmp_buf failed;
static const char *fail_code;

static void on_fail(const char *code, const char *msg)
{
	(void)msg;
	fail_code = code;
	longjmp(failed, 1);
}

static const uint8_t *input;
static size_t input_len, input_at, read_max;

static ssize_t from_input(struct tar_reader *r, void *buf, size_t n)
{
	(void)r;
	size_t k = input_len - input_at;
	if (k > n)
		k = n;
	if (k > read_max)
		k = read_max;
	memcpy(buf, input + input_at, k);
	input_at += k;
	return (ssize_t)k;
}

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 1099511628211ull;
	return h;
}

static struct tar_reader reader;
static volatile uint64_t sink;
static struct tar_entry entry;

/* the entries' digest and how the reading ended */
static uint64_t read_all(int flags, int read_data)
{
	struct tar_reader *r = &reader;
	memset(r, 0, sizeof *r);
	r->fd = -1;
	r->fail = on_fail;
	r->read = from_input;
	r->global_pax = r->need_end = (flags & 2) != 0;
	r->keep_xattrs = !(flags & 2);
	input_at = 0;
	fail_code = NULL;
	uint64_t h = 1469598103934665603ull;
	volatile uint64_t digest = h; /* kept across the longjmp */
	if (setjmp(failed) == 0) {
		while (tar_next(r, &entry)) {
			struct tar_entry *e = &entry;
			if (e->type && strchr("xgLKS", e->type))
				abort();
			size_t nl = strnlen(e->name, TAR_MAX_PATH), ll = strnlen(e->link, TAR_MAX_PATH);
			if (nl >= TAR_MAX_PATH || ll >= TAR_MAX_PATH)
				abort();
			if ((e->type == '1' || e->type == '2') && !ll)
				abort();
			if (e->mode > 07777 || e->uid > TAR_MAX_ID || e->gid > TAR_MAX_ID || e->size > TAR_MAX_SIZE)
				abort();
			if (e->nxattrs < 0 || e->nxattrs > TAR_MAX_XATTRS || (e->nxattrs && (flags & 2)))
				abort();
			for (int i = 0; i < e->nxattrs; i++)
				if (!e->xattrs[i].name || !e->xattrs[i].value ||
				    e->xattrs[i].value[e->xattrs[i].len] != 0)
					abort();
			uint64_t d = digest;
			d = mix(d, &e->type, 1);
			d = mix(d, e->name, nl);
			d = mix(d, e->link, ll);
			d = mix(d, &e->size, sizeof e->size);
			d = mix(d, &e->mode, sizeof e->mode);
			d = mix(d, &e->uid, sizeof e->uid);
			d = mix(d, &e->gid, sizeof e->gid);
			d = mix(d, &e->mtime.tv_sec, sizeof e->mtime.tv_sec);
			d = mix(d, &e->mtime.tv_nsec, sizeof e->mtime.tv_nsec);
			for (int i = 0; i < e->nxattrs; i++)
				d = mix(d, e->xattrs[i].value, e->xattrs[i].len);
			digest = d;
			uint64_t got = 0;
			if (read_data) {
				const unsigned char *p;
				for (size_t k; (k = tar_data(r, &p)) > 0;) {
					sink = mix(sink, p, k); /* every byte handed out is read (ASan) */
					got += k;
				}
				if (got != e->size || got > input_len)
					abort();
			}
		}
		tar_drain(r, 1u << 20);
		digest = mix(digest, "end", 3);
	} else {
		digest = mix(digest, fail_code, strlen(fail_code));
	}
	tar_done(r);
	return digest;
}

/* the checksum of each block made right, as a writer computes it (octal, NUL, space) */
static void fix_checksums(uint8_t *a, size_t n)
{
	for (size_t off = 0; off + TAR_BLOCK <= n; off += TAR_BLOCK) {
		uint8_t *h = a + off;
		unsigned sum = 0;
		for (int i = 0; i < TAR_BLOCK; i++)
			sum += (i >= 148 && i < 156) ? ' ' : h[i];
		if (sum == 8 * ' ')
			continue; /* an end-of-archive block stays zeros */
		snprintf((char *)h + 148, 8, "%06o", sum & 0777777);
		h[155] = ' ';
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int flags = data[0];
	uint8_t *archive = malloc(size - 1 + 1);
	if (!archive)
		return 0;
	memcpy(archive, data + 1, size - 1);
	if (flags & 1)
		fix_checksums(archive, size - 1);
	input = archive;
	input_len = size - 1;
	int shift = (flags >> 2) & 7;
	read_max = shift == 7 ? SIZE_MAX : (size_t)64 << shift;
	uint64_t with_data = read_all(flags, 1);
	uint64_t skipped = read_all(flags, 0);
	if (with_data != skipped)
		abort();
	free(archive);
	return 0;
}
