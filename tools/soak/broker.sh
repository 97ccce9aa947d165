#!/usr/bin/env bash
# A mosquitto for tools/soak, in the foreground, on 127.0.0.1:PORT with tools/soak/mosquitto.conf.
#
#   tools/soak/broker.sh PORT [MOSQUITTO_BIN]   run it (default binary: the installed /usr/sbin/mosquitto)
#   tools/soak/broker.sh fetch-2.0.11           extract Debian 12's own mosquitto 2.0.11 (which
#                                               ignores the client's Receive Maximum) into
#                                               target/mosquitto-2.0.11 and print its binary's path
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ "${1:-}" = fetch-2.0.11 ]; then
    dir="$root/target/mosquitto-2.0.11"
    bin="$dir/usr/sbin/mosquitto"
    if [ ! -x "$bin" ]; then
        version="$(apt-cache madison mosquitto | awk '$3 ~ /^2\.0\.11-/ {print $3; exit}')"
        [ -n "$version" ] || { echo "broker.sh: no mosquitto 2.0.11 in apt's lists (run apt-get update)" >&2; exit 1; }
        mkdir -p "$root/target/debs"
        # apt-get download writes into the current directory.
        (cd "$root/target/debs" && apt-get download "mosquitto=$version" >&2)
        dpkg-deb -x "$root/target/debs/mosquitto_${version//:/%3a}_$(dpkg --print-architecture).deb" "$dir"
    fi
    if ldd "$bin" | grep -q 'not found'; then
        echo "broker.sh: $bin misses shared libraries (apt-get install them):" >&2
        ldd "$bin" | grep 'not found' >&2
        exit 1
    fi
    echo "$bin"
    exit 0
fi
port="${1:?usage: broker.sh PORT [MOSQUITTO_BIN] | broker.sh fetch-2.0.11}"
bin="${2:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}"
mkdir -p "$root/target/soak"
conf="$root/target/soak/mosquitto-$port.conf"
sed "s/^listener 18830 127.0.0.1$/listener $port 127.0.0.1/" "$root/tools/soak/mosquitto.conf" >"$conf"
echo "broker.sh: $("$bin" -h 2>/dev/null | head -1 || true) on 127.0.0.1:$port ($conf)" >&2
exec "$bin" -c "$conf"
