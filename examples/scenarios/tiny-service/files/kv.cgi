#!/bin/sh
# The store: a tiny key-value store behind busybox httpd.
#   GET  /cgi-bin/kv/KEY          the value, or 404
#   POST /cgi-bin/kv/KEY (body)   stores the body as the value
dir=${KV_DIR:-/var/lib/kv}
key=${PATH_INFO#/}

reply() { # STATUS [TEXT]
  printf 'HTTP/1.0 %s\r\nContent-Type: text/plain\r\n\r\n' "$1"
  [ -z "$2" ] || printf '%s\n' "$2"
}

case $key in
  '' | *[!A-Za-z0-9_-]*) reply '400 Bad Request' 'keys are letters, digits, "_" and "-"'; exit 0 ;;
esac

case $REQUEST_METHOD in
  GET)
    if [ -f "$dir/$key" ]; then reply '200 OK'; cat "$dir/$key"; else reply '404 Not Found' "no key $key"; fi ;;
  POST)
    head -c "${CONTENT_LENGTH:-0}" >"$dir/.$key.new" && mv "$dir/.$key.new" "$dir/$key"
    echo "set $key" >>/var/log/kv.log
    reply '200 OK' stored ;;
  *)
    reply '405 Method Not Allowed' 'GET or POST' ;;
esac
