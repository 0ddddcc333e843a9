#!/usr/bin/env bash
# GPU check for one lent H200 (sparse-attention.md §7.2): builds kernels/cuda in the kernels-only
# configuration, runs the GPU tests (plus the prebuilt engine-level ones in .gpu-carry/engine,
# from scripts/gpu-prepare-carry), the decode-attention microbenchmark, the DeviceModel decode
# benchmark (SmolLM2 shape; TinyLlama shape end to end), the PyTorch SDPA comparison and the one-rank
# NCCL check, and prints a short summary table LAST. Full logs and JSON lines go to $OUT (else
# ./gpu-results). Every step is time-capped; a failed step is reported and the script goes on to
# the summary. Budget: < 8 minutes (no step runs past GPU_CHECK_DEADLINE_S, default 470 s).
#   Expected: configure ~0.5 min, build ~2-3 min (16 cores), tests ~1 min, DeviceModel bench
#   ~1 min, attention bench ~1.5 min, e2e ~1 min each, SDPA ~1 min, NCCL seconds.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
RES=${OUT:-$ROOT/gpu-results}
mkdir -p "$RES"
STEPS=$RES/steps.txt
: > "$STEPS"
T_START=$(date +%s)

# Every step is capped at the smaller of its own cap and the time left before
# GPU_CHECK_DEADLINE_S (default 470 s after the start: the issue asks for < 8 minutes, and the
# device command limit is 600 s), and
# skipped when under 20 s are left, so the summary always prints.
DEADLINE=${GPU_CHECK_DEADLINE_S:-470}

# step NAME TIMEOUT_S CMD...: runs CMD with a time cap, output to $RES/NAME.log, records rc.
step() {
  local name=$1 cap=$2
  shift 2
  local t0 rc left
  left=$(( DEADLINE - ($(date +%s) - T_START) ))
  if [ "$left" -lt 20 ]; then
    echo "$name rc=skipped (deadline)" | tee -a "$STEPS"
    return 0
  fi
  if [ "$left" -lt "$cap" ]; then cap=$left; fi
  t0=$(date +%s)
  echo "=== $name (cap ${cap}s): $*" | tee -a "$RES/all.log"
  timeout --kill-after=10 "$cap" "$@" > "$RES/$name.log" 2>&1
  rc=$?
  tail -n 5 "$RES/$name.log" | sed 's/^/    /'
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$STEPS"
  return $rc
}

step gpu_info 30 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv; nvcc --version | tail -2; cmake --version | head -1'

# NCCL: the toolkit's, else the one in the Python wheel (nvidia-nccl-cu13), passed explicitly.
NCCL_ARGS=()
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  NCCL_DIR=$(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for h in glob.glob(os.path.join(r, "nvidia", "**", "nccl.h"), recursive=True):
        inc = os.path.dirname(h)
        libs = glob.glob(os.path.join(os.path.dirname(inc), "lib", "libnccl.so*"))
        if libs:
            print(inc + "|" + sorted(libs)[0]); sys.exit(0)
PY
)
  if [ -n "${NCCL_DIR:-}" ]; then
    NCCL_ARGS=(-DNCCL_INCLUDE_DIR="${NCCL_DIR%%|*}" -DNCCL_LIBRARY="${NCCL_DIR##*|}")
    echo "NCCL from the Python wheel: $NCCL_DIR" | tee -a "$RES/all.log"
  fi
fi

GEN=()
if command -v ninja > /dev/null 2>&1; then GEN=(-G Ninja); fi
GTEST_ARGS=()
if [ -d "$ROOT/.gpu-carry/googletest" ]; then
  GTEST_ARGS=(-DTINYSERVE_GTEST_SOURCE="$ROOT/.gpu-carry/googletest")
fi
# A rerun on the same (warm) machine reuses build-gpu: only what changed is rebuilt.
if [ "${GPU_CHECK_CLEAN:-0}" = 1 ]; then rm -rf build-gpu; fi
# The emulator twins of the GPU tests (kernels/cuda/emu) are for machines without a GPU: off here.
step configure 120 cmake -S . -B build-gpu -DTINYSERVE_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DTINYSERVE_CUDA_EMU_TESTS=OFF \
  ${GTEST_ARGS[@]+"${GTEST_ARGS[@]}"} ${NCCL_ARGS[@]+"${NCCL_ARGS[@]}"} ${GEN[@]+"${GEN[@]}"}
step build 300 cmake --build build-gpu -j "$(nproc)"
BIN=$ROOT/build-gpu/bin

if [ -d build-gpu ]; then
  (cd build-gpu && step ctest 180 ctest --output-on-failure --timeout 150 -j 3)
else
  echo "ctest rc=skipped (no build)" | tee -a "$STEPS"
fi
# GPU tests that need Abseil (the engine's CUDA runner against the CPU runner), prebuilt by
# scripts/gpu-prepare-carry on the development machine and carried in .gpu-carry/engine.
if [ -d "$ROOT/.gpu-carry/engine/bin" ]; then
  want=$(bash scripts/gpu-source-hash 2>/dev/null || echo none)
  have=$(cat "$ROOT/.gpu-carry/engine/SOURCE_HASH" 2>/dev/null || echo none)
  if [ "$want" != "$have" ]; then
    echo "engine_carry rc=STALE (built from $have, tree is $want: rerun scripts/gpu-prepare-carry)" |
      tee -a "$STEPS"
  fi
  for t in "$ROOT"/.gpu-carry/engine/bin/*; do
    step "engine_$(basename "$t")" 90 env \
      TINYSERVE_CUDA_TEST_MODEL="$ROOT/.gpu-carry/models/llama-d64" \
      LD_LIBRARY_PATH="$ROOT/.gpu-carry/engine/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}" "$t"
  done
else
  echo "engine tests rc=skipped (no .gpu-carry/engine: run scripts/gpu-prepare-carry first)" | tee -a "$STEPS"
fi
# The DeviceModel bench runs first: it is the one measurement no earlier run has.
rm -f "$RES/attention.jsonl" "$RES/e2e.jsonl" "$RES/e2e_tc.jsonl" "$RES/sdpa.jsonl" "$RES/model.jsonl"
step model_bench 120 "$BIN/cuda_model_decode_bench" --out "$RES/model.jsonl" --contexts 8000 \
  --batches 1,8 --steps 32 --max-seconds 100
step attention_bench 150 "$BIN/cuda_attention_bench" --out "$RES/attention.jsonl" --max-seconds 110
# End to end: the TinyLlama-1.1B shape through DeviceModel, its cache filled with random K/V.
E2E=(--shape tinyllama --fill random --contexts 8192,32768 --batches 1,16 --modes dense,quest
     --budget 2048 --steps 20 --max-seconds 90)
step e2e_bench 120 "$BIN/cuda_model_decode_bench" --out "$RES/e2e.jsonl" "${E2E[@]}"
step e2e_bench_tc 120 env TINYSERVE_CUDA_ATTEND=tensor "$BIN/cuda_model_decode_bench" \
  --out "$RES/e2e_tc.jsonl" "${E2E[@]}"
step sdpa_bench 120 python3 scripts/gpu_sdpa_bench.py --out "$RES/sdpa.jsonl" --max-seconds 80
if [ -x "$BIN/cuda_nccl_check" ]; then
  step nccl_check 60 "$BIN/cuda_nccl_check"
else
  echo "nccl_check rc=skipped (NCCL not found at configure)" | tee -a "$STEPS"
fi
echo "total $(( $(date +%s) - T_START ))s" | tee -a "$STEPS"

# Summary, printed last.
python3 - "$RES" <<'PY'
import json, os, re, sys
res = sys.argv[1]
def load(name):
    out = []
    p = os.path.join(res, name)
    if os.path.exists(p):
        for line in open(p):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out
att, e2e, sdpa = load("attention.jsonl"), load("e2e.jsonl"), load("sdpa.jsonl")
model = load("model.jsonl")
e2e_tc = load("e2e_tc.jsonl")
print("\n================ TinyServe GPU check summary ================")
print(open(os.path.join(res, "steps.txt")).read().strip().replace("\n", " | "))
ct = os.path.join(res, "ctest.log")
if os.path.exists(ct):
    txt = open(ct).read()
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", txt)
    fails = re.findall(r"\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Not Run)\)", txt)
    print("tests:", m.group(0) if m else "no ctest summary", "| failed:", fails or "none")
for name in sorted(os.listdir(res)):
    if name.startswith("engine_") and name.endswith(".log"):
        txt = open(os.path.join(res, name)).read()
        passed = re.search(r"\[  PASSED  \] (\d+) tests?", txt)
        skipped = re.search(r"\[  SKIPPED \] (\d+) tests?", txt)
        failed = sorted(set(re.findall(r"\[  FAILED  \] ([\w./]+)", txt)))
        print(name[:-4] + ":", "passed", passed.group(1) if passed else "?", "| skipped",
              skipped.group(1) if skipped else "0", "| failed:", failed or "none")
copy = [r for r in att if r.get("kind") == "copy_bw"]
cbw = copy[0]["GBps"] if copy else None
print("copy bandwidth (D2D, read+write): %s GB/s" % (("%.0f" % cbw) if cbw else "n/a"))
def by_variant(v):
    return {(r["geom"], r["batch"], r["context"], r["budget"]): r for r in att if r.get("variant") == v}
dense, quest, dense_tc, quest_tc = (by_variant(v) for v in ("dense", "quest", "dense_tc", "quest_tc"))
best = {(r["geom"], r["batch"], r["context"]): r for r in sdpa if r.get("kind") == "sdpa_best"}
print("attention, us (cc = CUDA-core attend kernel, tc = tensor-core attend kernel):")
print("%-8s %5s %6s %6s | %8s %8s %8s %8s %8s | %6s %6s | %6s %6s | %5s %5s %5s" % (
    "geom", "batch", "ctx", "budget", "quest_cc", "dense_cc", "quest_tc", "dense_tc", "sdpa",
    "q/d_cc", "q/d_tc", "cc/sdp", "tc/sdp", "ccBW%", "tcBW%", "qtBW%"))
for geom in ("smollm2", "7b"):
    for ctx, bud in ((32768, 2048), (131072, 2048)):
        for b in (1, 16, 64):
            d = dense.get((geom, b, ctx, 0)); q = quest.get((geom, b, ctx, bud))
            dt = dense_tc.get((geom, b, ctx, 0)); qt = quest_tc.get((geom, b, ctx, bud))
            s = best.get((geom, b, ctx))
            if not d and not dt:
                continue
            us = lambda r: ("%.1f" % r["us"]) if r else "-"
            ratio = lambda x, y: ("%.2f" % (x["us"] / y["us"])) if x and y else "-"
            bw = lambda r: ("%.0f" % (100 * r["GBps"] / cbw)) if r and cbw else "-"
            print("%-8s %5d %6d %6d | %8s %8s %8s %8s %8s | %6s %6s | %6s %6s | %5s %5s %5s" % (
                geom, b, ctx, bud, us(q), us(d), us(qt), us(dt), us(s), ratio(d, q), ratio(dt, qt),
                ratio(d, s), ratio(dt, s), bw(d), bw(dt), bw(qt)))
print("(q/d = dense_us / quest_us of one kernel; cc/sdp, tc/sdp = dense_us / sdpa_us (<1: ours "
      "faster); BW% = achieved bytes-read bandwidth / copy bandwidth; quest bytes include the boxes)")
for tag, rows in (("cc", e2e), ("tc", e2e_tc)):
    for ctx in (8192, 32768):
        for b in (1, 16):
            rd = [r for r in rows if r["context"] == ctx and r["batch"] == b and r["mode"] == "dense"]
            rq = [r for r in rows if r["context"] == ctx and r["batch"] == b and r["mode"] == "quest"]
            if rd or rq:
                td = rd[0]["tok_per_s"] if rd else float("nan")
                tq = rq[0]["tok_per_s"] if rq else float("nan")
                print("e2e tinyllama (DeviceModel) %s ctx %6d batch %2d: dense %8.1f tok/s  quest(2048) %8.1f tok/s"
                      "  x%.2f" % (tag, ctx, b, td, tq, tq / td if rd and rq else float("nan")))
for r in model:
    print("DeviceModel smollm2-shape ctx %5d batch %2d %-12s %8.1f tok/s  pages %5.1f%%  tier hit %s"
          "  moved %s KB/step" % (r["context"], r["batch"], r["mode"], r["tok_per_s"],
                                  100 * r["pages_attended_frac"],
                                  "%.1f%%" % (100 * r["tier_hit_rate"]) if r["tier_hit_rate"] >= 0 else "-",
                                  "%.0f" % (r["bytes_moved_per_step"] / 1024) if r["device_pages"] else "-"))
PY
