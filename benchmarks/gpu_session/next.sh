#!/bin/bash
# For the next GPU lease, one call (steps of at most 570 s in all: a lease of 15 minutes
# holds one such call and the machine's start), carrying .whl (mctx, pytest-asyncio; see
# common.sh): the adapter tests on the GPU, CUDA's own first (then the shared suite on
# PyTorch, JAX's, and gpu.py's tests but those that run it whole, as the later steps
# do), then gpu.py with TorchModel's default CUDA graphs: MCTS on the 128 x 10
# policy-value net in full (in one process, the hand-written batcher, 1-14 client
# processes, mctx), MCTS on AlphaZero's published size (256 x 19) through 1, 4 and 14
# client processes with one and two servers on the GPU, and A* on the cost-to-go net;
# the MCTS and A* steps sample the serving process's stacks (--sample-stacks: is its
# loop the limit at 8 and 14 clients?) and run the same clients with no server
# (clients_alone: how far this machine scales the searches' CPU by itself, cores shared
# by two threads included). Last, 14 clients of 512 searches each with one and two
# servers (deep): a client of 128 searches has one message in flight and waits on its
# round trip (one A* client ran 36k nodes/s on the H200, a quarter of what its searches
# do alone on a free model on this slower 2-core host), so more searches per client
# should fill batches of 4096 and keep the device busy. Each step has its time limit;
# the JSON is rewritten after every run, so a step stopped at its limit leaves what it
# measured.
source benchmarks/gpu_session/common.sh
{ nvidia-smi -L; nproc; python3 -c "import sys, torch, numpy, jax; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'jax', jax.__version__, jax.devices())"; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step 70 tests bash -c 'p="python3 -m pytest -q -p no:cacheprovider -rfE --tb=short"; $p tests/models/test_torch_model.py -k "cuda or gpu or captured or precision"; $p tests/models/test_adapters.py -k torch; $p tests/models/test_jax_model.py tests/models/test_buckets.py; $p tests/test_benchmarks_gpu.py -k "not (imports_neither or sample_stacks)"'
step 190 mcts python3 benchmarks/gpu.py --workloads mcts --sections in_process,handwritten_torch,process_backend,clients_alone,mctx --rounds 1 --mcts-simulations 60000 --process-searches 128 --min-s 0.25 --sample-stacks --out "$OUT/c_mcts.json"
step 100 big python3 benchmarks/gpu.py --workloads mcts --channels 256 --blocks 19 --sections process_backend --clients 1,4,14 --servers 1,2 --rounds 1 --mcts-simulations 16000 --process-searches 128 --min-s 0.2 --out "$OUT/c_big.json"
step 130 astar python3 benchmarks/gpu.py --workloads astar --sections in_process,handwritten_torch,max_batch_size,process_backend,clients_alone --rounds 1 --astar-evaluations 80000 --astar-min-budget 100 --process-searches 128 --min-s 0.25 --sample-stacks --out "$OUT/c_astar.json"
step 80 deep python3 benchmarks/gpu.py --workloads astar,mcts --sections process_backend --clients 14 --servers 1,2 --rounds 1 --mcts-simulations 60000 --astar-evaluations 80000 --astar-min-budget 100 --process-searches 512 --min-s 0.2 --out "$OUT/c_deep.json"
