# Run one slice of a tune on a GPU machine within one device call, and pack what it wrote.
#
#   bash benchmarks/device/tune-slice.sh DEADLINE_S OUT_NAME TUNE_ARGS...
#
# Runs `orchestrate tune TUNE_ARGS... --out runs/OUT_NAME` (add --resume to carry on from an
# earlier call's folder: copy it here to runs/seed/OUT_NAME and name that in `carry`),
# interrupting it with SIGINT at DEADLINE_S seconds so that it cancels its jobs cleanly as on
# Ctrl-C and keeps every finished row (and snapshots the shared cache's autotune entries into
# runs/OUT_NAME/shared-cache.parquet, so that the next slice's fresh Redis starts with them:
# docs/shared-cache.md). Then packs runs/OUT_NAME into $OUT/OUT_NAME.tgz (hive folder names
# survive inside the archive) with the tune's log and its wall time in seconds (OUT_NAME.wall,
# written last).
#
# On the device machine it sources `.devcarry/setup.sh` itself where Ray is not importable yet
# (../shared/device/README.md): a command that forgot it failed at once, 30 s of device time.
set -u
deadline=$1; name=$2; shift 2
if [ -f .devcarry/setup.sh ] && ! python3 -c 'import ray' 2>/dev/null; then
    . .devcarry/setup.sh
fi
out=${OUT:-/tmp/out}
mkdir -p runs "$out"
# An earlier call's folder comes as runs/seed/NAME, never as runs/NAME: `carry` puts the paths it
# names back on every call, and a copy put back over a folder a background tune writes to loses
# its rows (session 22: two H100 cells). Copied once, when runs/NAME does not exist yet.
if [ -d "runs/seed/$name" ] && [ ! -e "runs/$name" ]; then
    cp -a "runs/seed/$name" "runs/$name"
fi
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pyc RAY_AUTH_MODE=disabled
t0=$(date +%s.%N)
timeout -s INT -k 30 "$deadline" python3 -m orchestrator tune "$@" --out "runs/$name" 2>&1 | tee "$out/$name.log"
rc=${PIPESTATUS[0]}
t1=$(date +%s.%N)
wall=$(python3 -c "print(round($t1 - $t0, 1))")
echo "tune rc=$rc wall=$wall s"
tar -C runs -czf "$out/$name.tgz" "$name"
# last, so that a caller waiting for it (a slice run in the background) finds the archive whole
echo "$wall" >"$out/$name.wall"
exit 0
