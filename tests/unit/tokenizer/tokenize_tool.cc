// tokenize_tool: a test-only driver for tests/reference/test_tokenizer.py.
//
//   tokenize_tool --model PATH   (a directory with tokenizer.json, or a .gguf file)
//
// Reads JSON requests, one per line, on stdin and answers each with one JSON line:
//   {"op": "encode", "texts": [...], "add_special_tokens": bool}
//       -> {"ids": [[...], ...], "seconds": encode time of the whole batch}
//   {"op": "decode", "ids": [[...], ...], "skip_special_tokens": bool}
//       -> {"texts": [...]}
//   {"op": "incremental", "ids": [[...], ...], "skip_special_tokens": bool}
//       -> {"pieces": [[add() results..., flush() result], ...]}
//   {"op": "info"} -> {"vocab_size", "bos_id", "eos_id", "stop_ids", "chat_template"}
// A load error prints the Status on stderr and exits 1.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json handle(const dserve::Tokenizer& tok, const json& req) {
  const std::string op = req.value("op", std::string());
  if (op == "encode") {
    const bool add = req.value("add_special_tokens", false);
    std::vector<std::string> texts = req.at("texts").get<std::vector<std::string>>();
    json out = json::array();
    std::vector<std::vector<int32_t>> all(texts.size());
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < texts.size(); ++i) all[i] = tok.encode(texts[i], add);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {{"ids", all}, {"seconds", seconds}};
  }
  if (op == "decode" || op == "incremental") {
    const bool skip = req.value("skip_special_tokens", false);
    const auto all = req.at("ids").get<std::vector<std::vector<int32_t>>>();
    json out = json::array();
    for (const auto& ids : all) {
      if (op == "decode") {
        out.push_back(tok.decode(ids, skip));
      } else {
        dserve::IncrementalDecoder dec(tok, skip);
        json pieces = json::array();
        for (int32_t id : ids) pieces.push_back(dec.add(id));
        pieces.push_back(dec.flush());
        out.push_back(std::move(pieces));
      }
    }
    return {{op == "decode" ? "texts" : "pieces", std::move(out)}};
  }
  if (op == "info") {
    return {{"vocab_size", tok.vocab_size()}, {"bos_id", tok.bos_id()},
            {"eos_id", tok.eos_id()},         {"stop_ids", tok.stop_ids()},
            {"chat_template", tok.chat_template()}};
  }
  return {{"error", "unknown op \"" + op + "\""}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--model") model = argv[i + 1];
  }
  if (model.empty()) {
    std::fprintf(stderr, "usage: %s --model PATH < requests.jsonl\n", argv[0]);
    return 2;
  }
  auto tok = dserve::Tokenizer::from_path(model);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    json reply;
    try {
      reply = handle(**tok, json::parse(line));
    } catch (const json::exception& e) {
      reply = {{"error", e.what()}};
    }
    std::cout << dump(reply) << '\n' << std::flush;
  }
  return 0;
}
