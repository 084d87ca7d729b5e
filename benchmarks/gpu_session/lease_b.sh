#!/bin/bash
# Second call, right after the first: CUDA graphs (TorchModel's default on CUDA since
# this run), bf16 and a shorter GIL switch interval against eager PyTorch on MCTS, JAX's
# adapter on both searches, then the whole adapter suite on the GPU. About 8 minutes.
source benchmarks/gpu_session/common.sh
few="--workloads mcts --sections in_process,process_backend --concurrency 1024,4096 --clients 14 --rounds 1 --mcts-simulations 60000 --process-searches 128 --min-s 0.25"
step 65 eager python3 benchmarks/gpu.py $few --eager --out "$OUT/gpu_eager.json"
step 65 graphs python3 benchmarks/gpu.py $few --out "$OUT/gpu_graphs.json"
step 55 switch python3 benchmarks/gpu.py $few --eager --switch-interval 0.0005 --out "$OUT/gpu_switch.json"
step 55 bf16 python3 benchmarks/gpu.py $few --eager --precision bfloat16 --out "$OUT/gpu_bf16.json"
step 100 jax python3 benchmarks/gpu.py --framework jax --workloads mcts,astar --sections in_process,process_backend --concurrency 1,1024,4096 --clients 14 --rounds 1 --mcts-simulations 60000 --astar-evaluations 80000 --astar-min-budget 100 --process-searches 128 --min-s 0.25 --out "$OUT/gpu_jax.json"
step 120 tests python3 -m pytest -q -p no:cacheprovider tests/models
