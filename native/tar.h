/*
 * The one tar reader of native/ (tar.c), shared by snaplab-unpack (unpack.c: image layers) and
 * snaplab cp's receiving side (copy.c: untar). Both read archives that may be hostile; the reader
 * checks the format (header checksums, numbers, sizes, pax records, name lengths, the end of the
 * archive) and hands over entries whose names are as the archive gives them: where an entry may
 * go is its caller's business (both resolve every name below their root with openat2).
 *
 * Reads ustar, pax ('x'; 'g' where the caller asks) and GNU long names ('L', 'K'); refuses sparse
 * files. Memory is bounded: the input buffer, one pax body at a time (MAX_PAX) unless extended
 * attributes are kept (then up to TAR_MAX_PAX_HEADERS bodies, for the entry they precede).
 */
#ifndef SNAPLAB_TAR_H
#define SNAPLAB_TAR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define TAR_BLOCK 512
#define TAR_MAX_PATH 4096 /* an entry's name or link target, NUL included */
#define TAR_MAX_PAX (1u << 20)
#define TAR_MAX_PAX_HEADERS 8
#define TAR_MAX_XATTRS 64
#define TAR_MAX_SIZE (1ull << 62) /* past this a size is corrupt (and would wrap when padded) */
#define TAR_MAX_ID 0xfffffffeull
#define TAR_CHUNK (256u * 1024)

struct tar_xattr {
	const char *name; /* without SCHILY.xattr. */
	const char *value;
	size_t len;
};

struct tar_entry {
	char type; /* the header's; '\0' (old archives' regular file) is given as '0' */
	char name[TAR_MAX_PATH]; /* pax path, else GNU long name, else ustar prefix/name */
	char link[TAR_MAX_PATH]; /* pax linkpath, else GNU long link, else the header's; set for '1' and '2' */
	mode_t mode; /* the permission bits (07777) */
	uid_t uid;
	gid_t gid;
	struct timespec mtime;
	uint64_t size; /* of its data (pax size, else the header's) */
	unsigned char header[TAR_BLOCK]; /* for fields only some callers read (device numbers: tar_num) */
	struct tar_xattr xattrs[TAR_MAX_XATTRS]; /* with keep_xattrs, valid until the next tar_next */
	int nxattrs;
};

struct tar_pax {
	int has_path, has_link, has_size, has_uid, has_gid, has_mtime;
	char path[TAR_MAX_PATH], link[TAR_MAX_PATH];
	uint64_t size, uid, gid;
	struct timespec mtime;
	struct tar_xattr xattrs[TAR_MAX_XATTRS];
	int nxattrs;
};

struct tar_reader {
	/* set by the caller (the rest zeroed) */
	int fd;
	/* how an error ends the reading: CODE (BAD_TAR, UNSAFE_PATH or IO) and a message; must not
	 * return (tar_fail aborts if it does) */
	void (*fail)(const char *code, const char *msg);
	/* the input, when not read(2) from fd (the fuzz harness); returns as read(2) does */
	ssize_t (*read)(struct tar_reader *r, void *buf, size_t n);
	void *ctx;
	int global_pax; /* 'g' headers give uid, gid and mtime to every following entry (GNU tar); else skipped */
	int keep_xattrs; /* SCHILY.xattr.* records are given with their entry */
	int need_end; /* the archive must have its end-of-archive block (else EOF at a header ends it) */

	/* the reader's */
	unsigned char buf[TAR_CHUNK];
	size_t pos, len;
	uint64_t seen; /* bytes read */
	uint64_t data; /* the current entry's data not yet read */
	uint64_t pad; /* then its padding */
	int zeros; /* end-of-archive blocks seen */
	int ended;
	struct tar_pax xpax, gpax; /* the next entry's ('x'), every following entry's ('g') */
	char long_name[TAR_MAX_PATH + 1], long_link[TAR_MAX_PATH + 1];
	char *bodies[TAR_MAX_PAX_HEADERS]; /* the pax bodies the entry's xattrs point into */
	int nbodies;
	char *body; /* a pax body being read that is not kept */
};

/* The next entry into e: 1, or 0 at the end of the archive. What the previous entry's data had
 * left unread is skipped. */
int tar_next(struct tar_reader *r, struct tar_entry *e);
/* Some of the current entry's data, in place in the reader's buffer: its length (0 when all is
 * read), *p pointing at it. */
size_t tar_data(struct tar_reader *r, const unsigned char **p);
/* After the end: what follows (record padding, a writer's trailing bytes) read and dropped, up to
 * limit bytes, so that a writer is not cut off while it finishes. */
void tar_drain(struct tar_reader *r, uint64_t limit);
/* A numeric header field (octal, or GNU base-256); what names it in a message. */
uint64_t tar_num(struct tar_reader *r, const unsigned char *f, size_t n, const char *what);
/* Frees what the reader holds (the pax bodies of the last entry); after an error too. */
void tar_done(struct tar_reader *r);

#endif
