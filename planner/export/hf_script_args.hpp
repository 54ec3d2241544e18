// The arguments of the user's training script for the targets that run a Hugging Face model under it (DeepSpeed's
// engine, accelerate with Transformers' Trainer): script_args.json, typed by the target's key table.
#pragma once

#include "export/config_doc.hpp"
#include "planfile/plan_file.hpp"

namespace fsdp {

// model_name_or_path, max_seq_length, attn_implementation, gradient_checkpointing (and torch_dtype).
FlatDoc hf_script_args(const PlanFile& plan, const std::string& hf_id);
// Sets seq_len, attention and act_ckpt (full per layer or none) from script_args.json.
void read_hf_script_args(const FlatDoc& d, const std::string& source, Strategy& s);

// Transformers' names (huggingface/transformers src/transformers/modeling_utils.py attn_implementation).
const char* hf_attention(AttentionImpl a);

}  // namespace fsdp
