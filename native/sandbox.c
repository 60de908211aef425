#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <grp.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <linux/mount.h> /* fspick, fsconfig: musl's sys/mount.h has not their constants */
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The filters, compiled when the agent is built (filters.c, build/filters.h) */
#include "filters.h"

const struct sock_fprog sandbox_filter = {
	.len = sizeof sandbox_program / sizeof *sandbox_program,
	.filter = (struct sock_filter *)sandbox_program,
};

const struct sock_fprog system_filter = {
	.len = sizeof system_program / sizeof *system_program,
	.filter = (struct sock_filter *)system_program,
};

/* several names a line, laid out by hand */
/* clang-format off */
static const char *const cap_names[] = {
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
	"SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST",
	"NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO",
	"SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
	"SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE",
	"AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
	"BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
};
/* clang-format on */
#define NCAPS ((int)(sizeof cap_names / sizeof cap_names[0]))

static int cap_lookup(const char *name, size_t n)
{
	if (n > 4 && strncasecmp(name, "CAP_", 4) == 0) {
		name += 4;
		n -= 4;
	}
	for (int i = 0; i < NCAPS; i++)
		if (strlen(cap_names[i]) == n && strncasecmp(cap_names[i], name, n) == 0)
			return i;
	return -1;
}

/*
 * A bind remount of PATH with FLAGS added to what it must keep. Inside a user namespace the
 * nosuid, nodev, noexec and read-only flags a mount had when the namespace got it are locked: a
 * remount that leaves one out is EPERM. A host /dev mounted nosuid (Debian, Ubuntu and dracut
 * all mount it so) made every bind of /dev/null fail that way. So the flags the mount has now
 * (statvfs) are kept; atime flags a bind remount keeps by itself.
 */
int remount_keeping(const char *path, unsigned long flags)
{
	struct statvfs st;
	if (statvfs(path, &st) < 0)
		return -1;
	if (st.f_flag & ST_NOSUID)
		flags |= MS_NOSUID;
	if (st.f_flag & ST_NODEV)
		flags |= MS_NODEV;
	if (st.f_flag & ST_NOEXEC)
		flags |= MS_NOEXEC;
	if (st.f_flag & ST_RDONLY)
		flags |= MS_RDONLY;
	return mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | flags, NULL);
}

/*
 * /proc as Docker leaves it. Without a user namespace the sandbox's root is the host's root, so a
 * writable /proc/sys (kernel.core_pattern, kernel.modprobe) would run code on the host. bwrap only
 * covers /proc/sys when it is writable by access(2), which the kernel never reports for the
 * directory itself. So the agent, started with CAP_SYS_ADMIN for exactly this, makes the tunables
 * read-only and masks the files that expose the host kernel, then drops the capability for good
 * (caps_restrict) before it serves anything. Paths this kernel lacks are skipped.
 */
char harden_failed[128];

/* The step that failed, for the error message (the launch reports it, not just the errno). */
static int harden_fail(const char *what, const char *path)
{
	int e = errno;
	snprintf(harden_failed, sizeof harden_failed, "%s %s", what, path);
	errno = e;
	return -1;
}

/*
 * The masked directories of /proc, all bound from one empty directory that is then removed: a
 * directory made in /dev's tmpfs (a superblock the machine has anyway), bound read-only over each
 * and deleted, so the binds hold a directory the kernel lets nothing be created in (a removed
 * directory takes no new entry, read-only or not). A tmpfs per mask, as before, cost a superblock
 * each, and every superblock a shrinker id that each memory cgroup on the host pays for
 * (docs/architecture.md "Density").
 */
#define MASK_SOURCE "/dev/.snaplab-masked"

static int mask_dirs(const char *const *dirs, size_t n)
{
	const unsigned long ro_flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
	int made = 0;
	for (size_t i = 0; i < n; i++) {
		if (access(dirs[i], F_OK) < 0)
			continue;
		if (!made && mkdir(MASK_SOURCE, 0555) < 0 && errno != EEXIST)
			return harden_fail("mkdir", MASK_SOURCE);
		made = 1;
		if (mount(MASK_SOURCE, dirs[i], NULL, MS_BIND, NULL) < 0)
			return harden_fail("mask", dirs[i]);
		if (remount_keeping(dirs[i], ro_flags) < 0)
			return harden_fail("remount read-only", dirs[i]);
	}
	if (made && rmdir(MASK_SOURCE) < 0)
		return harden_fail("rmdir", MASK_SOURCE);
	return 0;
}

/*
 * A sandbox's /dev/shm: the directory bwrap makes in /dev's tmpfs (mode 1777, as on any Linux),
 * bound over itself so that it stays writable when /dev goes read-only, and that tmpfs capped at
 * SHM_BYTES, the size Docker and E2B give /dev/shm (/dev holds nothing else that takes pages:
 * empty files the host's devices are bound on, directories, symlinks). A tmpfs of its own, as
 * before, cost a superblock (see mask_dirs). Its pages are charged to the sandbox's memory cgroup
 * as before, so its memory limit bounds it too. A /dev/shm that is already a mount is left as it is.
 */
#define SHM_BYTES "64m"

static int shm_in_dev(void)
{
	struct stat dev, shm;
	if (stat("/dev", &dev) < 0 || stat("/dev/shm", &shm) < 0)
		return harden_fail("stat", "/dev/shm");
	if (dev.st_dev != shm.st_dev)
		return 0;
	if (chmod("/dev/shm", 01777) < 0)
		return harden_fail("chmod", "/dev/shm");
	if (mount("/dev/shm", "/dev/shm", NULL, MS_BIND, NULL) < 0)
		return harden_fail("bind", "/dev/shm");
	if (remount_keeping("/dev/shm", MS_NOSUID | MS_NODEV) < 0)
		return harden_fail("remount", "/dev/shm");
	/* the superblock's size alone (fspick: no mount flag changes with it) */
	int fs = (int)syscall(SYS_fspick, AT_FDCWD, "/dev", FSPICK_CLOEXEC);
	int rc = fs < 0 ? -1 : (int)syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "size", SHM_BYTES, 0);
	if (rc == 0)
		rc = (int)syscall(SYS_fsconfig, fs, FSCONFIG_CMD_RECONFIGURE, NULL, NULL, 0);
	int e = errno;
	if (fs >= 0)
		close(fs);
	errno = e;
	return rc < 0 ? harden_fail("cap the size of", "/dev (and /dev/shm in it)") : 0;
}

/*
 * A sandbox's /run: a directory of /dev's tmpfs, not a tmpfs of its own (a superblock, which every
 * memory cgroup on the host pays a slot for: docs/architecture.md "Density"). The directory is
 * made under /dev/pts, where the sandbox's devpts covers it, so /dev shows nothing of it and no
 * path through /dev reaches it (only an unmount of /dev/pts would, which needs CAP_SYS_ADMIN:
 * nothing inside keeps it). It is reached here through a bind of /dev's tmpfs alone (a bind that
 * is not recursive takes no mount along, devpts neither), then bound at /run, and the bind is
 * removed. bwrap bound the agent at STAGE in /dev (there was no /run yet): it is bound again at
 * /run/snaplab/agent, where commands run it, read-only, and STAGE goes. /run shares the tmpfs's
 * size cap with /dev/shm (shm_in_dev).
 */
#define RUN_WORK "/dev/.snaplab-run"

int run_in_dev(const char *stage)
{
	const char *agent = MACHINE_AGENT;
	const char *dirs[] = { RUN_WORK "/pts/run", RUN_WORK "/pts/run/snaplab" };
	if (mkdir(RUN_WORK, 0700) < 0)
		return harden_fail("mkdir", RUN_WORK);
	if (mount("/dev", RUN_WORK, NULL, MS_BIND, NULL) < 0)
		return harden_fail("bind /dev at", RUN_WORK);
	/* (mode 0755 whatever the umask the agent was started with: bwrap made them so before) */
	for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
		if (mkdir(dirs[i], 0755) < 0 || chmod(dirs[i], 0755) < 0)
			return harden_fail("mkdir or chmod", dirs[i]);
	int f = open(RUN_WORK "/pts" MACHINE_AGENT, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0555);
	if (f < 0)
		return harden_fail("create", agent);
	close(f);
	/* (an image without /run gets the directory, as bwrap's tmpfs made it before) */
	if (mkdir("/run", 0755) == 0 ? chmod("/run", 0755) < 0 : errno != EEXIST)
		return harden_fail("mkdir or chmod", "/run");
	if (mount(RUN_WORK "/pts/run", "/run", NULL, MS_BIND, NULL) < 0)
		return harden_fail("bind", "/run");
	if (umount2(RUN_WORK, MNT_DETACH) < 0 || rmdir(RUN_WORK) < 0)
		return harden_fail("remove", RUN_WORK);
	if (mount(stage, agent, NULL, MS_BIND, NULL) < 0)
		return harden_fail("bind", agent);
	if (remount_keeping(agent, MS_RDONLY | MS_NOSUID | MS_NODEV) < 0)
		return harden_fail("remount read-only", agent);
	if (umount2(stage, MNT_DETACH) < 0 || unlink(stage) < 0)
		return harden_fail("remove", stage);
	return 0;
}

int harden_proc(int dev_readonly)
{
	static const char *const ro[] = { "/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq" };
	static const char *const masked_files[] = { "/proc/sysrq-trigger", "/proc/kcore",      "/proc/keys",
						    "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
						    "/proc/sched_debug",   "/proc/kallsyms" };
	static const char *const masked_dirs[] = { "/proc/acpi", "/proc/asound", "/proc/scsi" };
	const unsigned long ro_flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
	for (size_t i = 0; i < sizeof ro / sizeof *ro; i++) {
		if (access(ro[i], F_OK) < 0)
			continue;
		if (mount(ro[i], ro[i], NULL, MS_BIND | MS_REC, NULL) < 0)
			return harden_fail("bind", ro[i]);
		if (remount_keeping(ro[i], ro_flags) < 0)
			return harden_fail("remount read-only", ro[i]);
	}
	for (size_t i = 0; i < sizeof masked_files / sizeof *masked_files; i++) {
		if (access(masked_files[i], F_OK) < 0)
			continue;
		if (mount("/dev/null", masked_files[i], NULL, MS_BIND, NULL) < 0)
			return harden_fail("mask", masked_files[i]);
		if (remount_keeping(masked_files[i], MS_RDONLY) < 0)
			return harden_fail("remount read-only", masked_files[i]);
	}
	if (mask_dirs(masked_dirs, sizeof masked_dirs / sizeof *masked_dirs) < 0)
		return -1;
	if (dev_readonly && shm_in_dev() < 0)
		return -1;
	/* The device nodes bwrap binds are the host's own inodes: read-only mounts (devices stay
	 * usable: a read-only mount does not stop writes to a character device) so that chmod or chown
	 * inside cannot change the host's /dev/null. Then /dev itself read-only, so that nothing can be
	 * added to it or swapped in it between executions (/dev/shm, /dev/pts, /dev/mqueue are mounts
	 * of their own and stay writable). */
	static const char *const devices[] = { "/dev/null",   "/dev/zero",    "/dev/full",
					       "/dev/random", "/dev/urandom", "/dev/tty" };
	for (size_t i = 0; i < sizeof devices / sizeof *devices; i++) {
		if (access(devices[i], F_OK) < 0)
			continue;
		if (remount_keeping(devices[i], MS_RDONLY | MS_NOSUID) < 0)
			return harden_fail("remount read-only", devices[i]);
	}
	/* (not for a system machine: its systemd makes /dev/log and friends in its own /dev) */
	if (dev_readonly && remount_keeping("/dev", MS_RDONLY | MS_NOSUID | MS_NODEV) < 0)
		return harden_fail("remount read-only", "/dev");
	return 0;
}

int caps_restrict(const char *list)
{
	uint64_t keep = 0;
	for (const char *p = list; *p;) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n > 0) {
			int c = cap_lookup(p, n);
			if (c < 0) {
				fprintf(stderr, "snaplab-agent: unknown capability '%.*s'\n", (int)n, p);
				errno = EINVAL;
				return -1;
			}
			keep |= 1ull << c;
		}
		p = e ? e + 1 : p + n;
	}
	/* Walk up to what the kernel knows, not just our table: unknown new caps are dropped too. */
	for (int c = 0; c < 64; c++) {
		if (keep & (1ull << c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break;
			return -1;
		}
	}
	/*
	 * The agent keeps no more than its commands get: it is the sandbox's root, and requests it
	 * serves itself (SET_CLOCK, FILE_PUT) must fail the same way a command would. Inheritable and
	 * ambient sets could otherwise carry a dropped cap across exec.
	 */
	prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) < 0)
		return -1;
	for (int i = 0; i < 2; i++) {
		uint32_t k = (uint32_t)(keep >> (32 * i));
		d[i].inheritable &= k;
		d[i].permitted &= k;
		d[i].effective &= k;
	}
	return syscall(SYS_capset, &h, d) < 0 ? -1 : 0;
}

static _Noreturn void child_fail(struct spawn_req *r, int stage)
{
	r->err = errno;
	r->stage = stage;
	_exit(stage == STAGE_EXEC && (r->err == ENOENT || r->err == ENOTDIR) ? 127 : 126);
}

/* Runs in the vfork-style child: async-signal-safe calls only, no heap, no stdio. */
static int child_main(void *arg)
{
	struct spawn_req *r = arg;
	r->ns_pid = getpid();
	/* its own process group either way (SIGNAL goes to the group); a terminal's command leads a
	 * session whose controlling terminal is the pty, so ^C reaches its foreground group */
	if (r->tty ? setsid() < 0 : setpgid(0, 0) < 0)
		child_fail(r, STAGE_SETUP);
	if (dup2(r->fd_in, 0) < 0 || dup2(r->fd_out, 1) < 0 || dup2(r->fd_err, 2) < 0)
		child_fail(r, STAGE_SETUP);
	if (r->tty && ioctl(0, TIOCSCTTY, 0) < 0)
		child_fail(r, STAGE_SETUP);
	/* the user last but the filter: groups, then gid, then uid (which drops every capability) */
	if (r->set_user && (setgroups((size_t)r->ngroups, r->groups) < 0 || setresgid(r->gid, r->gid, r->gid) < 0 ||
			    setresuid(r->uid, r->uid, r->uid) < 0))
		child_fail(r, STAGE_USER);
	if (r->cwd && chdir(r->cwd) < 0)
		child_fail(r, STAGE_CHDIR);
	/* The agent ignores SIGPIPE and blocks SIGCHLD/SIGTERM/SIGINT; a command gets defaults. */
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_DFL;
	sigaction(SIGPIPE, &sa, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (r->filter && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, r->filter, 0, 0) < 0)
		child_fail(r, STAGE_SECCOMP);

	const char *file = r->argv[0];
	if (strchr(file, '/')) {
		execve(file, r->argv, r->envp);
		child_fail(r, STAGE_EXEC);
	}
	/* execvp semantics, but PATH comes from the command's env, not the agent's. */
	int seen_eacces = 0;
	size_t flen = strlen(file);
	for (const char *p = r->path;;) {
		const char *e = strchrnul(p, ':');
		size_t dl = (size_t)(e - p);
		char *b = r->pathbuf;
		if (dl) {
			memcpy(b, p, dl);
			b[dl++] = '/';
		}
		memcpy(b + dl, file, flen + 1);
		execve(b, r->argv, r->envp);
		if (errno == EACCES)
			seen_eacces = 1;
		else if (errno != ENOENT && errno != ENOTDIR && errno != ESTALE && errno != ENODEV &&
			 errno != ETIMEDOUT)
			child_fail(r, STAGE_EXEC);
		if (!*e)
			break;
		p = e + 1;
	}
	errno = seen_eacces ? EACCES : ENOENT;
	child_fail(r, STAGE_EXEC);
}

/* One stack is enough: CLONE_VFORK suspends us until the child has exec'd or exited. Page-aligned,
 * so that give_back_stacks can return all of it, its top page (the one a spawn touches) too. */
static char child_stack[64 * 1024] __attribute__((aligned(4096)));

void give_back_stacks(void)
{
	const uintptr_t page = (uintptr_t)getpagesize();
	/* the child's: nothing runs on it once spawn_child has returned */
	uintptr_t lo = ((uintptr_t)child_stack + page - 1) & ~(page - 1);
	uintptr_t hi = ((uintptr_t)child_stack + sizeof child_stack) & ~(page - 1);
	if (hi > lo)
		madvise((void *)lo, hi - lo, MADV_DONTNEED);
	/* ours, below this frame and a page more (the red zone, madvise's own frame): dead by the
	 * ABI. The span is far less than the gap the kernel leaves between a stack's top and any
	 * other mapping (at least 128 MiB); madvise does the mapped part of it and says ENOMEM for
	 * the rest, which is why its answer is not looked at. */
	const uintptr_t span = 1 << 20;
	uintptr_t keep = ((uintptr_t)__builtin_frame_address(0) & ~(page - 1)) - page;
	madvise((void *)(keep - span), span, MADV_DONTNEED);
}

pid_t spawn_child(struct spawn_req *r)
{
	r->stage = STAGE_OK;
	r->err = 0;
	r->ns_pid = 0;
	return clone(child_main, child_stack + sizeof child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, r);
}
