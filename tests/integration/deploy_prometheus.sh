#!/usr/bin/env bash
# deploy_prometheus.sh — deploy/prometheus: `promtool check rules` on alerts.yml, `promtool
# test rules` on alerts_test.yml (alerts fire on the series they should, after their `for`,
# and not on the near misses), `promtool check config` on scrape.yml, and every medley_*
# metric the rules use is one docs/operations.md's "Metrics" section lists. promtool: Debian
# package prometheus (scripts/setup.sh).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v promtool >/dev/null || fail "promtool not found (apt-get install prometheus)"
cd "$src/deploy/prometheus"
promtool check rules alerts.yml || fail "promtool check rules alerts.yml"
promtool test rules alerts_test.yml || fail "promtool test rules alerts_test.yml"
promtool check config scrape.yml || fail "promtool check config scrape.yml"
used=$(grep -o 'medley_[a-z_]*' alerts.yml | sort -u)
doc=$(awk '/^## Metrics/{on=1; next} /^## /{on=0} on' "$src/docs/operations.md")
if [ -z "$doc" ]; then
    echo "note: docs/operations.md has no \"## Metrics\" section: metric names not checked"
else
    for m in $used; do
        # histograms are listed by their base name (_bucket/_sum/_count series)
        base=${m%_bucket}
        grep -q "\`$base\`" <<<"$doc" || fail "alerts.yml uses $m, not in docs/operations.md \"Metrics\""
    done
    echo "ok: the $(wc -w <<<"$used") medley_* metrics of alerts.yml are all documented"
fi
echo "deploy_prometheus: ok"
