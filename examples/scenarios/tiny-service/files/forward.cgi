#!/bin/sh
# The proxy: GET /cgi-bin/forward/NAME fetches http://server:8080/cgi-bin/NAME (busybox httpd
# cannot proxy by itself) and passes the answer on, marked as having come through here.
case $PATH_INFO in
  /* ) ;;
  * ) printf 'HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n\r\nuse /cgi-bin/forward/NAME\n'; exit 0 ;;
esac
if body=$(wget -q -O- "http://server:8080/cgi-bin$PATH_INFO"); then
  printf 'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n%s (via %s)\n' "$body" "$(hostname)"
else
  printf 'HTTP/1.0 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\nthe server did not answer\n'
fi
