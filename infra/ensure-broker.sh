#!/usr/bin/env bash
# Make sure a RabbitMQ broker answers on 127.0.0.1:5672 (start the local one if it is installed but down) and
# that its management API (15672, used by `fedat provision`) and Prometheus endpoint (15692) are enabled.
# Idempotent: when everything is already up it only checks (well under a second).
set -euo pipefail
MANAGEMENT_URL="${FEDAT_MANAGEMENT_URL:-http://127.0.0.1:15672}"
PLUGINS=(rabbitmq_management rabbitmq_prometheus)

answers() { timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672' 2>/dev/null; }
management_answers() {
  # Any HTTP answer to an authenticated request means the API is up; curl -f fails on 401 as well.
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -m 3 -u guest:guest -o /dev/null "$MANAGEMENT_URL/api/overview" 2>/dev/null
  else
    python3 - "$MANAGEMENT_URL/api/overview" <<'EOF' 2>/dev/null
import base64, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
urllib.request.urlopen(req, timeout=3).read()
EOF
  fi
}

if ! answers; then
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "No RabbitMQ answers on 127.0.0.1:5672 and rabbitmq-server is not installed." >&2
    echo "Install it (Debian: apt-get install rabbitmq-server) or point FEDAT_AMQP_URL at a broker." >&2
    exit 1
  fi
  echo "starting rabbitmq-server ..." >&2
  rabbitmq-server -detached
  up=0
  for _ in $(seq 1 60); do
    if answers && rabbitmqctl await_startup >/dev/null 2>&1; then up=1; break; fi
    sleep 1
  done
  if [ "$up" != 1 ]; then
    echo "rabbitmq-server did not come up within 60 s (see /var/log/rabbitmq/)" >&2
    exit 1
  fi
fi

# Fast path: the API answers, so the management plugin is on; the Prometheus port tells about the other one.
prometheus_answers() { timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/15692' 2>/dev/null; }
if management_answers && prometheus_answers; then exit 0; fi

if ! command -v rabbitmq-plugins >/dev/null 2>&1; then
  echo "The broker on 127.0.0.1:5672 has no management API at $MANAGEMENT_URL and rabbitmq-plugins is not here:" >&2
  echo "enable ${PLUGINS[*]} on that broker." >&2
  exit 1
fi
enabled="$(rabbitmq-plugins list -e -m 2>/dev/null || true)"
missing=()
for p in "${PLUGINS[@]}"; do
  grep -qx "$p" <<<"$enabled" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "enabling ${missing[*]} ..." >&2
  rabbitmq-plugins enable "${missing[@]}" >/dev/null
fi
for _ in $(seq 1 60); do
  if management_answers && prometheus_answers; then exit 0; fi
  sleep 0.5
done
echo "the management API ($MANAGEMENT_URL/api/overview, guest:guest) or 127.0.0.1:15692 did not answer within 30 s" >&2
exit 1
