/*
 * libFuzzer harness: the relay's routing (relay.c), fed what four clients and the VM's agent send
 * it, interleaved, in chunks of any size, with clients connecting and going.
 *
 * relay.c is compiled into this file (its static functions and state) unchanged. Its loop reads a
 * socket into a client's or the agent's input buffer and calls frames() on it; here the bytes
 * are appended to the same buffer and the same frames() runs (client_frame, agent_frame, the
 * oversized-frame skip). A client connects, as relay_main's accept does (a free slot, HELLO id 0
 * with the agent's payload), the first time it sends, on /dev/null instead of a socket; it goes
 * through close_client(), as when its socket reads EOF. An agent frame that frames() refuses ends
 * the input: the relay exits there. The agent's HELLO is that of a 1.6 agent (it lets kept execs go:
 * DETACH).
 *
 * Input: a sequence of operations, each a byte OP and a byte N:
 *   OP % 8 = 0..3  client OP % 8 sends the next N + 1 bytes
 *   OP % 8 = 4..6  the agent sends the next N + 1 bytes
 *   OP % 8 = 7     client N % 4 disconnects
 * At the end every client disconnects.
 *
 * Checked beyond what ASan and UBSan see (abort() on a failure): what the relay queues for a
 * client and for the agent is always whole frames; no route in flight belongs to a client that
 * has gone or shares its relay id with another; after an input nothing is left open.
 */
#include "../relay.c"

#define NCLIENTS 4

static int fd_floor(void)
{
	int fd = fcntl(0, F_DUPFD_CLOEXEC, 0);
	close(fd);
	return fd;
}

/* b holds whole frames only; the peer reads them all */
static void drain(struct buf *b)
{
	struct frame f;
	while (buf_used(b)) {
		long used = frame_parse(b->data + b->off, buf_used(b), &f);
		if (used <= 0)
			abort(); /* a torn or oversized frame queued */
		buf_consume(b, (size_t)used);
	}
}

static void check_routes(void)
{
	if (nroutes < 0 || nroutes > MAX_ROUTES)
		abort();
	for (int i = 0; i < nroutes; i++) {
		int ci = routes[i].client;
		if (ci < -1 || ci >= NCLIENTS || (ci >= 0 && clients[ci].fd < 0))
			abort(); /* a route of a client that has gone: its answer would reach the next one */
		if (ci < 0)
			continue;
		for (int j = i + 1; j < nroutes; j++)
			if (routes[j].client >= 0 && routes[j].relay_id == routes[i].relay_id)
				abort();
	}
}

static void client_connects(int ci)
{
	clients[ci].fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (clients[ci].fd < 0)
		abort();
	clients[ci].events = EPOLLIN;
	frame_put(&clients[ci].out, T_HELLO, 0, hello, hello_len);
}

static void reset(void)
{
	static const uint8_t hello16[] = { 1, 0, 6, 0, 1, 0, 0, 0, '0', '.', '1', '.', '0' };
	for (int i = 0; i < MAX_CLIENTS; i++)
		clients[i] = (struct client){ .fd = -1 };
	nroutes = 0;
	next_id = 1;
	resync_id = 0;
	hold = held_reported = 0;
	memcpy(hello, hello16, sizeof hello16);
	hello_len = sizeof hello16;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int floor = fd_floor();
	reset();
	int agent_gone = 0;
	for (size_t i = 0; i + 1 < size && !agent_gone;) {
		uint8_t op = data[i], n = data[i + 1];
		i += 2;
		int who = op % 8;
		if (who == 7) {
			close_client(n % NCLIENTS);
		} else {
			size_t len = (size_t)n + 1 < size - i ? (size_t)n + 1 : size - i;
			struct buf *in = who < NCLIENTS ? &clients[who].in : &agent_in;
			if (who < NCLIENTS && clients[who].fd < 0)
				client_connects(who);
			if (buf_append(in, data + i, len) < 0)
				abort();
			i += len;
			if (who < NCLIENTS)
				frames(in, who); /* never -1 for a client */
			else if (frames(in, -1) < 0)
				agent_gone = 1; /* relay_main exits */
		}
		check_routes();
		for (int ci = 0; ci < NCLIENTS; ci++)
			drain(&clients[ci].out);
		drain(&agent_out);
	}
	for (int ci = 0; ci < NCLIENTS; ci++)
		close_client(ci);
	check_routes();
	drain(&agent_out);
	buf_free(&agent_in);
	buf_free(&agent_out);
	if (fd_floor() != floor)
		abort();
	return 0;
}
