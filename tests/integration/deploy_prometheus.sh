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
# every alert has a test in which it fires (exp_alerts with an entry): a rule nobody saw
# fire is a rule nobody knows fires
for a in $(awk '$2 == "alert:" {print $3}' alerts.yml); do
    awk -v a="$a" '$1 == "alertname:" {on = ($2 == a)} on && $1 == "-" && $2 == "exp_labels:" {n++}
                   END {exit n > 0 ? 0 : 1}' alerts_test.yml ||
        fail "alert $a has no promtool test in alerts_test.yml in which it fires"
done
echo "ok: every alert of alerts.yml fires in a test of alerts_test.yml"
used=$(grep -o 'medley_[a-z_]*' alerts.yml | grep -v '_$' | sort -u) # not a regex's stem
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
