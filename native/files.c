/*
 * snaplab-agent file ...: the file operations behind the HTTP daemon's file endpoints, run in a
 * machine through its agent like any command (argv exec, stdin/stdout pipes). It runs as the
 * exec's user inside the machine, so a PATH is the machine's own and its permissions apply.
 *
 *   cat PATH, write [--mode OCTAL] [--parents] [--append] [--size N] [--xattr NAME=VALUE]...
 *   [--owner UID:GID] [--through] PATH, stat [-L] PATH, ls [--depth N] PATH,
 *   mkdir [--parents] [--mode OCTAL] [--owner UID:GID] PATH, rm [--recursive] [--force] PATH,
 *   mv [--parents] [--owner UID:GID] FROM TO   (`--` ends the flags)
 *
 * --owner gives what the command makes or writes (the directories --parents makes, the file
 * written or appended to, the directory made) to UID:GID, as envd does when it acts for a user:
 * the caller runs it as root. A write keeps the owner (where the writer may give it) and, without
 * --mode, the permission bits of the regular file it replaces (0644 for a new one). --through: a
 * link at PATH is written through (the file it ends at replaced, or made; a device or FIFO there
 * written into), not replaced; --parents makes PATH's parents, never the link target's. ls
 * --depth N lists N levels, each directory's entries (sorted) followed by its own, never through
 * a link. mv is rename(2): a file onto a directory fails (EISDIR), as does a directory
 * onto a non-empty one (ENOTEMPTY) or across filesystems (EXDEV).
 *
 * write puts stdin in a temp file beside PATH (.NAME.snaplab-XXXXXX, + for - when PATH is new) renamed over it, so a reader
 * never sees half a file (a symlink at PATH is replaced, not written through). stat and ls print
 * one JSON object a line: {"name","path","type","size","mode":"0644","uid","gid","mtime":"...Z"
 * [,"target"[,"resolved":{"path","type","mode"}]][,"xattrs":{"user.NAME":"VALUE",...}]} (a link's
 * resolved: its realpath and what is there, when it ends at something) (the user.* extended attributes, when there are
 * any; a value holding a NUL byte is left out), names as raw bytes with '"', '\' and control characters escaped. rm -r never
 * follows a symlink. Exit 0; 1 with one line on stderr, `snaplab: file: ERRNAME: PATH: strerror`,
 * which the daemon maps by ERRNAME (PATH "-" is stdin or stdout); 2 on bad usage. write's --xattr
 * sets each attribute on the temporary file before it is renamed, so the file lands with exactly
 * those (an overwrite is a new file: the old one's attributes go with it); with --append they are
 * set on the file as it is.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64 * 1024)

#define E(x)          \
	{             \
		x, #x \
	}
static const struct {
	int no;
	const char *name;
} errnames[] = {
	E(ENOENT), E(EACCES), E(EEXIST), E(ENOTDIR), E(EISDIR),	      E(ENOTEMPTY), E(EINVAL), E(ELOOP),
	E(ENOSPC), E(EROFS),  E(EPERM),	 E(EBUSY),   E(ENAMETOOLONG), E(EIO),	    E(EXDEV),  E(EDQUOT),
	E(EFBIG),  E(EMFILE), E(ENOMEM), E(EPIPE),   E(ETXTBSY),      E(EMLINK),    E(ENXIO),  E(EOPNOTSUPP),
};

/* A file on one of the kernel's own filesystems: its contents are what the kernel answers, and nothing
 * can be made in its directory (a write there is written where it is, as envd's open of it). */
static int kernel_file(const char *path)
{
	struct statfs fs;
	if (statfs(path, &fs) < 0)
		return 0;
	switch ((unsigned long)fs.f_type) {
	case PROC_SUPER_MAGIC:
	case SYSFS_MAGIC:
	case CGROUP_SUPER_MAGIC:
	case CGROUP2_SUPER_MAGIC:
	case DEBUGFS_MAGIC:
	case SECURITYFS_MAGIC:
	case TRACEFS_MAGIC:
		return 1;
	}
	return 0;
}

/* The one error line, e (an errno) its cause. */
static int fail(int e, const char *path)
{
	char num[16];
	const char *name = NULL;
	for (size_t i = 0; i < sizeof errnames / sizeof errnames[0] && !name; i++)
		if (errnames[i].no == e)
			name = errnames[i].name;
	if (!name)
		snprintf(num, sizeof num, "E%d", e), name = num;
	fprintf(stderr, "snaplab: file: %s: %s: %s\n", name, path, strerror(e));
	return 1;
}

/* A JSON string on stdout (also watch.c's event names). */
void json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		p += w, n -= (size_t)w;
	}
	return 0;
}

/* Copy in to out; the number of bytes, or -1 with *rerr set when the read side failed. */
static long long copy_fd(int in, int out, int *rerr)
{
	static char buf[CHUNK];
	long long total = 0;
	for (;;) {
		ssize_t n = read(in, buf, sizeof buf);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			*rerr = n < 0;
			return n < 0 ? -1 : total;
		}
		*rerr = 0;
		if (write_all(out, buf, (size_t)n) < 0)
			return -1;
		total += n;
	}
}

/* The last component of a path, trailing slashes ignored ("/" for the root). */
static char *base_name(const char *path)
{
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	size_t b = n;
	while (b > 0 && path[b - 1] != '/')
		b--;
	if (b == n && n > 0) /* only slashes */
		return strdup("/");
	return strndup(path + b, n - b);
}

/* ,"xattrs":{...}: path's user.* extended attributes (its link's own unless follow), when it has any. */
static void print_xattrs(const char *path, int follow)
{
	static char names[65536], value[65537];
	ssize_t n = follow ? listxattr(path, names, sizeof names) : llistxattr(path, names, sizeof names);
	int first = 1;
	for (char *p = names; n > 0 && p < names + n; p += strlen(p) + 1) {
		if (strncmp(p, "user.", 5))
			continue;
		ssize_t v = follow ? getxattr(path, p, value, sizeof value - 1)
				   : lgetxattr(path, p, value, sizeof value - 1);
		if (v < 0 || memchr(value, 0, (size_t)v))
			continue;
		value[v] = 0;
		printf(first ? ",\"xattrs\":{" : ",");
		first = 0;
		json_str(p), putchar(':'), json_str(value);
	}
	if (!first)
		putchar('}');
}

static const char *const types[16] = { [S_IFREG >> 12] = "file",    [S_IFDIR >> 12] = "dir",
				       [S_IFLNK >> 12] = "symlink", [S_IFCHR >> 12] = "char",
				       [S_IFBLK >> 12] = "block",   [S_IFIFO >> 12] = "fifo",
				       [S_IFSOCK >> 12] = "socket" };

/* ,"resolved":{"path","type","mode"}: where a link at path ends (every link followed), when it
 * ends at something */
static void print_resolved(const char *path)
{
	struct stat ts;
	char *rp = realpath(path, NULL);
	if (rp && stat(rp, &ts) == 0) {
		const char *type = types[(ts.st_mode & S_IFMT) >> 12];
		printf(",\"resolved\":{\"path\":"), json_str(rp);
		printf(",\"type\":\"%s\",\"mode\":\"%04o\"}", type ? type : "unknown", (unsigned)(ts.st_mode & 07777));
	}
	free(rp);
}

static void print_entry(const char *name, const char *path, const struct stat *st, const char *target, int follow)
{
	const char *type = types[(st->st_mode & S_IFMT) >> 12];
	struct tm tm;
	char when[64];
	gmtime_r(&st->st_mtim.tv_sec, &tm);
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	printf("{\"name\":"), json_str(name), printf(",\"path\":"), json_str(path);
	printf(",\"type\":\"%s\",\"size\":%lld,\"mode\":\"%04o\",\"uid\":%u,\"gid\":%u,\"mtime\":\"%s.%03ldZ\"",
	       type ? type : "unknown", (long long)st->st_size, (unsigned)(st->st_mode & 07777), (unsigned)st->st_uid,
	       (unsigned)st->st_gid, when, st->st_mtim.tv_nsec / 1000000);
	if (target)
		printf(",\"target\":"), json_str(target), print_resolved(path);
	print_xattrs(path, follow);
	printf("}\n");
}

/* readlinkat into a new string (NULL unless a symlink, or on error). */
static char *link_target(int dirfd, const char *name, const struct stat *st)
{
	char buf[4097];
	ssize_t n = S_ISLNK(st->st_mode) ? readlinkat(dirfd, name, buf, sizeof buf - 1) : -1;
	return n < 0 ? NULL : strndup(buf, (size_t)n);
}

static char *join(const char *dir, const char *name)
{
	size_t n = strlen(dir);
	char *s = malloc(n + strlen(name) + 2);
	if (!s)
		exit(fail(errno, dir));
	sprintf(s, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
	return s;
}

static int own(const char *path);

static int flush_out(void)
{
	return fflush(stdout) == EOF || ferror(stdout) ? fail(errno, "-") : 0;
}

/* mkdir -p: every missing directory of path made (mode 0755, the last `mode`; each given to --owner); an existing
 * directory (or a link to one) is fine, an existing non-directory is EEXIST (last) or ENOTDIR.
 * *made: the last one was created. */
static int make_dirs(char *path, mode_t mode, int *made)
{
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		path[--n] = 0;
	for (char *p = path + 1;; p++) {
		if (*p && *p != '/')
			continue;
		char c = *p;
		struct stat st;
		*p = 0;
		int r = mkdir(path, c ? 0755 : mode), e = errno;
		if (r == 0 && own(path) < 0)
			return fail(errno, path);
		if (r == 0 && !c)
			*made = 1;
		else if (r < 0 && stat(path, &st) == 0)
			r = S_ISDIR(st.st_mode) ? 0 : -1, e = c ? ENOTDIR : EEXIST;
		if (r < 0)
			return fail(e, path);
		*p = c;
		if (!c)
			return 0;
	}
}

static int empty_dir(int fd, const char *path);

/* Remove name in dirfd (path: its name in messages), never following a symlink: unlinkat fails
 * on a directory (EISDIR), which is then opened O_NOFOLLOW, emptied and removed. Gone is fine. */
static int remove_at(int dirfd, const char *name, const char *path)
{
	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno != EISDIR)
		return fail(errno, path);
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : fail(errno, path);
	if (empty_dir(fd, path))
		return 1;
	return unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? fail(errno, path) : 0;
}

/* Everything in fd (consumed) removed; passes repeat until one finds nothing, as a directory
 * changed while it is read may skip entries. */
static int empty_dir(int fd, const char *path)
{
	DIR *d = fdopendir(fd);
	if (!d)
		return fail(errno, path);
	int rc = 0;
	for (int found = 1; found && !rc;) {
		struct dirent *de;
		found = 0;
		rewinddir(d);
		while (!rc && (errno = 0, de = readdir(d)) != NULL) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			char *sub = join(path, de->d_name);
			rc = remove_at(fd, de->d_name, sub);
			free(sub);
			found = 1;
		}
		if (!rc && errno)
			rc = fail(errno, path);
	}
	closedir(d);
	return rc;
}

enum {
	F_MODE = 1,
	F_PARENTS = 2,
	F_APPEND = 4,
	F_FOLLOW = 8,
	F_RECURSIVE = 16,
	F_FORCE = 32,
	F_SIZE = 64,
	F_XATTR = 128,
	F_OWNER = 256,
	F_DEPTH = 512,
	F_THROUGH = 1024
};

/* --owner: who what the command makes belongs to (-1: its maker) */
static uid_t owner_uid = (uid_t)-1;
static gid_t owner_gid = (gid_t)-1;
/* ls --depth: the levels listed */
static long list_depth = 1;
/* mv: the second path */
static const char *dest_path;

/* Give what path names (made by this command) to --owner's ids, when given. */
static int own(const char *path)
{
	return owner_uid == (uid_t)-1 || lchown(path, owner_uid, owner_gid) == 0 ? 0 : -1;
}

/* write: the NAME=VALUE of each --xattr, set on the file written */
#define MAX_XATTRS 256
static const char *xattrs[MAX_XATTRS];
static int nxattrs;

/* Set each --xattr on fd; -1 with errno on the first that fails. */
static int set_xattrs(int fd)
{
	for (int i = 0; i < nxattrs; i++) {
		const char *eq = strchr(xattrs[i], '=');
		char name[256];
		if ((size_t)(eq - xattrs[i]) >= sizeof name)
			return errno = ERANGE, -1;
		memcpy(name, xattrs[i], (size_t)(eq - xattrs[i]));
		name[eq - xattrs[i]] = 0;
		if (fsetxattr(fd, name, eq + 1, strlen(eq + 1), 0) < 0)
			return -1;
	}
	return 0;
}

/* write: the bytes the caller says it sends (--size); fewer means its input broke off */
static long long expect_size = -1;
/* write: the temp file, removed if the write is stopped (SIGTERM: the caller's input failed) */
static char *volatile temp_path;

static void drop_temp(int sig)
{
	if (temp_path)
		unlink(temp_path);
	_exit(128 + sig);
}

static int cmd_cat(const char *path, int set, mode_t mode)
{
	(void)set; /* one signature for every command of the table */
	(void)mode;
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC), rerr;
	if (fd < 0 || fstat(fd, &st) < 0)
		return fail(errno, path);
	if (S_ISDIR(st.st_mode))
		return fail(EISDIR, path);
	if (copy_fd(fd, 1, &rerr) < 0)
		return fail(errno, rerr ? path : "-");
	close(fd);
	return 0;
}

/* write --through: where a write to path goes when a link there is written through, as an open
 * of it would (every link followed, to a target that need not exist yet). A new string. */
static char *through_links(const char *path)
{
	char *p = strdup(path);
	for (int i = 0; p && i < 40; i++) {
		struct stat st;
		char buf[4097], *next;
		ssize_t n;
		if (lstat(p, &st) < 0 || !S_ISLNK(st.st_mode) || (n = readlink(p, buf, sizeof buf - 1)) < 0)
			return p;
		buf[n] = 0;
		const char *slash = strrchr(p, '/');
		int keep = buf[0] == '/' || !slash ? 0 : (int)(slash - p + 1);
		if (asprintf(&next, "%.*s%s", keep, p, buf) < 0)
			next = NULL;
		free(p);
		p = next;
	}
	if (p)
		free(p), errno = ELOOP;
	return NULL;
}

static int cmd_write(const char *path, int set, mode_t mode)
{
	long long n = 0;
	int fd, rerr = 0;
	mode = set & F_MODE ? mode : 0644;
	if (!*path)
		return fail(ENOENT, path);
	if (path[strlen(path) - 1] == '/')
		return fail(EISDIR, path);
	const char *slash = strrchr(path, '/');
	/* the parents of the path asked for (never of where a link there leads) */
	if ((set & F_PARENTS) && slash && slash > path) {
		char *dir = strndup(path, (size_t)(slash - path));
		int made = 0;
		if (!dir || make_dirs(dir, 0755, &made))
			return dir ? 1 : fail(errno, path);
		free(dir);
	}
	if (set & F_THROUGH) {
		const char *asked = path;
		if (!(path = through_links(asked)))
			return fail(errno, asked);
		slash = strrchr(path, '/');
	}
	/* a device, a FIFO or a socket at the end is written into, as an open of the link would
	 * (renamed over, it would be replaced by a file: /dev/null behind ~/.bash_history); so is a
	 * file of the kernel's (/proc, /sys, cgroupfs), beside which no temporary file can be made */
	struct stat end;
	if ((set & F_THROUGH ? stat(path, &end) : lstat(path, &end)) == 0 &&
	    ((set & F_THROUGH && !S_ISREG(end.st_mode)) || (S_ISREG(end.st_mode) && kernel_file(path)))) {
		if (S_ISDIR(end.st_mode))
			return fail(EISDIR, path);
		/* (its mode is its own: as envd's open of an existing file, none is given to it) */
		if ((fd = open(path, O_WRONLY | (set & F_APPEND ? O_APPEND : O_TRUNC) | O_CLOEXEC)) < 0)
			return fail(errno, path);
		/* metadata where the file takes it; a device, /proc and /sys take none: dropped, as envd does */
		if ((set_xattrs(fd) < 0 && errno != EPERM && errno != EOPNOTSUPP) || (n = copy_fd(0, fd, &rerr)) < 0)
			return fail(errno, n < 0 && rerr ? "-" : path);
		if (close(fd) < 0)
			return fail(errno, path);
		if (expect_size >= 0 && n != expect_size) {
			fprintf(stderr,
				"snaplab: file: EPIPE: %s: the input ended after %lld of %lld bytes (written where it is: it holds what came)\n",
				path, n, expect_size);
			return 1;
		}
		printf("{\"bytes\":%lld}\n", n);
		return flush_out();
	}
	if (set & F_APPEND) {
		fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, mode);
		if (fd < 0 || (owner_uid != (uid_t)-1 && fchown(fd, owner_uid, owner_gid) < 0) ||
		    ((set & F_MODE) && fchmod(fd, mode) < 0) || set_xattrs(fd) < 0)
			return fail(errno, path);
		if ((n = copy_fd(0, fd, &rerr)) < 0)
			return fail(errno, rerr ? "-" : path);
		if (close(fd) < 0)
			return fail(errno, path);
	} else {
		/* the temp name keeps a long NAME short enough to fit NAME_MAX; its '-' says PATH is there
		 * (replaced), '+' that it is new: what a watcher (watch.c) tells of the rename */
		const char *base = slash ? slash + 1 : path;
		char *tmp;
		struct stat was;
		char sign = lstat(path, &was) == 0 ? '-' : '+';
		int replaces = sign == '-' && S_ISREG(was.st_mode);
		/* a file replaced keeps its permission bits (not set-id or sticky) unless --mode says */
		if (replaces && !(set & F_MODE))
			mode = was.st_mode & 0777;
		if (asprintf(&tmp, "%.*s.%.200s.snaplab%cXXXXXX", (int)(base - path), path, base, sign) < 0)
			return fail(errno, path);
		struct sigaction sa = { .sa_handler = drop_temp };
		sigemptyset(&sa.sa_mask);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGHUP, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0)
			return fail(errno, path);
		temp_path = tmp;
		int e = 0;
		/* and its owner, where the writer may give it (root; else the writer's own file stays its) */
		if (replaces && owner_uid == (uid_t)-1 && fchown(fd, was.st_uid, was.st_gid) < 0 && errno != EPERM)
			e = errno;
		if (!e && ((owner_uid != (uid_t)-1 && fchown(fd, owner_uid, owner_gid) < 0) || fchmod(fd, mode) < 0 ||
			   set_xattrs(fd) < 0 || (n = copy_fd(0, fd, &rerr)) < 0))
			e = errno;
		if (close(fd) < 0 && !e)
			e = errno;
		if (!e && expect_size >= 0 && n != expect_size) {
			unlink(tmp);
			fprintf(stderr,
				"snaplab: file: EPIPE: %s: the input ended after %lld of %lld bytes (the file is unchanged)\n",
				path, n, expect_size);
			return 1;
		}
		if (!e && rename(tmp, path) < 0)
			e = errno;
		temp_path = NULL;
		if (e) {
			unlink(tmp);
			return fail(e, n < 0 && rerr ? "-" : path);
		}
		free(tmp);
	}
	printf("{\"bytes\":%lld}\n", n);
	return flush_out();
}

static int cmd_stat(const char *path, int set, mode_t mode)
{
	(void)mode; /* one signature for every command of the table */
	struct stat st;
	if ((set & F_FOLLOW ? stat(path, &st) : lstat(path, &st)) < 0)
		return fail(errno, path);
	print_entry(base_name(path), path, &st, link_target(AT_FDCWD, path, &st), set & F_FOLLOW);
	return flush_out();
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of the directory fd (consumed; path its name in output), sorted, each followed by
 * its own when it is a directory (not a link to one) and level < list_depth. */
static int list_dir(int fd, const char *path, long level)
{
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (!d)
		return fail(errno, path);
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	while ((errno = 0, de = readdir(d)) != NULL) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (n == cap && !(names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names)))
			return fail(errno, path);
		if (!(names[n++] = strdup(de->d_name)))
			return fail(errno, path);
	}
	if (errno)
		return fail(errno, path);
	qsort(names, n, sizeof *names, by_name);
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		char *sub = join(path, names[i]);
		if (rc) {
			/* an error below: the rest freed, not listed */
		} else if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0) {
			char *target = link_target(fd, names[i], &st);
			print_entry(names[i], sub, &st, target, 0);
			free(target);
			int sfd = S_ISDIR(st.st_mode) && level < list_depth
					  ? openat(fd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
					  : -2;
			/* gone, or no longer a directory, since it was read: its entry stands, nothing under it */
			if (sfd >= 0 || (sfd == -1 && errno != ENOENT && errno != ENOTDIR && errno != ELOOP))
				rc = list_dir(sfd, sub, level + 1);
		} else if (errno != ENOENT) { /* gone since it was read: left out */
			rc = fail(errno, sub);
		}
		free(sub), free(names[i]);
	}
	free(names);
	closedir(d);
	return rc;
}

static int cmd_ls(const char *path, int set, mode_t mode)
{
	(void)set; /* one signature for every command of the table */
	(void)mode;
	/* a descriptor a level: a deep walk may take as many as the hard limit allows */
	struct rlimit rl;
	if (list_depth > 1 && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	return list_dir(open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), path, 1) || flush_out();
}

static int cmd_mkdir(const char *path, int set, mode_t mode)
{
	int made = 0;
	char *p = strdup(path);
	mode_t m = set & F_MODE ? mode : 0755;
	if (!*path)
		return fail(ENOENT, path);
	if (!p)
		return fail(errno, path);
	if (set & F_PARENTS) {
		if (make_dirs(p, m, &made))
			return 1;
	} else if (mkdir(path, m) < 0 || own(path) < 0) {
		return fail(errno, path);
	} else {
		made = 1;
	}
	/* an explicit mode is the mode, whatever the umask */
	if (made && (set & F_MODE) && chmod(path, mode) < 0)
		return fail(errno, path);
	return 0;
}

static int cmd_rm(const char *path, int set, mode_t mode)
{
	(void)mode; /* one signature for every command of the table */
	struct stat st;
	char *p = strdup(path), *base = base_name(path);
	size_t n = strlen(path);
	if (!p || !base)
		return fail(errno, path);
	while (n > 1 && p[n - 1] == '/')
		p[--n] = 0;
	if (!strcmp(p, "/") || !strcmp(base, ".") || !strcmp(base, ".."))
		return fail(EINVAL, path);
	if (lstat(p, &st) < 0)
		return (set & F_FORCE) && errno == ENOENT ? 0 : fail(errno, path);
	/* "link/" would resolve through the link: only a real directory may have a trailing slash */
	if (!S_ISDIR(st.st_mode))
		return n < strlen(path) ? fail(ENOTDIR, path) : unlink(p) < 0 ? fail(errno, path) : 0;
	if (set & F_RECURSIVE)
		return remove_at(AT_FDCWD, p, path);
	return rmdir(p) < 0 ? fail(errno, path) : 0;
}

static int cmd_mv(const char *path, int set, mode_t mode)
{
	(void)mode; /* one signature for every command of the table */
	const char *slash = strrchr(dest_path, '/');
	if (!*path || !*dest_path)
		return fail(ENOENT, *path ? dest_path : path);
	if ((set & F_PARENTS) && slash && slash > dest_path) {
		char *dir = strndup(dest_path, (size_t)(slash - dest_path));
		int made = 0;
		if (!dir || make_dirs(dir, 0755, &made))
			return dir ? 1 : fail(errno, dest_path);
		free(dir);
	}
	if (rename(path, dest_path) == 0)
		return 0;
	/* which path the error is of: the source when it is not there, else the target */
	struct stat st;
	int e = errno;
	return fail(e, e == ENOENT && lstat(path, &st) < 0 ? path : dest_path);
}

static const struct {
	const char *name;
	int bit;
} flags[] = {
	{ "--mode", F_MODE },		{ "--parents", F_PARENTS }, { "--append", F_APPEND },	{ "-L", F_FOLLOW },
	{ "--recursive", F_RECURSIVE }, { "--force", F_FORCE },	    { "--size", F_SIZE },	{ "--xattr", F_XATTR },
	{ "--owner", F_OWNER },		{ "--depth", F_DEPTH },	    { "--through", F_THROUGH },
};

static const struct {
	const char *name;
	int (*run)(const char *path, int set, mode_t mode);
	int allowed;
	int paths;
} cmds[] = {
	{ "cat", cmd_cat, 0, 1 },
	{ "write", cmd_write, F_MODE | F_PARENTS | F_APPEND | F_SIZE | F_XATTR | F_OWNER | F_THROUGH, 1 },
	{ "stat", cmd_stat, F_FOLLOW, 1 },
	{ "ls", cmd_ls, F_DEPTH, 1 },
	{ "mkdir", cmd_mkdir, F_MODE | F_PARENTS | F_OWNER, 1 },
	{ "rm", cmd_rm, F_RECURSIVE | F_FORCE, 1 },
	{ "mv", cmd_mv, F_PARENTS | F_OWNER, 2 },
};

/* argv[1] is "file": flags, then exactly one PATH, two for mv (`--` ends the flags). */
int file_main(int argc, char **argv)
{
	size_t c = 0, ncmds = sizeof cmds / sizeof cmds[0];
	while (argc > 2 && c < ncmds && strcmp(argv[2], cmds[c].name))
		c++;
	const char *path = NULL;
	int set = 0, flags_done = 0;
	mode_t mode = 0;
	for (int i = 3; argc > 2 && c < ncmds && i < argc; i++) {
		const char *a = argv[i];
		size_t f = 0, nflags = sizeof flags / sizeof flags[0];
		if (dest_path || (path && cmds[c].paths == 1))
			goto usage;
		if (flags_done || a[0] != '-') {
			*(path ? &dest_path : &path) = a;
			continue;
		}
		if (!strcmp(a, "--")) {
			flags_done = 1;
			continue;
		}
		while (f < nflags && strcmp(a, flags[f].name))
			f++;
		if (f == nflags || !(cmds[c].allowed & flags[f].bit))
			goto usage;
		set |= flags[f].bit;
		if (flags[f].bit == F_MODE) {
			char *end;
			if (i + 1 == argc || !argv[i + 1][0])
				goto usage;
			mode = (mode_t)strtoul(argv[++i], &end, 8) & 07777;
			if (*end || argv[i][0] < '0' || argv[i][0] > '7')
				goto usage;
		}
		if (flags[f].bit == F_SIZE) {
			char *end;
			if (i + 1 == argc || argv[i + 1][0] < '0' || argv[i + 1][0] > '9')
				goto usage;
			expect_size = strtoll(argv[++i], &end, 10);
			if (*end || expect_size < 0)
				goto usage;
		}
		if (flags[f].bit == F_XATTR) {
			/* NAME=VALUE, NAME not empty; repeated */
			if (i + 1 == argc || nxattrs == MAX_XATTRS || !strchr(argv[i + 1], '=') ||
			    argv[i + 1][0] == '=')
				goto usage;
			xattrs[nxattrs++] = argv[++i];
		}
		if (flags[f].bit == F_OWNER) {
			/* UID:GID, both numbers (the caller resolved the names) */
			unsigned long u, g;
			char *end;
			if (i + 1 == argc || argv[i + 1][0] < '0' || argv[i + 1][0] > '9')
				goto usage;
			u = strtoul(argv[++i], &end, 10);
			if (*end != ':' || end[1] < '0' || end[1] > '9')
				goto usage;
			g = strtoul(end + 1, &end, 10);
			if (*end || u >= 0xffffffffUL || g >= 0xffffffffUL)
				goto usage;
			owner_uid = (uid_t)u, owner_gid = (gid_t)g;
		}
		if (flags[f].bit == F_DEPTH) {
			char *end;
			if (i + 1 == argc || argv[i + 1][0] < '1' || argv[i + 1][0] > '9')
				goto usage;
			list_depth = strtol(argv[++i], &end, 10);
			if (*end || list_depth < 1)
				goto usage;
		}
	}
	if (path && (cmds[c].paths == 1 || dest_path))
		return cmds[c].run(path, set, mode);
usage:
	fprintf(stderr, "usage: snaplab-agent file cat|write|stat|ls|mkdir|rm|mv ...\n");
	return 2;
}
