#include "export/hf_script_args.hpp"

namespace fsdp {

const char* hf_attention(AttentionImpl a) {
  switch (a) {
    case AttentionImpl::Flash:
      return "flash_attention_2";
    case AttentionImpl::Flash3:
      // Transformers' flash_attention_3 (from v4.53: ms-swift examples/train/flash_attention_3/transformers.sh,
      // 'pip install "transformers==4.53.*"'), the flash_attn_interface package of flash-attention's hopper/ build.
      return "flash_attention_3";
    case AttentionImpl::Flex:
      return "flex_attention";  // Transformers' name for torch's flex_attention
    case AttentionImpl::Sdpa:
      return "sdpa";
    case AttentionImpl::Eager:
      return "eager";
  }
  return "sdpa";
}

FlatDoc hf_script_args(const PlanFile& plan, const std::string& hf_id) {
  const Strategy& s = plan.strategy;
  FlatDoc d;
  d.emplace_back("model_name_or_path", hf_id);
  d.emplace_back("torch_dtype", s.master_dtype == DType::Bf16 ? "bfloat16" : "float32");
  d.emplace_back("attn_implementation", hf_attention(s.attention));
  d.emplace_back("max_seq_length", s.seq_len);
  d.emplace_back("gradient_checkpointing", s.act_ckpt == ActCkpt::Full);
  return d;
}

void read_hf_script_args(const FlatDoc& d, const std::string& source, Strategy& s) {
  s.seq_len = doc_get(d, "max_seq_length", source).get<int64_t>();
  const std::string attn = doc_get(d, "attn_implementation", source).get<std::string>();
  s.attention = attn == "flash_attention_2"   ? AttentionImpl::Flash
                : attn == "flash_attention_3" ? AttentionImpl::Flash3
                : attn == "flex_attention"    ? AttentionImpl::Flex
                : attn == "eager"             ? AttentionImpl::Eager
                                              : AttentionImpl::Sdpa;
  s.act_ckpt = doc_get(d, "gradient_checkpointing", source).get<bool>() ? ActCkpt::Full : ActCkpt::None;
  s.master_dtype = doc_get(d, "torch_dtype", source).get<std::string>() == "bfloat16" ? DType::Bf16 : DType::Fp32;
}

}  // namespace fsdp
