"""Tiny Hugging Face chat models built in the test, with nothing downloaded: a Llama of a few
thousand random weights and a word-level tokenizer with a chat template, saved to a directory
the `transformers` engine loads like any model."""
from __future__ import annotations

from pathlib import Path

import torch

SPECIAL = ["[UNK]", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def make_tokenizer(words: list[str], split_on_whitespace: bool = True):
    """A word-level tokenizer over SPECIAL + `words`. Without `split_on_whitespace`, the text
    between special tokens is one word (so a whole answer can be one token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    if split_on_whitespace:
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(SPECIAL)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="<|eos|>",
                                   pad_token="<|eos|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    eos = tokenizer.convert_tokens_to_ids("<|eos|>")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def teach(model, tokenizer, messages: list[dict], answer_token: str, steps: int = 60) -> None:
    """Train `model` to answer `messages` with `answer_token`, then end: a few optimizer steps
    on one short sequence."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ids + tokenizer.convert_tokens_to_ids([answer_token, "<|eos|>"])])
    labels = torch.full_like(ids, -100)
    labels[0, -2:] = ids[0, -2:]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
    model.eval()


def save(model, tokenizer, directory: Path) -> str:
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)
