// File: worker/tokenizer/chat_template_test.cc
#include "gtest/gtest.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

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
  EXPECT_EQ(RenderChat(data, {{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(RenderChat, ExplicitSystemReplacesDefault) {
  TokenizerData data;
  data.chat_template = kSmolLm2Template;
  EXPECT_EQ(
      RenderChat(data, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}}, false),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello<|im_end|>\n");
}

TEST(RenderChat, PlainChatMlWithoutTemplate) {
  TokenizerData data;
  EXPECT_EQ(RenderChat(data, {{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(RenderChat(data, {}, false), "");
}

}  // namespace
}  // namespace tinyserve
