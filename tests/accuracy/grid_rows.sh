# Sourced by run_grid.sh and run_time_grid.sh: plans every row of grid.txt with fsdp-plan (all knobs pinned,
# runtime fsdp-run) on hardware profile $1, runs it with `fsdp-run --steps $2`, and lists the rows it ran in
# $out/rows.tsv (its 13th column the row's model, its 14th the mesh, its 15th the gate). Needs plan_bin, run_bin,
# model, root and out;
# $3, if given, is a space-separated list of the row numbers to run.
run_grid_rows() {
  local hw=$1 steps=$2 only=${3:-} i=0 plan extra
  local strategy world wrap ckpt dtype accum offload reshard group mb seq row_model mesh gate part
  : >"$out/rows.tsv"
  while read -r strategy world wrap ckpt dtype accum offload reshard group mb seq row_model mesh gate; do
    [[ -z "$strategy" || "$strategy" == \#* ]] && continue
    mb=${mb:-2} seq=${seq:-64}
    # the model: $model (acc-small) unless the row names a zoo model (its 12th field; - for acc-small)
    [[ "$row_model" == - ]] && row_model=
    local row_model_arg=${row_model:-$model}
    mesh=${mesh:--} gate=${gate:-all}
    i=$((i + 1))
    if [[ -n "$only" && " $only " != *" $i "* ]]; then continue; fi
    plan=$out/plan$i.yaml
    extra=()
    [[ "$group" != 0 ]] && extra=(--hsdp-group "$group")
    [[ "$reshard" != - ]] && extra+=(--reshard-after-forward "$reshard")
    # the mesh (13th field): - (data parallel only) or parts joined by +: tpN, ppN, sp (sequence parallelism; without
    # it a tp row runs without), gpipe (the pipeline schedule; 1f1b otherwise), loraR (LoRA of rank R on the default
    # targets, the base frozen; not a mesh dimension, the row's method), loraR:T1,T2 (on those target modules)
    if [[ "$mesh" != - ]]; then
      local sp=false schedule=1f1b
      for part in ${mesh//+/ }; do
        case "$part" in
          tp*) extra+=(--tp "${part#tp}") ;;
          pp*) extra+=(--pp "${part#pp}") ;;
          sp) sp=true ;;
          gpipe) schedule=gpipe ;;
          lora*)
            local lora=${part#lora}
            extra+=(--method lora --lora-rank "${lora%%:*}")
            [[ "$lora" == *:* ]] && extra+=(--lora-targets "${lora#*:}") ;;
          *) echo "row $i: unknown mesh part '$part'"; return 1 ;;
        esac
      done
      extra+=(--sequence-parallel "$sp" --pp-schedule "$schedule")
    fi
    # dtype: the param dtype, or param/reduce (the reduce dtype defaults to fp32)
    local pdtype=${dtype%%/*} rdtype=fp32
    [[ "$dtype" == */* ]] && rdtype=${dtype#*/}
    "$plan_bin" --model "$row_model_arg" --hw "$hw" --runtime fsdp-run --gpus "$world" --strategy "$strategy" --wrap "$wrap" \
      --act-ckpt "$ckpt" --param-dtype "$pdtype" --reduce-dtype "$rdtype" --micro-batch "$mb" --seq "$seq" \
      --grad-accum "$accum" --offload "$offload" --attention eager "${extra[@]}" --out "$plan" --json \
      >"$out/pred$i.json" 2>"$out/plan$i.err" || { echo "row $i: fsdp-plan failed: $(cat "$out/plan$i.err")"; return 1; }
    "$run_bin" --nproc-per-node "$world" "$plan" --steps "$steps" --report "$out/report$i.json" >"$out/run$i.log" 2>&1 ||
      { echo "row $i: fsdp-run failed:"; tail -5 "$out/run$i.log"; return 1; }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$i" "$strategy" "$world" "$wrap" \
      "$ckpt" "$dtype" "$accum" "$offload" "$group" "$mb" "$seq" "$reshard" "${row_model:-acc-small}" "$mesh" "$gate" \
      >>"$out/rows.tsv"
  done <"$root/tests/accuracy/grid.txt"
}
