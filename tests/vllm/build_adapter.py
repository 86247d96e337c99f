"""Build the real-engine tier's LoRA adapter offline: a random rank-8 adapter on the tiny
Llama's ``q_proj`` and ``v_proj``, written with ``peft`` (no hub download).

Run with the vLLM venv's interpreter after build_model.py:
``.venv-vllm/bin/python tests/vllm/build_adapter.py MODEL_DIR ADAPTER_DIR``. Reuses
ADAPTER_DIR if it is complete.
"""

from __future__ import annotations

import sys
from pathlib import Path

RANK = 8
SEED = 20


def main(model: Path, out: Path) -> None:
    if (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists():
        print(f"tiny adapter: reusing {out}", flush=True)
        return
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    base = LlamaForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16)
    config = LoraConfig(
        r=RANK, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(base, config).save_pretrained(str(out), safe_serialization=True)
    print(f"tiny adapter: built in {out}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
