/*
 * libFuzzer harness: the agent's frame decoder and request handlers (serve.c, frame.c), fed what
 * a host sends on one connection, in chunks of any size, with its commands exiting in between.
 *
 * serve.c is compiled into this file (its static functions and state), with -DFUZZ, and driven
 * through its own loop: a socketpair is the connection, registered in the agent's epoll set as
 * on_accept does; each chunk is written to it, then on_event() runs for every ready source and
 * after_events() sends the replies and frees what was closed, as serve_main's loop does. What is
 * not the agent's parsing is replaced, and nothing else:
 *   - spawn_child (sandbox.c is not linked): the command is not run. It gets a pid above the
 *     kernel's PID_MAX_LIMIT (2^22), so the agent's kill()s find nothing (ESRCH), nor does the
 *     /proc walk that kills a terminal's session; it writes its argv[1] to its stdout, and with
 *     argv[0] beginning with '<' keeps its stdin open without reading it; '!', '?', '%', '#'
 *     fail it as a real child reports chdir, exec (ENOENT, EACCES) and setuid failures. The
 *     process "exits" when an input says so (exec_finish, as reap() calls it), and at the end
 *     of every input.
 *   - FILE_PUT writes nothing, FILE_GET reads a memfd made up from its path, SET_CLOCK sets no
 *     clock, IDENTITY no name (FUZZ_EFFECT in serve.c): the fuzzer runs as root on the host.
 * Pipes and pseudo-terminals are real (TIOCSWINSZ, /dev/ptmx), and STATUS reads this host's
 * /proc and /dev. The frame limit is 1 MiB in this build (frame.h says why).
 *
 * Input: a sequence of operations, each one byte:
 *   0x00-0x7f  the next (byte + 1) bytes are written to the connection
 *   0x80-0xff  an exec exits: the ((byte & 7) mod count)-th of the agent's execs, newest first;
 *              bit 6 clear: exit code (byte >> 3) & 7; set: killed by a signal of SIGNALS
 * At the end the host closes its side (the agent sees EOF) and the remaining commands exit.
 *
 * Checked beyond what ASan and UBSan see (abort() on a failure): every byte the agent sends is a
 * whole frame of a response type with a payload of its type's size; per request id, STARTED
 * only when no exec of that id runs, STDOUT, STDERR, STDIN_ACK and EXIT only while one does
 * (a HELLO starts a session: RESET detaches the execs of the last, which send nothing more, but
 * a kept one, which an ATTACH of the new session may take on);
 * what spawn_child is given is a request it can carry out (at most MAX_GROUPS groups, an argv);
 * after an input no exec, connection or file descriptor is left.
 */
#include "../serve.c"

#include <sys/mman.h>

#define FAKE_PID_BASE (1 << 23)
static const int SIGNALS[8] = { SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGSEGV, SIGPIPE, SIGALRM, SIGABRT };

/* sandbox.c's other entry points: only serve_main calls them */
const struct sock_fprog sandbox_filter;
int caps_restrict(const char *list)
{
	abort();
}
int harden_proc(int dev_readonly)
{
	abort();
}
/* after_events calls it: returning an idle agent's stack pages is no parsing, and would give
 * back the fuzzer's */
void give_back_stacks(void)
{
}

/* stdin ends kept open by '<' commands, closed when they exit */
static struct {
	pid_t pid;
	int fd;
} kept[256];
static int nkept;
static pid_t next_pid;

pid_t spawn_child(struct spawn_req *r)
{
	static const struct {
		char c;
		int stage, err;
	} fails[] = {
		{ '!', STAGE_CHDIR, ENOENT },
		{ '?', STAGE_EXEC, ENOENT },
		{ '%', STAGE_EXEC, EACCES },
		{ '#', STAGE_USER, EPERM },
	};
	if (r->ngroups < 0 || r->ngroups > MAX_GROUPS || !r->argv[0])
		abort(); /* a bad request: groups[] is followed by the other fields, where ASan does not look */
	r->stage = STAGE_OK;
	r->err = 0;
	r->ns_pid = 0;
	for (size_t i = 0; i < sizeof fails / sizeof *fails; i++)
		if (r->argv[0][0] == fails[i].c) {
			r->stage = fails[i].stage;
			r->err = fails[i].err;
		}
	if (r->stage != STAGE_OK && r->stage != STAGE_EXEC)
		return FAKE_PID_BASE + next_pid++; /* exited at once: never reaped by the agent */
	pid_t pid = FAKE_PID_BASE + next_pid++;
	/* a few hundred bytes always fit in a fresh pipe or terminal: the write never blocks */
	if (r->stage == STAGE_OK && r->argv[1]) {
		size_t n = strlen(r->argv[1]);
		if (write(r->fd_out, r->argv[1], n < 256 ? n : 256) < 0)
			abort();
	}
	if (r->stage == STAGE_OK && r->argv[0][0] == '<' && nkept < 256 && r->fd_in != devnull) {
		kept[nkept].pid = pid;
		kept[nkept++].fd = fcntl(r->fd_in, F_DUPFD_CLOEXEC, 0);
	}
	return pid;
}

static void unkeep(pid_t pid)
{
	for (int i = 0; i < nkept; i++)
		if (kept[i].pid == pid) {
			close(kept[i].fd);
			kept[i] = kept[--nkept];
			return;
		}
}

int fuzz_open(const char *path)
{
	size_t n = strlen(path);
	if (n && path[n - 1] == '/')
		return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* a directory: EISDIR */
	if (strstr(path, "missing")) {
		errno = ENOENT;
		return -1;
	}
	int fd = memfd_create("fuzz-file", MFD_CLOEXEC);
	if (fd < 0)
		abort();
	if (strncmp(path, "/big", 4) == 0) {
		/* sparse, over the frame limit: refused on its size, never read */
		if (ftruncate(fd, (off_t)FRAME_MAX_PAYLOAD + 1) < 0)
			abort();
		return fd;
	}
	/* the path, repeated: a few bytes to a few kB */
	for (size_t i = 0; n && i < (n * 31) % 5000; i += n)
		if (write(fd, path, n) != (ssize_t)n)
			abort();
	lseek(fd, 0, SEEK_SET);
	return fd;
}

int fuzz_clock_settime(clockid_t clock, const struct timespec *ts)
{
	if (ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000)
		abort(); /* handle_frame normalises the nanoseconds */
	if (ts->tv_sec < 0) {
		errno = EINVAL; /* as the kernel answers */
		return -1;
	}
	return 0;
}

/* IDENTITY sets nothing here; what do_identity checked is checked again */
int fuzz_identity(const char *hostname, const char *machine_id, const uint8_t *entropy, size_t n, int system)
{
	size_t hl = strlen(hostname);
	if (hl == 0 || hl > 64 || strlen(machine_id) != 32 || (n && !entropy) || (system & ~1))
		abort();
	return 0;
}

/* ---- what the agent sends ---- */

static struct buf seen; /* bytes from the agent not yet parsed */
static int host_eof; /* the agent closed the connection */
static struct exec_id {
	uint32_t id;
	int running;
} * ids; /* request ids that frames of an exec used */
static size_t nids, ids_cap;

static int *running_of(uint32_t id)
{
	for (size_t i = 0; i < nids; i++)
		if (ids[i].id == id)
			return &ids[i].running;
	if (nids == ids_cap) {
		ids_cap = ids_cap ? 2 * ids_cap : 64;
		ids = realloc(ids, ids_cap * sizeof *ids);
		if (!ids)
			abort();
	}
	ids[nids] = (struct exec_id){ id, 0 };
	return &ids[nids++].running;
}

static int trace; /* FRAME_FUZZ_TRACE=1: each response on stderr (to read what an input does) */

static void check_frame(const struct frame *f)
{
	if (trace)
		fprintf(stderr, "agent: type 0x%02x id %u len %u %.*s\n", f->type, f->id, f->len,
			f->type == T_ERROR && f->len > 4 ? (int)f->len - 4 : 0, (const char *)f->payload + 4);
	int exec_frame = f->type == T_STARTED || f->type == T_STDOUT || f->type == T_STDERR || f->type == T_STDIN_ACK ||
			 f->type == T_EXIT;
	int *running = exec_frame ? running_of(f->id) : NULL;
	switch (f->type) {
	case T_HELLO:
		if (f->len != 8 + sizeof AGENT_VERSION - 1)
			abort();
		nids = 0; /* a session starts (RESET's answer): the old one's execs send nothing more */
		break;
	case T_PONG:
	case T_DATA:
	case T_OK:
		break;
	case T_ERROR:
		if (f->len < 4)
			abort();
		break;
	case T_STARTED:
		/* an EXEC's is its pid; an ATTACH's (1.5) adds flags and the output count */
		if ((f->len != 4 && f->len != 16) || *running)
			abort(); /* an EXEC of an id that still runs is refused (EBUSY) */
		/* an ATTACH's: one of the harness's pids, flags bit 0 (held) clear: it is this connection's now */
		if (f->len == 16 && (get_u32(f->payload) < FAKE_PID_BASE || (get_u32(f->payload + 4) & 1)))
			abort();
		*running = 1;
		break;
	case T_STDOUT:
	case T_STDERR:
		if (!*running)
			abort();
		break;
	case T_STDIN_ACK:
		if (f->len != 4 || !*running)
			abort();
		break;
	case T_EXIT:
		if (f->len != EXIT_PAYLOAD || !*running)
			abort();
		*running = 0;
		break;
	default:
		abort(); /* not a response */
	}
}

/* Read what the agent sent (the host end is non-blocking) and check every whole frame. */
static void host_read(int host)
{
	for (;;) {
		uint8_t *p = buf_reserve(&seen, 65536);
		if (!p)
			abort();
		ssize_t n = read(host, p, 65536);
		if (n == 0)
			host_eof = 1;
		if (n <= 0)
			break;
		seen.len += (size_t)n;
	}
	struct frame f;
	long used;
	while (buf_used(&seen) && (used = frame_parse(seen.data + seen.off, buf_used(&seen), &f)) > 0) {
		check_frame(&f);
		buf_consume(&seen, (size_t)used);
	}
}

/* Run the agent's loop until nothing is ready, reading its replies as they come. */
static void settle(int host)
{
	struct epoll_event evs[64];
	for (int round = 0; round < 64; round++) {
		int n = epoll_wait(epfd, evs, 64, 0);
		for (int i = 0; i < n; i++) {
			struct src *s = evs[i].data.ptr;
			if (s->fd >= 0)
				on_event(s, evs[i].events);
		}
		after_events();
		host_read(host);
		if (n <= 0)
			return;
	}
}

static void command_exits(struct exec *e, int status)
{
	struct rusage ru = { .ru_utime = { 0, 1500 }, .ru_maxrss = 1024 };
	unkeep(e->pid);
	exec_finish(e, status, &ru);
}

/* the lowest free file descriptor */
static int fd_floor(void)
{
	int fd = fcntl(0, F_DUPFD_CLOEXEC, 0);
	close(fd);
	return fd;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	signal(SIGPIPE, SIG_IGN); /* as serve_main does */
	trace = getenv("FRAME_FUZZ_TRACE") != NULL;
	epfd = epoll_create1(EPOLL_CLOEXEC);
	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (epfd < 0 || devnull < 0)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int floor = fd_floor();
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	int host = sv[1];
	/* the connection, as on_accept makes it */
	struct conn *c = calloc(1, sizeof *c);
	if (!c)
		abort();
	c->s = (struct src){ K_CONN, sv[0], 0, 0, c };
	if (ep_add(&c->s, EPOLLIN) < 0)
		abort();
	send_hello(c, 0);
	next_pid = 0;
	nids = 0;
	host_eof = 0;
	settle(host);

	for (size_t i = 0; i < size;) {
		uint8_t op = data[i++];
		if (op < 0x80) {
			size_t n = (size_t)op + 1 < size - i ? (size_t)op + 1 : size - i;
			if (n && write(host, data + i, n) != (ssize_t)n)
				abort(); /* at most 128 bytes at a time, read at once: room in the socket */
			i += n;
		} else {
			int count = 0;
			for (struct exec *e = execs; e; e = e->next)
				count++;
			if (count) {
				struct exec *e = execs;
				for (int k = (op & 7) % count; k > 0; k--)
					e = e->next;
				int v = (op >> 3) & 7;
				command_exits(e, op & 0x40 ? SIGNALS[v] : v << 8);
			}
		}
		settle(host);
	}

	/* the host goes: the agent reads EOF, closes the connection and kills its commands */
	shutdown(host, SHUT_WR);
	settle(host);
	if (!host_eof)
		abort(); /* EOF always ends a connection (c is freed by now) */
	while (execs)
		command_exits(execs, SIGKILL);
	after_events();
	host_read(host);
	if (buf_used(&seen))
		abort(); /* a torn frame */
	close(host);
	buf_free(&seen);
	while (nkept)
		unkeep(kept[0].pid);
	/* everything the input opened is closed again */
	if (fd_floor() != floor || dirty_list || grave_conns || grave_execs)
		abort();
	return 0;
}
