#!/usr/bin/env python3
"""Writes a random Llama-style Hugging Face folder sized for tensor-parallel decode timing on CPU.

  python3 scripts/make_tp_bench_model.py OUT_DIR [--hidden 768 --layers 8 --heads 12 --kv-heads 4
                                                  --ffn 2048 --dtype F16]

Same tokenizer, safetensors writer and random stream as scripts/make_test_models.py (imported),
but bigger: 8+ query heads and an MLP that divide by 2 and 4, so TP 2 and TP 4 shard evenly
(SmolLM2-135M has 9 heads, which TP 2 cannot split). The weights are noise: only for timing.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_test_models as mtm  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--dtype", default="F16", choices=["F32", "F16", "BF16"])
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    if a.hidden % a.heads:
        sys.exit("hidden must be a multiple of heads")
    hd = a.hidden // a.heads
    rng = mtm.Rng(a.seed)
    d, f, v = a.hidden, a.ffn, mtm.VOCAB_SIZE
    t = [("model.embed_tokens.weight", rng.uniform((v, d), 1.0))]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        t += [
            (p + "input_layernorm.weight", rng.uniform((d,), 0.1, 1.0)),
            (p + "self_attn.q_proj.weight", rng.uniform((a.heads * hd, d), mtm.inv_sqrt(d))),
            (p + "self_attn.k_proj.weight", rng.uniform((a.kv_heads * hd, d), mtm.inv_sqrt(d))),
            (p + "self_attn.v_proj.weight", rng.uniform((a.kv_heads * hd, d), mtm.inv_sqrt(d))),
            (p + "self_attn.o_proj.weight",
             rng.uniform((d, a.heads * hd), mtm.inv_sqrt(a.heads * hd))),
            (p + "post_attention_layernorm.weight", rng.uniform((d,), 0.1, 1.0)),
            (p + "mlp.gate_proj.weight", rng.uniform((f, d), mtm.inv_sqrt(d))),
            (p + "mlp.up_proj.weight", rng.uniform((f, d), mtm.inv_sqrt(d))),
            (p + "mlp.down_proj.weight", rng.uniform((d, f), mtm.inv_sqrt(f))),
        ]
    t.append(("model.norm.weight", rng.uniform((d,), 0.1, 1.0)))
    t.append(("lm_head.weight", rng.uniform((v, d), mtm.inv_sqrt(d))))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": d, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "head_dim": hd, "intermediate_size": f,
        "hidden_act": "silu", "vocab_size": v, "max_position_embeddings": a.ctx,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "bos_token_id": mtm.EOT_ID, "eos_token_id": mtm.EOT_ID, "torch_dtype": a.dtype.lower(),
    }
    os.makedirs(a.out_dir, exist_ok=True)
    files = {
        "config.json": mtm.json_bytes(config),
        "tokenizer.json": mtm.tokenizer_json(),
        "tokenizer_config.json": mtm.tokenizer_config_json(),
        "model.safetensors": mtm.safetensors_bytes(t, a.dtype),
    }
    for name, data in files.items():
        if isinstance(data, str):
            data = data.encode("utf-8")
        with open(os.path.join(a.out_dir, name), "wb") as fh:
            fh.write(data)
    n = sum(int(x.size) for _, x in t)
    print(f"{a.out_dir}: {n / 1e6:.1f}M parameters, {a.layers} layers, {a.heads}/{a.kv_heads} "
          f"heads, ffn {f}, {a.dtype}")


if __name__ == "__main__":
    main()
