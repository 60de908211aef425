/*
 * libFuzzer harness: the host helper's request reader (hostops.c request_read) and the parser of
 * its one request with arithmetic on its arguments, launch (launch_parse), fed the bytes the host
 * library writes to the helper's stdin.
 *
 * hostops.c is compiled into this file with -DFUZZ, which leaves out only its main (libFuzzer has
 * its own). The input goes into a memfd and request_read() reads requests from it until EOF or
 * a bad length, as main does from stdin. No request is run: every other op is system calls on
 * the paths it names (mount, btrfs ioctls, setns, fork), parsed by argc checks only.
 *
 * Checked beyond what ASan and UBSan see (abort() on a failure): a request's argv holds at least
 * the op, at most MAX_ARGS - 1 strings, each inside the request's buffer, and ends with NULL; a
 * launch that parses points its cgroups, its command, its lower layers, upper, work and agent at
 * arguments that exist (indices inside argv[0, argc), the command non-empty).
 */
#include "../hostops.c"

#include <sys/mman.h>

static int memfd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	memfd = memfd_create("hostops-fuzz", MFD_CLOEXEC);
	return memfd < 0 ? (abort(), -1) : 0;
}

/* p is one of r's arguments */
static void in_argv(const struct request *r, const void *p)
{
	for (int i = 0; i < r->argc; i++)
		if ((const void *)r->argv[i] == p)
			return;
	abort();
}

/* argv[0, n) are arguments of r (n >= 0) */
static void span_in_argv(const struct request *r, char *const *argv, long n)
{
	if (n < 0 || argv < r->argv || argv + n > r->argv + r->argc)
		abort();
	for (long i = 0; i < n; i++)
		in_argv(r, argv[i]);
}

static void check_request(const struct request *r)
{
	if (r->argc < 1 || r->argc > MAX_ARGS - 1 || r->argv[r->argc])
		abort();
	size_t total = 0;
	for (int i = 0; i < r->argc; i++) {
		if (r->argv[i] < r->buf)
			abort();
		total += strlen(r->argv[i]); /* past the buffer's end: ASan's heap-buffer-overflow */
	}
	if (total > MAX_REQUEST)
		abort();
	if (strcmp(r->argv[0], "launch") != 0)
		return;
	struct launch_args la;
	if (launch_parse((struct request *)r, &la))
		return;
	in_argv(r, la.log);
	in_argv(r, la.sock);
	in_argv(r, la.netns);
	span_in_argv(r, la.cgs, la.ncg);
	span_in_argv(r, la.argv, 1); /* the command: argv[0] at least */
	if (la.us) {
		const struct userns_root *root = &la.us->root;
		in_argv(r, la.us->agent);
		if (root->lowers) {
			span_in_argv(r, (char *const *)root->lowers, root->nlower);
			in_argv(r, root->upper);
			in_argv(r, root->work);
		} else
			in_argv(r, root->dir);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (ftruncate(memfd, 0) < 0 || (size && pwrite(memfd, data, size, 0) != (ssize_t)size) ||
	    lseek(memfd, 0, SEEK_SET) < 0)
		abort();
	struct request *r;
	while (request_read(memfd, &r) == 1) {
		check_request(r);
		free(r->buf);
		free(r);
	}
	return 0;
}
