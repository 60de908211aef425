/*
 * snaplab-unpack: apply one tar stream (stdin) to an image tree, contained by the kernel.
 *
 *   snaplab-unpack ROOT [--layer]
 *
 * Reads ustar, pax (path, linkpath, size, uid, gid, mtime, SCHILY.xattr.*) and GNU long names.
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

#define BLOCK 512
#define MAX_PATH 4096
#define MAX_NAME 255
#define MAX_PAX (1 << 20)
#define MAX_XATTRS 64

static int root_fd = -1;
static int layer_mode;

static struct {
  uint64_t entries, files, dirs, symlinks, hardlinks, whiteouts, opaques, devices, xattrs_dropped, bytes;
} stats;

static void fail(const char *code, const char *fmt, ...) {
  char msg[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\t') *p = ' ';
  fprintf(stderr, "%s\t%s\n", code, msg);
  exit(2);
}

/* ---- input ---- */

static void read_full(void *buf, size_t n, int eof_ok_at_start, int *eof) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(0, (char *)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("IO", "reading the archive: %s", strerror(errno));
    if (r == 0) {
      if (got == 0 && eof_ok_at_start && eof) {
        *eof = 1;
        return;
      }
      fail("BAD_TAR", "the archive ends in the middle of an entry (truncated)");
    }
    got += (size_t)r;
  }
}

static void skip_bytes(uint64_t n) {
  char buf[65536];
  while (n > 0) {
    size_t k = n > sizeof buf ? sizeof buf : (size_t)n;
    read_full(buf, k, 0, NULL);
    n -= k;
  }
}

/* sizes past this are corrupt (and would wrap when padded to a block) */
#define MAX_SIZE (1ull << 62)
#define MAX_ID 0xfffffffeull

static uint64_t padded(uint64_t size) { return (size + BLOCK - 1) / BLOCK * BLOCK; }

/* ---- paths written by this layer (a whiteout or an opaque marker never removes these) ----
 * By path, not by inode: a hard link to a lower layer's file must not shield that file. Every
 * entry marks its own path and all its ancestors, so an opaque parent keeps what the layer put
 * below it whatever the order of the tar. */

static char **written;
static size_t written_cap, written_len;

static uint64_t path_hash(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

static int written_find(const char *p, size_t n, size_t *slot) {
  size_t i = (size_t)path_hash(p, n) & (written_cap - 1);
  for (; written[i]; i = (i + 1) & (written_cap - 1))
    if (strlen(written[i]) == n && memcmp(written[i], p, n) == 0) {
      *slot = i;
      return 1;
    }
  *slot = i;
  return 0;
}

static void written_put(const char *p, size_t n) {
  if ((written_len + 1) * 2 > written_cap) {
    char **old = written;
    size_t old_cap = written_cap;
    written_cap = written_cap ? written_cap * 2 : 4096;
    written = calloc(written_cap, sizeof *written);
    if (!written) fail("IO", "out of memory");
    for (size_t i = 0; i < old_cap; i++)
      if (old[i]) {
        size_t slot;
        written_find(old[i], strlen(old[i]), &slot);
        written[slot] = old[i];
      }
    free(old);
  }
  size_t slot;
  if (written_find(p, n, &slot)) return;
  written[slot] = strndup(p, n);
  if (!written[slot]) fail("IO", "out of memory");
  written_len++;
}

/* mark `rel` and every ancestor of it ("" is the root) */
static void mark_written(const char *rel) {
  if (!layer_mode) return;
  size_t n = strlen(rel);
  written_put(rel, n);
  for (size_t i = n; i-- > 0;)
    if (rel[i] == '/') written_put(rel, i);
  written_put("", 0);
}

static int was_written(const char *rel) {
  if (!written_cap) return 0;
  size_t slot;
  return written_find(rel, strlen(rel), &slot);
}

/* ---- paths ---- */

/* Normalize an archive name in place: drop "./" and empty components; refuse absolute names,
   "..", and over-long names. Returns "" for the root itself. */
static void clean_path(char *p, const char *what, const char *orig) {
  if (strlen(p) >= MAX_PATH) fail("UNSAFE_PATH", "%s name is longer than %d bytes", what, MAX_PATH - 1);
  if (p[0] == '/') fail("UNSAFE_PATH", "%s %s is an absolute name", what, orig);
  char out[MAX_PATH];
  size_t o = 0;
  char *save = NULL;
  for (char *c = strtok_r(p, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (strcmp(c, ".") == 0) continue;
    if (strcmp(c, "..") == 0) fail("UNSAFE_PATH", "%s %s has a '..' component", what, orig);
    if (strlen(c) > MAX_NAME) fail("UNSAFE_PATH", "%s %s has a component longer than %d bytes", what, orig, MAX_NAME);
    if (o) out[o++] = '/';
    size_t n = strlen(c);
    memcpy(out + o, c, n);
    o += n;
  }
  out[o] = 0;
  memcpy(p, out, o + 1);
}

static int resolve_dir_as(const char *rel, int flags) {
  struct open_how how = {
    .flags = (uint64_t)(flags | O_DIRECTORY | O_CLOEXEC),
    .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
  };
  return (int)syscall(SYS_openat2, root_fd, rel[0] ? rel : ".", &how, sizeof how);
}

static int resolve_dir(const char *rel) { return resolve_dir_as(rel, O_PATH); }

/* One cached parent directory: most entries of a tar share the previous one's. Entries only ever
   replace children of the cached directory, never the directory itself; an opaque directory,
   which can empty an ancestor of it, drops the cache. */
static char cached_dir[MAX_PATH];
static int cached_fd = -1;

static void drop_cache(void) {
  if (cached_fd >= 0) close(cached_fd);
  cached_fd = -1;
  cached_dir[0] = 0;
}

static void remove_at(int dirfd, const char *name, const char *shown);

/* The parent directory of `rel` (made, root-owned 0755, where the archive left it out), and the
   last component in *base. */
static int parent_of(const char *rel, const char **base, const char *shown) {
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
  if (cached_fd >= 0 && strcmp(dir, cached_dir) == 0) return cached_fd;
  int fd = resolve_dir(dir);
  if (fd < 0 && errno == ENOENT) {
    /* make the missing directories one at a time, each resolved in the root again */
    char part[MAX_PATH];
    size_t n = strlen(dir);
    for (size_t i = 0; i <= n; i++) {
      if (dir[i] != '/' && dir[i] != 0) continue;
      memcpy(part, dir, i);
      part[i] = 0;
      int pfd = resolve_dir(part);
      if (pfd >= 0) {
        close(pfd);
        continue;
      }
      if (errno != ENOENT) break;
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
      if (ufd < 0) break;
      if (mkdirat(ufd, leaf, 0755) < 0 && errno != EEXIST) fail("IO", "mkdir %s: %s", part, strerror(errno));
      close(ufd);
    }
    fd = resolve_dir(dir);
  }
  if (fd < 0) {
    if (errno == ELOOP || errno == EXDEV)
      fail("UNSAFE_PATH", "%s goes through a symbolic link (%s); entries are never written through links", shown, dir);
    if (errno == ENOTDIR) fail("UNSAFE_PATH", "%s: a parent of it is not a directory", shown);
    fail("IO", "%s: cannot open its directory: %s", shown, strerror(errno));
  }
  if (cached_fd >= 0) close(cached_fd);
  cached_fd = fd;
  strcpy(cached_dir, dir);
  return fd;
}

/* Remove every entry of the directory open at fd (taken over: closed here), never following a
 * link. keep_layer: `rel` is the directory's path in the tree, and what this layer wrote below
 * it stays. One descriptor per level. */
static void empty_dir(int fd, const char *rel, const char *shown, int keep_layer) {
  DIR *d = fdopendir(fd);
  if (!d) fail("IO", "opendir %s: %s", shown, strerror(errno));
  int dfd = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (keep_layer) {
      char child[MAX_PATH * 2];
      snprintf(child, sizeof child, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
      if (was_written(child)) {
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
          int cfd = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
          if (cfd < 0) fail("IO", "open %s/%s: %s", shown, e->d_name, strerror(errno));
          empty_dir(cfd, child, shown, 1);
        }
        continue;
      }
    }
    remove_at(dfd, e->d_name, shown);
  }
  closedir(d);
}

static void remove_at(int dirfd, const char *name, const char *shown) {
  if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return;
  if (errno != EISDIR) fail("IO", "remove %s: %s", shown, strerror(errno));
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) fail("IO", "open %s: %s", shown, strerror(errno));
  empty_dir(fd, "", shown, 0);
  if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT) fail("IO", "rmdir %s: %s", shown, strerror(errno));
}

/* Make room for a new entry named `base`: whatever has the name goes (a directory with all it
   holds), unless keep_dir and it is a directory. Returns 1 when a directory was kept. */
static int clear_name(int pfd, const char *base, const char *shown, int keep_dir) {
  struct stat st;
  if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) return 0;
  if (keep_dir && S_ISDIR(st.st_mode)) return 1;
  remove_at(pfd, base, shown);
  return 0;
}

/* ---- entries ---- */

struct xattr { char *name; char *value; size_t len; };

struct entry {
  char path[MAX_PATH + 1];
  char link[MAX_PATH + 1];
  char type;
  mode_t mode;
  uid_t uid;
  gid_t gid;
  struct timespec mtime;
  uint64_t size;
  struct xattr xattrs[MAX_XATTRS];
  int nxattrs;
};

static int keep_xattr(const char *name) {
  /* user.overlay.* would be read as overlayfs's own marks when the tree is a layer (userxattr) */
  if (strncmp(name, "user.overlay.", 13) == 0) return 0;
  return strcmp(name, "security.capability") == 0 || strncmp(name, "user.", 5) == 0 ||
         strcmp(name, "system.posix_acl_access") == 0 || strcmp(name, "system.posix_acl_default") == 0;
}

static void set_meta(int fd, const struct entry *e, const char *shown) {
  if (fchown(fd, e->uid, e->gid) < 0) fail("IO", "chown %s: %s", shown, strerror(errno));
  /* after chown, which clears setuid and setgid */
  if (fchmod(fd, e->mode & 07777) < 0) fail("IO", "chmod %s: %s", shown, strerror(errno));
  for (int i = 0; i < e->nxattrs; i++) {
    if (!keep_xattr(e->xattrs[i].name)) {
      stats.xattrs_dropped++;
      continue;
    }
    if (fsetxattr(fd, e->xattrs[i].name, e->xattrs[i].value, e->xattrs[i].len, 0) < 0)
      fail("IO", "setting %s on %s: %s", e->xattrs[i].name, shown, strerror(errno));
  }
}

/* directory times are set once the layer is done: writing into a directory changes its mtime */
static struct dir_time { char *path; struct timespec mtime; } *dir_times;
static size_t dir_times_len, dir_times_cap;

static void remember_dir_time(const char *rel, struct timespec t) {
  if (dir_times_len == dir_times_cap) {
    dir_times_cap = dir_times_cap ? dir_times_cap * 2 : 256;
    dir_times = realloc(dir_times, dir_times_cap * sizeof *dir_times);
    if (!dir_times) fail("IO", "out of memory");
  }
  dir_times[dir_times_len].path = strdup(rel);
  dir_times[dir_times_len].mtime = t;
  dir_times_len++;
}

static void apply_dir_times(void) {
  for (size_t i = 0; i < dir_times_len; i++) {
    int fd = resolve_dir_as(dir_times[i].path, O_RDONLY);
    if (fd < 0) continue; /* removed by a later entry */
    struct timespec ts[2] = { dir_times[i].mtime, dir_times[i].mtime };
    (void)futimens(fd, ts);
    close(fd);
  }
}

static void write_data(int fd, uint64_t size, const char *shown) {
  char buf[1 << 16];
  uint64_t left = size;
  while (left > 0) {
    size_t k = left > sizeof buf ? sizeof buf : (size_t)left;
    read_full(buf, k, 0, NULL);
    size_t off = 0;
    while (off < k) {
      ssize_t w = write(fd, buf + off, k - off);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("IO", "writing %s: %s", shown, strerror(errno));
      off += (size_t)w;
    }
    left -= k;
  }
  skip_bytes(padded(size) - size);
  stats.bytes += size;
}

static void do_whiteout(char *rel, const char *shown) {
  const char *base;
  int pfd;
  /* a whiteout in a directory that is not there hides nothing */
  char dir[MAX_PATH];
  const char *slash = strrchr(rel, '/');
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - rel) : 0, rel);
  int probe = resolve_dir(dir);
  if (probe < 0 && errno == ENOENT) return;
  if (probe >= 0) close(probe);
  pfd = parent_of(rel, &base, shown);
  struct stat st;
  if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) return;
  if (was_written(rel)) return; /* written by this same layer: a whiteout hides only what is below */
  remove_at(pfd, base, shown);
  stats.whiteouts++;
}

static void do_opaque(const char *rel, const char *shown) {
  int fd = resolve_dir(rel);
  if (fd < 0 && errno == ENOENT) return;
  if (fd < 0) {
    if (errno == ELOOP || errno == EXDEV) fail("UNSAFE_PATH", "%s goes through a symbolic link", shown);
    fail("IO", "opaque directory %s: %s", shown, strerror(errno));
  }
  int rfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  close(fd);
  if (rfd < 0) fail("IO", "open %s: %s", shown, strerror(errno));
  drop_cache();
  empty_dir(rfd, rel, shown, 1);
  stats.opaques++;
}

static void apply(struct entry *e) {
  char shown[MAX_PATH + 8];
  snprintf(shown, sizeof shown, "%s", e->path[0] ? e->path : ".");
  stats.entries++;

  /* a .wh. name is a whiteout whatever its type (as Docker and containerd read it) */
  if (layer_mode) {
    const char *slash = strrchr(e->path, '/');
    const char *base = slash ? slash + 1 : e->path;
    if (strncmp(base, ".wh.", 4) == 0) {
      skip_bytes(padded(e->size));
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
          fail("UNSAFE_PATH", "whiteout %s names %s, not an entry of its directory", shown, hidden[0] ? hidden : "nothing");
        snprintf(target, sizeof target, "%.*s%s%s", (int)dlen, e->path, dlen ? "/" : "", base + 4);
        do_whiteout(target, shown);
      }
      return;
    }
  }

  mark_written(e->path);
  if (!e->path[0]) {
    if (e->type != '5') fail("UNSAFE_PATH", "an entry named '.' that is not a directory would replace the image's root");
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
  case '0': case '\0': case '7': {
    clear_name(pfd, base, shown, 0);
    int fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) fail("IO", "create %s: %s", shown, strerror(errno));
    write_data(fd, e->size, shown);
    set_meta(fd, e, shown);
    struct timespec ts[2] = { e->mtime, e->mtime };
    futimens(fd, ts);
    close(fd);
    stats.files++;
    return;
  }
  case '5': {
    if (!clear_name(pfd, base, shown, 1) && mkdirat(pfd, base, 0700) < 0) fail("IO", "mkdir %s: %s", shown, strerror(errno));
    int fd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail("IO", "open %s: %s", shown, strerror(errno));
    set_meta(fd, e, shown);
    close(fd);
    remember_dir_time(e->path, e->mtime);
    skip_bytes(padded(e->size));
    stats.dirs++;
    return;
  }
  case '2': {
    clear_name(pfd, base, shown, 0);
    if (symlinkat(e->link, pfd, base) < 0) fail("IO", "symlink %s: %s", shown, strerror(errno));
    if (fchownat(pfd, base, e->uid, e->gid, AT_SYMLINK_NOFOLLOW) < 0) fail("IO", "chown %s: %s", shown, strerror(errno));
    struct timespec ts[2] = { e->mtime, e->mtime };
    utimensat(pfd, base, ts, AT_SYMLINK_NOFOLLOW);
    skip_bytes(padded(e->size));
    stats.symlinks++;
    return;
  }
  case '1': {
    char target[MAX_PATH + 1];
    char orig[MAX_PATH + 1];
    snprintf(orig, sizeof orig, "%s", e->link);
    snprintf(target, sizeof target, "%s", e->link);
    clean_path(target, "hard link target of", orig);
    if (!target[0]) fail("UNSAFE_PATH", "hard link %s points at the image's root", shown);
    /* the target's directory, resolved in the root like every other path */
    const char *tslash = strrchr(target, '/');
    char tdir[MAX_PATH];
    snprintf(tdir, sizeof tdir, "%.*s", tslash ? (int)(tslash - target) : 0, target);
    const char *tbase = tslash ? tslash + 1 : target;
    int tfd = resolve_dir(tdir);
    if (tfd < 0) {
      if (errno == ELOOP || errno == EXDEV) fail("UNSAFE_PATH", "hard link %s -> %s goes through a symbolic link", shown, orig);
      fail("UNSAFE_PATH", "hard link %s -> %s: no such file in the image", shown, orig);
    }
    if (fstatat(tfd, tbase, &st, AT_SYMLINK_NOFOLLOW) < 0) fail("UNSAFE_PATH", "hard link %s -> %s: no such file in the image", shown, orig);
    if (S_ISDIR(st.st_mode)) fail("UNSAFE_PATH", "hard link %s -> %s is a directory", shown, orig);
    struct stat have;
    if (fstatat(pfd, base, &have, AT_SYMLINK_NOFOLLOW) == 0 && have.st_ino == st.st_ino && have.st_dev == st.st_dev) {
      close(tfd);
    } else {
      clear_name(pfd, base, shown, 0);
      if (linkat(tfd, tbase, pfd, base, 0) < 0) fail("IO", "link %s -> %s: %s", shown, orig, strerror(errno));
      close(tfd);
    }
    skip_bytes(padded(e->size));
    stats.hardlinks++;
    return;
  }
  case '3': case '4': case '6':
    skip_bytes(padded(e->size));
    stats.devices++;
    return;
  default:
    fail("BAD_TAR", "%s has an entry type this reader does not take ('%c')", shown, e->type);
  }
}

/* ---- tar headers ---- */

static uint64_t num(const char *f, size_t n, const char *what) {
  const unsigned char *u = (const unsigned char *)f;
  if (u[0] & 0x80) { /* base-256 (GNU) */
    if (u[0] != 0x80) fail("BAD_TAR", "negative or oversized %s in a header", what);
    uint64_t v = 0;
    for (size_t i = 1; i < n; i++) {
      if (v >> 56) fail("BAD_TAR", "oversized %s in a header", what);
      v = (v << 8) | u[i];
    }
    return v;
  }
  uint64_t v = 0;
  size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == 0)) i++;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
    if (v >> 60) fail("BAD_TAR", "oversized %s in a header", what);
    v = v * 8 + (uint64_t)(f[i] - '0');
  }
  for (; i < n; i++)
    if (f[i] != ' ' && f[i] != 0) fail("BAD_TAR", "a header's %s field is not a number", what);
  return v;
}

/* a pax number: decimal digits only (strtoull would take "-1" and wrap it) */
static uint64_t pax_num(const char *v, const char *what, uint64_t max) {
  if (!*v) fail("BAD_TAR", "a pax %s record is empty", what);
  uint64_t n = 0;
  for (const char *c = v; *c; c++) {
    if (*c < '0' || *c > '9' || n > max / 10) fail("BAD_TAR", "a pax %s record is not a number in range", what);
    n = n * 10 + (uint64_t)(*c - '0');
  }
  if (n > max) fail("BAD_TAR", "a pax %s record is not a number in range", what);
  return n;
}

static int checksum_ok(const unsigned char *h) { return tar_sum_matches(h, num((const char *)h + 148, 8, "checksum")); }

static void read_body(char **buf, uint64_t size, uint64_t limit, const char *what) {
  if (size > limit) fail("BAD_TAR", "%s of %" PRIu64 " bytes is over the limit of %" PRIu64, what, size, limit);
  *buf = malloc((size_t)size + 1);
  if (!*buf) fail("IO", "out of memory");
  read_full(*buf, (size_t)size, 0, NULL);
  (*buf)[size] = 0;
  skip_bytes(padded(size) - size);
}

struct pax { char *path, *link; int has_size, has_uid, has_gid, has_mtime; uint64_t size, uid, gid; struct timespec mtime; struct xattr xattrs[MAX_XATTRS]; int nxattrs; };

static void pax_parse(char *buf, uint64_t len, struct pax *p) {
  uint64_t off = 0;
  while (off < len) {
    char *rec = buf + off;
    char *sp = memchr(rec, ' ', (size_t)(len - off));
    if (!sp) fail("BAD_TAR", "a pax record has no length");
    uint64_t n = 0;
    for (char *c = rec; c < sp; c++) {
      if (*c < '0' || *c > '9' || n > MAX_PAX) fail("BAD_TAR", "a pax record's length is not a number");
      n = n * 10 + (uint64_t)(*c - '0');
    }
    if (n <= (uint64_t)(sp - rec) + 2 || n > len - off || rec[n - 1] != '\n') fail("BAD_TAR", "a pax record's length does not fit");
    char *kv = sp + 1;
    char *end = rec + n - 1;
    char *eq = memchr(kv, '=', (size_t)(end - kv));
    if (!eq) fail("BAD_TAR", "a pax record has no '='");
    *eq = 0;
    char *val = eq + 1;
    size_t vlen = (size_t)(end - val);
    *end = 0;
    if ((strcmp(kv, "path") == 0 || strcmp(kv, "linkpath") == 0) && strlen(val) != vlen)
      fail("BAD_TAR", "a pax %s record has a NUL byte in it", kv);
    if (strcmp(kv, "path") == 0) p->path = val;
    else if (strcmp(kv, "linkpath") == 0) p->link = val;
    else if (strcmp(kv, "size") == 0) { p->size = pax_num(val, "size", MAX_SIZE); p->has_size = 1; }
    else if (strcmp(kv, "uid") == 0) { p->uid = pax_num(val, "uid", MAX_ID); p->has_uid = 1; }
    else if (strcmp(kv, "gid") == 0) { p->gid = pax_num(val, "gid", MAX_ID); p->has_gid = 1; }
    else if (strcmp(kv, "mtime") == 0) {
      char *dot;
      p->mtime.tv_sec = strtoll(val, &dot, 10);
      p->mtime.tv_nsec = 0;
      if (*dot == '.') {
        long ns = 0;
        int digits = 0;
        for (char *c = dot + 1; *c >= '0' && *c <= '9' && digits < 9; c++, digits++) ns = ns * 10 + (*c - '0');
        for (; digits < 9; digits++) ns *= 10;
        p->mtime.tv_nsec = ns;
      }
      p->has_mtime = 1;
    } else if (strncmp(kv, "SCHILY.xattr.", 13) == 0) {
      if (p->nxattrs == MAX_XATTRS) fail("BAD_TAR", "an entry has more than %d extended attributes", MAX_XATTRS);
      p->xattrs[p->nxattrs++] = (struct xattr){ kv + 13, val, vlen };
    } else if (strncmp(kv, "GNU.sparse.", 11) == 0) {
      fail("BAD_TAR", "sparse files (GNU.sparse) are not supported; make the archive without --sparse");
    }
    off += n;
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: snaplab-unpack ROOT [--layer]\n");
    return 64;
  }
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--layer") == 0) layer_mode = 1;
  root_fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root_fd < 0) fail("IO", "open %s: %s", argv[1], strerror(errno));
  umask(0);
  /* removing a deep tree holds one descriptor per level (a 4095-byte name is ~2000 levels) */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  /* every pax header before one entry is kept until the entry is applied: the records point into them */
  enum { MAX_PAX_HEADERS = 8 };
  char *pax_bufs[MAX_PAX_HEADERS];
  int npax = 0;
  char *long_name = NULL, *long_link = NULL;
  struct pax pax;
  memset(&pax, 0, sizeof pax);
  static struct entry e;
  unsigned char h[BLOCK];
  int zero_blocks = 0;
  for (;;) {
    int eof = 0;
    read_full(h, BLOCK, 1, &eof);
    if (eof) break;
    int zero = 1;
    for (int i = 0; i < BLOCK && zero; i++) zero = h[i] == 0;
    if (zero) {
      if (++zero_blocks == 2) break;
      continue;
    }
    if (zero_blocks) fail("BAD_TAR", "a header follows an end-of-archive block");
    if (!checksum_ok(h)) fail("BAD_TAR", "a header's checksum is wrong (not a tar archive, or corrupt)");
    char type = (char)h[156];
    uint64_t size = num((char *)h + 124, 12, "size");
    if (size > MAX_SIZE) fail("BAD_TAR", "a header's size is out of range");
    if (type == 'x') {
      if (npax == MAX_PAX_HEADERS) fail("BAD_TAR", "more than %d pax headers before one entry", MAX_PAX_HEADERS);
      read_body(&pax_bufs[npax], size, MAX_PAX, "a pax header");
      pax_parse(pax_bufs[npax++], size, &pax);
      continue;
    }
    if (type == 'g') { /* global pax header: nothing in it changes how entries are applied */
      skip_bytes(padded(size));
      continue;
    }
    if (type == 'L') { free(long_name); read_body(&long_name, size, MAX_PATH, "a long name"); continue; }
    if (type == 'K') { free(long_link); read_body(&long_link, size, MAX_PATH, "a long link name"); continue; }
    if (type == 'S') fail("BAD_TAR", "sparse files are not supported; make the archive without --sparse");
    if (type == 'V') { skip_bytes(padded(size)); continue; }

    memset(&e, 0, sizeof e);
    e.type = type;
    char name[MAX_PATH * 2];
    int ustar = memcmp(h + 257, "ustar\0", 6) == 0; /* POSIX: has a prefix field; GNU's "ustar  " has none */
    if (pax.path) snprintf(name, sizeof name, "%s", pax.path);
    else if (long_name) snprintf(name, sizeof name, "%s", long_name);
    else if (ustar && h[345]) snprintf(name, sizeof name, "%.155s/%.100s", (char *)h + 345, (char *)h);
    else snprintf(name, sizeof name, "%.100s", (char *)h);
    if (strlen(name) >= MAX_PATH) fail("UNSAFE_PATH", "an entry's name is longer than %d bytes", MAX_PATH - 1);
    char orig[MAX_PATH];
    snprintf(orig, sizeof orig, "%s", name);
    snprintf(e.path, sizeof e.path, "%s", name);
    clean_path(e.path, "entry", orig);
    if (pax.link) snprintf(e.link, sizeof e.link, "%s", pax.link);
    else if (long_link) snprintf(e.link, sizeof e.link, "%s", long_link);
    else snprintf(e.link, sizeof e.link, "%.100s", (char *)h + 157);
    e.mode = (mode_t)num((char *)h + 100, 8, "mode");
    uint64_t uid = pax.has_uid ? pax.uid : num((char *)h + 108, 8, "uid");
    uint64_t gid = pax.has_gid ? pax.gid : num((char *)h + 116, 8, "gid");
    if (uid > MAX_ID || gid > MAX_ID) fail("BAD_TAR", "%s has an owner out of range", orig);
    e.uid = (uid_t)uid;
    e.gid = (gid_t)gid;
    e.size = pax.has_size ? pax.size : size;
    if (pax.has_mtime) e.mtime = pax.mtime;
    else e.mtime = (struct timespec){ (time_t)num((char *)h + 136, 12, "mtime"), 0 };
    e.nxattrs = pax.nxattrs;
    memcpy(e.xattrs, pax.xattrs, sizeof pax.xattrs);
    if ((type == '1' || type == '2') && !e.link[0]) fail("BAD_TAR", "link %s has no target", orig);
    apply(&e);

    memset(&pax, 0, sizeof pax);
    while (npax > 0) free(pax_bufs[--npax]);
    free(long_name);
    free(long_link);
    long_name = long_link = NULL;
  }
  /* what follows the end of the archive (record padding, a writer's trailing bytes) is read and
     dropped: the caller hashes the whole stream, and must be able to write all of it */
  {
    char sink[65536];
    ssize_t r;
    while ((r = read(0, sink, sizeof sink)) != 0)
      if (r < 0 && errno != EINTR) fail("IO", "reading the archive: %s", strerror(errno));
  }
  apply_dir_times();
  printf("{\"entries\":%" PRIu64 ",\"files\":%" PRIu64 ",\"dirs\":%" PRIu64 ",\"symlinks\":%" PRIu64
         ",\"hardlinks\":%" PRIu64 ",\"whiteouts\":%" PRIu64 ",\"opaques\":%" PRIu64 ",\"devices\":%" PRIu64
         ",\"xattrsDropped\":%" PRIu64 ",\"bytes\":%" PRIu64 "}\n",
         stats.entries, stats.files, stats.dirs, stats.symlinks, stats.hardlinks, stats.whiteouts, stats.opaques,
         stats.devices, stats.xattrs_dropped, stats.bytes);
  return 0;
}
