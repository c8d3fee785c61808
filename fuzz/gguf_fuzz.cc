// Fuzz target: a GGUF file (loader/gguf_file.h) as `dserve serve model.gguf` reads it:
// header, metadata and tensor table through ModelFiles (which also converts Q5_0 /
// Q5_1 tensors), then everything read from the metadata: the model's hyper-parameters
// (Llama/Qwen2 and DeepSeek), the tokenizer (tokenizer.ggml.*, then used on a short
// text) and the chat template with its BOS/EOS strings. The input is the whole file.
#include <algorithm>
#include <string>

#include "base/log.h"
#include "chat/chat_template_source.h"
#include "fuzz_support.h"
#include "loader/model_files.h"
#include "model/config.h"
#include "model/deepseek_config.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dserve::set_log_level("error");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  const std::string path = fuzz::write_scratch_file("model.gguf", fuzz::as_text(data, size));
  Result<std::unique_ptr<ModelFiles>> files = ModelFiles::open(path);
  if (!files.ok()) return 0;
  (void)ModelConfig::from_model_files(**files);
  (void)DeepseekConfig::from_model_files(**files);
  (void)(*files)->weights_summary();
  if (Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_model_files(**files); tok.ok()) {
    const std::vector<int32_t> ids = (*tok)->encode("Hello world! 123 <|im_end|> é\xff", true);
    (void)(*tok)->decode(ids, false);
    (void)(*tok)->stop_ids();
    for (int32_t id = 0; id < std::min((*tok)->vocab_size(), 512); ++id) (void)(*tok)->token_bytes(id);
  }
  (void)chat::find_chat_template(path);
  return 0;
}
