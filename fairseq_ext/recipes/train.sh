#!/usr/bin/env bash
# Train with fairseq's own torch.distributed training: one process (CPU or one GPU),
# several processes on one node, or several nodes, with the world size wired through.
#
#   fairseq-ext train DATA_BIN SAVE_DIR [--nproc N] [--nnodes M --node-rank R --master-addr HOST
#                     --master-port PORT] [--config iwslt] -- FAIRSEQ_TRAIN_ARGS...
#   (scripts/train.sh in a checkout; --help prints the usage)
#
# Why a launcher: `torchrun ... fairseq-train --cpu` silently trains N independent
# single-process worlds (fairseq only infers the world from torchrun's environment when it
# also sees GPUs, and then divides by the GPU count). Here every process gets
# --distributed-init-method env:// --distributed-world-size N*M --distributed-rank $RANK
# --device-id $LOCAL_RANK --distributed-no-spawn; the backend is NCCL on GPUs and gloo on
# the CPU (with fairseq's legacy_ddp, since torch's DDP wants device ids on CPU modules).
#
# Examples:
#   scripts/train.sh data-bin/iwslt15.en-vi checkpoints/mlmha --config configs/iwslt.args -- --arch multilayer_transformer_mlmha_iwslt
#   scripts/train.sh data-bin/wmt14.en-de ckpt --nproc 8 --config configs/wmt14.args -- --arch multilayer_transformer_mlmha_wmt_en_de --fp16
#   # node 0 and node 1 of a 2 x 8 GPU job:
#   scripts/train.sh data-bin/wmt14.en-de ckpt --nproc 8 --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 -- ...
#   scripts/train.sh data-bin/wmt14.en-de ckpt --nproc 8 --nnodes 2 --node-rank 1 --master-addr node0 --master-port 29500 -- ...
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
usage() {
    cat <<EOF
Usage: $FSX_COMMAND_NAME DATA_BIN SAVE_DIR [--config NAME|FILE] [--nproc N]
           [--nnodes M --node-rank R --master-addr HOST --master-port PORT] -- FAIRSEQ_TRAIN_ARGS...

Trains with fairseq-train and this package (--user-dir) on the binarized data DATA_BIN into
SAVE_DIR, on one process (the CPU or one GPU), several on one node, or several nodes, with
fairseq's own torch.distributed training. Rerun the same command to resume from
SAVE_DIR/checkpoint_last.pt; one run writes a save dir at a time.

  --config NAME|FILE   fairseq-train flags from a file (flags after -- win): one the package
                       ships ($(fsx_config_names)), or your own
  --init-from CKPT     start from the weights of CKPT, a checkpoint of fairseq's transformer or
                       of this model with other options of the same sizes (fairseq's
                       --finetune-from-model: optimizer, schedule and meters start afresh)
  --nproc N            processes (GPUs) on this node (default 1)
  --nnodes M, --node-rank R, --master-addr HOST, --master-port PORT
                       a job over M nodes: run the same command on each, R = 0..M-1
  -h, --help           this help

Every process gets --distributed-init-method env:// --distributed-world-size N*M
--distributed-rank and --device-id; the backend is NCCL on GPUs and gloo on the CPU (with
fairseq's legacy_ddp). On the CPU, each process takes its share of the idle cores unless
OMP_NUM_THREADS is set. docs/training.md has the details.

Examples:
  $FSX_COMMAND_NAME data-bin/iwslt15.en-vi checkpoints/mlmha --config iwslt -- --arch multilayer_transformer_mlmha_iwslt
  $FSX_COMMAND_NAME data-bin/wmt14.en-de ckpt --nproc 8 --config wmt14 -- --arch multilayer_transformer_mlmha_wmt_en_de --fp16
  # node 0 and node 1 of a 2 x 8 GPU job:
  $FSX_COMMAND_NAME data-bin/wmt14.en-de ckpt --nproc 8 --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 -- ...
  $FSX_COMMAND_NAME data-bin/wmt14.en-de ckpt --nproc 8 --nnodes 2 --node-rank 1 --master-addr node0 --master-port 29500 -- ...
EOF
    exit "${1:-0}"
}
die() { fsx_die "$@"; }

[[ ${1:-} == -h || ${1:-} == --help ]] && usage 0
[[ $# -ge 2 ]] || usage 1
DATA=$1 SAVE=$2
shift 2
NPROC=1 NNODES=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1 CONFIG="" INIT_FROM=""
# the port: --master-port, else the environment's MASTER_PORT (as torchrun), else on one node a
# free one (a second run at once would die on 29500's EADDRINUSE before its save dir's lock), else 29500
PORT_SOURCE=""
[[ -n ${MASTER_PORT:-} ]] && PORT_SOURCE="MASTER_PORT (from the environment)"
MASTER_PORT=${MASTER_PORT:-29500}
while [[ $# -gt 0 ]]; do
    case $1 in
        --nproc | --nnodes | --node-rank | --master-addr | --master-port | --config | --init-from)
            [[ $# -ge 2 && $2 != --* ]] || die "option $1 needs a value"
            case $1 in
                --nproc) NPROC=$2 ;;
                --nnodes) NNODES=$2 ;;
                --node-rank) NODE_RANK=$2 ;;
                --master-addr) MASTER_ADDR=$2 ;;
                --master-port) MASTER_PORT=$2 PORT_SOURCE=--master-port ;;
                --config) CONFIG=$2 ;;
                --init-from) INIT_FROM=$2 ;;
            esac
            shift 2 ;;
        -h|--help) usage 0 ;;
        --) shift; break ;;
        *) die "unknown option $1 (fairseq-train flags go after --)" ;;
    esac
done
# decimal integers of at most 9 digits (no overflow, "08" is eight, not an octal error)
is_int() { [[ $1 =~ ^[0-9]{1,9}$ ]]; }
is_int "$NPROC" && ((10#$NPROC >= 1)) || die "--nproc must be a positive integer (processes on this node), not '$NPROC'"
is_int "$NNODES" && ((10#$NNODES >= 1)) || die "--nnodes must be a positive integer, not '$NNODES'"
NPROC=$((10#$NPROC)) NNODES=$((10#$NNODES))
is_int "$NODE_RANK" && ((10#$NODE_RANK < NNODES)) ||
    die "--node-rank must be an integer in 0..$((NNODES - 1)) (--nnodes $NNODES), not '$NODE_RANK'"
is_int "$MASTER_PORT" && ((10#$MASTER_PORT >= 1 && 10#$MASTER_PORT <= 65535)) ||
    die "${PORT_SOURCE:---master-port} must be a port number (1-65535), not '$MASTER_PORT'"
NODE_RANK=$((10#$NODE_RANK)) MASTER_PORT=$((10#$MASTER_PORT))
if [[ -z $PORT_SOURCE && $NNODES -eq 1 ]] && FREE=$(python3 -c 'import socket; s = socket.socket()
s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null); then
    MASTER_PORT=$FREE
fi
[[ -d $DATA ]] || die "no binarized data directory $DATA (make one with fairseq-ext prepare NAME, or fairseq-preprocess)"
USER_DIR="$FSX_USER_DIR"
CONFIG_ARGS=()
if [[ -n $CONFIG ]]; then
    CONFIG_FILE="$(fsx_config_path "$CONFIG")" || exit 1
    fsx_read_config "$CONFIG_FILE" CONFIG_ARGS
fi

fsx_require_cmd fairseq-train
# a --restore-file that does not exist is refused here (plain fairseq-train starts from scratch
# with a warning, fairseq's own meaning): fairseq_ext.guards.resume.STRICT_ENV
export FAIRSEQ_EXT_STRICT_RESTORE=1
if fsx_has_gpu; then
    DEVICE_ARGS=(--distributed-backend nccl)
else
    DEVICE_ARGS=(--cpu --distributed-backend gloo --ddp-backend legacy_ddp)
    # torch's default of one thread per core collapses when other work competes for the
    # cores (standalone/cpu.py has the measurement): each process takes its share of the cores
    # idle now, unless OMP_NUM_THREADS says otherwise
    if [[ -z ${OMP_NUM_THREADS:-} ]]; then
        mapfile -t CPU_THREADS < <("${FSX_PY:-python3}" "$USER_DIR/standalone/cpu.py" threads "$NPROC")
        export OMP_NUM_THREADS="${CPU_THREADS[0]:-1}"
        echo "[train.sh] CPU: $OMP_NUM_THREADS thread(s) per process (${CPU_THREADS[1]:-}; OMP_NUM_THREADS=N to choose)" >&2
    fi
fi
INIT_ARGS=()
if [[ -n $INIT_FROM ]]; then
    [[ -f $INIT_FROM ]] || die "--init-from: no checkpoint $INIT_FROM"
    INIT_ARGS=(--finetune-from-model "$(cd "$(dirname "$INIT_FROM")" && pwd)/$(basename "$INIT_FROM")")
fi
ARGS=("$DATA" --user-dir "$USER_DIR" --save-dir "$SAVE" "${CONFIG_ARGS[@]}" "${INIT_ARGS[@]}" "$@")
WORLD=$((NPROC * NNODES))
if [[ $WORLD -eq 1 ]]; then
    [[ ${DEVICE_ARGS[0]} == --cpu ]] && DEVICE_ARGS=(--cpu)
    [[ ${DEVICE_ARGS[0]} == --distributed-backend ]] && DEVICE_ARGS=(--distributed-world-size 1)
    exec fairseq-train "${ARGS[@]}" "${DEVICE_ARGS[@]}"
fi
fsx_require_cmd torchrun
# A --restore-file typo, an unreadable checkpoint_last.pt with no intact checkpoint beside it, or
# a save dir another run writes (the workers of a killed one), is said once here
# (fairseq_ext.guards.resume.preflight, the plugin's own check), not by every
# rank followed by torchrun's traceback. fairseq-train's own argument errors likewise.
PY="$(dirname "$(command -v fairseq-train)")/python"
[[ -x $PY ]] || PY=python3
if ! PREFLIGHT=$(PYTHONPATH="$(dirname "$USER_DIR")${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    'import sys; sys.argv[0] = "fairseq-train"; from fairseq_ext.guards.resume import preflight; preflight(sys.argv[1:])' \
    "${ARGS[@]}" "${DEVICE_ARGS[@]}" 2>&1 >/dev/null); then
    if grep -q '^fairseq-train: error: ' <<<"$PREFLIGHT"; then
        grep '^fairseq-train: error: ' <<<"$PREFLIGHT" >&2
    else
        printf '%s\n' "$PREFLIGHT" >&2
    fi
    exit 1
fi
echo "[train.sh] world size $WORLD ($NNODES node(s) x $NPROC process(es)), ${DEVICE_ARGS[*]}, port $MASTER_PORT" >&2
exec torchrun --no-python --nproc_per_node "$NPROC" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    bash -c 'exec fairseq-train "$@" --distributed-rank "$RANK" --device-id "$LOCAL_RANK"' fairseq-train \
    "${ARGS[@]}" "${DEVICE_ARGS[@]}" --distributed-init-method env:// --distributed-world-size "$WORLD" \
    --distributed-no-spawn
