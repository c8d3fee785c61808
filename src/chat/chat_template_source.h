// Where a model keeps its chat template and the BOS/EOS strings the template uses:
//   - a Hugging Face directory: chat_template.jinja if present (transformers gives it
//     priority), else `chat_template` in tokenizer_config.json (a string, or a list of
//     {name, template} of which "default" is taken); bos_token / eos_token from
//     tokenizer_config.json (a string or an {"content": ...} object), else from
//     special_tokens_map.json;
//   - a GGUF file: `tokenizer.chat_template`, with the tokens at
//     tokenizer.ggml.bos_token_id / eos_token_id in tokenizer.ggml.tokens.
// Only these files are read (no weights). A missing token is an empty string.
//
// Thread-safety: pure function (reads files).
#pragma once

#include <string>

#include "base/status.h"

namespace dserve::chat {

struct ChatTemplateSource {
  std::string source;
  std::string bos_token;
  std::string eos_token;
};

// NotFound when the model has no chat template; Corrupt when a file is malformed.
Result<ChatTemplateSource> find_chat_template(const std::string& model_path);

}  // namespace dserve::chat
