/*
 * snaplab-agent: one static binary, two modes.
 *
 *   launch [--cgroup-procs FILE]... [--oom-score-adj N] -- PROG ARGS...
 *       join cgroups, set oom_score_adj, exec PROG (the host uses it to put bwrap into the
 *       sandbox's cgroups before any namespace exists).
 *   serve --socket PATH [--ready-fd N] [--caps LIST]
 *       the in-sandbox agent: one single-threaded epoll loop serving the framed protocol of
 *       docs/agent-protocol.md. Usually PID 1 of a pid namespace, so it reaps every child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "sandbox.h"

int serve_main(const char *socket_path, int ready_fd, const char *caps);

static int write_all(int fd, const char *s, size_t n)
{
	while (n) {
		ssize_t w = write(fd, s, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		s += w;
		n -= (size_t)w;
	}
	return 0;
}

static int launch_main(int argc, char **argv)
{
	char pid[24];
	int pl = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
	int i = 0;
	for (; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
		if (strcmp(argv[i], "--cgroup-procs") == 0 && i + 1 < argc) {
			const char *f = argv[++i];
			int fd = open(f, O_WRONLY | O_CLOEXEC);
			if (fd < 0 || write_all(fd, pid, (size_t)pl) < 0) {
				fprintf(stderr, "snaplab-agent launch: cannot join cgroup via %s: %s\n", f, strerror(errno));
				return 125;
			}
			close(fd);
		} else if (strcmp(argv[i], "--oom-score-adj") == 0 && i + 1 < argc) {
			const char *v = argv[++i];
			int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
			if (fd < 0 || write_all(fd, v, strlen(v)) < 0) {
				fprintf(stderr, "snaplab-agent launch: cannot set oom_score_adj %s: %s\n", v, strerror(errno));
				return 125;
			}
			close(fd);
		} else {
			fprintf(stderr, "snaplab-agent launch: unknown or incomplete option '%s'\n", argv[i]);
			return 125;
		}
	}
	if (i >= argc) {
		fprintf(stderr, "snaplab-agent launch: missing '-- PROG ARGS...'\n");
		return 125;
	}
	execvp(argv[i], argv + i);
	int e = errno;
	fprintf(stderr, "snaplab-agent launch: %s: %s\n", argv[i], strerror(e));
	return e == ENOENT ? 127 : 126;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: snaplab-agent launch [--cgroup-procs FILE]... [--oom-score-adj N] -- PROG ARGS...\n"
		"       snaplab-agent serve --socket PATH [--ready-fd N] [--caps CAP_A,CAP_B,...]\n"
		"       snaplab-agent --version\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage();
		return 2;
	}
	if (strcmp(argv[1], "launch") == 0)
		return launch_main(argc - 2, argv + 2);
	if (strcmp(argv[1], "--version") == 0) {
		printf("snaplab-agent %s (protocol %d.%d)\n", AGENT_VERSION, PROTO_MAJOR, PROTO_MINOR);
		return 0;
	}
	if (strcmp(argv[1], "serve") == 0) {
		const char *sock = NULL, *caps = NULL;
		int ready = -1;
		for (int i = 2; i < argc; i++) {
			if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
				sock = argv[++i];
			else if (strcmp(argv[i], "--ready-fd") == 0 && i + 1 < argc)
				ready = atoi(argv[++i]);
			else if (strcmp(argv[i], "--caps") == 0 && i + 1 < argc)
				caps = argv[++i];
			else {
				usage();
				return 2;
			}
		}
		if (!sock) {
			usage();
			return 2;
		}
		return serve_main(sock, ready, caps);
	}
	usage();
	return 2;
}
