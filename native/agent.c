/*
 * snaplab-agent: the in-sandbox agent, one static binary for every driver.
 *
 *   serve (--socket PATH | --listen-fd N | --stream PATH | --stream-fd N) [--ready-fd N] [--caps LIST]
 *       the in-sandbox agent: one single-threaded epoll loop serving the framed protocol of
 *       docs/agent-protocol.md. Usually PID 1 of a pid namespace, so it reaps every child.
 *       --stream/--stream-fd serve one byte stream (a VM's virtio-serial port) as the connection.
 *   relay --connect PATH --listen PATH --pid N [--ready-fd N]
 *       on the host: hold a VM's one agent connection and multiplex clients onto it (relay.c).
 *   tar [-L] SRC  /  untar [--plain] [--untrusted] [--expect NAME] DEST
 *       the two ends of snaplab cp: SRC as a tar on stdout, a tar from stdin created at DEST,
 *       which end is the machine and which the host is the caller's business (copy.c).
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

int serve_main(const char *socket_path, int listen_fd, const char *stream_path, int stream_fd, int ready_fd,
	       const char *caps, int harden);
int relay_main(const char *connect_path, const char *listen_path, pid_t qemu, int ready_fd);
int boot_main(int argc, char **argv);
int connect_main(int argc, char **argv);
int file_main(int argc, char **argv);
int watch_main(int argc, char **argv);
int copy_main(int argc, char **argv, void (*usage)(void));
extern int system_machine;

/*
 * A sandbox's start: bwrap ran the agent from STAGE in /dev, since /run is made here (run_in_dev,
 * sandbox.c). Once it is, the agent runs again from /run/snaplab/agent with the same arguments
 * but these two, so that PID 1 is /run/snaplab/agent to ps and /proc/1/exe, as in every machine.
 */
static int serve_from_run(int argc, char **argv, const char *stage)
{
	if (run_in_dev(stage) < 0) {
		fprintf(stderr, "snaplab-agent: make /run: %s: %s\n", harden_failed, strerror(errno));
		return 1;
	}
	char **again = calloc((size_t)argc, sizeof *again);
	if (!again)
		return 1;
	int n = 0;
	again[n++] = MACHINE_AGENT;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--run-in-dev") == 0)
			i++;
		else
			again[n++] = argv[i];
	}
	again[n] = NULL;
	execv(MACHINE_AGENT, again);
	fprintf(stderr, "snaplab-agent: exec %s: %s\n", MACHINE_AGENT, strerror(errno));
	return 1;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: snaplab-agent serve (--socket PATH | --listen-fd N | --stream PATH | --stream-fd N) [--ready-fd N] [--caps CAP_A,CAP_B,...] [--harden-proc [--run-in-dev STAGE]] [--system]\n"
		"       snaplab-agent relay --connect PATH --listen PATH --pid N [--ready-fd N]\n"
		"       snaplab-agent boot --root DIR --agent PATH --hostname NAME [--net] [--caps LIST] -- INIT [ARGS]\n"
		"       snaplab-agent tar [-L] SRC\n"
		"       snaplab-agent untar [--plain] [--untrusted] [--expect NAME] DEST\n"
		"       snaplab-agent cp [-L] [--expect NAME] SRC DEST\n"
		"       snaplab-agent connect [HOST] PORT\n"
		"       snaplab-agent file cat PATH\n"
		"       snaplab-agent file write [--mode OCTAL] [--parents] [--append] PATH\n"
		"       snaplab-agent file stat [-L] PATH\n"
		"       snaplab-agent file ls PATH\n"
		"       snaplab-agent file mkdir [--parents] [--mode OCTAL] PATH\n"
		"       snaplab-agent file rm [--recursive] [--force] PATH\n"
		"       snaplab-agent watch [--recursive] PATH\n"
		"       snaplab-agent --version\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage();
		return 2;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("snaplab-agent %s (protocol %d.%d)\n", AGENT_VERSION, PROTO_MAJOR, PROTO_MINOR);
		return 0;
	}
	if (strcmp(argv[1], "serve") == 0) {
		const char *sock = NULL, *caps = NULL, *stream = NULL, *run_stage = NULL;
		int ready = -1, listen_fd = -1, stream_fd = -1, harden = 0;
		for (int i = 2; i < argc; i++) {
			if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
				sock = argv[++i];
			else if (strcmp(argv[i], "--ready-fd") == 0 && i + 1 < argc)
				ready = atoi(argv[++i]);
			else if (strcmp(argv[i], "--listen-fd") == 0 && i + 1 < argc)
				listen_fd = atoi(argv[++i]);
			else if (strcmp(argv[i], "--stream") == 0 && i + 1 < argc)
				stream = argv[++i];
			else if (strcmp(argv[i], "--stream-fd") == 0 && i + 1 < argc)
				stream_fd = atoi(argv[++i]);
			else if (strcmp(argv[i], "--harden-proc") == 0)
				harden = 1;
			else if (strcmp(argv[i], "--run-in-dev") == 0 && i + 1 < argc)
				run_stage = argv[++i];
			else if (strcmp(argv[i], "--system") == 0)
				system_machine = 1;
			else if (strcmp(argv[i], "--caps") == 0 && i + 1 < argc)
				caps = argv[++i];
			else {
				usage();
				return 2;
			}
		}
		/* exactly one transport */
		if ((sock != NULL) + (listen_fd >= 0) + (stream != NULL) + (stream_fd >= 0) != 1 ||
		    (run_stage && !harden)) {
			usage();
			return 2;
		}
		if (run_stage)
			return serve_from_run(argc, argv, run_stage);
		return serve_main(sock, listen_fd, stream, stream_fd, ready, caps, harden);
	}
	if (strcmp(argv[1], "boot") == 0)
		return boot_main(argc, argv);
	if (strcmp(argv[1], "connect") == 0)
		return connect_main(argc, argv);
	if (strcmp(argv[1], "file") == 0)
		return file_main(argc, argv);
	if (strcmp(argv[1], "watch") == 0)
		return watch_main(argc, argv);
	if (!strcmp(argv[1], "tar") || !strcmp(argv[1], "untar") || !strcmp(argv[1], "cp"))
		return copy_main(argc, argv, usage);
	if (strcmp(argv[1], "relay") == 0) {
		const char *conn = NULL, *lis = NULL;
		int ready = -1;
		pid_t pid = 0;
		for (int i = 2; i < argc; i++) {
			if (strcmp(argv[i], "--connect") == 0 && i + 1 < argc)
				conn = argv[++i];
			else if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
				lis = argv[++i];
			else if (strcmp(argv[i], "--pid") == 0 && i + 1 < argc)
				pid = (pid_t)atoi(argv[++i]);
			else if (strcmp(argv[i], "--ready-fd") == 0 && i + 1 < argc)
				ready = atoi(argv[++i]);
			else {
				usage();
				return 2;
			}
		}
		if (!conn || !lis || pid <= 0) {
			usage();
			return 2;
		}
		return relay_main(conn, lis, pid, ready);
	}
	usage();
	return 2;
}
