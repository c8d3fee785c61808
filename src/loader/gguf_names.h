// Mapping of llama.cpp's GGUF tensor names to Hugging Face names, so model code
// sees one naming scheme whichever format a model came in.
//   token_embd.weight          -> model.embed_tokens.weight
//   blk.3.attn_q.weight        -> model.layers.3.self_attn.q_proj.weight
// Names without a mapping are returned unchanged.
//
// Thread-safety: pure function.
#pragma once

#include <string>

namespace dserve {

std::string gguf_to_hf_name(const std::string& gguf_name);

}  // namespace dserve
