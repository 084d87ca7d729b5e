#!/bin/bash
# For the next GPU lease, with TorchModel's CUDA graphs (its default on CUDA since the
# H200 run): `next.sh a` (about 8 minutes), then at once `next.sh b` (about 6 minutes).
# a: the adapter suite on the GPU (the tests fixed after the H200 run, the new graph
#    tests), then MCTS in full, mctx and the process backend included.
# b: A* in full with graphs, channels-last against NCHW on MCTS, JAX on A*.
source benchmarks/gpu_session/common.sh
nvidia-smi -L >"$OUT/env.txt" 2>&1; nproc >>"$OUT/env.txt"
few="--workloads mcts --sections in_process,process_backend --concurrency 1024,4096 --clients 14 --rounds 1 --mcts-simulations 60000 --process-searches 128 --min-s 0.25"
case "$1" in
  a)
    step 150 tests python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/models
    step 300 mcts python3 benchmarks/gpu.py --workloads mcts --mcts-simulations 60000 --process-searches 128 --min-s 0.25 --out "$OUT/gpu_mcts.json"
    ;;
  b)
    step 170 astar python3 benchmarks/gpu.py --workloads astar --sections in_process,handwritten_torch,max_batch_size,process_backend --astar-evaluations 80000 --astar-min-budget 100 --process-searches 128 --min-s 0.25 --out "$OUT/gpu_astar.json"
    step 60 nchw python3 benchmarks/gpu.py $few --out "$OUT/gpu_nchw.json"
    step 60 nhwc python3 benchmarks/gpu.py $few --channels-last --out "$OUT/gpu_nhwc.json"
    step 90 jax_astar python3 benchmarks/gpu.py --framework jax --workloads astar --sections in_process,process_backend --concurrency 1,1024,4096 --clients 14 --rounds 1 --astar-evaluations 80000 --astar-min-budget 100 --process-searches 128 --min-s 0.25 --out "$OUT/gpu_jax_astar.json"
    ;;
  *) echo "usage: next.sh a|b" >&2; exit 2 ;;
esac
