// InternVL's remote-code InternVLChatModel (model_type internvl_chat) as a mapping onto the composable parts of
// model_spec.hpp. Read: OpenGVLab/InternVL internvl_chat/internvl/model/internvl_chat/configuration_internvl_chat.py
// @ 016ae21f18dbec7efdbf91d96de1febb6626a561, configuration_intern_vit.py @ b9b1bb86a8e786f6479557d03aacc3f8b6b4c4f6,
// modeling_intern_vit.py @ 2d93b099ffbbf45d1db59710914f26fce4494104 and modeling_internvl_chat.py (the same files
// the hub checkpoints ship).
//
//  - language_model: the class llm_config's architectures[0] names (InternVLChatConfig builds LlamaConfig,
//    InternLM2Config, Phi3Config, Qwen2Config or Gemma2Config from it), read by that class's mapping (hf_config.cpp);
//  - vision_model, InternVisionModel: InternVisionEmbeddings (class_embedding (hidden), patch_embedding
//    Conv2d(3, hidden, patch, stride=patch) with its bias, position_embedding ((image / patch)^2 + 1 rows));
//    num_hidden_layers InternVisionEncoderLayers: norm1, InternAttention (qkv Linear(hidden, 3 hidden,
//    bias=qkv_bias); with qk_normalization q_norm and k_norm, InternRMSNorm(hidden) over the whole projection; proj
//    Linear(hidden, hidden) biased), x + attn * ls1, norm2, InternMLP (fc1, act, fc2, biased), x + mlp * ls2, where
//    norm1/norm2 are NORM2FN[norm_type] (rms_norm: InternRMSNorm, layer_norm: nn.LayerNorm) with layer_norm_eps and
//    ls1, ls2 are hidden-wide layer scales (VisionSpec::layer_scale); no final norm. The blocks up to select_layer
//    run (-1: all, last_hidden_state; else hidden_states[select_layer]);
//  - extract_feature drops the CLS token's feature, pixel_shuffle(scale_factor=downsample_ratio) puts 1 / ratio x
//    1 / ratio patches side by side (0.5: 2 x 2, a token of 4 x hidden), then mlp1: LayerNorm(hidden x (1 / ratio)^2),
//    Linear(-> the language model's hidden size), GELU, Linear(-> the same), biased (ProjectorNorm::AfterMerge).
// One 448 x 448 tile of 14-pixel patches is 1024 patches and 256 image tokens (num_image_token); dynamic_image_size
// cuts an image into up to max_dynamic_patch tiles (and a thumbnail), so the tiles of a sample are the run's to give
// with --image-tokens (one tile by default, said in a warning).
#include <string>
#include <vector>

#include "model/hf_reader.hpp"

namespace fsdp::hf {

namespace {

// InternVisionConfig's defaults of the shape keys (InternViT-6B's).
const std::vector<std::pair<std::string, int64_t>> kInternVisionShape = {
    {"hidden_size", 3200},       {"intermediate_size", 12800}, {"num_hidden_layers", 48},
    {"num_attention_heads", 25}, {"image_size", 224},          {"patch_size", 14}};

VisionSpec read_intern_vit(const Reader& r) {
  VisionSpec v = read_vit_shape(r, "intern_vit_6b", "InternVisionModel");
  v.activation = activation_of(r, "hidden_act", "gelu");
  const std::string norm = r.optional_string("norm_type", "rms_norm");
  if (norm != "rms_norm" && norm != "layer_norm")
    r.fail("norm_type", "'" + norm + "' is not one of rms_norm, layer_norm");
  v.norm = norm == "rms_norm" ? NormType::RmsNorm : NormType::LayerNorm;
  v.norm_eps = r.optional_positive("layer_norm_eps", 1e-6);
  v.qkv_bias = r.optional_bool("qkv_bias", false);
  v.attn_out_bias = v.mlp_bias = true;  // proj, fc1, fc2: nn.Linear's default bias
  if (r.optional_bool("qk_normalization", true)) {
    // q_norm / k_norm are InternRMSNorm whatever norm_type is: modelled with the blocks' norm, so only with rms_norm.
    if (v.norm != NormType::RmsNorm)
      r.fail("qk_normalization", "RMSNorm q/k norms in LayerNorm blocks (norm_type layer_norm) are not modelled");
    v.qk_norm = QkNorm::Projection;
  }
  v.layer_scale = true;
  v.position_embedding = PositionEmbedding::Learned;
  v.image_size = r.required_dim("image_size");
  v.patch_size = r.required_dim("patch_size");
  v.num_channels = 3;  // patch_embedding is Conv2d(in_channels=3, ...): num_channels is not read
  v.patch_bias = true;
  v.class_token = true;
  v.pre_norm = v.post_norm = false;
  for (const char* key : {"dropout", "attention_dropout"})
    if (r.optional_probability(key, 0.0) > 0) r.fail(key, "dropout in the vision tower is not modelled");
  return v;
}

}  // namespace

void read_internvl(const json& root, const std::string& text, const std::string& source, LoadedModel& out) {
  ModelSpec& m = out.spec;
  Reader top(root, text, source);
  top.set_arch("InternVLChatModel");
  if (!top.has("llm_config"))
    top.fail("llm_config", "missing: InternVLChatConfig builds the language model from llm_config's architectures");
  const json& lc = sub_config(top, "llm_config");
  Reader lr(lc, text, source);
  if (!lr.has("architectures"))
    lr.fail("architectures",
            "missing in llm_config: InternVLChatConfig builds the language model from architectures[0]");
  std::vector<std::string> llm_unmodelled;
  const std::string llm = read_language_model(lr, "LlamaForCausalLM", m, llm_unmodelled, source);

  const json& vc = sub_config(top, "vision_config");
  Reader vr(vc, text, source);
  vr.set_arch("InternVisionModel");
  vr.set_class_defaults(&kInternVisionShape);
  VisionSpec v = read_intern_vit(vr);
  // The tile size: force_image_size, else vision_config's image_size (InternVLChatModel.__init__). The position table
  // is sized by vision_config's image_size and interpolated to another tile size: a mismatch is not modelled.
  if (top.has("force_image_size") && top.optional_dim("force_image_size", 0) != v.image_size)
    top.fail("force_image_size", "differs from vision_config's image_size " + std::to_string(v.image_size) +
                                     " (an interpolated position table is not modelled)");
  const int64_t select = top.optional_int("select_layer", -1);
  v.run_layers = feature_layer_blocks(top, "select_layer", select, v.num_layers);
  v.merge = merge_of_ratio(top, "downsample_ratio", 0.5);
  for (const char* key : {"use_backbone_lora", "use_llm_lora"})
    if (top.optional_int(key, 0) != 0)
      top.fail(key, "LoRA adapters built into the model are not modelled (plan them with --method lora)");
  v.projector_norm = ProjectorNorm::AfterMerge;
  v.projector_norm_type = NormType::LayerNorm;  // mlp1[0]: nn.LayerNorm
  v.projector_layers = 2;
  v.projector_bias = true;
  v.projector_hidden = m.hidden_size;  // mlp1[1]: Linear(vit_hidden x (1 / ratio)^2, llm_hidden)
  v.projector_activation = ActivationFn::Gelu;
  v.image_tokens = v.tokens_per_image();  // one tile; --image-tokens gives more
  m.vision = v;

  warn_defaults(top, source, "", "InternVLChatConfig", out.warnings);
  warn_defaults(lr, source, "llm_config: ", llm, out.warnings);
  warn_defaults(vr, source, "vision_config: ", "InternVisionConfig", out.warnings);
  for (auto& w : llm_unmodelled) out.warnings.push_back(std::move(w));
  if (vr.optional_probability("drop_path_rate", 0.0) > 0)
    out.warnings.push_back(source +
                           ": key 'drop_path_rate' is set: stochastic depth's per-sample masks and scaling "
                           "in the vision tower are not counted");
  if (v.run_layers < v.num_layers)
    out.warnings.push_back(source + ": select_layer " + std::to_string(select) + ": the vision tower's last " +
                           std::to_string(v.num_layers - v.run_layers) +
                           " block(s) are counted but not run (their forward is not priced, and no backward reaches "
                           "them)");
  out.warnings.push_back(source + ": " + std::to_string(v.image_tokens) + " image tokens per sample (one " +
                         std::to_string(v.image_size) + "x" + std::to_string(v.image_size) +
                         " tile; dynamic_image_size cuts an image into up to max_dynamic_patch tiles and a "
                         "thumbnail) join the language model's sequence; --image-tokens N sets another count");
}

}  // namespace fsdp::hf
