/*
 * escape-probe: run inside a machine by test/escapes/escapes.test.ts. Each subcommand makes one
 * attempt the way an attacker would and prints what the kernel answered: "ok" or the errno's name
 * (EPERM, ENOENT, ...). It decides nothing: the test says what answer a defence must give.
 * Built static by the test (gcc -static), so it runs in any image.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/btrfs.h>
#include <signal.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/shm.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <mqueue.h>
#include <time.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

static int answer(long rc)
{
	if (rc < 0)
		printf("%s\n", strerrorname_np(errno));
	else
		printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: probe TEST [ARG]\n");
		return 2;
	}
	const char *t = argv[1], *a = argc > 2 ? argv[2] : "";
	if (!strcmp(t, "write")) { /* open a file for writing and write a byte (the agent binary, /proc/1/exe, /sys...) */
		int fd = open(a, O_WRONLY);
		return answer(fd < 0 ? -1 : write(fd, "1", 1));
	}
	if (!strcmp(t, "ptrace")) /* attach to a process */
		return answer(ptrace(PTRACE_ATTACH, atoi(a), 0, 0));
	if (!strcmp(t, "mount-proc"))
		return answer(mkdir("/root/p", 0700) < 0 && errno != EEXIST ? -1 : mount("proc", "/root/p", "proc", 0, NULL));
	if (!strcmp(t, "mount-cgroup"))
		return answer(mkdir("/root/c", 0700) < 0 && errno != EEXIST ? -1 : mount("cgroup2", "/root/c", "cgroup2", 0, NULL));
	if (!strcmp(t, "fsopen"))
		return answer(syscall(SYS_fsopen, "tmpfs", 0));
	if (!strcmp(t, "mknod"))
		return answer(mknod("/root/mem", S_IFCHR | 0600, makedev(1, 1)));
	if (!strcmp(t, "keyctl"))
		return answer(syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "escape"));
	if (!strcmp(t, "add_key"))
		return answer(syscall(SYS_add_key, "user", "escape", "x", 1, KEY_SPEC_PROCESS_KEYRING));
	if (!strcmp(t, "bpf")) {
		union bpf_attr at;
		memset(&at, 0, sizeof at);
		at.map_type = BPF_MAP_TYPE_ARRAY;
		at.key_size = 4;
		at.value_size = 4;
		at.max_entries = 1;
		return answer(syscall(SYS_bpf, BPF_MAP_CREATE, &at, sizeof at));
	}
	if (!strcmp(t, "perf")) {
		struct perf_event_attr pe;
		memset(&pe, 0, sizeof pe);
		pe.type = PERF_TYPE_SOFTWARE;
		pe.size = sizeof pe;
		pe.config = PERF_COUNT_SW_CPU_CLOCK;
		return answer(syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0));
	}
	if (!strcmp(t, "userfaultfd"))
		return answer(syscall(SYS_userfaultfd, 0));
	if (!strcmp(t, "io_uring")) {
		struct io_uring_params p;
		memset(&p, 0, sizeof p);
		return answer(syscall(SYS_io_uring_setup, 4, &p));
	}
	if (!strcmp(t, "unshare-user"))
		return answer(unshare(CLONE_NEWUSER));
	if (!strcmp(t, "setns"))
		{
		int ns = open("/proc/self/ns/mnt", O_RDONLY);
		return answer(ns < 0 ? -1 : setns(ns, 0));
	}
	if (!strcmp(t, "open_by_handle")) { /* the "shocker" escape: open a host inode by its handle */
		struct { struct file_handle h; unsigned char b[8]; } fh = { .h = { .handle_bytes = 8, .handle_type = 1 } };
		int root = open("/", O_RDONLY);
		return answer(syscall(SYS_open_by_handle_at, root, &fh.h, O_RDONLY));
	}
	if (!strcmp(t, "abstract")) { /* connect to an abstract unix socket by name */
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		size_t n = strlen(a);
		memcpy(sa.sun_path + 1, a, n);
		int s = socket(AF_UNIX, SOCK_STREAM, 0);
		/* the whole sun_path, NUL-padded: the length libuv (Node's listener) binds with */
		(void)n;
		return answer(s < 0 ? -1 : connect(s, (struct sockaddr *)&sa, sizeof sa));
	}
	if (!strcmp(t, "vsock"))
		return answer(socket(40 /* AF_VSOCK */, SOCK_STREAM, 0));
	if (!strcmp(t, "vsock-high")) /* the domain with high bits set: the kernel reads an int (CVE-2019-10063's trick) */
		return answer(syscall(SYS_socket, (1UL << 32) | 40, SOCK_STREAM, 0));
	if (!strcmp(t, "subvol") || !strcmp(t, "subvol-high")) { /* a btrfs subvolume nested in the machine's root */
		struct btrfs_ioctl_vol_args va;
		memset(&va, 0, sizeof va);
		snprintf(va.name, sizeof va.name, "nested-%s", t);
		int dir = open("/root", O_RDONLY | O_DIRECTORY);
		unsigned long req = BTRFS_IOC_SUBVOL_CREATE | (!strcmp(t, "subvol-high") ? 1UL << 32 : 0);
		return answer(dir < 0 ? -1 : syscall(SYS_ioctl, dir, req, &va));
	}
	if (!strcmp(t, "clone-newns")) { /* clone(2) asking for a new namespace (a way round unshare's denial) */
		long pid = syscall(SYS_clone, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0);
		if (pid == 0)
			_exit(0);
		return answer(pid);
	}
	if (!strcmp(t, "init_module")) /* load a kernel module (an empty image: the answer is the gate's) */
		return answer(syscall(SYS_init_module, "", 0, ""));
	if (!strcmp(t, "finit_module")) {
		int fd = open("/probe", O_RDONLY | O_CLOEXEC);
		return answer(syscall(SYS_finit_module, fd, "", 0));
	}
	if (!strcmp(t, "delete_module"))
		return answer(syscall(SYS_delete_module, "loop", O_NONBLOCK));
	if (!strcmp(t, "kexec_load")) /* replace the running kernel */
		return answer(syscall(SYS_kexec_load, 0, 0, NULL, 0));
	if (!strcmp(t, "kexec_file_load"))
		return answer(syscall(SYS_kexec_file_load, -1, -1, 0, "", 0));
	if (!strcmp(t, "settime")) { /* set the host's clock: the same time it has, the answer is the gate's */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		return answer(clock_settime(CLOCK_REALTIME, &ts));
	}
	if (!strcmp(t, "settimeofday")) {
		struct timeval tv;
		gettimeofday(&tv, NULL);
		return answer(settimeofday(&tv, NULL));
	}
	if (!strcmp(t, "adjtimex")) { /* a change of the clock's frequency (modes set: a write) */
		struct timex now = { 0 };
		adjtimex(&now); /* read */
		struct timex tx = { .modes = ADJ_FREQUENCY, .freq = now.freq }; /* set it to what it is */
		return answer(adjtimex(&tx));
	}
	if (!strcmp(t, "process_vm_readv")) { /* read a process's memory (PID, or "self": our own buffer) */
		char src[8] = "x", dst[8];
		struct iovec l = { dst, sizeof dst }, r = { src, sizeof src };
		return answer(process_vm_readv(!strcmp(a, "self") ? getpid() : atoi(a), &l, 1, &r, 1, 0));
	}
	if (!strcmp(t, "process_vm_writev")) {
		char src[8] = "x", dst[8];
		struct iovec l = { src, sizeof src }, r = { dst, sizeof dst };
		return answer(process_vm_writev(!strcmp(a, "self") ? getpid() : atoi(a), &l, 1, &r, 1, 0));
	}
	if (!strcmp(t, "clone3")) { /* flags in memory, where seccomp cannot read them: ENOSYS, libc falls back to clone */
		struct { unsigned long long flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls; } args = { .flags = CLONE_NEWNS, .exit_signal = SIGCHLD };
		long pid = syscall(435 /* SYS_clone3 */, &args, sizeof args);
		if (pid == 0)
			_exit(0);
		return answer(pid);
	}
	if (!strcmp(t, "i386")) { /* a 32-bit system call from a 64-bit process (int 0x80: getpid), another architecture's table */
		fflush(stdout);
		long rc;
		__asm__ volatile("int $0x80" : "=a"(rc) : "a"(20) : "memory");
		return answer(rc < 0 ? (errno = (int)-rc, -1) : rc);
	}
	if (!strcmp(t, "x32")) { /* an x32 system call (getpid with the x32 bit): x86-64's entry, another ABI's numbers */
		fflush(stdout);
		return answer(syscall(0x40000000L | 39));
	}
	if (!strcmp(t, "shmget")) { /* a System V shared memory segment, left behind (it outlives this process) */
		return answer(shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600));
	}
	if (!strcmp(t, "mq_open")) { /* a POSIX message queue in /dev/mqueue, left behind */
		mqd_t q = mq_open("/left", O_CREAT | O_RDWR, 0600, NULL);
		return answer(q == (mqd_t)-1 ? -1 : 0);
	}
	if (!strcmp(t, "fds")) { /* every descriptor open in this process but the listing's own, and where it points */
		DIR *d = opendir("/proc/self/fd");
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
				continue;
			char path[64], to[4096];
			snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
			ssize_t n = readlink(path, to, sizeof to - 1);
			to[n < 0 ? 0 : n] = 0;
			printf("%s %s\n", e->d_name, to);
		}
		char cwd[4096];
		ssize_t n = readlink("/proc/self/cwd", cwd, sizeof cwd - 1);
		cwd[n < 0 ? 0 : n] = 0;
		printf("cwd %s\n", cwd);
		return 0;
	}
	fprintf(stderr, "unknown test %s\n", t);
	return 2;
}
