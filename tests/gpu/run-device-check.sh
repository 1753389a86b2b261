#!/usr/bin/env bash
# run-device-check.sh — the CUDA backend's whole check on a GPU host, in one go (< 6 min on
# an H200): build (or use binaries packed by pack-device-check.sh), run the GPU tests, write
# a profile with `medley profile --device cuda:0`, measure the device's copy bandwidth and
# bf16 matrix rate through PyTorch, time the GEMV of every weight type
# against cuBLAS (bench_gemv.c), attention and sampling against PyTorch, run the GPU benchmark (the kernels alone,
# and the whole engine on a synthetic Llama-3-8B, with and without CUDA graphs) and its peer
# (PyTorch + transformers `generate`, same model shape, same GPU, same run), and write every
# log and result to $OUT (default ./devcheck-out): summary.md says what passed and the
# figures against the issue's targets.
#
#   bash tests/gpu/run-device-check.sh [--pack-out] [--emu]
#
# --pack-out: at the end, everything in $OUT but summary.md goes into $OUT/logs.tgz (the
# device tool brings back at most 8 files from $OUT; the check writes about 30).
# --emu: the rehearsal, on a machine without a GPU: every step of the check, in order, with
# the same parsing of its results, on the CPU emulator's builds of the same binaries
# (tests/cuda_emu_rt.cmake: *_emu, medley_emu; from $MEDLEY_EMU_BUILD, default ./build) at
# small shapes (synthetic:tiny-hd64 for the profiles, a 2-layer width-256 model for the
# benchmark); the PyTorch steps are left out (they need the GPU) and their comparisons then
# report the missing input. Its figures mean nothing; any FAILED line fails it. ctest runs
# it as test_device_check_emu.
#
# Environment:
#   OUT                  results folder (the device tool collects it)
#   MEDLEY_DEVCHECK_DIR  prebuilt folder from tests/gpu/pack-device-check.sh (default
#                        .devcheck when it exists, unpacked from .devpack/devcheck.tar.xz when
#                        only that came): bin/ and lib/ are used instead of building, for GPU
#                        hosts without medley's Debian build dependencies
#   MEDLEY_MODELS        folder holding SmolLM2-135M-Instruct.Q4_1.gguf for the e2e test and
#                        the profile; otherwise assembled from .devmodel*/part-* if present
#   BENCH_LAYERS         layers of the synthetic Llama-3-8B (default 32)
#   MEDLEY_DEVCHECK_TESTS  the GPU tests to run (default: all of them; with --emu the quick
#                        ones, the others being ctest entries of their own)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
EMU=0
PACK_OUT=0
for a in "$@"; do
    case $a in
    --pack-out) PACK_OUT=1 ;;
    --emu) EMU=1 ;;
    *) echo "usage: bash tests/gpu/run-device-check.sh [--pack-out] [--emu]" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$ROOT/devcheck-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
# tmo SECONDS: a step's time limit on the device (it keeps the check inside the lease); none
# in the rehearsal, where the emulator's speed depends on the machine and its load, so a slow
# machine cannot fail a step (ctest's TIMEOUT still ends a hang)
tmo() { if [ $EMU = 1 ]; then echo 0; else echo "$1"; fi; }
T0=$(date +%s)

note "# medley CUDA device check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
[ $EMU = 1 ] && note "REHEARSAL on the CPU emulator (--emu): small shapes, figures meaningless"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv \
    >"$OUT/device.txt" 2>&1 || true
note "device: $(tail -n +2 "$OUT/device.txt" | head -1)"

# ---- binaries ------------------------------------------------------------------------
PRE=${MEDLEY_DEVCHECK_DIR:-}
# the pack as carried: one xz archive of .devcheck (pack-device-check.sh)
if [ -z "$PRE" ] && [ $EMU = 0 ] && [ ! -d .devcheck/bin ] && [ -r .devpack/devcheck.tar.xz ]; then
    python3 -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(".", **kw)' \
        .devpack/devcheck.tar.xz || note "binaries: .devpack/devcheck.tar.xz does not unpack"
fi
[ -z "$PRE" ] && [ $EMU = 0 ] && [ -d .devcheck/bin ] && PRE=.devcheck
if [ $EMU = 1 ]; then
    EB=${MEDLEY_EMU_BUILD:-$ROOT/build}
    if [ ! -x "$EB/tests/medley_emu" ]; then
        note "binaries: $EB/tests/medley_emu not built (the emulator's targets need the CUDA"
        note "toolkit's headers, C++20 and python3: tests/cuda_emu_rt.cmake)"
        exit 1
    fi
    note "binaries: the emulator's builds in $EB/tests"
elif [ -n "$PRE" ]; then
    BIN=$ROOT/$PRE/bin
    export LD_LIBRARY_PATH="$ROOT/$PRE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    note "binaries: prebuilt in $PRE ($(cat "$PRE/BUILT" 2>/dev/null))"
else
    BIN=$ROOT/build-gpu/bin
    mkdir -p "$BIN"
    gen=""
    command -v ninja >/dev/null && gen="-G Ninja"
    if cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEDLEY_WERROR=ON \
        -DMEDLEY_CUDA=ON -DMEDLEY_CUDA_ARCHS=90 >"$OUT/build.log" 2>&1 &&
        cmake --build build-gpu -j "$(nproc)" --target test_cuda_device_select test_cuda_step_plan test_cuda_graph_cache test_cuda_nccl_load \
            test_cuda_kernels test_cuda_backend test_cuda_e2e test_cuda_graphs test_cuda_engine test_cuda_tp test_cuda_encoder medley_gpu_bench medley_gemv_bench medley_attn_bench medley_sample_bench medley >>"$OUT/build.log" 2>&1; then
        cp build-gpu/tests/test_cuda_* build-gpu/tests/medley_gpu_bench build-gpu/tests/medley_gemv_bench build-gpu/tests/medley_attn_bench build-gpu/tests/medley_sample_bench build-gpu/cli/medley "$BIN/"
        note "build: ok (sm_90, warnings as errors)"
    else
        note "build: FAILED (see build.log; on hosts without jansson/hiredis/cmocka/glpk/pcre2"
        note "dev packages, run tests/gpu/pack-device-check.sh where they are and carry .devcheck)"
        tail -20 "$OUT/build.log"
        exit 1
    fi
fi
export MEDLEY_FIXTURES_DIR=$ROOT/tests/fixtures
# bin NAME: the binary the check runs for NAME (with --emu its *_emu build where there is
# one: the host-only tests have none and skip or run as they are)
bin() {
    if [ $EMU = 0 ]; then
        echo "$BIN/$1"
    elif [ "$1" = medley ]; then
        echo "$EB/tests/medley_emu"
    elif [ -x "$EB/tests/$1_emu" ]; then
        echo "$EB/tests/$1_emu"
    else
        echo "$EB/tests/$1"
    fi
}
# what each step runs: the check's shapes, or the rehearsal's
L=${BENCH_LAYERS:-32}
TESTS="test_cuda_device_select test_cuda_step_plan test_cuda_graph_cache test_cuda_nccl_load
    test_cuda_kernels test_cuda_backend test_cuda_e2e test_cuda_graphs test_cuda_engine
    test_cuda_tp test_cuda_encoder"
TEST_TIMEOUT=240
PROFILE_MODEL=
PROFILE_ARGS="--model-name smollm2-135m --batches 1,8,64 --contexts 128,512 --gen 32"
GEMV_ARGS=""
ATTN_ARGS=""
SAMPLE_ARGS=""
GPU_BENCH_ARGS="--layers $L --prompt 128 --gen 128 --batch 256"
ENGINE_MODEL=synthetic:llama-3-8b
ENGINE_ARGS="--batches 1,256 --contexts 128 --gen 128"
ENGINE_NOGRAPH_ARGS="--batches 1 --contexts 128 --gen 64"
Q4_ARGS="--batches 32,128 --contexts 128 --gen 32"
if [ $EMU = 1 ]; then
    TESTS="test_cuda_device_select test_cuda_step_plan test_cuda_graph_cache test_cuda_nccl_load
        test_cuda_backend test_cuda_engine test_cuda_encoder"
    TEST_TIMEOUT=600
    export MEDLEY_GPU_TEST_SMALL=1 MEDLEY_GPU_TEST_MODEL=synthetic:tiny-hd64:q4_0
    PROFILE_MODEL=synthetic:tiny-hd64:q4_0
    PROFILE_ARGS="--model-name tiny-hd64 --batches 1,4 --contexts 32,64 --gen 8"
    GEMV_ARGS="--n 256 --k 256 --ms 1,16,64 --per-graph 1"
    ATTN_ARGS="--lens 64 --decode 4:64,1:256"
    SAMPLE_ARGS="--rows 1,4 --vocab 2048"
    GPU_BENCH_ARGS="--small --prompt 16 --gen 4 --batch 4"
    ENGINE_MODEL=synthetic:tiny-hd64
    ENGINE_ARGS="--batches 1,4 --contexts 32 --gen 8"
    ENGINE_NOGRAPH_ARGS="--batches 1 --contexts 32 --gen 8"
    Q4_ARGS="--batches 16,64 --contexts 32 --gen 4"
fi
TESTS=${MEDLEY_DEVCHECK_TESTS:-$TESTS}

# ---- the test model -------------------------------------------------------------------
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -z "${MEDLEY_MODELS:-}" ] && ls .devmodel*/part-* >/dev/null 2>&1; then
    export MEDLEY_MODELS=/tmp/medley-models
    mkdir -p "$MEDLEY_MODELS"
    cat $(ls .devmodel*/part-* | sort -t/ -k2) >"$MEDLEY_MODELS/$MODEL_FILE"
fi
if [ -n "${MEDLEY_MODELS:-}" ] && [ -r "$MEDLEY_MODELS/$MODEL_FILE" ]; then
    note "model: $MEDLEY_MODELS/$MODEL_FILE ($(sha256sum "$MEDLEY_MODELS/$MODEL_FILE" | cut -c1-16)...)"
    [ -z "$PROFILE_MODEL" ] && PROFILE_MODEL=$MEDLEY_MODELS/$MODEL_FILE
elif [ $EMU = 0 ]; then
    note "model: $MODEL_FILE not available: e2e test and profile will skip"
fi

# ---- tests ----------------------------------------------------------------------------
fails=0
for t in $TESTS; do
    timeout "$(tmo $TEST_TIMEOUT)" "$(bin "$t")" >"$OUT/$t.log" 2>&1
    rc=$?
    case $rc in
    0) note "test $t: PASSED" ;;
    77) note "test $t: SKIPPED ($(grep -m1 SKIP "$OUT/$t.log"))" ;;
    *) note "test $t: FAILED (exit $rc, see $t.log)"; fails=$((fails + 1)); tail -30 "$OUT/$t.log" ;;
    esac
done
# the embedding path on a real encoder when one came with the models (all-MiniLM-L6-v2 as
# the sentence-transformers directory `medley models fetch` makes): cuda:0 against cpu,
# cosine >= 0.9999 (test_cuda_encoder above ran its synthetic twin)
if [ $EMU = 0 ] && [ -n "${MEDLEY_MODELS:-}" ] && [ -d "$MEDLEY_MODELS/all-MiniLM-L6-v2" ]; then
    MEDLEY_GPU_TEST_ENCODER=$MEDLEY_MODELS/all-MiniLM-L6-v2 MEDLEY_TEST_FILTER='*embedder*' \
        timeout $(tmo 120) "$(bin test_cuda_encoder)" >"$OUT/test_cuda_encoder_minilm.log" 2>&1
    case $? in
    0) note "test test_cuda_encoder on all-MiniLM-L6-v2: PASSED ($(grep -m1 '^embed ' "$OUT/test_cuda_encoder_minilm.log"))" ;;
    77) ;;
    *) note "test test_cuda_encoder on all-MiniLM-L6-v2: FAILED (see test_cuda_encoder_minilm.log)"; fails=$((fails + 1)) ;;
    esac
fi
# the prefill attention of f16 caches on the f32 path again (1e-5 of the CPU backend)
MEDLEY_CUDA_ATTN_TC=0 timeout $(tmo 120) "$(bin test_cuda_backend)" >"$OUT/test_cuda_backend_noattntc.log" 2>&1
rc=$?
case $rc in
0) note "test test_cuda_backend with MEDLEY_CUDA_ATTN_TC=0: PASSED" ;;
77) ;;
*) note "test test_cuda_backend with MEDLEY_CUDA_ATTN_TC=0: FAILED (exit $rc)"; fails=$((fails + 1)) ;;
esac
grep -h -E "^(matmul|dequant|sampling|sticky|attention|rope|embed|encoder|logits:|greedy|penalised greedy|penalties row|[0-9]+ prompts through)" \
    "$OUT"/test_cuda_*.log >"$OUT/test-figures.txt" 2>/dev/null || true

# ---- profile --------------------------------------------------------------------------
if [ -n "$PROFILE_MODEL" ]; then
    # shellcheck disable=SC2086
    if timeout $(tmo 120) "$(bin medley)" profile -m "$PROFILE_MODEL" --device cuda:0 $PROFILE_ARGS \
        -o "$OUT/profile-smollm2-h200.json" >"$OUT/profile.log" 2>&1; then
        note "profile: written (profile-smollm2-h200.json)"
    else
        note "profile: FAILED (see profile.log)"
        fails=$((fails + 1))
    fi
    # the rehearsal: its profile of a synthetic model labelled H200, so the plan check runs
    chk_env=()
    [ $EMU = 1 ] && chk_env=(MEDLEY_PROFILE_MODEL="$PROFILE_MODEL" MEDLEY_PROFILE_DEVICE_TYPE=H200)
    env "${chk_env[@]}" MEDLEY_PROFILE_DEVICE=cuda:0 MEDLEY_BIN="$(bin medley)" timeout $(tmo 120) \
        python3 tests/gpu/check_profile.py >"$OUT/check_profile.log" 2>&1
    rc=$?
    case $rc in
    0) note "profile read by medley plan: $(grep -m1 '^plan' "$OUT/check_profile.log")" ;;
    *) note "profile check: FAILED (exit $rc, see check_profile.log)"; fails=$((fails + 1)) ;;
    esac
fi

# torch_py SECONDS NAME LOG SCRIPT ARGS...: a PyTorch step, its output in $OUT/LOG; when it
# fails, a line "NAME: FAILED or skipped"; left out of the rehearsal (it needs the GPU)
torch_py() {
    local secs=$1 name=$2 log=$3
    shift 3
    if [ $EMU = 1 ]; then
        echo "rehearsal: $1 left out (PyTorch on the GPU)" >"$OUT/$log"
        note "$name: left out of the rehearsal (PyTorch on the GPU)"
        return 3
    fi
    PYTHONUNBUFFERED=1 timeout "$secs" python3 "$@" >"$OUT/$log" 2>&1 && return 0
    note "$name: FAILED or skipped (see $log)"
    return 1
}

# ---- the device's ceilings, through PyTorch (bench/gpu/torch_ceilings.py): copy bandwidth
# and the bf16 matrix rate, measured in this run rather than taken from the datasheet ----
torch_py 60 ceilings ceilings.log bench/gpu/torch_ceilings.py --out "$OUT/ceilings.json" &&
    note "$(grep -m1 '^ceilings' "$OUT/ceilings.log")"

# ---- GEMV of every weight type vs cuBLAS on the same product (bench/gpu/bench_gemv.c) ---
# shellcheck disable=SC2086
timeout $(tmo 90) "$(bin medley_gemv_bench)" $GEMV_ARGS --out "$OUT/bench-gemv.json" >"$OUT/bench-gemv.log" 2>&1
rc=$?
case $rc in
0) note "bench gemv (type m medley-us GB/s of-HBM TFLOP/s cublas-on-copy-us medley/cublas expand-us):"
   grep -E '^(BF16|F16|Q[0-9])' "$OUT/bench-gemv.log" | sed 's/^/    /' | tee -a "$SUMMARY" ;;
77) note "bench gemv: SKIPPED ($(head -1 "$OUT/bench-gemv.log"))" ;;
*) note "bench gemv: FAILED (exit $rc, see bench-gemv.log)"; fails=$((fails + 1)) ;;
esac

# ---- attention: prefill on the tensor cores vs f32 vs torch sdpa, decode vs torch sdpa ----
# shellcheck disable=SC2086
timeout $(tmo 60) "$(bin medley_attn_bench)" $ATTN_ARGS --out "$OUT/bench-attn.json" >"$OUT/bench-attn.log" 2>&1
rc=$?
case $rc in
0) note "bench attention: ran" ;;
77) note "bench attention: SKIPPED ($(head -1 "$OUT/bench-attn.log"))" ;;
*) note "bench attention: FAILED (exit $rc, see bench-attn.log)"; fails=$((fails + 1)); tail -5 "$OUT/bench-attn.log" ;;
esac
torch_py 90 "bench torch sdpa" bench-sdpa.log bench/gpu/torch_sdpa.py --out "$OUT/bench-sdpa.json"
python3 bench/gpu/torch_sdpa.py --compare "$OUT/bench-attn.json" "$OUT/bench-sdpa.json" | tee -a "$SUMMARY"

# ---- sampling: argmax, sampled, penalised + logprobs vs PyTorch (bench_sample.c) --------
# shellcheck disable=SC2086
timeout $(tmo 45) "$(bin medley_sample_bench)" $SAMPLE_ARGS --out "$OUT/bench-sample.json" >"$OUT/bench-sample.log" 2>&1
rc=$?
case $rc in
0) note "bench sampling: ran" ;;
77) note "bench sampling: SKIPPED ($(head -1 "$OUT/bench-sample.log"))" ;;
*) note "bench sampling: FAILED (exit $rc, see bench-sample.log)"; fails=$((fails + 1)); tail -5 "$OUT/bench-sample.log" ;;
esac
torch_py 60 "bench torch sampling" bench-sample-torch.log bench/gpu/torch_sample.py \
    --out "$OUT/bench-sample-torch.json"
python3 bench/gpu/torch_sample.py --compare "$OUT/bench-sample.json" "$OUT/bench-sample-torch.json" |
    tee -a "$SUMMARY"

# ---- benchmark: medley vs PyTorch + transformers --------------------------------------
# shellcheck disable=SC2086
timeout $(tmo 200) "$(bin medley_gpu_bench)" $GPU_BENCH_ARGS \
    --out "$OUT/bench-medley.json" >"$OUT/bench-medley.log" 2>&1
rc=$?
case $rc in
0) note "bench medley: ran" ;;
77) note "bench medley: SKIPPED ($(head -1 "$OUT/bench-medley.log"))" ;;
*) note "bench medley: FAILED (exit $rc, see bench-medley.log)"; fails=$((fails + 1)) ;;
esac
# the same figures through the whole engine: a synthetic Llama-3-8B-shaped BF16 model
# (engine/weights/synth.h: real shapes, random weights, built in host memory), profiled with and
# without decode-step CUDA graphs
if [ "$L" = 32 ]; then
    # shellcheck disable=SC2086
    timeout $(tmo 150) "$(bin medley)" profile -m $ENGINE_MODEL --device cuda:0 $ENGINE_ARGS \
        -o "$OUT/engine-llama8b.json" >"$OUT/engine-llama8b.log" 2>&1 &&
        note "engine profile $ENGINE_MODEL: ran" ||
        { note "engine profile $ENGINE_MODEL: FAILED (see engine-llama8b.log)"; fails=$((fails + 1)); }
    # shellcheck disable=SC2086
    MEDLEY_CUDA_GRAPHS=0 timeout $(tmo 90) "$(bin medley)" profile -m $ENGINE_MODEL --device cuda:0 \
        $ENGINE_NOGRAPH_ARGS -o "$OUT/engine-llama8b-nograph.json" \
        >"$OUT/engine-llama8b-nograph.log" 2>&1 ||
        note "engine profile without graphs: FAILED (see engine-llama8b-nograph.log)"
fi
torch_py 240 "bench hf" bench-hf.log bench/gpu/hf_generate.py --layers "$L" --prompt 128 \
    --gen 128 --batch 256 --out "$OUT/bench-hf.json"
python3 bench/gpu/compare.py "$OUT/bench-medley.json" "$OUT/bench-hf.json" \
    --ceilings "$OUT/ceilings.json" --engine "$OUT/engine-llama8b.json" --engine-nograph "$OUT/engine-llama8b-nograph.json" |
    tee -a "$SUMMARY"

# ---- the whole engine on quantized weights without BF16 copies: batches of 32 (k_mmq,
# __dp4a) and 128 (k_mmq_tc, int8 mma) on the int8 tiled products against expanding every
# weight at each step (MEDLEY_CUDA_MMQ_MAX_M=0); only while the check is inside its time
# budget (the rehearsal: batches of 16 and 64, always) ------------------------------------
if [ "$L" = 32 ] && { [ $EMU = 1 ] || [ $(($(date +%s) - T0)) -lt 240 ]; }; then
    for mode in mmq expand; do
        v=""
        [ $mode = expand ] && v=0
        # shellcheck disable=SC2086
        MEDLEY_CUDA_MMQ_MAX_M=$v timeout $(tmo 60) "$(bin medley)" profile -m $ENGINE_MODEL:q4_0 \
            --device cuda:0 --bf16-weights off $Q4_ARGS \
            -o "$OUT/engine-q4-$mode.json" >"$OUT/engine-q4-$mode.log" 2>&1 ||
            note "engine profile q4_0 ($mode): FAILED or timed out (see engine-q4-$mode.log)"
    done
    python3 - "$OUT/engine-q4-mmq.json" "$OUT/engine-q4-expand.json" <<'PY' | tee -a "$SUMMARY"
import json, sys
try:
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
    for x, y in zip(a["batches"], b["batches"]):
        print("engine q4_0 batch %d decode: %.0f tok/s on the int8 tiled product, %.0f expanding (%.2fx)" % (
            x["batch"], x["decode_tokens_per_s"], y["decode_tokens_per_s"],
            x["decode_tokens_per_s"] / y["decode_tokens_per_s"]))
except Exception as ex:
    print("engine q4_0 int8 tiled vs expansion: no figures (%s)" % ex)
PY
else
    note "engine q4_0 int8 tiled vs expansion: skipped (time budget)"
fi

# ---- compute-sanitizer's memcheck over the backend test, every device buffer its own
# allocation (MEDLEY_CUDA_POOL_EXACT=1) so a kernel past a buffer's end is caught there
# (KINDS.md: it works on Firecracker machines, not on gVisor); only inside the time budget --
if [ $EMU = 0 ] && command -v compute-sanitizer >/dev/null && [ $(($(date +%s) - T0)) -lt 300 ]; then
    MEDLEY_CUDA_POOL_EXACT=1 timeout $(tmo 60) compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$(bin test_cuda_backend)" >"$OUT/memcheck-backend.log" 2>&1
    rc=$?
    case $rc in
    0) note "memcheck test_cuda_backend: clean ($(grep -m1 -E 'ERROR SUMMARY' "$OUT/memcheck-backend.log"))" ;;
    9) note "memcheck test_cuda_backend: FAILED, errors found (see memcheck-backend.log)"; fails=$((fails + 1)) ;;
    *) note "memcheck test_cuda_backend: did not complete (exit $rc, see memcheck-backend.log)" ;;
    esac
fi

note "total: $(($(date +%s) - T0)) s, $fails failure(s)"
if [ $EMU = 1 ]; then
    # the rehearsal fails on any step of medley's that failed or left no result, counted
    # above or not (the comparisons with PyTorch's left-out steps say "no figures")
    bad=$(grep -c FAILED "$SUMMARY")
    for f in profile-smollm2-h200 bench-gemv bench-attn bench-sample bench-medley engine-llama8b \
        engine-llama8b-nograph engine-q4-mmq engine-q4-expand; do
        python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$OUT/$f.json" 2>/dev/null ||
            { note "rehearsal: $f.json missing or not JSON"; bad=$((bad + 1)); }
    done
    [ "$bad" -gt 0 ] && note "rehearsal: $bad step(s) did not run or left no result"
    fails=$((fails + bad))
fi
if [ $PACK_OUT = 1 ]; then
    tar -C "$OUT" --exclude=./summary.md -czf /tmp/devcheck-logs.tgz . &&
        find "$OUT" -mindepth 1 ! -name summary.md -delete &&
        mv /tmp/devcheck-logs.tgz "$OUT/logs.tgz"
fi
exit $((fails > 0))
