# shellcheck shell=bash
# Site settings for the batch scripts in jobs/slurm/, sourced by each of them
# before anything else runs. On a new cluster, edit this file (and the
# #SBATCH lines of the scripts if the node shape differs), nothing else.
#
# Partition, account, QOS: sbatch options. Give them on the command line
# (sbatch -p gpu -A project ...) or once in the shell profile:
#   export SBATCH_PARTITION=gpu SBATCH_ACCOUNT=project
# (sbatch reads SBATCH_* variables; command-line options win over them, and
# both win over the scripts' #SBATCH lines).
#
# Modules: a job runs with the environment sbatch was called from (Slurm's
# default --export=ALL), so `module load vqa-hpc` (env/modules/vqa-hpc.lua,
# adapted to the site) before sbatch is enough. To load modules inside the job
# instead, list them here or in VQA_SITE_MODULES, e.g. "vqa-hpc" or
# "gcc/12 cuda/12.4 nccl/2.21 openmpi/4.1 hdf5/1.14-openmpi".
VQA_SITE_MODULES=${VQA_SITE_MODULES:-}

if [[ -n $VQA_SITE_MODULES ]]; then
  if ! command -v module >/dev/null 2>&1; then
    # Batch shells are not login shells: bring in Lmod / Environment Modules.
    for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do
      # shellcheck source=/dev/null  # the site's file, not in this repository
      [[ -f $init ]] && source "$init" && break
    done
  fi
  # shellcheck disable=SC2086  # a space-separated list of module names
  module load $VQA_SITE_MODULES
fi
