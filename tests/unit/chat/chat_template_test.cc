// ChatTemplate (message normalisation, variables, errors) and find_chat_template.
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "chat/chat_template_source.h"

namespace dserve::chat {
namespace {

using ojson = nlohmann::ordered_json;

std::unique_ptr<ChatTemplate> make(const std::string& src, const std::string& bos = "<s>",
                                   const std::string& eos = "</s>") {
  auto t = ChatTemplate::create(src, bos, eos);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

std::string render(const ChatTemplate& t, const ojson& messages, bool agp = false,
                   const ojson& extra = ojson::object()) {
  auto out = t.render(messages, agp, extra);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : "";
}

// SmolLM2-135M-Instruct's template, as its GGUF stores it.
constexpr const char* kSmolLm2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplateTest, RendersSmolLm2) {
  auto t = make(kSmolLm2);
  const ojson msgs = ojson::parse(R"([{"role":"user","content":"Hi"}])");
  EXPECT_EQ(render(*t, msgs, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const ojson with_system = ojson::parse(
      R"([{"role":"system","content":"S"},{"role":"user","content":"Q"},{"role":"assistant","content":"A"}])");
  EXPECT_EQ(render(*t, with_system, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>"
            "assistant\nA<|im_end|>\n");
}

TEST(ChatTemplateTest, ContentPartsAreJoinedAndNullIsEmpty) {
  auto t = make("{% for m in messages %}[{{ m.content }}]{% endfor %}");
  const ojson msgs = ojson::parse(R"([
    {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
    {"role":"assistant","content":null,"tool_calls":[]},
    {"role":"user","content":[]}])");
  EXPECT_EQ(render(*t, msgs), "[a\nb][][]");
  const ojson image =
      ojson::parse(R"([{"role":"user","content":[{"type":"image_url","image_url":{}}]}])");
  const auto out = t->render(image, false);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("image_url"), std::string::npos);
}

TEST(ChatTemplateTest, NullFieldsAreDroppedAndReasoningAliased) {
  auto t = make("{% for m in messages %}{{ m | tojson }}{% endfor %}");
  const ojson msgs = ojson::parse(
      R"([{"role":"assistant","content":"x","name":null,"reasoning_content":"why"},
          {"role":"assistant","content":"y","reasoning":"r2"}])");
  EXPECT_EQ(
      render(*t, msgs),
      R"({"thinking": "why", "role": "assistant", "content": "x", "reasoning_content": "why"})"
      R"({"thinking": "r2", "role": "assistant", "content": "y", "reasoning": "r2", "reasoning_content": "r2"})");
}

TEST(ChatTemplateTest, Variables) {
  auto t = make(
      "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}|"
      "{{ enable_thinking }}|{{ tools is none }}");
  EXPECT_EQ(render(*t, ojson::array(), true, {{"enable_thinking", false}}),
            "<s>|</s>|True|None|None|False|True");
  // Empty special tokens are undefined, as in transformers when the tokenizer has none.
  auto no_bos = make("{{ bos_token is defined }}{{ eos_token }}", "", "E");
  EXPECT_EQ(render(*no_bos, ojson::array()), "FalseE");
  // Tool schemas keep the client's key order.
  auto tools = make("{{ tools | tojson }}");
  const ojson extra = ojson::parse(R"({"tools":[{"z":1,"a":{"y":true,"b":null}}]})");
  EXPECT_EQ(render(*tools, ojson::array(), false, extra),
            R"([{"z": 1, "a": {"y": true, "b": null}}])");
}

TEST(ChatTemplateTest, Errors) {
  auto bad = ChatTemplate::create("{% for m in messages %}", "", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 1"), std::string::npos);

  auto t = make(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor "
      "%}ok");
  EXPECT_EQ(render(*t, ojson::parse(R"([{"role":"user","content":"x"}])")), "ok");
  auto out = t->render(ojson::parse(R"([{"role":"tool","content":"x"}])"), false);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "Only user and assistant roles are supported!");

  EXPECT_FALSE(t->render(ojson::object(), false).ok());
  EXPECT_FALSE(t->render(ojson::parse("[1]"), false).ok());
  EXPECT_FALSE(t->render(ojson::parse(R"([{"role":"user","content":5}])"), false).ok());
  EXPECT_FALSE(t->render(ojson::array(), false, ojson::parse("[1]")).ok());

  std::string deep = R"([{"role":"user","content":"x","meta":)";
  for (int i = 0; i < 100000; ++i) deep += "[";
  for (int i = 0; i < 100000; ++i) deep += "]";
  deep += "}]";
  const ojson deep_json = ojson::parse(deep);
  out = t->render(deep_json, false);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("nested too deeply"), std::string::npos);

  auto concat = make("{{ messages[0].content + 1 }}");
  out = concat->render(ojson::parse(R"([{"role":"user","content":"x"}])"), false);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, RenderIsRepeatable) {
  // A namespace accumulator is fresh for every render.
  auto t = make(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ "
      "ns.n }}");
  const ojson msgs =
      ojson::parse(R"([{"role":"user","content":"a"},{"role":"user","content":"b"}])");
  EXPECT_EQ(render(*t, msgs), "2");
  EXPECT_EQ(render(*t, msgs), "2");
}

class FindChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("DSERVE_TEST_TMPDIR");
    dir_ = std::filesystem::path(tmp ? tmp : "/tmp") /
           ("find_chat_template_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(FindChatTemplateTest, TokenizerConfigString) {
  write(
      "tokenizer_config.json",
      R"({"chat_template":"T","bos_token":{"__type":"AddedToken","content":"<B>"},"eos_token":"<E>"})");
  const auto src = find_chat_template(dir_.string());
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "T");
  EXPECT_EQ(src->bos_token, "<B>");
  EXPECT_EQ(src->eos_token, "<E>");
}

TEST_F(FindChatTemplateTest, NamedTemplatesTakeDefault) {
  write(
      "tokenizer_config.json",
      R"({"chat_template":[{"name":"tool_use","template":"U"},{"name":"default","template":"D"}],"eos_token":null})");
  write("special_tokens_map.json", R"({"eos_token":{"content":"<E>"}})");
  const auto src = find_chat_template(dir_.string());
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "D");
  EXPECT_EQ(src->bos_token, "");
  EXPECT_EQ(src->eos_token, "<E>");
}

TEST_F(FindChatTemplateTest, JinjaFileWins) {
  write("tokenizer_config.json", R"({"chat_template":"old"})");
  write("chat_template.jinja", "new\n");
  const auto src = find_chat_template(dir_.string());
  ASSERT_TRUE(src.ok());
  EXPECT_EQ(src->source, "new\n");
}

TEST_F(FindChatTemplateTest, Missing) {
  write("tokenizer_config.json", R"({"bos_token":"<s>"})");
  EXPECT_EQ(find_chat_template(dir_.string()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(find_chat_template((dir_ / "nope.gguf").string()).status().code(),
            StatusCode::kNotFound);
  write("tokenizer_config.json", "{not json");
  EXPECT_EQ(find_chat_template(dir_.string()).status().code(), StatusCode::kCorrupt);
  write("bad.gguf", "GGUF garbage");
  EXPECT_FALSE(find_chat_template((dir_ / "bad.gguf").string()).ok());
}

}  // namespace
}  // namespace dserve::chat
