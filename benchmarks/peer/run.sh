#!/usr/bin/env bash
# Runs the peer benchmarks: BullMQ on redis-server (bullmq.js), then raw nats.js JetStream
# on nats-server (natsjs.js). Each starts and stops its own server on a free loopback port
# with a temporary directory, writes benchmarks/results/peer_{bullmq,natsjs}.json and prints
# a summary table.
#
#   benchmarks/peer/run.sh [--quick] [--runs N] [bullmq|natsjs ...]
#
# Needs node (18 or later) and npm, and Debian's redis-server and nats-server (or
# AMP_REDIS_SERVER / AMP_NATS_SERVER naming the binaries). The locked npm packages
# (package-lock.json: bullmq, nats) are installed here with `npm ci` when missing or stale.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
args=()
which=()
while (($#)); do
  case "$1" in
    --quick) args+=("$1") ;;
    --runs) args+=("$1" "${2:?--runs needs a value}"); shift ;;
    --runs=*) args+=("$1") ;;
    bullmq | natsjs) which+=("$1") ;;
    -h | --help)
      sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0 ;;
    *) echo "run.sh: unknown argument $1 (use the scripts directly for --out)" >&2; exit 2 ;;
  esac
  shift
done
((${#which[@]})) || which=(bullmq natsjs)

for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "run.sh: $tool not found" >&2; exit 1; }
done
for b in "${which[@]}"; do
  case "$b" in
    bullmq) bin="${AMP_REDIS_SERVER:-redis-server}"; pkg=redis-server ;;
    natsjs) bin="${AMP_NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}"; pkg=nats-server ;;
  esac
  if ! command -v "$bin" >/dev/null 2>&1; then
    echo "run.sh: $bin not found (Debian package $pkg)" >&2
    exit 1
  fi
done

# npm ci when node_modules is missing or older than the lock file.
if [[ ! -f "$here/node_modules/.package-lock.json" || "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]]; then
  (cd "$here" && npm ci --no-audit --no-fund)
fi

for b in "${which[@]}"; do
  node "$here/$b.js" "${args[@]}"
done
