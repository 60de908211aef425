#!/bin/sh
# The server: GET /cgi-bin/hello answers with the store's greeting, fetched by name over `back`.
if greeting=$(wget -q -O- http://store:8081/cgi-bin/kv/greeting); then
  printf 'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n%s from %s\n' "$greeting" "$(hostname)"
else
  printf 'HTTP/1.0 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\nthe store did not answer\n'
fi
