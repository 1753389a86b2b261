#!/usr/bin/env python3
"""The peer for bench/gpu/bench_llama8b.c: PyTorch + transformers `generate` on the same
synthetic Llama-3-8B-shaped BF16 model (random weights, same shapes, same prompt and output
lengths, greedy, EOS never stops a sequence), on the same GPU in the same run.

    python3 bench/gpu/hf_generate.py [--layers 32] [--prompt 128] [--gen 128] [--batch 256]
                                     [--out hf.json]

Needs torch with CUDA and transformers (the H200 image has them; elsewhere:
`pip install torch transformers`). Prints one JSON object: batch-1 ms per token (decode
steps only, from the difference between two generate lengths) and batch-N generated tokens
per second over the whole generate call (prefill included), as medley's bench reports them.
min_new_tokens = max_new_tokens, so every sequence generates exactly --gen tokens.
"""
import argparse
import sys
import time

from torch_gpu import DEVICE, device_name, emit, sync, torch_or_skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out")
    a = ap.parse_args()
    got = torch_or_skip("transformers")
    if not got:
        return 77
    torch, (transformers,) = got
    LlamaConfig, LlamaForCausalLM = transformers.LlamaConfig, transformers.LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    torch.manual_seed(0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(DEVICE):
        model = LlamaForCausalLM(cfg)
    model.eval()
    torch.set_default_dtype(torch.float32)
    attn = getattr(model.config, "_attn_implementation", "?")
    print(f"hf: built in {time.time() - t0:.1f} s, attention {attn}, transformers "
          f"{transformers.__version__}, torch {torch.__version__}", file=sys.stderr)

    def run(batch, prompt, gen):
        g = torch.Generator(device="cpu").manual_seed(batch)
        ids = torch.randint(3, cfg.vocab_size, (batch, prompt), generator=g).to(DEVICE)
        mask = torch.ones_like(ids)
        sync(torch)
        t = time.time()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen,
                                 min_new_tokens=gen, do_sample=False, pad_token_id=0)
        sync(torch)
        assert out.shape == (batch, prompt + gen), out.shape
        return time.time() - t

    run(1, 16, 4)  # warm-up: kernels, allocator
    t_long = run(1, a.prompt, a.gen)
    t_short = run(1, a.prompt, a.gen // 4)
    ms_tok = (t_long - t_short) * 1e3 / (a.gen - a.gen // 4)
    print(f"hf batch 1: {ms_tok:.3f} ms/token", file=sys.stderr)
    t_b = run(a.batch, a.prompt, a.gen)
    tps = a.batch * a.gen / t_b
    print(f"hf batch {a.batch}: {t_b:.2f} s for {a.batch} x {a.gen} tokens: {tps:.0f} tokens/s",
          file=sys.stderr)
    res = {"bench": "hf_generate", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": device_name(torch), "torch": torch.__version__,
           "transformers": transformers.__version__, "attention": attn, "layers": a.layers,
           "prompt": a.prompt, "gen": a.gen,
           "batch1": {"ms_per_token": ms_tok},
           "batchN": {"batch": a.batch, "seconds": t_b, "tokens_per_s": tps}}
    return emit(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
