/*
 * snaplab agent protocol: framing and payload helpers.
 *
 * Transport-independent on purpose: nothing here knows about sockets, so the same code can
 * serve a Unix socket (namespace driver) or a serial/vsock byte stream (VM drivers).
 * See docs/agent-protocol.md.
 */
#ifndef SNAPLAB_FRAME_H
#define SNAPLAB_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_MAJOR 1
#define PROTO_MINOR 8
#define AGENT_VERSION "0.1.0"

#define FRAME_HDR 12u
/* make fuzz lowers it to 1 MiB (-D): the agent makes room for a whole announced frame at once,
 * which under ASan costs ~60 ms at 64 MiB on these hosts, and every path is the same at 1 MiB */
#ifndef FRAME_MAX_PAYLOAD
#define FRAME_MAX_PAYLOAD (64u << 20)
#endif

enum frame_type {
	/* requests: host -> agent */
	T_PING = 0x01,
	T_EXEC = 0x02,
	T_STDIN = 0x03,
	T_SIGNAL = 0x04,
	T_FILE_PUT = 0x05,
	T_FILE_GET = 0x06,
	T_SET_CLOCK = 0x07,
	T_STATUS = 0x08,
	T_RESET = 0x09, /* end the session (kill its execs), answered by HELLO with this id */
	T_RESIZE = 0x0a, /* 1.2: u16 cols, u16 rows for a tty exec */
	T_HOLD_OUTPUT = 0x0b, /* 1.2: u32 1 = stop reading an exec's output, 0 = read it again (the relay) */
	T_IDENTITY = 0x0c, /* 1.3: a restored machine's own name, machine id and entropy (docs/agent-protocol.md) */
	T_LIST_KEPT = 0x0d, /* 1.5: the kept execs (EXEC_F_KEEP) that still run, answered by DATA */
	T_ATTACH = 0x0e, /* 1.5: u32 pid: a kept exec no connection holds, taken on under this request's id */
	T_DETACH = 0x0f, /* 1.6: let this kept exec of the connection go, as the connection's end would */
	/* responses: agent -> host */
	T_HELLO = 0x80,
	T_PONG = 0x81,
	T_STARTED = 0x82,
	T_STDOUT = 0x83,
	T_STDERR = 0x84,
	T_EXIT = 0x85,
	T_DATA = 0x86,
	T_OK = 0x87,
	T_ERROR = 0x88,
	T_STDIN_ACK = 0x89, /* 1.2: u32 bytes of an exec's stdin the agent has passed on since the last */
};

enum exec_field { F_ARGV = 1, F_ENV = 2, F_CWD = 3, F_USER = 4, F_TTY = 5, F_TAG = 6 };
#define EXEC_F_STDIN 0x1u
#define EXEC_F_KEEP 0x2u /* 1.5: the exec outlives its connection (docs/agent-protocol.md "Kept execs") */
#define EXEC_F_WAIT_OUTPUT 0x4u /* 1.8: EXIT waits for the end of its stdout and stderr ("Waiting for output") */
#define TAG_MAX 4096u /* a kept exec's tag: the host's own words about it, given back by LIST_KEPT */

#define EXIT_F_TIMED_OUT 0x1u
#define EXIT_F_NOT_FOUND 0x2u
#define EXIT_F_NOT_EXECUTABLE 0x4u
#define EXIT_PAYLOAD 48u

/* A growable byte queue: bytes live in data[off, len). */
struct buf {
	uint8_t *data;
	size_t off, len, cap;
};

uint8_t *buf_reserve(struct buf *b, size_t n); /* room for n more bytes at data+len; NULL on OOM */
void buf_consume(struct buf *b, size_t n);
void buf_free(struct buf *b);
static inline size_t buf_used(const struct buf *b)
{
	return b->len - b->off;
}
int buf_append(struct buf *b, const void *p, size_t n);

static inline void put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static inline void put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}
static inline void put_u64(uint8_t *p, uint64_t v)
{
	put_u32(p, (uint32_t)v);
	put_u32(p + 4, (uint32_t)(v >> 32));
}
static inline uint16_t get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t get_u64(const uint8_t *p)
{
	return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

struct frame {
	uint32_t len;
	uint16_t type, flags;
	uint32_t id;
	const uint8_t *payload;
};

/*
 * Parse one frame from p[0,n). Returns the bytes it spans when complete, 0 when more bytes are
 * needed, -1 when the header announces a payload over FRAME_MAX_PAYLOAD (f's header fields are set
 * so that the caller can answer and skip it).
 */
long frame_parse(const uint8_t *p, size_t n, struct frame *f);

/* Start a frame in b (header space reserved, payload follows); returns the frame's offset or -1. */
long frame_begin(struct buf *b, uint16_t type, uint32_t id);
/* Finish the frame started at off: fixes its length from b->len. */
void frame_end(struct buf *b, long off);
/* Whole frame with payload in one call. */
int frame_put(struct buf *b, uint16_t type, uint32_t id, const void *payload, size_t n);
int frame_error(struct buf *b, uint32_t id, int err, const char *msg);

/* Bounds-checked reader for payloads. Any overrun sets bad and yields zeros/NULL. */
struct rd {
	const uint8_t *p;
	size_t n;
	int bad;
};
uint8_t rd_u8(struct rd *r);
uint32_t rd_u32(struct rd *r);
uint64_t rd_u64(struct rd *r);
const uint8_t *rd_bytes(struct rd *r, size_t n);

#endif
