/*
 * Takes per-user kernel objects until the kernel refuses, and holds them until stdin closes:
 * what a hostile machine does to the counts the kernel charges to its user namespace's owner
 * (test/kernel-accounting.test.ts). Static, so that it runs in a busybox machine and on the host.
 *
 *   fill inotify N    inotify_init1 up to N times
 *   fill userns N     up to N user namespaces, each made by a child and kept by a descriptor
 *   fill owner PID    the host uid that owns PID's user namespace (NS_GET_OWNER_UID)
 *
 * Prints "COUNT ERRNO" (ERRNO "ok" when N was reached) once it holds them, then waits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* one user namespace, made by a child that waits until its parent has a descriptor of it */
static int one_userns(void)
{
	int ack[2], go[2];
	if (pipe(ack) < 0 || pipe(go) < 0)
		return -1;
	pid_t c = fork();
	if (c == 0) {
		close(ack[0]), close(go[1]); /* else its own go[1] keeps the read below from EOF */
		int e = unshare(CLONE_NEWUSER) == 0 ? 0 : errno;
		(void)!write(ack[1], &e, sizeof e);
		(void)!read(go[0], &e, 1);
		_exit(0);
	}
	close(ack[1]), close(go[0]);
	int e = c < 0 ? errno : EPROTO, fd = -1;
	if (c > 0 && read(ack[0], &e, sizeof e) == sizeof e && e == 0) {
		char path[64];
		snprintf(path, sizeof path, "/proc/%d/ns/user", (int)c);
		fd = open(path, O_RDONLY);
		e = fd < 0 ? errno : 0;
	}
	close(ack[0]), close(go[1]);
	if (c > 0)
		waitpid(c, NULL, 0);
	errno = e;
	return fd;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: fill inotify|userns N | fill owner PID\n");
		return 2;
	}
	long n = atol(argv[2]), got = 0;
	if (!strcmp(argv[1], "owner")) {
		char path[64];
		uid_t uid;
		snprintf(path, sizeof path, "/proc/%ld/ns/user", n);
		int fd = open(path, O_RDONLY);
		if (fd < 0 || ioctl(fd, NS_GET_OWNER_UID, &uid) < 0) {
			printf("%s\n", strerrorname_np(errno));
			return 1;
		}
		printf("%u\n", (unsigned)uid);
		return 0;
	}
	struct rlimit r = { (rlim_t)n + 64, (rlim_t)n + 64 };
	setrlimit(RLIMIT_NOFILE, &r); /* where it may: else the descriptor limit stops it first */
	int e = 0;
	for (; got < n; got++) {
		int fd = !strcmp(argv[1], "inotify") ? inotify_init1(IN_CLOEXEC) : one_userns();
		if (fd < 0) {
			e = errno;
			break;
		}
	}
	printf("%ld %s\n", got, e ? strerrorname_np(e) : "ok");
	fflush(stdout);
	char b;
	while (read(0, &b, 1) > 0)
		;
	return 0;
}
