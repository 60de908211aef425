/*
 * `snaplab create`, `ls` and `rm` through a daemon (SNAPLAB_HOST, or --host), served by the
 * command on PATH without starting Node: one HTTP request on the daemon's socket (create, ls) or
 * two per sandbox (rm: look it up, then destroy it), exactly the requests the remote library makes,
 * printed as the Node CLI prints them (src/cli/create.ts, lifecycle.ts). A create through a daemon is then the
 * daemon's create and one round trip (~30 ms here), where the Node CLI pays its start-up first.
 *
 * As for exec (cli.c), this path takes only what it is sure of: any option it does not know, a
 * value it would read differently, a URL it cannot reach, is handed to the Node CLI before a byte
 * is sent. Once a request is out it is never sent again: a connection lost then is reported.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "json.h"

struct daemon {
	const char *url;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* unix: */
	char host[256], port[8]; /* http: an address (or localhost), a port 1-65535 as a number */
	int v6;
	const char *token;
};

static int write_fd(int fd, const void *p, size_t n);
struct response;
static int response_parse(struct buf *in, struct response *r);
static void put_text(struct buf *b, const char *s)
{
	buf_append(b, s, strlen(s));
}

struct response {
	int status;
	struct buf body;
};

/* unix:/path or http://HOST[:PORT][/], as the remote library reads them; -1 for anything else. */
static int parse_url(const char *url, struct daemon *d)
{
	memset(d, 0, sizeof *d);
	d->url = url;
	if (!utf8_ok(url))
		return -1; /* Node reads it with U+FFFD in place of the bad bytes: another path */
	const char *tok = getenv("SNAPLAB_TOKEN");
	if (tok && *tok) {
		for (const char *p = tok; *p; p++)
			if (*p < 0x21 || *p > 0x7e)
				return -1; /* Node refuses such a header: its error, then */
		d->token = tok;
	}
	if (!strncmp(url, "unix:", 5)) {
		if (!url[5] || strlen(url + 5) >= sizeof d->path)
			return -1;
		strcpy(d->path, url + 5);
		return 0;
	}
	if (strncmp(url, "http://", 7))
		return -1;
	const char *h = url + 7, *end;
	int v6 = *h == '[';
	if (v6) {
		end = strchr(h, ']');
		if (!end)
			return -1;
		h++;
	} else
		end = h + strcspn(h, ":/");
	size_t hl = (size_t)(end - h);
	if (!hl || hl >= sizeof d->host)
		return -1;
	memcpy(d->host, h, hl);
	/* an address, or localhost: a name would be a DNS lookup, Node's to make */
	struct in6_addr a6;
	struct in_addr a4;
	if (v6 ? inet_pton(AF_INET6, d->host, &a6) != 1
	       : strcmp(d->host, "localhost") && inet_pton(AF_INET, d->host, &a4) != 1)
		return -1;
	d->v6 = v6;
	if (v6)
		end++;
	long port = 80;
	if (*end == ':') {
		size_t pl = strspn(++end, "0123456789");
		if (!pl || pl > 5)
			return -1;
		port = strtol(end, NULL, 10);
		end += pl;
	}
	if ((*end && strcmp(end, "/")) || port < 1 || port > 65535)
		return -1;
	snprintf(d->port, sizeof d->port, "%ld", port);
	return 0;
}

static const char *errname(int e)
{
	const char *n = strerrorname_np(e);
	return n ? n : "EIO";
}

static int dial(const struct daemon *d, char *why, size_t whylen)
{
	int fd = -1, err = EIO;
	if (d->path[0]) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		strcpy(sa.sun_path, d->path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			err = errno;
		else if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
			err = errno, close(fd), fd = -1;
		if (fd < 0)
			snprintf(why, whylen, "connect %s %s", errname(err), d->path);
		return fd;
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV }, *ai, *a;
	if (getaddrinfo(d->host, d->port, &hints, &ai)) {
		snprintf(why, whylen, "getaddrinfo ENOTFOUND %s", d->host);
		return -1;
	}
	char addr[INET6_ADDRSTRLEN] = "";
	for (a = ai; a && fd < 0; a = a->ai_next) {
		getnameinfo(a->ai_addr, a->ai_addrlen, addr, sizeof addr, NULL, 0,
			    NI_NUMERICHOST); /* Node names the address it tried */
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			err = errno;
		else if (connect(fd, a->ai_addr, a->ai_addrlen) < 0)
			err = errno, close(fd), fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		snprintf(why, whylen, "connect %s %s:%s", errname(err), addr, d->port);
	return fd;
}

/* The body of a chunked response, in place; -1 if it is cut or malformed. */
static int dechunk(struct buf *b)
{
	char *s = (char *)b->data;
	size_t r = 0, w = 0, n = b->len;
	for (;;) {
		char *end;
		unsigned long size = strtoul(s + r, &end, 16);
		char *crlf = memmem(s + r, n - r, "\r\n", 2);
		if (!crlf || end == s + r)
			return -1;
		r = (size_t)(crlf - s) + 2;
		if (size == 0)
			break;
		if (size > n - r)
			return -1;
		memmove(s + w, s + r, size);
		w += size, r += size + 2;
		if (r > n)
			return -1;
	}
	b->len = w;
	return 0;
}

/*
 * One request, on a connection of its own (Connection: close), the whole answer read.
 * 0: answered. -2: the daemon could not be reached, nothing was sent (why says so, as Node would).
 * -1: lost once the request was out ("socket hang up", as Node says it).
 */
static int request(const struct daemon *d, const char *method, const char *path, const struct buf *json,
		   struct response *r, char *why, size_t whylen)
{
	int fd = dial(d, why, whylen);
	if (fd < 0)
		return -2;
	struct buf req = { 0 };
	put_text(&req, method), put_text(&req, " "), put_text(&req, path), put_text(&req, " HTTP/1.1\r\nHost: ");
	if (d->path[0])
		put_text(&req, "localhost");
	else {
		/* as Node writes it: an IPv6 address in brackets, no port when it is 80 */
		if (d->v6)
			put_text(&req, "[");
		put_text(&req, d->host);
		if (d->v6)
			put_text(&req, "]");
		if (strcmp(d->port, "80"))
			put_text(&req, ":"), put_text(&req, d->port);
	}
	put_text(&req, "\r\nConnection: close\r\n");
	if (d->token)
		put_text(&req, "authorization: Bearer "), put_text(&req, d->token), put_text(&req, "\r\n");
	if (json) {
		char len[32];
		snprintf(len, sizeof len, "%zu", buf_used(json));
		put_text(&req, "content-type: application/json\r\ncontent-length: "), put_text(&req, len),
			put_text(&req, "\r\n");
	}
	put_text(&req, "\r\n");
	if (json)
		buf_append(&req, json->data + json->off, buf_used(json));
	snprintf(why, whylen, "socket hang up");
	int ok = write_fd(fd, req.data, req.len) == 0;
	buf_free(&req);
	struct buf in = { 0 };
	for (ssize_t got = 1; ok && got > 0;) {
		uint8_t *room = buf_reserve(&in, 65536);
		if (!room)
			ok = 0;
		else if ((got = read(fd, room, 65536)) > 0)
			in.len += (size_t)got;
		else if (got < 0 && errno == EINTR)
			got = 1;
		else if (got < 0)
			ok = 0;
	}
	close(fd);
	if (!ok) {
		buf_free(&in);
		return -1;
	}
	return response_parse(&in, r);
}

/*
 * A whole HTTP/1.1 answer (what came until the daemon closed) into status and body; the buffer
 * becomes the body's (NUL after it, not counted). -1, the buffer freed, if it is not one.
 */
static int response_parse(struct buf *in, struct response *r)
{
	if (buf_append(in, "", 1) < 0)
		return buf_free(in), -1;
	in->len--; /* a NUL past what came: the parsing below stops there */
	char *s = (char *)in->data;
	char *head_end = in->len ? memmem(s, in->len, "\r\n\r\n", 4) : NULL;
	if (!head_end || in->len < 12 || strncmp(s, "HTTP/1.", 7))
		return buf_free(in), -1;
	r->status = atoi(s + 9);
	size_t head = (size_t)(head_end - s) + 4;
	*head_end = 0;
	int chunked = strcasestr(s, "\r\ntransfer-encoding: chunked") != NULL;
	const char *cl = strcasestr(s, "\r\ncontent-length:");
	long want = cl ? (long)strtoul(cl + 17, NULL, 10) : -1; /* read before the body moves over the head */
	memmove(in->data, in->data + head, in->len - head + 1);
	in->len -= head;
	if (chunked && dechunk(in) < 0)
		return buf_free(in), -1;
	if (!chunked && want >= 0) {
		if ((size_t)want > in->len)
			return buf_free(in), -1; /* cut short */
		in->len = (size_t)want;
	}
	if (buf_append(in, "", 1) < 0)
		return buf_free(in), -1; /* a terminator past the body, not counted */
	in->len--;
	r->body = *in;
	return 0;
}

/* Whole, or -1 (SIGPIPE is ignored here: a closed reader is EPIPE). */
static int write_fd(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p = (const char *)p + w, n -= (size_t)w;
	}
	return 0;
}

static void print_buf(int fd, struct buf *b)
{
	write_fd(fd, b->data + b->off, buf_used(b));
}

/* A string token's text (the token itself if it is not a string). */
static void put_unescaped(struct buf *b, const char *tok)
{
	if (json_string(tok, 0, strlen(tok), b) < 0)
		put_text(b, tok);
}

/*
 * An error as reportError prints it (src/cli/output.ts), from the tokens of the daemon's answer
 * (hint and op may be NULL: absent), then exit 2. As a SnaplabError made from that answer: the
 * JSON form keeps a hint that is there at all, the text form one that is not empty.
 */
static _Noreturn void report(const char *code, const char *msg, const char *hint, const char *op, int json)
{
	struct buf b = { 0 };
	int has_op = op && op[0] == '"' && strcmp(op, "\"\"");
	if (json) {
		put_text(&b, "{\"error\":{\"code\":"), put_text(&b, code);
		put_text(&b, ",\"message\":"), put_text(&b, msg);
		if (hint)
			put_text(&b, ",\"hint\":"), put_text(&b, hint);
		if (has_op)
			put_text(&b, ",\"operation\":"), put_text(&b, op);
		put_text(&b, "}}\n");
	} else {
		put_text(&b, "error["), put_unescaped(&b, code), put_text(&b, "]: "), put_unescaped(&b, msg),
			put_text(&b, "\n");
		if (hint && hint[0] == '"' && strcmp(hint, "\"\""))
			put_text(&b, "hint: "), put_unescaped(&b, hint), put_text(&b, "\n");
		if (has_op)
			put_text(&b, "trace: snaplab trace "), put_unescaped(&b, op), put_text(&b, "\n");
	}
	print_buf(2, &b);
	exit(EXIT_USAGE);
}

/* A token of the body's object, as a string of its own (NULL if absent). */
static char *member(const struct buf *body, const char *key)
{
	size_t vs, ve;
	if (json_member((const char *)body->data, body->len, key, &vs, &ve) < 0)
		return NULL;
	return strndup((const char *)body->data + vs, ve - vs);
}

static _Noreturn void unreachable(const struct daemon *d, const char *why, int json)
{
	struct buf m = { 0 }, msg = { 0 }, hint = { 0 };
	buf_append(&m, "cannot reach the daemon at ", 27);
	buf_append(&m, d->url, strlen(d->url));
	buf_append(&m, ": ", 2);
	buf_append(&m, why, strlen(why));
	buf_append(&m, "", 1);
	json_escape(&msg, (const char *)m.data);
	json_escape(&hint, "is `snaplab serve` running there? (SNAPLAB_HOST says where)");
	buf_append(&msg, "", 1), buf_append(&hint, "", 1);
	report("\"DAEMON_UNREACHABLE\"", (const char *)msg.data, (const char *)hint.data, NULL, json);
}

/* An error answer, as the remote library turns it into a SnaplabError. */
static _Noreturn void answer_error(struct response *r, int json)
{
	char *code = member(&r->body, "code"), *msg = member(&r->body, "message");
	if (code && msg && code[0] == '"' && msg[0] == '"')
		report(code, msg, member(&r->body, "hint"), member(&r->body, "operationId"), json);
	struct buf m = { 0 }, tok = { 0 }, hint = { 0 };
	char head[64];
	buf_append(&m, head, (size_t)snprintf(head, sizeof head, "the daemon answered %d: ", r->status));
	buf_append(&m, r->body.data,
		   r->body.len < 200
			   ? r->body.len
			   : 200); /* JS slices 200 UTF-16 units: close enough for an error no daemon of ours sends */
	buf_append(&m, "", 1);
	json_escape(&tok, (const char *)m.data);
	json_escape(&hint, "see the daemon log");
	buf_append(&tok, "", 1), buf_append(&hint, "", 1);
	report("\"DAEMON_ERROR\"", (const char *)tok.data, (const char *)hint.data, NULL, json);
}

/* encodeURIComponent */
static void encode(struct buf *b, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		    strchr("-_.!~*'()", c))
			buf_append(b, s, 1);
		else {
			char h[4];
			snprintf(h, sizeof h, "%%%02X", c);
			buf_append(b, h, 3);
		}
	}
}

/* `--opt VALUE` or `--opt=VALUE`: the value (and i moved past it), or NULL if argv[*i] is not it. */
static const char *option(char **argv, int argc, int *i, const char *name)
{
	size_t n = strlen(name);
	const char *a = argv[*i];
	if (strncmp(a, name, n))
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] || *i + 1 >= argc || argv[*i + 1][0] == '-')
		return NULL; /* a missing value: commander's error */
	return argv[++*i];
}

int daemon_create(int argc, char **argv, int first, const char *url)
{
	struct daemon d;
	if (parse_url(url, &d) < 0)
		return -1;
	const char *image = "busybox", *name = NULL, *pool = NULL, *timeout = NULL, *on_timeout = "kill";
	struct buf body = { 0 }, labels = { 0 };
	int json = 0, nlabels = 0;
	const char *keys[64]; /* each label's KEY= (a key given twice is Node's refusal to make) */
	for (int i = first; i < argc; i++) {
		const char *v;
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if ((v = option(argv, argc, &i, "--image")))
			image = v;
		else if ((v = option(argv, argc, &i, "--name")))
			name = v;
		else if ((v = option(argv, argc, &i, "--pool")))
			pool = v;
		else if ((v = option(argv, argc, &i, "--timeout")))
			timeout = v;
		else if ((v = option(argv, argc, &i, "--on-timeout")))
			on_timeout = v;
		else if ((v = option(argv, argc, &i, "--label"))) {
			const char *eq = strchr(v, '=');
			if (!eq || eq == v || !utf8_ok(v) || !strncmp(v, "__proto__=", 10) || nlabels == 64)
				return -1; /* keyValues' error, or a key JS objects treat apart */
			for (int j = 0; j < nlabels; j++)
				if (!strncmp(keys[j], v, (size_t)(eq - v + 1)))
					return -1;
			keys[nlabels] = v;
			char *k = strndup(v, (size_t)(eq - v));
			if (nlabels++)
				buf_append(&labels, ",", 1);
			json_escape(&labels, k);
			buf_append(&labels, ":", 1);
			json_escape(&labels, eq + 1);
			free(k);
		} else
			return -1;
	}
	/* Number(--timeout) of anything but digits, and a --on-timeout the daemon refuses: Node's to say */
	if (timeout && (!*timeout || strspn(timeout, "0123456789") != strlen(timeout) || strlen(timeout) > 9))
		return -1;
	if (strcmp(on_timeout, "kill") && strcmp(on_timeout, "pause") && strcmp(on_timeout, "stop"))
		return -1;
	if (!utf8_ok(image) || (name && !utf8_ok(name)) || (pool && !utf8_ok(pool)))
		return -1;
	buf_append(&body, "{", 1);
	if (pool && *pool)
		buf_append(&body, "\"pool\":", 7), json_escape(&body, pool); /* `o.pool ? ...`: an empty one is none */
	else {
		buf_append(&body, "\"image\":", 8), json_escape(&body, image);
		if (name)
			buf_append(&body, ",\"name\":", 8), json_escape(&body, name);
	}
	buf_append(&body, ",\"labels\":{", 11);
	buf_append(&body, labels.data, labels.len);
	buf_append(&body, "}", 1);
	if (timeout) {
		char n[32]; /* at most 9 digits: checked above */
		snprintf(n, sizeof n, "%ld", strtol(timeout, NULL, 10));
		put_text(&body, ",\"timeoutS\":"), put_text(&body, n);
	}
	buf_append(&body, ",\"onTimeout\":", 13), json_escape(&body, on_timeout);
	buf_append(&body, "}", 1);

	signal(SIGPIPE, SIG_IGN);
	struct response r = { 0 };
	char why[512];
	int rc = request(&d, "POST", "/sandboxes", &body, &r, why, sizeof why);
	if (rc == -2)
		return -1; /* nothing sent: the Node CLI tries, and says what it finds */
	if (rc < 0)
		unreachable(&d, why, json);
	if (r.status >= 400)
		answer_error(&r, json);
	struct buf out = { 0 };
	if (json) {
		if (json_pretty(&out, (const char *)r.body.data, r.body.len) < 0)
			answer_error(&r, json);
	} else {
		size_t vs, ve;
		if (json_member((const char *)r.body.data, r.body.len, "name", &vs, &ve) < 0 ||
		    json_string((const char *)r.body.data, vs, ve, &out) < 0)
			answer_error(&r, json);
	}
	buf_append(&out, "\n", 1);
	print_buf(1, &out);
	return 0;
}

int daemon_rm(int argc, char **argv, int first, const char *url)
{
	struct daemon d;
	if (parse_url(url, &d) < 0)
		return -1;
	int json = 0, nnames = 0;
	for (int i = first; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (argv[i][0] == '-' || !utf8_ok(argv[i]))
			return -1; /* --all, --help, --: the Node CLI's */
		else
			nnames++;
	}
	if (!nnames)
		return -1;
	signal(SIGPIPE, SIG_IGN);
	struct buf out = { 0 };
	put_text(&out, json ? "{\n  \"removed\": [" : "removed ");
	int done = 0;
	for (int i = first; i < argc; i++) {
		if (argv[i][0] == '-')
			continue;
		struct buf path = { 0 };
		struct response r = { 0 };
		char why[512];
		buf_append(&path, "/sandboxes/", 11);
		encode(&path, argv[i]);
		buf_append(&path, "", 1);
		int rc = request(&d, "GET", (const char *)path.data, NULL, &r, why, sizeof why);
		if (rc == -2 && !done)
			return -1; /* nothing done yet: Node's to try */
		if (rc < 0)
			unreachable(&d, why, json);
		if (r.status >= 400)
			answer_error(&r, json);
		struct buf id = { 0 };
		size_t vs, ve;
		if (json_member((const char *)r.body.data, r.body.len, "id", &vs, &ve) < 0 ||
		    json_string((const char *)r.body.data, vs, ve, &id) < 0)
			answer_error(&r, json);
		buf_append(&id, "", 1);
		path.len = 0;
		buf_append(&path, "/sandboxes/", 11);
		encode(&path, (const char *)id.data);
		buf_append(&path, "", 1);
		buf_free(&r.body);
		rc = request(&d, "DELETE", (const char *)path.data, NULL, &r, why, sizeof why);
		if (rc < 0)
			unreachable(&d, why, json);
		if (r.status >= 400)
			answer_error(&r, json);
		done++;
		if (json)
			put_text(&out, "\n    "), json_escape(&out, argv[i]);
		else
			put_text(&out, argv[i]);
		if (done < nnames)
			put_text(&out, json ? "," : ", ");
	}
	put_text(&out, json ? "\n  ]\n}\n" : "\n");
	print_buf(1, &out);
	return 0;
}

/* application/x-www-form-urlencoded, as URLSearchParams writes a value */
static void form_encode(struct buf *b, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("*-._", c))
			buf_append(b, s, 1);
		else if (c == ' ')
			buf_append(b, "+", 1);
		else {
			char h[4];
			snprintf(h, sizeof h, "%%%02X", c);
			buf_append(b, h, 3);
		}
	}
}

/* String length as JavaScript counts it (UTF-16 units) of well-formed UTF-8. */
static size_t js_length(const char *s, size_t n)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c & 0xc0) != 0x80)
			len += c >= 0xf0 ? 2 : 1;
	}
	return len;
}

#define LS_COLUMNS 9

/* A member of the sandbox object s[0..n) as text into out (a string unescaped, a number or a literal
 * as written); 0 if it is absent or null. */
static int member_text(const char *s, size_t n, const char *key, struct buf *out)
{
	size_t vs, ve;
	if (json_member(s, n, key, &vs, &ve) < 0 || !strncmp(s + vs, "null", 4))
		return 0;
	if (json_string(s, vs, ve, out) < 0)
		buf_append(out, s + vs, ve - vs);
	return 1;
}

/* ls's AGE of an ISO time (as Date.toISOString writes it), as src/cli/lifecycle.ts's age() says it. */
static void put_age(struct buf *out, const char *iso)
{
	struct tm tm = { 0 };
	int ms = 0;
	if (sscanf(iso, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
		   &tm.tm_sec, &ms) < 6) {
		put_text(out, "-");
		return;
	}
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	double made = (double)timegm(&tm) * 1000 + ms, at = (double)now.tv_sec * 1000 + (double)now.tv_nsec / 1e6;
	long sec = (long)floor((at - made) / 1000 + 0.5); /* Math.round */
	char text[32];
	if (sec < 120)
		snprintf(text, sizeof text, "%lds", sec == 0 ? 0 : sec);
	else if (sec < 7200)
		snprintf(text, sizeof text, "%ldm", (long)floor(sec / 60.0 + 0.5));
	else
		snprintf(text, sizeof text, "%ldh", (long)floor(sec / 3600.0 + 0.5));
	put_text(out, text);
}

/* ls's NOTE (src/cli/lifecycle.ts note()): host root first, then the init, egress, then the reason (or where it came from). */
static void put_note(struct buf *out, const char *s, size_t n)
{
	size_t vs, ve, start = out->len;
	if (json_member(s, n, "hostRoot", &vs, &ve) == 0 && !strncmp(s + vs, "true", 4))
		put_text(out, "NO USER NAMESPACE (root inside is host root)");
	struct buf init = { 0 };
	if (member_text(s, n, "init", &init) && init.len == 7 && !memcmp(init.data, "systemd", 7)) {
		if (out->len > start)
			put_text(out, "; ");
		put_text(out, "systemd");
	}
	buf_free(&init);
	if (json_member(s, n, "egress", &vs, &ve) == 0 && s[vs] == '{') {
		if (out->len > start)
			put_text(out, "; ");
		put_text(out, "egress");
	}
	struct buf why = { 0 }, origin = { 0 };
	/* reason ?? (origin ? `from ${origin}` : ''): an empty reason is kept (and says nothing) */
	if (!member_text(s, n, "reason", &why) && member_text(s, n, "origin", &origin) && origin.len) {
		put_text(&why, "from ");
		buf_append(&why, origin.data, origin.len);
	}
	buf_free(&origin);
	if (why.len) {
		if (out->len > start)
			put_text(out, "; ");
		buf_append(out, why.data, why.len);
	}
	buf_free(&why);
}

/* The ls table (src/cli/lifecycle.ts) of the daemon's list: a row of cells per sandbox, padded columns. */
static int ls_table(const char *s, size_t n, struct buf *out)
{
	static const char *head[LS_COLUMNS] = { "ID",	  "NAME", "STATE",   "IMAGE", "STORAGE",
						"DRIVER", "AGE",  "EXPIRES", "NOTE" };
	static const char *keys[6] = { "id", "name", "state", "image", "storage", "driver" };
	struct buf cells = { 0 }; /* every cell, NUL-terminated, header row first */
	size_t width[LS_COLUMNS] = { 0 };
	int rows = 0;
	for (int c = 0; c < LS_COLUMNS; c++)
		buf_append(&cells, head[c], strlen(head[c]) + 1), width[c] = strlen(head[c]);
	size_t i = 0;
	while (i < n && s[i] != '[')
		i++;
	for (i++; i < n;) {
		while (i < n && strchr(" \t\r\n,", s[i]))
			i++;
		if (i >= n || s[i] == ']')
			break;
		long e = json_end(s, i, n);
		if (e < 0 || s[i] != '{')
			return buf_free(&cells), -1;
		const char *o = s + i;
		size_t on = (size_t)e - i;
		for (int c = 0; c < LS_COLUMNS; c++) {
			size_t at = cells.len;
			if (c < 6) {
				if (!member_text(o, on, keys[c], &cells))
					put_text(&cells, "-");
			} else if (c == 6) {
				struct buf made = { 0 };
				if (member_text(o, on, "createdAt", &made)) {
					buf_append(&made, "", 1);
					put_age(&cells, (const char *)made.data);
				} else
					put_text(&cells, "-");
				buf_free(&made);
			} else if (c == 7) {
				if (!member_text(o, on, "expiresAt", &cells))
					put_text(&cells, "-");
			} else
				put_note(&cells, o, on);
			size_t w = js_length((const char *)cells.data + at, cells.len - at);
			if (w > width[c])
				width[c] = w;
			buf_append(&cells, "", 1);
		}
		rows++;
		i = (size_t)e;
	}
	const char *cell = (const char *)cells.data;
	for (int row = 0; row <= rows; row++) {
		for (int c = 0; c < LS_COLUMNS; c++) {
			size_t len = strlen(cell);
			buf_append(out, cell, len);
			if (c < LS_COLUMNS - 1) {
				for (size_t w = js_length(cell, len); w < width[c]; w++)
					buf_append(out, " ", 1);
				put_text(out, "  ");
			}
			cell += len + 1;
		}
		put_text(out, "\n");
	}
	buf_free(&cells);
	return 0;
}

int daemon_ls(int argc, char **argv, int first, const char *url)
{
	struct daemon d;
	if (parse_url(url, &d) < 0)
		return -1;
	int json = 0, nlabels = 0;
	struct buf path = { 0 };
	put_text(&path, "/sandboxes");
	for (int i = first; i < argc; i++) {
		const char *v;
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if ((v = option(argv, argc, &i, "--label"))) {
			const char *eq = strchr(v, '=');
			if (!eq || eq == v || !utf8_ok(v))
				return -1; /* keyValues' error: Node's to say */
			put_text(&path, nlabels++ ? "&label=" : "?label=");
			form_encode(&path, v);
		} else
			return -1;
	}
	buf_append(&path, "", 1);
	signal(SIGPIPE, SIG_IGN);
	struct response r = { 0 };
	char why[512];
	int rc = request(&d, "GET", (const char *)path.data, NULL, &r, why, sizeof why);
	if (rc == -2)
		return -1;
	if (rc < 0)
		unreachable(&d, why, json);
	if (r.status >= 400)
		answer_error(&r, json);
	const char *s = (const char *)r.body.data;
	size_t n = r.body.len;
	struct buf out = { 0 };
	if (json) {
		if (json_pretty(&out, s, n) < 0)
			answer_error(&r, json);
		put_text(&out, "\n");
		print_buf(1, &out);
		return 0;
	}
	if (ls_table(s, n, &out) < 0)
		answer_error(&r, json);
	print_buf(1, &out);
	return 0;
}
