/* Confinement for exec'd commands: seccomp filter, capability bounding set, and the spawn itself. */
#ifndef SNAPLAB_SANDBOX_H
#define SNAPLAB_SANDBOX_H

#include <linux/filter.h>
#include <sys/types.h>

/* The Docker-like deny list commands get, and a system machine's filter, installed on its PID 1
 * (native/boot.c): BPF programs compiled when the agent is built (filters.c) */
extern const struct sock_fprog sandbox_filter;
extern const struct sock_fprog system_filter;

/* Drops every capability not named in list (comma separated) from the bounding set. */
int caps_restrict(const char *list);
/* dev_readonly: /dev itself read-only too (sandboxes; a system machine's systemd writes to it) */
/* on failure, harden_failed says which step (e.g. "remount read-only /proc/kcore") */
extern char harden_failed[128];
int harden_proc(int dev_readonly);
/* where every machine has the agent (src/drivers/driver.ts MACHINE_AGENT_PATH) */
#define MACHINE_AGENT "/run/snaplab/agent"
/* a sandbox's /run in /dev's tmpfs, the agent bound there from STAGE (see sandbox.c) */
int run_in_dev(const char *stage);
int remount_keeping(const char *path, unsigned long flags);

enum spawn_stage { STAGE_OK = 0, STAGE_SETUP, STAGE_CHDIR, STAGE_SECCOMP, STAGE_EXEC, STAGE_USER };

#define MAX_GROUPS 32

struct spawn_req {
	char **argv;
	char **envp;
	const char *path; /* PATH to search when argv[0] has no slash */
	char *pathbuf; /* scratch, strlen(path) + strlen(argv[0]) + 2 bytes */
	const char *cwd; /* NULL: keep the agent's */
	int set_user; /* run as uid:gid with groups (else as the agent: root of the namespace) */
	uid_t uid;
	gid_t gid;
	int ngroups;
	gid_t groups[MAX_GROUPS];
	int fd_in, fd_out, fd_err;
	int tty; /* fd_in is a pty slave: new session, made its controlling terminal */
	const struct sock_fprog *filter;
	/* written by the child (shared memory, CLONE_VM) before it execs or exits */
	volatile int stage;
	volatile int err;
	/* its pid as the command sees it: in a system machine's pid namespace, which the agent is
	 * not in, another number than clone's */
	volatile pid_t ns_pid;
};

/*
 * clone(CLONE_VM|CLONE_VFORK): no page-table copy, and when it returns the child has either
 * exec'd (stage == STAGE_OK) or exited after a setup failure (stage/err say what failed).
 */
pid_t spawn_child(struct spawn_req *r);

/* An idle agent's stacks back to the kernel: what a command's spawn touched of the child's stack,
 * and what deeper moments touched of its own below the caller's frame (a stack never shrinks by
 * itself). Call it from a shallow frame, with no child being spawned. */
void give_back_stacks(void);

/* The machine's name in its /etc/hostname and /etc/hosts (127.0.1.1), regular files only, never
 * through a symlink (boot.c; a system machine's systemd and sudo read them). */
void name_machine(const char *hostname);

#endif
