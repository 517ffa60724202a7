#!/usr/bin/env bash
# Installs jfa-prof, then runs its main job: what this machine can do, the SM heatmap with
# static vs dynamic scheduling (live on a GPU; on a CPU-only machine the bundled H200
# recordings, labeled as such), the barrier waits, the ranked diagnosis of both passes, and the
# compile-time register/spill report of the forward and backward kernels (broadcast-Q, bf16, D=128).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
mkdir -p out
jfa-prof doctor || true   # says what runs here; a compile-only machine still has work to do
jfa-prof heatmap --clc both --out out/heatmap.html
jfa-prof barriers
jfa-prof diagnose            # what limits the forward, ranked (live level-3 recording on a GPU)
jfa-prof diagnose --pass bwd
jfa-prof spills --variant 'fwd/bcast/bf16/d128/*'
jfa-prof spills --variant 'bwd/bcast/bf16/d128/*'
echo "heatmap written to out/heatmap.html"
