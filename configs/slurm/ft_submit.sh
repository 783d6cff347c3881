#!/bin/bash
# Submit a torchft job: the lighthouse, then FT_GROUPS replica groups of NODES_PER_GROUP nodes each.
#   FT_DIR=/shared/run1 FT_GROUPS=4 NODES_PER_GROUP=2 configs/slurm/ft_submit.sh --config configs/llama3_8b.toml \
#       --checkpoint.folder /shared/run1/checkpoint
# FT_DIR: a folder every node sees (the lighthouse's address, each group's dump_folder). Give the groups one
# shared checkpoint.folder: the lowest live group writes there, and a whole-job restart resumes from it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${FT_DIR:?set FT_DIR to a folder shared by all nodes}"
export FT_DIR FT_GROUPS=${FT_GROUPS:-2}
mkdir -p "$FT_DIR"
rm -f "$FT_DIR/lighthouse"
sbatch --parsable --output="$FT_DIR/lighthouse-%j.out" "$HERE/ft_lighthouse.sbatch"
for ((g = 0; g < FT_GROUPS; g++)); do
    # Each group its own rendezvous port: two groups' first nodes may be the same machine.
    sbatch --parsable --nodes="${NODES_PER_GROUP:-1}" --output="$FT_DIR/group$g-%j.out" \
        --export="ALL,REPLICA_ID=$g,RDZV_PORT=$((${RDZV_PORT:-29400} + g))" "$HERE/ft_group.sbatch" "$@"
done
