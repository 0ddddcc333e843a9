// File: worker/tokenizer/chat_template_test.cc
// RenderChat and the Jinja subset: every case of tests/golden/chat/chat_templates.json (real
// models' templates rendered by transformers, scripts/make_chat_goldens.py) byte for byte, and
// what happens to templates outside the subset or refusing their messages.
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/jinja.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

using json = nlohmann::ordered_json;

TEST(JinjaGolden, EveryCaseMatchesTransformers) {
  std::ifstream in("tests/golden/chat/chat_templates.json");
  ASSERT_TRUE(in) << "tests/golden/chat/chat_templates.json (run from the repository root)";
  std::stringstream text;
  text << in.rdbuf();
  const json golden = json::parse(text.str());
  int rendered = 0, refused = 0, continued_cases = 0;
  for (const json& c : golden["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const std::string where = name + " / " + c["conversation"].get<std::string>() +
                              (c["variables"]["add_generation_prompt"].get<bool>() ? " +gen" : "") +
                              (c["variables"].contains("tools") ? " +tools" : "");
    auto t = jinja::Template::Parse(golden["templates"][name].get<std::string>());
    ASSERT_TRUE(t.ok()) << where << ": " << t.status();
    absl::StatusOr<std::string> out;
    const bool continued = c.value("continue_final_message", false);
    if (continued) {  // through RenderChat, which places and cuts transformers' marker
      TokenizerData data;
      data.chat_template = golden["templates"][name].get<std::string>();
      data.tokens = {c["variables"]["bos_token"].get<std::string>(),
                     c["variables"]["eos_token"].get<std::string>()};
      data.bos_id = 0;
      data.eos_id = 1;
      std::vector<ChatMessage> messages;
      for (const json& m : c["variables"]["messages"]) {
        messages.emplace_back(m["role"].get<std::string>(), m["content"].get<std::string>());
      }
      out = RenderChat(data, messages, /*add_generation_prompt=*/false, "",
                       /*continue_final_message=*/true);
      ++continued_cases;
    } else {
      out = t->Render(c["variables"]);
    }
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok()) << where << " rendered: " << *out;
      // RenderChat words its own refusals; the template's own raise_exception message stays.
      if (!continued) {
        EXPECT_EQ(out.status().message(), c["error"].get<std::string>()) << where;
      }
      ++refused;
    } else {
      ASSERT_TRUE(out.ok()) << where << ": " << out.status();
      EXPECT_EQ(*out, c["rendered"].get<std::string>()) << where;
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 100);
  EXPECT_GT(refused, 10);
  EXPECT_GT(continued_cases, 30);
}

TEST(Jinja, RefusesWhatItDoesNotImplementNamingIt) {
  for (const auto& [source, named] : std::vector<std::pair<std::string, std::string>>{
           {"{% macro f(x) %}{{ x }}{% endmacro %}", "macro"},
           {"{{ x | wordwrap }}", "wordwrap"},
           {"{{ x is callable }}", "callable"},
           {"{% for x in y recursive %}{% endfor %}", "recursive"},
           {"{% if x %}never closed", "endif"},
           {"{{ 'unclosed }}", "unclosed string"},
           {"{{ x ", "unclosed tag"},
           {"{{ a b }}", "expected '}}'"}}) {
    auto t = jinja::Template::Parse(source);
    ASSERT_FALSE(t.ok()) << source;
    EXPECT_NE(std::string(t.status().message()).find(named), std::string::npos)
        << source << " -> " << t.status();
  }
  std::string deep;
  for (int i = 0; i < 1000; ++i) deep += "(";
  EXPECT_FALSE(jinja::Template::Parse("{{ " + deep + " }}").ok());  // no stack overflow
}

TEST(Jinja, RuntimeErrorsAndRunawayTemplatesAreStatuses) {
  auto loop = jinja::Template::Parse(
      "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}");
  ASSERT_TRUE(loop.ok());
  auto out = loop->Render(json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(std::string(out.status().message()).find("too long"), std::string::npos);
  auto bad = jinja::Template::Parse("{{ 'a' + 1 }}");
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->Render(json::object()).ok());
  // As jinja2's Undefined: printed as nothing, but its attributes are errors.
  auto undefined = jinja::Template::Parse("[{{ nothing }}]");
  ASSERT_TRUE(undefined.ok());
  EXPECT_EQ(*undefined->Render(json::object()), "[]");
  auto attr = jinja::Template::Parse("{{ nothing.attr }}");
  ASSERT_TRUE(attr.ok());
  EXPECT_FALSE(attr->Render(json::object()).ok());
}

// What an independent review fed the renderer (templates from corrupt or hostile model files,
// messages and tools from users): each is an error status or a bounded result, never a crash,
// a hang or unbounded memory.
TEST(Jinja, HostileTemplatesAndInputsStayBounded) {
  auto render = [](const std::string& source, const json& vars = json::object()) {
    auto t = jinja::Template::Parse(source);
    if (!t.ok()) return absl::StatusOr<std::string>(t.status());
    return t->Render(vars);
  };
  std::string sum = "{{ 1", nots = "{{ ", trims = "{{ 'x'", conds = "{{ 1";
  for (int i = 0; i < 10000; ++i) {
    sum += "+1";
    nots += "not ";
    trims += "|trim";
    conds += " if true else 1";
  }
  for (const std::string& deep : {sum + " }}", nots + "x }}", trims + " }}", conds + " }}"}) {
    EXPECT_FALSE(render(deep).ok()) << deep.substr(0, 40);  // refused while parsing
  }
  for (const char* overflow :
       {"{{ (-9223372036854775807 - 1) // -1 }}", "{{ 9223372036854775807 + 1 }}", "{{ 10 ** 20 }}",
        "{{ -(-9223372036854775807 - 1) }}", "{{ (-9223372036854775807 - 1) | abs }}"}) {
    EXPECT_FALSE(render(overflow).ok()) << overflow;
  }
  EXPECT_EQ(*render("{{ 'ab'[1::9223372036854775807] }}"), "b");
  EXPECT_EQ(*render("{{ [1, 2, 3][2::-9223372036854775807] }}"), "[3]");
  for (const char* huge : {"{{ ('x' * 1000000).replace('x', 'y' * 1000000) }}",
                           "{{ range(1000000) | join('x' * 100000) }}",
                           "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(100) %}"
                           "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
                           "{% for i in range(1000) %}{% set t = 'y' * 1000000 %}"
                           "{{ (t ~ t)|length }}{% endfor %}"}) {
    auto out = render(huge);
    EXPECT_FALSE(out.ok()) << huge;
  }
  // Deeply nested tools or tool calls from a request are refused before the renderer walks them.
  TokenizerData data;
  data.chat_template = "{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}";
  std::string nested;
  for (int i = 0; i < 50000; ++i) nested += "[";
  for (int i = 0; i < 50000; ++i) nested += "]";
  EXPECT_FALSE(RenderChat(data, {{"user", "Hi"}}, true, nested).ok());
  EXPECT_FALSE(RenderChat(data, {{"assistant", "", nested}}, true).ok());
  // Many messages: each reference to `messages` shares it (no copy per lookup).
  data.chat_template =
      "{% for m in messages %}{{ loop.index }}/{{ messages | length }} {{ m.content }}\n{% endfor "
      "%}";
  std::vector<ChatMessage> many;
  for (int i = 0; i < 5000; ++i) many.emplace_back("user", std::string(100, 'a'));
  auto out = RenderChat(data, many, false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("5000/5000 "), std::string::npos);
}

constexpr char kSmolLm2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(RenderChat, SmolLm2DefaultSystemTurn) {
  TokenizerData data;
  data.chat_template = kSmolLm2Template;
  // model-formats.md §1.3.
  EXPECT_EQ(*RenderChat(data, {{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(
      *RenderChat(data, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}}, false),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello<|im_end|>\n");
}

TEST(RenderChat, TheTemplatesTokensAndRefusals) {
  TokenizerData data;
  data.tokens = {"<unk>", "<s>", "</s>"};
  data.bos_id = 1;
  data.eos_id = 2;
  data.chat_template =
      "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
      "{{ raise_exception('no system turns') }}{% endif %}[{{ m.role }}] {{ m.content }}"
      "{{ eos_token }}{% endfor %}";
  EXPECT_EQ(*RenderChat(data, {{"user", "Hi"}}, true), "<s>[user] Hi</s>");
  auto refused = RenderChat(data, {{"system", "x"}}, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("no system turns"), std::string::npos);
}

// Template kwargs (vLLM's chat_template_kwargs) through RenderChat give what transformers
// renders with the same variables: Qwen3's enable_thinking=false cases of the golden file (one
// of them with an assistant turn's reasoning_content).
TEST(RenderChat, TemplateKwargs) {
  std::ifstream in("tests/golden/chat/chat_templates.json");
  ASSERT_TRUE(in) << "run from the repository root";
  std::stringstream text;
  text << in.rdbuf();
  const json golden = json::parse(text.str());
  TokenizerData data;
  data.chat_template = golden["templates"]["Qwen3"].get<std::string>();
  int checked = 0;
  for (const json& c : golden["cases"]) {
    const json& v = c["variables"];
    if (c["template"] != "Qwen3" || !v.contains("enable_thinking") || !c.contains("rendered") ||
        v.contains("tools"))
      continue;
    std::vector<ChatMessage> messages;
    bool plain = true;  // calls are tested elsewhere
    for (const json& m : v["messages"]) {
      plain = plain && !m.contains("tool_calls");
      messages.emplace_back(m["role"].get<std::string>(), m["content"].get<std::string>(), "",
                            m.value("tool_call_id", ""), m.value("reasoning_content", ""));
    }
    if (!plain) continue;
    absl::StatusOr<std::string> out = RenderChat(data, messages, v["add_generation_prompt"], "",
                                                 false, R"({"enable_thinking": false})");
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c["rendered"].get<std::string>()) << c["conversation"];
    ++checked;
  }
  EXPECT_GE(checked, 6);
  // Without the kwarg the generation prompt has no empty think block.
  const std::string on = *RenderChat(data, {{"user", "Hi"}}, true);
  const std::string off =
      *RenderChat(data, {{"user", "Hi"}}, true, "", false, R"({"enable_thinking": false})");
  EXPECT_EQ(off, on + "<think>\n\n</think>\n\n");
  // What RenderChat sets itself cannot come from kwargs; the kwargs must be an object.
  for (const char* bad :
       {R"({"messages": []})", R"({"add_generation_prompt": false})", "[1]", "{"}) {
    EXPECT_EQ(CheckTemplateKwargs(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(RenderChat(data, {{"user", "Hi"}}, true, "", false, bad).ok()) << bad;
  }
  EXPECT_TRUE(CheckTemplateKwargs("").ok());
}

TEST(RenderChat, PlainChatMlWithoutATemplateOrOutsideTheSubset) {
  TokenizerData data;
  EXPECT_TRUE(CheckChatTemplate(data).ok());
  EXPECT_EQ(*RenderChat(data, {{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*RenderChat(data, {}, false), "");
  data.chat_template = "{% macro turn(m) %}{{ m }}{% endmacro %}";
  EXPECT_FALSE(CheckChatTemplate(data).ok());
  EXPECT_EQ(*RenderChat(data, {{"user", "Hi"}}, false), "<|im_start|>user\nHi<|im_end|>\n");
}

}  // namespace
}  // namespace tinyserve
