/*
 * snaplab-agent relay: the host-side holder of a VM's one agent connection.
 *
 *   relay --connect PATH --listen PATH --pid N [--ready-fd N]
 *
 * QEMU's chardev socket takes one client at a time, so a VM could serve one host process at a
 * time. The relay owns that connection (it RESETs the guest's session when it connects, as a
 * restored guest still holds the session of the host that snapshotted it) and serves any number
 * of clients on a Unix socket of its own, multiplexing their requests onto the one session:
 * each request gets an id of the relay's, and responses go back to their client under the
 * client's id. A client's RESET is answered here (HELLO with its id) and ends only that client's
 * execs; a client that disconnects has its execs killed (SIGKILL), as the agent does for a
 * session, and its kept execs let go (DETACH, agent 1.6): they run on in the VM for an ATTACH,
 * which is routed as an exec. A client's HOLD_OUTPUT for one of its execs goes on to the agent
 * (the exec stays held while its client asks or the relay holds the client). The relay exits when
 * the VM's connection ends or QEMU (--pid) is gone. While the file LISTEN_PATH.hold exists (read at start and on every SIGUSR1) the relay
 * neither writes to the VM nor reads from it, and creates LISTEN_PATH.held once QEMU has taken
 * what was already sent: the driver holds the relay while the VM is paused, so that nothing moves
 * in the guest's memory while a memory snapshot is written. A state in a file, not a signal pair: signals merge and reorder.
 * See docs/agent-protocol.md ("Relay").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"

#define MAX_CLIENTS 256
#define MAX_ROUTES 8192
/* a client with this much unread output queued has its execs held by the agent (HOLD_OUTPUT;
 * an agent older than 1.2: the relay stops reading the VM instead), released below the low mark */
#define CLIENT_HIGH_WATER (16u << 20)
#define CLIENT_LOW_WATER (4u << 20)
/* stop reading from clients while this much is queued for the VM */
#define AGENT_HIGH_WATER (16u << 20)
/* at most this much read from one client per pass, so that one fast writer cannot hog the loop */
#define READ_PASS (1u << 20)

struct client {
	int fd;
	struct buf in, out;
	size_t skip; /* bytes still to drop of a frame too big to relay */
	uint32_t events; /* what epoll watches for it now */
	int held; /* its execs' output is held by the agent until it reads its backlog */
};

/* one request in flight: the relay's id, whose it is, and under which id the client knows it */
struct route {
	uint32_t relay_id, client_id;
	int client; /* index into clients; -1 = free slot */
	uint16_t type; /* an ATTACH's is T_EXEC: it goes on as one */
	uint8_t started; /* an EXEC the agent has started (its ERRORs no longer end it) */
	uint8_t keep; /* a kept EXEC (flags bit 1) or an ATTACH: let go, not killed, when its client goes */
	uint8_t detaching; /* its client sent DETACH: the route ends with the answer (OK, or ESRCH or its EXIT) */
	uint8_t asked_hold; /* its client sent HOLD_OUTPUT 1 for it (and not 0 since) */
};

static struct client clients[MAX_CLIENTS];
static struct route routes[MAX_ROUTES];
static int nroutes;
static int agent_fd = -1, listen_fd = -1, epfd = -1;
static struct buf agent_in, agent_out;
static uint8_t hello[256];
static size_t hello_len;
static uint32_t next_id = 1;
/* the id of a RESET the relay sent after the agent started a new session: until its HELLO, what
 * the agent sends belongs to no one */
static uint32_t resync_id;
/* while `hold_file` exists nothing goes to or comes from the VM (a memory snapshot must not see
 * the guest's queues move); `held_file` says so once the socket towards QEMU is drained */
static int hold, held_reported;
static char held_file[4096], hold_file[4096];

static void read_hold(void)
{
	int want = access(hold_file, F_OK) == 0;
	if (want && !hold)
		held_reported = 0;
	if (!want && hold)
		unlink(held_file);
	hold = want;
}

static void die(const char *what)
{
	fprintf(stderr, "snaplab-relay: %s: %s\n", what, strerror(errno));
	exit(1);
}

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static int unix_socket(const char *path, struct sockaddr_un *a)
{
	if (strlen(path) >= sizeof a->sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	strcpy(a->sun_path, path);
	return socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
}

static struct route *route_by_relay(uint32_t relay_id);

/* The next relay id not in flight (after 2^32 requests ids come round again; 0 is HELLO's). */
static uint32_t fresh_id(void)
{
	for (;;) {
		uint32_t id = next_id++;
		if (next_id == 0)
			next_id = 1;
		if (!route_by_relay(id))
			return id;
	}
}

/* Queue a frame whose header says `id` under a new id into b. */
static int forward(struct buf *b, const uint8_t *frame, size_t n, uint32_t id)
{
	uint8_t *d = buf_reserve(b, n);
	if (!d)
		return -1;
	memcpy(d, frame, n);
	put_u32(d + 8, id);
	b->len += n;
	return 0;
}

/* Write what we can of b to fd; -1 when the peer is gone. */
static int flush(int fd, struct buf *b)
{
	while (buf_used(b)) {
		ssize_t w = write(fd, b->data + b->off, buf_used(b));
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return -1;
		}
		buf_consume(b, (size_t)w);
	}
	return 0;
}

static void agent_send_signal(uint32_t relay_id, uint32_t sig)
{
	uint8_t p[4];
	put_u32(p, sig);
	frame_put(&agent_out, T_SIGNAL, relay_id, p, sizeof p);
}

/* The agent's protocol minor, from its HELLO (0 before one). */
static int agent_minor(void)
{
	return hello_len >= 4 && get_u16(hello) == PROTO_MAJOR ? get_u16(hello + 2) : 0;
}

/* The agent can let one exec go (DETACH): the relay can keep its clients' execs (1.6). */
static int agent_detaches(void)
{
	return agent_minor() >= 6;
}

/* End a client's session: its execs are killed (its kept ones let go), its requests forgotten. */
static void drop_routes_of(int ci, int kill_execs)
{
	for (int i = 0; i < nroutes; i++) {
		if (routes[i].client != ci)
			continue;
		if (kill_execs && routes[i].type == T_EXEC && !routes[i].detaching) {
			if (routes[i].keep && agent_detaches())
				frame_put(&agent_out, T_DETACH, routes[i].relay_id, NULL, 0);
			else
				agent_send_signal(routes[i].relay_id, SIGKILL);
		}
		routes[i].client = -1;
	}
	while (nroutes > 0 && routes[nroutes - 1].client < 0)
		nroutes--;
}

static void close_client(int ci)
{
	struct client *c = &clients[ci];
	if (c->fd < 0)
		return;
	epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	c->skip = 0;
	c->held = 0;
	buf_free(&c->in);
	buf_free(&c->out);
	drop_routes_of(ci, 1);
}

/* The agent speaks 1.2 or later (HOLD_OUTPUT). */
static int agent_holds(void)
{
	return agent_minor() >= 2;
}

static void hold_route(const struct route *r, int on)
{
	uint8_t p[4];
	put_u32(p, on ? 1u : 0u);
	frame_put(&agent_out, T_HOLD_OUTPUT, r->relay_id, p, sizeof p);
}

/* Hold (or release) the output of every exec of client ci (those it holds itself stay held). */
static void hold_client(int ci, int on)
{
	clients[ci].held = on;
	for (int i = 0; i < nroutes; i++)
		if (routes[i].client == ci && routes[i].type == T_EXEC && !routes[i].asked_hold)
			hold_route(&routes[i], on);
}

/* The client's running exec (an EXEC or an ATTACH) of this id, not another request's. */
static struct route *exec_route(int ci, uint32_t client_id)
{
	for (int i = 0; i < nroutes; i++)
		if (routes[i].client == ci && routes[i].client_id == client_id && routes[i].type == T_EXEC)
			return &routes[i];
	return NULL;
}

static struct route *route_by_relay(uint32_t relay_id)
{
	for (int i = 0; i < nroutes; i++)
		if (routes[i].client >= 0 && routes[i].relay_id == relay_id)
			return &routes[i];
	return NULL;
}

static struct route *new_route(void)
{
	for (int i = 0; i < nroutes; i++)
		if (routes[i].client < 0)
			return &routes[i];
	if (nroutes == MAX_ROUTES)
		return NULL;
	return &routes[nroutes++];
}

/* One frame from client ci. */
static void client_frame(int ci, const uint8_t *p, size_t n, const struct frame *f)
{
	struct client *c = &clients[ci];
	if (f->type == T_RESET) {
		drop_routes_of(ci, 1);
		frame_put(&c->out, T_HELLO, f->id, hello, hello_len);
		return;
	}
	if (f->type == T_HOLD_OUTPUT) {
		/* a client holding one exec's output (it reads that one slowly) as the agent takes it; an
		 * exec the relay holds for its client stays held until both let go. An agent before 1.2
		 * cannot hold one exec: ignored there (the relay stops reading the VM for a client behind) */
		struct route *r = exec_route(ci, f->id);
		if (f->len != 4) {
			frame_error(&c->out, f->id, EINVAL, "bad HOLD_OUTPUT payload");
			return;
		}
		uint8_t on = get_u32(f->payload) != 0;
		if (!r || !agent_holds() || r->asked_hold == on)
			return;
		r->asked_hold = on;
		if (!c->held)
			hold_route(r, on);
		return;
	}
	if (f->type == T_STDIN || f->type == T_SIGNAL || f->type == T_RESIZE) {
		/* addressed to one of this client's execs, by its id */
		struct route *r = exec_route(ci, f->id);
		if (r)
			forward(&agent_out, p, n, r->relay_id);
		return;
	}
	int exec = f->type == T_EXEC || f->type == T_ATTACH;
	struct route *running = exec_route(ci, f->id);
	if (exec && running) {
		/* as the agent answers an EXEC (or ATTACH) whose id is still running */
		frame_error(&c->out, f->id, EBUSY, "an exec with this request id is still running");
		return;
	}
	if (f->type == T_DETACH) {
		/* refused here as the agent would; a kept exec's goes on to the agent, and its route ends
		 * with the answer (OK; or the exec's EXIT or ERROR, had it ended or failed first) */
		if (f->len)
			frame_error(&c->out, f->id, EINVAL, "bad DETACH payload");
		else if (!running || running->detaching) /* let go already, as the agent would say */
			frame_error(&c->out, f->id, ESRCH, "no running exec has this request id");
		else if (!running->keep || !agent_detaches())
			frame_error(&c->out, f->id, EINVAL, "this exec is not kept (EXEC flag bit 1)");
		else {
			forward(&agent_out, p, n, running->relay_id);
			running->detaching = 1;
		}
		return;
	}
	struct route *r = new_route();
	if (!r) {
		frame_error(&c->out, f->id, EBUSY, "too many requests in flight through the relay");
		return;
	}
	/* EXEC: u32 timeout, u32 flags (bit 1 keep), fields; an ATTACH takes on a kept one */
	int keep = f->type == T_ATTACH || (f->type == T_EXEC && f->len >= 8 && (get_u32(f->payload + 4) & EXEC_F_KEEP));
	*r = (struct route){ .relay_id = fresh_id(),
			     .client_id = f->id,
			     .client = ci,
			     .type = exec ? T_EXEC : f->type,
			     .keep = (uint8_t)keep };
	forward(&agent_out, p, n, r->relay_id);
	if (exec && c->held)
		hold_route(r, 1); /* a new exec of a client that is behind starts held too */
}

/* One frame from the VM's agent. */
static void agent_frame(const uint8_t *p, size_t n, const struct frame *f)
{
	if (resync_id) {
		if (f->type == T_HELLO && f->id == resync_id)
			resync_id = 0;
		return; /* the old session's tail, or frames for requests already failed */
	}
	if (f->type == T_HELLO && f->id == 0) {
		/* the agent started a new session (its execs were killed, its kept ones let go: they run
		 * on for an ATTACH): fail what was in flight with ECONNRESET, which a client reads as its
		 * connection to the machine lost, and RESET it, so that requests already on their way run
		 * in a session that ends them */
		resync_id = fresh_id();
		frame_put(&agent_out, T_RESET, resync_id, NULL, 0);
		for (int i = 0; i < nroutes; i++) {
			if (routes[i].client < 0)
				continue;
			frame_error(&clients[routes[i].client].out, routes[i].client_id, ECONNRESET,
				    "the VM's agent started a new session");
			routes[i].client = -1;
		}
		nroutes = 0;
		return;
	}
	struct route *r = route_by_relay(f->id);
	if (!r)
		return; /* e.g. output of an exec whose client went away */
	struct client *c = &clients[r->client];
	forward(&c->out, p, n, r->client_id);
	if (r->type == T_EXEC && f->type == T_STARTED)
		r->started = 1;
	/* an EXEC ends with EXIT, or with an ERROR before it started (after, an ERROR answers a bad
	 * STDIN or SIGNAL for it), or, let go (DETACH), with the answer to that: OK, or ESRCH (it had
	 * ended; the relay refused every other DETACH itself); any other request with its one answer */
	int done = r->type != T_EXEC || f->type == T_EXIT || (f->type == T_ERROR && !r->started) ||
		   (r->detaching &&
		    (f->type == T_OK || (f->type == T_ERROR && f->len >= 4 && get_u32(f->payload) == ESRCH)));
	if (done)
		r->client = -1;
}

/*
 * Parse every whole frame in b, handing each on. A client's frame over the limit is answered
 * with ERROR (EMSGSIZE) and skipped, as the agent does; the agent's is fatal (-1).
 */
static int frames(struct buf *b, int ci)
{
	for (;;) {
		if (ci >= 0 && clients[ci].skip) {
			size_t k = buf_used(b) < clients[ci].skip ? buf_used(b) : clients[ci].skip;
			buf_consume(b, k);
			clients[ci].skip -= k;
			if (clients[ci].skip)
				return 0;
		}
		struct frame f;
		long used = frame_parse(b->data + b->off, buf_used(b), &f);
		if (used == 0)
			return 0;
		if (used < 0) {
			if (ci < 0)
				return -1;
			frame_error(&clients[ci].out, f.id, EMSGSIZE, "frame larger than 64 MiB");
			clients[ci].skip = FRAME_HDR + (size_t)f.len;
			continue;
		}
		if (ci >= 0)
			client_frame(ci, b->data + b->off, (size_t)used, &f);
		else
			agent_frame(b->data + b->off, (size_t)used, &f);
		buf_consume(b, (size_t)used);
	}
}

/* Read what fd has into b (up to `max` bytes); 0 at EOF or error, 1 otherwise. */
static int fill(int fd, struct buf *b, size_t max)
{
	for (size_t got = 0; got < max;) {
		uint8_t *d = buf_reserve(b, 65536);
		if (!d)
			return 0;
		ssize_t r = read(fd, d, 65536);
		if (r > 0) {
			b->len += (size_t)r;
			got += (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EAGAIN)
			return 1;
		return 0;
	}
	return 1;
}

/*
 * Connect to the VM's chardev and RESET the guest's session; retry until HELLO answers it (the
 * guest may still be booting) or QEMU is gone.
 */
static void connect_agent(const char *path, pid_t qemu)
{
	long deadline = now_ms() + 120000;
	while (now_ms() < deadline) {
		if (kill(qemu, 0) < 0 && errno == ESRCH) {
			fprintf(stderr, "snaplab-relay: QEMU (pid %d) is gone\n", (int)qemu);
			exit(1);
		}
		struct sockaddr_un a;
		int fd = unix_socket(path, &a);
		if (fd < 0)
			die("socket");
		if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
			uint32_t id = 0x52454c59; /* "RELY" */
			struct buf b = { 0 };
			frame_put(&b, T_RESET, id, NULL, 0);
			if (write(fd, b.data + b.off, buf_used(&b)) == (ssize_t)buf_used(&b)) {
				buf_free(&b);
				struct timeval tv = { .tv_sec = 0, .tv_usec = 500000 };
				setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
				/* an old session's output streaming in must not keep this attempt going */
				long attempt_end = now_ms() + 2000;
				while (now_ms() < attempt_end) {
					uint8_t *d = buf_reserve(&b, 4096);
					ssize_t r = d ? read(fd, d, 4096) : -1;
					if (r <= 0)
						break;
					b.len += (size_t)r;
					struct frame f;
					long used;
					while ((used = frame_parse(b.data + b.off, buf_used(&b), &f)) > 0) {
						if (f.type == T_HELLO && f.id == id && f.len <= sizeof hello) {
							memcpy(hello, f.payload, f.len);
							hello_len = f.len;
							/* a client's kept execs outlive it only where the agent can let
							 * one go alone (DETACH, 1.6): an older one's clients are told 1.4,
							 * so none asks for a kept exec (1.5); a newer one's, what the
							 * relay routes (1.7: a client's HOLD_OUTPUT too; 1.8: an EXEC's
							 * flags, passed on as they are, wait for output's end) */
							int most = agent_detaches() ? 8 : 4;
							if (hello_len >= 4 && get_u16(hello + 2) > most)
								put_u16(hello + 2, (uint16_t)most);
							buf_consume(&b, (size_t)used);
							/* whatever follows it is the session's: keep it in step */
							buf_append(&agent_in, b.data + b.off, buf_used(&b));
							buf_free(&b);
							agent_fd = fd;
							return;
						}
						buf_consume(&b, (size_t)used);
					}
					if (used < 0)
						break;
				}
			}
			buf_free(&b);
		}
		close(fd);
		usleep(50000);
	}
	fprintf(stderr, "snaplab-relay: the agent did not answer within 120 s\n");
	exit(1);
}

/* Hold: stop writing to the VM; report once QEMU has taken all that was sent (or at once if
 * nothing is in flight). Release: write again. */
static void check_held(void)
{
	if (!hold || held_reported)
		return;
	int q = 0;
	if (ioctl(agent_fd, SIOCOUTQ, &q) < 0 || q == 0) {
		int fd = open(held_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd >= 0)
			close(fd);
		held_reported = 1;
	}
}

int relay_main(const char *connect_path, const char *listen_path, pid_t qemu, int ready_fd)
{
	signal(SIGPIPE, SIG_IGN);
	snprintf(held_file, sizeof held_file, "%s.held", listen_path);
	snprintf(hold_file, sizeof hold_file, "%s.hold", listen_path);
	unlink(held_file);
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGUSR1);
	sigprocmask(SIG_BLOCK, &sigs, NULL);
	int sig_fd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sig_fd < 0)
		die("signalfd");
	for (int i = 0; i < MAX_CLIENTS; i++)
		clients[i].fd = -1;
	connect_agent(connect_path, qemu);
	fcntl(agent_fd, F_SETFL, O_NONBLOCK);
	struct timeval none = { 0 };
	setsockopt(agent_fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);

	struct sockaddr_un a;
	listen_fd = unix_socket(listen_path, &a);
	if (listen_fd < 0)
		die("socket");
	unlink(listen_path);
	if (bind(listen_fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(listen_fd, 128) < 0)
		die(listen_path);
	fcntl(listen_fd, F_SETFL, O_NONBLOCK);

	epfd = epoll_create1(EPOLL_CLOEXEC);
	if (epfd < 0)
		die("epoll");
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &agent_fd };
	epoll_ctl(epfd, EPOLL_CTL_ADD, agent_fd, &ev);
	ev = (struct epoll_event){ .events = EPOLLIN, .data.ptr = &listen_fd };
	epoll_ctl(epfd, EPOLL_CTL_ADD, listen_fd, &ev);
	ev = (struct epoll_event){ .events = EPOLLIN, .data.ptr = &sig_fd };
	epoll_ctl(epfd, EPOLL_CTL_ADD, sig_fd, &ev);

	if (ready_fd >= 0) {
		/* the host waits on this: the relay serves from now on */
		if (write(ready_fd, "R", 1) < 0) { /* the host gave up waiting: serve anyway */
		}
		close(ready_fd);
	}

	uint32_t agent_events = EPOLLIN;
	read_hold();
	for (;;) {
		struct epoll_event evs[64];
		/* while a hold waits for QEMU to drain the socket, look again soon */
		int n = epoll_wait(epfd, evs, 64, hold && !held_reported ? 2 : 1000);
		if (n < 0 && errno != EINTR)
			die("epoll_wait");
		/* QEMU gone: its socket closes too, but a crashed QEMU's child could hold it open */
		if (n == 0 && kill(qemu, 0) < 0 && errno == ESRCH)
			break;
		for (int i = 0; i < n; i++) {
			void *tag = evs[i].data.ptr;
			if (tag == &sig_fd) {
				struct signalfd_siginfo si;
				while (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
				}
				read_hold();
			} else if (tag == &listen_fd) {
				int fd;
				while ((fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0 ||
				       errno == EINTR) {
					if (fd < 0)
						continue;
					int ci = -1;
					for (int k = 0; k < MAX_CLIENTS && ci < 0; k++)
						if (clients[k].fd < 0)
							ci = k;
					if (ci < 0) {
						close(fd);
						continue;
					}
					clients[ci].fd = fd;
					clients[ci].events = EPOLLIN;
					struct epoll_event ce = { .events = EPOLLIN, .data.ptr = &clients[ci] };
					epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ce);
					/* as the agent greets a new connection (a client that RESETs skips it) */
					frame_put(&clients[ci].out, T_HELLO, 0, hello, hello_len);
				}
				if (errno == EMFILE || errno == ENFILE)
					usleep(10000); /* out of descriptors: do not spin on the pending connection */
			} else if (tag == &agent_fd) {
				if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
					if (!fill(agent_fd, &agent_in, (size_t)-1) || frames(&agent_in, -1) < 0)
						goto out;
				}
			} else {
				int ci = (int)((struct client *)tag - clients);
				if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
					int alive = fill(clients[ci].fd, &clients[ci].in, READ_PASS);
					if (frames(&clients[ci].in, ci) < 0 || !alive) {
						close_client(ci);
						continue;
					}
				}
			}
		}
		/* write out, and apply backpressure: a client that does not read stops the VM's output */
		int full = 0;
		for (int ci = 0; ci < MAX_CLIENTS; ci++) {
			struct client *c = &clients[ci];
			if (c->fd < 0)
				continue;
			if (flush(c->fd, &c->out) < 0) {
				close_client(ci);
				continue;
			}
			/* backpressure the other way: clients wait while the VM has a backlog */
			uint32_t want = (buf_used(&agent_out) > AGENT_HIGH_WATER ? 0 : EPOLLIN) |
					(buf_used(&c->out) ? EPOLLOUT : 0);
			if (want != c->events) {
				struct epoll_event ce = { .events = want, .data.ptr = c };
				epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ce);
				c->events = want;
			}
			if (agent_holds()) {
				if (!c->held && buf_used(&c->out) > CLIENT_HIGH_WATER)
					hold_client(ci, 1);
				else if (c->held && buf_used(&c->out) < CLIENT_LOW_WATER)
					hold_client(ci, 0);
			} else if (buf_used(&c->out) > CLIENT_HIGH_WATER)
				full = 1;
		}
		if (!hold && flush(agent_fd, &agent_out) < 0)
			break;
		check_held();
		/* held: no reading either, so QEMU does not move the guest's output queue into a full
		 * chardev's room */
		uint32_t want = (full || hold ? 0 : EPOLLIN) | (!hold && buf_used(&agent_out) ? EPOLLOUT : 0);
		if (want != agent_events) {
			struct epoll_event ae = { .events = want, .data.ptr = &agent_fd };
			epoll_ctl(epfd, EPOLL_CTL_MOD, agent_fd, &ae);
			agent_events = want;
		}
	}
out:
	unlink(listen_path);
	unlink(held_file);
	return 0;
}
