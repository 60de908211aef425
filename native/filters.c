/*
 * The agent's seccomp filters, compiled to BPF when the agent is built (native/Makefile runs this
 * as build/filter-gen and writes build/filters.h, which sandbox.c includes): libseccomp resolves
 * the names and lays out the program here, on the build host, once. The agent used to do it at
 * each start, ~0.1 ms and ~40-80 KiB of heap pages that stayed with every idle sandbox (its
 * allocations freed, their pages not: docs/architecture.md "Density"); and the agent no longer
 * links libseccomp. A filter is the same bytes whoever builds it on the same architecture.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/btrfs.h>
#include <linux/filter.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Modelled on Docker's default profile: syscalls it denies to a container by default. */
/* several names a line, laid out by hand */
/* clang-format off */
static const char *const denied[] = {
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"mount", "umount2", "umount", "pivot_root", "swapon", "swapoff", "reboot", "acct", "bpf",
	"perf_event_open", "keyctl", "add_key", "request_key", "unshare", "setns",
	"open_by_handle_at", "name_to_handle_at", "userfaultfd", "iopl", "ioperm",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "lookup_dcookie",
	"quotactl", "syslog", "kcmp", "process_vm_readv", "process_vm_writev", "mbind",
	"move_pages", "set_mempolicy", "vm86", "vm86old", "uselib", "create_module",
	"get_kernel_syms", "query_module", "nfsservctl", "fsopen", "fsconfig", "fsmount",
	"fspick", "move_mount", "open_tree", "mount_setattr", "stime",
	/* Docker has denied io_uring since 2023: a large attack surface that bypasses this filter */
	"io_uring_setup", "io_uring_enter", "io_uring_register",
};
/* clang-format on */

/* Sockets that cross network namespaces: vsock reaches the hypervisor's host whatever netns.
 * socket()'s domain and ioctl()'s request are ints to the kernel, which drops the upper 32 bits
 * of the register: the rules compare the lower 32 only (a mask: libseccomp 2.5's SCMP_A*_32 still
 * compared all 64 here, shown by a probe), or a value with high bits
 * set would pass the filter and still mean vsock or a subvolume ioctl (CVE-2019-10063). */
#define AF_VSOCK_NR 40

/* btrfs ioctls that make subvolumes: no capability needed, and a subvolume nested in a sandbox's
 * root would make that root impossible to delete with one ioctl. */
/* several names a line, laid out by hand */
/* clang-format off */
static const unsigned long denied_ioctls[] = {
	BTRFS_IOC_SNAP_CREATE, BTRFS_IOC_SNAP_CREATE_V2, BTRFS_IOC_SUBVOL_CREATE, BTRFS_IOC_SUBVOL_CREATE_V2,
};
/* clang-format on */

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
/* several names a line, laid out by hand */
/* clang-format off */
static const unsigned long ns_flags[] = {
	CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
	CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME,
};
/* clang-format on */

static int export_filter(scmp_filter_ctx ctx, struct sock_fprog *out);

/* Both filters: no vsock socket, no subvolume made inside (see AF_VSOCK_NR, denied_ioctls). */
static int deny_vsock_and_subvolumes(scmp_filter_ctx ctx)
{
	if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
			     SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffUL, AF_VSOCK_NR)) < 0)
		return -1;
	for (size_t i = 0; i < sizeof denied_ioctls / sizeof denied_ioctls[0]; i++)
		if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
				     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, denied_ioctls[i])) < 0)
			return -1;
	return 0;
}

/*
 * A system machine's filter (its init and everything under it): systemd needs mount, unshare and
 * the rest, so only what no system container needs and what would break the host's hold on the
 * machine: subvolumes nested in its root (rm could not delete it), io_uring (a surface that
 * bypasses filters), vsock, foreign architectures; and keyrings, as systemd-nspawn's default
 * filter refuses them: keys are not namespaced, their memory is charged to no cgroup, and each of
 * the machine's uids has a quota of its own, so switching among its 65536 uids held GBs of the
 * host's kernel memory (docs/security.md "Kernel objects"). systemd takes EPERM as "keyring
 * access prohibited" and goes on; pam_keyinit is optional in Debian's stacks.
 */
static int system_rules(struct sock_fprog *out)
{
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	if (!ctx)
		return -1;
	static const char *const none[] = { "io_uring_setup",  "io_uring_enter", "io_uring_register", "kexec_load",
					    "kexec_file_load", "keyctl",	 "add_key",	      "request_key" };
	int rc = -1;
	if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0)
		goto out;
	for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
		int nr = seccomp_syscall_resolve_name(none[i]);
		if (nr != __NR_SCMP_ERROR && nr >= 0 && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0) < 0)
			goto out;
	}
	if (deny_vsock_and_subvolumes(ctx) < 0)
		goto out;
	rc = export_filter(ctx, out);
out:
	seccomp_release(ctx);
	return rc;
}

static int sandbox_rules(struct sock_fprog *out)
{
	int rc = -1;
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	if (!ctx)
		return -1;
	/* Anything not native x86_64 (i386 int 0x80, x32 numbers) is refused outright. */
	if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0)
		goto out;
	/* Binary-tree layout: fewer instructions per syscall and a cheaper attach (the kernel's
	 * action cache emulates the filter for every syscall number at attach time). */
	seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
	for (size_t i = 0; i < sizeof denied / sizeof denied[0]; i++) {
		int nr = seccomp_syscall_resolve_name(denied[i]);
		if (nr == __NR_SCMP_ERROR || nr < 0)
			continue; /* not a syscall on this arch */
		if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0) < 0)
			goto out;
	}
	/* clone() may make threads and processes, never namespaces. */
	for (size_t i = 0; i < sizeof ns_flags / sizeof ns_flags[0]; i++)
		if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
				     SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i])) < 0)
			goto out;
	if (deny_vsock_and_subvolumes(ctx) < 0)
		goto out;
	/* clone3 passes flags in memory, which BPF cannot read: ENOSYS makes libc fall back to clone. */
	if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) < 0)
		goto out;
	rc = export_filter(ctx, out);
out:
	seccomp_release(ctx);
	return rc;
}

static int export_filter(scmp_filter_ctx ctx, struct sock_fprog *out)
{
	int rc = -1;
	int fd = memfd_create("snaplab-seccomp", MFD_CLOEXEC);
	if (fd < 0 || seccomp_export_bpf(ctx, fd) < 0)
		goto out;
	off_t size = lseek(fd, 0, SEEK_END);
	if (size <= 0 || size % (off_t)sizeof(struct sock_filter) != 0)
		goto out;
	struct sock_filter *prog = malloc((size_t)size);
	if (!prog || pread(fd, prog, (size_t)size, 0) != size) {
		free(prog);
		goto out;
	}
	out->filter = prog;
	out->len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

static int print_filter(const char *name, int (*build)(struct sock_fprog *))
{
	struct sock_fprog f;
	if (build(&f) < 0) {
		fprintf(stderr, "filter-gen: %s: %s\n", name, strerror(errno));
		return -1;
	}
	printf("static const struct sock_filter %s_program[%u] = {\n", name, f.len);
	for (unsigned i = 0; i < f.len; i++)
		printf("\t{ 0x%04x, %u, %u, 0x%08x },\n", f.filter[i].code, f.filter[i].jt, f.filter[i].jf,
		       f.filter[i].k);
	printf("};\n");
	free(f.filter);
	return 0;
}

int main(void)
{
	printf("/* made by filter-gen (native/filters.c): do not edit */\n");
	return print_filter("sandbox", sandbox_rules) < 0 || print_filter("system", system_rules) < 0 ? 1 : 0;
}
