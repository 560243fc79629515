"""Write a Hugging Face model folder with random weights of a preset's shape, to serve it.

`pagedrt serve` (and vLLM) load a folder, not a preset: this builds the HF transformers model of
the preset's shape (its own random initialisation, seeded), saves it as safetensors with its
config.json, and copies a tokenizer folder beside it (SmolLM2's, from pagedrt's GGUF cache: the
random model's vocabulary may be larger than the tokenizer's; prompts are token ids anyway).
The offline benchmark then runs on the same weights with `--model FOLDER`.

    python benchmarks/make_random_folder.py --preset qwen2-0.5b --tokenizer TOK_DIR --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil

import torch

from pagedrt.bench.common import hf_config_fields
from pagedrt.bench.presets import get_preset

_MODEL_TYPES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                "Gemma3ForCausalLM": "gemma3_text"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json etc.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="override the preset's vocabulary (e.g. the tokenizer's, 49152 for "
                         "SmolLM2's, so that every generated token has text)")
    args = ap.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    mc = get_preset(args.preset)
    if args.vocab_size is not None:
        mc = dataclasses.replace(mc, vocab_size=args.vocab_size,
                                 bos_token_id=min(mc.bos_token_id or 0, args.vocab_size - 1),
                                 eos_token_ids=(args.vocab_size - 1,))
    cfg = AutoConfig.for_model(_MODEL_TYPES[mc.architecture], **hf_config_fields(mc))
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, args.dtype))
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    for name in os.listdir(args.tokenizer):
        shutil.copy(os.path.join(args.tokenizer, name), args.out)
    print(f"wrote {args.preset} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          f"parameters, {args.dtype}) to {args.out}")


if __name__ == "__main__":
    main()
