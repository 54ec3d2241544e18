// The vision tower of a vision-language model in the module graph (model_spec.hpp VisionSpec): the patch
// embeddings, the blocks (decoder-style layers of the tower's own width, built by the same layer builders as the
// decoder layers, and put first in the layer stack so FSDP wraps them as units), the blocks past the feature
// layer (held, not run), and the projector that turns patches into image tokens of the language model's width.
// Every module here carries tokens_per_sample (module_graph.hpp): the vision tokens of a sample for the
// embeddings and the blocks, the image tokens for the projector.
//
// Module layouts read (transformers v4.51): models/clip/modeling_clip.py CLIPVisionEmbeddings (patch_embedding =
// Conv2d(num_channels, hidden, patch_size, stride=patch_size, bias=False), class_embedding (hidden),
// position_embedding (num_patches + 1, hidden)), CLIPVisionTransformer (pre_layrnorm, encoder, post_layernorm on
// the pooled CLS token), CLIPEncoderLayer (layer_norm1, self_attn with q/k/v/out_proj biased, layer_norm2, mlp
// fc1/fc2 biased); models/llava/modeling_llava.py LlavaMultiModalProjector (linear_1, act, linear_2);
// models/qwen2_vl/modeling_qwen2_vl.py PatchEmbed (Conv3d(in_channels, embed_dim, (temporal_patch_size,
// patch_size, patch_size), bias=False)), VisionRotaryEmbedding (no parameters), Qwen2VLVisionBlock (norm1,
// attn.qkv + attn.proj biased, norm2, mlp fc1/fc2), PatchMerger (ln_q over context_dim, mlp: Linear(context_dim x
// spatial_merge_size^2 -> same), GELU, Linear(-> dim)); models/llama4/modeling_llama4.py @ 000c33fd
// (Llama4VisionModel: 2-D rotary in the blocks beside positional_embedding_vlm, layernorm_post, the pixel-shuffle
// vision_adapter's fc1 / fc2 and multi_modal_projector.linear_1: three linears without biases); OpenGVLab/InternVL
// modeling_intern_vit.py @ 2d93b099 (InternVisionEncoderLayer's layer scales ls1 / ls2, q_norm / k_norm).
#include <algorithm>

#include "core/errors.hpp"
#include "model/module_graph.hpp"
#include "model/module_parts.hpp"

namespace fsdp {

using namespace graph_parts;

namespace {

// The spec the layer builders build a vision block from: the tower's width, heads (MHA), MLP, norm and biases;
// rotary (full head, FLOPs only) for a 2-D rotary tower, none for a learned table (its positions are added once
// in the embeddings). No dropout (CLIP's attention_dropout 0.0, Qwen2-VL has none).
ModelSpec vision_block_spec(const ModelSpec& model, const VisionSpec& v) {
  ModelSpec b;
  b.name = model.name + " vision tower";
  b.family = "decoder";
  b.hidden_size = v.hidden_size;
  b.num_layers = v.num_layers;
  b.num_heads = b.num_kv_heads = v.num_heads;
  b.head_dim = v.head_dim();
  b.ffn_size = v.ffn_size;
  b.gated_mlp = v.gated_mlp;
  b.activation = v.activation;
  b.vocab_size = 1;  // no embedding table of its own: never read by the layer builders
  b.norm = v.norm;
  b.norm_eps = v.norm_eps;
  // Llama 4's blocks rotate q and k (2-D rotary) beside the learned table the embeddings add.
  b.position_embedding = v.block_rotary ? PositionEmbedding::Rope : v.position_embedding;
  b.qk_norm = v.qk_norm;
  b.max_positions = v.seq_per_image();
  b.qkv_bias = v.qkv_bias;
  b.attn_out_bias = v.attn_out_bias;
  b.mlp_bias = v.mlp_bias;
  b.dropout = false;
  return b;
}

}  // namespace

ModuleId ModuleGraph::build_vision() {
  const VisionSpec& v = *spec_.vision;
  FSDP_ASSERT(layers_.empty(), "the vision tower opens the layer stack");
  const int64_t h = v.hidden_size;
  const int64_t tokens = v.vision_tokens();
  const int64_t seq = v.seq_per_image();
  const int64_t patches = seq - (v.class_token ? 1 : 0);

  ModuleNode emb_c;
  emb_c.name = "vision_tower.embeddings";
  emb_c.short_name = "embeddings";
  emb_c.kind = ModuleKind::Vision;
  emb_c.tokens_per_sample = tokens;
  emb_c.output_elems_per_token = h;
  const ModuleId emb = add(root_, emb_c);
  // The patch embedding is a convolution with stride = kernel: one GEMM of (patches x C p p t) by (C p p t x
  // hidden), on the patches only (the CLS token is a parameter): its per-token FLOPs and input scaled by
  // patches / seq.
  const int64_t patch_in = v.num_channels * v.patch_size * v.patch_size * v.temporal_patch_size;
  ModuleNode patch = linear("vision_tower.embeddings.patch_embedding", "patch_embedding", -1, patch_in, h, v.patch_bias,
                            "vision_tower.pixel_values", TensorClass::Compute);
  patch.lora_target = false;
  const double on_patches = static_cast<double>(patches) / static_cast<double>(seq);
  patch.flops_per_token *= on_patches;
  patch.saved[0].elems_per_token *= on_patches;
  ModuleId prev = add(emb, patch);
  if (v.class_token) {
    ModuleNode cls;
    cls.name = "vision_tower.embeddings.class_embedding";
    cls.short_name = "class_embedding";
    cls.kind = ModuleKind::Embedding;
    cls.params = h;
    cls.output_elems_per_token = h;
    const ModuleId c = add(emb, cls);
    feeds(prev, c);
    prev = c;
  }
  if (v.position_embedding == PositionEmbedding::Learned) {
    ModuleNode pos;
    pos.name = "vision_tower.embeddings.position_embedding";
    pos.short_name = "position_embedding";
    pos.kind = ModuleKind::PositionEmbedding;
    pos.params = seq * h;
    pos.output_elems_per_token = h;
    const ModuleId pe = add(emb, pos);
    feeds(prev, pe);
    prev = pe;
  }
  if (v.pre_norm) {
    const ModuleId n =
        add(emb, norm("vision_tower.pre_layrnorm", v.norm, -1, "vision_tower.embeddings.out", NormShape{h, h, 1}));
    feeds(prev, n);
    prev = n;
  }

  // The blocks that run, into the layer stack; then the held ones (past the feature layer) and CLIP's
  // post_layernorm: parameters of the model (counted, sharded with the root) that the image path never runs.
  vision_layers_spec_ = vision_block_spec(spec_, v);
  cur_ = &vision_layers_spec_;
  cur_vision_ = &v;
  prefix_ = "vision_tower.layers.";
  layer_offset_ = 0;
  ModuleNode stack;
  stack.name = "vision_tower.layers";
  stack.short_name = "layers";
  stack.kind = ModuleKind::LayerStack;
  stack.tokens_per_sample = tokens;
  const ModuleId st = add(root_, stack);
  for (int64_t i = 0; i < v.run_layers; ++i) {
    const ModuleId layer = build_layer(st, i, prev);
    layers_.push_back(layer);
    prev = layer;
  }
  if (v.run_layers < v.num_layers || v.post_norm) {
    ModuleNode held;
    held.name = "vision_tower.held";
    held.short_name = "held";
    held.kind = ModuleKind::LayerStack;
    held.runs = false;
    const ModuleId hd = add(root_, held);
    for (int64_t i = v.run_layers; i < v.num_layers; ++i) g_[build_layer(hd, i, prev)].runs = false;
    if (v.post_norm)
      g_[add(hd, norm("vision_tower.post_layernorm", v.norm, -1, "vision_tower.pooled", NormShape{h, h, 1}))].runs =
          false;
  }

  // The projector, per image token: merge x merge patches (their features side by side, hidden x merge^2), the
  // optional norm (per patch before the merge: weight hidden over merge^2 rows of a token; after: one row of
  // hidden x merge^2), then linear_1, the activation, ..., the last linear to the language model's width.
  const int64_t mm = v.merge * v.merge;
  const int64_t in = v.merged_width();
  ModuleNode proj_c;
  proj_c.name = "multi_modal_projector";
  proj_c.short_name = "multi_modal_projector";
  proj_c.kind = ModuleKind::Vision;
  proj_c.tokens_per_sample = v.image_tokens;
  proj_c.output_elems_per_token = spec_.hidden_size;
  const ModuleId proj = add(root_, proj_c);
  std::string in_id = "vision_tower.out";
  if (v.projector_norm != ProjectorNorm::None) {
    const NormShape shape =
        v.projector_norm == ProjectorNorm::BeforeMerge ? NormShape{h, in, mm} : NormShape{in, in, 1};
    const ModuleId n = add(proj, norm("multi_modal_projector.norm", v.projector_norm_type, -1, in_id, shape));
    feeds(prev, n);
    prev = n;
    in_id = "multi_modal_projector.norm.out";
  }
  // The projector's linears, with the activation between each two (VisionSpec::projector_layers); each activation
  // keeps its input, the linear's output, for backward.
  const std::string p = "multi_modal_projector";
  int64_t width = in;
  ModuleId last = prev;
  for (int64_t k = 1; k <= v.projector_layers; ++k) {
    const std::string lin = p + ".linear_" + std::to_string(k);
    const bool final_layer = k == v.projector_layers;
    const int64_t out = final_layer ? spec_.hidden_size : v.projector_hidden;
    const ModuleId l = add(proj, linear(lin, "linear_" + std::to_string(k), -1, width, out, v.projector_bias, in_id,
                                        TensorClass::Compute));
    g_[l].lora_target = false;
    g_[l].output_id = lin + ".out";
    feeds(last, l);
    last = l;
    width = out;
    if (final_layer) break;
    ModuleNode act = activation(lin, -1, static_cast<double>(out), out);
    act.saved.push_back(SavedTensor{lin + ".out", static_cast<double>(out), false, TensorClass::Compute});
    const ModuleId a = add(proj, act);
    feeds(l, a);
    last = a;
    in_id = lin + ".act.out";
  }
  return last;
}

}  // namespace fsdp
