/*
 * snaplab: the command on PATH (native/build/snaplab, linked from /usr/local/bin by set-up).
 *
 * `snaplab exec SANDBOX -- argv` into a running sandbox on this host is served here: look the
 * sandbox up in state.db (read-only), connect to its agent's socket (or its VM's relay), send one
 * EXEC, stream the output, and exit with the command's code. That is a few milliseconds, where
 * starting Node alone takes 70-100 ms on the hosts this runs on, and scripts call exec in loops.
 *
 * Everything else, and every exec this file is not sure about (an option it does not know, a
 * sandbox that is not running, a socket that does not answer, an agent that refuses the command
 * before it starts), is handed to the Node CLI (dist/bin/snaplab.js) with the same arguments,
 * before anything has run: its behaviour, messages and exit codes are the reference, and this
 * path only ever takes the case where it would do exactly the same. A connection lost after the
 * command may have started is reported by the Node CLI too (`_exec-lost`), never retried.
 * SNAPLAB_NO_FAST_EXEC=1 sends every exec to Node (the bench compares the two). `--version` is
 * answered here too, from package.json.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "frame.h"
#include "queries.h" /* build/, from src/store/native-queries.sql */

#define EXIT_EXEC_FAILURE 125
#define OUT_HIGH (4u << 20) /* stop reading stdin while this much is queued for the agent */
#define STDIN_WINDOW (4u << 20) /* or this much is sent and not acknowledged (protocol 1.2) */

static const char *DEFAULT_ENV[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"TERM=xterm",
};

static char **g_argv;

/* The checkout (or package) this binary was built in: <root>/native/build/snaplab. */
static const char *package_root(void)
{
	static char root[PATH_MAX];
	if (root[0])
		return root;
	ssize_t n = readlink("/proc/self/exe", root, sizeof root - 1);
	if (n <= 0) {
		perror("snaplab: /proc/self/exe");
		exit(EXIT_EXEC_FAILURE);
	}
	root[n] = 0;
	for (int up = 0; up < 3; up++) {
		char *slash = strrchr(root, '/');
		if (slash)
			*slash = 0;
	}
	return root;
}

/* `snaplab --version`: package.json's version, as the Node CLI prints it; -1 if unreadable. */
static int print_version(void)
{
	char path[PATH_MAX + 16], text[8192];
	snprintf(path, sizeof path, "%s/package.json", package_root());
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, text, sizeof text - 1);
	close(fd);
	if (n <= 0)
		return -1;
	text[n] = 0;
	char *k = strstr(text, "\"version\"");
	if (!k)
		return -1;
	char *q = strchr(k + 9, '"');
	char *e = q ? strchr(q + 1, '"') : NULL;
	if (!q || !e || e - q > 64)
		return -1;
	printf("%.*s\n", (int)(e - q - 1), q + 1);
	return 0;
}

static _Noreturn void start_node(char **nargv)
{
	execvp("node", nargv);
	fprintf(stderr, "error[INTERNAL]: cannot start node for %s: %s\nhint: install Node.js 20 (node on PATH)\n",
		nargv[1], strerror(errno));
	exit(EXIT_EXEC_FAILURE);
}

/* `shell`, or `exec` with -t among its options: a command that puts the local terminal in raw mode. */
static int takes_terminal(char **args)
{
	if (!args[1])
		return 0;
	if (!strcmp(args[1], "shell"))
		return 1;
	if (strcmp(args[1], "exec"))
		return 0;
	for (int i = 2; args[i] && strcmp(args[i], "--"); i++) {
		const char *a = args[i];
		if (!strcmp(a, "--tty"))
			return 1;
		if (a[0] == '-' && a[1] != '-' && a[1] != 'e' && a[1] != 'u' && strchr(a, 't'))
			return 1; /* -t, -it, -ti */
	}
	return 0;
}

static volatile sig_atomic_t child_pid;
static void forward_signal(int sig)
{
	if (child_pid > 0)
		kill(child_pid, sig);
}

/*
 * The Node CLI in a child, this process waiting for it: when the child ends in any way, even by
 * SIGKILL, the local terminal is put back as it was (the child leaves it raw if it is killed).
 * If this process is killed instead, the child gets SIGTERM (PR_SET_PDEATHSIG) and restores it.
 */
static _Noreturn void supervise(char **nargv)
{
	struct termios saved;
	int have = tcgetattr(0, &saved) == 0;
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		start_node(nargv);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(EXIT_EXEC_FAILURE); /* the parent is gone already (reparented) */
		start_node(nargv);
	}
	child_pid = pid;
	struct sigaction sa = { .sa_handler = forward_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGINT, SIG_IGN); /* a key the terminal turned into a signal is the child's to handle */
	signal(SIGQUIT, SIG_IGN);
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			exit(EXIT_EXEC_FAILURE);
	if (have)
		tcsetattr(0, TCSADRAIN, &saved);
	if (WIFEXITED(status))
		exit(WEXITSTATUS(status));
	int sig = WTERMSIG(status);
	signal(sig, SIG_DFL);
	sigset_t one;
	sigemptyset(&one);
	sigaddset(&one, sig);
	sigprocmask(SIG_UNBLOCK, &one, NULL);
	raise(sig);
	exit(128 + sig);
}

/* Hand the whole command line to the Node CLI beside this binary. Does not return. */
static _Noreturn void node_cli(char **args)
{
	char script[PATH_MAX + 32];
	snprintf(script, sizeof script, "%s/dist/bin/snaplab.js", package_root());
	int argc = 0;
	while (args[argc])
		argc++;
	char **nargv = calloc((size_t)argc + 2, sizeof *nargv);
	if (!nargv)
		exit(EXIT_EXEC_FAILURE);
	nargv[0] = "node";
	nargv[1] = script;
	for (int i = 1; i < argc; i++)
		nargv[i + 1] = args[i];
	if (takes_terminal(args) && isatty(0))
		supervise(nargv);
	start_node(nargv);
}

static _Noreturn void fall_back(void)
{
	node_cli(g_argv);
}

struct opts {
	/* authorize: an ssh key the agent's connect adds first (`connect --authorize`, protocol 1.4) */
	const char *sandbox, *cwd, *timeout, *authorize;
	const char **env, **cmd;
	int nenv, ncmd, interactive, json;
};

int utf8_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		int n = *p < 0x80	      ? 0
			: (*p & 0xe0) == 0xc0 ? 1
			: (*p & 0xf0) == 0xe0 ? 2
			: (*p & 0xf8) == 0xf0 ? 3
					      : -1;
		if (n < 0 || (n == 1 && *p < 0xc2))
			return 0;
		unsigned cp = n == 0 ? *p : *p & (0x3f >> n);
		for (int k = 1; k <= n; k++) {
			if ((p[k] & 0xc0) != 0x80)
				return 0;
			cp = (cp << 6) | (p[k] & 0x3f);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		p += n + 1;
	}
	return 1;
}

/* 0 when the arguments are understood exactly as the Node CLI (commander) reads them; -1 otherwise. */
static int parse(int argc, char **argv, struct opts *o)
{
	o->env = calloc((size_t)argc, sizeof *o->env);
	o->cmd = calloc((size_t)argc, sizeof *o->cmd);
	if (!o->env || !o->cmd)
		return -1;
	int i = 2;
	for (; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--")) {
			i++;
			break;
		}
		if (a[0] != '-' || !a[1]) {
			if (!o->sandbox)
				o->sandbox = a;
			else
				o->cmd[o->ncmd++] = a;
			continue;
		}
		const char **val = NULL;
		const char *inl = NULL;
		if (!strcmp(a, "-e") || !strcmp(a, "--env"))
			val = &o->env[o->nenv++];
		else if (!strncmp(a, "--env=", 6)) {
			o->env[o->nenv++] = a + 6;
			continue;
		} else if (!strncmp(a, "-e", 2)) {
			o->env[o->nenv++] = a + 2;
			continue;
		} else if (!strcmp(a, "--cwd"))
			val = &o->cwd;
		else if (!strncmp(a, "--cwd=", 6))
			inl = a + 6, o->cwd = inl;
		else if (!strcmp(a, "--timeout"))
			val = &o->timeout;
		else if (!strncmp(a, "--timeout=", 10))
			inl = a + 10, o->timeout = inl;
		else if (!strcmp(a, "-i") || !strcmp(a, "--interactive"))
			o->interactive = 1;
		else if (!strcmp(a, "--json"))
			o->json = 1;
		else
			return -1; /* --help, combined flags, a typo: Node says what it says */
		if (val) {
			if (i + 1 >= argc)
				return -1;
			*val = argv[++i];
		}
	}
	if (i < argc && o->ncmd == 0 && !strcmp(argv[i], "--"))
		i++; /* `-- -- cmd`: the CLI drops one */
	for (; i < argc; i++)
		o->cmd[o->ncmd++] = argv[i];
	if (!o->sandbox || o->ncmd == 0)
		return -1;
	for (int k = 0; k < o->nenv; k++) {
		const char *eq = strchr(o->env[k], '=');
		if (!eq || eq == o->env[k] || !utf8_ok(o->env[k]))
			return -1;
	}
	for (int k = 0; k < o->ncmd; k++)
		if (!utf8_ok(o->cmd[k]))
			return -1;
	if (!utf8_ok(o->sandbox) || (o->cwd && !utf8_ok(o->cwd)))
		return -1;
	if (o->timeout) { /* seconds as parseSeconds takes them, /^\d+(\.\d+)?$/; spaces and the rest go to Node */
		const char *t = o->timeout;
		size_t whole = strspn(t, "0123456789");
		if (!whole || whole > 7)
			return -1;
		t += whole;
		if (*t == '.') {
			size_t frac = strspn(t + 1, "0123456789");
			if (!frac)
				return -1;
			t += 1 + frac;
		}
		if (*t)
			return -1;
	}
	return 0;
}

struct target {
	char id[64], driver[32];
	int limited;
};

static int lookup(const char *home, const char *name, struct target *t)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/state.db", home);
	sqlite3 *db;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
		sqlite3_close(db);
		return -1;
	}
	sqlite3_busy_timeout(db, 10000);
	sqlite3_stmt *st;
	int rc = -1;
	if (sqlite3_prepare_v2(db, SQL_LOOKUP_SANDBOX, -1, &st, NULL) == SQLITE_OK) {
		/* SCENARIO/MACHINE names a scenario machine, whose sandbox is SCENARIO.MACHINE (as lab.get) */
		char mapped[512];
		const char *slash = strchr(name, '/');
		if (slash && strlen(name) < sizeof mapped) {
			snprintf(mapped, sizeof mapped, "%s", name);
			mapped[slash - name] = '.';
			name = mapped;
		}
		sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
		if (sqlite3_step(st) == SQLITE_ROW) {
			const char *id = (const char *)sqlite3_column_text(st, 0);
			const char *drv = (const char *)sqlite3_column_text(st, 1);
			const char *state = (const char *)sqlite3_column_text(st, 3);
			/* the same row Node's getSandbox takes; anything but running is Node's to explain */
			if (id && drv && state && !strcmp(state, "running") && strlen(id) < sizeof t->id &&
			    strlen(drv) < sizeof t->driver && strspn(id, "0123456789abcdef") == strlen(id)) {
				strcpy(t->id, id);
				strcpy(t->driver, drv);
				t->limited = sqlite3_column_int(st, 2);
				rc = 0;
			}
		}
		sqlite3_finalize(st);
	}
	sqlite3_close(db);
	return rc;
}

/* The memory cgroup's OOM kill count, as src/host/cgroups oomKills reads it (v1, else v2 in
 * snaplab's systemd scope on a systemd host, else v2 under the root: src/host/cgroups/scope.ts);
 * 0 if unreadable. */
static long oom_kills(const char *id)
{
	static const char *const where[] = {
		"/sys/fs/cgroup/memory/snaplab/%s/memory.oom_control",
		"/sys/fs/cgroup/snaplab.slice/snaplab.scope/snaplab/%s/memory.events",
		"/sys/fs/cgroup/snaplab/%s/memory.events",
	};
	char path[PATH_MAX], line[256];
	FILE *f = NULL;
	for (size_t i = 0; !f && i < sizeof where / sizeof *where; i++) {
		snprintf(path, sizeof path, where[i], id);
		f = fopen(path, "re");
	}
	if (!f)
		return 0;
	long n = 0;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "oom_kill ", 9))
			n = strtol(line + 9, NULL, 10);
	fclose(f);
	return n;
}

static int connect_unix(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path)
		return -1;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* All of it, waiting where the fd is non-blocking (a stdout the caller made so); -1 with errno. */
static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN) {
			struct pollfd pf = { .fd = fd, .events = POLLOUT };
			poll(&pf, 1, -1);
			continue;
		}
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/*
 * The command's output could not be written (a reader that went away: `| head`): stop, as a
 * command writing to a closed pipe does. Closing the connection makes the agent kill the command.
 * The Node path does the same (src/cli/exec.ts).
 */
static _Noreturn void output_failed(int sock)
{
	int e = errno;
	close(sock);
	if (e == EPIPE)
		exit(141);
	const char *name = strerrorname_np(e);
	fprintf(stderr,
		"error[OUTPUT_FAILED]: cannot write the command's output (%s)\nhint: is there room where stdout goes?\n",
		name ? name : "error");
	exit(EXIT_EXEC_FAILURE);
}

/* Read until one whole frame is in `in` (by the CLOCK_MONOTONIC deadline, ms); its length, or -1
 * on EOF, error, an oversize frame or the deadline. */
static long read_frame(int fd, struct buf *in, struct frame *f, long deadline_ms)
{
	for (;;) {
		long used = frame_parse(in->data + in->off, buf_used(in), f);
		if (used != 0)
			return used;
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		long left = deadline_ms - (now.tv_sec * 1000 + now.tv_nsec / 1000000);
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
			return -1;
		uint8_t *room = buf_reserve(in, 65536);
		if (!room)
			return -1;
		ssize_t r = read(fd, room, 65536);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		in->len += (size_t)r;
	}
}

static void put_field(struct buf *b, uint8_t tag, const char *s)
{
	size_t n = strlen(s);
	uint8_t *p = buf_reserve(b, 5 + n);
	if (!p)
		exit(EXIT_EXEC_FAILURE);
	p[0] = tag;
	put_u32(p + 1, (uint32_t)n);
	memcpy(p + 5, s, n);
	b->len += 5 + n;
}

/* DEFAULT_ENV, then --env entries: a later KEY replaces an earlier one in its place (mergeEnv). */
static void put_env(struct buf *b, const struct opts *o)
{
	int n = 3 + o->nenv;
	const char **all = calloc((size_t)n, sizeof *all);
	int m = 0;
	if (!all)
		exit(EXIT_EXEC_FAILURE);
	for (int i = 0; i < n; i++) {
		const char *kv = i < 3 ? DEFAULT_ENV[i] : o->env[i - 3];
		size_t klen = (size_t)(strchr(kv, '=') - kv);
		int j = 0;
		for (; j < m; j++)
			if (!strncmp(all[j], kv, klen + 1))
				break;
		all[j] = kv;
		if (j == m)
			m++;
	}
	for (int j = 0; j < m; j++)
		put_field(b, F_ENV, all[j]);
	free(all);
}

static _Noreturn void exec_lost(const struct opts *o)
{
	char *args[] = { "snaplab", "_exec-lost", (char *)o->sandbox, o->json ? "--json" : NULL, NULL };
	node_cli(args);
}

/* The agent's ERROR for the exec, reported by the Node CLI as its own exec reports it. */
static _Noreturn void exec_refused(const struct opts *o, const struct frame *f)
{
	char code[16], *msg = NULL;
	if (f->len < 4 || asprintf(&msg, "%.*s", (int)(f->len - 4), (const char *)f->payload + 4) < 0)
		exec_lost(o);
	snprintf(code, sizeof code, "%d", (int)get_u32(f->payload));
	char *args[] = { "snaplab", "_exec-error", code, msg, o->json ? "--json" : NULL, NULL };
	node_cli(args);
	exit(EXIT_EXEC_FAILURE);
}

static int fast_exec(const struct opts *o)
{
	const char *home = getenv("SNAPLAB_HOME");
	if (!home || !*home)
		home = "/var/lib/snaplab"; /* set but empty is unset, as the Node CLI reads it (envHome) */
	struct target t;
	if (lookup(home, o->sandbox, &t) < 0)
		return -1;
	int vm = !strcmp(t.driver, "qemu");
	if (!vm && strcmp(t.driver, "namespaces"))
		return -1;
	char sock[PATH_MAX];
	snprintf(sock, sizeof sock, "%s/run/%s/%s", home, t.id, vm ? "relay.sock" : "agent.sock");
	int fd = connect_unix(sock);
	if (fd < 0)
		return -1;
	signal(SIGPIPE, SIG_IGN);

	struct buf in = { 0 }, out = { 0 };
	struct frame f;
	long used;
	/* a VM's relay: RESET, then everything up to the HELLO that answers it is another session's */
	uint32_t reset_id = 0;
	unsigned minor = 0;
	if (vm) {
		while (!reset_id)
			if (getrandom(&reset_id, sizeof reset_id, 0) != sizeof reset_id)
				return -1;
		uint8_t hdr[FRAME_HDR];
		put_u32(hdr, 0), put_u16(hdr + 4, T_RESET), put_u16(hdr + 6, 0), put_u32(hdr + 8, reset_id);
		if (write_all(fd, hdr, sizeof hdr) < 0)
			return -1;
	}
	/* the agent answers at once unless it is stuck (a sandbox paused meanwhile): Node's 5 s, then Node */
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	long deadline = t0.tv_sec * 1000 + t0.tv_nsec / 1000000 + 5000;
	for (;;) {
		if ((used = read_frame(fd, &in, &f, deadline)) <= 0)
			return -1;
		int hello = f.type == T_HELLO && f.id == reset_id;
		int refused = f.type == T_ERROR && vm && f.id == reset_id;
		int major_ok = hello && f.len >= 4 &&
			       get_u16(f.payload) == PROTO_MAJOR; /* read before the frame is consumed */
		if (hello && f.len >= 4)
			minor = get_u16(f.payload + 2);
		buf_consume(&in, (size_t)used);
		if (refused || (hello && !major_ok))
			return -1;
		if (hello)
			break;
	}

	long oom_before = t.limited ? oom_kills(t.id) : 0;
	uint32_t timeout_ms = 0;
	if (o->timeout) { /* parseSeconds rounds to ms, encodeExec makes it 1..0xffffffff */
		double ms = floor(strtod(o->timeout, NULL) * 1000 + 0.5);
		timeout_ms = ms < 1 ? 1 : ms > 4294967295.0 ? 0xffffffffu : (uint32_t)ms;
	}
	long start = frame_begin(&out, T_EXEC, 1);
	uint8_t *p = buf_reserve(&out, 8);
	if (start < 0 || !p)
		return -1;
	put_u32(p, timeout_ms);
	put_u32(p + 4, o->interactive ? EXEC_F_STDIN : 0);
	out.len += 8;
	for (int i = 0; i < o->ncmd; i++) {
		/* after `agent connect`: an older agent's connect would refuse the flag (it keeps its key) */
		if (i == 2 && o->authorize && minor >= 4)
			put_field(&out, F_ARGV, "--authorize"), put_field(&out, F_ARGV, o->authorize);
		put_field(&out, F_ARGV, o->cmd[i]);
	}
	put_env(&out, o);
	if (o->cwd)
		put_field(&out, F_CWD, o->cwd);
	frame_end(&out, start);
	if (write_all(fd, out.data + out.off, buf_used(&out)) < 0)
		exec_lost(o);
	buf_consume(&out, buf_used(&out));

	/* from here the command may be running: a failure is reported, never retried */
	int started = 0, stdin_open = o->interactive;
	/* stdin sent ahead of the agent's STDIN_ACKs (1.2; an older agent is paced by the socket) */
	uint64_t unacked = 0;
	if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0)
		exec_lost(o);
	for (;;) {
		while ((used = frame_parse(in.data + in.off, buf_used(&in), &f)) > 0) {
			if (f.id == 1)
				switch (f.type) {
				case T_STARTED:
					started = 1;
					break;
				case T_STDOUT:
					if (write_all(1, f.payload, f.len) < 0)
						output_failed(fd);
					break;
				case T_STDERR:
					if (write_all(2, f.payload, f.len) < 0)
						output_failed(fd);
					break;
				case T_STDIN_ACK:
					if (f.len >= 4) {
						uint32_t n = get_u32(f.payload);
						unacked = n > unacked ? 0 : unacked - n;
					}
					break;
				case T_ERROR:
					/* refused (a bad --cwd), or ended by the relay: the Node CLI says so, as it
				 * would have; it is not run again (through a VM's relay it may have started) */
					exec_refused(o, &f);
					break;
				case T_EXIT: {
					if (f.len < EXIT_PAYLOAD)
						exec_lost(o);
					int32_t code = (int32_t)get_u32(f.payload),
						sig = (int32_t)get_u32(f.payload + 4);
					uint32_t flags = get_u32(f.payload + 8);
					int timed_out = (flags & EXIT_F_TIMED_OUT) != 0;
					int rc = timed_out ? 124 : sig > 0 ? 128 + sig : code;
					/* SIGKILL, of the command or (a shell's 137) of the child it waited for */
					if (!timed_out && (sig == 9 || (sig <= 0 && code == 128 + 9)) && t.limited &&
					    oom_kills(t.id) > oom_before)
						fputs("snaplab: the command was killed by the OOM killer (sandbox memory limit)\n",
						      stderr);
					else if (timed_out)
						fprintf(stderr, "snaplab: timed out after %s s; killed\n", o->timeout);
					return rc & 0xff;
				}
				}
			buf_consume(&in, (size_t)used);
		}
		if (used < 0)
			exec_lost(o);
		struct pollfd pf[2] = { { .fd = fd, .events = POLLIN | (buf_used(&out) ? POLLOUT : 0) },
					{ .fd = 0, .events = POLLIN } };
		int may_send = buf_used(&out) < OUT_HIGH && (minor < 2 || unacked < STDIN_WINDOW);
		int n = poll(pf, started && stdin_open && may_send ? 2 : 1, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			exec_lost(o);
		if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
			uint8_t *room = buf_reserve(&in, 65536);
			if (!room)
				exec_lost(o);
			ssize_t r = read(fd, room, 65536);
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
				exec_lost(o);
			if (r > 0)
				in.len += (size_t)r;
		}
		if (pf[1].revents) {
			uint8_t chunk[65536];
			ssize_t r = read(0, chunk, sizeof chunk);
			if (r < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			if (r <= 0)
				stdin_open = 0, r = 0; /* end of input: an empty STDIN */
			if (frame_put(&out, T_STDIN, 1, chunk, (size_t)r) < 0)
				exec_lost(o);
			unacked += (uint64_t)r;
		}
		if (buf_used(&out)) {
			ssize_t w = send(fd, out.data + out.off, buf_used(&out), MSG_NOSIGNAL);
			if (w < 0 && errno != EAGAIN && errno != EINTR)
				exec_lost(o);
			if (w > 0)
				buf_consume(&out, (size_t)w);
		}
	}
}

/*
 * SNAPLAB_HOST names the daemon of this very home by its default socket ($SNAPLAB_HOME/daemon.sock):
 * its sandboxes are this host's, recorded in this state.db, so exec reaches them directly as
 * without a daemon (whoever can open that socket is root already). Anything this path does not
 * take still goes to the Node CLI, and so through the daemon.
 */
static int daemon_is_local(const char *host)
{
	const char *home = getenv("SNAPLAB_HOME");
	char sock[PATH_MAX], a[PATH_MAX], b[PATH_MAX];
	if (strncmp(host, "unix:", 5) || strlen(host + 5) >= sizeof sock)
		return 0;
	strcpy(sock, host + 5);
	char *slash = strrchr(sock, '/');
	if (!slash || strcmp(slash, "/daemon.sock"))
		return 0;
	*slash = 0;
	return realpath(*sock ? sock : "/", a) && realpath(home && *home ? home : "/var/lib/snaplab", b) &&
	       !strcmp(a, b);
}

/* The home's ssh public key (HOME/ssh/id_ed25519.pub), its one line, or -1 when there is none. */
static int home_key(char *key, size_t size)
{
	const char *home = getenv("SNAPLAB_HOME");
	char path[PATH_MAX];
	if (snprintf(path, sizeof path, "%s/ssh/id_ed25519.pub", home && *home ? home : "/var/lib/snaplab") >=
	    (int)sizeof path)
		return -1;
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	int ok = fgets(key, (int)size, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	key[strcspn(key, "\r\n")] = 0;
	return key[0] ? 0 : -1;
}

int main(int argc, char **argv)
{
	g_argv = argv;
	const char *all_off = getenv("SNAPLAB_NO_FAST"), *off = getenv("SNAPLAB_NO_FAST_EXEC");
	int any = !(all_off && *all_off && strcmp(all_off, "0"));
	if (any && argc == 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) && print_version() == 0)
		return 0;
	int fast = any && !(off && *off && strcmp(off, "0"));
	/* with a daemon to talk to (SNAPLAB_HOST, or --host before the command), every command goes
	 * through it: create, rm and ls from here (daemon.c), exec into a sandbox of this home directly
	 * when it is this home's daemon (daemon_is_local), the rest by the Node CLI */
	const char *host = getenv("SNAPLAB_HOST");
	int verb = 1;
	if (argc > 3 && !strcmp(argv[1], "--host"))
		host = argv[2], verb = 3;
	if (host && *host) {
		int rc = -1;
		if (any && argc > verb && !strcmp(argv[verb], "create"))
			rc = daemon_create(argc, argv, verb + 1, host);
		else if (any && argc > verb && !strcmp(argv[verb], "rm"))
			rc = daemon_rm(argc, argv, verb + 1, host);
		else if (any && argc > verb && !strcmp(argv[verb], "ls"))
			rc = daemon_ls(argc, argv, verb + 1, host);
		if (rc >= 0)
			return rc;
		if (verb != 1 || !daemon_is_local(host))
			fall_back();
	}
	if (verb != 1)
		fall_back();
	/* `snaplab proxy MACHINE PORT` (ssh's ProxyCommand) is `exec -i MACHINE -- agent connect PORT` */
	if (argc == 4 && !strcmp(argv[1], "proxy") && fast && argv[3][0] &&
	    strspn(argv[3], "0123456789") == strlen(argv[3]) && strlen(argv[3]) <= 5 && atoi(argv[3]) >= 1 &&
	    atoi(argv[3]) <= 65535 && argv[3][0] != '0' && utf8_ok(argv[2]) && argv[2][0] != '-') {
		static const char *cmd[4] = { "/run/snaplab/agent", "connect", NULL, NULL };
		static char key[16384];
		cmd[2] = argv[3];
		struct opts o = { .sandbox = argv[2], .cmd = cmd, .ncmd = 3, .interactive = 1 };
		/* ssh: the home's key (made by `inventory` or `ssh-config`) is given again first, should a
		 * reset or restore have taken it away (the agent's connect --authorize) */
		if (!strcmp(argv[3], "22") && home_key(key, sizeof key) == 0)
			o.authorize = key;
		int rc = fast_exec(&o);
		if (rc >= 0)
			return rc;
	}
	if (argc > 2 && !strcmp(argv[1], "exec") && fast) {
		struct opts o = { 0 };
		if (parse(argc, argv, &o) == 0) {
			int rc = fast_exec(&o);
			if (rc >= 0)
				return rc;
		}
	}
	fall_back();
}
