#!/usr/bin/env bash
# How long a new user waits: a clean Debian 12 root (debootstrap, as a new machine has
# it, plus `make` and `git`), a clone of this repository in it, then `make serve` timed
# until the server answers /health and a completion. Nothing of this machine's caches
# (packages, ccache, model) is used. Prints the seconds of each phase.
#   tools/time_to_first_request.sh [WORK_DIR]     (root; needs debootstrap, curl)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /var/tmp/dserve-first-request.XXXXXX)}
root=$work/root
port=8123
mkdir -p "$work"

cleanup() {
  if [ -n "${server:-}" ]; then kill -- -"$server" 2>/dev/null; wait "$server" 2>/dev/null || true; fi
  for m in proc dev; do umount -l "$root/$m" 2>/dev/null || true; done
}
trap cleanup EXIT

[ -x "$root/bin/bash" ] || debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
cp /etc/resolv.conf "$root/etc/resolv.conf"
# pip behind a proxy that re-signs TLS needs this machine's CA bundle (not a part of
# what a user installs; left out of the timing's meaning).
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/host-ca.crt"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
chroot "$root" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq make git >/dev/null'
rm -rf "$root/dserve"
git clone -q "$repo" "$root/dserve"

start=$(date +%s)
setsid chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  PIP_CERT=/etc/host-ca.crt bash -c "cd /dserve && make serve PORT=$port" > "$work/serve.log" 2>&1 &
server=$!
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
  kill -0 "$server" 2>/dev/null || { tail -30 "$work/serve.log"; echo "make serve exited"; exit 1; }
  sleep 1
done
healthy=$(date +%s)
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is", "max_tokens": 8}'
echo
answered=$(date +%s)
test ! -e "$root/dserve/.venv" || { echo "make serve created a Python venv"; exit 1; }
echo "make serve: healthy after $((healthy - start)) s, first completion after $((answered - start)) s (no .venv created)"
