#!/bin/bash
# hermeneut Slurm Epilog: the job ended; forget which GPUs it held (see hermeneut-slurm-prolog.sh).
# Always exits 0: a failing Epilog would drain the node.
dir="${HERMENEUT_SLURM_DIR:-/run/hermeneut/slurm}"
[ -n "${SLURM_JOB_ID:-}" ] && rm -f "$dir/${SLURM_JOB_ID}.env" 2>/dev/null
exit 0
