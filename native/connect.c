/*
 * snaplab-agent connect [HOST] PORT: one TCP connection to HOST:PORT (default 127.0.0.1) from
 * inside a machine, its bytes on stdin/stdout. Run by the agent as an ordinary command, it is
 * how port-forward and `snaplab proxy` (ssh's ProxyCommand) reach a service in the machine's
 * own network namespace (or VM) without any host address being involved.
 *
 * End of stdin half-closes the connection (shutdown SHUT_WR) and the reply is read to its end;
 * the peer's end of stream closes stdout and gives stdin half a second more (none with
 * --no-linger). It exits when both
 * directions are done: 0, or 1 with one line on stderr when the connection could not be made or
 * broke.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
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

/* One direction of the connection: bytes read from `from`, not yet written to `to`. Both fds
 * are non-blocking, so neither direction ever waits on the other (a server that writes while
 * it reads, as sshd does, never deadlocks against us). */
struct half {
	int from, to;
	char buf[CHUNK];
	size_t off, len;
	int eof; /* `from` ended: nothing more to read */
};

/* Read into an empty buffer; -1 on error, 0 at end of stream, else 1. */
static int half_read(struct half *h)
{
	ssize_t n = read(h->from, h->buf, sizeof h->buf);
	if (n < 0)
		return errno == EINTR || errno == EAGAIN ? 1 : -1;
	if (n == 0) {
		h->eof = 1;
		return 0;
	}
	h->off = 0;
	h->len = (size_t)n;
	return 1;
}

/* Write what is buffered; -1 on error. */
static int half_write(struct half *h)
{
	while (h->off < h->len) {
		ssize_t w = write(h->to, h->buf + h->off, h->len - h->off);
		if (w < 0)
			return errno == EINTR ? 0 : errno == EAGAIN ? 1 : -1;
		h->off += (size_t)w;
	}
	h->off = h->len = 0;
	return 1;
}

/* Append `key` (one line, an ssh public key) to root's authorized_keys unless a line is it
 * already: what `snaplab proxy MACHINE 22` asks before each ssh connection, so that snaplab's key
 * is in a machine reset or restored to a snapshot taken before it was first given. ~/.ssh is
 * made 0700 and the file 0600 (sshd's StrictModes); a file that cannot be read is left alone. */
static int authorize(const char *key)
{
	static const char dir[] = "/root/.ssh", file[] = "/root/.ssh/authorized_keys";
	size_t klen = strlen(key);
	if (!klen || strchr(key, '\n') || klen > 16384)
		return -1;
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return -1;
	int fd = open(file, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	/* read and append under one lock: a second proxy sees the first's line */
	if (flock(fd, LOCK_EX) < 0) {
		close(fd);
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) {
		errno = EFBIG;
		close(fd);
		return -1;
	}
	char *text = malloc((size_t)st.st_size + 1);
	ssize_t n = text ? pread(fd, text, (size_t)st.st_size, 0) : -1;
	int found = 0;
	if (n >= 0) {
		text[n] = 0;
		for (char *line = text; line && *line && !found;) {
			char *end = strchr(line, '\n');
			size_t len = end ? (size_t)(end - line) : strlen(line);
			while (len && line[len - 1] == '\r')
				len--;
			found = len == klen && !memcmp(line, key, klen);
			line = end ? end + 1 : NULL;
		}
	}
	int rc = n < 0 ? -1 : 0;
	if (rc == 0 && !found) {
		/* one write of the whole line: two proxies at once must not interleave their halves */
		int needs_nl = n > 0 && text[n - 1] != '\n';
		char *line = malloc(klen + 2);
		if (!line) {
			rc = -1;
		} else {
			size_t len = 0;
			if (needs_nl)
				line[len++] = '\n';
			memcpy(line + len, key, klen);
			len += klen;
			line[len++] = '\n';
			if (write(fd, line, len) != (ssize_t)len)
				rc = -1;
			free(line);
		}
	}
	free(text);
	close(fd);
	return rc;
}

int connect_main(int argc, char **argv)
{
	/* --no-linger: the peer's end of stream is the end (a request/response server that closes
	 * once it has answered: the code interpreter's), not LINGER_MS more for the host's input */
	int linger = LINGER_MS;
	if (argc > 2 && strcmp(argv[2], "--no-linger") == 0)
		linger = 0, argv++, argc--;
	/* --check: connect and close, exit 0 (a scenario's tcp ready check in a VM) */
	int check = argc > 2 && strcmp(argv[2], "--check") == 0;
	if (check)
		argv++, argc--;
	/* --authorize KEY: snaplab's ssh key for root first (ssh's ProxyCommand, `snaplab proxy M 22`) */
	if (argc > 3 && strcmp(argv[2], "--authorize") == 0) {
		if (authorize(argv[3]) < 0)
			fprintf(stderr, "snaplab-agent: cannot add snaplab's key to /root/.ssh/authorized_keys: %s\n",
				strerror(errno));
		argv += 2, argc -= 2;
	}
	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: snaplab-agent connect [--no-linger] [--check] [--authorize KEY] [HOST] PORT\n");
		return 2;
	}
	const char *host = argc == 4 ? argv[2] : "127.0.0.1", *port = argv[argc - 1];
	signal(SIGPIPE, SIG_IGN);
	int s = dial(host, port);
	if (s < 0)
		return 1;
	if (check) {
		close(s);
		return 0;
	}
	/* Until both directions are done. The host's end of input half-closes and the peer's reply
	 * is read to its end; the peer's end gives the host's remaining input LINGER_MS more (as
	 * socat does): a server that has closed rarely reads on, and the host learns of the end
	 * only when this exits. */
	static struct half up, down; /* up: stdin -> peer; down: peer -> stdout */
	up.from = 0, up.to = s, down.from = s, down.to = 1;
	fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
	fcntl(1, F_SETFL, fcntl(1, F_GETFL) | O_NONBLOCK);
	fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
	int up_done = 0, down_done = 0;
	while (!up_done || !down_done) {
		/* each side: read when its buffer is empty, else wait to write it */
		struct pollfd p[4];
		int n = 0, iu = -1, id = -1, ou = -1, od = -1;
		if (!up_done && !up.len)
			iu = n, p[n++] = (struct pollfd){ .fd = 0, .events = POLLIN };
		if (!up_done && up.len)
			ou = n, p[n++] = (struct pollfd){ .fd = s, .events = POLLOUT };
		if (!down_done && !down.len)
			id = n, p[n++] = (struct pollfd){ .fd = s, .events = POLLIN };
		if (!down_done && down.len)
			od = n, p[n++] = (struct pollfd){ .fd = 1, .events = POLLOUT };
		int ready = poll(p, (nfds_t)n, down_done ? linger : -1);
		if (ready < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (ready == 0)
			break; /* the peer ended and the host sent nothing more for LINGER_MS */
		if (iu >= 0 && p[iu].revents) {
			int r = half_read(&up);
			if (r < 0) {
				fprintf(stderr, "snaplab: connect: reading the host's side: %s\n", strerror(errno));
				return 1;
			}
			if (r == 0) {
				up_done = 1;
				shutdown(s, SHUT_WR); /* the host's side ended: the peer sees end of stream */
			}
		}
		if (ou >= 0 && p[ou].revents && half_write(&up) < 0) {
			if (down_done)
				break; /* the peer has gone both ways meanwhile: the end */
			fprintf(stderr, "snaplab: connect: sending: %s\n", strerror(errno));
			return 1;
		}
		if (id >= 0 && p[id].revents) {
			int r = half_read(&down);
			if (r < 0) {
				/* a reset after our own end is how many servers close; not worth a message */
				if (errno == ECONNRESET && up_done)
					break;
				fprintf(stderr, "snaplab: connect: %s\n", strerror(errno));
				return 1;
			}
			if (r == 0) {
				down_done = 1;
				close(1); /* the peer's end of stream: ours to the host too */
			}
		}
		if (od >= 0 && p[od].revents && half_write(&down) < 0)
			return 1; /* the host's side has gone */
	}
	close(s);
	return 0;
}
