/*
 * snaplab cp's two ends (like docker cp), run by the host on one side and the agent binary on
 * the other, with the tar stream piped between them:
 *
 *   snaplab-agent tar [-L] SRC        SRC as a POSIX tar (ustar + pax 'x') on stdout
 *   snaplab-agent untar [--plain] DEST a tar from stdin, created at DEST
 *
 * tar: `DIR/.` (and `/`) is contents mode: the first entry is `./` (the directory itself), then
 * `./a`, `./sub/`, ... Otherwise the first entry is basename(SRC), a directory followed by
 * `NAME/x`, ... The walk never follows a symbolic link; -L follows SRC itself only. Hard links
 * (a regular file with st_nlink > 1 seen earlier by dev+ino) become type '1' entries. Sockets
 * are skipped. Exit 0; 1 when an entry could not be read (warned, skipped); 2 on a fatal error
 * (SRC missing, stdout gone).
 *
 * untar: reads with the one tar reader of native/ (tar.c), which snaplab-unpack shares. The
 * receiving side decides what DEST means from the archive's first entry (docker cp's
 * rules, see open_root). The archive may come from a hostile machine: every entry's parent is
 * resolved below the extraction root with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS) and the entry made with *at() calls on that parent, absolute names and
 * `..` are refused, nothing is opened without O_NOFOLLOW, and an existing non-directory is
 * unlinked, never written through. Exit 0; 1 after warnings (an owner or a device node that could
 * not be set up, ...); 2 on a fatal error (one line on stderr; what was written stays).
 *
 * Memory is bounded on both sides: file data is streamed in CHUNK pieces, pax bodies are capped,
 * and what grows is one small buffer per directory level (tar), the hard link table (tar) and
 * the list of directories whose times are set at the end (untar).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tar.h"

#define BLOCK 512
#define CHUNK (256u * 1024)
#define MAX_PATH 4096 /* an archive name, NUL included, on both sides */
#define OCTAL11 077777777777ull /* what a 12-byte ustar field holds */
#define OCTAL7 07777777ull /* what an 8-byte one holds */
#define DIRBUF 4096 /* getdents buffer, one per directory level being walked */
#define TRAILER_MAX (1u << 20) /* what is read and dropped after the end of the archive */
#define CHOWN_WARNINGS 10

static int status; /* 1 once a warning was printed */

/* One line on stderr; control characters in names become '?' so a name cannot forge lines. */
static void say(const char *prefix, const char *fmt, va_list ap)
{
	char msg[3 * MAX_PATH];
	vsnprintf(msg, sizeof msg, fmt, ap);
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	fprintf(stderr, "snaplab: cp: %s%s\n", prefix, msg);
}

static void fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	say("", fmt, ap);
	va_end(ap);
	exit(2);
}

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	say("warning: ", fmt, ap);
	va_end(ap);
	status = 1;
}

/* a warning that is no failure of the copy */
static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	say("warning: ", fmt, ap);
	va_end(ap);
}

static uint64_t padded(uint64_t size)
{
	return (size + BLOCK - 1) / BLOCK * BLOCK;
}

/* ================================ tar ================================ */

/* ---- output: one buffer, written when full ---- */

static unsigned char obuf[CHUNK];
static size_t olen;

static void out_flush(void)
{
	size_t off = 0;
	while (off < olen) {
		ssize_t w = write(1, obuf + off, olen - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EPIPE)
			exit(2); /* the reader went away: it has its own error to report */
		if (w < 0)
			fatal("writing the archive: %s", strerror(errno));
		off += (size_t)w;
	}
	olen = 0;
}

static void out_put(const void *p, size_t n)
{
	const unsigned char *c = p;
	while (n > 0) {
		if (olen == CHUNK)
			out_flush();
		size_t k = CHUNK - olen < n ? CHUNK - olen : n;
		memcpy(obuf + olen, c, k);
		olen += k;
		c += k;
		n -= k;
	}
}

static void out_zeros(uint64_t n)
{
	while (n > 0) {
		if (olen == CHUNK)
			out_flush();
		size_t k = CHUNK - olen < n ? CHUNK - olen : (size_t)n;
		memset(obuf + olen, 0, k);
		olen += k;
		n -= k;
	}
}

/* ---- headers ---- */

/* width-1 octal digits and a NUL; the caller has checked that v fits */
static void put_octal(unsigned char *f, size_t width, uint64_t v)
{
	f[width - 1] = 0;
	for (size_t i = width - 1; i-- > 0; v >>= 3)
		f[i] = (unsigned char)('0' + (v & 7));
}

/* name, or prefix '/' name, in the ustar fields; 0 when it does not fit there */
static int ustar_name(unsigned char *h, const char *name)
{
	size_t n = strlen(name);
	if (n <= 100) {
		memcpy(h, name, n);
		return 1;
	}
	if (n > 256)
		return 0;
	/* the first slash that leaves at most 100 bytes after it (and at least one) */
	for (size_t i = n - 101; i <= 155 && i + 1 < n; i++)
		if (name[i] == '/' && i > 0) {
			memcpy(h + 345, name, i);
			memcpy(h, name + i + 1, n - i - 1);
			return 1;
		}
	return 0;
}

static char pax[2 * MAX_PATH + 256];
static size_t paxlen;

static size_t digits(size_t n)
{
	size_t d = 1;
	while (n >= 10) {
		n /= 10;
		d++;
	}
	return d;
}

/* one "LEN key=value\n" record; LEN counts itself */
static void pax_add(const char *key, const char *val)
{
	size_t len = strlen(key) + strlen(val) + 3;
	size_t n = len + 1;
	while (n != len + digits(n))
		n = len + digits(n);
	paxlen += (size_t)snprintf(pax + paxlen, sizeof pax - paxlen, "%zu %s=%s\n", n, key, val);
}

static void pax_add_num(const char *key, long long v)
{
	char s[32];
	snprintf(s, sizeof s, "%lld", v);
	pax_add(key, s);
}

static void finish_header(unsigned char *h, char type)
{
	h[156] = (unsigned char)type;
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	memset(h + 148, ' ', 8);
	unsigned sum = 0;
	for (int i = 0; i < BLOCK; i++)
		sum += h[i];
	put_octal(h + 148, 7, sum);
	h[155] = ' ';
}

/* The header of one entry, after a pax 'x' header when a value does not fit ustar's fields.
 * uname/gname stay empty: owners are numeric, as on the machine's side. */
static void put_header(const char *name, char type, const struct stat *st, uint64_t size, const char *link)
{
	unsigned char h[BLOCK];
	memset(h, 0, sizeof h);
	paxlen = 0;
	if (!ustar_name(h, name)) {
		pax_add("path", name);
		memcpy(h, name, 100);
	}
	if (link) {
		size_t n = strlen(link);
		if (n > 100)
			pax_add("linkpath", link);
		memcpy(h + 157, link, n > 100 ? 100 : n);
	}
	put_octal(h + 100, 8, st->st_mode & 07777);
	if ((uint64_t)st->st_uid > OCTAL7)
		pax_add_num("uid", st->st_uid);
	else
		put_octal(h + 108, 8, st->st_uid);
	if ((uint64_t)st->st_gid > OCTAL7)
		pax_add_num("gid", st->st_gid);
	else
		put_octal(h + 116, 8, st->st_gid);
	if (size > OCTAL11)
		pax_add_num("size", (long long)size);
	else
		put_octal(h + 124, 12, size);
	if (st->st_mtime < 0 || (uint64_t)st->st_mtime > OCTAL11)
		pax_add_num("mtime", (long long)st->st_mtime);
	else
		put_octal(h + 136, 12, (uint64_t)st->st_mtime);
	if (type == '3' || type == '4') {
		put_octal(h + 329, 8, major(st->st_rdev) & OCTAL7);
		put_octal(h + 337, 8, minor(st->st_rdev) & OCTAL7);
	}
	finish_header(h, type);

	if (paxlen) {
		unsigned char x[BLOCK];
		memset(x, 0, sizeof x);
		memcpy(x, "././@PaxHeader", 14);
		put_octal(x + 100, 8, 0644);
		put_octal(x + 124, 12, paxlen);
		finish_header(x, 'x');
		out_put(x, BLOCK);
		out_put(pax, paxlen);
		out_zeros(padded(paxlen) - paxlen);
	}
	out_put(h, BLOCK);
}

/* ---- names: the entry at hand, as named in the archive and as a path on this side ---- */

static char arc[MAX_PATH + 1];
static size_t arclen;
static char shown[2 * MAX_PATH + 2];
static size_t shownlen;

static void set_names(const char *a, const char *s)
{
	arclen = (size_t)snprintf(arc, sizeof arc, "%s", a);
	shownlen = (size_t)snprintf(shown, sizeof shown, "%s", s);
}

/* Append "/name" to both; 0 (nothing changed) when the archive name would be too long for the
 * receiving side, which takes names below MAX_PATH with a directory's trailing slash. */
static int push(const char *name)
{
	size_t n = strlen(name);
	if (arclen + 1 + n + 1 >= MAX_PATH || shownlen + 1 + n >= sizeof shown)
		return 0;
	arc[arclen++] = '/';
	memcpy(arc + arclen, name, n + 1);
	arclen += n;
	if (shownlen == 0 || shown[shownlen - 1] != '/')
		shown[shownlen++] = '/';
	memcpy(shown + shownlen, name, n + 1);
	shownlen += n;
	return 1;
}

static void pop(size_t a, size_t s)
{
	arc[arclen = a] = 0;
	shown[shownlen = s] = 0;
}

/* a problem with SRC itself is fatal (there would be nothing to copy); below it, a warning */
static void problem(int top, const char *what, int err)
{
	if (top)
		fatal("%s: %s", shown, what ? what : strerror(err));
	warn("%s: %s; not copied", shown, what ? what : strerror(err));
}

/* ---- hard links: the first archive name of every multiply-linked file ---- */

struct seen {
	dev_t dev;
	ino_t ino;
	char *name;
};
static struct seen *seen;
static size_t seen_cap, seen_len;

static size_t seen_slot(dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)dev * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)ino * 0xc2b2ae3d27d4eb4full);
	size_t i = (size_t)(h ^ (h >> 29)) & (seen_cap - 1);
	while (seen[i].name && (seen[i].dev != dev || seen[i].ino != ino))
		i = (i + 1) & (seen_cap - 1);
	return i;
}

static const char *seen_find(dev_t dev, ino_t ino)
{
	return seen_cap ? seen[seen_slot(dev, ino)].name : NULL;
}

static void seen_add(dev_t dev, ino_t ino, const char *name)
{
	if ((seen_len + 1) * 2 > seen_cap) {
		struct seen *old = seen;
		size_t old_cap = seen_cap;
		seen_cap = seen_cap ? seen_cap * 2 : 256;
		seen = calloc(seen_cap, sizeof *seen);
		if (!seen)
			fatal("out of memory");
		for (size_t i = 0; i < old_cap; i++)
			if (old[i].name)
				seen[seen_slot(old[i].dev, old[i].ino)] = old[i];
		free(old);
	}
	size_t i = seen_slot(dev, ino);
	seen[i] = (struct seen){ dev, ino, strdup(name) };
	if (!seen[i].name)
		fatal("out of memory");
	seen_len++;
}

/* ---- entries ---- */

/* Exactly `size` bytes of the file, whatever it does meanwhile: one that grew is cut at the size
 * in its header, one that shrank (or could not be read to its end) is padded with zeros. */
static void put_data(int fd, uint64_t size)
{
	uint64_t left = size;
	while (left > 0) {
		if (olen == CHUNK)
			out_flush();
		size_t k = CHUNK - olen < left ? CHUNK - olen : (size_t)left;
		ssize_t r = read(fd, obuf + olen, k);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r < 0)
				warn("%s: %s; the rest (%" PRIu64 " bytes) is copied as zeros", shown, strerror(errno),
				     left);
			else
				warn("%s: the file shrank by %" PRIu64 " bytes while it was read; padded with zeros",
				     shown, left);
			out_zeros(left);
			break;
		}
		olen += (size_t)r;
		left -= (uint64_t)r;
	}
	out_zeros(padded(size) - size);
}

static void put_file(int dfd, const char *base, int top, int follow)
{
	/* O_NONBLOCK: should it have become a FIFO since it was looked at, open must not wait */
	int fd = openat(dfd, base, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
	if (fd < 0) {
		problem(top, NULL, errno);
		return;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		problem(top, "changed while it was being copied", 0);
		close(fd);
		return;
	}
	const char *first = st.st_nlink > 1 ? seen_find(st.st_dev, st.st_ino) : NULL;
	if (first) {
		put_header(arc, '1', &st, 0, first);
	} else {
		put_header(arc, '0', &st, (uint64_t)st.st_size, NULL);
		put_data(fd, (uint64_t)st.st_size);
		if (st.st_nlink > 1)
			seen_add(st.st_dev, st.st_ino, arc);
	}
	close(fd);
}

static void put_symlink(int dfd, const char *base, const struct stat *st, int top)
{
	char target[MAX_PATH];
	ssize_t n = readlinkat(dfd, base, target, sizeof target);
	if (n < 0) {
		problem(top, NULL, errno);
		return;
	}
	if (n >= (ssize_t)sizeof target) {
		problem(top, "the link's target is too long", 0);
		return;
	}
	target[n] = 0;
	put_header(arc, '2', st, 0, target);
}

static void put_entry(int dfd, const char *base, const struct stat *st, int top, int follow);

/* What getdents64(2) fills in, declared here: the C libraries differ (glibc's struct dirent64;
 * musl's getdents takes a struct dirent, and from 1.2.4 names the *64 forms only under
 * _LARGEFILE64_SOURCE), so the system call is made directly. */
struct linux_dirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* Every entry of the directory open at fd (taken over: closed here), in the order the
 * directory lists them. getdents64 with a small buffer rather than readdir's 32 KiB one: a
 * deep tree holds one per level. */
static void walk(int fd)
{
	char *buf = malloc(DIRBUF);
	if (!buf)
		fatal("out of memory");
	for (;;) {
		ssize_t n = syscall(SYS_getdents64, fd, buf, DIRBUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			warn("%s: reading the directory: %s", shown, strerror(errno));
		if (n <= 0)
			break;
		for (ssize_t off = 0; off < n;) {
			struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
			off += d->d_reclen;
			if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
				continue;
			size_t a = arclen, s = shownlen;
			if (!push(d->d_name)) {
				warn("%s/%s: the name is longer than %d bytes; not copied", shown, d->d_name,
				     MAX_PATH - 2);
				continue;
			}
			struct stat st;
			if (fstatat(fd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
				problem(0, NULL, errno);
			else
				put_entry(fd, d->d_name, &st, 0, 0);
			pop(a, s);
		}
	}
	free(buf);
	close(fd);
}

/* a directory's header ("NAME/"), then what it holds */
static void put_dir_fd(int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		fatal("%s: %s", shown, strerror(errno));
	arc[arclen] = '/';
	arc[arclen + 1] = 0;
	put_header(arc, '5', &st, 0, NULL);
	arc[arclen] = 0;
	walk(fd);
}

static void put_entry(int dfd, const char *base, const struct stat *st, int top, int follow)
{
	switch (st->st_mode & S_IFMT) {
	case S_IFREG:
		put_file(dfd, base, top, follow);
		return;
	case S_IFDIR: {
		int fd = openat(dfd, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
		if (fd < 0)
			problem(top, NULL, errno);
		else
			put_dir_fd(fd);
		return;
	}
	case S_IFLNK:
		put_symlink(dfd, base, st, top);
		return;
	case S_IFCHR:
		put_header(arc, '3', st, 0, NULL);
		return;
	case S_IFBLK:
		put_header(arc, '4', st, 0, NULL);
		return;
	case S_IFIFO:
		put_header(arc, '6', st, 0, NULL);
		return;
	default:
		/* like GNU tar's "socket ignored": not a failure of the copy */
		if (top)
			fatal("%s: a socket cannot be copied", shown);
		note("%s: a socket; not copied", shown);
	}
}

static void raise_nofile(void)
{
	/* the walk holds one descriptor per level (a 4095-byte name is ~2000 levels) */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* SRC is `DIR/.`, `.` or `/`: the directory's contents, the first entry `./`; shown is how its
 * entries are named in messages (`DIR/a`) */
static void tar_contents(const char *src, const char *path, const char *show)
{
	set_names(".", show);
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		fatal("%s: %s", src, strerror(errno));
	put_dir_fd(fd);
}

/* SRC names one entry, NAME: its basename (a `..` is named after the directory it is) */
static void tar_named(const char *src, char *s, int follow, int slash)
{
	char *cut = strrchr(s, '/');
	const char *base = cut ? cut + 1 : s;
	char dir[MAX_PATH * 2];
	if (!cut)
		strcpy(dir, ".");
	else
		snprintf(dir, sizeof dir, "%.*s", cut == s ? 1 : (int)(cut - s), s);
	char *real = NULL;
	const char *name = base;
	if (strcmp(base, "..") == 0) {
		real = realpath(s, NULL);
		if (!real)
			fatal("%s: %s", src, strerror(errno));
		name = strrchr(real, '/') + 1;
	}
	set_names(name, s);
	int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		fatal("%s: %s", src, strerror(errno));
	/* a trailing slash resolves SRC (as the kernel would), and SRC must then be a directory */
	struct stat st;
	if (fstatat(dfd, base, &st, follow || slash ? 0 : AT_SYMLINK_NOFOLLOW) < 0)
		fatal("%s: %s", src, strerror(errno));
	if (slash && !S_ISDIR(st.st_mode))
		fatal("%s: %s", src, strerror(ENOTDIR));
	put_entry(dfd, base, &st, 1, follow || slash);
	close(dfd);
	free(real);
}

int copy_tar(const char *src, int follow)
{
	signal(SIGPIPE, SIG_IGN);
	raise_nofile();
	char s[MAX_PATH * 2];
	if (snprintf(s, sizeof s, "%s", src) >= (int)sizeof s)
		fatal("%s: %s", src, strerror(ENAMETOOLONG));
	size_t n = strlen(s);
	int slash = 0;
	while (n > 1 && s[n - 1] == '/') {
		s[--n] = 0;
		slash = 1;
	}
	char *real = strcmp(s, "..") == 0 || (n >= 3 && strcmp(s + n - 3, "/..") == 0) ? realpath(s, NULL) : NULL;
	if (strcmp(s, "/") == 0 || strcmp(s, "/.") == 0 || (real && strcmp(real, "/") == 0)) {
		tar_contents(src, "/", "/");
	} else if (strcmp(s, ".") == 0) {
		tar_contents(src, ".", ".");
	} else if (n >= 2 && strcmp(s + n - 2, "/.") == 0) {
		char show[MAX_PATH * 2];
		snprintf(show, sizeof show, "%.*s", (int)(n - 2), s);
		tar_contents(src, s, show);
	} else {
		tar_named(src, s, follow, slash);
	}
	free(real);
	out_zeros(2 * BLOCK);
	out_flush();
	return status;
}

/* ================================ untar ================================ */

/* the reader's errors end the copy as every other (its code is for snaplab-unpack's caller) */
static void tar_failed(const char *code, const char *msg)
{
	(void)code;
	fatal("%s", msg);
}

/* zeroed, in .bss: set up by copy_untar. Initialised here it put its ~290 KiB of buffers in .data,
 * most of the agent's data segment, where the few globals every agent writes were spread over
 * pages it then held privately (docs/architecture.md "Density") */
static struct tar_reader in;

/* ---- where entries go ---- */

enum { M_PLAIN, M_CONTENTS, M_NAMED };
static int dest_mode = -1;
static int root_fd = -1; /* O_PATH: the extraction root */
static int root_new; /* contents mode: DEST was made here, and takes the `./` entry's meta */
static char root_shown[MAX_PATH * 2];
static char first_name[MAX_PATH]; /* named mode: NAME */
static char new_name[MAX_PATH]; /* named mode, renamed: basename(DEST), else "" */
static int is_root;
/* --untrusted: the archive comes out of a machine onto the host. Root inside the machine may
 * have made anything, so no setuid/setgid bits and no device nodes are created from it (a
 * setuid-root shell or a /dev/sda node in a host directory would outlive the machine). */
static int untrusted;
static unsigned long untrusted_dropped;
static const char *expect_first; /* --expect: the first entry's name ("" for ./), or NULL */
static unsigned long chown_failures;

/* Normalise an archive name in place: no "./" or empty components; absolute names and ".."
 * are refused. "" is the extraction root itself. */
static void clean_path(char *p, const char *what, const char *orig)
{
	if (p[0] == '/')
		fatal("%s %s is an absolute name", what, orig);
	char out[MAX_PATH];
	size_t o = 0;
	char *save = NULL;
	for (char *c = strtok_r(p, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		if (strcmp(c, ".") == 0)
			continue;
		if (strcmp(c, "..") == 0)
			fatal("%s %s has a '..' component", what, orig);
		size_t n = strlen(c);
		if (o)
			out[o++] = '/';
		memcpy(out + o, c, n);
		o += n;
	}
	out[o] = 0;
	memcpy(p, out, o + 1);
}

/* Named mode: every name begins with NAME (the sender is ours), renamed to basename(DEST) when
 * DEST is not an existing directory. */
static void place(char *p, const char *what, const char *orig)
{
	if (dest_mode != M_NAMED)
		return;
	size_t n = strlen(first_name);
	if (strncmp(p, first_name, n) != 0 || (p[n] != 0 && p[n] != '/'))
		fatal("%s %s is not under %s (not an archive made by snaplab cp)", what, orig, first_name);
	if (!new_name[0])
		return;
	size_t m = strlen(new_name), rest = strlen(p + n);
	if (m + rest >= MAX_PATH)
		fatal("%s %s: the name is longer than %d bytes once renamed", what, orig, MAX_PATH - 1);
	memmove(p + m, p + n, rest + 1);
	memcpy(p, new_name, m);
}

static void show_path(char *out, size_t size, const char *rel)
{
	if (!rel[0])
		snprintf(out, size, "%s", root_shown);
	else if (strcmp(root_shown, ".") == 0)
		snprintf(out, size, "%s", rel);
	else
		snprintf(out, size, "%s%s%s", root_shown, root_shown[strlen(root_shown) - 1] == '/' ? "" : "/", rel);
}

/* DEST without its trailing slashes split at its last slash: the directory and the name */
static void split_dest(const char *dest, char *dir, char *base)
{
	char s[MAX_PATH * 2];
	snprintf(s, sizeof s, "%s", dest);
	size_t n = strlen(s);
	while (n > 1 && s[n - 1] == '/')
		s[--n] = 0;
	char *cut = strrchr(s, '/');
	const char *b = cut ? cut + 1 : s;
	if (strlen(b) >= MAX_PATH)
		fatal("%s: %s", dest, strerror(ENAMETOOLONG));
	memcpy(base, b, strlen(b) + 1);
	if (!cut)
		strcpy(dir, ".");
	else
		snprintf(dir, MAX_PATH * 2, "%.*s", cut == s ? 1 : (int)(cut - s), s);
}

/* the user's directory on this side: symlinks in it are followed, it is their path */
static int open_dir(const char *path)
{
	int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		fatal("%s: %s", path, strerror(errno));
	return fd;
}

static int valid_name(const char *base)
{
	return base[0] && strcmp(base, ".") != 0 && strcmp(base, "..") != 0 && strlen(base) < 256;
}

/* contents mode, DEST missing: DEST made (its parent must exist), 0700 until the `./` entry's
 * meta is applied */
static void make_root(const char *dest)
{
	char dir[MAX_PATH * 2], base[MAX_PATH];
	split_dest(dest, dir, base);
	if (!valid_name(base))
		fatal("%s: not a name a directory can be made with", dest);
	int pfd = open_dir(dir);
	if (mkdirat(pfd, base, 0700) < 0)
		fatal("%s: %s", dest, strerror(errno));
	root_fd = openat(pfd, base, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (root_fd < 0)
		fatal("%s: %s", dest, strerror(errno));
	close(pfd);
	root_new = 1;
	snprintf(root_shown, sizeof root_shown, "%s", dest);
}

/* docker cp's destination rules, decided from the first entry: its name (normalised, "" for
 * `./`) and whether it is a directory. Sets the mode, the extraction root and, in named mode,
 * NAME and what it is renamed to. */
static void open_root(const char *dest, int plain, const char *first, int first_is_dir)
{
	/* looked at without its trailing slash: "FILE/" is a file that the slash rule refuses */
	char bare[MAX_PATH * 2];
	snprintf(bare, sizeof bare, "%s", dest);
	size_t dn = strlen(bare);
	int slash = dn > 1 && bare[dn - 1] == '/';
	while (dn > 1 && bare[dn - 1] == '/')
		bare[--dn] = 0;
	struct stat st;
	int have = stat(bare, &st) == 0;
	if (!have && errno != ENOENT)
		fatal("%s: %s", dest, strerror(errno));
	int is_dir = have && S_ISDIR(st.st_mode);
	snprintf(root_shown, sizeof root_shown, "%s", dest);

	if (plain) {
		dest_mode = M_PLAIN;
		if (!have)
			fatal("%s: %s", dest, strerror(ENOENT));
		if (!is_dir)
			fatal("%s: not a directory", dest);
		root_fd = open_dir(dest);
		return;
	}
	if (!first[0]) {
		dest_mode = M_CONTENTS;
		if (!first_is_dir)
			fatal("the archive's first entry names the destination itself but is not a directory");
		if (is_dir)
			root_fd = open_dir(dest);
		else if (have)
			fatal("%s: cannot copy a directory onto a file", dest);
		else
			make_root(dest);
		return;
	}
	dest_mode = M_NAMED;
	if (strchr(first, '/'))
		fatal("the archive's first entry %s is not a single name (not an archive made by snaplab cp)", first);
	snprintf(first_name, sizeof first_name, "%s", first);
	if (is_dir) {
		root_fd = open_dir(dest); /* under DEST, keeping NAME */
		return;
	}
	/* docker cp makes a missing DEST/ for a directory; a file needs DEST/ to be there */
	if (slash && !(first_is_dir && !have))
		fatal("%s: not a directory", dest);
	if (first_is_dir && have)
		fatal("%s: cannot copy a directory onto a file", dest);
	char dir[MAX_PATH * 2];
	split_dest(dest, dir, new_name);
	if (!valid_name(new_name))
		fatal("%s: not a name an entry can be made with", dest);
	root_fd = open_dir(dir);
	snprintf(root_shown, sizeof root_shown, "%s", dir);
}

/* ---- resolution below the root ---- */

static int resolve(const char *rel, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC),
		.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	int fd = (int)syscall(SYS_openat2, root_fd, rel[0] ? rel : ".", &how, sizeof how);
	if (fd < 0 && errno == ENOSYS)
		fatal("this kernel has no openat2 (Linux 5.6 or later is needed)");
	return fd;
}

/* O_NOFOLLOW | O_DIRECTORY on a last component that is a symlink is ENOTDIR, not ELOOP: the
 * component is looked at again to say which it is */
static int is_symlink_below_root(const char *rel)
{
	const char *cut = strrchr(rel, '/');
	char up[MAX_PATH];
	snprintf(up, sizeof up, "%.*s", cut ? (int)(cut - rel) : 0, rel);
	int fd = resolve(up, O_PATH);
	struct stat st;
	int link = fd >= 0 && fstatat(fd, cut ? cut + 1 : rel, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
	if (fd >= 0)
		close(fd);
	return link;
}

static void resolve_failed(const char *where, const char *dir)
{
	int err = errno;
	if (err == ELOOP || err == EXDEV || (err == ENOTDIR && is_symlink_below_root(dir)))
		fatal("%s goes through a symbolic link (%s); entries are never written through links", where, dir);
	if (err == ENOTDIR)
		fatal("%s: a parent of it is not a directory", where);
	fatal("%s: cannot open its directory: %s", where, strerror(err));
}

/* The directories of dir that are missing, made one at a time, each resolved in the root
 * again. Stops at the first one that cannot be resolved for another reason: the caller's
 * resolution of dir reports it. */
static void make_parents(const char *dir, const char *where)
{
	size_t n = strlen(dir);
	for (size_t i = 0; i <= n; i++) {
		if (dir[i] != '/' && dir[i] != 0)
			continue;
		char part[MAX_PATH];
		snprintf(part, sizeof part, "%.*s", (int)i, dir);
		int fd = resolve(part, O_PATH);
		if (fd >= 0) {
			close(fd);
			continue;
		}
		if (errno != ENOENT)
			return;
		const char *cut = strrchr(part, '/');
		char up[MAX_PATH];
		snprintf(up, sizeof up, "%.*s", cut ? (int)(cut - part) : 0, part);
		int ufd = resolve(up, O_PATH);
		if (ufd < 0)
			return;
		if (mkdirat(ufd, cut ? cut + 1 : part, 0755) < 0 && errno != EEXIST)
			fatal("%s: making its directory: %s", where, strerror(errno));
		close(ufd);
	}
}

/* The parent directory of rel (made where the archive left it out), and the last component in
 * *base. The previous entry's parent is kept open: no entry ever removes a directory, so it
 * stays what it was. */
static char cached_dir[MAX_PATH];
static int cached_fd = -1;

static int parent_of(const char *rel, const char **base, const char *where)
{
	const char *slash = strrchr(rel, '/');
	char dir[MAX_PATH];
	snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - rel) : 0, rel);
	*base = slash ? slash + 1 : rel;
	if (cached_fd >= 0 && strcmp(dir, cached_dir) == 0)
		return cached_fd;
	int fd = resolve(dir, O_PATH);
	if (fd < 0 && errno == ENOENT) {
		make_parents(dir, where);
		fd = resolve(dir, O_PATH);
	}
	if (fd < 0)
		resolve_failed(where, dir[0] ? dir : ".");
	if (cached_fd >= 0)
		close(cached_fd);
	cached_fd = fd;
	strcpy(cached_dir, dir);
	return fd;
}

/* Room for a new entry at base: a non-directory there is unlinked (never written through); a
 * directory stays for a directory (returns 1) and is an error for anything else. */
static int clear_name(int pfd, const char *base, const char *where, int dir)
{
	struct stat st;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0;
		fatal("%s: %s", where, strerror(errno));
	}
	if (S_ISDIR(st.st_mode)) {
		if (dir)
			return 1;
		fatal("%s: cannot overwrite a directory with a non-directory", where);
	}
	if (unlinkat(pfd, base, 0) < 0 && errno != ENOENT)
		fatal("%s: cannot remove it: %s", where, strerror(errno));
	return 0;
}

/* ---- entries ---- */

struct entry {
	char path[MAX_PATH]; /* below the root, placed */
	char orig[MAX_PATH]; /* as the archive names it, for messages about the archive */
	char link[MAX_PATH];
	char type;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	struct timespec mtime;
	uint64_t size;
	dev_t rdev;
};

static void chown_failed(const char *where, const struct entry *e, int err)
{
	/* a user namespace that does not map the archive's owners fails every entry alike */
	if (++chown_failures <= CHOWN_WARNINGS)
		warn("%s: cannot give it the owner %u:%u: %s", where, (unsigned)e->uid, (unsigned)e->gid,
		     strerror(err));
}

/* directory modes and times are set once every entry is in: writing into a directory changes
 * its mtime, and a directory without u+wx could not be filled by a user who is not root */
static struct dir_meta {
	char *path;
	mode_t mode;
	int fix_mode; /* made u+rwx meanwhile */
	struct timespec mtime;
} * dirs;
static size_t dirs_len, dirs_cap;

static void remember_dir(const char *rel, const struct entry *e, int fix_mode)
{
	if (dirs_len == dirs_cap) {
		dirs_cap = dirs_cap ? dirs_cap * 2 : 256;
		dirs = realloc(dirs, dirs_cap * sizeof *dirs);
		if (!dirs)
			fatal("out of memory");
	}
	dirs[dirs_len].path = strdup(rel);
	if (!dirs[dirs_len].path)
		fatal("out of memory");
	dirs[dirs_len].mode = e->mode;
	dirs[dirs_len].fix_mode = fix_mode;
	dirs[dirs_len].mtime = e->mtime;
	dirs_len++;
}

/* deepest first (the reverse of the archive's order): a parent keeps u+rwx until its children
 * are done */
static void apply_dir_meta(void)
{
	char where[MAX_PATH * 3];
	while (dirs_len > 0) {
		struct dir_meta *d = &dirs[--dirs_len];
		int fd = resolve(d->path, O_RDONLY);
		int err = errno;
		show_path(where, sizeof where, d->path);
		if (fd < 0) {
			warn("%s: cannot set its mode and time: %s", where, strerror(err));
			free(d->path);
			continue;
		}
		struct timespec ts[2] = { d->mtime, d->mtime };
		if (d->fix_mode && fchmod(fd, d->mode) < 0)
			warn("%s: cannot set its mode: %s", where, strerror(errno));
		if (futimens(fd, ts) < 0)
			warn("%s: cannot set its time: %s", where, strerror(errno));
		close(fd);
		free(d->path);
	}
}

/* Owner, then mode (chown clears setuid and setgid), of an open file or directory. A file that
 * could not be given its owner stays the receiving root's: it does not get setuid or setgid,
 * which it would then have for an owner the archive never named. */
static void set_meta_fd(int fd, const struct entry *e, mode_t mode, const char *where)
{
	if (is_root && fchown(fd, e->uid, e->gid) < 0) {
		chown_failed(where, e, errno);
		if (e->type != '5')
			mode &= ~(mode_t)(S_ISUID | S_ISGID);
	}
	if (fchmod(fd, mode) < 0)
		warn("%s: cannot set its mode %o: %s", where, (unsigned)mode, strerror(errno));
}

static void write_all(int fd, const unsigned char *p, size_t n, const char *where)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			fatal("%s: writing: %s", where, strerror(errno));
		p += w;
		n -= (size_t)w;
	}
}

static void make_file(int pfd, const char *base, const struct entry *e, const char *where)
{
	clear_name(pfd, base, where, 0);
	int fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		fatal("%s: %s", where, strerror(errno));
	const unsigned char *data;
	for (size_t k; (k = tar_data(&in, &data)) > 0;)
		write_all(fd, data, k, where);
	set_meta_fd(fd, e, e->mode, where);
	struct timespec ts[2] = { e->mtime, e->mtime };
	if (futimens(fd, ts) < 0)
		warn("%s: cannot set its time: %s", where, strerror(errno));
	if (close(fd) < 0)
		fatal("%s: writing: %s", where, strerror(errno));
}

static void make_dir_meta(int fd, const char *rel, const struct entry *e, const char *where)
{
	/* not root: u+rwx until the end, or its entries could not be made */
	mode_t now = is_root ? e->mode : e->mode | S_IRWXU;
	set_meta_fd(fd, e, now, where);
	remember_dir(rel, e, now != e->mode);
}

static void make_dir(int pfd, const char *base, const struct entry *e, const char *where)
{
	int existed = clear_name(pfd, base, where, 1);
	if (!existed && mkdirat(pfd, base, 0700) < 0)
		fatal("%s: %s", where, strerror(errno));
	/* out of a machine, a directory the host already has keeps its owner, mode and time: the
	 * archive may only add to it (else `cp m:/x/root /` could hand the host's /root away) */
	if (existed && untrusted)
		return;
	int fd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		fatal("%s: %s", where, strerror(errno));
	make_dir_meta(fd, e->path, e, where);
	close(fd);
}

/* Owner and time of a name that cannot be opened (a link, a node), never following it. */
static void set_meta_at(int pfd, const char *base, const struct entry *e, const char *where)
{
	if (is_root && fchownat(pfd, base, e->uid, e->gid, AT_SYMLINK_NOFOLLOW) < 0)
		chown_failed(where, e, errno);
	struct timespec ts[2] = { e->mtime, e->mtime };
	if (utimensat(pfd, base, ts, AT_SYMLINK_NOFOLLOW) < 0)
		warn("%s: cannot set its time: %s", where, strerror(errno));
}

static void make_symlink(int pfd, const char *base, const struct entry *e, const char *where)
{
	clear_name(pfd, base, where, 0);
	if (symlinkat(e->link, pfd, base) < 0)
		fatal("%s: %s", where, strerror(errno));
	set_meta_at(pfd, base, e, where);
}

static void make_node(int pfd, const char *base, const struct entry *e, const char *where)
{
	mode_t kind = e->type == '3' ? S_IFCHR : e->type == '4' ? S_IFBLK : S_IFIFO;
	if (untrusted && kind != S_IFIFO) {
		warn("%s: a device node out of a machine is not made on the host", where);
		return;
	}
	clear_name(pfd, base, where, 0);
	/* made with its mode (the umask is 0): fchmodat would follow a link put there meanwhile */
	if (mknodat(pfd, base, kind | e->mode, e->rdev) < 0) {
		warn("%s: cannot make the %s: %s", where, kind == S_IFIFO ? "FIFO" : "device node", strerror(errno));
		return;
	}
	set_meta_at(pfd, base, e, where);
}

/* the target is resolved below the root like every name, and linked from its parent's fd */
static void make_hardlink(int pfd, const char *base, const struct entry *e, const char *where)
{
	char target[MAX_PATH];
	snprintf(target, sizeof target, "%s", e->link);
	clean_path(target, "the hard link target", e->link);
	if (!target[0])
		fatal("hard link %s points at the destination directory itself", e->orig);
	place(target, "the hard link target", e->link);
	const char *cut = strrchr(target, '/');
	char tdir[MAX_PATH];
	snprintf(tdir, sizeof tdir, "%.*s", cut ? (int)(cut - target) : 0, target);
	const char *tbase = cut ? cut + 1 : target;
	int tfd = resolve(tdir, O_PATH);
	if (tfd < 0 && (errno == ELOOP || errno == EXDEV))
		fatal("hard link %s -> %s goes through a symbolic link", e->orig, e->link);
	struct stat st, have;
	if (tfd < 0 || fstatat(tfd, tbase, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		warn("%s: cannot link it to %s: no such entry", where, e->link);
		if (tfd >= 0)
			close(tfd);
		return;
	}
	if (S_ISDIR(st.st_mode))
		fatal("hard link %s -> %s points at a directory", e->orig, e->link);
	if (fstatat(pfd, base, &have, AT_SYMLINK_NOFOLLOW) < 0 || have.st_dev != st.st_dev ||
	    have.st_ino != st.st_ino) {
		clear_name(pfd, base, where, 0);
		if (linkat(tfd, tbase, pfd, base, 0) < 0)
			fatal("%s: linking it to %s: %s", where, e->link, strerror(errno));
	}
	close(tfd);
}

/* the `./` entry: DEST itself. An existing DEST keeps its own mode, owner and times, as with
 * docker cp; one made here takes the source directory's. */
static void apply_root(const struct entry *e, const char *where)
{
	if (e->type != '5')
		fatal("the archive's entry %s names the destination itself but is not a directory", e->orig);
	if (!root_new)
		return;
	int fd = resolve("", O_RDONLY);
	if (fd < 0)
		fatal("%s: %s", where, strerror(errno));
	make_dir_meta(fd, "", e, where);
	close(fd);
}

static void apply(const struct entry *e)
{
	char where[MAX_PATH * 3];
	show_path(where, sizeof where, e->path);
	if (!e->path[0]) {
		apply_root(e, where);
		return;
	}
	const char *base;
	int pfd = parent_of(e->path, &base, where);
	switch (e->type) {
	case '0':
	case '7':
		make_file(pfd, base, e, where);
		break;
	case '5':
		make_dir(pfd, base, e, where);
		break;
	case '2':
		make_symlink(pfd, base, e, where);
		break;
	case '1':
		make_hardlink(pfd, base, e, where);
		break;
	default: /* '3', '4', '6' */
		make_node(pfd, base, e, where);
	}
}

/* The reader's entry t into e. Returns 0 for an entry type this side skips. */
static int read_entry(const struct tar_entry *t, struct entry *e)
{
	memset(e, 0, sizeof *e);
	e->type = t->type;
	size_t n = strlen(t->name);
	/* an old archive's directory: a regular entry whose name ends in '/' */
	if (e->type == '0' && n > 0 && t->name[n - 1] == '/')
		e->type = '5';
	if (!strchr("0123456", e->type) && e->type != '7') {
		warn("%s: skipped, an entry of type '%c' this reader does not take", t->name, e->type);
		return 0;
	}
	memcpy(e->orig, t->name, n + 1); /* n < MAX_PATH: the reader checks */
	memcpy(e->path, t->name, n + 1);
	clean_path(e->path, "entry", e->orig);
	memcpy(e->link, t->link, strlen(t->link) + 1);
	e->mode = t->mode;
	if (untrusted && (e->mode & (S_ISUID | S_ISGID))) {
		e->mode &= ~(mode_t)(S_ISUID | S_ISGID);
		untrusted_dropped++;
	}
	e->uid = t->uid;
	e->gid = t->gid;
	e->size = t->size;
	e->mtime = t->mtime;
	if (e->type == '3' || e->type == '4')
		e->rdev = makedev((unsigned)tar_num(&in, t->header + 329, 8, "devmajor"),
				  (unsigned)tar_num(&in, t->header + 337, 8, "devminor"));
	return 1;
}

int copy_untar(const char *dest, int plain, int untrusted_archive, const char *expect)
{
	in.fd = 0;
	in.fail = tar_failed;
	in.global_pax = 1;
	in.need_end = 1;
	untrusted = untrusted_archive;
	if (expect)
		expect_first = strcmp(expect, ".") == 0 ? "" : expect;
	static struct tar_entry t;
	static struct entry e;
	uint64_t entries = 0;
	umask(0);
	is_root = geteuid() == 0;
	while (tar_next(&in, &t)) {
		if (!read_entry(&t, &e))
			continue;
		if (!entries++) {
			/* --expect: the host asked for NAME (or a directory's contents); an archive that
			 * begins with anything else is not the copy it asked for (a hostile machine's
			 * tar could otherwise choose what lands in DEST, e.g. .ssh/authorized_keys) */
			if (expect_first && strcmp(e.path, expect_first) != 0)
				fatal("the archive begins with %s, not the %s that was asked for",
				      e.path[0] ? e.path : "./", expect_first[0] ? expect_first : "contents (./)");
			open_root(dest, plain, e.path, e.type == '5');
		}
		place(e.path, "entry", e.orig);
		apply(&e);
	}
	if (!entries) {
		if (!plain)
			fatal("the archive has no entries");
		open_root(dest, 1, "", 0);
	}
	/* a writer's record padding after the end is read, up to a limit, so that the writer is not
	 * cut off while it finishes */
	tar_drain(&in, TRAILER_MAX);
	apply_dir_meta();
	if (chown_failures > CHOWN_WARNINGS)
		warn("%lu more entries could not be given their owner", chown_failures - CHOWN_WARNINGS);
	if (untrusted_dropped)
		note("%lu file(s) copied without their setuid/setgid bits (out of a machine)", untrusted_dropped);
	return status;
}

/*
 * `cp [-L] [--expect NAME] SRC DEST`: tar | untar within one machine, in one exec. A copy between
 * two paths of the same machine goes through here rather than through the host: on a VM both
 * halves would share the relay's one stream, where a reader slower than the writer stalls the
 * writer's acknowledgements behind its own unread output.
 */
int copy_within(const char *src, int follow, const char *dest, const char *expect)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0)
		fatal("pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0)
		fatal("fork: %s", strerror(errno));
	if (pid == 0) {
		close(fds[0]);
		if (dup2(fds[1], 1) < 0)
			_exit(2);
		_exit(copy_tar(src, follow));
	}
	close(fds[1]);
	if (dup2(fds[0], 0) < 0)
		fatal("dup2: %s", strerror(errno));
	close(fds[0]);
	int rc = copy_untar(dest, 0, 0, expect);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return 2;
	int trc = WIFEXITED(st) ? WEXITSTATUS(st) : 2;
	return trc > rc ? trc : rc;
}

/*
 * `tar [-L] SRC`, `untar [--plain] [--untrusted] [--expect NAME] DEST`, `cp [-L] [--expect NAME]
 * SRC DEST`: argv as the agent got it (argv[1] the subcommand). One parser for the three: each
 * takes the flags it names, "--" ends them, then its paths. Usage errors exit 2.
 */
int copy_main(int argc, char **argv, void (*usage)(void))
{
	const char *cmd = argv[1];
	int is_tar = !strcmp(cmd, "tar"), is_cp = !strcmp(cmd, "cp");
	int follow = 0, plain = 0, untrusted_archive = 0, i = 2;
	const char *expect = NULL;
	for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--")) {
			i++;
			break;
		}
		if ((is_tar || is_cp) && !strcmp(a, "-L"))
			follow = 1;
		else if (!is_tar && !strcmp(a, "--expect") && i + 1 < argc)
			expect = argv[++i];
		else if (!is_tar && !is_cp && !strcmp(a, "--plain"))
			plain = 1;
		else if (!is_tar && !is_cp && !strcmp(a, "--untrusted"))
			untrusted_archive = 1;
		else {
			usage();
			return 2;
		}
	}
	int paths = is_cp ? 2 : 1;
	if (argc - i != paths || !argv[i][0] || (is_cp && !argv[i + 1][0])) {
		usage();
		return 2;
	}
	if (is_cp)
		return copy_within(argv[i], follow, argv[i + 1], expect);
	return is_tar ? copy_tar(argv[i], follow) : copy_untar(argv[i], plain, untrusted_archive, expect);
}
