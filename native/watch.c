/*
 * snaplab-agent watch [--recursive] PATH: the changes under a directory of the machine, as they
 * happen, from inotify in the machine itself (run through its agent like any command, as the
 * exec's user). It prints {"type":"start"} once its watches hold, then one JSON line an event:
 * {"type":"create|write|remove|rename|chmod","name":"sub/file"}, the name relative to PATH
 * ("." for PATH itself), the types E2B's envd names (from inotify as fsnotify maps it: CREATE and
 * MOVED_TO create, MODIFY write, DELETE remove, MOVED_FROM rename, ATTRIB chmod). It runs until it
 * is killed, or PATH itself is gone (exit 0).
 *
 * --recursive watches every directory below PATH, and each one made or moved in later: what it
 * holds by the time its watch is added is told as created (a directory made with its contents
 * at once is seen whole).
 *
 * `snaplab-agent file write` writes a file as .NAME.snaplab-XXXXXX renamed over NAME (files.c;
 * .NAME.snaplab+XXXXXX when NAME was not there); that temporary file is not told: its rename is
 * told as envd tells a write of NAME, "create" (a new NAME) then "write".
 *
 * Exit 1 with `snaplab: file: ERRNAME: PATH: strerror` on stderr (as files.c), 2 on bad usage.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define MASK                                                                                                           \
	(IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_DELETE_SELF | IN_MOVED_FROM | IN_MOVED_TO | IN_MOVE_SELF | \
	 IN_ONLYDIR)
#define TEMP_SUFFIX ".snaplab-XXXXXX"

struct dir_watch {
	int wd;
	char *rel; /* "" for PATH */
};

static const char *root;
static int ifd, recursive;
static struct dir_watch *dirs;
static size_t ndirs, cap;
/* the last temporary file renamed away: its MOVED_TO (same cookie) is the write it ends */
static uint32_t moved_cookie;
static int moved_existed, moved_pending;

static int fail(int e, const char *path)
{
	static const struct {
		int no;
		const char *name;
	} names[] = { { ENOENT, "ENOENT" }, { EACCES, "EACCES" }, { ENOTDIR, "ENOTDIR" },    { ENOSPC, "ENOSPC" },
		      { EMFILE, "EMFILE" }, { ENOMEM, "ENOMEM" }, { EOVERFLOW, "EOVERFLOW" } };
	const char *name = "EIO";
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (names[i].no == e)
			name = names[i].name;
	fprintf(stderr, "snaplab: file: %s: %s: %s\n", name, path, strerror(e));
	return 1;
}

static void *must(void *p)
{
	if (!p)
		exit(fail(ENOMEM, root));
	return p;
}

static char *join(const char *a, const char *b)
{
	char *s;
	if (asprintf(&s, "%s%s%s", a, *a && *b ? "/" : "", b) < 0)
		exit(fail(ENOMEM, root));
	return s;
}

void json_str(const char *s); /* files.c */

static void emit(const char *type, const char *rel)
{
	printf("{\"type\":\"%s\",\"name\":", type);
	json_str(*rel ? rel : ".");
	printf("}\n");
}

static struct dir_watch *dir_of(int wd)
{
	for (size_t i = 0; i < ndirs; i++)
		if (dirs[i].wd == wd)
			return &dirs[i];
	return NULL;
}

static void forget_dir(int wd)
{
	struct dir_watch *d = dir_of(wd);
	if (d) {
		free(d->rel);
		*d = dirs[--ndirs];
	}
}

/* Is NAME a temporary file of `file write`? 1: of a NAME that was there, 2: of a new one, else 0. */
static int is_temp(const char *name)
{
	size_t n = strlen(name), s = strlen(TEMP_SUFFIX);
	if (n < s + 2 || name[0] != '.' || strncmp(name + n - s, ".snaplab", 8))
		return 0;
	return name[n - 7] == '-' ? 1 : name[n - 7] == '+' ? 2 : 0;
}

static void add_tree(const char *rel, int announce);

/* Watch the directory at rel and, recursive, those below it; announce: tell what it holds as created. */
static void add_dir(const char *rel, int announce)
{
	char *path = join(root, rel);
	int wd = inotify_add_watch(ifd, path, MASK | (*rel ? IN_DONT_FOLLOW : 0));
	if (wd < 0) {
		/* else it went before its watch held, or is not ours to read (its changes are not told) */
		if (!*rel || (errno != ENOENT && errno != ENOTDIR && errno != EACCES && errno != ELOOP))
			exit(fail(errno, path));
		free(path);
		return;
	}
	struct dir_watch *known = dir_of(wd);
	if (known) { /* the same directory under a new name (moved): not new */
		free(known->rel);
		known->rel = must(strdup(rel));
		announce = 0;
	} else {
		if (ndirs == cap)
			dirs = must(realloc(dirs, (cap = cap ? cap * 2 : 16) * sizeof *dirs));
		dirs[ndirs++] = (struct dir_watch){ wd, must(strdup(rel)) };
	}
	free(path);
	if (recursive)
		add_tree(rel, announce);
}

static void add_tree(const char *rel, int announce)
{
	char *path = join(root, rel);
	DIR *d = opendir(path);
	free(path);
	if (!d)
		return; /* gone, or not ours to read: its own watch says what it can */
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *child = join(rel, e->d_name);
		struct stat st;
		int is_dir = e->d_type == DT_DIR ||
			     (e->d_type == DT_UNKNOWN && !fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
			      S_ISDIR(st.st_mode));
		if (announce)
			emit("create", child);
		if (is_dir)
			add_dir(child, announce);
		free(child);
	}
	closedir(d);
}

/* One event of a temporary file of `file write`: only its rename over NAME is told (as a write). */
static void temp_event(const struct inotify_event *ev, int kind)
{
	if (ev->mask & IN_MOVED_FROM) {
		moved_existed = kind == 1;
		moved_cookie = ev->cookie;
		moved_pending = 1;
	}
}

/* One event: told as envd tells it; a new directory watched (recursive). 1: PATH itself is gone. */
static int handle(const struct inotify_event *ev)
{
	struct dir_watch *dir = dir_of(ev->wd);
	if (ev->mask & IN_Q_OVERFLOW)
		exit(fail(EOVERFLOW, root));
	if (!dir)
		return 0;
	if (!ev->len) { /* the directory itself: told by its parent's watch, but for PATH */
		if (ev->mask & IN_IGNORED) {
			int top = !*dir->rel;
			forget_dir(ev->wd);
			return top;
		}
		if (!*dir->rel && (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)))
			emit(ev->mask & IN_DELETE_SELF ? "remove" : "rename", "");
		return 0;
	}
	int kind = is_temp(ev->name);
	if (kind) {
		temp_event(ev, kind);
		return 0;
	}
	char *rel = join(dir->rel, ev->name);
	int from_temp = (ev->mask & IN_MOVED_TO) && moved_pending && ev->cookie == moved_cookie;
	moved_pending = 0;
	if (from_temp) {
		if (!moved_existed)
			emit("create", rel);
		emit("write", rel);
	} else {
		if (ev->mask & (IN_CREATE | IN_MOVED_TO))
			emit("create", rel);
		if (ev->mask & IN_MOVED_FROM)
			emit("rename", rel);
		if (ev->mask & IN_ATTRIB)
			emit("chmod", rel);
		if (ev->mask & IN_MODIFY)
			emit("write", rel);
		if (ev->mask & IN_DELETE)
			emit("remove", rel);
	}
	if (recursive && (ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO)))
		add_dir(rel, 1);
	free(rel);
	return 0;
}

/* argv[1] is "watch": [--recursive] PATH (`--` ends the flags). */
int watch_main(int argc, char **argv)
{
	int i = 2;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		}
		if (strcmp(argv[i], "--recursive"))
			goto usage;
		recursive = 1;
	}
	if (i != argc - 1 || !argv[i][0])
		goto usage;
	root = argv[i];
	if ((ifd = inotify_init1(IN_CLOEXEC)) < 0)
		return fail(errno, root);
	add_dir("", 0);
	emit("start", "");
	fflush(stdout);
	static char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
	for (;;) {
		ssize_t n = read(ifd, buf, sizeof buf);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return fail(n < 0 ? errno : EIO, root);
		int done = 0;
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			done |= handle(ev);
			p += sizeof *ev + ev->len;
		}
		if (fflush(stdout) == EOF || done)
			return done ? 0 : 1;
	}
usage:
	fprintf(stderr, "usage: snaplab-agent watch [--recursive] PATH\n");
	return 2;
}
