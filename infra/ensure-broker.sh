#!/usr/bin/env bash
# Make sure a RabbitMQ broker answers on 127.0.0.1:5672: start the local one if it is installed but down.
set -euo pipefail
answers() { timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672' 2>/dev/null; }
if answers; then exit 0; fi
if ! command -v rabbitmq-server >/dev/null 2>&1; then
  echo "No RabbitMQ answers on 127.0.0.1:5672 and rabbitmq-server is not installed." >&2
  echo "Install it (Debian: apt-get install rabbitmq-server) or point FEDAT_AMQP_URL at a broker." >&2
  exit 1
fi
echo "starting rabbitmq-server ..." >&2
rabbitmq-server -detached
for _ in $(seq 1 60); do
  if answers && rabbitmqctl await_startup >/dev/null 2>&1; then exit 0; fi
  sleep 1
done
echo "rabbitmq-server did not come up within 60 s (see /var/log/rabbitmq/)" >&2
exit 1
