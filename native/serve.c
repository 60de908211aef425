/*
 * Serve mode: the in-sandbox agent. One thread, one epoll loop, level-triggered, non-blocking fds.
 * Connections speak the framed protocol (frame.h); each EXEC becomes a child in its own process
 * group whose pipes are pumped into frames. The agent reaps every child it gets, orphans included.
 *
 * Transports: a listening Unix socket (one connection per accept), or one byte stream (--stream,
 * a VM's virtio-serial port) served as a single connection that lives as long as the agent. A
 * stream has sessions instead of connections: one ends on RESET, or when the stream reports
 * hang-up (virtio-serial: the host side disconnected), and the stream is then kept out of epoll
 * and re-checked by a timer (and by SIGIO) until it is usable again.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/random.h>

#include "frame.h"
#include "sandbox.h"

/* fuzz/frame_fuzz.c compiles this file with -DFUZZ: every request is parsed and answered as here,
 * but what a handler would do to the files and the clock of the host the fuzzer runs on (as
 * root) is replaced by the harness's stand-in, the second argument. */
#ifdef FUZZ
int fuzz_open(const char *path);
int fuzz_clock_settime(clockid_t clock, const struct timespec *ts);
int fuzz_identity(const char *hostname, const char *machine_id, const uint8_t *entropy, size_t n, int system);
#define FUZZ_EFFECT(real, fake) (fake)
#else
#define FUZZ_EFFECT(real, fake) (real)
#endif

#define READ_CHUNK (64u * 1024)
#define OUT_HIGH (16u << 20) /* stop reading a connection's pipes above this much unsent output */
#define OUT_LOW (1u << 20)
#define STDIN_WINDOW (4u << 20) /* what the host may send of an exec's stdin ahead of its ACKs */
#define STDIN_LIMIT (STDIN_WINDOW + FRAME_MAX_PAYLOAD) /* queued beyond this, the host ignored the window */
#define ACK_EVERY (256u << 10)
#define DRAIN_MAX (4u << 20) /* per stream, after exit: a grandchild that keeps writing can't stall us */
#define STREAM_RECHECK_NS 50000000ull /* while a stream is hung up */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

enum kind { K_LISTEN, K_SIGNAL, K_TIMER, K_STREAM_TIMER, K_CONN, K_OUT, K_ERR, K_IN };

struct src {
	enum kind kind;
	int fd;
	uint32_t events;
	int paused;
	void *owner;
};

struct conn {
	struct src s;
	struct buf in, out;
	uint64_t skip; /* bytes of a refused oversized frame still to discard */
	int dead, dirty, paused;
	int stream; /* the --stream connection: never closed, its sessions end instead */
	int down; /* stream only: hung up, out of epoll, waiting for the recheck timer */
	unsigned gen; /* bumped when a stream session ends: stale loops over `in` stop */
	struct conn *next_dirty, *next_grave;
};

struct exec {
	struct src out, err, in;
	struct conn *conn; /* NULL once its connection has gone */
	uint32_t id;
	pid_t pid;
	pid_t ns_pid; /* as the command and its /proc see it (a system machine's agent is outside its pid namespace) */
	struct buf inq;
	int in_eof, timed_out;
	int tty; /* out.fd is the pty master (in.fd a dup of it); no err */
	uint64_t unacked; /* stdin bytes passed on (or dropped) since the last STDIN_ACK */
	int held; /* HOLD_OUTPUT: its output is not read until released (a VM relay's slow client) */
	uint32_t flags;
	int keep; /* EXEC_F_KEEP: its connection's end leaves it running, unheld (LIST_KEPT, ATTACH) */
	uint64_t out_total; /* output bytes it has written, sent or dropped: where an ATTACH starts */
	char *tag; /* a kept exec's tag (F_TAG), or NULL */
	uint32_t tag_len;
	int exec_errno;
	uint64_t start_ns, deadline_ns;
	/* EXEC_F_WAIT_OUTPUT (1.8): its EXIT waits for the end of its output, not only its process */
	int wait_output;
	/* its process ended (reaped, out of by_pid) while what it left still held its output;
	 * group_gone: no process was left in its group then (the number may be another's later) */
	int exited, status, group_gone;
	struct rusage ru;
	struct exec *prev, *next, *hnext, *next_grave;
};

static int epfd = -1, devnull = -1, is_pid1;
/* a system machine (snaplab-agent boot): its init is PID 1 and starts services unfiltered, and
 * sudo must work for commands too: no no_new_privs, no seccomp filter on commands. The user
 * namespace and the bounding set are the boundary (docs/architecture.md "System machines"). */
int system_machine;
static struct src listen_src = { K_LISTEN, -1, 0, 0, NULL };
static struct src signal_src = { K_SIGNAL, -1, 0, 0, NULL };
static struct src timer_src = { K_TIMER, -1, 0, 0, NULL };
static struct src stream_timer_src = { K_STREAM_TIMER, -1, 0, 0, NULL };
static struct conn *stream_conn;
static const char *sock_path;
static uint64_t timer_armed;
static struct exec *execs;
#define PID_BUCKETS 256
static struct exec *by_pid[PID_BUCKETS];
static struct conn *dirty_list, *grave_conns;
static struct exec *grave_execs;
static unsigned waiting_execs; /* reaped, their EXIT waiting for their output (EXEC_F_WAIT_OUTPUT) */
static unsigned tmp_counter;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
	fprintf(stderr, "snaplab-agent: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int ep_set(struct src *s, uint32_t events)
{
	if (s->fd < 0 || s->events == events)
		return 0;
	struct epoll_event ev = { .events = events, .data.ptr = s };
	s->events = events;
	return epoll_ctl(epfd, EPOLL_CTL_MOD, s->fd, &ev);
}

static int ep_add(struct src *s, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = s };
	s->events = events;
	return epoll_ctl(epfd, EPOLL_CTL_ADD, s->fd, &ev);
}

static void src_close(struct src *s)
{
	if (s->fd >= 0) {
		/* out of the epoll set first: a tty exec's input is a dup of its output's open file,
		 * and epoll forgets a registration only when the open file's last fd is closed */
		epoll_ctl(epfd, EPOLL_CTL_DEL, s->fd, NULL);
		close(s->fd);
		s->fd = -1;
	}
}

static void mark_dirty(struct conn *c)
{
	if (!c->dirty && !c->dead) {
		c->dirty = 1;
		c->next_dirty = dirty_list;
		dirty_list = c;
	}
}

/* ---- exec bookkeeping ---- */

static void exec_link(struct exec *e)
{
	e->next = execs;
	if (execs)
		execs->prev = e;
	execs = e;
	struct exec **b = &by_pid[(unsigned)e->pid % PID_BUCKETS];
	e->hnext = *b;
	*b = e;
}

static void pid_unhash(struct exec *e)
{
	for (struct exec **b = &by_pid[(unsigned)e->pid % PID_BUCKETS]; *b; b = &(*b)->hnext)
		if (*b == e) {
			*b = e->hnext;
			break;
		}
}

static void exec_unlink(struct exec *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		execs = e->next;
	if (e->next)
		e->next->prev = e->prev;
	if (!e->exited)
		pid_unhash(e);
}

static struct exec *exec_by_pid(pid_t pid)
{
	for (struct exec *e = by_pid[(unsigned)pid % PID_BUCKETS]; e; e = e->hnext)
		if (e->pid == pid)
			return e;
	return NULL;
}

static struct exec *exec_by_id(struct conn *c, uint32_t id)
{
	for (struct exec *e = execs; e; e = e->next)
		if (e->conn == c && e->id == id)
			return e;
	return NULL;
}

/* Commands are the OOM killer's first choice (1000: Kubernetes' BestEffort), the agent (and the
 * bwrap above it) never while a command is left: a memory cgroup's killer can take a second
 * victim while the first is still dying, and on the smallest score it took bwrap or the agent,
 * which ended the machine. Raising needs no privilege; a command can lower itself again only to
 * the floor it inherits (oom_score_adj_min: 0 unless a process with CAP_SYS_RESOURCE gave the
 * agent's ancestors a lower score), never below it. Written here, once the command has exec'd
 * (it ran for that long at the agent's score): the clone cannot write its own, its /proc files
 * being the host root's while it shares the agent's memory (the agent binary is unreadable
 * inside: boot.c). Non-blocking: a FIFO mounted there must not stall the agent. */
static void oom_first(pid_t ns_pid)
{
	char path[48];
	snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int)ns_pid);
	int f = FUZZ_EFFECT(open(path, O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY), -1);
	if (f < 0)
		return; /* gone already, or no such /proc: its score stays the agent's */
	if (write(f, "1000", 4) < 0) {
		/* best effort, as above */
	}
	close(f);
}

/* SIGKILL to every process of session sid (its leader's pid as /proc numbers it): a shell on a
 * terminal puts each job in a process group of its own, which killing the shell's group alone
 * would leave running. Signalled through its /proc directory (a pidfd): a system machine's
 * agent is not in the pid namespace whose numbers /proc shows, so kill() would take another. */
static void kill_session(pid_t sid)
{
	DIR *d = opendir("/proc");
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d))) {
		char *end, st[512];
		long pid = strtol(de->d_name, &end, 10);
		if (*end || pid <= 1)
			continue;
		int dir = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dir < 0)
			continue;
		int fd = openat(dir, "stat", O_RDONLY | O_CLOEXEC);
		ssize_t n = fd < 0 ? -1 : read(fd, st, sizeof st - 1);
		if (fd >= 0)
			close(fd);
		if (n > 0) {
			st[n] = 0;
			/* pid (comm) state ppid pgrp session ...: comm may hold anything, so after the last ')' */
			char *rp = strrchr(st, ')');
			int ppid, pgrp, session;
			if (rp && sscanf(rp + 1, " %*c %d %d %d", &ppid, &pgrp, &session) == 3 && session == sid)
				syscall(SYS_pidfd_send_signal, dir, SIGKILL, NULL, 0);
		}
		close(dir);
	}
	closedir(d);
}

static void exec_signal(struct exec *e, int sig)
{
	/* one whose process has ended: what is left of its group (its pid, reaped, may be another's),
	 * unless nothing was (then the number may be another group's) */
	if (e->exited && e->group_gone)
		return;
	if (kill(-e->pid, sig) < 0 && !e->exited)
		kill(e->pid, sig);
	if (e->tty && sig == SIGKILL)
		kill_session(e->ns_pid);
}

static void timer_update(void)
{
	uint64_t next = 0;
	for (struct exec *e = execs; e; e = e->next)
		if (e->deadline_ns && !e->timed_out && (!next || e->deadline_ns < next))
			next = e->deadline_ns;
	if (next == timer_armed)
		return;
	struct itimerspec its = { 0 };
	its.it_value.tv_sec = (time_t)(next / 1000000000ull);
	its.it_value.tv_nsec = (long)(next % 1000000000ull);
	timerfd_settime(timer_src.fd, TFD_TIMER_ABSTIME, &its, NULL);
	timer_armed = next;
}

static void exec_finish(struct exec *e, int status, const struct rusage *ru);

/* EXEC_F_WAIT_OUTPUT: one whose process has ended is done once its output has ended too. */
static void output_ended(struct exec *e)
{
	if (e->exited && e->out.fd < 0 && e->err.fd < 0)
		exec_finish(e, e->status, &e->ru);
}

/* Its output is not waited for any more (a timeout, a SIGKILL or SIGTERM from the host, its
 * connection gone), as envd stops reading a command's output there: ended now if its process has. */
static void stop_waiting(struct exec *e)
{
	e->wait_output = 0;
	if (e->exited)
		exec_finish(e, e->status, &e->ru);
}

static void on_timer(void)
{
	uint64_t ticks;
	if (read(timer_src.fd, &ticks, sizeof ticks) < 0) {
		/* spurious: re-armed below anyway */
	}
	uint64_t now = now_ns();
	for (struct exec *e = execs; e; e = e->next)
		if (e->deadline_ns && !e->timed_out && e->deadline_ns <= now) {
			e->timed_out = 1;
			exec_signal(e, SIGKILL);
			stop_waiting(e); /* (a finished one stays readable until freed after the events) */
		}
	timer_armed = UINT64_MAX; /* force a re-arm */
	timer_update();
}

/* ---- child output ---- */

static void pause_check(struct exec *e, struct src *s)
{
	if (e->conn && buf_used(&e->conn->out) > OUT_HIGH) {
		ep_set(s, 0);
		s->paused = 1;
		e->conn->paused = 1;
	}
}

/* One read from a child's stdout/stderr into a frame. Returns bytes read, 0 on EOF, -1 on EAGAIN. */
static ssize_t pump_once(struct exec *e, struct src *s)
{
	if (!e->conn) {
		char junk[READ_CHUNK];
		ssize_t n = read(s->fd, junk, sizeof junk);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			src_close(s);
			return 0;
		}
		if (n > 0)
			e->out_total += (uint64_t)n;
		return n < 0 ? -1 : n;
	}
	struct buf *b = &e->conn->out;
	uint8_t *p = buf_reserve(b, FRAME_HDR + READ_CHUNK);
	if (!p)
		return -1;
	ssize_t n = read(s->fd, p + FRAME_HDR, READ_CHUNK);
	if (n > 0) {
		put_u32(p, (uint32_t)n);
		put_u16(p + 4, s->kind == K_OUT ? T_STDOUT : T_STDERR);
		put_u16(p + 6, 0);
		put_u32(p + 8, e->id);
		b->len += FRAME_HDR + (size_t)n;
		e->out_total += (uint64_t)n;
		mark_dirty(e->conn);
		return n;
	}
	if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
		src_close(s);
		return 0;
	}
	return -1;
}

static void drain(struct exec *e, struct src *s)
{
	size_t total = 0;
	while (s->fd >= 0 && total < DRAIN_MAX) {
		ssize_t n = pump_once(e, s);
		if (n <= 0)
			break;
		total += (size_t)n;
	}
	src_close(s);
}

static void conn_events(struct conn *c)
{
	if (!c->dead && !c->down)
		ep_set(&c->s, EPOLLIN | (buf_used(&c->out) ? EPOLLOUT : 0));
}

/* Flow control for stdin (1.2): the host sends at most STDIN_WINDOW bytes of an exec's stdin
 * that the agent has not acknowledged; the agent acknowledges what it has passed on to the
 * command (or dropped) with STDIN_ACK, every ACK_EVERY bytes and whenever its queue runs dry.
 * So the connection is always read: a command that does not read its stdin holds back only its
 * own input, never a SIGNAL, a PING or another exec. */
static void ack_stdin(struct exec *e, int all)
{
	if (!e->conn || !e->unacked || (!all && e->unacked < ACK_EVERY && buf_used(&e->inq)))
		return;
	uint8_t p[4];
	put_u32(p, (uint32_t)e->unacked);
	frame_put(&e->conn->out, T_STDIN_ACK, e->id, p, sizeof p);
	mark_dirty(e->conn);
	e->unacked = 0;
}

static void stdin_flush(struct exec *e)
{
	while (e->in.fd >= 0 && buf_used(&e->inq)) {
		ssize_t n = write(e->in.fd, e->inq.data + e->inq.off, buf_used(&e->inq));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				ep_set(&e->in, EPOLLOUT);
				ack_stdin(e, 0); /* what went in so far: the host keeps sending while it waits */
				return;
			}
			src_close(&e->in); /* EPIPE: the command stopped reading; its input is moot */
			e->unacked += buf_used(&e->inq); /* dropped: the host may send on (to nobody) */
			buf_free(&e->inq);
			ack_stdin(e, 1);
			return;
		}
		buf_consume(&e->inq, (size_t)n);
		e->unacked += (uint64_t)n;
	}
	if (e->in.fd >= 0) {
		if (e->in_eof)
			src_close(&e->in);
		else
			ep_set(&e->in, 0);
	}
	ack_stdin(e, 0);
}

static void exec_finish(struct exec *e, int status, const struct rusage *ru)
{
	if (e->exited)
		waiting_execs--;
	drain(e, &e->out);
	drain(e, &e->err);
	src_close(&e->in);
	buf_free(&e->inq);
	if (e->conn) {
		uint8_t p[EXIT_PAYLOAD];
		int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
		uint32_t flags = e->flags | (e->timed_out ? EXIT_F_TIMED_OUT : 0);
		put_u32(p, (uint32_t)code);
		put_u32(p + 4, (uint32_t)sig);
		put_u32(p + 8, flags);
		put_u32(p + 12, (uint32_t)e->exec_errno);
		put_u64(p + 16, (uint64_t)ru->ru_utime.tv_sec * 1000000ull + (uint64_t)ru->ru_utime.tv_usec);
		put_u64(p + 24, (uint64_t)ru->ru_stime.tv_sec * 1000000ull + (uint64_t)ru->ru_stime.tv_usec);
		put_u64(p + 32, (uint64_t)ru->ru_maxrss);
		put_u64(p + 40, (now_ns() - e->start_ns) / 1000u);
		frame_put(&e->conn->out, T_EXIT, e->id, p, sizeof p);
		mark_dirty(e->conn);
	}
	exec_unlink(e);
	e->next_grave = grave_execs;
	grave_execs = e;
}

static void reap(void)
{
	for (;;) {
		int status;
		struct rusage ru;
		pid_t pid = wait4(-1, &status, WNOHANG | __WALL, &ru);
		if (pid <= 0)
			return;
		struct exec *e = exec_by_pid(pid);
		if (e && e->wait_output && (e->out.fd >= 0 || e->err.fd >= 0)) {
			/* what it left running still holds its output: its EXIT waits for that to end */
			pid_unhash(e);
			e->exited = 1;
			waiting_execs++;
			e->status = status;
			e->ru = ru;
			e->group_gone = kill(-e->pid, 0) < 0 && errno == ESRCH;
		} else if (e)
			exec_finish(e, status, &ru);
		/* else: an orphan we inherited as PID 1 / subreaper, or a failed spawn: just reaped */
	}
}

/* ---- connections ---- */

/* Let a kept exec go (its connection ended, or DETACH): it runs on, held by no connection, its
 * output read and dropped until an ATTACH; input that was on its way is lost with the
 * connection, its stdin stays open for the next holder. */
static void let_go(struct exec *e)
{
	e->conn = NULL;
	buf_free(&e->inq);
	if (e->in_eof)
		src_close(&e->in); /* its end of input was on its way: it still gets it */
	e->unacked = 0;
	e->held = 0;
	e->out.paused = e->err.paused = 0;
	ep_set(&e->out, EPOLLIN);
	ep_set(&e->err, EPOLLIN);
	ep_set(&e->in, 0);
}

/* End the execs a connection (or a stream session) started: SIGKILL their process groups and
 * forget their output. They are still reaped, silently. A kept one (1.5) is let go instead. */
static void detach_execs(struct conn *c)
{
	for (struct exec *e = execs; e; e = e->next)
		if (e->conn == c && e->keep)
			let_go(e);
		else if (e->conn == c) {
			exec_signal(e, SIGKILL);
			e->conn = NULL;
			src_close(&e->in);
			src_close(&e->out);
			src_close(&e->err);
			buf_free(&e->inq);
			stop_waiting(e);
		}
	c->paused = 0;
}

static void send_hello(struct conn *c, uint32_t id);
static void conn_flush(struct conn *c);

static void stream_timer_set(uint64_t interval_ns)
{
	struct itimerspec its = { 0 };
	its.it_value.tv_sec = its.it_interval.tv_sec = (time_t)(interval_ns / 1000000000ull);
	its.it_value.tv_nsec = its.it_interval.tv_nsec = (long)(interval_ns % 1000000000ull);
	timerfd_settime(stream_timer_src.fd, 0, &its, NULL);
}

/* SIGIO on the stream while it is down: virtio-serial signals the host's (dis)connect. */
static void stream_async(struct conn *c, int on)
{
	int fl = fcntl(c->s.fd, F_GETFL);
	if (fl < 0)
		return;
	if (on)
		fcntl(c->s.fd, F_SETOWN, getpid());
	fcntl(c->s.fd, F_SETFL, on ? fl | O_ASYNC : fl & ~O_ASYNC);
}

/*
 * The stream hung up (virtio-serial: the host disconnected; a socketpair: the peer closed) or
 * failed: end the session, drop what was read or queued for it, and leave epoll — a hung-up
 * virtio port reports POLLHUP continuously — until stream_check() finds it usable again.
 */
static void stream_down(struct conn *c)
{
	if (c->down)
		return;
	c->down = 1;
	c->gen++;
	detach_execs(c);
	epoll_ctl(epfd, EPOLL_CTL_DEL, c->s.fd, NULL);
	c->s.events = 0;
	/* A half-read frame of the old host is dropped. The fd itself is not drained: virtio-serial
	 * reads 0 only once nothing is queued, and a drain could eat the RESET of a host that has
	 * reconnected in the meantime. */
	c->in.off = c->in.len = 0;
	c->skip = 0;
	c->out.off = c->out.len = 0;
	stream_async(c, 1);
	stream_timer_set(STREAM_RECHECK_NS);
}

/* While down: is the stream usable again? Then re-enter epoll and greet the new host. */
static void stream_check(struct conn *c)
{
	if (!c->down)
		return;
	struct pollfd p = { .fd = c->s.fd, .events = POLLIN | POLLOUT | POLLRDHUP };
	if (poll(&p, 1, 0) < 0 || (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)))
		return; /* still hung up: the timer keeps ticking */
	stream_timer_set(0);
	stream_async(c, 0);
	if (ep_add(&c->s, EPOLLIN) < 0)
		die("epoll_ctl stream");
	c->down = 0;
	send_hello(c, 0);
	conn_flush(c); /* at start-up nothing else would flush it */
}

static void conn_close(struct conn *c)
{
	if (c->stream) {
		stream_down(c);
		return;
	}
	if (c->dead)
		return;
	c->dead = 1;
	src_close(&c->s);
	detach_execs(c);
	c->next_grave = grave_conns;
	grave_conns = c;
}

static void conn_flush(struct conn *c)
{
	if (c->down) {
		c->out.off = c->out.len = 0; /* nobody to send it to: the session it belongs to is over */
		return;
	}
	while (!c->dead && !c->down && buf_used(&c->out)) {
		/* write(), not send(): a stream may be a character device (virtio-serial port) */
		ssize_t n = c->stream ? write(c->s.fd, c->out.data + c->out.off, buf_used(&c->out))
				      : send(c->s.fd, c->out.data + c->out.off, buf_used(&c->out), MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				conn_events(c);
				break;
			}
			conn_close(c);
			return;
		}
		buf_consume(&c->out, (size_t)n);
	}
	if (c->dead || c->down)
		return;
	if (!buf_used(&c->out))
		conn_events(c);
	if (c->paused && buf_used(&c->out) < OUT_LOW) {
		c->paused = 0;
		for (struct exec *e = execs; e; e = e->next)
			if (e->conn == c) {
				if (e->out.paused) {
					e->out.paused = 0;
					if (!e->held)
						ep_set(&e->out, EPOLLIN);
				}
				if (e->err.paused) {
					e->err.paused = 0;
					if (!e->held)
						ep_set(&e->err, EPOLLIN);
				}
			}
	}
}

static void reply_error(struct conn *c, uint32_t id, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void reply_error(struct conn *c, uint32_t id, int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	frame_error(&c->out, id, err, msg);
	mark_dirty(c);
}

static void reply(struct conn *c, uint16_t type, uint32_t id, const void *p, size_t n)
{
	if (frame_put(&c->out, type, id, p, n) < 0)
		conn_close(c);
	else
		mark_dirty(c);
}

/* Payload strings are not NUL-terminated: copy one out, refusing embedded NULs. */
static char *dup_str(const uint8_t *p, size_t n)
{
	if (memchr(p, 0, n))
		return NULL;
	char *s = malloc(n + 1);
	if (s) {
		memcpy(s, p, n);
		s[n] = 0;
	}
	return s;
}

static int make_pipe(int fds[2], int parent_end)
{
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -1;
	/* Only our end is non-blocking: the command gets ordinary blocking pipes. */
	fcntl(fds[parent_end], F_SETFL, O_NONBLOCK);
	return 0;
}

/* "COLSxROWS", decimal, each 1..65535 */
static int parse_winsize(const char *s, unsigned *cols, unsigned *rows)
{
	char *end;
	errno = 0;
	unsigned long c = strtoul(s, &end, 10);
	if (errno || end == s || *end != 'x' || c == 0 || c > 65535)
		return -1;
	s = end + 1;
	unsigned long r = strtoul(s, &end, 10);
	if (errno || end == s || *end || r == 0 || r > 65535)
		return -1;
	*cols = (unsigned)c;
	*rows = (unsigned)r;
	return 0;
}

/* A pseudo-terminal of the machine's own devpts: fds[0] the master (non-blocking, ours),
 * fds[1] the slave (the command's stdin, stdout and stderr); *in a second master fd for input,
 * so that closing input (end of stdin) leaves the output side open. */
static int open_pty(int fds[2], int *in, unsigned cols, unsigned rows)
{
	int zero = 0;
	struct winsize ws = { .ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols };
	int m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
	if (m < 0)
		return -1;
	int sl = -1;
	if (ioctl(m, TIOCSPTLCK, &zero) < 0 || ioctl(m, TIOCSWINSZ, &ws) < 0 ||
	    (sl = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 ||
	    (in && (*in = fcntl(m, F_DUPFD_CLOEXEC, 0)) < 0)) {
		int err = errno;
		close(m);
		if (sl >= 0)
			close(sl);
		errno = err;
		return -1;
	}
	fds[0] = m;
	fds[1] = sl;
	return 0;
}

/* "UID:GID[:G1,G2,...]", all decimal */
static int parse_user(const char *s, struct spawn_req *req)
{
	char *end;
	errno = 0;
	unsigned long u = strtoul(s, &end, 10);
	if (errno || end == s || *end != ':' || u > 0xfffffffeUL)
		return -1;
	s = end + 1;
	unsigned long g = strtoul(s, &end, 10);
	if (errno || end == s || (*end && *end != ':') || g > 0xfffffffeUL)
		return -1;
	req->uid = (uid_t)u;
	req->gid = (gid_t)g;
	req->ngroups = 0;
	if (!*end)
		return 0;
	s = end + 1;
	while (*s) {
		unsigned long x = strtoul(s, &end, 10);
		if (errno || end == s || (*end && *end != ',') || x > 0xfffffffeUL || req->ngroups == MAX_GROUPS)
			return -1;
		req->groups[req->ngroups++] = (gid_t)x;
		s = *end ? end + 1 : end;
	}
	return 0;
}

static void do_exec(struct conn *c, uint32_t id, const uint8_t *payload, size_t len)
{
	if (exec_by_id(c, id)) {
		reply_error(c, id, EBUSY, "request id %u already names a running exec", id);
		return;
	}
	struct rd r = { payload, len, 0 };
	uint32_t timeout_ms = rd_u32(&r), flags = rd_u32(&r);
	size_t argc = 0, envc = 0, strbytes = 0, cwd_len = 0;
	struct rd scan = r;
	while (!scan.bad && scan.n) {
		uint8_t tag = rd_u8(&scan);
		uint32_t n = rd_u32(&scan);
		const uint8_t *s = rd_bytes(&scan, n);
		if (!s)
			break;
		if (memchr(s, 0, n)) {
			reply_error(c, id, EINVAL, "exec field contains a NUL byte");
			return;
		}
		if (tag == F_ARGV)
			argc++;
		else if (tag == F_ENV)
			envc++;
		else if (tag == F_CWD)
			cwd_len = n;
		else if (tag == F_TAG && n > TAG_MAX) {
			reply_error(c, id, EINVAL, "exec tag of %u bytes is over %u", n, TAG_MAX);
			return;
		}
		strbytes += n + 1;
	}
	if (scan.bad || r.bad) {
		reply_error(c, id, EINVAL, "malformed EXEC payload");
		return;
	}
	if (argc == 0) {
		reply_error(c, id, EINVAL, "argv is empty");
		return;
	}
	/* One allocation: pointer arrays, then strings, then the PATH-search scratch buffer. */
	size_t ptrs = (argc + 1 + envc + 1) * sizeof(char *);
	char *block = malloc(ptrs + strbytes + 2 * PATH_MAX + cwd_len + 2);
	if (!block) {
		reply_error(c, id, ENOMEM, "out of memory");
		return;
	}
	char **argv = (char **)block, **envp = argv + argc + 1;
	char *sp = block + ptrs, *cwds = NULL;
	const char *path = DEFAULT_PATH;
	const char *user = NULL, *tty = NULL, *tagp = NULL;
	size_t ai = 0, ei = 0, argv0_len = 0, tag_n = 0;
	while (r.n) {
		uint8_t tag = rd_u8(&r);
		uint32_t n = rd_u32(&r);
		const uint8_t *s = rd_bytes(&r, n);
		memcpy(sp, s, n);
		sp[n] = 0;
		if (tag == F_ARGV) {
			if (ai == 0)
				argv0_len = n;
			argv[ai++] = sp;
		} else if (tag == F_ENV) {
			envp[ei++] = sp;
			if (n >= 5 && memcmp(sp, "PATH=", 5) == 0)
				path = sp + 5;
		} else if (tag == F_CWD)
			cwds = sp;
		else if (tag == F_USER)
			user = sp;
		else if (tag == F_TTY)
			tty = sp;
		else if (tag == F_TAG) {
			tagp = sp;
			tag_n = n;
		}
		sp += n + 1;
	}
	argv[ai] = NULL;
	envp[ei] = NULL;
	size_t need = strlen(path) + argv0_len + 2;
	char *pathbuf = need <= 2 * PATH_MAX ? sp : malloc(need);

	/* The parent's ends: po[0] (stdout, or the pty master), pe[0], pi[1]; the child's: po[1],
	 * pe[1], pi[0] (for a tty all three are the slave, held once in po[1]). */
	int po[2] = { -1, -1 }, pe[2] = { -1, -1 }, pi[2] = { -1, -1 };
	unsigned cols = 0, rows = 0;
	if (tty && parse_winsize(tty, &cols, &rows) < 0) {
		reply_error(c, id, EINVAL, "bad tty field %s (COLSxROWS)", tty);
		goto fail;
	}
	if (!pathbuf) {
		reply_error(c, id, ENOMEM, "out of memory");
		goto fail;
	}
	if (tty ? open_pty(po, (flags & EXEC_F_STDIN) ? &pi[1] : NULL, cols, rows) < 0
		: make_pipe(po, 0) < 0 || make_pipe(pe, 0) < 0 || ((flags & EXEC_F_STDIN) && make_pipe(pi, 1) < 0)) {
		reply_error(c, id, errno, "cannot create %s: %s", tty ? "a terminal" : "pipes", strerror(errno));
		goto fail;
	}
	struct spawn_req req = {
		.argv = argv,
		.envp = envp,
		.path = path,
		.pathbuf = pathbuf,
		.set_user = user != NULL,
		.cwd = cwds,
		.fd_in = tty			  ? po[1]
			 : (flags & EXEC_F_STDIN) ? pi[0]
						  : devnull,
		.fd_out = po[1],
		.fd_err = tty ? po[1] : pe[1],
		.tty = tty != NULL,
		.filter = system_machine ? NULL : &sandbox_filter,
	};
	if (user && parse_user(user, &req) < 0) {
		reply_error(c, id, EINVAL, "bad user field %s (UID:GID[:GID,...])", user);
		goto fail;
	}
	uint64_t start = now_ns();
	pid_t pid = spawn_child(&req);
	int cerr = errno;
	close(po[1]);
	if (pe[1] >= 0)
		close(pe[1]);
	if (pi[0] >= 0)
		close(pi[0]);
	po[1] = pe[1] = pi[0] = -1;
	if (pid < 0) {
		reply_error(c, id, cerr, "clone: %s", strerror(cerr));
		goto fail;
	}
	if (req.stage != STAGE_OK && req.stage != STAGE_EXEC) {
		/* The child has exited already; the reaper collects it as an unknown pid. */
		int err = req.err;
		if (req.stage == STAGE_CHDIR)
			reply_error(c, id, err, "chdir %s: %s", cwds, strerror(err));
		else
			reply_error(c, id, err, "%s: %s",
				    req.stage == STAGE_SECCOMP ? "seccomp"
				    : req.stage == STAGE_USER  ? "setuid"
							       : "setup",
				    strerror(err));
		goto fail;
	}
	struct exec *e = calloc(1, sizeof *e);
	if (e && tagp && !(e->tag = malloc(tag_n ? tag_n : 1))) {
		free(e);
		e = NULL;
	}
	if (!e) {
		kill(pid, SIGKILL);
		reply_error(c, id, ENOMEM, "out of memory");
		goto fail;
	}
	e->conn = c;
	e->id = id;
	e->pid = pid;
	e->keep = (flags & EXEC_F_KEEP) != 0;
	e->wait_output = (flags & EXEC_F_WAIT_OUTPUT) && !tty; /* a terminal's end is its process's */
	if (tagp) {
		memcpy(e->tag, tagp, tag_n);
		e->tag_len = (uint32_t)tag_n;
	}
	e->ns_pid = req.ns_pid > 0 ? req.ns_pid : pid;
	if (req.stage == STAGE_OK)
		oom_first(e->ns_pid);
	e->start_ns = start;
	e->tty = tty != NULL;
	e->out = (struct src){ K_OUT, po[0], 0, 0, e };
	e->err = (struct src){ K_ERR, pe[0], 0, 0, e };
	e->in = (struct src){ K_IN, pi[1], 0, 0, e };
	ep_add(&e->out, EPOLLIN);
	if (e->err.fd >= 0)
		ep_add(&e->err, EPOLLIN);
	if (e->in.fd >= 0)
		ep_add(&e->in, 0);
	/* one still waiting for its output whose pid this is now (they wrapped round) ends here, so a
	 * pid names one exec: LIST_KEPT's, ATTACH's and the host's, and its group is this one's */
	for (struct exec *o = waiting_execs ? execs : NULL; o; o = o->next)
		if (o->exited && (o->pid == pid || o->ns_pid == e->ns_pid))
			stop_waiting(o);
	exec_link(e);
	uint8_t p[4];
	put_u32(p, (uint32_t)e->ns_pid); /* the pid the command has, where it runs */
	reply(c, T_STARTED, id, p, 4);
	if (req.stage == STAGE_EXEC) {
		char msg[PATH_MAX + 64];
		int notfound = req.err == ENOENT || req.err == ENOTDIR;
		int m = snprintf(msg, sizeof msg, "snaplab: %s: %s\n", argv[0],
				 notfound ? "command not found" : strerror(req.err));
		e->flags = notfound ? EXIT_F_NOT_FOUND : EXIT_F_NOT_EXECUTABLE;
		e->exec_errno = req.err;
		size_t mlen = (size_t)(m < (int)sizeof msg ? m : (int)sizeof msg - 1);
		e->out_total += mlen;
		reply(c, T_STDERR, id, msg, mlen);
	}
	if (timeout_ms) {
		e->deadline_ns = start + (uint64_t)timeout_ms * 1000000ull;
		if (!timer_armed || e->deadline_ns < timer_armed)
			timer_update();
	}
	if (pathbuf != sp)
		free(pathbuf);
	free(block);
	return;
fail:
	for (int i = 0; i < 2; i++) {
		if (po[i] >= 0)
			close(po[i]);
		if (pe[i] >= 0)
			close(pe[i]);
		if (pi[i] >= 0)
			close(pi[i]);
	}
	if (pathbuf && pathbuf != sp)
		free(pathbuf);
	free(block);
}

static int mkdir_parents(char *path)
{
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		int rc = mkdir(path, 0755);
		*p = '/';
		if (rc < 0 && errno != EEXIST)
			return -1;
	}
	return 0;
}

static void do_file_put(struct conn *c, uint32_t id, const uint8_t *payload, size_t len)
{
	struct rd r = { payload, len, 0 };
	uint32_t mode = rd_u32(&r), plen = rd_u32(&r);
	const uint8_t *pp = rd_bytes(&r, plen);
	char *path = pp && plen ? dup_str(pp, plen) : NULL;
	if (!path) {
		reply_error(c, id, EINVAL, "malformed FILE_PUT payload");
		return;
	}
	if (!mode)
		mode = 0644;
#ifdef FUZZ
	reply(c, T_OK, id, NULL, 0); /* parsed; written nowhere (see FUZZ_EFFECT) */
	free(path);
	return;
#endif
	char tmp[PATH_MAX + 64];
	snprintf(tmp, sizeof tmp, "%s.snaplab-tmp.%d.%u", path, (int)getpid(), ++tmp_counter);
	int fd = -1;
	const char *step = "mkdir";
	if (mkdir_parents(path) < 0)
		goto err;
	step = "create";
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		goto err;
	step = "chmod";
	if (fchmod(fd, mode & 07777) < 0)
		goto err;
	step = "write";
	for (const uint8_t *d = r.p; r.n;) {
		ssize_t n = write(fd, d, r.n);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			goto err;
		}
		d += n;
		r.n -= (size_t)n;
	}
	step = "close";
	if (close(fd) < 0) {
		fd = -1;
		goto err;
	}
	fd = -1;
	step = "rename";
	if (rename(tmp, path) < 0)
		goto err;
	reply(c, T_OK, id, NULL, 0);
	free(path);
	return;
err:;
	int e = errno;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	reply_error(c, id, e, "put %s: %s: %s", path, step, strerror(e));
	free(path);
}

static void do_file_get(struct conn *c, uint32_t id, const uint8_t *payload, size_t len)
{
	char *path = len ? dup_str(payload, len) : NULL;
	if (!path) {
		reply_error(c, id, EINVAL, "malformed FILE_GET payload");
		return;
	}
	/* never a controlling terminal of the agent (a pty there), never a wait on a FIFO */
	int fd = FUZZ_EFFECT(open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK), fuzz_open(path));
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		reply_error(c, id, e, "get %s: %s", path, strerror(e));
		free(path);
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		close(fd);
		reply_error(c, id, EISDIR, "get %s: %s", path, strerror(EISDIR));
		free(path);
		return;
	}
	if (st.st_size > (off_t)FRAME_MAX_PAYLOAD) {
		close(fd);
		reply_error(c, id, EFBIG, "get %s: %lld bytes is over the %u byte frame limit", path,
			    (long long)st.st_size, FRAME_MAX_PAYLOAD);
		free(path);
		return;
	}
	struct buf *b = &c->out;
	long off = frame_begin(b, T_DATA, id);
	size_t total = 0;
	int e = off < 0 ? ENOMEM : 0;
	/* Read to EOF rather than trusting st_size: /proc and growing files lie about it. */
	while (!e) {
		size_t want =
			st.st_size > 0 && total < (size_t)st.st_size ? (size_t)st.st_size - total + 1 : READ_CHUNK;
		uint8_t *p = buf_reserve(b, want);
		if (!p) {
			e = ENOMEM;
			break;
		}
		ssize_t n = read(fd, p, want);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			e = errno;
			break;
		}
		if (n == 0)
			break;
		b->len += (size_t)n;
		total += (size_t)n;
		if (total > FRAME_MAX_PAYLOAD)
			e = EFBIG;
	}
	close(fd);
	if (e) {
		if (off >= 0)
			b->len = (size_t)off;
		reply_error(c, id, e, "get %s: %s", path, strerror(e));
	} else {
		frame_end(b, off);
		mark_dirty(c);
	}
	free(path);
}

/* Lines after the header line of a /proc/sysvipc file: System V IPC objects left in this
 * sandbox's IPC namespace (only a reader inside the namespace sees them). -1 when unreadable. */
static long sysvipc_count(const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	long lines = 0;
	int ch;
	while ((ch = fgetc(f)) != EOF)
		if (ch == '\n')
			lines++;
	fclose(f);
	return lines > 0 ? lines - 1 : 0;
}

/* Processes in this pid namespace other than the agent itself. */
static long other_processes(void)
{
	DIR *d = opendir("/proc");
	if (!d)
		return -1;
	long n = 0;
	struct dirent *de;
	pid_t self = system_machine ? 0 : getpid(); /* a system machine's agent is not in its /proc */
	while ((de = readdir(d)))
		if (de->d_name[0] >= '1' && de->d_name[0] <= '9' && atoi(de->d_name) != self)
			n++;
	closedir(d);
	return n;
}

/* Append "entries DIR <dir's mode:uid:gid> name=mode:uid:gid:size:inode,...\n" (sorted; "-" when
 * DIR cannot be read): names alone would miss an entry swapped for another of the same name. */
static int list_entries(char *out, size_t cap, const char *dir)
{
	struct dirent **names = NULL;
	struct stat st;
	int n = scandir(dir, &names, NULL, alphasort);
	size_t len = (size_t)snprintf(out, cap, "entries %s ", dir);
	if (n < 0 || lstat(dir, &st) < 0) {
		len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "-");
	} else {
		len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%o:%u:%u", st.st_mode, st.st_uid,
					st.st_gid);
		for (int i = 0; i < n; i++) {
			const char *nm = names[i]->d_name;
			if (strcmp(nm, ".") != 0 && strcmp(nm, "..") != 0 && len < cap) {
				char path[4096];
				snprintf(path, sizeof path, "%s/%s", dir, nm);
				struct stat es;
				if (lstat(path, &es) < 0)
					memset(&es, 0, sizeof es);
				len += (size_t)snprintf(out + len, cap - len, ",%s=%o:%u:%u:%lld:%llu", nm, es.st_mode,
							es.st_uid, es.st_gid, (long long)es.st_size,
							(unsigned long long)es.st_ino);
			}
		}
	}
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (len < cap)
		len += (size_t)snprintf(out + len, cap - len, "\n");
	return len < cap ? (int)len : -1;
}

/* STATUS: what a recycled sandbox must not carry to the next execution, as seen from inside:
 * processes, System V IPC objects, and the entries of the in-memory filesystems (/dev, /dev/shm,
 * /dev/mqueue, /run) that are not part of the root filesystem's volume. */
/* IDENTITY (1.3), for a machine restored from a memory snapshot, so that several restores of one
 * snapshot can run side by side: u8 flags (1: a system machine, its name goes into /etc too),
 * u8 length and the host name, 32 hex digits of machine id, then entropy to mix into the
 * kernel's pool, from which its generator is then reseeded (every restore would otherwise draw
 * the same random numbers). Done here, not
 * by a command: a restored guest's first fork and exec fault in pages and, under emulation,
 * translate code for hundreds of milliseconds (docs/agent-protocol.md). */
#ifndef FUZZ
static int set_identity(const char *hostname, const char *machine_id, const uint8_t *entropy, size_t n, int system,
			const char **step)
{
	*step = "sethostname";
	if (sethostname(hostname, strlen(hostname)) < 0)
		return -1;
	/* a regular file only, opened non-blocking (a FIFO there would stall the agent's one loop);
	 * a link is followed, as the shell this replaces did: inside a VM the guest's own business */
	*step = "/etc/machine-id";
	int f = open("/etc/machine-id", O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0444);
	if (f < 0)
		return -1;
	struct stat st;
	if (fstat(f, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(f);
		errno = EINVAL;
		return -1;
	}
	int ok = dprintf(f, "%s\n", machine_id) == 33;
	close(f);
	if (!ok) {
		errno = EIO;
		return -1;
	}
	/* The entropy comes from the host's own generator over the host's connection: it is credited
	 * (RNDADDENTROPY, as virtio-rng's would be), which makes a generator that was not yet ready
	 * (a small guest with nothing that waited on getrandom before its snapshot) ready, seeded from
	 * it. One that was ready already is rekeyed from the pool at once (RNDRESEEDCRNG): a write or
	 * a credit alone reaches it only at its next scheduled reseed, up to a minute away (a vmgenid
	 * device would tell the kernel at the restore; QEMU's restores here have none). Until then
	 * every restore of one snapshot would draw the same numbers. */
	*step = "/dev/urandom";
	f = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
	if (f < 0)
		return -1;
	int r = 0;
	if (n) {
		struct rand_pool_info *info = malloc(sizeof *info + n);
		if (!info) {
			close(f);
			errno = ENOMEM;
			return -1;
		}
		info->entropy_count = (int)(n * 8);
		info->buf_size = (int)n;
		memcpy(info->buf, entropy, n);
		*step = "RNDADDENTROPY";
		r = ioctl(f, RNDADDENTROPY, info);
		free(info);
		if (r == 0) {
			*step = "RNDRESEEDCRNG";
			r = ioctl(f, RNDRESEEDCRNG);
		}
	}
	int e = errno;
	close(f);
	if (r < 0) {
		errno = e;
		return -1;
	}
	if (system)
		name_machine(hostname);
	return 0;
}
#endif

static void do_identity(struct conn *c, uint32_t id, const uint8_t *p, size_t len)
{
	char hostname[65], machine_id[33];
	if (len < 2 || p[1] == 0 || p[1] > 64 || len < 2u + p[1] + 32 || len > 2u + p[1] + 32 + 4096 || (p[0] & ~1u)) {
		reply_error(c, id, EINVAL, "bad IDENTITY payload");
		return;
	}
	size_t hl = p[1];
	memcpy(hostname, p + 2, hl);
	hostname[hl] = 0;
	memcpy(machine_id, p + 2 + hl, 32);
	machine_id[32] = 0;
	for (size_t i = 0; i < hl; i++) {
		char ch = hostname[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
		      ch == '.' || ch == '_')) {
			reply_error(c, id, EINVAL, "bad IDENTITY host name");
			return;
		}
	}
	for (size_t i = 0; i < 32; i++) {
		char ch = machine_id[i];
		if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) {
			reply_error(c, id, EINVAL, "bad IDENTITY machine id");
			return;
		}
	}
	const uint8_t *entropy = p + 2 + hl + 32;
	size_t n = len - 2 - hl - 32;
	const char *step = "identity";
	if (FUZZ_EFFECT(set_identity(hostname, machine_id, entropy, n, p[0] & 1, &step),
			fuzz_identity(hostname, machine_id, entropy, n, p[0] & 1)) < 0)
		reply_error(c, id, errno, "%s: %s", step, strerror(errno));
	else
		reply(c, T_OK, id, NULL, 0);
}

static void do_status(struct conn *c, uint32_t id)
{
	static const char *const dirs[] = { "/dev", "/dev/shm", "/dev/mqueue", "/run", "/run/snaplab" };
	char text[16384];
	int n = snprintf(text, sizeof text, "processes %ld\nshm %ld\nsem %ld\nmsg %ld\n", other_processes(),
			 sysvipc_count("/proc/sysvipc/shm"), sysvipc_count("/proc/sysvipc/sem"),
			 sysvipc_count("/proc/sysvipc/msg"));
	for (size_t i = 0; i < sizeof dirs / sizeof *dirs && n >= 0; i++) {
		int m = list_entries(text + n, sizeof text - (size_t)n, dirs[i]);
		n = m < 0 ? -1 : n + m;
	}
	if (n < 0)
		reply_error(c, id, E2BIG, "status does not fit: too many entries");
	else
		reply(c, T_DATA, id, text, (uint32_t)n);
}

/* LIST_KEPT (1.5): each kept exec still running, oldest first: u32 pid (as the machine sees it),
 * u32 flags (bit 0 a connection holds it, bit 1 a terminal, bit 2 it has stdin), u64 its age in
 * microseconds, u32 tag length, the tag. */
static void do_list_kept(struct conn *c, uint32_t id)
{
	struct buf b = { 0 };
	struct exec *last = NULL;
	for (struct exec *e = execs; e; e = e->next)
		last = e;
	uint64_t now = now_ns();
	for (struct exec *e = last; e; e = e->prev) { /* execs is newest first */
		if (!e->keep)
			continue;
		uint8_t *p = buf_reserve(&b, 20 + e->tag_len);
		if (!p) {
			buf_free(&b);
			reply_error(c, id, ENOMEM, "out of memory");
			return;
		}
		uint32_t fl = (e->conn ? 1u : 0) | (e->tty ? 2u : 0) | (e->in.fd >= 0 ? 4u : 0);
		put_u32(p, (uint32_t)e->ns_pid);
		put_u32(p + 4, fl);
		put_u64(p + 8, (now - e->start_ns) / 1000u);
		put_u32(p + 16, e->tag_len);
		if (e->tag_len)
			memcpy(p + 20, e->tag, e->tag_len);
		b.len += 20 + e->tag_len;
	}
	reply(c, T_DATA, id, b.data ? b.data + b.off : NULL, buf_used(&b));
	buf_free(&b);
}

/* ATTACH (1.5): a kept exec that no connection holds is this connection's, under this request's
 * id: STARTED (its pid, u32 flags as LIST_KEPT's, u64 the bytes of output it has written so far:
 * where this connection's share of it starts), then its output from now on and its EXIT, and
 * STDIN, SIGNAL and RESIZE by this id, as if it had been started here. */
static void do_attach(struct conn *c, uint32_t id, const uint8_t *payload, size_t len)
{
	if (len != 4) {
		reply_error(c, id, EINVAL, "bad ATTACH payload");
		return;
	}
	if (exec_by_id(c, id)) {
		reply_error(c, id, EBUSY, "request id %u already names a running exec", id);
		return;
	}
	pid_t pid = (pid_t)get_u32(payload);
	struct exec *e = execs;
	while (e && !(e->keep && e->ns_pid == pid))
		e = e->next;
	if (!e) {
		reply_error(c, id, ESRCH, "no kept command has pid %d", (int)pid);
		return;
	}
	if (e->conn) {
		reply_error(c, id, EBUSY, "command %d is held by another connection", (int)pid);
		return;
	}
	e->conn = c;
	e->id = id;
	uint8_t p[16];
	put_u32(p, (uint32_t)e->ns_pid);
	put_u32(p + 4, (e->tty ? 2u : 0) | (e->in.fd >= 0 ? 4u : 0));
	put_u64(p + 8, e->out_total);
	reply(c, T_STARTED, id, p, sizeof p);
}

/* DETACH (1.6): let one kept exec of this connection go, as its connection's end would (a relay
 * whose client went, while the relay's own session goes on), answered by OK; ERROR ESRCH when no
 * running exec has this id here, EINVAL when it is not kept (let go, nothing would end it). */
static void do_detach(struct conn *c, uint32_t id, size_t len)
{
	struct exec *e = exec_by_id(c, id);
	if (len != 0)
		reply_error(c, id, EINVAL, "bad DETACH payload");
	else if (!e)
		reply_error(c, id, ESRCH, "no running exec has request id %u", id);
	else if (!e->keep)
		reply_error(c, id, EINVAL, "exec %u is not kept (EXEC flag bit 1)", id);
	else {
		let_go(e);
		reply(c, T_OK, id, NULL, 0);
	}
}

static void handle_frame(struct conn *c, const struct frame *f)
{
	struct rd r = { f->payload, f->len, 0 };
	switch (f->type) {
	case T_PING:
		reply(c, T_PONG, f->id, f->payload, f->len);
		break;
	case T_EXEC:
		do_exec(c, f->id, f->payload, f->len);
		break;
	case T_STDIN: {
		struct exec *e = exec_by_id(c, f->id);
		if (!e)
			break; /* finished: its EXIT settles the host's window */
		if (e->in.fd < 0 || e->in_eof) {
			/* closed (the command stopped reading) or never had stdin: dropped, and said so,
			 * or the host would wait for its window forever */
			e->unacked += f->len;
			ack_stdin(e, 1);
			break;
		}
		if (f->len == 0)
			e->in_eof = 1;
		else if (buf_append(&e->inq, f->payload, f->len) < 0) {
			reply_error(c, f->id, ENOMEM, "out of memory");
			break;
		}
		stdin_flush(e);
		if (e->in.fd >= 0 && buf_used(&e->inq) > STDIN_LIMIT) {
			/* a host that ignores the window: its input for this exec ends here */
			src_close(&e->in);
			buf_free(&e->inq);
			reply_error(c, f->id, ENOBUFS, "stdin beyond the flow-control window (%u bytes unacknowledged)",
				    STDIN_WINDOW);
		}
		break;
	}
	case T_SIGNAL: {
		uint32_t sig = rd_u32(&r);
		struct exec *e = exec_by_id(c, f->id);
		if (r.bad || sig == 0 || sig > 64)
			reply_error(c, f->id, EINVAL, "bad SIGNAL payload");
		else if (e) {
			exec_signal(e, (int)sig);
			if (sig == SIGKILL || sig == SIGTERM)
				stop_waiting(e);
		}
		break;
	}
	case T_HOLD_OUTPUT: {
		/* The relay of a VM has one stream for all its clients; one that does not read must not
		 * stop the stream (the others' output and STDIN_ACKs travel on it): the relay holds that
		 * client's execs here instead, and releases them when it has read its backlog. */
		struct exec *e = exec_by_id(c, f->id);
		if (f->len != 4) {
			reply_error(c, f->id, EINVAL, "bad HOLD_OUTPUT payload");
			break;
		}
		if (!e)
			break;
		e->held = get_u32(f->payload) != 0;
		if (!e->held && c->paused) {
			/* released while the connection itself is full: resumed with the others by conn_flush */
			e->out.paused = e->out.fd >= 0;
			e->err.paused = e->err.fd >= 0;
		}
		uint32_t want = e->held || c->paused ? 0 : EPOLLIN;
		ep_set(&e->out, want);
		ep_set(&e->err, want);
		break;
	}
	case T_RESIZE: {
		struct exec *e = exec_by_id(c, f->id);
		struct winsize ws = { 0 };
		if (f->len == 4) {
			ws.ws_col = get_u16(f->payload);
			ws.ws_row = get_u16(f->payload + 2);
		}
		if (!ws.ws_col || !ws.ws_row)
			reply_error(c, f->id, EINVAL, "bad RESIZE payload");
		else if (e && e->tty && e->out.fd >= 0)
			ioctl(e->out.fd, TIOCSWINSZ, &ws); /* the kernel sends SIGWINCH to its foreground group */
		break;
	}
	case T_FILE_PUT:
		do_file_put(c, f->id, f->payload, f->len);
		break;
	case T_FILE_GET:
		do_file_get(c, f->id, f->payload, f->len);
		break;
	case T_STATUS:
		do_status(c, f->id);
		break;
	case T_SET_CLOCK: {
		int64_t ns = (int64_t)rd_u64(&r);
		if (r.bad) {
			reply_error(c, f->id, EINVAL, "bad SET_CLOCK payload");
			break;
		}
		struct timespec ts = { .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 };
		if (ts.tv_nsec < 0) {
			ts.tv_sec--;
			ts.tv_nsec += 1000000000;
		}
		if (FUZZ_EFFECT(clock_settime(CLOCK_REALTIME, &ts), fuzz_clock_settime(CLOCK_REALTIME, &ts)) < 0)
			reply_error(c, f->id, errno, "clock_settime: %s", strerror(errno));
		else
			reply(c, T_OK, f->id, NULL, 0);
		break;
	}
	case T_IDENTITY:
		do_identity(c, f->id, f->payload, f->len);
		break;
	case T_LIST_KEPT:
		do_list_kept(c, f->id);
		break;
	case T_ATTACH:
		do_attach(c, f->id, f->payload, f->len);
		break;
	case T_DETACH:
		do_detach(c, f->id, f->len);
		break;
	case T_RESET:
		/* End the session: the host (re)connected, e.g. to a restored VM whose agent never saw
		 * the previous host go. Input before the RESET is consumed (frames are handled in
		 * order); what follows it belongs to the new session. Output already queued is whole
		 * frames of the old session and is sent before the HELLO, which marks the start. */
		detach_execs(c);
		send_hello(c, f->id);
		break;
	default:
		reply_error(c, f->id, ENOSYS, "unknown request type 0x%x", f->type);
	}
}

/* Returns what read() returned (-1 with errno EAGAIN/EINTR when there was nothing). */
static ssize_t conn_readable(struct conn *c)
{
	unsigned gen = c->gen;
	struct buf *in = &c->in;
	size_t want = READ_CHUNK;
	struct frame f;
	/* A frame in progress: make room for all of it in one go. */
	if (buf_used(in) >= FRAME_HDR && frame_parse(in->data + in->off, buf_used(in), &f) == 0)
		if (FRAME_HDR + f.len - buf_used(in) > want)
			want = FRAME_HDR + f.len - buf_used(in);
	uint8_t *p = buf_reserve(in, want);
	if (!p) {
		conn_close(c);
		return 0;
	}
	ssize_t n = read(c->s.fd, p, want);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return -1;
	if (n <= 0) {
		conn_close(c); /* a stream: its session ends, see stream_down */
		return 0;
	}
	in->len += (size_t)n;
	while (!c->dead && c->gen == gen && buf_used(in)) {
		if (c->skip) {
			size_t k = buf_used(in) < c->skip ? buf_used(in) : (size_t)c->skip;
			buf_consume(in, k);
			c->skip -= k;
			continue;
		}
		long used = frame_parse(in->data + in->off, buf_used(in), &f);
		if (used == 0)
			break;
		if (used < 0) {
			reply_error(c, f.id, EMSGSIZE, "frame payload of %u bytes is over the %u byte limit", f.len,
				    FRAME_MAX_PAYLOAD);
			buf_consume(in, FRAME_HDR);
			c->skip = f.len;
			continue;
		}
		handle_frame(c, &f);
		if (c->gen != gen)
			break; /* the session ended under us: `in` was emptied */
		buf_consume(in, (size_t)used);
	}
	return n;
}

static void on_accept(void)
{
	for (;;) {
		int fd = accept4(listen_src.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct conn *c = calloc(1, sizeof *c);
		if (!c) {
			close(fd);
			continue;
		}
		c->s = (struct src){ K_CONN, fd, 0, 0, c };
		if (ep_add(&c->s, EPOLLIN) < 0) {
			close(fd);
			free(c);
			continue;
		}
		send_hello(c, 0);
	}
}

static void send_hello(struct conn *c, uint32_t id)
{
	uint8_t hello[8 + sizeof AGENT_VERSION - 1];
	put_u16(hello, PROTO_MAJOR);
	put_u16(hello + 2, PROTO_MINOR);
	put_u32(hello + 4, (uint32_t)getpid());
	memcpy(hello + 8, AGENT_VERSION, sizeof AGENT_VERSION - 1);
	reply(c, T_HELLO, id, hello, sizeof hello);
}

static void kill_children_listed(void)
{
	char p[64], line[4096];
	/* none for a system machine's agent (its /proc has no "self"): its orphans go to systemd */
	snprintf(p, sizeof p, "/proc/self/task/%d/children", (int)getpid());
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	ssize_t n = read(fd, line, sizeof line - 1);
	close(fd);
	if (n <= 0)
		return;
	line[n] = 0;
	for (char *s = line, *end; *s; s = end) {
		long pid = strtol(s, &end, 10);
		if (end == s)
			break;
		if (pid > 0)
			kill((pid_t)pid, SIGKILL);
	}
}

static _Noreturn void shutdown_agent(void)
{
	for (struct exec *e = execs; e; e = e->next)
		exec_signal(e, SIGKILL);
	if (is_pid1)
		kill(-1, SIGKILL); /* everything in our pid namespace */
	else
		kill_children_listed(); /* adopted orphans (we are a subreaper) */
	if (sock_path)
		unlink(sock_path);
	/* Reap what we killed, briefly, so that nothing is handed to the host's init as a zombie. */
	uint64_t until = now_ns() + 500000000ull;
	while (now_ns() < until) {
		pid_t p = waitpid(-1, NULL, WNOHANG | __WALL);
		if (p < 0)
			break;
		if (p == 0) {
			struct timespec ts = { 0, 1000000 };
			nanosleep(&ts, NULL);
		}
	}
	exit(0);
}

static void on_signal(void)
{
	struct signalfd_siginfo si[16];
	int chld = 0, io = 0;
	/* One read: epoll is level-triggered, so anything left over wakes us again. */
	ssize_t n = read(signal_src.fd, si, sizeof si);
	if (n > 0) {
		for (size_t i = 0; i < (size_t)n / sizeof si[0]; i++) {
			if (si[i].ssi_signo == SIGTERM || si[i].ssi_signo == SIGINT)
				shutdown_agent();
			if (si[i].ssi_signo == SIGCHLD)
				chld = 1;
			if (si[i].ssi_signo == SIGIO)
				io = 1;
		}
	}
	if (chld)
		reap();
	if (io && stream_conn)
		stream_check(stream_conn);
}

static void ensure_std_fds(void)
{
	for (int fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0) {
			int n = open("/dev/null", O_RDWR);
			if (n >= 0 && n != fd) {
				dup2(n, fd);
				close(n);
			}
		}
}

/* One event of the loop below (the fuzz harness, fuzz/frame_fuzz.c, drives the loop through this
 * and after_events too). Not inlined: what its handlers put on the stack stays below the loop,
 * where give_back_stacks returns it, not in serve_main's own frame (~7 KiB when it was). */
static __attribute__((noinline)) void on_event(struct src *s, uint32_t ev)
{
	switch (s->kind) {
	case K_LISTEN:
		on_accept();
		break;
	case K_SIGNAL:
		on_signal();
		break;
	case K_TIMER:
		on_timer();
		break;
	case K_STREAM_TIMER: {
		uint64_t ticks;
		if (read(s->fd, &ticks, sizeof ticks) < 0) {
			/* nothing: level-triggered, and stream_check polls anyway */
		}
		stream_check(stream_conn);
		break;
	}
	case K_CONN: {
		struct conn *c = s->owner;
		if (c->down)
			break; /* went down earlier in this batch */
		if (ev & EPOLLOUT)
			conn_flush(c);
		ssize_t r = 1;
		if (!c->dead && !c->down && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
			r = conn_readable(c);
		/* A hung-up stream that had nothing left to read: don't spin on EPOLLHUP. */
		if (c->stream && !c->down && (ev & (EPOLLHUP | EPOLLERR)) && r < 0)
			stream_down(c);
		break;
	}
	case K_OUT:
	case K_ERR: {
		struct exec *e = s->owner;
		pump_once(e, s);
		if (s->fd >= 0)
			pause_check(e, s);
		else
			output_ended(e);
		break;
	}
	case K_IN: {
		struct exec *e = s->owner;
		/* the command closed its stdin: epoll reports the pipe's error for ever, so it
		 * goes now (what comes later is acknowledged as dropped) */
		if ((ev & (EPOLLERR | EPOLLHUP)) && !buf_used(&e->inq)) {
			src_close(&e->in);
			break;
		}
		stdin_flush(e);
		break;
	}
	}
}

/* After a batch of events: send what they queued, free what they closed. */
static void after_events(void)
{
	while (dirty_list) {
		struct conn *c = dirty_list;
		dirty_list = c->next_dirty;
		c->dirty = 0;
		conn_flush(c);
	}
	int freed = grave_execs || grave_conns;
	while (grave_execs) {
		struct exec *e = grave_execs;
		grave_execs = e->next_grave;
		free(e->tag);
		free(e);
	}
	while (grave_conns) {
		struct conn *c = grave_conns;
		grave_conns = c->next_grave;
		buf_free(&c->in);
		buf_free(&c->out);
		free(c);
	}
	/* an idle agent holds what it needs and no more: a connection's 64 KiB read buffers, freed
	 * below malloc's trim threshold, stayed resident (~100 KiB a sandbox, docs/benchmarks.md
	 * "Density"), and the pages a request's deeper frames or a spawn touched of the stacks stayed
	 * too (~25 KiB); a few microseconds per closed connection or ended command. (The agent links
	 * musl, whose allocator gives freed pages back by itself and has no malloc_trim; a glibc build,
	 * the fuzz harness's, trims.) */
	if (freed) {
#ifdef __GLIBC__
		malloc_trim(0);
#endif
		give_back_stacks();
	}
}

int serve_main(const char *path, int listen_fd, const char *stream_path, int stream_fd, int ready_fd, const char *caps,
	       int harden)
{
	ensure_std_fds();
	/* Commands start with umask 022, as in a Docker container or under envd's systemd, not with the
	 * umask of whatever started snaplab on the host (a CLI under 077 made files no one else inside
	 * could read) */
	umask(022);
	is_pid1 = getpid() == 1;
	/* Start from default dispositions (our parent may have ignored some), then ignore SIGPIPE. */
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_DFL;
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			sigaction(s, &sa, NULL);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGIO); /* a stream's (dis)connect, when it is down (O_ASYNC) */
	sigprocmask(SIG_BLOCK, &set, NULL);

	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0 && !is_pid1)
		fprintf(stderr, "snaplab-agent: cannot become subreaper: %s\n", strerror(errno));
	if (!system_machine && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die("no_new_privs");
	/* Not dumpable: commands (same uid, no CAP_SYS_PTRACE) cannot ptrace the agent, read its
	 * memory or take its file descriptors (pidfd_getfd) — the listening socket among them. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		die("dumpable");
	if (harden && harden_proc(1) < 0) {
		char what[192];
		snprintf(what, sizeof what, "harden /proc: %s", harden_failed);
		die(what);
	}
	if (caps && caps_restrict(caps) < 0)
		die("capability bounding set");

	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (devnull < 0) {
		/* No /dev (a bare VM rootfs): a pipe whose writer is gone reads as EOF forever. */
		int p[2];
		if (pipe2(p, O_CLOEXEC) < 0)
			die("pipe");
		close(p[1]);
		devnull = p[0];
	}

	epfd = epoll_create1(EPOLL_CLOEXEC);
	signal_src.fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	timer_src.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (epfd < 0 || signal_src.fd < 0 || timer_src.fd < 0)
		die("epoll/signalfd/timerfd");

	if (stream_path || stream_fd >= 0) {
		/* One byte stream, one connection. A virtio-serial port is opened here; an inherited
		 * fd (tests: a socketpair end) is made non-blocking and close-on-exec. */
		int fd = stream_fd;
		if (stream_path) {
			fd = open(stream_path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
			if (fd < 0)
				die(stream_path);
		} else {
			int fl = fcntl(fd, F_GETFL);
			if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
				die("stream fd");
		}
		stream_timer_src.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		stream_conn = calloc(1, sizeof *stream_conn);
		if (stream_timer_src.fd < 0 || !stream_conn || ep_add(&stream_timer_src, EPOLLIN) < 0)
			die("stream setup");
		stream_conn->s = (struct src){ K_CONN, fd, 0, 0, stream_conn };
		stream_conn->stream = 1;
		stream_conn->down = 1; /* stream_check: HELLO now if the host is there, else when it comes */
		stream_async(stream_conn, 1);
		stream_timer_set(STREAM_RECHECK_NS);
		stream_check(stream_conn);
	} else if (listen_fd >= 0) {
		/* The host made, bound and listened on the socket (on a path only it can see) and
		 * handed it over: nothing inside the sandbox can replace or redirect it. */
		int fl = fcntl(listen_fd, F_GETFL);
		if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
		    fcntl(listen_fd, F_SETFD, FD_CLOEXEC) < 0)
			die("listen fd");
		listen_src.fd = listen_fd;
	} else {
		struct sockaddr_un sun = { .sun_family = AF_UNIX };
		if (strlen(path) >= sizeof sun.sun_path) {
			errno = ENAMETOOLONG;
			die(path);
		}
		strcpy(sun.sun_path, path);
		unlink(path);
		listen_src.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (listen_src.fd < 0 || bind(listen_src.fd, (struct sockaddr *)&sun, sizeof sun) < 0 ||
		    listen(listen_src.fd, 128) < 0)
			die(path);
		sock_path = path;
	}
	if ((listen_src.fd >= 0 && ep_add(&listen_src, EPOLLIN) < 0) || ep_add(&signal_src, EPOLLIN) < 0 ||
	    ep_add(&timer_src, EPOLLIN) < 0)
		die("epoll_ctl");
	if (ready_fd >= 0) {
		if (write(ready_fd, "R", 1) != 1)
			fprintf(stderr, "snaplab-agent: ready fd %d: %s\n", ready_fd, strerror(errno));
		close(ready_fd);
	}
	/* Children that exited before we blocked SIGCHLD (none normally) */
	reap();

	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(epfd, evs, 64, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		for (int i = 0; i < n; i++) {
			struct src *s = evs[i].data.ptr;
			if (s->fd < 0)
				continue; /* closed earlier in this batch */
			on_event(s, evs[i].events);
		}
		after_events();
	}
}
