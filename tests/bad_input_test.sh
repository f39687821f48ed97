#!/bin/bash
# Bad input, table-driven: every malformed config, model directory,
# safetensors file, JSONL file, generate flag and queue-server flag below must
# be refused with the exit code and a message naming the problem, never a
# crash. (Malformed wire frames sent to a running server: NetProcessTest.
# MalformedFramesGetErrorsAndStateSurvives; the decoder is fuzzed.)
# Usage: bad_input_test.sh SLUICE QUEUE_SERVER
#        bad_input_test.sh --show SLUICE QUEUE_SERVER   (print every case's rc and message)
set -u
show=false
if [ "${1:-}" = --show ]; then show=true; shift; fi
SLUICE=$(realpath "$1")
SERVER=$(realpath "$2")
DATA=$(realpath "$(dirname "$0")/data")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

# ---------------------------------------------------------------- fixtures
"$SLUICE" init --preset tiny --out good > /dev/null 2>&1 || { echo "FAIL sluice init"; exit 1; }
model() {  # model NAME: a copy of the good model to break
  rm -rf "$1" && cp -r good "$1"
}
# safetensors FILE HEADER: an 8-byte little-endian header length, the header, 64 zero bytes of data.
safetensors() {
  local n=${#2} le="" i
  for i in 0 1 2 3 4 5 6 7; do le+=$(printf '\\x%02x' $(((n >> (8 * i)) & 255))); done
  { printf "$le"; printf '%s' "$2"; head -c 64 /dev/zero; } > "$1"
}
model no-config && rm no-config/config.json
model config-not-json && echo '{"hidden_size": 32,' > config-not-json/config.json
model config-no-hidden && sed -i 's/"hidden_size"/"hidden_sizes"/' config-no-hidden/config.json
model config-negative && sed -i 's/"num_hidden_layers": *[0-9]*/"num_hidden_layers": -2/' config-negative/config.json
model config-gpt2 && sed -i 's/"model_type": *"llama"/"model_type": "gpt2"/' config-gpt2/config.json
model config-rope-scaling && sed -i 's/^{/{"rope_scaling": {"type": "yarn", "factor": 4.0},/' config-rope-scaling/config.json
model config-heads && sed -i 's/"num_attention_heads": *[0-9]*/"num_attention_heads": 3/' config-heads/config.json
model config-huge-vocab && sed -i 's/"vocab_size": *[0-9]*/"vocab_size": 1000000000000/' config-huge-vocab/config.json
model no-weights && rm no-weights/model.safetensors
model st-empty && : > st-empty/model.safetensors
model st-truncated && head -c 3000 good/model.safetensors > st-truncated/model.safetensors
model st-huge-header && { printf '\xff\xff\xff\xff\xff\x00\x00\x00{}'; } > st-huge-header/model.safetensors
model st-not-json && safetensors st-not-json/model.safetensors '{"a": [1, 2'
model st-bad-dtype && safetensors st-bad-dtype/model.safetensors \
  '{"model.embed_tokens.weight":{"dtype":"Q7","shape":[2,2],"data_offsets":[0,16]}}'
model st-past-end && safetensors st-past-end/model.safetensors \
  '{"model.embed_tokens.weight":{"dtype":"F32","shape":[259,32],"data_offsets":[0,33152]}}'
model st-shape-bytes && safetensors st-shape-bytes/model.safetensors \
  '{"model.embed_tokens.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,32]}}'
model st-missing-tensor && safetensors st-missing-tensor/model.safetensors \
  '{"model.norm.weight":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}}'
model st-wrong-shape && safetensors st-wrong-shape/model.safetensors \
  '{"model.embed_tokens.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}'

"$SLUICE" calibrate --quick --out=profile.yaml model.preset=tiny rl.slots=8 rl.max_new_tokens=32 > /dev/null 2>&1 ||
  { echo "FAIL sluice calibrate"; exit 1; }
printf 'rollout:\n  decode_step_s: 0.001\n' > profile-none.yaml
sed 's/^  format: [0-9]*/  format: 9/' profile.yaml > profile-format.yaml
printf '{"step": 1, "response_len_mean": "long", "response_len_max": 9, "samples_trained": 4}\n' > metrics-bad.jsonl
sed 's/^  decode_row_s: .*/  decode_row_s: -1/' profile.yaml > profile-negative.yaml
sed 's/^  token_s: .*/  token_s: fast/' profile.yaml > profile-text.yaml
printf 'run:\n  seed: [1\n' > yaml-syntax.yaml
printf 'rl:\n  steps: ten\n' > yaml-type.yaml
printf 'rl:\n  group_size: 1\n' > yaml-group.yaml
printf 'trainer:\n  lr: -0.1\n' > yaml-lr.yaml
printf 'pipeline:\n  mode: async\n  max_staleness: -1\n' > yaml-staleness.yaml
printf 'rl:\n  steps: 1\n  steps: 2\n' > yaml-duplicate.yaml
printf 'sft:\n  stepz: 3\n' > yaml-unknown.yaml
printf -- '- just\n- a list\n' > yaml-list.yaml
printf '\xff\xfe not utf-8: \x80\n' > yaml-binary.yaml

printf '{"prompt": "1+1=", "answer": "2"}\n{"prompt": 5, "answer": "3"}\n' > jsonl-prompt-type.jsonl
printf '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n' > jsonl-no-answer.jsonl
printf '{"prompt": "1+1=", "answer": "2"}\n[1, 2]\n' > jsonl-array.jsonl
printf '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"} trailing\n' > jsonl-trailing.jsonl
printf '{"prompt": "", "answer": "2"}\n' > jsonl-empty-prompt.jsonl
echo "secret" > token.txt

# A downloaded model directory is untrusted input: FIFOs for its files (open
# blocked for ever), hostile chat templates (they crashed or rendered for
# ever), a tokenizer.json nested 40,000 deep (it overflowed the stack).
model fifo-config && rm fifo-config/config.json && mkfifo fifo-config/config.json
model fifo-weights && rm fifo-weights/model.safetensors && mkfifo fifo-weights/model.safetensors
mkdir fifo-tokenizer && mkfifo fifo-tokenizer/tokenizer.json
mkfifo fifo.yaml
chat_model() {  # chat_model NAME TEMPLATE: Qwen3's tokenizer with TEMPLATE as its chat template
  mkdir "$1" && cp "$DATA/tokenizers/qwen3/tokenizer.json" "$1/" &&
    python3 -c 'import json, sys; print(json.dumps({"chat_template": sys.argv[1]}))' "$2" > "$1/tokenizer_config.json"
}
chat_model template-loops '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}'
chat_model template-doubling "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
chat_model template-list-doubling '{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}'
chat_model template-attr-chain "{{ messages$(printf '.a%.0s' $(seq 20000)) }}"
chat_model template-filter-chain "{{ 'x'$(printf '|upper%.0s' $(seq 20000)) }}"
echo '{"messages": [{"role": "user", "content": "hi"}]}' > conversation.jsonl
mkdir deep-tokenizer && python3 - "$DATA/tokenizers/qwen3/tokenizer.json" deep-tokenizer/tokenizer.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
deep = '{"type": "Sequence", "pretokenizers": [' * 40000 + '{"type": "ByteLevel"}' + ']}' * 40000
j["pre_tokenizer"] = "DEEP"
open(sys.argv[2], "w").write(json.dumps(j).replace('"DEEP"', deep))
PY

# ---------------------------------------------------------------- the table
# NAME | EXIT CODE | TEXT THE MESSAGE MUST HOLD | COMMAND (word-split; no quoting inside;
# a first word @in=FILE gives the command FILE as its stdin)
cases=$(cat <<'EOF'
model-no-config        | 2 | config.json: cannot open model config                | generate --model no-config
model-config-not-json  | 2 | config.json: not valid JSON                          | generate --model config-not-json
model-config-no-hidden | 2 | hidden_size                                          | generate --model config-no-hidden
model-config-negative  | 2 | num_hidden_layers                                    | generate --model config-negative
model-config-gpt2      | 2 | model_type                                           | generate --model config-gpt2
model-rope-scaling     | 1 | 'rope_scaling': type 'yarn' is not supported          | generate --model config-rope-scaling
model-heads            | 2 | does not divide num_attention_heads 3                | generate --model config-heads
model-huge-vocab       | 2 | 'vocab_size': 1000000000000 is over the limit        | generate --model config-huge-vocab
model-no-weights       | 2 | neither model.safetensors nor model.safetensors.index.json | generate --model no-weights
model-not-a-dir        | 2 | no-such-dir/config.json                              | generate --model no-such-dir
st-empty               | 1 | too short for a safetensors file                     | generate --model st-empty
st-truncated           | 1 | file truncated or offsets out of range               | generate --model st-truncated
st-huge-header         | 1 | header length 1099511627775 exceeds the limit        | generate --model st-huge-header
st-not-json            | 1 | header is not valid JSON                             | generate --model st-not-json
st-bad-dtype           | 1 | unknown dtype "Q7"                                   | generate --model st-bad-dtype
st-past-end            | 1 | past the data buffer (64 bytes)                      | generate --model st-past-end
st-shape-bytes         | 1 | holds 32 bytes but shape x dtype needs 64            | generate --model st-shape-bytes
st-missing-tensor      | 2 | missing tensor 'model.embed_tokens.weight'           | generate --model st-missing-tensor
st-wrong-shape         | 2 | has shape [4, 4] but the config implies [259, 32]    | generate --model st-wrong-shape
gen-temperature        | 2 | --temperature                                        | generate --model good --temperature -1
gen-top-p              | 2 | --top-p                                              | generate --model good --top-p 1.5
gen-top-k              | 2 | --top-k                                              | generate --model good --top-k -3
gen-max-new-tokens     | 2 | --max-new-tokens                                     | generate --model good --max-new-tokens 0
gen-num-samples        | 2 | --num-samples                                        | generate --model good --num-samples 0
gen-threads            | 2 | --threads                                            | generate --model good --threads -1
gen-seed-text          | 2 | --seed                                               | generate --model good --seed abc
gen-slots-text         | 2 | --slots                                              | generate --model good --slots 1e3
gen-flag-no-value      | 2 | --prompt                                             | generate --model good --prompt
gen-device             | 2 | device 'tpu' is not one of auto, cpu, cuda, cuda:N   | generate --model good --device tpu
gen-dtype              | 2 | dtype 'fp8' is not one of auto, float32, bfloat16    | generate --model good --dtype fp8
train-device           | 2 | device 'tpu' is not one of auto, cpu, cuda, cuda:N   | train model.device=tpu
train-device-absent    | 1 | device 'cuda:99' asked for                           | train model.device=cuda:99
train-rollout-dtype    | 2 | pipeline.rollout_dtype                               | train pipeline.rollout_dtype=fp8
train-direct-rollout   | 2 | direct mode generates with the trainer's model       | train pipeline.mode=direct model.device=cpu pipeline.rollout_device=cuda
train-trace-direct     | 2 | run.trace: records the roles of a streaming          | train pipeline.mode=direct run.trace=true
train-metrics-host     | 2 | host 'localhost' is not an IPv4 address              | train pipeline.mode=async run.metrics_listen=localhost:9400
train-metrics-public   | 2 | 0.0.0.0 is not a loopback address                    | train pipeline.mode=async run.metrics_listen=0.0.0.0:0
train-metrics-port     | 2 | port '99999' is not in 0..65535                      | train pipeline.mode=async run.metrics_listen=127.0.0.1:99999
train-trainer-command  | 2 | pipeline.trainer_command: needs pipeline.processes   | train pipeline.mode=async pipeline.trainer_command=true
train-ranks-threads    | 2 | pipeline.trainer_ranks: needs pipeline.processes     | train pipeline.mode=async pipeline.trainer_ranks=2
train-ranks-command    | 2 | pipeline.trainer_command replaces that trainer       | train pipeline.mode=async pipeline.processes=true pipeline.trainer_ranks=2 pipeline.trainer_command=true
train-ranks-range      | 2 | pipeline.trainer_ranks                               | train pipeline.mode=async pipeline.processes=true pipeline.trainer_ranks=0
train-restarts-threads | 2 | pipeline.max_restarts: restarts Sluice's role        | train pipeline.mode=async pipeline.max_restarts=2
train-replicas-threads | 2 | pipeline.rollout_replicas: needs pipeline.processes  | train pipeline.mode=async pipeline.rollout_replicas=2
train-workers-threads  | 2 | pipeline.reward_workers: needs pipeline.processes    | train pipeline.mode=sync pipeline.reward_workers=3
train-replicas-range   | 2 | pipeline.rollout_replicas                            | train pipeline.mode=async pipeline.processes=true pipeline.rollout_replicas=65
train-worker-lease     | 2 | pipeline.worker_lease_seconds                        | train pipeline.mode=async pipeline.processes=true pipeline.worker_lease_seconds=0
yaml-syntax            | 2 | yaml-syntax.yaml                                     | train --config=yaml-syntax.yaml
yaml-type              | 2 | rl.steps                                             | train --config=yaml-type.yaml
yaml-group             | 2 | rl.group_size                                        | train --config=yaml-group.yaml
yaml-lr                | 2 | trainer.lr                                           | train --config=yaml-lr.yaml
yaml-staleness         | 2 | pipeline.max_staleness                               | train --config=yaml-staleness.yaml
yaml-duplicate         | 2 | is set twice                                         | train --config=yaml-duplicate.yaml
yaml-unknown           | 2 | sft.stepz                                            | train --config=yaml-unknown.yaml
yaml-list              | 2 | yaml-list.yaml                                       | train --config=yaml-list.yaml
yaml-binary            | 2 | yaml-binary.yaml                                     | train --config=yaml-binary.yaml
override-no-equals     | 2 | rl.steps                                             | train rl.steps
override-empty-key     | 2 | =3                                                   | train =3
override-range         | 2 | rl.temperature                                       | train rl.temperature=-2
jsonl-prompt-type      | 2 | jsonl-prompt-type.jsonl:2                            | train task.name=jsonl task.jsonl.train_path=jsonl-prompt-type.jsonl
jsonl-no-answer        | 2 | jsonl-no-answer.jsonl:2                              | train task.name=jsonl task.jsonl.train_path=jsonl-no-answer.jsonl
jsonl-array            | 2 | jsonl-array.jsonl:2                                  | train task.name=jsonl task.jsonl.train_path=jsonl-array.jsonl
jsonl-trailing         | 2 | jsonl-trailing.jsonl:2: malformed JSON               | train task.name=jsonl task.jsonl.train_path=jsonl-trailing.jsonl
jsonl-empty-prompt     | 2 | jsonl-empty-prompt.jsonl:1                           | train task.name=jsonl task.jsonl.train_path=jsonl-empty-prompt.jsonl
jsonl-no-file          | 2 | nothere.jsonl                                        | train task.name=jsonl task.jsonl.train_path=nothere.jsonl
eval-bad-model         | 1 | st-truncated/model.safetensors                       | eval --model st-truncated
fifo-config            | 2 | config.json: not a regular file (a FIFO)             | generate --model fifo-config
fifo-weights           | 2 | model.safetensors: not a regular file (a FIFO)       | generate --model fifo-weights
fifo-tokenizer         | 2 | tokenizer.json: not a regular file (a FIFO)          | tokenize --model fifo-tokenizer --text x
fifo-config-file       | 2 | fifo.yaml: not a regular file (a FIFO)               | train --config=fifo.yaml
template-loops         | 2 | the rendering takes more than 20000000 steps         | @in=conversation.jsonl tokenize --model template-loops --chat
template-doubling      | 2 | a string longer than 64 MiB                          | @in=conversation.jsonl tokenize --model template-doubling --chat
template-list-doubling | 2 | a list too long                                      | @in=conversation.jsonl tokenize --model template-list-doubling --chat
template-attr-chain    | 2 | an expression nests too deeply                       | @in=conversation.jsonl tokenize --model template-attr-chain --chat
template-filter-chain  | 2 | an expression nests too deeply                       | @in=conversation.jsonl tokenize --model template-filter-chain --chat
tokenizer-deep         | 2 | JSON nested deeper than 128 levels                   | tokenize --model deep-tokenizer --text x
report-no-run          | 2 | metrics.jsonl                                        | report no-such-run
server-public-no-token | 2 | --token-file                                         | @server --bind=tcp://0.0.0.0:0
server-bad-port        | 2 | 99999                                                | @server --bind=tcp://127.0.0.1:99999
server-bad-scheme      | 2 | udp://127.0.0.1:5                                    | @server --bind=udp://127.0.0.1:5
server-no-token-file   | 2 | no-token.txt                                         | @server --bind=tcp://127.0.0.1:0 --token-file=no-token.txt
server-workers         | 2 | --workers                                            | @server --workers=0
server-columns         | 2 | --columns                                            | @server --columns=prompt:Q9:*
server-shm-capacity    | 2 | --shm-bytes                                          | @server --shm-bytes=1M --capacity-bytes=8M
simulate-no-profile    | 2 | --profile                                            | simulate model.preset=tiny
simulate-missing       | 2 | nowhere.yaml                                         | simulate --profile=nowhere.yaml
simulate-not-profile   | 2 | not a cost profile                                   | simulate --profile=profile-none.yaml
simulate-format        | 2 | profile.format 9                                     | simulate --profile=profile-format.yaml
simulate-negative      | 2 | rollout.decode_row_s                                 | simulate --profile=profile-negative.yaml
simulate-text-cost     | 2 | trainer.token_s                                      | simulate --profile=profile-text.yaml
simulate-other-model   | 2 | calibrate for this model                             | simulate --profile=profile.yaml model.preset=5m
simulate-long-answers  | 2 | rl.max_new_tokens                                    | simulate --profile=profile.yaml model.preset=tiny --median=64 --tail=8
simulate-threads       | 2 | --rollout-threads                                    | simulate --profile=profile.yaml model.preset=tiny --threads=2 --rollout-threads=2
simulate-direct        | 2 | direct is not simulated                              | simulate --profile=profile.yaml model.preset=tiny --modes=direct
simulate-bad-mode      | 2 | fast                                                 | simulate --profile=profile.yaml model.preset=tiny --modes=sync,fast
simulate-huge-run      | 2 | the simulator takes at most                          | simulate --profile=profile.yaml model.preset=tiny rl.steps=1000000 rl.prompts_per_step=64
plan-hardware          | 2 | unknown hardware 'tpu9' (known: h100                 | plan --hardware=tpu9
plan-model             | 2 | unknown model 'gpt-9'                                | plan --model=gpt-9
plan-regime            | 2 | --regime: unknown 'fastest'                          | plan --regime=fastest
plan-policy            | 2 | unknown policy 'magic'                               | plan --policies=sluice,magic
plan-no-fit-engine     | 2 | does not fit a rollout engine                        | plan --model=llama3.1-70b --hardware=a100 --gpus=64 --train-mp=8 --max-response=1024 --median=512 --rollout-tp=1
plan-no-fit-trainer    | 2 | does not train on                                    | plan --model=qwen2.5-72b --gpus=8 --rollout-gpus=4 --max-response=1024 --median=512 --policies=sluice
plan-median            | 2 | --median 9000 is over --max-response 4096            | plan --median=9000 --max-response=4096
plan-split             | 2 | --rollout-gpus 64 leaves none                        | plan --gpus=64 --rollout-gpus=64
plan-tp-split          | 2 | not a multiple of rollout_tp                         | plan --gpus=16 --rollout-gpus=6 --rollout-tp=4 --policies=sluice
plan-one-gpu           | 2 | split_sync: no split of 1 accelerators gives         | plan --gpus=1 --model=qwen2.5-72b --hardware=a100 --max-response=1024 --median=512
plan-micro-batch       | 2 | cannot hold a prompt and the longest answer          | plan --micro-batch-tokens=1000 --max-response=4096 --median=512
plan-huge              | 2 | plan simulates at most                               | plan --steps=1000 --prompts=1024 --group=16
plan-lengths-missing   | 2 | nowhere.jsonl                                        | plan --lengths-from=nowhere.jsonl
plan-lengths-bad       | 2 | metrics-bad.jsonl:1                                  | plan --lengths-from=metrics-bad.jsonl
plan-positional        | 2 | extra                                                | plan extra
calibrate-no-out       | 2 | --out                                                | calibrate model.preset=tiny
calibrate-long-answers | 2 | exceeds rl.max_new_tokens 32                         | calibrate --quick --out=never.yaml model.preset=tiny rl.max_new_tokens=32 --median=16 --tail=4
calibrate-bad-tail     | 2 | --tail                                               | calibrate --quick --out=never.yaml model.preset=tiny --tail=0.5
server-size-suffix     | 2 | --capacity-bytes                                     | @server --capacity-bytes=12X
server-positional      | 2 | extra                                                | @server extra
EOF
)

failures=0
while IFS='|' read -r name want needle command; do
  name=$(echo $name); want=$(echo $want); needle=$(echo "$needle" | sed 's/^ *//; s/ *$//')
  [ -z "$name" ] && continue
  read -r -a words <<< "$command"
  input=/dev/null
  if [[ "${words[0]}" == @in=* ]]; then input=${words[0]#@in=}; words=("${words[@]:1}"); fi
  if [ "${words[0]}" = "@server" ]; then
    timeout 20 "$SERVER" "${words[@]:1}" > out.txt 2>&1 < "$input"; rc=$?
  elif [ "${words[0]}" = train ]; then  # a run directory of its own, in case a case is not refused
    timeout 60 "$SLUICE" "${words[@]}" run.dir="$tmp/runs/$name" > out.txt 2>&1 < "$input"; rc=$?
  else
    timeout 60 "$SLUICE" "${words[@]}" > out.txt 2>&1 < "$input"; rc=$?
  fi
  if $show; then printf '%-24s rc=%s %s\n' "$name" "$rc" "$(grep -v '^\s*$' out.txt | tail -1 | cut -c1-220)"; continue; fi
  if [ "$rc" != "$want" ] || ! grep -qF -- "$needle" out.txt; then
    echo "FAIL $name: rc=$rc (want $want), want the message to hold '$needle':"; tail -3 out.txt
    failures=$((failures + 1))
  elif grep -qiE "terminate called|Segmentation|Aborted \(core|std::bad_alloc|Internal:" out.txt; then
    echo "FAIL $name: refused, but by a crash or an internal error:"; tail -3 out.txt
    failures=$((failures + 1))
  fi
done <<< "$cases"
$show && exit 0
total=$(echo "$cases" | grep -c '|')
[ "$failures" -eq 0 ] && echo "ok   $total bad inputs refused with clear messages"
exit $((failures > 0))
