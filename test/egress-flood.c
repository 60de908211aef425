/*
 * Opens many connections from inside a machine, for test/egress.test.ts (its caps on connections):
 *   egress-flood udp ADDR N            one datagram to each of ports 1..N of ADDR, from one socket
 *   egress-flood tcp ADDR PORT N SECS  N connections to ADDR:PORT (3 s each at most), kept SECS
 *   egress-flood icmperr SRC DST       an ICMP "port unreachable" from SRC to DST about a datagram no
 *                                      connection table knows (a raw packet: CAP_NET_RAW)
 *   egress-flood rst1 ADDR PORT N      N connections to ADDR:PORT, each then reset with a TTL of 1
 *                                      (a reset the first router drops: any process may send one)
 * Prints "ok N refused M" (udp: sent and failed) and exits 0.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

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
