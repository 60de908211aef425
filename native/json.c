/*
 * The little JSON the command on PATH needs to be a client of the daemon (daemon.c): find a
 * member of an object, read a string, write a string as JSON.stringify does, and print a document
 * as JSON.stringify(JSON.parse(text), null, 2) prints it. The daemon writes every body with
 * JSON.stringify's escaping (fastify), so its tokens can be copied as they are.
 */
#include <stdio.h>
#include <string.h>

#include "json.h"

static size_t ws(const char *s, size_t i, size_t n)
{
	while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
		i++;
	return i;
}

long json_end(const char *s, size_t i, size_t n)
{
	if (i >= n)
		return -1;
	if (s[i] == '"') {
		for (i++; i < n; i++) {
			if (s[i] == '\\')
				i++;
			else if (s[i] == '"')
				return (long)i + 1;
		}
		return -1;
	}
	if (s[i] == '{' || s[i] == '[') {
		int depth = 0;
		for (; i < n; i++) {
			if (s[i] == '"') {
				long e = json_end(s, i, n);
				if (e < 0)
					return -1;
				i = (size_t)e - 1;
			} else if (s[i] == '{' || s[i] == '[')
				depth++;
			else if ((s[i] == '}' || s[i] == ']') && --depth == 0)
				return (long)i + 1;
		}
		return -1;
	}
	size_t j = i;
	while (j < n && !strchr(",}] \t\r\n", s[j]))
		j++;
	return j > i ? (long)j : -1;
}

int json_member(const char *s, size_t n, const char *key, size_t *vs, size_t *ve)
{
	size_t i = ws(s, 0, n), klen = strlen(key);
	if (i >= n || s[i] != '{')
		return -1;
	for (i = ws(s, i + 1, n); i < n && s[i] == '"';) {
		long ke = json_end(s, i, n);
		if (ke < 0)
			return -1;
		size_t k0 = i + 1, k1 = (size_t)ke - 1;
		i = ws(s, (size_t)ke, n);
		if (i >= n || s[i] != ':')
			return -1;
		i = ws(s, i + 1, n);
		long e = json_end(s, i, n);
		if (e < 0)
			return -1;
		/* keys the daemon writes are plain names: compared as written */
		if (k1 - k0 == klen && !memcmp(s + k0, key, klen)) {
			*vs = i, *ve = (size_t)e;
			return 0;
		}
		i = ws(s, (size_t)e, n);
		if (i < n && s[i] == ',')
			i = ws(s, i + 1, n);
	}
	return -1;
}

static int hex4(const char *p, unsigned *v)
{
	*v = 0;
	for (int k = 0; k < 4; k++) {
		char c = p[k];
		int d = c >= '0' && c <= '9'   ? c - '0'
			: c >= 'a' && c <= 'f' ? c - 'a' + 10
			: c >= 'A' && c <= 'F' ? c - 'A' + 10
					       : -1;
		if (d < 0)
			return -1;
		*v = *v << 4 | (unsigned)d;
	}
	return 0;
}

static void put_utf8(struct buf *b, unsigned cp)
{
	uint8_t u[4];
	size_t n;
	if (cp >= 0xd800 && cp <= 0xdfff)
		cp = 0xfffd; /* a lone surrogate: what Node writes for it */
	if (cp < 0x80)
		u[0] = (uint8_t)cp, n = 1;
	else if (cp < 0x800)
		u[0] = (uint8_t)(0xc0 | cp >> 6), u[1] = (uint8_t)(0x80 | (cp & 0x3f)), n = 2;
	else if (cp < 0x10000)
		u[0] = (uint8_t)(0xe0 | cp >> 12), u[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)),
		u[2] = (uint8_t)(0x80 | (cp & 0x3f)), n = 3;
	else
		u[0] = (uint8_t)(0xf0 | cp >> 18), u[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f)),
		u[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)), u[3] = (uint8_t)(0x80 | (cp & 0x3f)), n = 4;
	buf_append(b, u, n);
}

int json_string(const char *s, size_t vs, size_t ve, struct buf *out)
{
	if (ve - vs < 2 || s[vs] != '"' || s[ve - 1] != '"')
		return -1;
	for (size_t i = vs + 1; i < ve - 1; i++) {
		if (s[i] != '\\') {
			buf_append(out, s + i, 1);
			continue;
		}
		if (++i >= ve - 1)
			return -1;
		const char *esc = strchr("\"\\/bfnrt", s[i]);
		if (esc && s[i]) {
			static const char real[] = "\"\\/\b\f\n\r\t";
			buf_append(out, real + (esc - "\"\\/bfnrt"), 1);
			continue;
		}
		unsigned cp, lo;
		if (s[i] != 'u' || i + 4 >= ve || hex4(s + i + 1, &cp) < 0)
			return -1;
		i += 4;
		if (cp >= 0xd800 && cp < 0xdc00 && i + 6 < ve && s[i + 1] == '\\' && s[i + 2] == 'u' &&
		    hex4(s + i + 3, &lo) == 0 && lo >= 0xdc00 && lo <= 0xdfff) {
			cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			i += 6;
		}
		put_utf8(out, cp);
	}
	return 0;
}

void json_escape(struct buf *b, const char *s)
{
	buf_append(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		const char *e = c == '"'    ? "\\\""
				: c == '\\' ? "\\\\"
				: c == '\b' ? "\\b"
				: c == '\f' ? "\\f"
				: c == '\n' ? "\\n"
				: c == '\r' ? "\\r"
				: c == '\t' ? "\\t"
					    : NULL;
		char u[8];
		if (!e && c < 0x20)
			snprintf(u, sizeof u, "\\u%04x", c), e = u;
		if (e)
			buf_append(b, e, strlen(e));
		else
			buf_append(b, s, 1);
	}
	buf_append(b, "\"", 1);
}

static size_t strspn_n(const char *s, size_t i, size_t n, const char *set)
{
	size_t j = i;
	while (j < n && s[j] && strchr(set, s[j]))
		j++;
	return j - i;
}

static void newline(struct buf *b, int depth)
{
	buf_append(b, "\n", 1);
	for (int k = 0; k < depth; k++)
		buf_append(b, "  ", 2);
}

/* A number as JSON writes one: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?; its end, or 0. */
static size_t number_end(const char *s, size_t i, size_t n)
{
	size_t d;
	if (i < n && s[i] == '-')
		i++;
	if (i < n && s[i] == '0')
		i++;
	else if ((d = strspn_n(s, i, n, "0123456789")) > 0)
		i += d;
	else
		return 0;
	if (i < n && s[i] == '.') {
		if (!(d = strspn_n(s, i + 1, n, "0123456789")))
			return 0;
		i += 1 + d;
	}
	if (i < n && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (i < n && (s[i] == '+' || s[i] == '-'))
			i++;
		if (!(d = strspn_n(s, i, n, "0123456789")))
			return 0;
		i += d;
	}
	return i;
}

/* One value at s[i], written indented at depth; the index after it, or 0 if it is not JSON. */
static size_t pretty_value(struct buf *out, const char *s, size_t i, size_t n, int depth)
{
	if (i >= n || depth > 1000)
		return 0;
	char c = s[i];
	if (c == '"') {
		long e = json_end(s, i, n);
		struct buf check = { 0 };
		int ok = e > 0 && json_string(s, i, (size_t)e, &check) == 0;
		for (size_t k = i; ok && k < (size_t)e; k++)
			ok = (unsigned char)s[k] >= 0x20;
		buf_free(&check);
		if (!ok)
			return 0;
		buf_append(out, s + i, (size_t)e - i);
		return (size_t)e;
	}
	if (c == '{' || c == '[') {
		char close = c == '{' ? '}' : ']';
		size_t j = ws(s, i + 1, n);
		if (j < n && s[j] == close) { /* empty: {} and [] on one line */
			buf_append(out, c == '{' ? "{}" : "[]", 2);
			return j + 1;
		}
		buf_append(out, &c, 1);
		for (int first = 1;; first = 0) {
			if (!first) {
				if (j >= n || (s[j] != ',' && s[j] != close))
					return 0;
				if (s[j] == close)
					break;
				buf_append(out, ",", 1);
				j = ws(s, j + 1, n);
			}
			newline(out, depth + 1);
			if (c == '{') {
				if (j >= n || s[j] != '"' || !(j = pretty_value(out, s, j, n, depth + 1)))
					return 0;
				j = ws(s, j, n);
				if (j >= n || s[j] != ':')
					return 0;
				buf_append(out, ": ", 2);
				j = ws(s, j + 1, n);
			}
			if (!(j = pretty_value(out, s, j, n, depth + 1)))
				return 0;
			j = ws(s, j, n);
		}
		newline(out, depth);
		buf_append(out, &close, 1);
		return j + 1;
	}
	static const char *const words[] = { "true", "false", "null" };
	for (int k = 0; k < 3; k++) {
		size_t l = strlen(words[k]);
		if (n - i >= l && !memcmp(s + i, words[k], l)) {
			buf_append(out, words[k], l);
			return i + l;
		}
	}
	size_t e = number_end(s, i, n);
	if (e)
		buf_append(out, s + i, e - i);
	return e;
}

int json_pretty(struct buf *out, const char *s, size_t n)
{
	size_t end = pretty_value(out, s, ws(s, 0, n), n, 0);
	return end && ws(s, end, n) == n ? 0 : -1;
}
