#!/bin/bash
# For the next GPU lease (written in stop 50, after next.sh's lease): the two goals still
# open are the process backend's scaling past 4 clients and 2x the hand-written batcher
# in one process. One call (steps of at most 580 s in all), no wheels needed.
#
# The first lease's process runs were short (A*: 1.7 s served at 14 clients) and client
# processes start one after another, so a run's rate counts a ramp where fewer clients
# feed the server. gpu.py now reports each run's steady rate too (every client
# searching: steady_nodes_per_s, start_spread_s, steady_scaling_efficiency in goals);
# these runs are 4-5x longer so that the window is most of each run (MCTS: 1875
# simulations a search, past gpu.py's default cap of 800). Each workload runs
# with client_waves 1 (as before) and 2 (each client keeps two messages in flight: it
# computes one wave while the server evaluates the other; on the 2-core CPU host,
# 0.81-1.31x over 15 pairs, no clear gain, where the server and the client share the
# cores), paired, A* first (its clients waited most: busy 0.57 at 14 clients). Last,
# MCTS through 1-14 clients of 512 searches each: 14 of them kept the device busy 0.87
# of the time in the second lease, so the goal's "until the device saturates" is read
# there (the 1-client rate at 512 searches was not measured).
source benchmarks/gpu_session/common.sh
{ nvidia-smi -L; nproc; python3 -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)"; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
astar="python3 benchmarks/gpu.py --workloads astar --sections process_backend --clients 1,2,4,8,14 --rounds 1 --astar-evaluations 400000 --astar-min-budget 100 --process-searches 128 --min-s 0.2"
mcts="python3 benchmarks/gpu.py --workloads mcts --sections process_backend --clients 1,2,4,8,14 --rounds 1 --mcts-simulations 240000 --mcts-max-simulations 1875 --process-searches 128 --min-s 0.2"
step 110 astar_w1 $astar --client-waves 1 --out "$OUT/d_astar_w1.json"
step 110 astar_w2 $astar --client-waves 2 --out "$OUT/d_astar_w2.json"
step 130 mcts_w1 $mcts --client-waves 1 --out "$OUT/d_mcts_w1.json"
step 130 mcts_w2 $mcts --client-waves 2 --out "$OUT/d_mcts_w2.json"
step 100 mcts512 python3 benchmarks/gpu.py --workloads mcts --sections process_backend --clients 1,2,4,8,14 --rounds 1 --mcts-simulations 120000 --process-searches 512 --min-s 0.2 --out "$OUT/d_mcts512.json"
