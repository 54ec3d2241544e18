// The leaf modules the module graph is built from (module_graph.cpp), shared by the decoder stack and the vision
// tower (vision_tower.cpp): linears, norms, activations, dropout. Internal to simulator/model.
#pragma once

#include <cstdint>
#include <string>

#include "model/module_graph.hpp"

namespace fsdp::graph_parts {

// Elementwise FLOPs per element are small next to GEMMs; counted for completeness with the
// conventional costs used by Korthikanti et al. (arXiv 2205.05198) Appendix: they are
// excluded from the 6N rule and from MFU (PaLM paper, arXiv 2204.02311 Appendix B).
constexpr double kNormFlopsPerElem = 5.0;
constexpr double kActFlopsPerElem = 4.0;

// A Linear of in x out (+ out bias): 2 in out FLOPs per token, and its input saved for the weight gradient.
ModuleNode linear(std::string name, std::string short_name, int64_t layer, int64_t in, int64_t out, bool bias,
                  const std::string& input_id, TensorClass input_cls);

// The shape of a norm: its weight's length, the elements it normalises per token, and the rows (statistics)
// per token. A decoder norm: hidden, hidden, 1. A per-head q/k norm (Qwen3RMSNorm(head_dim) over q viewed as
// heads x head_dim): head_dim, heads * head_dim, heads.
struct NormShape {
  int64_t weight = 0;
  int64_t elems = 0;
  int64_t rows = 1;
};

NormShape hidden_norm(const ModelSpec& m);
ModuleNode norm(std::string name, NormType type, int64_t layer, const std::string& input_id, NormShape shape);
ModuleNode norm(std::string name, const ModelSpec& m, int64_t layer, const std::string& input_id);
NormShape qk_norm_shape(const ModelSpec& m, int64_t heads);
// A layer's q_norm or k_norm over `heads` heads of its projection (model_spec.hpp QkNorm).
ModuleNode qk_norm(std::string name, const ModelSpec& m, int64_t layer, const std::string& input_id, int64_t heads);
// A sublayer's output times a learned hidden-wide vector (InternViT's ls1 / ls2), reading the tensor `input_id`.
ModuleNode layer_scale(std::string name, int64_t layer, int64_t hidden, const std::string& input_id);
// The MLP's activation function (with the gating multiply for gated MLPs), `f` elements per token.
ModuleNode activation(const std::string& mlp, int64_t layer, double f, int64_t ffn);
ModuleNode dropout(std::string name, int64_t layer, double elems, bool per_seq, bool attention_internal);

}  // namespace fsdp::graph_parts
