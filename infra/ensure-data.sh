#!/usr/bin/env bash
# Fashion-MNIST comes from the Debian package dataset-fashion-mnist (no download at run time).
set -euo pipefail
DIR=${FEDAT_DATA_ROOT:-/usr/share/datasets/fashion-mnist}
if [ -f "$DIR/train-images-idx3-ubyte.gz" ]; then exit 0; fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null; }
fi
if [ ! -f "$DIR/train-images-idx3-ubyte.gz" ]; then
  echo "Fashion-MNIST missing: expected $DIR/train-images-idx3-ubyte.gz; install the Debian package dataset-fashion-mnist" >&2
  exit 1
fi
