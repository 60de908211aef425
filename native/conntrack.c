/* ctnetlink for egress: see conntrack.h. */
#define _GNU_SOURCE
#include "conntrack.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* at most this many flows of one machine are read (its caps keep it far below) */
#define MAX_FLOWS (1 << 20)

struct tuple {
	uint8_t proto, type, code;
	uint32_t src, dst; /* network order */
	uint16_t sport, dport, id; /* network order */
};

struct flow {
	struct tuple orig, reply;
	uint32_t id; /* the kernel's id of the entry (network order; 0: not known) */
};

struct msg {
	char b[512];
	size_t len;
};

static void *put(struct msg *m, uint16_t type, const void *data, size_t n)
{
	struct nlattr *a = (struct nlattr *)(m->b + m->len);
	a->nla_type = type;
	a->nla_len = (uint16_t)(NLA_HDRLEN + n);
	if (n)
		memcpy((char *)a + NLA_HDRLEN, data, n);
	m->len += NLA_ALIGN(a->nla_len);
	return a;
}

static size_t nest(struct msg *m, uint16_t type)
{
	size_t at = m->len;
	put(m, type | NLA_F_NESTED, NULL, 0);
	return at;
}

static void nest_end(struct msg *m, size_t at)
{
	((struct nlattr *)(m->b + at))->nla_len = (uint16_t)(m->len - at);
}

static void start(struct msg *m, uint16_t kind, uint16_t flags)
{
	memset(m, 0, sizeof *m);
	struct nlmsghdr *h = (struct nlmsghdr *)m->b;
	h->nlmsg_type = (uint16_t)(NFNL_SUBSYS_CTNETLINK << 8 | kind);
	h->nlmsg_flags = (uint16_t)(NLM_F_REQUEST | flags);
	h->nlmsg_seq = 1;
	struct nfgenmsg *g = (struct nfgenmsg *)(m->b + NLMSG_HDRLEN);
	g->nfgen_family = AF_INET;
	g->version = NFNETLINK_V0;
	m->len = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof *g);
}

static void put_tuple(struct msg *m, uint16_t type, const struct tuple *t)
{
	size_t at = nest(m, type), ip = nest(m, CTA_TUPLE_IP);
	put(m, CTA_IP_V4_SRC, &t->src, 4);
	put(m, CTA_IP_V4_DST, &t->dst, 4);
	nest_end(m, ip);
	size_t p = nest(m, CTA_TUPLE_PROTO);
	put(m, CTA_PROTO_NUM, &t->proto, 1);
	if (t->proto == IPPROTO_ICMP) {
		put(m, CTA_PROTO_ICMP_ID, &t->id, 2);
		put(m, CTA_PROTO_ICMP_TYPE, &t->type, 1);
		put(m, CTA_PROTO_ICMP_CODE, &t->code, 1);
	} else {
		put(m, CTA_PROTO_SRC_PORT, &t->sport, 2);
		put(m, CTA_PROTO_DST_PORT, &t->dport, 2);
	}
	nest_end(m, p);
	nest_end(m, at);
}

static int send_msg(int fd, struct msg *m)
{
	((struct nlmsghdr *)m->b)->nlmsg_len = (uint32_t)m->len;
	struct sockaddr_nl k = { .nl_family = AF_NETLINK };
	return sendto(fd, m->b, m->len, 0, (struct sockaddr *)&k, sizeof k) == (ssize_t)m->len ? 0 : -errno;
}

/* The attributes nested in A (or following a message's header), by type, into at[0..max]. */
static void attrs(const struct nlattr *a, size_t len, const struct nlattr **at, int max)
{
	memset(at, 0, sizeof *at * (size_t)(max + 1));
	while (len >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= len) {
		int type = a->nla_type & NLA_TYPE_MASK;
		if (type <= max)
			at[type] = a;
		size_t step = NLA_ALIGN(a->nla_len);
		if (step >= len)
			break;
		len -= step;
		a = (const struct nlattr *)((const char *)a + step);
	}
}

#define INSIDE(a) ((const struct nlattr *)((const char *)(a) + NLA_HDRLEN)), ((size_t)(a)->nla_len - NLA_HDRLEN)

static void copy(void *to, const struct nlattr *a, size_t n)
{
	if (a && (size_t)a->nla_len - NLA_HDRLEN >= n)
		memcpy(to, (const char *)a + NLA_HDRLEN, n);
}

static int parse_tuple(const struct nlattr *a, struct tuple *t)
{
	const struct nlattr *in[CTA_TUPLE_MAX + 1], *ip[CTA_IP_MAX + 1], *p[CTA_PROTO_MAX + 1];
	memset(t, 0, sizeof *t);
	if (!a)
		return -1;
	attrs(INSIDE(a), in, CTA_TUPLE_MAX);
	if (!in[CTA_TUPLE_IP] || !in[CTA_TUPLE_PROTO])
		return -1;
	attrs(INSIDE(in[CTA_TUPLE_IP]), ip, CTA_IP_MAX);
	attrs(INSIDE(in[CTA_TUPLE_PROTO]), p, CTA_PROTO_MAX);
	if (!ip[CTA_IP_V4_SRC] || !ip[CTA_IP_V4_DST] || !p[CTA_PROTO_NUM])
		return -1; /* (not IPv4) */
	copy(&t->src, ip[CTA_IP_V4_SRC], 4);
	copy(&t->dst, ip[CTA_IP_V4_DST], 4);
	copy(&t->proto, p[CTA_PROTO_NUM], 1);
	copy(&t->sport, p[CTA_PROTO_SRC_PORT], 2);
	copy(&t->dport, p[CTA_PROTO_DST_PORT], 2);
	copy(&t->id, p[CTA_PROTO_ICMP_ID], 2);
	copy(&t->type, p[CTA_PROTO_ICMP_TYPE], 1);
	copy(&t->code, p[CTA_PROTO_ICMP_CODE], 1);
	return 0;
}

/* NLMSG_OK and NLMSG_NEXT without their mixed signs: a whole message within the LEFT bytes at H. */
static int message_ok(const struct nlmsghdr *h, size_t left)
{
	return left >= sizeof *h && h->nlmsg_len >= sizeof *h && h->nlmsg_len <= left;
}

static struct nlmsghdr *message_next(struct nlmsghdr *h, ssize_t *left)
{
	size_t step = NLMSG_ALIGN(h->nlmsg_len);
	*left = (size_t)*left > step ? *left - (ssize_t)step : 0;
	return (struct nlmsghdr *)((char *)h + step);
}

static int nl_open(void)
{
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
	if (fd < 0)
		return -errno;
	int size = 4 << 20; /* a dump of a large table must not overrun it */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) < 0)
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
	return fd;
}

static int dump_read(int fd, char *buf, size_t size, uint32_t src, struct flow **out, size_t *n, size_t *cap);

/* Every IPv4 flow of the table whose original source is SRC (and mark MARK, when not 0). */
static int dump(int fd, uint32_t src, uint32_t mark, struct flow **out, size_t *n)
{
	struct msg m;
	start(&m, IPCTNL_MSG_CT_GET, NLM_F_DUMP);
	if (mark) {
		uint32_t v = htonl(mark), all = 0xffffffff;
		put(&m, CTA_MARK, &v, 4);
		put(&m, CTA_MARK_MASK, &all, 4);
	}
	int rc = send_msg(fd, &m);
	if (rc < 0)
		return rc;
	size_t cap = 0;
	*out = NULL;
	*n = 0;
	enum { SIZE = 1 << 16 };
	char *buf = malloc(SIZE);
	if (!buf)
		return -ENOMEM;
	rc = dump_read(fd, buf, SIZE, src, out, n, &cap);
	free(buf);
	return rc;
}

static int dump_read(int fd, char *buf, size_t size, uint32_t src, struct flow **out, size_t *n, size_t *cap)
{
	for (;;) {
		ssize_t got = recv(fd, buf, size, 0);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; message_ok(h, (size_t)got);
		     h = message_next(h, &got)) {
			if (h->nlmsg_type == NLMSG_DONE)
				return 0;
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);
				return e->error ? e->error : 0;
			}
			size_t head = NLMSG_ALIGN(sizeof(struct nfgenmsg));
			if (h->nlmsg_len < NLMSG_HDRLEN + head)
				continue;
			const struct nlattr *at[CTA_MAX + 1];
			attrs((const struct nlattr *)((const char *)NLMSG_DATA(h) + head),
			      h->nlmsg_len - NLMSG_HDRLEN - head, at, CTA_MAX);
			struct flow f = { .id = 0 };
			copy(&f.id, at[CTA_ID], 4);
			if (parse_tuple(at[CTA_TUPLE_ORIG], &f.orig) < 0 ||
			    parse_tuple(at[CTA_TUPLE_REPLY], &f.reply) < 0 || f.orig.src != src || *n >= MAX_FLOWS)
				continue;
			if (*n == *cap) {
				*cap = *cap ? *cap * 2 : 64;
				struct flow *more = realloc(*out, *cap * sizeof **out);
				if (!more)
					return -ENOMEM;
				*out = more;
			}
			(*out)[(*n)++] = f;
		}
	}
}

/*
 * Send M on FD and read to its ack, past what comes before it (a GET's flow): 1 when the kernel
 * said yes, 0 when it has no such flow (ENOENT), or -errno.
 */
static int ask(int fd, struct msg *m)
{
	int rc = send_msg(fd, m);
	if (rc < 0)
		return rc;
	char buf[4096];
	for (;;) {
		ssize_t got = recv(fd, buf, sizeof buf, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; message_ok(h, (size_t)got);
		     h = message_next(h, &got)) {
			if (h->nlmsg_type != NLMSG_ERROR)
				continue;
			int e = ((const struct nlmsgerr *)NLMSG_DATA(h))->error;
			return e == 0 ? 1 : e == -ENOENT ? 0 : e;
		}
	}
}

/*
 * Remove the flow whose original tuple is T (and, ID not 0, whose id is ID: not another that took
 * its tuple since): 1, 0 when the table has none, or -errno.
 */
static int del(int fd, const struct tuple *t, uint32_t id)
{
	struct msg m;
	start(&m, IPCTNL_MSG_CT_DELETE, NLM_F_ACK);
	put_tuple(&m, CTA_TUPLE_ORIG, t);
	if (id)
		put(&m, CTA_ID, &id, 4);
	return ask(fd, &m);
}

/*
 * Whether the table of FD holds a flow whose reply tuple is T: 1, 0 when it has none, or -errno.
 * An exact lookup (no dump, which the table's changes meanwhile could make miss one).
 */
static int has_reply(int fd, const struct tuple *t)
{
	struct msg m;
	start(&m, IPCTNL_MSG_CT_GET, NLM_F_ACK);
	put_tuple(&m, CTA_TUPLE_REPLY, t);
	return ask(fd, &m);
}

/* Into the network namespace at PATH, or back to SELF for "-". */
static int enter(const char *path, int self)
{
	int fd = strcmp(path, "-") == 0 ? self : open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = setns(fd, CLONE_NEWNET) < 0 ? -errno : 0;
	if (fd != self)
		close(fd);
	return rc;
}

static int address(const char *text, uint32_t *out)
{
	struct in_addr a;
	if (inet_pton(AF_INET, text, &a) != 1)
		return -EINVAL;
	*out = a.s_addr;
	return 0;
}

/* The request type of an ICMP query whose reply type is TYPE (echo, timestamp, information,
 * address mask), or -1: only queries are flows of their own. */
static int query_of(uint8_t type)
{
	switch (type) {
	case 0:
		return 8;
	case 14:
		return 13;
	case 16:
		return 15;
	case 18:
		return 17;
	default:
		return -1;
	}
}

/*
 * What the router sent on for flow F (its reply tuple, reversed: the flow its translation became
 * in the uplink's table) into *T: 0, or -1 for an ICMP message that is no query (no flow of its own).
 */
static int sent_on(const struct flow *f, struct tuple *t)
{
	const struct tuple *r = &f->reply;
	*t = (struct tuple){ .proto = r->proto, .src = r->dst, .dst = r->src, .sport = r->dport, .dport = r->sport };
	if (r->proto == IPPROTO_ICMP) {
		int q = query_of(r->type);
		if (q < 0)
			return -1;
		t->type = (uint8_t)q, t->code = r->code, t->id = r->id;
	}
	return 0;
}

/*
 * Delete each flow's tuple (its own, or what the router's translation made of it) in the table of
 * FD, going on past a failure (the first is returned).
 */
static int delete_all(int fd, const struct flow *f, size_t n, int translated, unsigned *count)
{
	int first = 0;
	for (size_t i = 0; i < n; i++) {
		struct tuple t = f[i].orig;
		if (translated && sent_on(&f[i], &t) < 0)
			continue;
		/* (a translated flow's id is the router's entry's, not the uplink's) */
		int rc = del(fd, &t, translated ? 0 : f[i].id);
		if (rc < 0 && !first)
			first = rc;
		if (rc > 0)
			*count += (unsigned)rc;
	}
	return first;
}

/* How many flows the table of this thread's namespace holds; -1 when it cannot say. */
static long table_count(void)
{
	char b[32];
	int fd = open("/proc/sys/net/netfilter/nf_conntrack_count", O_RDONLY | O_CLOEXEC);
	ssize_t got = fd >= 0 ? read(fd, b, sizeof b - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (got <= 0)
		return -1;
	b[got] = '\0';
	return strtol(b, NULL, 10);
}

/* Back to the caller's namespace (SELF, closed), F freed: RC, or the failure to go back. */
static int back_to(int self, int rc, struct flow *f)
{
	int back = enter("-", self);
	close(self);
	free(f);
	return rc ? rc : back;
}

/* This thread's network namespace (to go back to), with ADDR parsed into SRC: its fd, or -errno. */
static int begin(const char *addr, uint32_t *src)
{
	if (address(addr, src) < 0)
		return -EINVAL;
	int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	return self < 0 ? -errno : self;
}

/* Into the namespace at PATH ("-": SELF) with a netlink socket there: the socket, or -errno. */
static int socket_in(const char *path, int self)
{
	int rc = enter(path, self);
	return rc < 0 ? rc : nl_open();
}

/* Delete the flows F (translated: what the router's translation sent on) in the namespace at PATH. */
static int delete_in(const char *path, int self, const struct flow *f, size_t n, int translated, unsigned *count)
{
	int fd = socket_in(path, self);
	if (fd < 0)
		return fd;
	int rc = delete_all(fd, f, n, translated, count);
	close(fd);
	return rc;
}

/* The flows from SRC (of mark MARK, when not 0) of the namespace at PATH, into *F and *N. */
static int dump_in(const char *path, int self, uint32_t src, uint32_t mark, struct flow **f, size_t *n)
{
	int fd = socket_in(path, self);
	if (fd < 0)
		return fd;
	int rc = dump(fd, src, mark, f, n);
	close(fd);
	return rc;
}

int ct_forget(const char *router, const char *uplink, const char *machine, uint32_t mark, unsigned *router_n,
	      unsigned *uplink_n)
{
	uint32_t src;
	*router_n = *uplink_n = 0;
	int self = begin(machine, &src);
	if (self < 0)
		return self;
	struct flow *f = NULL;
	size_t n = 0;
	/* a dump walks the kernel's whole table, every namespace's (~9 ms at 262 144 buckets): not
	 * when the router's holds nothing */
	int rc = enter(router, self);
	if (rc == 0 && table_count() != 0)
		rc = dump_in(router, self, src, mark, &f, &n);
	/* the uplink's first: the router's entries are what find them (a failure here leaves both),
	 * and while the router's stands its translation keeps that port */
	if (rc == 0 && n)
		rc = delete_in(uplink, self, f, n, 1, uplink_n);
	if (rc == 0 && n)
		rc = delete_in(router, self, f, n, 0, router_n);
	return back_to(self, rc, f);
}

int ct_forget_src(const char *uplink, const char *src_text, unsigned *count)
{
	uint32_t src;
	*count = 0;
	int self = begin(src_text, &src);
	if (self < 0)
		return self;
	struct flow *f = NULL;
	size_t n = 0;
	int rc = dump_in(uplink, self, src, 0, &f, &n);
	if (rc == 0)
		rc = delete_in(uplink, self, f, n, 0, count);
	return back_to(self, rc, f);
}

int ct_sweep(const char *router, const char *uplink, const char *src_text, unsigned *count)
{
	uint32_t src;
	*count = 0;
	int self = begin(src_text, &src);
	if (self < 0)
		return self;
	struct flow *f = NULL;
	size_t n = 0, orphans = 0;
	/* the uplink's first: a flow is in the router's table before it is in the uplink's, so one the
	 * router does not hold when asked after had ended there (closed, timed out, forgotten) */
	int rc = dump_in(uplink, self, src, 0, &f, &n);
	int fd = rc == 0 && n ? socket_in(router, self) : -1;
	if (rc == 0 && n && fd < 0)
		rc = fd;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		/* the router's reply tuple is the uplink's original one reversed (an ICMP query's reply) */
		const struct tuple *o = &f[i].orig;
		struct tuple r = {
			.proto = o->proto, .src = o->dst, .dst = o->src, .sport = o->dport, .dport = o->sport
		};
		if (o->proto == IPPROTO_ICMP) {
			if (o->type != 8 && o->type != 13 && o->type != 15 && o->type != 17)
				continue;
			r.type = (uint8_t)(o->type == 8 ? 0 : o->type + 1), r.code = o->code, r.id = o->id;
		}
		int held = has_reply(fd, &r);
		if (held < 0)
			rc = held;
		else if (!held)
			f[orphans++] = f[i];
	}
	if (fd >= 0)
		close(fd);
	if (rc == 0 && orphans)
		rc = delete_in(uplink, self, f, orphans, 0, count);
	return back_to(self, rc, f);
}
