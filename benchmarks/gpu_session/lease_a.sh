#!/bin/bash
# First call on a GPU machine: what it is, the GPU-only tests, then gpu.py with PyTorch
# on MCTS (Connect Four) and A* (the 15-puzzle). About 7 minutes. These are the commands
# of the H200 run of 2026-11-27 (results/benchmarks/gpu.json), when TorchModel had no
# CUDA graphs by default: --eager keeps them so.
source benchmarks/gpu_session/common.sh
{ nvidia-smi -L; nproc; python3 -c "import sys, torch, numpy, jax; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'jax', jax.__version__, jax.devices())"; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step 60 tests_gpu python3 -m pytest -q -p no:cacheprovider tests/models/test_torch_model.py tests/models/test_jax_model.py -k "cuda or gpu"
step 200 mcts python3 benchmarks/gpu.py --workloads mcts --mcts-simulations 60000 --process-searches 128 --min-s 0.25 --eager --out "$OUT/gpu_mcts.json"
step 150 astar python3 benchmarks/gpu.py --workloads astar --sections in_process,handwritten_torch,max_batch_size,process_backend --astar-evaluations 80000 --astar-min-budget 100 --process-searches 128 --min-s 0.25 --eager --out "$OUT/gpu_astar.json"
