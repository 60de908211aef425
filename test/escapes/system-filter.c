/*
 * A system machine's seccomp filter (native/filters.c, compiled in: system_filter, as
 * native/boot.c installs it on the machine's PID 1), then keyring calls: built
 * against the native sources by test/kernel-accounting.test.ts and run in a
 * machine's user namespace as its root.
 */
#define _GNU_SOURCE
#include "sandbox.h"
#include <errno.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &system_filter, 0, 0) < 0)
		return 2;
	long k = syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "x");
	printf("keyctl %s\n", k < 0 ? strerrorname_np(errno) : "ok");
	k = syscall(SYS_add_key, "user", "x", "x", 1, KEY_SPEC_PROCESS_KEYRING);
	printf("add_key %s\n", k < 0 ? strerrorname_np(errno) : "ok");
	return 0;
}
