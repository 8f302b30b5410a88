#!/bin/bash
# hermeneut Slurm Prolog: record which job holds which GPUs of this node, for `hermeneut context watch --slurm-dir`.
#
# Install on every GPU node (slurm.conf: Prolog=/path/to/hermeneut-slurm-prolog.sh, or call it from your own
# prolog). It writes $HERMENEUT_SLURM_DIR/<jobid>.env (default /run/hermeneut/slurm) with the job's variables
# as KEY=value lines; hermeneut-slurm-epilog.sh removes it. The file is written to a temporary name and renamed,
# so a reader never sees half of it. It calls no Slurm command (the Prolog guide asks prologs not to) and
# always exits 0: a failing Prolog would drain the node.
dir="${HERMENEUT_SLURM_DIR:-/run/hermeneut/slurm}"
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
mkdir -p "$dir" 2>/dev/null || exit 0
tmp="$dir/.${SLURM_JOB_ID}.env.$$"
{
    for name in SLURM_JOB_ID SLURM_JOB_USER SLURM_JOB_NAME SLURM_JOB_ACCOUNT SLURM_JOB_PARTITION \
        SLURM_JOB_GPUS CUDA_VISIBLE_DEVICES SLURM_JOB_NUM_NODES SLURM_GPUS_ON_NODE SLURM_JOB_COMMENT \
        SLURM_CLUSTER_NAME; do
        value="${!name:-}"
        # one line per variable: newlines in a comment would start a bogus line
        if [ -n "$value" ]; then printf '%s=%s\n' "$name" "${value//[$'\r\n']/ }"; fi
    done
} >"$tmp" 2>/dev/null && mv -f "$tmp" "$dir/${SLURM_JOB_ID}.env" 2>/dev/null
rm -f "$tmp" 2>/dev/null
exit 0
