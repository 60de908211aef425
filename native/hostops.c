/*
 * snaplab-hostops: a small resident helper that does, on the host, the system calls Node cannot
 * make itself, so the hot path pays a pipe round trip (~50 us) instead of spawning a tool
 * (btrfs, mount: 4-10 ms each on these hosts).
 *
 * Started by the host library with pipes on stdin/stdout; exits on stdin EOF.
 * Request:  u32 payload length (LE), u32 request id, payload = NUL-terminated strings: op, args...
 * Response: u32 payload length (LE), u32 request id, payload = "ok\0" fields... or
 *           "err\0" errno "\0" message "\0".
 * Every request runs on its own thread, so a slow one (a launch waiting for its agent) never
 * holds up the others.
 *
 * ops:
 *   ping
 *   btrfs-snapshot SRC DST RO(0|1)          BTRFS_IOC_SNAP_CREATE_V2
 *   btrfs-clone SRC DST STAGE               a writable snapshot made in the directory STAGE (made if
 *                                           missing), then renamed to DST (RENAME_NOREPLACE)
 *   btrfs-delete PATH                       BTRFS_IOC_SNAP_DESTROY
 *   btrfs-changes PATH                      syncfs, then the subvolume's generation:ctransid
 *   btrfs-squota PATH                       turn on simple quotas on PATH's filesystem (kernel 6.7+; idempotent)
 *   btrfs-limit PATH BYTES                  the subvolume's own qgroup may hold at most BYTES exclusive (0: no limit)
 *   btrfs-quota PATH                        syncfs, then the subvolume's qgroup: EXCLUSIVE LIMIT (0: none)
 *   mount SOURCE TARGET FSTYPE FLAGS DATA   mount(2)
 *   umount TARGET FLAGS                     umount2(2)
 *   tcp-check NETNS HOST PORT TIMEOUT_MS    connect from inside a network namespace (path)
 *   netns-userns PATH BASE COUNT            a network namespace at PATH owned by a new user namespace
 *   idmap-check DIR BASE                    can DIR be idmapped through a user namespace at BASE?
 *   overlay-xattrs DIR                      trusted.overlay.* -> user.overlay.* below DIR (one filesystem)
 *   ct-forget ROUTER UPLINK MACHINE MARK    a machine's flows removed from its router's connection table
 *                                           and the uplink's (conntrack.h); ok ROUTER_N UPLINK_N
 *   ct-forget-src UPLINK SRC                every flow from SRC removed from the uplink's table; ok N
 *   ct-sweep ROUTER UPLINK SRC              the uplink's flows from SRC that the router no longer holds
 *                                           removed (conntrack.h); ok N
 *   launch LOG TIMEOUT_MS SOCKET NETNS USERNS [ROOTFS AGENT] N CGROUP_PROCS*N ARGV...
 *       NETNS: a path to join, or -. USERNS: - or BASE:COUNT[:suid], followed by the root filesystem
 *       and the agent binary to stage for bwrap (userns.c).
 *       makes a listening Unix socket at SOCKET (a host path the sandbox cannot see), then
 *       double-forks a session leader that writes its pid into each cgroup.procs file, points
 *       stdout/stderr at LOG, gets a "ready" pipe on fd 3, an "info" pipe on fd 4 and the
 *       listening socket on fd 5, and execs ARGV (bwrap, which passes fds 3 and 5 to the agent). Replies "ok" AGENT_PID T_NAMESPACES_NS T_READY_NS (CLOCK_MONOTONIC) once
 *       bwrap has reported the child pid on fd 4 and the agent has written a byte to fd 3.
 *   launch-bwrap ...                        launch, ARGV being bwrap's: once the agent serves, bwrap's
 *       monitor (the exec'd process, the agent's parent) is let go (drop_monitor).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/xattr.h>
#include <ftw.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/nsfs.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "conntrack.h"
#include "userns.h"

#define MAX_ARGS 512
#define MAX_REQUEST (1 << 20)

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

struct request {
	uint32_t id;
	int argc;
	char *argv[MAX_ARGS];
	char *buf;
};

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = write(fd, c, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	char *c = p;
	while (n > 0) {
		ssize_t r = read(fd, c, n);
		if (r == 0)
			return 1;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

/* fields: NULL-terminated list of strings */
static void reply(uint32_t id, const char *const *fields)
{
	char body[8192];
	size_t len = 0;
	for (int i = 0; fields[i]; i++) {
		size_t l = strlen(fields[i]) + 1;
		if (len + l > sizeof body)
			break;
		memcpy(body + len, fields[i], l);
		len += l;
	}
	uint32_t head[2] = { (uint32_t)len, id };
	pthread_mutex_lock(&out_lock);
	if (write_all(1, head, sizeof head) < 0 || write_all(1, body, len) < 0)
		_exit(0); /* host went away */
	pthread_mutex_unlock(&out_lock);
}

static void reply_err(uint32_t id, int err, const char *what)
{
	char num[16], msg[4096];
	snprintf(num, sizeof num, "%d", err);
	snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
	const char *f[] = { "err", num, msg, NULL };
	reply(id, f);
}

/* An error whose message is whole: no strerror appended (the errno only classifies it). */
static void reply_err_msg(uint32_t id, int err, const char *msg)
{
	char num[16];
	snprintf(num, sizeof num, "%d", err);
	const char *f[] = { "err", num, msg, NULL };
	reply(id, f);
}

static void reply_ok(uint32_t id)
{
	const char *f[] = { "ok", NULL };
	reply(id, f);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* split "/a/b/c" into an O_DIRECTORY fd of "/a/b" and the name "c" */
static int open_parent(const char *path, const char **name)
{
	const char *slash = strrchr(path, '/');
	if (!slash || slash[1] == '\0') {
		errno = EINVAL;
		return -1;
	}
	*name = slash + 1;
	if (slash == path)
		return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char dir[4096];
	size_t l = (size_t)(slash - path);
	if (l >= sizeof dir) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(dir, path, l);
	dir[l] = '\0';
	return open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* delete the subvolume NAME in the directory DIR (BTRFS_IOC_SNAP_DESTROY); 0 or -1 with errno */
static int subvol_destroy(int dir, const char *name)
{
	struct btrfs_ioctl_vol_args args;
	memset(&args, 0, sizeof args);
	if (strlen(name) >= sizeof args.name) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(args.name, name);
	return ioctl(dir, BTRFS_IOC_SNAP_DESTROY, &args);
}

/*
 * btrfs-snapshot SRC DST RO, and btrfs-clone SRC DST STAGE. A snapshot is made under its parent
 * directory's lock and ends with a transaction commit: made side by side in one directory,
 * concurrent snapshots each wait for the lock and commit alone. A clone (writable) is made in STAGE
 * (a directory on the same filesystem, one per snapshot in flight; made if missing) and renamed to
 * DST: concurrent ones share their commits (docs/architecture.md "Density"). A read-only subvolume
 * cannot be moved (its ".." is read-only): a snapshot is made in place. An op of its own, so that a
 * helper older than it answers ENOSYS, and its client makes the clone in place.
 */
static void snapshot(struct request *r, int ro, const char *staging)
{
	const char *name;
	int src = open(r->argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (src < 0)
		return reply_err(r->id, errno, r->argv[1]);
	int parent = open_parent(r->argv[2], &name);
	if (parent < 0) {
		int e = errno;
		close(src);
		return reply_err(r->id, e, r->argv[2]);
	}
	int stage = -1;
	if (staging) {
		if (mkdir(staging, 0700) < 0 && errno != EEXIST) {
			int e = errno;
			close(src);
			close(parent);
			return reply_err(r->id, e, staging);
		}
		stage = open(staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (stage < 0) {
			int e = errno;
			close(src);
			close(parent);
			return reply_err(r->id, e, staging);
		}
	}
	struct btrfs_ioctl_vol_args_v2 args;
	memset(&args, 0, sizeof args);
	args.fd = src;
	if (ro)
		args.flags = BTRFS_SUBVOL_RDONLY;
	int rc = -1, e = ENAMETOOLONG;
	const char *what = "btrfs snapshot";
	if (strlen(name) < sizeof args.name) {
		strcpy(args.name, name);
		rc = ioctl(stage >= 0 ? stage : parent, BTRFS_IOC_SNAP_CREATE_V2, &args);
		e = errno;
		if (rc == 0 && stage >= 0 && renameat2(stage, name, parent, name, RENAME_NOREPLACE) < 0) {
			e = errno;
			rc = -1;
			what = "move the staged snapshot into place";
			if (subvol_destroy(stage, name) < 0)
				dprintf(2, "snaplab-hostops: cannot delete the staged snapshot %s/%s: %s\n", staging,
					name, strerror(errno));
		}
	}
	close(src);
	close(parent);
	if (stage >= 0)
		close(stage);
	if (rc < 0)
		return reply_err(r->id, e, what);
	reply_ok(r->id);
}

static void op_btrfs_snapshot(struct request *r)
{
	if (r->argc != 4)
		return reply_err(r->id, EINVAL, "btrfs-snapshot SRC DST RO");
	snapshot(r, strcmp(r->argv[3], "1") == 0, NULL);
}

static void op_btrfs_clone(struct request *r)
{
	if (r->argc != 4)
		return reply_err(r->id, EINVAL, "btrfs-clone SRC DST STAGE");
	snapshot(r, 0, r->argv[3]);
}

static void op_btrfs_delete(struct request *r)
{
	if (r->argc != 2)
		return reply_err(r->id, EINVAL, "btrfs-delete PATH");
	const char *name;
	int parent = open_parent(r->argv[1], &name);
	if (parent < 0)
		return reply_err(r->id, errno, r->argv[1]);
	int rc = subvol_destroy(parent, name);
	int e = errno;
	close(parent);
	if (rc < 0)
		return reply_err(r->id, e, "btrfs subvolume delete");
	reply_ok(r->id);
}

/* A subvolume's change counters after a sync: pending writes are committed first, so any write
 * made since an earlier reading shows as a different value (fails closed). */
static void op_btrfs_changes(struct request *r)
{
	if (r->argc != 2)
		return reply_err(r->id, EINVAL, "btrfs-changes PATH");
	int fd = open(r->argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return reply_err(r->id, errno, r->argv[1]);
	struct btrfs_ioctl_get_subvol_info_args info;
	memset(&info, 0, sizeof info);
	if (syncfs(fd) < 0 || ioctl(fd, BTRFS_IOC_GET_SUBVOL_INFO, &info) < 0) {
		int e = errno;
		close(fd);
		return reply_err(r->id, e, "btrfs subvolume info");
	}
	close(fd);
	char v[64];
	snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)info.generation, (unsigned long long)info.ctransid);
	const char *f[] = { "ok", v, NULL };
	reply(r->id, f);
}

#ifndef BTRFS_QUOTA_TREE_OBJECTID
#define BTRFS_QUOTA_TREE_OBJECTID 8ULL
#endif
#ifndef BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA
#define BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA 4
#endif

/*
 * Simple quotas (squota): each extent is charged to the subvolume that wrote it, for as long as it
 * exists, so a clone's qgroup counts what the machine wrote and nothing of its image, and neither
 * a snapshot nor a delete triggers the accounting walk that full qgroups do.
 */
static void op_btrfs_squota(struct request *r)
{
	if (r->argc != 2)
		return reply_err(r->id, EINVAL, "btrfs-squota PATH");
	int fd = open(r->argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return reply_err(r->id, errno, r->argv[1]);
	struct btrfs_ioctl_quota_ctl_args args = { .cmd = BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA };
	int rc = ioctl(fd, BTRFS_IOC_QUOTA_CTL, &args);
	int e = errno;
	close(fd);
	if (rc < 0)
		return reply_err(r->id, e, "btrfs quota enable (simple)");
	reply_ok(r->id);
}

static void op_btrfs_limit(struct request *r)
{
	if (r->argc != 3)
		return reply_err(r->id, EINVAL, "btrfs-limit PATH BYTES");
	int fd = open(r->argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return reply_err(r->id, errno, r->argv[1]);
	char *end = NULL;
	errno = 0;
	unsigned long long bytes = strtoull(r->argv[2], &end, 10);
	if (errno || !end || *end || end == r->argv[2])
		return reply_err(r->id, EINVAL, "btrfs-limit: BYTES is not a whole number");
	struct btrfs_ioctl_qgroup_limit_args args;
	memset(&args, 0, sizeof args);
	args.qgroupid = 0; /* the qgroup of the subvolume fd is in */
	/* exclusive only: under simple quotas it equals referenced (what the subvolume wrote); under full
	 * qgroups (a btrfs of the user's) referenced would count the image the clone shares */
	args.lim.flags = BTRFS_QGROUP_LIMIT_MAX_EXCL;
	args.lim.max_excl = bytes ? bytes : (unsigned long long)-1;
	int rc = ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &args);
	int e = errno;
	close(fd);
	if (rc < 0)
		return reply_err(r->id, e, e == ENOTCONN ? "quotas are off on this filesystem" : "btrfs qgroup limit");
	reply_ok(r->id);
}

/* one item of the quota tree: the subvolume's level-0 qgroup (0/ID) of the given key type */
static int quota_item(int fd, unsigned long long subvol, unsigned type, void *out, size_t len)
{
	struct btrfs_ioctl_search_args args;
	memset(&args, 0, sizeof args);
	args.key.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
	args.key.min_objectid = 0;
	args.key.max_objectid = 0;
	args.key.min_type = type;
	args.key.max_type = type;
	args.key.min_offset = subvol;
	args.key.max_offset = subvol;
	args.key.max_transid = (unsigned long long)-1;
	args.key.nr_items = 1;
	if (ioctl(fd, BTRFS_IOC_TREE_SEARCH, &args) < 0)
		return -1;
	if (args.key.nr_items < 1) {
		errno = ENOENT;
		return -1;
	}
	struct btrfs_ioctl_search_header *h = (struct btrfs_ioctl_search_header *)args.buf;
	if (h->len < len) {
		errno = EPROTO;
		return -1;
	}
	memcpy(out, args.buf + sizeof *h, len);
	return 0;
}

static void op_btrfs_quota(struct request *r)
{
	if (r->argc != 2)
		return reply_err(r->id, EINVAL, "btrfs-quota PATH");
	int fd = open(r->argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return reply_err(r->id, errno, r->argv[1]);
	struct btrfs_ioctl_get_subvol_info_args info;
	memset(&info, 0, sizeof info);
	/* le64 fields: info {generation, rfer, rfer_cmpr, excl, excl_cmpr}, limit {flags, max_rfer, max_excl, ...} */
	unsigned long long qinfo[5] = { 0 }, qlimit[3] = { 0 };
	if (syncfs(fd) < 0 || ioctl(fd, BTRFS_IOC_GET_SUBVOL_INFO, &info) < 0 ||
	    quota_item(fd, info.treeid, 242 /* BTRFS_QGROUP_INFO_KEY */, qinfo, sizeof qinfo) < 0) {
		int e = errno;
		close(fd);
		return reply_err(r->id, e, "btrfs qgroup of the subvolume");
	}
	if (quota_item(fd, info.treeid, 244 /* BTRFS_QGROUP_LIMIT_KEY */, qlimit, sizeof qlimit) < 0)
		qlimit[0] = 0;
	close(fd);
	unsigned long long limit =
		(qlimit[0] & BTRFS_QGROUP_LIMIT_MAX_EXCL) && qlimit[2] != (unsigned long long)-1 ? qlimit[2] : 0;
	char used[32], lim[32];
	snprintf(used, sizeof used, "%llu", qinfo[3]); /* exclusive: what the limit counts */
	snprintf(lim, sizeof lim, "%llu", limit);
	const char *f[] = { "ok", used, lim, NULL };
	reply(r->id, f);
}

static void op_mount(struct request *r)
{
	if (r->argc != 6)
		return reply_err(r->id, EINVAL, "mount SOURCE TARGET FSTYPE FLAGS DATA");
	unsigned long flags = strtoul(r->argv[4], NULL, 10);
	const char *data = r->argv[5][0] ? r->argv[5] : NULL;
	if (mount(r->argv[1], r->argv[2], r->argv[3][0] ? r->argv[3] : NULL, flags, data) < 0)
		return reply_err(r->id, errno, "mount");
	reply_ok(r->id);
}

/* Overlay layers written by a mount without userxattr keep overlayfs's own marks (opaque
 * directories, redirects, origins) as trusted.overlay.*; with userxattr, which every overlay
 * mount uses since the namespace's root cannot write trusted.*, the kernel reads user.overlay.*.
 * Move them, never following a link, never crossing into another mount. */
static __thread unsigned long moved_xattrs;
static __thread int move_errno;

static int move_overlay_xattrs(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)ftw;
	if (type == FTW_SL || S_ISLNK(st->st_mode))
		return 0; /* user.* cannot be set on a symlink; overlayfs keeps nothing there we need */
	char names[65536];
	ssize_t n = llistxattr(path, names, sizeof names);
	if (n <= 0)
		return 0;
	for (char *k = names; k < names + n; k += strlen(k) + 1) {
		if (strncmp(k, "trusted.overlay.", 16) != 0)
			continue;
		char value[4096], user[512];
		ssize_t v = lgetxattr(path, k, value, sizeof value);
		if (v < 0)
			continue;
		snprintf(user, sizeof user, "user.overlay.%s", k + 16);
		if (lsetxattr(path, user, value, (size_t)v, 0) < 0 || lremovexattr(path, k) < 0) {
			move_errno = errno;
			return 1;
		}
		moved_xattrs++;
	}
	return 0;
}

static void op_overlay_xattrs(struct request *r)
{
	if (r->argc != 2)
		return reply_err(r->id, EINVAL, "overlay-xattrs DIR");
	moved_xattrs = 0;
	move_errno = 0;
	if (nftw(r->argv[1], move_overlay_xattrs, 32, FTW_PHYS | FTW_MOUNT) != 0)
		return reply_err(r->id, move_errno ? move_errno : errno, r->argv[1]);
	char count[32];
	snprintf(count, sizeof count, "%lu", moved_xattrs);
	const char *f[] = { "ok", count, NULL };
	reply(r->id, f);
}

static void op_umount(struct request *r)
{
	if (r->argc != 3)
		return reply_err(r->id, EINVAL, "umount TARGET FLAGS");
	if (umount2(r->argv[1], (int)strtol(r->argv[2], NULL, 10)) < 0)
		return reply_err(r->id, errno, "umount");
	reply_ok(r->id);
}

/* In the grandchild: join the cgroups, wire fds, exec. Only async-signal-safe calls. */
struct userns_spec {
	unsigned base, count;
	struct userns_root root;
	const char *agent;
};

static void launch_child(char *log, const char *netns, const struct userns_spec *us, char **cgs, int ncg, char **argv,
			 int ready_w, int info_w, int listen_fd)
{
	int fd = open("/dev/null", O_RDONLY);
	if (fd >= 0 && fd != 0) {
		dup2(fd, 0);
		close(fd);
	}
	fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0600);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
		if (fd > 2)
			close(fd);
	}
	char pid[24];
	int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
	for (int i = 0; i < ncg; i++) {
		int c = open(cgs[i], O_WRONLY | O_CLOEXEC);
		if (c < 0 || write(c, pid, (size_t)n) != n) {
			dprintf(2, "snaplab-hostops: cannot join cgroup %s: %s\n", cgs[i], strerror(errno));
			_exit(125);
		}
		close(c);
	}
	/* a scenario machine lives in a network namespace snaplab made (and keeps across resets):
	 * join it, and bwrap is told not to make one */
	int owner = -1;
	if (strcmp(netns, "-") != 0) {
		int nfd = open(netns, O_RDONLY | O_CLOEXEC);
		if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0) {
			dprintf(2, "snaplab-hostops: cannot join network namespace %s: %s\n", netns, strerror(errno));
			_exit(125);
		}
		/* a network namespace made in a user namespace of its own (a scenario machine's): the
		 * sandbox joins that one, so that its root has its capabilities over its network */
		if (us) {
			int o = ioctl(nfd, NS_GET_USERNS);
			owner = o >= 0 ? fcntl(o, F_DUPFD_CLOEXEC, 20)
				       : -1; /* clear of the fds moved onto 3..6 below */
			if (o >= 0)
				close(o);
			struct stat mine, theirs;
			if (owner >= 0 && (stat("/proc/self/ns/user", &mine) < 0 || fstat(owner, &theirs) < 0 ||
					   mine.st_ino == theirs.st_ino)) {
				close(owner);
				owner = -1;
			}
		}
		close(nfd);
	}
	/* move the pipe ends out of the way, then onto 3 and 4 (dup2 clears CLOEXEC) */
	int r = fcntl(ready_w, F_DUPFD_CLOEXEC, 10), in = fcntl(info_w, F_DUPFD_CLOEXEC, 10);
	int l = fcntl(listen_fd, F_DUPFD_CLOEXEC, 10);
	if (r < 0 || in < 0 || l < 0 || dup2(r, 3) < 0 || dup2(in, 4) < 0 || dup2(l, 5) < 0)
		_exit(125);
	/* the machine's user namespace on fd 6 (dup2 clears CLOEXEC; userns_enter closes it); then,
	 * before anything runs as the sandbox's ids, none of the helper's other descriptors (other
	 * requests') may reach it */
	if (owner >= 0 && dup2(owner, 6) < 0)
		_exit(125);
	close_range(owner >= 0 ? 7 : 6, ~0U, 0);
	/* last of what needs host root: after this the process is the root of its own namespace */
	if (us && userns_enter(us->base, us->count, owner >= 0 ? 6 : -1, &us->root, us->agent) < 0)
		_exit(125);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execv(argv[0], argv);
	dprintf(2, "snaplab-hostops: exec %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

/* A launch request's arguments, pointing into its argv. */
struct launch_args {
	char *log;
	int timeout_ms;
	const char *sock, *netns;
	struct userns_spec spec, *us; /* us: &spec, or NULL for USERNS - */
	int ncg;
	char **cgs, **argv;
};

/*
 * A user namespace's range from "BASE" and "COUNT" text (end: where the count's text ends): 1 to
 * 65536 ids, all below (uid_t)-1, which no range may hold. Parsed as unsigned 32-bit values
 * (ranges go up to 2^32-2): sscanf's %u took "-1" and 2^32 and above silently.
 */
static int id_range(const char *b, const char *n, char **end, unsigned *base, unsigned *count)
{
	char *e;
	errno = 0;
	unsigned long long bv = strtoull(b, &e, 10), nv;
	if (errno || e == b || *e != (n == NULL ? ':' : '\0') || *b == '-')
		return -1;
	const char *c = n ? n : e + 1;
	nv = strtoull(c, end, 10);
	if (errno || *end == c || *c == '-' || nv == 0 || nv > 65536 || bv > 0xFFFFFFFFull - nv)
		return -1;
	*base = (unsigned)bv;
	*count = (unsigned)nv;
	return 0;
}

/* NULL, or why the arguments are not a launch (EINVAL). */
static const char *launch_parse(struct request *r, struct launch_args *a)
{
	static const char usage[] =
		"launch LOG TIMEOUT_MS SOCKET NETNS USERNS [ROOTFS|overlay N LOWER*N UPPER WORK] [AGENT] N CGROUP_PROCS... ARGV...";
	if (r->argc < 8)
		return usage;
	a->log = r->argv[1];
	a->timeout_ms = atoi(r->argv[2]);
	a->sock = r->argv[3];
	a->netns = r->argv[4];
	a->us = NULL;
	struct userns_spec *spec = &a->spec;
	int at = 6;
	if (strcmp(r->argv[5], "-") != 0) {
		char *end;
		if (id_range(r->argv[5], NULL, &end, &spec->base, &spec->count) < 0 || (*end != '\0' && *end != ':') ||
		    r->argc < 10)
			return usage;
		memset(&spec->root, 0, sizeof spec->root);
		/* BASE:COUNT:suid: a system machine's tree keeps setuid (userns.c idmapped_clone) */
		spec->root.allow_suid = strstr(r->argv[5], ":suid") != NULL;
		at = 6;
		if (strcmp(r->argv[at], "overlay") == 0) {
			/* counts are compared with what is left of argv, never added to an index: at + n
			 * overflowed for n near INT_MAX, passed, and argv[at + 2 + n] crashed the helper */
			int n = atoi(r->argv[at + 1]);
			if (n < 1 || n >= r->argc - at - 5)
				return usage;
			spec->root.lowers = (const char *const *)&r->argv[at + 2];
			spec->root.nlower = n;
			spec->root.upper = r->argv[at + 2 + n];
			spec->root.work = r->argv[at + 3 + n];
			at += 4 + n;
		} else
			spec->root.dir = r->argv[at++];
		spec->agent = r->argv[at++];
		a->us = spec;
	}
	a->ncg = atoi(r->argv[at]);
	if (a->ncg < 0 || a->ncg >= r->argc - at - 1)
		return "launch: bad cgroup count";
	a->cgs = &r->argv[at + 1];
	a->argv = &r->argv[at + 1 + a->ncg]; /* NULL-terminated by the reader */
	return NULL;
}

/*
 * bwrap's monitor, the process ARGV became, waits for its child (the agent, PID 1 of the
 * sandbox) and does nothing else once the agent runs (no --die-with-parent, no status fd). It
 * holds ~220 KiB per sandbox (its dirty pages, page tables, kernel stack) and the launch's private
 * mount namespace, so it is killed once the agent serves: the agent is reparented to the host's
 * init and lives on (docs/architecture.md "Density"). The pidfd pins the monitor, and it is
 * signalled only while it is still the agent's parent, so no other process can be hit.
 */
static void drop_monitor(pid_t monitor, long agent)
{
	int pfd = (int)syscall(SYS_pidfd_open, monitor, 0);
	if (pfd < 0)
		return;
	char path[64], st[512];
	snprintf(path, sizeof path, "/proc/%ld/stat", agent);
	int f = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = f >= 0 ? read(f, st, sizeof st - 1) : -1;
	if (f >= 0)
		close(f);
	char *end = n > 0 ? (st[n] = 0, strrchr(st, ')')) : NULL;
	int parent = 0;
	if (end && sscanf(end + 1, " %*c %d", &parent) == 1 && parent == monitor)
		if (syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0) == 0) {
			/* gone from the cgroup before the reply: a pool's clean baseline counts its processes */
			struct pollfd p = { pfd, POLLIN, 0 };
			(void)poll(&p, 1, 1000);
		}
	close(pfd);
}

static void op_launch(struct request *r)
{
	struct launch_args la;
	const char *bad = launch_parse(r, &la);
	if (bad)
		return reply_err(r->id, EINVAL, bad);
	char *log = la.log;
	int timeout_ms = la.timeout_ms;
	const char *sock = la.sock;
	const char *netns = la.netns;
	struct userns_spec *us = la.us;
	int ncg = la.ncg;
	char **cgs = la.cgs;
	char **argv = la.argv;
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	if (strlen(sock) >= sizeof sun.sun_path)
		return reply_err(r->id, ENAMETOOLONG, sock);
	strcpy(sun.sun_path, sock);
	unlink(sock);
	int listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listen_fd < 0)
		return reply_err(r->id, errno, "socket");
	if (bind(listen_fd, (struct sockaddr *)&sun, sizeof sun) < 0 || listen(listen_fd, 128) < 0) {
		int e = errno;
		close(listen_fd);
		return reply_err(r->id, e, sock);
	}
	int ready[2], info[2], mon[2];
	if (pipe2(mon, O_CLOEXEC) < 0) {
		int e = errno;
		close(listen_fd);
		return reply_err(r->id, e, "pipe");
	}
	if (pipe2(ready, O_CLOEXEC) < 0) {
		int e = errno;
		close(listen_fd);
		close(mon[0]);
		close(mon[1]);
		return reply_err(r->id, e, "pipe");
	}
	if (pipe2(info, O_CLOEXEC) < 0) {
		int e = errno;
		close(listen_fd);
		close(ready[0]);
		close(ready[1]);
		close(mon[0]);
		close(mon[1]);
		return reply_err(r->id, e, "pipe");
	}
	pid_t mid = fork();
	if (mid == 0) {
		/* a new session, then let go: the sandbox is reparented and outlives this helper */
		setsid();
		pid_t p = fork();
		if (p == 0)
			launch_child(log, netns, us, cgs, ncg, argv, ready[1], info[1], listen_fd);
		/* the exec'd process's pid, for drop_monitor */
		(void)!write(mon[1], &p, sizeof p);
		_exit(p < 0 ? 1 : 0);
	}
	int fork_errno = errno;
	close(mon[1]);
	close(listen_fd);
	close(ready[1]);
	close(info[1]);
	if (mid < 0) {
		close(ready[0]);
		close(info[0]);
		close(mon[0]);
		return reply_err(r->id, fork_errno, "fork");
	}
	waitpid(mid, NULL, 0);
	pid_t monitor = 0;
	if (read(mon[0], &monitor, sizeof monitor) != sizeof monitor)
		monitor = 0;
	close(mon[0]);

	char infobuf[4096];
	size_t infolen = 0;
	long agent = 0;
	uint64_t t_ns = 0, t_ready = 0, deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int info_open = 1, failed = 0;
	const char *why = NULL;
	while (!t_ready) {
		uint64_t now = now_ns();
		if (now >= deadline) {
			failed = ETIMEDOUT;
			why = "the sandbox's agent did not become ready in time";
			break;
		}
		struct pollfd p[2] = { { ready[0], POLLIN, 0 }, { info_open ? info[0] : -1, POLLIN, 0 } };
		int n = poll(p, 2, (int)((deadline - now) / 1000000ull) + 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (p[1].revents) {
			ssize_t got = read(info[0], infobuf + infolen, sizeof infobuf - 1 - infolen);
			if (got <= 0) {
				info_open = 0;
			} else {
				infolen += (size_t)got;
				infobuf[infolen] = '\0';
				char *k = strstr(infobuf, "\"child-pid\"");
				if (k && !agent) {
					k = strchr(k, ':');
					if (k)
						agent = strtol(k + 1, NULL, 10);
					if (agent > 0)
						t_ns = now_ns();
				}
			}
		}
		if (p[0].revents) {
			char b;
			ssize_t got = read(ready[0], &b, 1);
			if (got == 1) {
				t_ready = now_ns();
			} else if (got == 0) {
				/* ECHILD classifies it; the step that failed is in the sandbox's log */
				failed = ECHILD;
				why = "the sandbox exited before its agent was ready";
				break;
			}
		}
	}
	close(ready[0]);
	close(info[0]);
	if (failed == ECHILD)
		return reply_err_msg(r->id, failed, why);
	if (failed)
		return reply_err(r->id, failed, why);
	if (!agent)
		return reply_err(r->id, EPROTO, "bwrap did not report the sandbox's pid");
	if (strcmp(r->argv[0], "launch-bwrap") == 0 && monitor > 0)
		drop_monitor(monitor, agent);
	char a[24], tn[24], tr[24];
	snprintf(a, sizeof a, "%ld", agent);
	snprintf(tn, sizeof tn, "%llu", (unsigned long long)t_ns);
	snprintf(tr, sizeof tr, "%llu", (unsigned long long)t_ready);
	const char *f[] = { "ok", a, tn, tr, NULL };
	reply(r->id, f);
}

/* Connect to HOST:PORT from inside the network namespace at NETNS. setns(CLONE_NEWNET) moves only
 * this request's thread, which ends right after. ok: connected; err ECONNREFUSED, ETIMEDOUT... */
static void op_tcp_check(struct request *r)
{
	if (r->argc != 5)
		return reply_err(r->id, EINVAL, "tcp-check NETNS HOST PORT TIMEOUT_MS");
	int nfd = open(r->argv[1], O_RDONLY | O_CLOEXEC);
	if (nfd < 0)
		return reply_err(r->id, errno, r->argv[1]);
	if (setns(nfd, CLONE_NEWNET) < 0) {
		int e = errno;
		close(nfd);
		return reply_err(r->id, e, "setns");
	}
	close(nfd);
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(r->argv[3])) };
	if (inet_pton(AF_INET, r->argv[2], &sin.sin_addr) != 1)
		return reply_err(r->id, EINVAL, r->argv[2]);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return reply_err(r->id, errno, "socket");
	int rc = connect(fd, (struct sockaddr *)&sin, sizeof sin), e = rc < 0 ? errno : 0;
	if (rc < 0 && e == EINPROGRESS) {
		struct pollfd p = { fd, POLLOUT, 0 };
		int n = poll(&p, 1, atoi(r->argv[4]));
		socklen_t len = sizeof e;
		if (n == 0)
			e = ETIMEDOUT;
		else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
			e = errno;
	}
	close(fd);
	if (e)
		return reply_err(r->id, e, "connect");
	reply_ok(r->id);
}

/* ct-forget, ct-forget-src and ct-sweep: conntrack.h (a path, or "-" for this helper's own namespace). */
static void op_ct_forget(struct request *r)
{
	unsigned a = 0, b = 0;
	int rc;
	if (strcmp(r->argv[0], "ct-forget") == 0) {
		if (r->argc != 5)
			return reply_err(r->id, EINVAL, "ct-forget ROUTER_NETNS UPLINK_NETNS MACHINE MARK");
		char *end;
		errno = 0;
		unsigned long long mark = strtoull(r->argv[4], &end, 10);
		if (errno || end == r->argv[4] || *end || *r->argv[4] == '-' || mark > 0xFFFFFFFFull)
			return reply_err(r->id, EINVAL, "ct-forget: MARK is 0 to 4294967295");
		rc = ct_forget(r->argv[1], r->argv[2], r->argv[3], (uint32_t)mark, &a, &b);
	} else if (strcmp(r->argv[0], "ct-sweep") == 0) {
		if (r->argc != 4)
			return reply_err(r->id, EINVAL, "ct-sweep ROUTER_NETNS UPLINK_NETNS SRC");
		rc = ct_sweep(r->argv[1], r->argv[2], r->argv[3], &a);
	} else {
		if (r->argc != 3)
			return reply_err(r->id, EINVAL, "ct-forget-src UPLINK_NETNS SRC");
		rc = ct_forget_src(r->argv[1], r->argv[2], &a);
	}
	if (rc < 0)
		return reply_err(r->id, -rc, r->argv[0]);
	char x[16], y[16];
	snprintf(x, sizeof x, "%u", a);
	snprintf(y, sizeof y, "%u", b);
	const char *f[] = { "ok", x, y, NULL };
	reply(r->id, f);
}

/* Read QMP lines from fd until one answers a command ("return" or "error"), skipping events
 * and the greeting. 0 for "return", -1 otherwise (msg gets the line). */
static int qmp_answer(int fd, char *msg, size_t cap)
{
	char line[8192];
	size_t n = 0;
	for (;;) {
		char c;
		ssize_t r = read(fd, &c, 1);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			snprintf(msg, cap, "QMP did not answer within 10 s (is another client holding the monitor?)");
			return -1;
		}
		if (r <= 0) {
			snprintf(msg, cap, "QMP closed the connection");
			return -1;
		}
		if (c != '\n') {
			if (n < sizeof line - 1)
				line[n++] = c;
			continue;
		}
		line[n] = '\0';
		n = 0;
		if (strstr(line, "\"return\""))
			return 0;
		if (strstr(line, "\"error\"")) {
			snprintf(msg, cap, "%.500s", line);
			return -1;
		}
	}
}

/* Hand QEMU an open file over its QMP socket (SCM_RIGHTS with `getfd`), under NAME, for a
 * migration to or from `fd:NAME`: QEMU, which runs as an unprivileged user, never opens the path.
 * MODE r: read an existing file; w: create or truncate (0600). */
static void op_qmp_getfd(struct request *r)
{
	if (r->argc != 5 || (strcmp(r->argv[4], "r") != 0 && strcmp(r->argv[4], "w") != 0))
		return reply_err(r->id, EINVAL, "qmp-getfd QMP_SOCKET NAME FILE r|w");
	if (strlen(r->argv[2]) > 64 || strchr(r->argv[2], '"') || strchr(r->argv[2], '\\'))
		return reply_err(r->id, EINVAL, "fd name");
	int file = r->argv[4][0] == 'r' ? open(r->argv[3], O_RDONLY | O_CLOEXEC)
					: open(r->argv[3], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (file < 0)
		return reply_err(r->id, errno, r->argv[3]);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(r->argv[1]) >= sizeof a.sun_path) {
		close(file);
		return reply_err(r->id, ENAMETOOLONG, r->argv[1]);
	}
	strcpy(a.sun_path, r->argv[1]);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = { .tv_sec = 10 };
	char msg[512] = "";
	/* SO_SNDTIMEO bounds a blocking connect on a Unix socket whose listen backlog is full */
	if (s < 0 || setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
	    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0 ||
	    connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		int e = errno;
		if (s >= 0)
			close(s);
		close(file);
		return reply_err(r->id, e, r->argv[1]);
	}
	const char *caps = "{\"execute\":\"qmp_capabilities\"}\n";
	char cmd[256];
	snprintf(cmd, sizeof cmd, "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"%s\"}}\n", r->argv[2]);
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = cmd, .iov_len = strlen(cmd) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &file, sizeof(int));
	int rc = -1;
	if (write_all(s, caps, strlen(caps)) == 0 && qmp_answer(s, msg, sizeof msg) == 0 &&
	    sendmsg(s, &mh, 0) == (ssize_t)iov.iov_len)
		rc = qmp_answer(s, msg, sizeof msg);
	close(s);
	close(file);
	if (rc < 0)
		return reply_err(r->id, EPROTO, msg[0] ? msg : "getfd failed");
	reply_ok(r->id);
}

static void *serve(void *p)
{
	struct request *r = p;
	const char *op = r->argv[0];
	if (strcmp(op, "ping") == 0)
		reply_ok(r->id);
	else if (strcmp(op, "btrfs-snapshot") == 0)
		op_btrfs_snapshot(r);
	else if (strcmp(op, "btrfs-clone") == 0)
		op_btrfs_clone(r);
	else if (strcmp(op, "btrfs-delete") == 0)
		op_btrfs_delete(r);
	else if (strcmp(op, "btrfs-changes") == 0)
		op_btrfs_changes(r);
	else if (strcmp(op, "btrfs-squota") == 0)
		op_btrfs_squota(r);
	else if (strcmp(op, "btrfs-limit") == 0)
		op_btrfs_limit(r);
	else if (strcmp(op, "btrfs-quota") == 0)
		op_btrfs_quota(r);
	else if (strcmp(op, "mount") == 0)
		op_mount(r);
	else if (strcmp(op, "umount") == 0)
		op_umount(r);
	else if (strcmp(op, "overlay-xattrs") == 0)
		op_overlay_xattrs(r);
	else if (strcmp(op, "netns-userns") == 0 && r->argc != 4)
		reply_err(r->id, EINVAL, "netns-userns PATH BASE COUNT");
	else if (strcmp(op, "netns-userns") == 0) {
		unsigned base, count;
		char *end;
		if (id_range(r->argv[2], r->argv[3], &end, &base, &count) < 0 || *end != '\0')
			reply_err(r->id, EINVAL, "netns-userns: BASE COUNT: 1 to 65536 ids below 4294967295");
		else if (netns_make(r->argv[1], base, count) < 0)
			reply_err(r->id, errno, r->argv[1]);
		else
			reply_ok(r->id);
	} else if (strcmp(op, "idmap-check") == 0 && r->argc != 3)
		reply_err(r->id, EINVAL, "idmap-check DIR BASE");
	else if (strcmp(op, "idmap-check") == 0) {
		int rc = idmap_check(r->argv[1], (unsigned)strtoul(r->argv[2], NULL, 10));
		char code[16];
		snprintf(code, sizeof code, "%d", rc);
		const char *f[] = { "ok", code, NULL };
		reply(r->id, f);
	} else if (strcmp(op, "launch") == 0 || strcmp(op, "launch-bwrap") == 0)
		op_launch(r);
	else if (strcmp(op, "tcp-check") == 0)
		op_tcp_check(r);
	else if (strcmp(op, "qmp-getfd") == 0)
		op_qmp_getfd(r);
	else if (strcmp(op, "ct-forget") == 0 || strcmp(op, "ct-forget-src") == 0 || strcmp(op, "ct-sweep") == 0)
		op_ct_forget(r);
	else
		reply_err(r->id, ENOSYS, op);
	free(r->buf);
	free(r);
	return NULL;
}

/*
 * Read one request from fd: 1 with *out (op and arguments split at their NULs, argv NULL-terminated,
 * the last string ended by the reader), 0 at EOF or a short read, 2 for a length of 0 or over
 * MAX_REQUEST.
 */
static int request_read(int fd, struct request **out)
{
	uint32_t head[2];
	if (read_all(fd, head, sizeof head) != 0)
		return 0;
	if (head[0] == 0 || head[0] > MAX_REQUEST)
		return 2;
	struct request *r = calloc(1, sizeof *r);
	char *buf = malloc(head[0] + 1);
	if (!r || !buf || read_all(fd, buf, head[0]) != 0) {
		free(r);
		free(buf);
		return 0;
	}
	buf[head[0]] = '\0';
	r->id = head[1];
	r->buf = buf;
	for (size_t off = 0; off < head[0] && r->argc < MAX_ARGS - 1;) {
		r->argv[r->argc++] = buf + off;
		off += strlen(buf + off) + 1;
	}
	r->argv[r->argc] = NULL;
	*out = r;
	return 1;
}

#ifndef FUZZ /* fuzz/hostops_fuzz.c: libFuzzer's main calls request_read and launch_parse */
int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	for (;;) {
		struct request *r;
		int rc = request_read(0, &r);
		if (rc != 1)
			return rc;
		pthread_t t;
		if (pthread_create(&t, &attr, serve, r) != 0) {
			reply_err(r->id, errno, "thread");
			free(r->buf);
			free(r);
		}
	}
}
#endif
