#!/usr/bin/env bash
# deploy_systemd.sh — deploy/systemd/*.service are valid and hardened (docs/operations.md,
# "Runbook"). For each unit, a copy whose ExecStart names the built medley ($MEDLEY_BIN;
# verify insists the binary exists) must pass `systemd-analyze verify` with no message at
# all (verify exits 0 on an unknown key or a bad value, printing a warning, so any output
# fails), and `systemd-analyze security --offline` must rate it at most 2.5 (0 best, 10 worst;
# the old deploy/medley-worker.service scored 8.5). Controls: a unit with a
# misspelt key must print a warning and one whose binary is missing must fail, or verify
# checks nothing here. Also: TimeoutStopSec above the worker's --grace-ms. No running
# systemd is needed (systemd-analyze reads the files). systemd-analyze: Debian package
# systemd (scripts/setup.sh).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=${MEDLEY_BIN:-$src/build/cli/medley}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v systemd-analyze >/dev/null || fail "systemd-analyze not found (apt-get install systemd)"
[ -x "$bin" ] || fail "medley binary $bin not found (set MEDLEY_BIN)"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
tmp=$(mktemp -d /tmp/medley-it-systemd.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# verify FILE: prints what systemd-analyze said; returns its exit status
verify() { SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$1" 2>&1; }

for unit in medley-worker medley-scheduler medley-api medley-dashboard; do
    f=$src/deploy/systemd/$unit.service
    [ -f "$f" ] || fail "$f missing"
    grep -q '^ExecStart=/usr/local/bin/medley ' "$f" || fail "$unit: ExecStart is not /usr/local/bin/medley"
    sed "s#/usr/local/bin/medley#$bin#" "$f" >"$tmp/$unit.service"
    out=$(verify "$tmp/$unit.service") || fail "$unit: systemd-analyze verify failed: $out"
    [ -z "$out" ] || fail "$unit: systemd-analyze verify warns: $out"
    sec=$(systemd-analyze security --offline=true --man=no --threshold=25 "$tmp/$unit.service" 2>&1) ||
        fail "$unit: exposure above 2.5: $(echo "$sec" | tail -1)"
    for need in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
        CapabilityBoundingSet= SystemCallFilter=@system-service Restart=always EnvironmentFile=; do
        grep -q "^$need" "$f" || fail "$unit: no $need"
    done
    echo "ok: $unit verifies cleanly; $(echo "$sec" | tail -1 | sed 's/^→ //')"
done

# the worker's stop timeout covers its grace period plus the hand-back
w=$src/deploy/systemd/medley-worker.service
grace_ms=$(sed -n 's/^ExecStart=.* --grace-ms \([0-9]*\).*/\1/p' "$w")
stop_s=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "$w")
[ -n "$grace_ms" ] && [ -n "$stop_s" ] || fail "worker: no --grace-ms in ExecStart or no TimeoutStopSec"
[ $((stop_s * 1000)) -ge $((grace_ms + 10000)) ] ||
    fail "worker: TimeoutStopSec=$stop_s s leaves under 10 s after --grace-ms $grace_ms"
echo "ok: worker TimeoutStopSec ${stop_s} s > --grace-ms ${grace_ms} ms + 10 s"

# controls: verify really reads these files here
sed 's/^KillMode=mixed/KilMode=mixed/' "$tmp/medley-worker.service" >"$tmp/typo.service"
out=$(verify "$tmp/typo.service") || true
echo "$out" | grep -q "KilMode" || fail "a misspelt key went unnoticed: verify checks nothing here"
sed "s#^ExecStart=$bin#ExecStart=$tmp/nonexistent#" "$tmp/medley-scheduler.service" >"$tmp/nobin.service"
if verify "$tmp/nobin.service" >/dev/null; then fail "a missing ExecStart binary passed verify"; fi
echo "ok: controls (a misspelt key warns, a missing binary fails)"
echo "deploy_systemd: ok"
