#!/usr/bin/env python3
"""Writes tests/golden/chat/chat_templates.json: real models' chat templates rendered by Hugging
Face transformers (the Jinja2 environment apply_chat_template uses), for TinyServe's own Jinja
renderer (worker/tokenizer/jinja.cc) to match byte for byte (chat_template_golden_test).

Each template below is a model's `chat_template` as published in its tokenizer_config.json
(and as llama.cpp's tests/test-chat-template.cpp and GGUF files carry it). Each is rendered for
every conversation (with and without the generation prompt; the tool list only where a template
reads it); a template that raises (raise_exception) records its message instead.

Usage: .venv/bin/python scripts/make_chat_goldens.py [--out tests/golden/chat/chat_templates.json]
"""
import argparse
import json
import os

from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

TEMPLATES = [
    # HuggingFaceTB/SmolLM2-135M-Instruct (the default model; also in its GGUF).
    ("SmolLM2-Instruct", "", "<|im_end|>",
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
     "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
     "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
     "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant\n' }}{% endif %}"),
    # teknium/OpenHermes-2.5-Mistral-7B: plain ChatML.
    ("ChatML", "", "",
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
     "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    # TinyLlama/TinyLlama-1.1B-Chat-v1.0 (Zephyr's): one tag per line, trim_blocks at work.
    ("TinyLlama-1.1B-Chat-v1.0", "<s>", "</s>",
     "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
     "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
     "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
     "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
     "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
     "{% endfor %}"),
    # meta-llama/Llama-2-7b-chat-hf.
    ("Llama-2-chat", "<s>", "</s>",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
     "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = "
     "messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
     "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
     "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
     "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
     "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
     "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
     "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"),
    # mistralai/Mistral-7B-Instruct-v0.2 (the old one without a system turn: raises on one).
    ("Mistral-7B-Instruct-v0.2", "<s>", "</s>",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
     "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
     "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only "
     "user and assistant roles are supported!') }}{% endif %}{% endfor %}"),
    # mistralai's "v1" template with a system prompt: whitespace control, `is defined`.
    ("Mistral-v1", "<s>", "</s>",
     "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = "
     "messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n"
     "    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for "
     "message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 "
     "== 0) %}\n        {{- raise_exception('After the optional system message, conversation "
     "roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    "
     "{%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is "
     "defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] "
     "+ ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + "
     "' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n"
     "        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        "
     "{{- raise_exception('Only user and assistant roles are supported, with the exception "
     "of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n"),
    # mistralai/Mistral-Large-Instruct-2407 ("v3"): selectattr, namespace, tools with tojson.
    ("Mistral-v3", "<s>", "</s>",
     "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = "
     "messages[0][\"content\"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n"
     "    {%- set loop_messages = messages %}\n{%- endif %}\n{%- if not tools is defined %}\n"
     "    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages = loop_messages | "
     "selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{#- This block checks for "
     "alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = "
     "namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    "
     "{%- if not (message.role == \"tool\" or message.role == \"tool_results\" or "
     "(message.tool_calls is defined and message.tool_calls is not none)) %}\n        "
     "{%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n            "
     "{{- raise_exception(\"After the optional system message, conversation roles must "
     "alternate user/assistant/user/assistant/...\") }}\n        {%- endif %}\n        "
     "{%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n"
     "{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
     "        {%- if tools is not none and (message == user_messages[-1]) %}\n            "
     "{{- \"[AVAILABLE_TOOLS] [\" }}\n            {%- for tool in tools %}\n                "
     "{%- set tool = tool.function %}\n                {{- '{\"type\": \"function\", "
     "\"function\": {' }}\n                {%- for key, val in tool.items() if key != "
     "\"return\" %}\n                    {%- if val is string %}\n                        "
     "{{- '\"' + key + '\": \"' + val + '\"' }}\n                    {%- else %}\n"
     "                        {{- '\"' + key + '\": ' + val|tojson }}\n                    "
     "{%- endif %}\n                    {%- if not loop.last %}\n                        "
     "{{- \", \" }}\n                    {%- endif %}\n                {%- endfor %}\n"
     "                {{- \"}}\" }}\n                {%- if not loop.last %}\n"
     "                    {{- \", \" }}\n                {%- else %}\n                    "
     "{{- \"]\" }}\n                {%- endif %}\n            {%- endfor %}\n            "
     "{{- \"[/AVAILABLE_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and "
     "system_message is defined %}\n            {{- \"[INST] \" + system_message + \"\\n\\n\" "
     "+ message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            "
     "{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    "
     "{%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + "
     "message[\"content\"]|trim + eos_token}}\n    {%- else %}\n        "
     "{{- raise_exception(\"Only user and assistant roles are supported, with the exception "
     "of an initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n"),
    # TheBloke/FusionNet_34Bx2_MoE-AWQ: range over messages|length, -%} everywhere.
    ("FusionNet", "<s>", "</s>",
     "{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' "
     "-%}\n{%- if idx > 1 -%}\n{{- bos_token + '[INST] ' + messages[idx]['content'] + "
     "' [/INST]' -}}\n{%- else -%}\n{{- messages[idx]['content'] + ' [/INST]' -}}\n"
     "{%- endif -%}\n{% elif messages[idx]['role'] == 'system' %}\n{{- '[INST] <<SYS>>\\n' "
     "+ messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n{%- elif messages[idx]['role'] == "
     "'assistant' -%}\n{{- ' '  + messages[idx]['content'] + ' ' + eos_token -}}\n{% endif %}\n"
     "{% endfor %}"),
    # google/gemma-7b-it: a filter binding tighter than +.
    ("gemma-7b-it", "<bos>", "<eos>",
     "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
     "}}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') "
     "%}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
     "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
     "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"),
    # google/gemma-3-270m-it (also gemma-3-1b/4b-it): the system turn folded into the first user
    # turn, content as a string or a list of parts, `is string` / `is iterable`, `| trim`.
    ("gemma-3-it", "<bos>", "<eos>",
     "{{ bos_token }}\n"
     "{%- if messages[0]['role'] == 'system' -%}\n"
     "    {%- if messages[0]['content'] is string -%}\n"
     "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
     "    {%- else -%}\n"
     "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
     "    {%- endif -%}\n"
     "    {%- set loop_messages = messages[1:] -%}\n"
     "{%- else -%}\n"
     "    {%- set first_user_prefix = \"\" -%}\n"
     "    {%- set loop_messages = messages -%}\n"
     "{%- endif -%}\n"
     "{%- for message in loop_messages -%}\n"
     "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
     "        {{ raise_exception(\"Conversation roles must alternate "
     "user/assistant/user/assistant/...\") }}\n"
     "    {%- endif -%}\n"
     "    {%- if (message['role'] == 'assistant') -%}\n"
     "        {%- set role = \"model\" -%}\n"
     "    {%- else -%}\n"
     "        {%- set role = message['role'] -%}\n"
     "    {%- endif -%}\n"
     "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
     "    {%- if message['content'] is string -%}\n"
     "        {{ message['content'] | trim }}\n"
     "    {%- elif message['content'] is iterable -%}\n"
     "        {%- for item in message['content'] -%}\n"
     "            {%- if item['type'] == 'image' -%}\n"
     "                {{ '<start_of_image>' }}\n"
     "            {%- elif item['type'] == 'text' -%}\n"
     "                {{ item['text'] | trim }}\n"
     "            {%- endif -%}\n"
     "        {%- endfor -%}\n"
     "    {%- else -%}\n"
     "        {{ raise_exception(\"Invalid content type\") }}\n"
     "    {%- endif -%}\n"
     "    {{ '<end_of_turn>\n' }}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}\n"
     "    {{'<start_of_turn>model\n'}}\n"
     "{%- endif -%}\n"),
    # openchat/openchat-3.5-0106: str.title().
    ("openchat-3.5", "<s>", "<|end_of_turn|>",
     "{{ bos_token }}{% for message in messages %}{{ 'GPT4 Correct ' + "
     "message['role'].title() + ': ' + message['content'] + '<|end_of_turn|>'}}{% endfor %}"
     "{% if add_generation_prompt %}{{ 'GPT4 Correct Assistant:' }}{% endif %}"),
    # deepseek-ai/deepseek-coder-33b-instruct: namespace, `not x is defined`, mixed trims.
    ("deepseek-coder-instruct", "<｜begin▁of▁sentence｜>", "<|EOT|>",
     "{% if not add_generation_prompt is defined %}\n{% set add_generation_prompt = false %}\n"
     "{% endif %}\n{%- set ns = namespace(found=false) -%}\n{%- for message in messages -%}\n"
     "    {%- if message['role'] == 'system' -%}\n        {%- set ns.found = true -%}\n"
     "    {%- endif -%}\n{%- endfor -%}\n{{bos_token}}{%- if not ns.found -%}\n{{'You are an AI "
     "programming assistant, utilizing the Deepseek Coder model, developed by Deepseek "
     "Company, and you only answer questions related to computer science. For politically "
     "sensitive questions, security and privacy issues, and other non-computer science "
     "questions, you will refuse to answer\\n'}}\n{%- endif %}\n{%- for message in messages %}\n"
     "    {%- if message['role'] == 'system' %}\n{{ message['content'] }}\n    {%- else %}\n"
     "        {%- if message['role'] == 'user' %}\n{{'### Instruction:\\n' + "
     "message['content'] + '\\n'}}\n        {%- else %}\n{{'### Response:\\n' + "
     "message['content'] + '\\n<|EOT|>\\n'}}\n        {%- endif %}\n    {%- endif %}\n"
     "{%- endfor %}\n{% if add_generation_prompt %}\n{{'### Response:'}}\n{% endif %}"),
    # meta-llama/Meta-Llama-3-8B-Instruct: set, trim, bos on the first turn.
    ("Llama-3-Instruct", "<|begin_of_text|>", "<|eot_id|>",
     "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
     "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
     "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
     "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    # microsoft/Phi-3-vision-128k-instruct: messages[-1], {{- -}}.
    ("Phi-3-vision", "<s>", "<|endoftext|>",
     "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + "
     "message['content'] + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt and "
     "messages[-1]['role'] != 'assistant' %}{{- '<|assistant|>\n' -}}{% endif %}"),
    # ibm-granite/granite-3.0-8b-instruct: tools with tojson(indent=4), loop.last.
    ("granite-3.0-instruct", "<|end_of_text|>", "<|end_of_text|>",
     "{%- if tools %}\n    {{- '<|start_of_role|>available_tools<|end_of_role|>\n' }}\n"
     "    {%- for tool in tools %}\n    {{- tool | tojson(indent=4) }}\n    {%- if not "
     "loop.last %}\n        {{- '\n\n' }}\n    {%- endif %}\n    {%- endfor %}\n    "
     "{{- '<|end_of_text|>\n' }}\n{%- endif %}\n{%- for message in messages %}\n    {%- if "
     "message['role'] == 'system' %}\n    {{- '<|start_of_role|>system<|end_of_role|>' + "
     "message['content'] + '<|end_of_text|>\n' }}\n    {%- elif message['role'] == 'user' %}\n"
     "    {{- '<|start_of_role|>user<|end_of_role|>' + message['content'] + "
     "'<|end_of_text|>\n' }}\n    {%- elif message['role'] == 'assistant' %}\n    "
     "{{- '<|start_of_role|>assistant<|end_of_role|>'  + message['content'] + "
     "'<|end_of_text|>\n' }}\n    {%- endif %}\n    {%- if loop.last and "
     "add_generation_prompt %}\n    {{- '<|start_of_role|>assistant<|end_of_role|>' }}\n"
     "    {%- endif %}\n{%- endfor %}"),
    # CohereForAI/c4ai-command-r-plus: str.strip(), `elif false == true`.
    ("command-r", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = "
     "messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif false == true %}"
     "{% set loop_messages = messages %}{% set system_message = 'You are Command-R, a "
     "brilliant, sophisticated, AI-assistant trained to assist human users by providing "
     "thorough responses. You are trained by Cohere.' %}{% else %}{% set loop_messages = "
     "messages %}{% set system_message = false %}{% endif %}{% if system_message != false %}"
     "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}"
     "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% set content = message['content'] %}"
     "{% if message['role'] == 'user' %}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + "
     "content.strip() + '<|END_OF_TURN_TOKEN|>' }}{% elif message['role'] == 'assistant' %}"
     "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>'  + content.strip() + "
     "'<|END_OF_TURN_TOKEN|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"),
    # Llama 3.1's template with JSON tool calls (one statement per line, as vLLM's and
    # llm_templates' copies lay it out): reject, the items filter, `in` on a message, tojson.
    ("Llama-3.1-tools", "<|begin_of_text|>", "<|eot_id|>",
     "\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n"
     "{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n"
     "{%- endif %}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" "
     "%}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n"
     "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = "
     "messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n"
     "    {%- set system_message = \"\" %}\n{%- endif %}\n<|start_header_id|>system<|end_header_id|>\n"
     "{%- if builtin_tools is defined or tools is not none %}\nEnvironment: ipython\n{%- endif %}\n"
     "{%- if builtin_tools is defined %}\nTools: {{ builtin_tools | reject('equalto', "
     "'code_interpreter') | join(\", \") }}\n{%- endif %}\nCutting Knowledge Date: December 2023\n"
     "Today Date: {{ date_string }}\n{%- if tools is not none and not tools_in_user_message %}\n"
     "You have access to the following functions.\n\n{%- for t in tools %}\n    {{ t | tojson(indent=4) "
     "}}\n{%- endfor %}\n{%- endif %}\n\n{{ system_message }}<|eot_id|>\n\n{%- if "
     "tools_in_user_message and not tools is none %}\n    {%- if messages | length != 0 %}\n"
     "        {%- set first_user_message = messages[0]['content']|trim %}\n        {%- set messages "
     "= messages[1:] %}\n    {%- else %}\n        {{ raise_exception(\"Cannot put tools in the first "
     "user message when there's no first user message!\") }}\n    {%- endif %}\n"
     "<|start_header_id|>user<|end_header_id|>\nGiven the following functions, please respond "
     "with a JSON for a function call.\n\n{%- for t in tools %}\n    {{ t | tojson(indent=4) }}\n"
     "{%- endfor %}\n\n{{ first_user_message }}<|eot_id|>\n{%- endif %}\n{%- for message in "
     "messages %}\n    {%- if not (message.role == 'ipython' or message.role == 'tool' or "
     "'tool_calls' in message) %}\n<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n"
     "{{ message['content'] | trim }}<|eot_id|>\n    {%- elif 'tool_calls' in message %}\n"
     "        {%- if not message.tool_calls|length == 1 %}\n            {{ raise_exception(\"This "
     "model only supports single tool-calls at once!\") }}\n        {%- endif %}\n        {%- set "
     "tool_call = message.tool_calls[0].function %}\n        {%- if builtin_tools is defined and "
     "tool_call.name in builtin_tools %}\n<|start_header_id|>assistant<|end_header_id|>\n"
     "<|python_tag|>{{ tool_call.name }}.call(\n            {%- for arg_name, arg_val in "
     "tool_call.arguments | items %}\n                {{ arg_name }}=\"{{ arg_val }}\"\n"
     "                {%- if not loop.last %}, {% endif %}\n            {%- endfor %}\n)\n"
     "        {%- else %}\n<|start_header_id|>assistant<|end_header_id|>\n{\"name\": \"{{ "
     "tool_call.name }}\", \"parameters\": {{ tool_call.arguments | tojson }}}\n        {%- endif "
     "%}\n        {%- if builtin_tools is defined %}\n<|eom_id|>\n        {%- else %}\n<|eot_id|>\n"
     "        {%- endif %}\n    {%- elif message.role == \"tool\" or message.role == \"ipython\" "
     "%}\n<|start_header_id|>ipython<|end_header_id|>\n        {%- if message.content is mapping or "
     "message.content is iterable %}\n{{ message.content | tojson }}\n        {%- else %}\n"
     "{{ message.content }}\n        {%- endif %}\n<|eot_id|>\n    {%- endif %}\n{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n<|start_header_id|>assistant<|end_header_id|>\n{%- endif %}\n"),
    # Python's and jinja2's corners an independent review found (floats, Unicode whitespace,
    # tojson's arguments, generators, precedence, conversions), and CRLF line ends.
    # Qwen/Qwen2.5-7B-Instruct (the 0.5B-1.5B Instruct models carry the same): tools in
    # <tools></tools>, calls as <tool_call> JSON, tool results as user <tool_response>.
    ("Qwen2.5-Instruct", "", "<|im_end|>",
     '{%- if tools %}\n'
     "    {{- '<|im_start|>system\\n' }}\n"
     "    {%- if messages[0]['role'] == 'system' %}\n"
     "        {{- messages[0]['content'] }}\n"
     '    {%- else %}\n'
     "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
     '    {%- endif %}\n'
     '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
     '    {%- for tool in tools %}\n'
     '        {{- "\\n" }}\n'
     '        {{- tool | tojson }}\n'
     '    {%- endfor %}\n'
     '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
     '{%- else %}\n'
     "    {%- if messages[0]['role'] == 'system' %}\n"
     "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
     '    {%- else %}\n'
     "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
     '    {%- endif %}\n'
     '{%- endif %}\n'
     '{%- for message in messages %}\n'
     '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n'
     "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
     '    {%- elif message.role == "assistant" %}\n'
     "        {{- '<|im_start|>' + message.role }}\n"
     '        {%- if message.content %}\n'
     "            {{- '\\n' + message.content }}\n"
     '        {%- endif %}\n'
     '        {%- for tool_call in message.tool_calls %}\n'
     '            {%- if tool_call.function is defined %}\n'
     '                {%- set tool_call = tool_call.function %}\n'
     '            {%- endif %}\n'
     '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
     '            {{- tool_call.name }}\n'
     '            {{- \'", "arguments": \' }}\n'
     '            {{- tool_call.arguments | tojson }}\n'
     "            {{- '}\\n</tool_call>' }}\n"
     '        {%- endfor %}\n'
     "        {{- '<|im_end|>\\n' }}\n"
     '    {%- elif message.role == "tool" %}\n'
     '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
     "            {{- '<|im_start|>user' }}\n"
     '        {%- endif %}\n'
     "        {{- '\\n<tool_response>\\n' }}\n"
     '        {{- message.content }}\n'
     "        {{- '\\n</tool_response>' }}\n"
     '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
     "            {{- '<|im_end|>\\n' }}\n"
     '        {%- endif %}\n'
     '    {%- endif %}\n'
     '{%- endfor %}\n'
     '{%- if add_generation_prompt %}\n'
     "    {{- '<|im_start|>assistant\\n' }}\n"
     '{%- endif %}\n'),
    # Qwen/Qwen3-0.6B: as Qwen2.5 plus thinking: <think> blocks kept only after the last
    # user query, reasoning_content, enable_thinking (false: an empty think block).
    ("Qwen3", "", "<|im_end|>",
     '{%- if tools %}\n'
     "    {{- '<|im_start|>system\\n' }}\n"
     "    {%- if messages[0].role == 'system' %}\n"
     "        {{- messages[0].content + '\\n\\n' }}\n"
     '    {%- endif %}\n'
     '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
     '    {%- for tool in tools %}\n'
     '        {{- "\\n" }}\n'
     '        {{- tool | tojson }}\n'
     '    {%- endfor %}\n'
     '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
     '{%- else %}\n'
     "    {%- if messages[0].role == 'system' %}\n"
     "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
     '    {%- endif %}\n'
     '{%- endif %}\n'
     '{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n'
     '{%- for message in messages[::-1] %}\n'
     '    {%- set index = (messages|length - 1) - loop.index0 %}\n'
     '    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith(\'<tool_response>\') and message.content.endswith(\'</tool_response>\')) %}\n'
     '        {%- set ns.multi_step_tool = false %}\n'
     '        {%- set ns.last_query_index = index %}\n'
     '    {%- endif %}\n'
     '{%- endfor %}\n'
     '{%- for message in messages %}\n'
     '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
     "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
     '    {%- elif message.role == "assistant" %}\n'
     '        {%- set content = message.content %}\n'
     "        {%- set reasoning_content = '' %}\n"
     '        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n'
     '            {%- set reasoning_content = message.reasoning_content %}\n'
     '        {%- else %}\n'
     "            {%- if '</think>' in message.content %}\n"
     "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
     "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
     '            {%- endif %}\n'
     '        {%- endif %}\n'
     '        {%- if loop.index0 > ns.last_query_index %}\n'
     '            {%- if loop.last or (not loop.last and reasoning_content) %}\n'
     "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
     '            {%- else %}\n'
     "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
     '            {%- endif %}\n'
     '        {%- else %}\n'
     "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
     '        {%- endif %}\n'
     '        {%- if message.tool_calls %}\n'
     '            {%- for tool_call in message.tool_calls %}\n'
     '                {%- if (loop.first and content) or (not loop.first) %}\n'
     "                    {{- '\\n' }}\n"
     '                {%- endif %}\n'
     '                {%- if tool_call.function %}\n'
     '                    {%- set tool_call = tool_call.function %}\n'
     '                {%- endif %}\n'
     '                {{- \'<tool_call>\\n{"name": "\' }}\n'
     '                {{- tool_call.name }}\n'
     '                {{- \'", "arguments": \' }}\n'
     '                {%- if tool_call.arguments is string %}\n'
     '                    {{- tool_call.arguments }}\n'
     '                {%- else %}\n'
     '                    {{- tool_call.arguments | tojson }}\n'
     '                {%- endif %}\n'
     "                {{- '}\\n</tool_call>' }}\n"
     '            {%- endfor %}\n'
     '        {%- endif %}\n'
     "        {{- '<|im_end|>\\n' }}\n"
     '    {%- elif message.role == "tool" %}\n'
     '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
     "            {{- '<|im_start|>user' }}\n"
     '        {%- endif %}\n'
     "        {{- '\\n<tool_response>\\n' }}\n"
     '        {{- message.content }}\n'
     "        {{- '\\n</tool_response>' }}\n"
     '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
     "            {{- '<|im_end|>\\n' }}\n"
     '        {%- endif %}\n'
     '    {%- endif %}\n'
     '{%- endfor %}\n'
     '{%- if add_generation_prompt %}\n'
     "    {{- '<|im_start|>assistant\\n' }}\n"
     '    {%- if enable_thinking is defined and enable_thinking is false %}\n'
     "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
     '    {%- endif %}\n'
     '{%- endif %}'),
    ("review-cases", "<s>", "</s>",
     "{{ [1500.0, 10.0, 1e6, 3e10, 0.0001, 1e-05, 1.5e16, 1e16, -0.0, 2.5, 1e22] }}\r\n"
     "{{ {'t': 20.0, 'big': 1e300} | tojson }}|{{ ('Be nice.' ~ '\\u3000\\xa0') | trim }}|"
     "{{ '\\u2003x y\\u2003'.split() }}|{{ ' a  b '.split(none, 1) }}|{{ 'abc'.replace('', '-') }}\r\n"
     "{{ {'a': '\\u00e9', 'b': [1]} | tojson(true) }}|{{ {'a': 1} | tojson(indent=2) }}|"
     "{{ {'a': [1, 2]} | tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}\r"
     "{{ -5|abs }}|{{ 'tool_call'|title }}|{{ \"they're here\"|title }}|{{ 'hello world'.title() }}|"
     "{{ 'x-ray (b)'|capitalize }}\n"
     "{% if messages|selectattr('role', 'equalto', 'nobody') %}gen-true{% endif %}|"
     "{{ messages|map(attribute='role')|select('ne', 'user')|list }}|"
     "{{ ['a', 'b', 'c']|reject('equalto', 'b')|join(',') }}|{{ [0, 1, '', 'x']|select|list }}\n"
     "{{ true == 1 }}|{{ true is number }}|{{ true is integer }}|{{ '' is lower }}|{{ 'ab1' is lower }}|"
     "{{ 'AB' is upper }}|{{ '12abc'|int }}|{{ '0x1A'|int }}|{{ ' 42 '|int }}|{{ '3.7'|int }}|"
     "{{ '1e3'|float }}|{{ 'x'|float }}|{{ 1e3 }}|{{ 1_000 }}|{{ 2.5e-3 }}|{{ '\\101\\a'|length }}\n"
     "{{ 10 // 3 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 7 % -3 }}|{{ 2 ** -1 }}|{{ 2 ** 10 }}|{{ 3 * 'ab' }}|"
     "{{ [1] * 3 }}|{{ 7 / 2 }}|{{ 1 - -1 }}|{{ dict(b=1, a=2) }}|{{ 'ab'[1::5] }}|"
     "{{ [1, 2, 3][::-2] }}|{{ 'h\u00e9llo'[1:3] }}\n"
     "{% set ns = namespace(x=0) %}{% set alias = ns %}{% set alias.x = 5 %}{{ ns.x }}|"
     "{% set outer = 1 %}{% set blk %}{% set outer = 2 %}{{ outer }}{% endset %}{{ blk }}{{ outer }}\n"
     "{% for m in messages %}{{ loop.index }}{% if loop.last %}.{% endif %}{% endfor %}\n"),
    # A template written for these tests: the rest of the subset (loop variables, slices,
    # tests, filters, methods, Python's str() of values, the operators).
    ("subset-exercise", "<s>", "</s>",
     "{%- set ns = namespace(n=0, roles=[]) -%}\n"
     "{% for m in messages if m.role != 'system' %}\n"
     "  {{ loop.index }}/{{ loop.length }}{{ '(first)' if loop.first }}"
     "{{ '(last)' if loop.last else '' }} {{ loop.revindex0 }}"
     " {{ m.role | upper }}:{{ m['content'][:12] | trim | replace(' ', '_') }}|"
     "{{ m.content | length }}|{{ m.content.split() | length }}"
     "{% if loop.previtem is defined %}<{{ loop.previtem.role[0] }}{% endif %}\n"
     "  {%- set ns.n = ns.n + m.content|length -%}\n"
     "  {%- set ns.roles = ns.roles + [m.role] -%}\n"
     "{% else %}no turns\n"
     "{% endfor %}\n"
     "{{ ns.n }} {{ ns.n // 7 }} {{ ns.n % 7 }} {{ ns.n / 4 }} {{ -ns.n }} {{ 2 ** 10 }}\n"
     "{{ ns.roles }} {{ ns.roles | join(',') }} {{ ns.roles | length }}\n"
     "{{ messages | map(attribute='role') | list }} {{ (messages | first).role }} "
     "{{ (messages | last)['role'] }}\n"
     "{{ messages[::-1] | map(attribute='role') | join(' < ') }} {{ messages[1:3] | length }}\n"
     "{{ {'a': 1, 'b': [true, none, 1.5, 'q\\'s']} }} {{ [1, 2] + [3] }} {{ 'ab' ~ 3 ~ none }}\n"
     "{{ {'k': 'v', 'n': [1, 2.0]} | tojson }} {{ 'x' in 'xyz' }} {{ 'w' not in ['x'] }}\n"
     "{% for k, v in {'one': 1, 'two': 2}.items() %}{{ k }}={{ v }}{{ ', ' if not loop.last }}"
     "{% endfor %}\n"
     "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}"
     "{% break %}{% endif %}{{ i }}{% endfor %}\n"
     "{{ '  pad  '.strip() }}|{{ 'a-b-c'.split('-', 1) }}|{{ 'Hello'.startswith('He') }}|"
     "{{ 'hello world'.title() }}|{{ 'X'.lower() }}|{{ undefined_name | default('dflt') }}|"
     "{{ '' | default('empty', true) }}|{{ 3 is divisibleby 3 }}|{{ none is none }}|"
     "{{ messages is iterable }}|{{ 'q' is string }}|{{ 1 is number }}\n"
     "{% set block %}inside {{ bos_token }}{% endset %}{{ block | upper }}\n"
     "{% if add_generation_prompt %}GEN{% endif %}"),
]

CONVERSATIONS = [
    ("six_turns", [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you"},
        {"role": "assistant", "content": "   I am an assistant   "},
        {"role": "user", "content": "Another question"},
    ]),
    ("one_user", [{"role": "user", "content": "Hi"}]),
    ("no_system", [
        {"role": "user", "content": "Caf\u00e9 \u2615 \u65e5\u672c \"quoted\" and 'single'\nline two"},
        {"role": "assistant", "content": "\ttabbed {{ not a tag }} {% neither %}"},
        {"role": "user", "content": "  spaced  "},
    ]),
    ("tool_turns", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]),
    ("bad_order", [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ]),
    # A reasoning model's earlier answer with its thinking inline (Qwen3 drops it before the
    # last user query) and one with reasoning_content.
    ("thinking_turns", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "Add three."},
    ]),
]

# Conversations whose final assistant message the model continues (continue_final_message, as
# transformers' render_jinja_template renders it: a marker after the content, cut there).
CONTINUED = [
    ("continue_answer", [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]),
    ("continue_trailing_space", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List three colours."},
        {"role": "assistant", "content": "1. Red\n2. "},
    ]),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "days": {"type": "integer"}}, "required": ["city"]}}},
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "chat",
                                                      "chat_templates.json"))
    args = parser.parse_args()
    cases = []
    for name, bos, eos, template in TEMPLATES:
        compiled = _compile_jinja_template(template)
        reads_tools = "tools" in template
        for conv_name, messages in CONVERSATIONS:
            for gen in (True, False):
                for tools, extra in [(None, {})] + ([(TOOLS, {})] if reads_tools else []) + (
                        [(None, {"enable_thinking": False})] if "enable_thinking" in template
                        else []):
                    variables = {"messages": messages, "add_generation_prompt": gen,
                                 "bos_token": bos, "eos_token": eos, **extra}
                    if tools is not None:
                        variables["tools"] = tools
                        if name == "Llama-3.1-tools":
                            variables["builtin_tools"] = ["code_interpreter", "brave_search"]
                            variables["date_string"] = "30 Nov 2026"
                    case = {"template": name, "conversation": conv_name, "variables": variables}
                    try:
                        case["rendered"] = compiled.render(**variables)
                    except Exception as e:  # raise_exception: the template's own message
                        case["error"] = str(e)
                    cases.append(case)
        for conv_name, messages in CONTINUED:
            variables = {"messages": messages, "add_generation_prompt": False,
                         "bos_token": bos, "eos_token": eos}
            case = {"template": name, "conversation": conv_name, "variables": variables,
                    "continue_final_message": True}
            try:
                rendered, _ = render_jinja_template(
                    conversations=[messages], chat_template=template, continue_final_message=True,
                    add_generation_prompt=False, bos_token=bos, eos_token=eos)
                case["rendered"] = rendered[0]
            except Exception as e:
                case["error"] = str(e)
            cases.append(case)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"source": "scripts/make_chat_goldens.py (transformers "
                             "_compile_jinja_template, as apply_chat_template renders)",
                   "templates": {name: t for name, _, _, t in TEMPLATES},
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases from {len(TEMPLATES)} templates -> {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
