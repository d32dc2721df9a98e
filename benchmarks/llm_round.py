"""One round of the `llm` policy's transformers engine on the GPU, with a model built from a
config (random weights, nothing downloaded): how long N samples take, and the second round's
N conversations with one answer each.

    python benchmarks/llm_round.py                           # N=4, 512 new tokens, ~150M-parameter Llama
    python benchmarks/llm_round.py --samples 8 --max-new-tokens 1024 --layers 12 --hidden 1536

The tokenizer is a byte-level BPE trained here on the prompt text itself, so the opening has the
length in tokens a real tokenizer gives it, give or take. A random model seldom ends its answer,
so every sample runs to --max-new-tokens: the time is that of the longest answers. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_backend.policies import prompts  # noqa: E402
from agent_backend.policies.chat_transformers import TransformersChat  # noqa: E402
from agent_backend.specs import Task, TensorSpec  # noqa: E402

SPECIAL = ["<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
PROGRAM = """\
import torch
import torch.nn as nn
aten = torch.ops.aten


class Model(nn.Module):
    def forward(self, in0, in1):
        return aten.relu.default(aten.add.Tensor(in0, in1))


def get_inputs():
    return [torch.randn((4096, 4096), dtype=torch.bfloat16, device='cuda'),
            torch.randn((4096, 4096), dtype=torch.bfloat16, device='cuda')]


def get_init_inputs():
    return []
"""


def task() -> Task:
    spec = TensorSpec((4096, 4096), (4096, 1), "bfloat16", "cuda")
    return Task("bench", PROGRAM, (spec, spec), (spec,), ("aten.add.Tensor", "aten.relu.default"), "pointwise")


def build_model(directory: Path, args) -> tuple[int, int]:
    """Save a tokenizer and a random Llama to `directory`; (parameters, vocabulary size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([prompts.all_text(), PROGRAM], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|eos|>", pad_token="<|eos|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    eos = tokenizer.convert_tokens_to_ids("<|eos|>")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 64, max_position_embeddings=32768,
                         bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters()), len(tokenizer)


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4, help="N, the samples of a round (llm_samples)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/llm_round.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as directory:
        parameters, vocab = build_model(Path(directory), args)
        chat = TransformersChat(directory, max_new_tokens=args.max_new_tokens)
        opening = prompts.opening(task())
        tokenizer = AutoTokenizer.from_pretrained(directory)
        prompt_text = tokenizer.apply_chat_template(opening, tokenize=False, add_generation_prompt=True)
        prompt_tokens = len(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
        # The first call loads the model: timed apart, with a one-token answer.
        _, load_s = timed(lambda: TransformersChat(directory, max_new_tokens=1).complete([opening], 1))
        first, first_s = timed(lambda: chat.complete([opening], args.samples))
        second_round = [opening + [{"role": "assistant", "content": answer},
                                   {"role": "user", "content": prompts.no_code()}] for answer in first[0]]
        second, second_s = timed(lambda: chat.complete(second_round, 1))
        new_tokens = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in first[0]]
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "model": {"parameters": parameters, "layers": args.layers, "hidden": args.hidden, "vocab": vocab,
                  "dtype": "bfloat16"},
        "samples": args.samples, "max_new_tokens": args.max_new_tokens, "prompt_tokens": prompt_tokens,
        "load_and_first_token_s": round(load_s, 3),
        "round_1": {"conversations": 1, "answers": args.samples, "s": round(first_s, 3),
                    "answer_tokens_reencoded": new_tokens,
                    "tokens_per_s": round(sum(new_tokens) / first_s, 1)},
        "round_2": {"conversations": len(second), "answers_each": 1, "s": round(second_s, 3)},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
