#!/usr/bin/env bash
# Launch the gin-configured jobs on a Cloud TPU VM, the way T5X users launch t5x/infer.py.
#
# Usage (from the repository root, with gcloud authenticated and a project set):
#   scripts/launch_tpu.sh create                       # create the TPU VM
#   scripts/launch_tpu.sh setup                        # copy this repository, install jax[tpu] + .[seqio]
#   scripts/launch_tpu.sh infer GIN_ARGS...            # python -m speculative.infer GIN_ARGS...
#   scripts/launch_tpu.sh benchmark GIN_ARGS...        # python -m speculative.benchmark GIN_ARGS...
#   scripts/launch_tpu.sh paper                        # the 12 Table 2 rows (configs/paper), in turn
#   scripts/launch_tpu.sh delete                       # delete the TPU VM
#
# Settings (environment variables, defaults in brackets):
#   TPU_NAME [speculative], ZONE [us-central2-b], ACCELERATOR [v4-8], RUNTIME [tpu-ubuntu2204-base]
#   WORKERS [0]                  which hosts run each command: 0 on a single-host slice, `all` on a
#                                pod slice (every host runs the same job; add DISTRIBUTED=True)
#   REMOTE_DIR [~/speculative]   where the repository is copied on the VM
#   TFDS_DATA_DIR                TFDS data (gs://...) for the seqio tasks of configs/paper
#   OUTPUT_ROOT                  VM-local directory under which the paper runs write their outputs
#   CKPT_ENDE_XXL, CKPT_ENDE_SMALL, CKPT_ENDE_BASE, CKPT_ENDE_LARGE,
#   CKPT_CNNDM_XXL, CKPT_CNNDM_SMALL, CKPT_CNNDM_BASE, CKPT_CNNDM_LARGE
#                                T5X checkpoint directories of the T5 v1.1 models fine-tuned on each
#                                dataset (the `paper` command; the paper's weights are unreleased)
#   DRY_RUN=1                    print the gcloud commands instead of running them
#
# Examples:
#   ZONE=us-central2-b ACCELERATOR=v4-8 scripts/launch_tpu.sh create
#   scripts/launch_tpu.sh setup
#   scripts/launch_tpu.sh infer --gin_file=configs/paper/ende_t0_small.gin \
#     --gin.TARGET_CHECKPOINT="'gs://my-bucket/t5_1_1_xxl_ende/checkpoint_1010000'" \
#     --gin.DRAFT_CHECKPOINT="'gs://my-bucket/t5_1_1_small_ende/checkpoint_1010000'" \
#     --gin.OUTPUT_DIR="'/home/$USER/out/ende_t0_small'"
#
# Pod slice (e.g. a v4-32: 4 hosts x 4 chips), every host running the same command:
#   ACCELERATOR=v4-32 scripts/launch_tpu.sh create
#   WORKERS=all scripts/launch_tpu.sh setup
#   WORKERS=all scripts/launch_tpu.sh infer --gin_file=configs/paper/ende_t0_small.gin \
#     --gin.TARGET_CHECKPOINT="'gs://my-bucket/t5_1_1_xxl_ende/checkpoint_1010000'" \
#     --gin.DRAFT_CHECKPOINT="'gs://my-bucket/t5_1_1_small_ende/checkpoint_1010000'" \
#     --gin.OUTPUT_DIR="'/home/$USER/out/ende_t0_small'" \
#     --gin.PARTITIONER=@partitioning.create_partitioner\(\) \
#     --gin.partitioning.create_partitioner.data=4 --gin.partitioning.create_partitioner.model=4 \
#     --gin.BATCH_SIZE=4 --gin.DISTRIBUTED=True
# which runs, on every worker:
#   gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE --worker=all \
#     --command="cd ~/speculative && python3 -m speculative.infer ..."
#
# Notes:
# - With DISTRIBUTED=True each host feeds only its rows of every batch and host 0 alone writes
#   OUTPUT_DIR (and resumes from it); without it, use WORKERS=0 on a single-host slice.
# - OUTPUT_DIR is written with local file I/O: point it at the VM's disk (or a gcsfuse mount), then
#   copy the results out with `gcloud compute tpus tpu-vm scp`. A job restarted with the same
#   OUTPUT_DIR resumes where it stopped (e.g. after a preemption).
# - Checkpoints and the T5 vocabulary are read from gs:// directly (TensorStore).
set -euo pipefail
cd "$(dirname "$0")/.."

TPU_NAME="${TPU_NAME:-speculative}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR="${ACCELERATOR:-v4-8}"
RUNTIME="${RUNTIME:-tpu-ubuntu2204-base}"
REMOTE_DIR="${REMOTE_DIR:-~/speculative}"
WORKERS="${WORKERS:-0}"

run() {
  if [[ "${DRY_RUN:-0}" == "1" ]]; then
    printf '%q ' "$@"
    echo
  else
    "$@"
  fi
}

on_vm() {  # on_vm COMMAND: run a shell command on the VM, in the repository
  local env_prefix=""
  if [[ -n "${TFDS_DATA_DIR:-}" ]]; then
    env_prefix="TFDS_DATA_DIR=$(printf '%q' "$TFDS_DATA_DIR") "
  fi
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker="$WORKERS" \
    --command="cd $REMOTE_DIR && ${env_prefix}$1"
}

quoted() {  # the arguments, shell-quoted for the remote command line
  local out=""
  for arg in "$@"; do out+=" $(printf '%q' "$arg")"; done
  echo "$out"
}

require() {
  local name="$1"
  if [[ -z "${!name:-}" ]]; then
    echo "error: set $name (see the header of $0)" >&2
    exit 2
  fi
}

command="${1:-}"
shift || true
case "$command" in
  create)
    run gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" \
      --accelerator-type="$ACCELERATOR" --version="$RUNTIME"
    ;;
  setup)
    run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker="$WORKERS" \
      --command="mkdir -p $REMOTE_DIR"
    run gcloud compute tpus tpu-vm scp --recurse --zone="$ZONE" --worker="$WORKERS" \
      setup.py pyproject.toml README.md LICENSE speculative configs scripts "$TPU_NAME:$REMOTE_DIR/"
    on_vm "python3 -m pip install -U 'jax[tpu]' && python3 -m pip install -e '.[seqio]'"
    ;;
  infer)
    on_vm "python3 -m speculative.infer$(quoted "$@")"
    ;;
  benchmark)
    on_vm "python3 -m speculative.benchmark$(quoted "$@")"
    ;;
  paper)
    require OUTPUT_ROOT
    for dataset in ende cnndm; do
      upper=$(echo "$dataset" | tr '[:lower:]' '[:upper:]')
      target_var="CKPT_${upper}_XXL"
      require "$target_var"
      for temperature in 0 1; do
        for size in small base large; do
          draft_var="CKPT_${upper}_$(echo "$size" | tr '[:lower:]' '[:upper:]')"
          require "$draft_var"
          row="${dataset}_t${temperature}_${size}"
          on_vm "python3 -m speculative.infer$(quoted \
            --gin_file="configs/paper/$row.gin" \
            --gin.TARGET_CHECKPOINT="'${!target_var}'" \
            --gin.DRAFT_CHECKPOINT="'${!draft_var}'" \
            --gin.OUTPUT_DIR="'$OUTPUT_ROOT/$row'")"
        done
      done
    done
    ;;
  delete)
    run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --quiet
    ;;
  *)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
