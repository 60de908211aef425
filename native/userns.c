/*
 * User namespaces for sandboxes (snaplab-hostops, in the forked launcher child).
 *
 * bwrap cannot take a ranged user namespace from outside (`--userns FD` as host root fails), and
 * its own `--unshare-user` maps one id. So the launcher makes the namespace itself: a short-lived
 * child unshares CLONE_NEWUSER, the launcher (host root) writes its uid and gid maps (0..COUNT-1
 * inside = BASE.. outside) and takes a descriptor of it. In a private mount namespace the sandbox's
 * root filesystem is then cloned with an idmap (open_tree + mount_setattr(MOUNT_ATTR_IDMAP)), so
 * that files owned by 0 on disk are owned by 0 inside and what root inside writes is stored as 0:
 * images and snapshots stay the same whatever range a sandbox had. The clone and the agent binary
 * are staged on a tmpfs over /tmp (private to this mount namespace), because the namespace's root
 * cannot search the host's 0700 directories (the snaplab home, a checkout under /root). Then the
 * launcher joins the user namespace, becomes its root, and execs bwrap, which makes the other
 * namespaces as that root.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "userns.h"

static int write_text(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, text, strlen(text));
	int e = errno;
	close(fd);
	errno = e;
	return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Two close-on-exec pipes, or none (and -1). */
static int two_pipes(int a[2], int b[2])
{
	if (pipe2(a, O_CLOEXEC) < 0)
		return -1;
	if (pipe2(b, O_CLOEXEC) < 0) {
		close(a[0]), close(a[1]);
		return -1;
	}
	return 0;
}

/*
 * In the holder child, before it makes the namespace: run as the range's base uid and gid, keeping
 * CAP_SYS_ADMIN alone. The kernel charges every per-user count of a namespace (its nested user,
 * mount, net, pid, ipc namespaces, inotify instances and watches, mqueue bytes, pending signals)
 * to the namespace's owner in the parent, the euid of the process that made it: made by host root,
 * one machine could take host root's inotify instances or user namespaces (docs/security.md,
 * "Kernel objects"); made by the base uid, each machine's counts are its own. CAP_SYS_ADMIN is kept
 * so that hosts that restrict unprivileged user namespaces (kernel.unprivileged_userns_clone=0,
 * Ubuntu's kernel.apparmor_restrict_unprivileged_userns=1) treat this as the privileged
 * creation it is; nothing else of root's is kept, and the process is not dumpable (the uid change).
 */
static int become_owner(unsigned base)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[2] = { { 0 } };
	d[CAP_TO_INDEX(CAP_SYS_ADMIN)].effective = CAP_TO_MASK(CAP_SYS_ADMIN);
	d[CAP_TO_INDEX(CAP_SYS_ADMIN)].permitted = CAP_TO_MASK(CAP_SYS_ADMIN);
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0 || setgroups(0, NULL) < 0 || setresgid(base, base, base) < 0 ||
	    setresuid(base, base, base) < 0)
		return -1;
	return (int)syscall(SYS_capset, &h, d);
}

/*
 * A child in a new user namespace, owned by BASE (become_owner), mapped BASE..BASE+COUNT-1, waiting on *release until a byte is
 * written to it (let_go). Returns its pid and a descriptor of the namespace in *nsfd, or -1.
 * The caller must be single-threaded, or a fork made clean of other threads' descriptors (forks
 * of the helper's threads inherit every pipe of every concurrent request).
 */
static pid_t hold_userns(unsigned base, unsigned count, int *release, int *nsfd)
{
	int ack[2], rel[2];
	if (two_pipes(ack, rel) < 0)
		return -1;
	pid_t c = fork();
	if (c == 0) {
		close(ack[0]);
		close(rel[1]); /* else the launcher's close would never reach this read as EOF */
		int e = become_owner(base) == 0 && unshare(CLONE_NEWUSER) == 0 ? 0 : errno;
		if (write(ack[1], &e, sizeof e) != sizeof e || e)
			_exit(1);
		(void)!read(rel[0], &e, 1);
		_exit(0);
	}
	close(ack[1]);
	close(rel[0]);
	int made = -1; /* the child's errno from unshare, 0 when it worked */
	if (c < 0 || read(ack[0], &made, sizeof made) != sizeof made || made) {
		int e = c < 0 ? errno : made > 0 ? made : EPERM;
		close(ack[0]), close(rel[1]);
		if (c > 0)
			waitpid(c, NULL, 0);
		errno = e;
		return -1;
	}
	close(ack[0]);
	char path[64], map[64];
	snprintf(map, sizeof map, "0 %u %u\n", base, count);
	snprintf(path, sizeof path, "/proc/%d/uid_map", (int)c);
	int ok = write_text(path, map) == 0;
	snprintf(path, sizeof path, "/proc/%d/gid_map", (int)c);
	ok = ok && write_text(path, map) == 0;
	snprintf(path, sizeof path, "/proc/%d/ns/user", (int)c);
	*nsfd = ok ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	if (*nsfd < 0) {
		int e = errno;
		close(rel[1]);
		waitpid(c, NULL, 0);
		errno = e;
		return -1;
	}
	*release = rel[1];
	return c;
}

static void let_go(pid_t holder, int release)
{
	(void)!write(release, "", 1);
	close(release);
	waitpid(holder, NULL, 0);
}

/* A detached clone of the tree at path, idmapped through the user namespace nsfd (or not, nsfd < 0). */
static int idmapped_clone(const char *path, int nsfd, int allow_suid)
{
	int t = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
	if (t < 0 || nsfd < 0)
		return t;
	/* the storage pool is mounted nosuid on the host; the clone of a system machine's tree, seen
	 * only in the machine's mount namespace, is not (its setuid files are its namespace's root's) */
	struct mount_attr a = { .attr_set = MOUNT_ATTR_IDMAP,
				.attr_clr = allow_suid ? MOUNT_ATTR_NOSUID : 0,
				.userns_fd = (unsigned)nsfd };
	if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &a, sizeof a) < 0) {
		int e = errno;
		close(t);
		errno = e;
		return -1;
	}
	return t;
}

static int attach(int tree, const char *target)
{
	return (int)syscall(SYS_move_mount, tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH);
}

/*
 * Limits of the namespace this process is in (current_user_ns: /proc/sys/user is per namespace),
 * written by the launcher as the namespace's root before anything of the machine runs. Each counts
 * per uid inside the namespace; above them, the machine's whole range is charged to its base uid
 * on the host (become_owner) against the host's own per-user limits. Neither a sandbox (no
 * CAP_SYS_RESOURCE, /proc/sys read-only) nor anything it starts can raise them; a system
 * machine's root can (it has CAP_SYS_RESOURCE in its namespace), and stays bounded by the host's
 * per-user limits on its base uid. docs/security.md "Kernel objects" lists them.
 */
static const struct {
	const char *name;
	const char *value;
} limits[] = {
	{ "max_user_namespaces", USERNS_MAX_NAMESPACES },   { "max_mnt_namespaces", USERNS_MAX_MNT_NAMESPACES },
	{ "max_net_namespaces", USERNS_MAX_NAMESPACES },    { "max_pid_namespaces", USERNS_MAX_NAMESPACES },
	{ "max_ipc_namespaces", USERNS_MAX_NAMESPACES },    { "max_uts_namespaces", USERNS_MAX_NAMESPACES },
	{ "max_cgroup_namespaces", USERNS_MAX_NAMESPACES }, { "max_time_namespaces", USERNS_MAX_NAMESPACES },
	{ "max_inotify_instances", USERNS_MAX_INOTIFY },    { "max_inotify_watches", USERNS_MAX_INOTIFY_WATCHES },
};

static int limit_here(int proc)
{
	char path[96];
	for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
		snprintf(path, sizeof path, "%ssys/user/%s", proc >= 0 ? "" : "/proc/", limits[i].name);
		int fd = openat(proc >= 0 ? proc : AT_FDCWD, path, O_WRONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? write(fd, limits[i].value, strlen(limits[i].value)) : -1;
		int e = errno;
		if (fd >= 0)
			close(fd);
		errno = e;
		/* a kernel without this one (time namespaces before 5.6) has nothing to bound */
		if (n != (ssize_t)strlen(limits[i].value) && !(fd < 0 && errno == ENOENT))
			return -1;
	}
	return 0;
}

/*
 * A proc instance of this launch alone, detached (fsopen/fsmount: mounted nowhere, gone with its
 * descriptor), made as host root before joining the new namespace; or -1 (an older kernel: the
 * host's /proc). Why: sysctl dentries are per proc superblock, and on the host's /proc every user
 * namespace's /proc/sys/user/NAME hangs under one parent with one name, so each lookup compares
 * against all of them (proc_sys_compare): with ~2500 sandboxes on the host that walk was ~40% of
 * all CPU in a bulk create (docs/architecture.md "Density"). A fresh instance has only this
 * namespace's entries.
 */
static int private_proc(void)
{
	int fs = (int)syscall(SYS_fsopen, "proc", FSOPEN_CLOEXEC);
	if (fs < 0)
		return -1;
	int m = -1;
	if (syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
		m = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
				 MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
	close(fs);
	return m;
}

/* The limits through a private proc instance (private_proc), or through /proc when there is
 * none or when it refuses (an LSM may judge a detached mount differently): the same writes. */
static int set_limits(int proc)
{
	if (proc >= 0 && limit_here(proc) == 0)
		return 0;
	return limit_here(-1);
}

#define FAIL(what)                                                                              \
	do {                                                                                    \
		dprintf(2, "snaplab-hostops: user namespace: %s: %s\n", what, strerror(errno)); \
		return -1;                                                                      \
	} while (0)

#define MAX_LOWER 64

/* Stage one idmapped tree at /tmp/snaplab-<name> (a directory in the staging tmpfs). */
static int stage(int tree, const char *name, char *at, size_t cap)
{
	snprintf(at, cap, "%s/snaplab-%s", USERNS_STAGE, name);
	if (mkdir(at, 0755) < 0 && errno != EEXIST)
		return -1;
	return attach(tree, at);
}

int userns_enter(unsigned base, unsigned count, int owner, const struct userns_root *rootspec, const char *agent)
{
	const char *rootfs = rootspec->dir;
	int nl = rootspec->lowers ? rootspec->nlower : 0;
	if (nl > MAX_LOWER) {
		errno = E2BIG;
		FAIL("too many overlay layers");
	}
	int release = -1, nsfd = owner;
	pid_t holder = -1;
	if (owner < 0 && (holder = hold_userns(base, count, &release, &nsfd)) < 0)
		FAIL("cannot make it (are user namespaces enabled? sysctl user.max_user_namespaces)");
	/* everything below happens in a mount namespace of this launch alone: nothing reaches the
	 * host's, while the host's unmounts still reach it (slave, not private: bwrap's monitor lives
	 * here as long as the sandbox, and must not pin a filesystem the host lets go of) */
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
		FAIL("private mount namespace");
	/* every tree is cloned before the staging tmpfs covers /tmp (the home may be under it) */
	int root = -1, lower[MAX_LOWER], vol = -1;
	char voldir[4096];
	if (nl == 0 && (root = idmapped_clone(rootfs, nsfd, rootspec->allow_suid)) < 0)
		FAIL("idmapped mount of the root filesystem (does its filesystem support idmapped mounts?)");
	for (int i = 0; i < nl; i++)
		if ((lower[i] = idmapped_clone(rootspec->lowers[i], nsfd, rootspec->allow_suid)) < 0)
			FAIL("idmapped mount of an overlay layer");
	if (nl) {
		/* upper and work must be on one mount: clone their common parent */
		snprintf(voldir, sizeof voldir, "%s", rootspec->upper);
		char *slash = strrchr(voldir, '/');
		if (!slash)
			FAIL("overlay upper dir");
		*slash = 0;
		if ((vol = idmapped_clone(voldir, nsfd, rootspec->allow_suid)) < 0)
			FAIL("idmapped mount of the overlay's upper and work dirs");
	}
	int bin = idmapped_clone(agent, -1, 0);
	if (bin < 0)
		FAIL("clone of the agent binary");
	if (mount("snaplab-stage", USERNS_STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k") < 0)
		FAIL("staging tmpfs");
	int f = open(USERNS_STAGE_AGENT, O_CREAT | O_WRONLY | O_CLOEXEC, 0755);
	if (mkdir(USERNS_STAGE_ROOT, 0755) < 0 || f < 0)
		FAIL("staging directory");
	close(f);
	if ((root >= 0 && attach(root, USERNS_STAGE_ROOT) < 0) || attach(bin, USERNS_STAGE_AGENT) < 0)
		FAIL("staging mounts");
	/* the overlay's options name the staged layers: lowerdir=/tmp/snaplab-l0:..., upper and work in /tmp/snaplab-v */
	static char opts[8192];
	size_t o = 0;
	if (nl) {
		char at[256];
		o += (size_t)snprintf(opts + o, sizeof opts - o, "lowerdir=");
		for (int i = 0; i < nl; i++) {
			char name[16];
			snprintf(name, sizeof name, "l%d", i);
			if (stage(lower[i], name, at, sizeof at) < 0)
				FAIL("staging an overlay layer");
			close(lower[i]);
			o += (size_t)snprintf(opts + o, sizeof opts - o, "%s%s", i ? ":" : "", at);
		}
		if (stage(vol, "v", at, sizeof at) < 0)
			FAIL("staging the overlay's upper dir");
		close(vol);
		const char *u = strrchr(rootspec->upper, '/'), *w = strrchr(rootspec->work, '/');
		/* userxattr: overlayfs's marks as user.overlay.* (the namespace's root cannot write
		 * trusted.*), as every overlay mount of snaplab does (OVERLAY_OPTIONS, layers.ts) */
		o += (size_t)snprintf(opts + o, sizeof opts - o, ",upperdir=%s%s,workdir=%s%s,userxattr", at, u, at, w);
		if (o >= sizeof opts) {
			errno = E2BIG;
			FAIL("overlay options");
		}
	}
	if (root >= 0)
		close(root);
	close(bin);
	int proc = holder > 0 ? private_proc() : -1;
	if (setns(nsfd, CLONE_NEWUSER) < 0)
		FAIL("join");
	close(nsfd);
	/* a namespace made here gets its limits now; a joined one got them when it was made (netns_make) */
	if (holder > 0 && set_limits(proc) < 0)
		FAIL("per-namespace limits (/proc/sys/user)");
	if (proc >= 0)
		close(proc);
	if (holder > 0)
		let_go(holder, release); /* the namespace lives on in this process */
	if (setresgid(0, 0, 0) < 0 || setgroups(0, NULL) < 0 || setresuid(0, 0, 0) < 0)
		FAIL("become its root");
	/* a namespace joined, not made (a scenario machine's): it must map the range recorded for it */
	if (owner >= 0) {
		unsigned in = 1, out = 0, n = 0;
		char map[128] = { 0 };
		int m = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC); /* no stdio: a fork of a threaded process */
		ssize_t got = m >= 0 ? read(m, map, sizeof map - 1) : -1;
		if (m >= 0)
			close(m);
		int ok = got > 0 && sscanf(map, "%u %u %u", &in, &out, &n) == 3 && in == 0 && out == base && n == count;
		if (!ok) {
			errno = EPERM;
			FAIL("the machine's namespace does not map the range recorded for it");
		}
	}
	/* the overlay is mounted by the namespace's root, in a mount namespace the namespace owns:
	 * the kernel then takes the idmapped layers (as host root it came up read-only) */
	if (nl && (unshare(CLONE_NEWNS) < 0 || mount("overlay", USERNS_STAGE_ROOT, "overlay", 0, opts) < 0))
		FAIL("overlay mount inside the namespace");
	/* non-dumpable until the exec (the credentials changed): the range cannot ptrace this copy of the helper */
	return 0;
}

int idmap_check(const char *dir, unsigned base)
{
	pid_t c = fork();
	if (c == 0) {
		close_range(3, ~0U, 0); /* other requests' descriptors: see hold_userns */
		int release, nsfd;
		pid_t holder = hold_userns(base, 65536, &release, &nsfd);
		if (holder < 0)
			_exit(10);
		int rc = unshare(CLONE_NEWNS) < 0	    ? 11
			 : idmapped_clone(dir, nsfd, 0) < 0 ? (errno == EINVAL ? 12 : 13)
							    : 0;
		let_go(holder, release);
		_exit(rc);
	}
	int st = 0;
	if (c < 0 || waitpid(c, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 14;
}

static int netns_make_here(const char *path, unsigned base, unsigned count)
{
	int release, nsfd;
	pid_t holder = hold_userns(base, count, &release, &nsfd);
	if (holder < 0)
		return -1;
	/* a second child, in the holder's user namespace, makes the network namespace there: a
	 * network namespace belongs to the user namespace of the process that creates it */
	int done[2], go[2];
	if (two_pipes(done, go) < 0)
		return -1;
	pid_t c = fork();
	if (c == 0) {
		close(done[0]);
		close(go[1]);
		int proc = private_proc();
		int e = setns(nsfd, CLONE_NEWUSER) == 0 && set_limits(proc) == 0 && unshare(CLONE_NEWNET) == 0 ? 0
													       : errno;
		(void)!write(done[1], &e, sizeof e);
		if (!e)
			(void)!read(go[0], &e, 1); /* alive until the namespace is bound (the caller closes go) */
		_exit(0);
	}
	close(done[1]);
	close(go[0]);
	int e = c < 0 ? errno : -1;
	if (c > 0 && read(done[0], &e, sizeof e) != sizeof e)
		e = EPROTO;
	int rc = -1;
	if (e == 0) {
		char ns[64];
		snprintf(ns, sizeof ns, "/proc/%d/ns/net", (int)c);
		int f = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444);
		if (f >= 0) {
			close(f);
			rc = mount(ns, path, NULL, MS_BIND, NULL);
			if (rc < 0) {
				e = errno;
				unlink(path);
			}
		} else
			e = errno;
	}
	close(done[0]);
	(void)!write(go[1], "", 1);
	close(go[1]);
	if (c > 0)
		waitpid(c, NULL, 0);
	close(nsfd);
	let_go(holder, release);
	errno = e;
	return rc;
}

int netns_make(const char *path, unsigned base, unsigned count)
{
	/* in a worker of its own, clean of other requests' descriptors (see hold_userns) */
	pid_t w = fork();
	if (w == 0) {
		close_range(3, ~0U, 0);
		_exit(netns_make_here(path, base, count) == 0 ? 0 : errno & 0xff);
	}
	int st = 0;
	if (w < 0 || waitpid(w, &st, 0) < 0)
		return -1;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	errno = WIFEXITED(st) ? WEXITSTATUS(st) : EINTR;
	return -1;
}
