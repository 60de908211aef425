/* User namespaces for sandboxes: see userns.c. */
#ifndef SNAPLAB_USERNS_H
#define SNAPLAB_USERNS_H

/* where bwrap finds the staged root filesystem and agent (src/drivers/namespaces/bwrap-args.ts) */
#define USERNS_STAGE "/tmp"
#define USERNS_STAGE_ROOT "/tmp/snaplab-root"
#define USERNS_STAGE_AGENT "/tmp/snaplab-agent"

/* Per-namespace limits each machine's user namespace gets (userns.c limit_here), per uid inside:
 * nested namespaces of each kind (mount namespaces more: systemd makes one per sandboxed
 * service), inotify instances (the kernel's default per user) and watches. */
#define USERNS_MAX_NAMESPACES "256"
#define USERNS_MAX_MNT_NAMESPACES "1024"
#define USERNS_MAX_INOTIFY "128"
#define USERNS_MAX_INOTIFY_WATCHES "65536"

/*
 * In a forked, single-threaded launcher: make a user namespace mapping 0..count-1 to base..,
 * stage rootfs (idmapped) and agent for bwrap in a private mount namespace, join the user
 * namespace as its root; owner >= 0: join that existing user namespace instead of making one (a
 * scenario machine's, which owns its network namespace). 0, or -1 with the reason on stderr.
 */
/* The root filesystem: a directory to idmap, or (lowers != NULL) an overlay of nlower idmapped
 * lower dirs (top first) and an upper and work dir sharing one parent, mounted inside. */
struct userns_root {
	const char *dir;
	const char *const *lowers;
	int nlower;
	const char *upper, *work;
	/* a system machine's: setuid binaries work in its tree (sudo), as root of its namespace only */
	int allow_suid;
};

int userns_enter(unsigned base, unsigned count, int owner, const struct userns_root *root, const char *agent);

/* A network namespace bound at path (under /run/netns), owned by a new user namespace mapping
 * 0..count-1 to base.., which lives as long as it does: a scenario machine's, kept across resets.
 * 0, or -1 with errno. */
int netns_make(const char *path, unsigned base, unsigned count);

/* Can dir be idmapped here? 0 yes; 10 no user namespace, 11 no mount namespace, 12 EINVAL (the
 * filesystem does not support idmapped mounts), 13 another error; -1 could not check. */
int idmap_check(const char *dir, unsigned base);

#endif
