/*
 * snaplab-agent boot: raise a system machine, whose PID 1 is the image's own init (systemd).
 *
 *   snaplab-agent boot --root DIR --agent PATH --hostname NAME [--net] [--caps LIST] [--cgroup PROCS] [--agent-cgroup PROCS] -- INIT [ARGS]
 *
 * Run by the host helper's launcher as the root of the machine's user namespace, in a mount
 * namespace of its own where DIR is the machine's (idmapped) root and PATH the agent binary (see
 * userns.c), with the agent's fds: 3 ready pipe, 4 info pipe, 5 listening socket. bubblewrap is
 * not used for these machines: it always sets no_new_privs and mounts nosuid, so sudo and su
 * could never work; inside a user namespace setuid root is only the namespace's root.
 *
 * This process (the monitor) makes the console (a pty whose master it holds and copies to its
 * stdout, the machine's log), forks the agent (agent_child: it waits, then joins the machine from
 * outside its pid namespace), unshares pid, ipc, uts (and net, with --net) namespaces, and forks
 * the machine's PID 1. PID 1 moves itself into the cgroup delegated to the machine's systemd
 * (--cgroup: its cgroup.procs; the monitor stays in the leaf beside it, and the agent moves into
 * a leaf of its own inside, --agent-cgroup: see src/host/cgroups/cgroups.ts delegateCgroup) and makes
 * its cgroup namespace there, then mounts /proc, a read-only /sys, the cgroup2 subtree of its
 * own cgroup at /sys/fs/cgroup, a /dev of bound host devices with its own devpts, tmpfs /run and
 * /tmp, the agent read-only at /run/snaplab/agent; pivots into DIR; tells the agent it may join,
 * and execs INIT with container=snaplab. The monitor reports PID 1's host pid on
 * fd 4 as bubblewrap does ({"child-pid": N}) and exits with PID 1's status.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <linux/seccomp.h>
#include <linux/filter.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "sandbox.h"

/* what the monitor keeps of a system machine's console in its log, on the host's disk */
#define CONSOLE_LOG_MAX (16 << 20)

#define BOOT_FAIL(what)                                                                 \
	do {                                                                            \
		fprintf(stderr, "snaplab-agent boot: %s: %s\n", what, strerror(errno)); \
		_exit(125);                                                             \
	} while (0)

static void touch(const char *path, mode_t mode)
{
	int f = open(path, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, mode);
	if (f < 0 && errno != EEXIST)
		BOOT_FAIL(path);
	if (f >= 0)
		close(f);
}

static void mnt(const char *src, const char *dst, const char *type, unsigned long flags, const char *data)
{
	if (mount(src, dst, type, flags, data) < 0) {
		char what[512];
		snprintf(what, sizeof what, "mount %s on %s", type ? type : src, dst);
		BOOT_FAIL(what);
	}
}

static void bind_ro(const char *src, const char *dst)
{
	mnt(src, dst, NULL, MS_BIND, NULL);
	if (remount_keeping(dst, MS_RDONLY | MS_NOSUID | MS_NODEV) < 0) {
		char what[512];
		snprintf(what, sizeof what, "remount %s read-only", dst);
		BOOT_FAIL(what);
	}
}

static void lo_up(void)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	strcpy(ifr.ifr_name, "lo");
	if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		BOOT_FAIL("loopback");
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		BOOT_FAIL("loopback up");
	close(s);
}

/* The machine's /dev: a tmpfs with the host's harmless devices bound in (a user namespace
 * cannot mknod), its own devpts instance, and the console pty. Paths are relative to the new
 * root, which is the cwd; host paths are absolute (the old root is still /). */
static void make_dev(const char *console)
{
	mnt("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_STRICTATIME, "mode=755,size=65536k");
	static const char *const devices[] = { "null", "zero", "full", "random", "urandom", "tty" };
	for (size_t i = 0; i < sizeof devices / sizeof *devices; i++) {
		char in[64], host[64];
		snprintf(in, sizeof in, "dev/%s", devices[i]);
		snprintf(host, sizeof host, "/dev/%s", devices[i]);
		touch(in, 0666);
		mnt(host, in, NULL, MS_BIND, NULL);
	}
	if (mkdir("dev/pts", 0755) < 0)
		BOOT_FAIL("mkdir dev/pts");
	mnt("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620,gid=5");
	if (symlink("pts/ptmx", "dev/ptmx") < 0)
		BOOT_FAIL("dev/ptmx");
	touch("dev/console", 0600);
	mnt(console, "dev/console", NULL, MS_BIND, NULL);
	if (mkdir("dev/shm", 01777) < 0 || mkdir("dev/mqueue", 0755) < 0)
		BOOT_FAIL("mkdir dev/shm");
	mnt("tmpfs", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
	mnt("mqueue", "dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	static const char *const links[][2] = {
		{ "/proc/self/fd", "dev/fd" },
		{ "/proc/self/fd/0", "dev/stdin" },
		{ "/proc/self/fd/1", "dev/stdout" },
		{ "/proc/self/fd/2", "dev/stderr" },
	};
	for (size_t i = 0; i < sizeof links / sizeof *links; i++)
		if (symlink(links[i][0], links[i][1]) < 0)
			BOOT_FAIL(links[i][1]);
}

/* Open a file of the machine's /etc to rewrite: a regular file only (a FIFO there would block
 * the boot), never through a final symlink. */
static int etc_file(const char *path, int flags)
{
	int f = open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
	struct stat st;
	if (f >= 0 && (fstat(f, &st) < 0 || !S_ISREG(st.st_mode))) {
		close(f);
		return -1;
	}
	return f;
}

void name_machine(const char *hostname)
{
	int f = etc_file("/etc/hostname", O_WRONLY | O_CREAT | O_TRUNC);
	if (f >= 0) {
		dprintf(f, "%s\n", hostname);
		close(f);
	}
	static char hosts[1 << 16];
	ssize_t n = 0;
	f = etc_file("/etc/hosts", O_RDONLY);
	if (f >= 0) {
		n = read(f, hosts, sizeof hosts - 1);
		close(f);
	}
	if (n < 0)
		n = 0;
	hosts[n] = 0;
	char line[320];
	snprintf(line, sizeof line, "127.0.1.1\t%s\n", hostname);
	if ((size_t)n == sizeof hosts - 1 || strstr(hosts, line))
		return; /* there already (or a file too big to be a hosts file: leave it) */
	f = etc_file("/etc/hosts", O_WRONLY | O_CREAT | O_APPEND);
	if (f >= 0) {
		if (n == 0)
			dprintf(f, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
		else if (hosts[n - 1] != '\n')
			dprintf(f, "\n");
		dprintf(f, "%s", line);
		close(f);
	}
}

/* PID 1 and the agent alike: the bounding set of a system container (systemd-nspawn's default:
 * without the trim units that need CAP_SYS_RAWIO and friends fail), and the machine's small
 * seccomp filter, which everything they start inherits */
static void confine(const char *caps)
{
	if (caps && caps_restrict(caps) < 0)
		BOOT_FAIL("capability bounding set");
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &system_filter, 0, 0) < 0)
		BOOT_FAIL("seccomp filter");
}

/* PID 1 into the cgroup the host delegated to the machine's systemd, then a cgroup namespace
 * rooted there: the machine sees that cgroup as /sys/fs/cgroup and can name nothing above it. */
static void enter_payload(const char *procs)
{
	if (procs) {
		int f = open(procs, O_WRONLY | O_CLOEXEC);
		if (f < 0 || write(f, "0", 1) != 1)
			BOOT_FAIL("join the machine's cgroup");
		close(f);
	}
	if (unshare(CLONE_NEWCGROUP) < 0)
		BOOT_FAIL("unshare the cgroup namespace");
}

static _Noreturn void pid1(const char *root, const char *agent, const char *hostname, const char *console,
			   const char *caps, int up_fd, char **init)
{
	if (sethostname(hostname, strlen(hostname)) < 0)
		BOOT_FAIL("sethostname");
	mnt(root, root, NULL, MS_BIND | MS_REC, NULL);
	if (chdir(root) < 0)
		BOOT_FAIL("chdir root");
	mnt("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	mnt("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	/* the cgroup namespace is rooted at the machine's own cgroup, which the host delegated */
	mnt("cgroup2", "sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	make_dev(console);
	mnt("tmpfs", "run", "tmpfs", MS_NOSUID | MS_NODEV | MS_STRICTATIME, "mode=755,size=20%");
	mnt("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_STRICTATIME, "mode=1777");
	if (mkdir("run/snaplab", 0755) < 0)
		BOOT_FAIL("mkdir run/snaplab");
	touch("run/snaplab/agent", 0555);
	bind_ro(agent, "run/snaplab/agent");
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		BOOT_FAIL("pivot_root");
	if (umount2(".", MNT_DETACH) < 0)
		BOOT_FAIL("detach the old root");
	if (chdir("/") < 0)
		BOOT_FAIL("chdir /");
	/* the machine's name, as its systemd reads it at boot (an image carries its own), and in
	 * /etc/hosts, which sudo and other tools resolve it with (the tree is the machine's own) */
	name_machine(hostname);
	/* as Docker does: /proc/sys and friends read-only, sysrq and kcore masked */
	if (harden_proc(0) < 0) {
		char what[192];
		snprintf(what, sizeof what, "harden /proc: %s", harden_failed);
		BOOT_FAIL(what);
	}
	confine(caps);

	/* set up: the agent, waiting outside, may join (closed at the exec, so a failed boot is EOF).
	 * Dumpable first: this process's memory is the initial user namespace's (the agent binary
	 * is unreadable here), and the agent, the machine's root, must open its /proc/1/ns */
	prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
	if (write(up_fd, "1", 1) != 1)
		BOOT_FAIL("tell the agent");
	int c = open("/dev/console", O_RDWR | O_CLOEXEC | O_NOCTTY);
	if (c < 0 || dup2(c, 0) < 0 || dup2(c, 1) < 0 || dup2(c, 2) < 0)
		BOOT_FAIL("console");
	char *envp[] = { "container=snaplab", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			 "TERM=linux", NULL };
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execve(init[0], init, envp);
	BOOT_FAIL(init[0]);
}

/*
 * The agent, forked by the monitor before the machine's pid namespace exists: it joins the
 * machine's mount, uts, ipc, net and cgroup namespaces once PID 1 has set them up, and makes its
 * commands' pid namespace the machine's, but is not in it. So nothing inside can name it: no
 * pidfd_open, ptrace or /proc/PID/fd of the process that holds the host's listening socket (the
 * machine's root has CAP_SYS_PTRACE in its user namespace; systemd needs it). The child it clones
 * for each command is in the machine's pid namespace until it execs, sharing the agent's memory
 * and descriptors: the agent binary is not readable by the machine's root (mode 0711, owned by
 * the host's root), so the kernel gives that memory to the initial user namespace (would_dump),
 * and ptrace, pidfd_getfd and /proc/PID/mem of either need CAP_SYS_PTRACE there.
 */
static _Noreturn void agent_child(const char *agent, const char *caps, const char *agent_cgroup, int pid_fd, int up_fd)
{
	pid_t p, monitor = getppid();
	char b;
	/* the machine's life is the monitor's: the agent goes with it (it would hold the mount
	 * namespace, and could start nothing in a pid namespace whose init has died) */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != monitor)
		_exit(125);
	if (read(pid_fd, &p, sizeof p) != (ssize_t)sizeof p || read(up_fd, &b, 1) != 1)
		_exit(125); /* PID 1 did not come up: the monitor reports why */
	close(pid_fd);
	close(up_fd);
	/* into the leaf made for it in the machine's delegated cgroup (src/host/cgroups/cgroups.ts), while
	 * still in the host's cgroup namespace: its commands are then inside the machine's, where its
	 * systemd can move them (systemd-run --scope, pam_systemd); with nsdelegate it could not move
	 * a process from outside its namespace's root */
	if (agent_cgroup) {
		int f = open(agent_cgroup, O_WRONLY | O_CLOEXEC);
		if (f < 0 || write(f, "0", 1) != 1)
			BOOT_FAIL("join the agent's cgroup");
		close(f);
	}
	int exe = open(agent, O_PATH | O_CLOEXEC);
	if (exe < 0)
		BOOT_FAIL("open the agent");
	static const struct {
		const char *name;
		int type;
	} ns[] = {
		{ "cgroup", CLONE_NEWCGROUP }, { "ipc", CLONE_NEWIPC }, { "uts", CLONE_NEWUTS },
		{ "net", CLONE_NEWNET },       { "pid", CLONE_NEWPID }, { "mnt", CLONE_NEWNS },
	};
	int fds[sizeof ns / sizeof *ns];
	char path[64];
	for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
		snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)p, ns[i].name);
		if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
			BOOT_FAIL(path);
	}
	snprintf(path, sizeof path, "/proc/%d/root", (int)p);
	int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		BOOT_FAIL(path);
	for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
		if (setns(fds[i], ns[i].type) < 0)
			BOOT_FAIL(ns[i].name);
		close(fds[i]);
	}
	if (fchdir(root) < 0 || chroot(".") < 0 || chdir("/") < 0)
		BOOT_FAIL("the machine's root");
	close(root);
	setsid();
	/* not the monitor's stdout (the host's log file): nothing of the host's in reach */
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
		BOOT_FAIL("agent stdio");
	confine(caps); /* what PID 1 has */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	char *argv[] = { "/run/snaplab/agent",	 "serve",      "--listen-fd", "5", "--ready-fd", "3", "--system",
			 caps ? "--caps" : NULL, (char *)caps, NULL };
	char *envp[] = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL };
	fexecve(exe, argv, envp);
	BOOT_FAIL("exec the agent");
}

int boot_main(int argc, char **argv)
{
	const char *root = NULL, *agent = NULL, *hostname = "machine", *caps = NULL, *cgroup = NULL,
		   *agent_cgroup = NULL;
	int net = 0, i = 2;
	/* the machine's /run/snaplab, masks and init start as under a booted kernel (umask 022), not
	 * with the umask of whatever started snaplab (077 left /run/snaplab 0700: only root could run
	 * the agent's file commands) */
	umask(022);
	for (; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
		if (strcmp(argv[i], "--root") == 0 && i + 1 < argc)
			root = argv[++i];
		else if (strcmp(argv[i], "--agent") == 0 && i + 1 < argc)
			agent = argv[++i];
		else if (strcmp(argv[i], "--hostname") == 0 && i + 1 < argc)
			hostname = argv[++i];
		else if (strcmp(argv[i], "--caps") == 0 && i + 1 < argc)
			caps = argv[++i];
		else if (strcmp(argv[i], "--cgroup") == 0 && i + 1 < argc)
			cgroup = argv[++i];
		else if (strcmp(argv[i], "--agent-cgroup") == 0 && i + 1 < argc)
			agent_cgroup = argv[++i];
		else if (strcmp(argv[i], "--net") == 0)
			net = 1;
		else {
			fprintf(stderr, "snaplab-agent boot: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (!root || !agent || i >= argc) {
		fprintf(stderr,
			"usage: snaplab-agent boot --root DIR --agent PATH --hostname NAME [--net] [--caps LIST] [--cgroup PROCS] [--agent-cgroup PROCS] -- INIT [ARGS]\n");
		return 2;
	}
	/* the console: a pty of the host's devpts, opened before the namespaces so that its slave
	 * can be bound as the machine's /dev/console; the master stays here for the machine's life
	 * (closing it would hang systemd's shutdown) and what the machine writes goes to the log */
	int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0)
		BOOT_FAIL("console pty");
	char console[64];
	if (ptsname_r(master, console, sizeof console) != 0)
		BOOT_FAIL("console pty name");
	fcntl(master, F_SETFL, O_NONBLOCK); /* the final drain must not block on an empty console */
	struct termios t;
	if (tcgetattr(master, &t) == 0) {
		cfmakeraw(&t);
		tcsetattr(master, TCSANOW, &t);
	}
	if (chdir("/") < 0)
		BOOT_FAIL("chdir /");
	/* held open here so that the console never hangs up when nothing inside holds it (poll would
	 * then return at once, forever) */
	int slave = open(console, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (slave < 0)
		BOOT_FAIL("console slave");
	/* the agent first, while this process's children are still born outside the machine's pid
	 * namespace; it has fds 3 (ready) and 5 (the listening socket), which PID 1 never gets */
	int pid_pipe[2], up_pipe[2];
	if (pipe2(pid_pipe, O_CLOEXEC) < 0 || pipe2(up_pipe, O_CLOEXEC) < 0)
		BOOT_FAIL("pipe");
	pid_t a = fork();
	if (a < 0)
		BOOT_FAIL("fork the agent");
	if (a == 0) {
		close(master);
		close(slave);
		close(4);
		close(pid_pipe[1]);
		close(up_pipe[1]);
		agent_child(agent, caps, agent_cgroup, pid_pipe[0], up_pipe[0]);
	}
	close(pid_pipe[0]);
	close(up_pipe[0]);
	close(3);
	close(5);
	/* the cgroup namespace is PID 1's own, made once it is in its delegated cgroup */
	int flags = CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNS | (net ? CLONE_NEWNET : 0);
	if (unshare(flags) < 0)
		BOOT_FAIL("unshare");
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
		BOOT_FAIL("mount propagation");
	if (net)
		lo_up();
	pid_t p = fork();
	if (p < 0)
		BOOT_FAIL("fork PID 1");
	if (p == 0) {
		close(master);
		close(slave);
		close(4);
		close(pid_pipe[1]);
		enter_payload(cgroup);
		pid1(root, agent, hostname, console, caps, up_pipe[1], &argv[i]);
	}
	close(up_pipe[1]);
	if (write(pid_pipe[1], &p, sizeof p) != (ssize_t)sizeof p)
		BOOT_FAIL("tell the agent");
	close(pid_pipe[1]);
	dprintf(4, "{\n    \"child-pid\": %d\n}\n", (int)p);
	close(4);
	/* the monitor needs nothing more of the namespace's root, and nothing inside may reach it */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	caps_restrict("");
	/* copy the console to the log until PID 1 is gone: at most CONSOLE_LOG_MAX bytes (the log is
	 * on the host's disk), then drained and dropped */
	signal(SIGPIPE, SIG_IGN);
	int status = 0, done = 0;
	unsigned long long logged = 0;
	while (!done) {
		struct pollfd pf = { master, POLLIN, 0 };
		int r = poll(&pf, 1, 200);
		pid_t w = waitpid(p, &status, WNOHANG);
		done = w == p || (w < 0 && errno != EINTR);
		if (r > 0 && !(pf.revents & POLLIN) && (pf.revents & (POLLHUP | POLLERR)))
			usleep(200 * 1000); /* no writer: do not spin */
		/* after PID 1 is gone, what it left in the pty still goes to the log */
		while ((r > 0 && (pf.revents & POLLIN)) || done) {
			char buf[4096];
			ssize_t n = read(master, buf, sizeof buf);
			if (n <= 0)
				break;
			if (logged < CONSOLE_LOG_MAX) {
				size_t k = logged + (size_t)n > CONSOLE_LOG_MAX ? (size_t)(CONSOLE_LOG_MAX - logged)
										: (size_t)n;
				if (write(1, buf, k) < 0) {
					/* the log is gone: keep draining the console anyway */
				}
				logged += k;
				if (logged >= CONSOLE_LOG_MAX)
					dprintf(1, "\n[snaplab: console log stopped at %d MiB]\n",
						CONSOLE_LOG_MAX >> 20);
			}
			if (!done)
				break;
		}
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
