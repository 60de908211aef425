/*
 * The kernel's connection tables over netlink (ctnetlink), for egress: what a machine's flows
 * left in its router's table and in the uplink's (the host's) is removed with the machine
 * (docs/egress.md "Flows"). IPv4 only, as egress is.
 */
#ifndef SNAPLAB_CONNTRACK_H
#define SNAPLAB_CONNTRACK_H
#include <stdint.h>

/*
 * In the network namespace at ROUTER (a path), every flow whose original source is MACHINE (a
 * dotted address) and, when MARK is not 0, whose connection mark is MARK: removed there, and the
 * flow it became in the namespace at UPLINK ("-": the caller's own) removed too (the router's
 * reply tuple, reversed: what the router's translation sent on). 0, or -errno; *router_n and
 * *uplink_n say how many went in each.
 */
int ct_forget(const char *router, const char *uplink, const char *machine, uint32_t mark, unsigned *router_n,
	      unsigned *uplink_n);

/* In the namespace at UPLINK ("-": the caller's own), every flow whose original source is SRC. */
int ct_forget_src(const char *uplink, const char *src, unsigned *n);

/*
 * In the namespace at UPLINK ("-": the caller's own), every flow whose original source is SRC (a
 * router's address there) that the router's table at ROUTER no longer holds: removed (*n of them).
 * What ended in the router but not in the uplink's (a reset the router's lists took in and then
 * refused, one a full queue dropped on the way) would otherwise stay there for the uplink's
 * established timeout.
 */
int ct_sweep(const char *router, const char *uplink, const char *src, unsigned *n);

#endif
