#!/usr/bin/env bash
# One GPU session's measurements in as few device calls as possible, each phase well inside a
# 10-minute call; logs and results go to $OUT (default benchmarks/results/session-<date>).
#
#   benchmarks/gpu_session.sh tests [FILE..] # the gpu-marked tests (all files, or those named), each file in
#                                            # its own pytest process of at most $TEST_FILE_S seconds (300)
#   benchmarks/gpu_session.sh in-context [NAME..]  # suite problems where a kernel won alone and lost in
#                                            # its graph (cross_entropy), or won in both (softmax)
#   benchmarks/gpu_session.sh transformers [NAME..]  # GPT-2 / Llama / BERT (default: the inference
#                                            # problems), bf16, as a user of mode=background meets them: the
#                                            # first compile, the later ones (--settle), then timed
#                                            # interleaved against Inductor
#   benchmarks/gpu_session.sh models [NAME..]  # GPT-2 / Llama / BERT (default: the inference problems), bf16,
#                                            # searched first (mode=search), then timed 10 x 5 calls
#                                            # interleaved: whether our kernels win the whole model
#   benchmarks/gpu_session.sh level1 [NAME..]  # the level-1 problems (all, or those named), in $DTYPES (fp32
#                                            # bf16; all 20 took about 330 s a dtype at 10 x 5 calls: one dtype a
#                                            # call), searched (mode=search), then timed interleaved: issue 8's geomean
#   benchmarks/gpu_session.sh level2 [NAME..]  # the level-2 problems (groups $SUITE_GROUPS: fusion rewrites), as level1
#                                            # does; 31 problems a dtype will not fit one call: name some
#   benchmarks/gpu_session.sh compile [NAME..]  # first compiles in fresh processes (benchmarks/compile_time.py),
#                                            # ours (mode=background) against Inductor, empty caches, then warm
#                                            # ones after a priming run (up to 3 x 150 s of background work);
#                                            # one model a call: GPT-2's took 4 minutes, a training step's 5-6
#   benchmarks/gpu_session.sh gate [NAME..]  # pointwise-heavy problems with the gate and with gate=false,
#                                            # then the two side by side (benchmarks/suite/gate_compare.py)
#   benchmarks/gpu_session.sh dispatch       # host cost per call of the launch op and of run_winner, a tiny
#                                            # graph with our kernel under CUDA graphs against Inductor's,
#                                            # and one round of the llm policy's transformers engine
#   benchmarks/gpu_session.sh columns        # column sums (bias gradients, a tall sum(0)): the rows GPU
#                                            # tests of across-row kernels, then each case searched with
#                                            # every candidate's time logged (benchmarks/rows.py -v)
#   benchmarks/gpu_session.sh probes         # launch shapes and kernels not in the templates yet, against Inductor:
#                                            # split long-row softmax in shared memory (rows_ceiling.py softmax_long)
#                                            # and wider transpose tiles (transpose_probe.py)
#   benchmarks/gpu_session.sh stagger [LABELS] # the 16 x 393216 softmax on rows_stagger.py's layout (each block a
#                                            # slice of every row): its one-exchange kernels (stagger-sync) by
#                                            # default, or the comma-separated label prefixes given
#   benchmarks/gpu_session.sh ab BASE[,BASE..] SPEC..
#                                            # the rows template's codegen A/B: each launch of SPEC
#                                            # (problem:dtype[:tags]) written by each BASE (a codegen.py: git
#                                            # show REV:skills/rows/codegen.py) and by this checkout's, timed
#                                            # interleaved (benchmarks/rows_ab.py)
#   benchmarks/gpu_session.sh many-long-rows # softmax over 1024 x 393216 (the suite's softmax_many_long_rows):
#                                            # every launch of the backend's candidates (rows_plans.py), then
#                                            # the hand-written persistent kernels over as many rows
#                                            # (rows_persistent.py)
#   benchmarks/gpu_session.sh flush          # what the timing's L2 flush (a write) costs a short kernel,
#                                            # against a read flush and none (benchmarks/flush_effect.py)
#
# Each test file runs in a process of its own, so a crash (the launch op's segfault on the
# H100 machine, 2026-11-23) costs that file only, and its exit status is recorded.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 tests|in-context|transformers|models|level1|level2|compile|gate|dispatch|columns|probes|stagger|ab|"
phase=${1:?"${usage}many-long-rows|flush"}
out=${OUT:-benchmarks/results/session-$(date +%F)}
mkdir -p "$out"
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0))" 2>/dev/null || echo "no GPU")
torch_version=$(python3 -c "import torch; print(torch.__version__)")
header() { echo "# $1 on $gpu, torch $torch_version, $(date -u +%FT%TZ)"; }

case "$phase" in
  tests)
    log="$out/gpu_tests.log"
    header "gpu tests" >"$log"
    shift
    files=${*:-$(grep -l "mark.gpu" tests/test_*.py)}
    for file in $files; do
      start=$(date +%s)
      timeout "${TEST_FILE_S:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider "$file" >"$out/last_test.log" 2>&1
      status=$?
      echo "## $file: exit $status after $(( $(date +%s) - start )) s" >>"$log"
      grep -E "^(E |FAILED|ERROR)" "$out/last_test.log" | head -n 60 >>"$log"  # why each failure failed
      grep -v "^DEBUG" "$out/last_test.log" | tail -n 25 >>"$log"  # the device's torch logs DEBUG lines
    done
    rm -f "$out/last_test.log"
    grep '^## ' "$log"
    ;;
  in-context)
    header "in-context problems" >"$out/in_context.log"
    shift
    python3 -m benchmarks.suite --level 1 --only ${*:-cross_entropy l2_normalize softmax} \
      --dtype fp32 bf16 --rounds 5 --calls 3 --out "$out" -o search_budget_s=30 >>"$out/in_context.log" 2>&1
    tail -n 30 "$out/in_context.log"
    ;;
  transformers)
    header "transformers" >"$out/transformers.log"
    shift
    python3 -m benchmarks.suite --only ${*:-gpt2 llama bert} --dtype bf16 --rounds 5 --calls 3 --out "$out" \
      --settle 150 -o mode=background -o background_share=1.0 -o search_budget_s=20 >>"$out/transformers.log" 2>&1
    tail -n 30 "$out/transformers.log"
    ;;
  models)
    header "models" >"$out/models.log"
    shift
    python3 -m benchmarks.suite --only ${*:-gpt2 llama bert} --dtype bf16 --rounds 10 --calls 5 --out "$out" \
      -o mode=search -o search_budget_s=20 >>"$out/models.log" 2>&1
    tail -n 30 "$out/models.log"
    ;;
  level1)
    header "level 1" >"$out/level1.log"
    shift
    # 30 x 5 calls: the tenth session's 10 x 5 read 0.92x on a 20 us problem run by Inductor's code on
    # both sides (p10-p90 16.5-25.9 us); timing is a few seconds of each problem's search-bound minute
    python3 -m benchmarks.suite --level 1 ${*:+--only $*} --dtype ${DTYPES:-fp32 bf16} --rounds 30 --calls 5 --out "$out" \
      -o mode=search -o search_budget_s=30 >>"$out/level1.log" 2>&1
    tail -n 40 "$out/level1.log"
    ;;
  level2)
    header "level 2" >"$out/level2.log"
    shift
    python3 -m benchmarks.suite --level 2 --group ${SUITE_GROUPS:-fusion rewrites} ${*:+--only $*} \
      --dtype ${DTYPES:-fp32 bf16} --rounds 30 --calls 5 --out "$out" -o mode=search -o search_budget_s=30 \
      >>"$out/level2.log" 2>&1
    tail -n 40 "$out/level2.log"
    ;;
  compile)
    shift
    python3 -m benchmarks.compile_time --only ${*:-gpt2} --rounds 2 --warm-rounds 2 --settle 150 \
      -o background_share=1.0 --out "$out/compile_time.json" 2>"$out/compile_time.log" | tail -n 12
    ;;
  gate)
    shift
    names=${*:-gelu bias_gelu_mul scale_shift_tanh scalar_chain swiglu residual_layernorm layernorm_gelu \
      linear_bias_gelu transpose_copy mse_loss}
    header "gate side by side" >"$out/gate.log"
    for gate in true false; do
      mkdir -p "$out/gate-$gate"
      python3 -m benchmarks.suite --only $names --dtype bf16 --rounds 5 --calls 3 --out "$out/gate-$gate" \
        -o mode=search -o gate=$gate -o search_budget_s=30 >>"$out/gate.log" 2>&1
    done
    python3 -m benchmarks.suite.gate_compare "$out"/gate-true/suite-*.json "$out"/gate-false/suite-*.json \
      --out "$out/gate_side_by_side.md"
    rm -f "$out"/gate-*/suite-*.md  # the JSONs hold the same; a device call returns at most 8 files
    ;;
  dispatch)
    python3 benchmarks/dispatch_overhead.py --out "$out/dispatch_overhead.json"
    python3 benchmarks/run_winner_host.py --device cuda --out "$out/run_winner_host.json"
    python3 benchmarks/reduce_overhead_tiny.py --out "$out/reduce_overhead_tiny.json"
    python3 benchmarks/llm_round.py >"$out/llm_round.json"
    ;;
  columns)
    header "column sums" >"$out/columns.log"
    timeout "${TEST_FILE_S:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_rows_gpu.py \
      -k "sum_columns or dim1 or var or strided" >>"$out/columns.log" 2>&1
    echo "## rows GPU tests (across rows): exit $?" >>"$out/columns.log"
    for only in bias_grad sum_columns; do
      python3 benchmarks/rows.py --only "$only" -v --out "$out/rows_$only.json" >>"$out/columns.log" 2>&1
    done
    grep -E "^## |passed|failed|builtin:rows|^[a-z_0-9]+ +[0-9.]+ " "$out/columns.log" | grep -v DEBUG
    ;;
  probes)
    { header "probes"; python3 benchmarks/rows_ceiling.py softmax_long; python3 benchmarks/transpose_probe.py; } \
      >"$out/probes.log" 2>&1
    grep -v DEBUG "$out/probes.log" | tail -n 40
    ;;
  stagger)
    # the 16 x 393216 softmax on the layout where each block holds a slice of every row
    # (benchmarks/rows_stagger.py) beside the generated kernel, its copies and Inductor
    shift
    labels=${1:-copy,stagger-copy,staggerp-copy,stagger-sync,staggerw-sync,stagger2-sync,staggerp-sync,staggerp2-sync}
    { header "stagger layout"; timeout 300 python3 benchmarks/rows_phases.py bench bf16 fp32 --only "$labels"; } \
      >"$out/stagger.log" 2>&1
    grep -v -e DEBUG -e checked "$out/stagger.log" | tail -n 12
    ;;
  ab)
    shift
    : "${1:?usage: $0 ab BASE[,BASE..] SPEC.. (BASE: a codegen.py, git show REV:skills/rows/codegen.py > BASE)}"
    { header "rows codegen A/B against $1"; timeout 400 python3 benchmarks/rows_ab.py "$@"; } \
      >"$out/rows_ab.log" 2>&1
    grep -v -e DEBUG -e Warning "$out/rows_ab.log" | tail -n 20
    ;;
  many-long-rows)
    { header "many long rows"
      timeout 400 python3 benchmarks/rows_plans.py softmax_many_long_rows:bf16 softmax_many_long_rows:fp32
      timeout 200 python3 benchmarks/rows_persistent.py bf16,fp32 hold,staged,gen --rows 1024
    } >"$out/many_long_rows.log" 2>&1
    grep -v DEBUG "$out/many_long_rows.log" | tail -n 20
    ;;
  flush)
    python3 benchmarks/flush_effect.py --out "$out/flush_effect.json"
    ;;
  *)
    echo "unknown phase $phase: tests, in-context, transformers, models, level1, level2, compile, gate, dispatch," \
      "columns, probes, stagger, ab, many-long-rows or flush" >&2
    exit 2
    ;;
esac
