/*
 * snaplab-unpack: apply one tar stream (stdin) to an image tree, contained by the kernel.
 *
 *   snaplab-unpack ROOT [--layer]
 *
 * Reads ustar, pax (path, linkpath, size, uid, gid, mtime, SCHILY.xattr.*) and GNU long names,
 * with the one tar reader of native/ (tar.c); global pax headers are skipped, as containerd does.
 * Every path is resolved below ROOT with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS): an entry that would write through a symlink (of this archive or of an
 * earlier layer) is refused, never followed; absolute names and `..` are refused before that.
 * Nothing is ever opened without O_NOFOLLOW, and an existing entry is removed, not written
 * through, before a new one takes its name.
 *
 * --layer: an OCI layer. `.wh.NAME` removes NAME of the layers below, `.wh..wh..opq` empties its
 * directory of what the layers below put there (in whatever order the tar has them): the helper
 * remembers the paths this layer wrote (and their parents), and a whiteout never touches those.
 *
 * Device nodes and FIFOs are counted and skipped. Extended attributes: security.capability,
 * user.* (but user.overlay.*) and POSIX ACLs are kept; trusted.*, user.overlay.* and other security.*
 * are dropped and counted (overlayfs would read them as its own marks when the tree is a layer).
 *
 * On success one JSON line goes to stdout; on failure one line "CODE<TAB>message" goes to stderr
 * and the exit status is 2 (the caller removes the tree: a failed import leaves nothing).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "tar.h"

#define MAX_PATH TAR_MAX_PATH
#define MAX_NAME 255

static int root_fd = -1;
static int layer_mode;
static struct tar_reader in; /* stdin */

static struct {
	uint64_t entries, files, dirs, symlinks, hardlinks, whiteouts, opaques, devices, xattrs_dropped, bytes;
} stats;

static void fail(const char *code, const char *fmt, ...)
{
	char msg[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	for (char *p = msg; *p; p++)
		if (*p == '\n' || *p == '\t')
			*p = ' ';
	fprintf(stderr, "%s\t%s\n", code, msg);
	exit(2);
}

/* ---- paths written by this layer (a whiteout or an opaque marker never removes these) ----
 * By path, not by inode: a hard link to a lower layer's file must not shield that file. Every
 * entry marks its own path and all its ancestors, so an opaque parent keeps what the layer put
 * below it whatever the order of the tar. */

static char **written;
static size_t written_cap, written_len;

static uint64_t path_hash(const char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
	return h;
}

static int written_find(const char *p, size_t n, size_t *slot)
{
	size_t i = (size_t)path_hash(p, n) & (written_cap - 1);
	for (; written[i]; i = (i + 1) & (written_cap - 1))
		if (strlen(written[i]) == n && memcmp(written[i], p, n) == 0) {
			*slot = i;
			return 1;
		}
	*slot = i;
	return 0;
}

static void written_put(const char *p, size_t n)
{
	if ((written_len + 1) * 2 > written_cap) {
		char **old = written;
		size_t old_cap = written_cap;
		written_cap = written_cap ? written_cap * 2 : 4096;
		written = calloc(written_cap, sizeof *written);
		if (!written)
			fail("IO", "out of memory");
		for (size_t i = 0; i < old_cap; i++)
			if (old[i]) {
				size_t slot;
				written_find(old[i], strlen(old[i]), &slot);
				written[slot] = old[i];
			}
		free(old);
	}
	size_t slot;
	if (written_find(p, n, &slot))
		return;
	written[slot] = strndup(p, n);
	if (!written[slot])
		fail("IO", "out of memory");
	written_len++;
}

/* mark `rel` and every ancestor of it ("" is the root) */
static void mark_written(const char *rel)
{
	if (!layer_mode)
		return;
	size_t n = strlen(rel);
	written_put(rel, n);
	for (size_t i = n; i-- > 0;)
		if (rel[i] == '/')
			written_put(rel, i);
	written_put("", 0);
}

static int was_written(const char *rel)
{
	if (!written_cap)
		return 0;
	size_t slot;
	return written_find(rel, strlen(rel), &slot);
}

/* ---- paths ---- */

/* Normalize an archive name in place: drop "./" and empty components; refuse absolute names,
   "..", and over-long names. Returns "" for the root itself. */
static void clean_path(char *p, const char *what, const char *orig)
{
	if (strlen(p) >= MAX_PATH)
		fail("UNSAFE_PATH", "%s name is longer than %d bytes", what, MAX_PATH - 1);
	if (p[0] == '/')
		fail("UNSAFE_PATH", "%s %s is an absolute name", what, orig);
	char out[MAX_PATH];
	size_t o = 0;
	char *save = NULL;
	for (char *c = strtok_r(p, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		if (strcmp(c, ".") == 0)
			continue;
		if (strcmp(c, "..") == 0)
			fail("UNSAFE_PATH", "%s %s has a '..' component", what, orig);
		if (strlen(c) > MAX_NAME)
			fail("UNSAFE_PATH", "%s %s has a component longer than %d bytes", what, orig, MAX_NAME);
		if (o)
			out[o++] = '/';
		size_t n = strlen(c);
		memcpy(out + o, c, n);
		o += n;
	}
	out[o] = 0;
	memcpy(p, out, o + 1);
}

static int resolve_dir_as(const char *rel, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_DIRECTORY | O_CLOEXEC),
		.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	return (int)syscall(SYS_openat2, root_fd, rel[0] ? rel : ".", &how, sizeof how);
}

static int resolve_dir(const char *rel)
{
	return resolve_dir_as(rel, O_PATH);
}

/* One cached parent directory: most entries of a tar share the previous one's. Entries only ever
   replace children of the cached directory, never the directory itself; an opaque directory,
   which can empty an ancestor of it, drops the cache. */
static char cached_dir[MAX_PATH];
static int cached_fd = -1;

static void drop_cache(void)
{
	if (cached_fd >= 0)
		close(cached_fd);
	cached_fd = -1;
	cached_dir[0] = 0;
}

static void remove_at(int dirfd, const char *name, const char *shown);

/* The parent directory of `rel` (made, root-owned 0755, where the archive left it out), and the
   last component in *base. */
static int parent_of(const char *rel, const char **base, const char *shown)
{
	const char *slash = strrchr(rel, '/');
	char dir[MAX_PATH];
	if (slash) {
		memcpy(dir, rel, (size_t)(slash - rel));
		dir[slash - rel] = 0;
		*base = slash + 1;
	} else {
		dir[0] = 0;
		*base = rel;
	}
	if (cached_fd >= 0 && strcmp(dir, cached_dir) == 0)
		return cached_fd;
	int fd = resolve_dir(dir);
	if (fd < 0 && errno == ENOENT) {
		/* make the missing directories one at a time, each resolved in the root again */
		char part[MAX_PATH];
		size_t n = strlen(dir);
		for (size_t i = 0; i <= n; i++) {
			if (dir[i] != '/' && dir[i] != 0)
				continue;
			memcpy(part, dir, i);
			part[i] = 0;
			int pfd = resolve_dir(part);
			if (pfd >= 0) {
				close(pfd);
				continue;
			}
			if (errno != ENOENT)
				break;
			const char *slash2 = strrchr(part, '/');
			char up[MAX_PATH];
			const char *leaf = part;
			up[0] = 0;
			if (slash2) {
				memcpy(up, part, (size_t)(slash2 - part));
				up[slash2 - part] = 0;
				leaf = slash2 + 1;
			}
			int ufd = resolve_dir(up);
			if (ufd < 0)
				break;
			if (mkdirat(ufd, leaf, 0755) < 0 && errno != EEXIST)
				fail("IO", "mkdir %s: %s", part, strerror(errno));
			close(ufd);
		}
		fd = resolve_dir(dir);
	}
	if (fd < 0) {
		if (errno == ELOOP || errno == EXDEV)
			fail("UNSAFE_PATH",
			     "%s goes through a symbolic link (%s); entries are never written through links", shown,
			     dir);
		if (errno == ENOTDIR)
			fail("UNSAFE_PATH", "%s: a parent of it is not a directory", shown);
		fail("IO", "%s: cannot open its directory: %s", shown, strerror(errno));
	}
	if (cached_fd >= 0)
		close(cached_fd);
	cached_fd = fd;
	strcpy(cached_dir, dir);
	return fd;
}

/* Remove every entry of the directory open at fd (taken over: closed here), never following a
 * link. keep_layer: `rel` is the directory's path in the tree, and what this layer wrote below
 * it stays. One descriptor per level. */
static void empty_dir(int fd, const char *rel, const char *shown, int keep_layer)
{
	DIR *d = fdopendir(fd);
	if (!d)
		fail("IO", "opendir %s: %s", shown, strerror(errno));
	int dfd = dirfd(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (keep_layer) {
			char child[MAX_PATH * 2];
			snprintf(child, sizeof child, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
			if (was_written(child)) {
				struct stat st;
				if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
					int cfd =
						openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
					if (cfd < 0)
						fail("IO", "open %s/%s: %s", shown, e->d_name, strerror(errno));
					empty_dir(cfd, child, shown, 1);
				}
				continue;
			}
		}
		remove_at(dfd, e->d_name, shown);
	}
	closedir(d);
}

static void remove_at(int dirfd, const char *name, const char *shown)
{
	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
		return;
	if (errno != EISDIR)
		fail("IO", "remove %s: %s", shown, strerror(errno));
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		fail("IO", "open %s: %s", shown, strerror(errno));
	empty_dir(fd, "", shown, 0);
	if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		fail("IO", "rmdir %s: %s", shown, strerror(errno));
}

/* Make room for a new entry named `base`: whatever has the name goes (a directory with all it
   holds), unless keep_dir and it is a directory. Returns 1 when a directory was kept. */
static int clear_name(int pfd, const char *base, const char *shown, int keep_dir)
{
	struct stat st;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	if (keep_dir && S_ISDIR(st.st_mode))
		return 1;
	remove_at(pfd, base, shown);
	return 0;
}

/* ---- entries ---- */

struct entry {
	char path[MAX_PATH + 1];
	char link[MAX_PATH + 1];
	char type;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	struct timespec mtime;
	uint64_t size;
	const struct tar_entry *tar; /* its extended attributes */
};

static int keep_xattr(const char *name)
{
	/* user.overlay.* would be read as overlayfs's own marks when the tree is a layer (userxattr) */
	if (strncmp(name, "user.overlay.", 13) == 0)
		return 0;
	return strcmp(name, "security.capability") == 0 || strncmp(name, "user.", 5) == 0 ||
	       strcmp(name, "system.posix_acl_access") == 0 || strcmp(name, "system.posix_acl_default") == 0;
}

static void set_meta(int fd, const struct entry *e, const char *shown)
{
	if (fchown(fd, e->uid, e->gid) < 0)
		fail("IO", "chown %s: %s", shown, strerror(errno));
	/* after chown, which clears setuid and setgid */
	if (fchmod(fd, e->mode & 07777) < 0)
		fail("IO", "chmod %s: %s", shown, strerror(errno));
	for (int i = 0; i < e->tar->nxattrs; i++) {
		const struct tar_xattr *x = &e->tar->xattrs[i];
		if (!keep_xattr(x->name)) {
			stats.xattrs_dropped++;
			continue;
		}
		if (fsetxattr(fd, x->name, x->value, x->len, 0) < 0)
			fail("IO", "setting %s on %s: %s", x->name, shown, strerror(errno));
	}
}

/* directory times are set once the layer is done: writing into a directory changes its mtime */
static struct dir_time {
	char *path;
	struct timespec mtime;
} * dir_times;
static size_t dir_times_len, dir_times_cap;

static void remember_dir_time(const char *rel, struct timespec t)
{
	if (dir_times_len == dir_times_cap) {
		dir_times_cap = dir_times_cap ? dir_times_cap * 2 : 256;
		dir_times = realloc(dir_times, dir_times_cap * sizeof *dir_times);
		if (!dir_times)
			fail("IO", "out of memory");
	}
	dir_times[dir_times_len].path = strdup(rel);
	dir_times[dir_times_len].mtime = t;
	dir_times_len++;
}

static void apply_dir_times(void)
{
	for (size_t i = 0; i < dir_times_len; i++) {
		int fd = resolve_dir_as(dir_times[i].path, O_RDONLY);
		if (fd < 0)
			continue; /* removed by a later entry */
		struct timespec ts[2] = { dir_times[i].mtime, dir_times[i].mtime };
		(void)futimens(fd, ts);
		close(fd);
	}
}

static void write_data(int fd, uint64_t size, const char *shown)
{
	const unsigned char *buf;
	size_t k;
	while ((k = tar_data(&in, &buf)) > 0) {
		size_t off = 0;
		while (off < k) {
			ssize_t w = write(fd, buf + off, k - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				fail("IO", "writing %s: %s", shown, strerror(errno));
			off += (size_t)w;
		}
	}
	stats.bytes += size;
}

static void do_whiteout(char *rel, const char *shown)
{
	const char *base;
	int pfd;
	/* a whiteout in a directory that is not there hides nothing */
	char dir[MAX_PATH];
	const char *slash = strrchr(rel, '/');
	snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - rel) : 0, rel);
	int probe = resolve_dir(dir);
	if (probe < 0 && errno == ENOENT)
		return;
	if (probe >= 0)
		close(probe);
	pfd = parent_of(rel, &base, shown);
	struct stat st;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return;
	if (was_written(rel))
		return; /* written by this same layer: a whiteout hides only what is below */
	remove_at(pfd, base, shown);
	stats.whiteouts++;
}

static void do_opaque(const char *rel, const char *shown)
{
	int fd = resolve_dir(rel);
	if (fd < 0 && errno == ENOENT)
		return;
	if (fd < 0) {
		if (errno == ELOOP || errno == EXDEV)
			fail("UNSAFE_PATH", "%s goes through a symbolic link", shown);
		fail("IO", "opaque directory %s: %s", shown, strerror(errno));
	}
	int rfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	close(fd);
	if (rfd < 0)
		fail("IO", "open %s: %s", shown, strerror(errno));
	drop_cache();
	empty_dir(rfd, rel, shown, 1);
	stats.opaques++;
}

static void apply(struct entry *e)
{
	char shown[MAX_PATH + 8];
	snprintf(shown, sizeof shown, "%s", e->path[0] ? e->path : ".");
	stats.entries++;

	/* a .wh. name is a whiteout whatever its type (as Docker and containerd read it) */
	if (layer_mode) {
		const char *slash = strrchr(e->path, '/');
		const char *base = slash ? slash + 1 : e->path;
		if (strncmp(base, ".wh.", 4) == 0) {
			char target[MAX_PATH];
			size_t dlen = slash ? (size_t)(slash - e->path) : 0;
			if (strcmp(base, ".wh..wh..opq") == 0) {
				snprintf(target, sizeof target, "%.*s", (int)dlen, e->path);
				do_opaque(target, shown);
			} else if (strncmp(base, ".wh..wh.", 8) == 0) {
				/* aufs bookkeeping (.wh..wh.plnk, ...): not part of the image */
			} else {
				const char *hidden = base + 4;
				if (!hidden[0] || strcmp(hidden, ".") == 0 || strcmp(hidden, "..") == 0)
					fail("UNSAFE_PATH", "whiteout %s names %s, not an entry of its directory",
					     shown, hidden[0] ? hidden : "nothing");
				snprintf(target, sizeof target, "%.*s%s%s", (int)dlen, e->path, dlen ? "/" : "",
					 base + 4);
				do_whiteout(target, shown);
			}
			return;
		}
	}

	mark_written(e->path);
	if (!e->path[0]) {
		if (e->type != '5')
			fail("UNSAFE_PATH",
			     "an entry named '.' that is not a directory would replace the image's root");
		int fd = openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		set_meta(fd, e, shown);
		close(fd);
		remember_dir_time("", e->mtime);
		return;
	}

	const char *base;
	int pfd = parent_of(e->path, &base, shown);
	struct stat st;
	switch (e->type) {
	case '0':
	case '\0':
	case '7': {
		clear_name(pfd, base, shown, 0);
		int fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0)
			fail("IO", "create %s: %s", shown, strerror(errno));
		write_data(fd, e->size, shown);
		set_meta(fd, e, shown);
		struct timespec ts[2] = { e->mtime, e->mtime };
		futimens(fd, ts);
		close(fd);
		stats.files++;
		return;
	}
	case '5': {
		if (!clear_name(pfd, base, shown, 1) && mkdirat(pfd, base, 0700) < 0)
			fail("IO", "mkdir %s: %s", shown, strerror(errno));
		int fd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			fail("IO", "open %s: %s", shown, strerror(errno));
		set_meta(fd, e, shown);
		close(fd);
		remember_dir_time(e->path, e->mtime);
		stats.dirs++;
		return;
	}
	case '2': {
		clear_name(pfd, base, shown, 0);
		if (symlinkat(e->link, pfd, base) < 0)
			fail("IO", "symlink %s: %s", shown, strerror(errno));
		if (fchownat(pfd, base, e->uid, e->gid, AT_SYMLINK_NOFOLLOW) < 0)
			fail("IO", "chown %s: %s", shown, strerror(errno));
		struct timespec ts[2] = { e->mtime, e->mtime };
		utimensat(pfd, base, ts, AT_SYMLINK_NOFOLLOW);
		stats.symlinks++;
		return;
	}
	case '1': {
		char target[MAX_PATH + 1];
		char orig[MAX_PATH + 1];
		snprintf(orig, sizeof orig, "%s", e->link);
		snprintf(target, sizeof target, "%s", e->link);
		clean_path(target, "hard link target of", orig);
		if (!target[0])
			fail("UNSAFE_PATH", "hard link %s points at the image's root", shown);
		/* the target's directory, resolved in the root like every other path */
		const char *tslash = strrchr(target, '/');
		char tdir[MAX_PATH];
		snprintf(tdir, sizeof tdir, "%.*s", tslash ? (int)(tslash - target) : 0, target);
		const char *tbase = tslash ? tslash + 1 : target;
		int tfd = resolve_dir(tdir);
		if (tfd < 0) {
			if (errno == ELOOP || errno == EXDEV)
				fail("UNSAFE_PATH", "hard link %s -> %s goes through a symbolic link", shown, orig);
			fail("UNSAFE_PATH", "hard link %s -> %s: no such file in the image", shown, orig);
		}
		if (fstatat(tfd, tbase, &st, AT_SYMLINK_NOFOLLOW) < 0)
			fail("UNSAFE_PATH", "hard link %s -> %s: no such file in the image", shown, orig);
		if (S_ISDIR(st.st_mode))
			fail("UNSAFE_PATH", "hard link %s -> %s is a directory", shown, orig);
		struct stat have;
		if (fstatat(pfd, base, &have, AT_SYMLINK_NOFOLLOW) == 0 && have.st_ino == st.st_ino &&
		    have.st_dev == st.st_dev) {
			close(tfd);
		} else {
			clear_name(pfd, base, shown, 0);
			if (linkat(tfd, tbase, pfd, base, 0) < 0)
				fail("IO", "link %s -> %s: %s", shown, orig, strerror(errno));
			close(tfd);
		}
		stats.hardlinks++;
		return;
	}
	case '3':
	case '4':
	case '6':
		stats.devices++;
		return;
	default:
		fail("BAD_TAR", "%s has an entry type this reader does not take ('%c')", shown, e->type);
	}
}

/* the reader's errors are this helper's: one line "CODE<TAB>message", exit 2 */
static void tar_failed(const char *code, const char *msg)
{
	fail(code, "%s", msg);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: snaplab-unpack ROOT [--layer]\n");
		return 64;
	}
	for (int i = 2; i < argc; i++)
		if (strcmp(argv[i], "--layer") == 0)
			layer_mode = 1;
	root_fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (root_fd < 0)
		fail("IO", "open %s: %s", argv[1], strerror(errno));
	umask(0);
	/* removing a deep tree holds one descriptor per level (a 4095-byte name is ~2000 levels) */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	in.fd = 0;
	in.fail = tar_failed;
	in.keep_xattrs = 1;
	static struct tar_entry t;
	static struct entry e;
	while (tar_next(&in, &t)) {
		if (t.type == 'V')
			continue; /* a volume label */
		memset(&e, 0, sizeof e);
		e.type = t.type;
		snprintf(e.path, sizeof e.path, "%s", t.name);
		clean_path(e.path, "entry", t.name);
		snprintf(e.link, sizeof e.link, "%s", t.link);
		e.mode = t.mode;
		e.uid = t.uid;
		e.gid = t.gid;
		e.mtime = t.mtime;
		e.size = t.size;
		e.tar = &t;
		apply(&e);
	}
	/* what follows the end of the archive (record padding, a writer's trailing bytes) is read and
     dropped: the caller hashes the whole stream, and must be able to write all of it */
	tar_drain(&in, UINT64_MAX);
	tar_done(&in);
	apply_dir_times();
	printf("{\"entries\":%" PRIu64 ",\"files\":%" PRIu64 ",\"dirs\":%" PRIu64 ",\"symlinks\":%" PRIu64
	       ",\"hardlinks\":%" PRIu64 ",\"whiteouts\":%" PRIu64 ",\"opaques\":%" PRIu64 ",\"devices\":%" PRIu64
	       ",\"xattrsDropped\":%" PRIu64 ",\"bytes\":%" PRIu64 "}\n",
	       stats.entries, stats.files, stats.dirs, stats.symlinks, stats.hardlinks, stats.whiteouts, stats.opaques,
	       stats.devices, stats.xattrs_dropped, stats.bytes);
	return 0;
}
