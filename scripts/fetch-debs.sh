#!/usr/bin/env bash
# Downloads the Debian packages that scripts/gpu-check.py --debs DIR unpacks for a machine without
# a package registry: the headers and static libraries gpuq builds against (SQLite, zlib,
# nlohmann-json, CLI11, doctest) and the Fashion-MNIST files the example jobs train on.
# Run it where `apt-get download` works (Debian 12, amd64). Usage: scripts/fetch-debs.sh DIR
set -euo pipefail
dir=${1:?usage: scripts/fetch-debs.sh DIR}
mkdir -p "$dir"
cd "$dir"
apt-get download libsqlite3-dev zlib1g-dev nlohmann-json3-dev libcli11-dev doctest-dev dataset-fashion-mnist
ls -l ./*.deb
