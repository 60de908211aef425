/* The little JSON of the daemon client (json.c). Offsets are into a text of n bytes. */
#ifndef SNAPLAB_JSON_H
#define SNAPLAB_JSON_H
#include <stddef.h>

#include "frame.h"

/* The end (one past) of the value that starts at i; -1 if it is not one. */
long json_end(const char *s, size_t i, size_t n);
/* The value of `key` in the object s: its token at [*vs, *ve); -1 if absent or not an object. */
int json_member(const char *s, size_t n, const char *key, size_t *vs, size_t *ve);
/* The string token [vs, ve) unescaped into out (UTF-8); -1 if it is not a string. */
int json_string(const char *s, size_t vs, size_t ve, struct buf *out);
/* s (well-formed UTF-8) as JSON.stringify writes it. */
void json_escape(struct buf *b, const char *s);
/*
 * The document as JSON.stringify(JSON.parse(s), null, 2) writes it, for JSON whose numbers are
 * written as JavaScript writes them (the daemon's are: `1.0` would stay `1.0`); -1 if s is not
 * one JSON value.
 */
int json_pretty(struct buf *out, const char *s, size_t n);
#endif
