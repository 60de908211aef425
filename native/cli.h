/* What the command on PATH (cli.c) shares with its daemon client (daemon.c). */
#ifndef SNAPLAB_CLI_H
#define SNAPLAB_CLI_H

#define EXIT_USAGE 2 /* the Node CLI's exit code for a failed command (src/cli/output.ts) */

/* Well-formed UTF-8? Node turns anything else into U+FFFD before it sends it: let Node do it. */
int utf8_ok(const char *s);
/*
 * `create`, `rm NAME...` and `ls` through the daemon at url, argv[first..] the command's arguments.
 * -1 before anything is sent: the Node CLI is to run the command. Otherwise it has run: the exit code.
 */
int daemon_create(int argc, char **argv, int first, const char *url);
int daemon_rm(int argc, char **argv, int first, const char *url);
int daemon_ls(int argc, char **argv, int first, const char *url);
#endif
