/*
 * Opens many connections from inside a machine, for test/egress.test.ts (its caps on connections):
 *   egress-flood udp ADDR N            one datagram to each of ports 1..N of ADDR, from one socket
 *   egress-flood tcp ADDR PORT N SECS  N connections to ADDR:PORT (3 s each at most), kept SECS
 *   egress-flood icmperr SRC DST       an ICMP "port unreachable" from SRC to DST about a datagram no
 *                                      connection table knows (a raw packet: CAP_NET_RAW)
 *   egress-flood rst1 ADDR PORT N      N connections to ADDR:PORT, each then reset with a TTL of 1
 *                                      (a reset the first router drops: any process may send one)
 *   egress-flood rstbcast ADDR PORT S  a connection to ADDR:PORT, then a reset for it in a frame to
 *                                      the broadcast address (AF_PACKET on eth0: CAP_NET_RAW), which
 *                                      a router does not forward; prints "sent", keeps it S seconds
 *   egress-flood arp GATEWAY N         N ARP requests for GATEWAY on eth0, each from a sender
 *                                      address of its own (10.200.x.y: AF_PACKET, CAP_NET_RAW), as a
 *                                      neighbour table that answers them takes each sender in
 * Prints "ok N refused M" (udp: sent and failed) and exits 0.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static unsigned short fold(unsigned sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (unsigned short)~sum;
}

static unsigned sum16(const unsigned char *p, size_t n, unsigned sum)
{
	for (size_t i = 0; i + 1 < n; i += 2)
		sum += (unsigned)(p[i] << 8 | p[i + 1]);
	if (n & 1)
		sum += (unsigned)(p[n - 1] << 8);
	return sum;
}

/* rstbcast: see above. 0, or 1 when a step fails (said on stderr). */
static int rst_broadcast(struct sockaddr_in *a, unsigned secs)
{
	int ifindex = (int)if_nametoindex("eth0");
	/* every frame, sent ones too (only ETH_P_ALL sees those); packets without the frame's header */
	int pk = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_ALL));
	struct sockaddr_ll ll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = ifindex };
	if (!ifindex || pk < 0 || bind(pk, (struct sockaddr *)&ll, sizeof ll) < 0) {
		perror("packet socket");
		return 1;
	}
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(s, (struct sockaddr *)a, sizeof a[0]) < 0) {
		perror("connect");
		return 1;
	}
	struct sockaddr_in me;
	socklen_t len = sizeof me;
	getsockname(s, (struct sockaddr *)&me, &len);
	/* the handshake's last packet, as it left: its addresses, ports and sequence numbers */
	unsigned char f[2048];
	struct timeval tv = { 3, 0 };
	setsockopt(pk, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	for (;;) {
		struct sockaddr_ll from;
		socklen_t fl = sizeof from;
		ssize_t n = recvfrom(pk, f, sizeof f, 0, (struct sockaddr *)&from, &fl);
		if (n < 0) {
			perror("no packet of the connection seen");
			return 1;
		}
		struct iphdr *ip = (struct iphdr *)f;
		if (n < 40 || from.sll_protocol != htons(ETH_P_IP) || ip->protocol != IPPROTO_TCP ||
		    ip->saddr != me.sin_addr.s_addr)
			continue;
		struct tcphdr *t = (struct tcphdr *)(f + ip->ihl * 4);
		if (t->source != me.sin_port || t->dest != a->sin_port || !t->ack || t->syn)
			continue;
		/* the same packet, as a reset, in a frame to everyone */
		unsigned char frame[40] = { 0 };
		struct iphdr *oip = (struct iphdr *)frame;
		*oip = *ip;
		oip->ihl = 5, oip->tot_len = htons(40), oip->ttl = 64, oip->check = 0;
		oip->check = htons(fold(sum16((unsigned char *)oip, 20, 0)));
		struct tcphdr *ot = (struct tcphdr *)(frame + 20);
		memset(ot, 0, sizeof *ot);
		ot->source = t->source, ot->dest = t->dest, ot->seq = t->seq, ot->ack_seq = t->ack_seq;
		ot->doff = 5, ot->rst = 1, ot->ack = 1;
		unsigned char pseudo[12];
		memcpy(pseudo, &oip->saddr, 4);
		memcpy(pseudo + 4, &oip->daddr, 4);
		pseudo[8] = 0, pseudo[9] = IPPROTO_TCP, pseudo[10] = 0, pseudo[11] = 20;
		ot->check = htons(fold(sum16((unsigned char *)ot, 20, sum16(pseudo, 12, 0))));
		struct sockaddr_ll to = {
			.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP), .sll_ifindex = ifindex, .sll_halen = 6
		};
		memset(to.sll_addr, 0xff, 6);
		if (sendto(pk, frame, sizeof frame, 0, (struct sockaddr *)&to, sizeof to) != (ssize_t)sizeof frame) {
			perror("send");
			return 1;
		}
		printf("sent\n");
		fflush(stdout);
		sleep(secs);
		return 0;
	}
}

/* arp: see above. */
static int arp_requests(struct in_addr target, int n, int *ok, int *refused)
{
	int ifindex = (int)if_nametoindex("eth0");
	int pk = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_ARP));
	if (!ifindex || pk < 0) {
		perror("packet socket");
		return 1;
	}
	unsigned char mac[6] = { 0x02, 0x42, 0, 0, 0, 1 };
	for (int i = 0; i < n; i++) {
		/* htype 1, ptype IPv4, hlen 6, plen 4, op request; sender MAC and IP, target MAC 0 and IP */
		unsigned char a[28] = { 0, 1, 8, 0, 6, 4, 0, 1 };
		memcpy(a + 8, mac, 6);
		a[14] = 10, a[15] = 200, a[16] = (unsigned char)(i >> 8), a[17] = (unsigned char)(i & 255);
		memcpy(a + 24, &target, 4);
		struct sockaddr_ll to = {
			.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ARP), .sll_ifindex = ifindex, .sll_halen = 6
		};
		memset(to.sll_addr, 0xff, 6);
		if (sendto(pk, a, sizeof a, 0, (struct sockaddr *)&to, sizeof to) == (ssize_t)sizeof a)
			(*ok)++;
		else
			(*refused)++;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	if (argc < 4 || inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "usage: egress-flood udp ADDR N | tcp ADDR PORT N SECS\n");
		return 2;
	}
	int ok = 0, refused = 0;
	if (strcmp(argv[1], "icmperr") == 0) {
		/* IP header, ICMP type 3 code 3, the "original" datagram's IP header and 8 bytes of UDP */
		unsigned char p[56] = { 0 };
		struct iphdr *ip = (struct iphdr *)p, *inner = (struct iphdr *)(p + 28);
		struct sockaddr_in to = { .sin_family = AF_INET };
		if (inet_pton(AF_INET, argv[3], &to.sin_addr) != 1)
			return 2;
		ip->version = 4, ip->ihl = 5, ip->ttl = 64, ip->protocol = IPPROTO_ICMP;
		ip->tot_len = htons(sizeof p), ip->saddr = a.sin_addr.s_addr, ip->daddr = to.sin_addr.s_addr;
		p[20] = 3, p[21] = 3;
		*inner = *ip;
		inner->protocol = IPPROTO_UDP, inner->tot_len = htons(28);
		inner->saddr = to.sin_addr.s_addr, inner->daddr = a.sin_addr.s_addr;
		p[48] = 0x4e, p[49] = 0x21, p[50] = 0x27, p[51] = 0x0f; /* ports 20001 -> 9999 */
		unsigned sum = 0;
		for (int i = 20; i < (int)sizeof p; i += 2)
			sum += (unsigned)(p[i] << 8 | p[i + 1]);
		while (sum >> 16)
			sum = (sum & 0xffff) + (sum >> 16);
		p[22] = (unsigned char)(~sum >> 8), p[23] = (unsigned char)~sum;
		int s = socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
		if (s >= 0 && sendto(s, p, sizeof p, 0, (struct sockaddr *)&to, sizeof to) == sizeof p)
			ok++;
		else
			refused++;
	} else if (strcmp(argv[1], "udp") == 0) {
		int s = socket(AF_INET, SOCK_DGRAM, 0), n = atoi(argv[3]);
		for (int i = 1; i <= n; i++) {
			a.sin_port = htons((unsigned short)i);
			if (sendto(s, "x", 1, 0, (struct sockaddr *)&a, sizeof a) == 1)
				ok++;
			else
				refused++;
		}
	} else if (strcmp(argv[1], "arp") == 0) {
		if (arp_requests(a.sin_addr, atoi(argv[3]), &ok, &refused))
			return 1;
	} else if (strcmp(argv[1], "rstbcast") == 0 && argc == 5) {
		a.sin_port = htons((unsigned short)atoi(argv[3]));
		return rst_broadcast(&a, (unsigned)atoi(argv[4]));
	} else if (strcmp(argv[1], "rst1") == 0 && argc == 5) {
		a.sin_port = htons((unsigned short)atoi(argv[3]));
		for (int i = 0; i < atoi(argv[4]); i++) {
			int s = socket(AF_INET, SOCK_STREAM, 0), ttl = 1;
			struct linger l = { 1, 0 };
			if (connect(s, (struct sockaddr *)&a, sizeof a) == 0 &&
			    setsockopt(s, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) == 0 &&
			    setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0)
				ok++;
			else
				refused++;
			close(s);
		}
	} else if (strcmp(argv[1], "tcp") == 0 && argc == 6) {
		a.sin_port = htons((unsigned short)atoi(argv[3]));
		int n = atoi(argv[4]);
		struct timeval tv = { 3, 0 };
		for (int i = 0; i < n; i++) {
			int s = socket(AF_INET, SOCK_STREAM, 0);
			setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
			if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
				ok++; /* kept open */
			} else {
				refused++;
				close(s);
			}
		}
		printf("ok %d refused %d\n", ok, refused);
		fflush(stdout);
		sleep((unsigned)atoi(argv[5]));
		return 0;
	} else {
		fprintf(stderr, "usage: egress-flood udp ADDR N | tcp ADDR PORT N SECS\n");
		return 2;
	}
	printf("ok %d refused %d\n", ok, refused);
	return 0;
}
