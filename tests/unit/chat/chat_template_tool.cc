// Test-only: renders chat templates for tests/reference/test_chat_template.py.
//
//   chat_template_tool render < job.json
//     job: {"template": "...", "bos_token": "...", "eos_token": "...",
//           "cases": [{"messages": [...], "add_generation_prompt": bool, "extra": {...}}, ...]}
//     prints a JSON array, one {"text": "..."} or {"error": "..."} per case.
//   chat_template_tool find MODEL_PATH
//     prints {"source": ..., "bos_token": ..., "eos_token": ...} or {"error": ...}.
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "chat/chat_template_source.h"

namespace {

using ojson = nlohmann::ordered_json;

int render_job() {
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  const ojson job = ojson::parse(input, nullptr, /*allow_exceptions=*/false);
  if (job.is_discarded() || !job.is_object()) {
    std::cerr << "stdin is not a JSON object\n";
    return 2;
  }
  ojson results = ojson::array();
  auto tmpl = dserve::chat::ChatTemplate::create(
      job.value("template", ""), job.value("bos_token", ""), job.value("eos_token", ""));
  for (const ojson& c : job.value("cases", ojson::array())) {
    if (!tmpl.ok()) {
      results.push_back({{"error", tmpl.status().to_string()}});
      continue;
    }
    auto text =
        (*tmpl)->render(c.value("messages", ojson::array()),
                        c.value("add_generation_prompt", false), c.value("extra", ojson::object()));
    if (text.ok()) {
      results.push_back({{"text", *text}});
    } else {
      results.push_back({{"error", text.status().to_string()}});
    }
  }
  // Invalid UTF-8 in the output is replaced rather than aborting the dump.
  std::cout << results.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
  return 0;
}

int find(const std::string& path) {
  auto src = dserve::chat::find_chat_template(path);
  ojson out;
  if (src.ok()) {
    out = {{"source", src->source}, {"bos_token", src->bos_token}, {"eos_token", src->eos_token}};
  } else {
    out = {{"error", src.status().to_string()}};
  }
  std::cout << out.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "render" && argc == 2) return render_job();
  if (mode == "find" && argc == 3) return find(argv[2]);
  std::cerr << "usage: chat_template_tool render < job.json | chat_template_tool find MODEL_PATH\n";
  return 2;
}
