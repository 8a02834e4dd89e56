set -x
cd /work/main
for p in "grad-ckpt*2,approx-act*20" "grad-ckpt*1,approx-act+mesa*9,approx-act*12"; do
  n=$(tr '*,+' 'x_p' <<< "$p")
  GODEBUG=cpu.fma=off /tmp/ft bench step --model llama-1b --method lora-all --variant ms-norm --compute-dtype bfloat16 --batch-size 4 --seq-len 512 --block-plan "$p" --steps 2 --work-dir /tmp/l1bw --json /tmp/l1b-$n.json --overwrite
done
