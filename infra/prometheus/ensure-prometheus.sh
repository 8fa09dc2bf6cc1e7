#!/usr/bin/env bash
# The Prometheus server and promtool come from the Debian package `prometheus` (2.42; no download at run time).
# Installing it starts no service on this kind of machine; `fedat run --prometheus` runs the binary itself.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then exit 0; fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q prometheus >/dev/null; }
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "prometheus/promtool missing: install the Debian package prometheus (apt-get install -y prometheus)" >&2
  exit 1
fi
