/*
 * snaplab-agent connect [HOST] PORT: one TCP connection to HOST:PORT (default 127.0.0.1) from
 * inside a machine, its bytes on stdin/stdout. Run by the agent as an ordinary command, it is
 * how port-forward and `snaplab proxy` (ssh's ProxyCommand) reach a service in the machine's
 * own network namespace (or VM) without any host address being involved.
 *
 * End of stdin half-closes the connection (shutdown SHUT_WR) and the reply is read to its end;
 * the peer's end of stream closes stdout and gives stdin half a second more. It exits when both
 * directions are done: 0, or 1 with one line on stderr when the connection could not be made or
 * broke.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHUNK (64 * 1024)
#define LINGER_MS 500

/* HOST is an address (IPv4 or IPv6) or localhost: a static binary has no resolver to ask. */
static int dial(const char *host, const char *port)
{
	char *end;
	long pn = strtol(port, &end, 10);
	if (*end || pn < 1 || pn > 65535) {
		fprintf(stderr, "snaplab: connect: bad port %s\n", port);
		return -1;
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	socklen_t len;
	struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
	if (!strcmp(host, "localhost"))
		host = "127.0.0.1";
	if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)pn);
		len = sizeof *v4;
	} else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)pn);
		len = sizeof *v6;
	} else {
		fprintf(stderr, "snaplab: connect: %s is not an address (give an IP address or localhost)\n", host);
		return -1;
	}
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&ss, len) < 0) {
		fprintf(stderr, "snaplab: connect %s:%s: %s\n", host, port, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* Copy what one read gives; 0 at end of stream, -1 on error. */
static ssize_t pump(int from, int to)
{
	static char buf[CHUNK];
	ssize_t n = read(from, buf, sizeof buf);
	if (n <= 0)
		return n < 0 && (errno == EINTR || errno == EAGAIN) ? 1 : n;
	for (ssize_t off = 0; off < n;) {
		ssize_t w = write(to, buf + off, (size_t)(n - off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		off += w;
	}
	return n;
}

int connect_main(int argc, char **argv)
{
	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: snaplab-agent connect [HOST] PORT\n");
		return 2;
	}
	const char *host = argc == 4 ? argv[2] : "127.0.0.1", *port = argv[argc - 1];
	signal(SIGPIPE, SIG_IGN);
	int s = dial(host, port);
	if (s < 0)
		return 1;
	/* Until both directions are done. The host's end of input half-closes and the peer's reply
	 * is read to its end; the peer's end gives the host's remaining input LINGER_MS more (as
	 * socat does): a server that has closed rarely reads on, and the host learns of the end
	 * only when this exits. */
	int in_open = 1, out_open = 1;
	while (out_open || in_open) {
		struct pollfd p[2] = { { .fd = in_open ? 0 : -1, .events = POLLIN }, { .fd = out_open ? s : -1, .events = POLLIN } };
		int ready = poll(p, 2, out_open ? -1 : LINGER_MS);
		if (ready < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (ready == 0)
			break; /* the peer ended and the host sent nothing more for LINGER_MS */
		if (p[0].revents) {
			ssize_t n = pump(0, s);
			if (n <= 0) {
				in_open = 0;
				shutdown(s, SHUT_WR); /* the host's side ended: the peer sees end of stream */
				if (n < 0 && out_open) {
					fprintf(stderr, "snaplab: connect: sending: %s\n", strerror(errno));
					return 1;
				}
				if (n < 0)
					break; /* the peer has gone both ways meanwhile: the end */
			}
		}
		if (p[1].revents) {
			ssize_t n = pump(s, 1);
			if (n < 0) {
				/* a reset after our own end is how many servers close; not worth a message */
				if (errno == ECONNRESET && !in_open)
					break;
				fprintf(stderr, "snaplab: connect: %s\n", strerror(errno));
				return 1;
			}
			if (n == 0) {
				out_open = 0;
				close(1); /* the peer's end of stream: ours to the host too */
			}
		}
	}
	close(s);
	return 0;
}
