set -x
export PAIR_TARGET_S=70 PAIR_DRAFT_S=45 PAIR_HF= PAIR_ADAPTIVE=1 PAIR_ADAPTIVE_FIRST=1
PAIR_CONTROL_K=6 PAIR_PROPOSERS=draft PAIR_KS=2,3,4,6,8 bash scripts/gpu_check.sh pair /tmp/o
export VLLM_SKIP_BUILD=1
PAIR_SHAPE=llama-2-13b PAIR_PROPOSERS=draft,draft-gpu PAIR_KS=1,2,3,4,6,8 bash scripts/gpu_check.sh pair /tmp/o13
echo ALLDONE
