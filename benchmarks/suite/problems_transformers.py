"""GPT-2, Llama and BERT from transformers configs with random weights (nothing is downloaded),
bf16, in inference and one training step; and GPT-2 and Llama with their language-model head in
a training step on labels, the loss as transformers computes it. transformers is imported only
when a model is built, so the suite runs without it and reports these problems as skipped."""
from __future__ import annotations

import torch
import torch.nn as nn

from .problem import Problem


def _config(family: str, d):
    import transformers
    if family == "gpt2":
        return transformers.GPT2Config(n_layer=d.layers, n_embd=d.hidden, n_head=d.heads, n_positions=d.seq,
                                       vocab_size=d.vocab, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    if family == "llama":
        return transformers.LlamaConfig(num_hidden_layers=d.layers, hidden_size=d.hidden, num_attention_heads=d.heads,
                                        num_key_value_heads=max(1, d.heads // 3), intermediate_size=d.hidden * 8 // 3,
                                        max_position_embeddings=d.seq, vocab_size=d.vocab, use_cache=False)
    if family == "bert":
        return transformers.BertConfig(num_hidden_layers=d.layers, hidden_size=d.hidden, num_attention_heads=d.heads,
                                       intermediate_size=4 * d.hidden, max_position_embeddings=d.seq,
                                       vocab_size=d.vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    raise ValueError(f"unknown model family {family!r}")


class TransformersModel(nn.Module):
    """A transformers base model (no LM head) returning its last hidden state."""

    def __init__(self, family: str, config):
        super().__init__()
        import transformers
        if family == "bert":  # no pooler: its output is not returned, so it would get no gradient
            self.model = transformers.BertModel(config, add_pooling_layer=False)
        else:
            self.model = {"gpt2": transformers.GPT2Model, "llama": transformers.LlamaModel}[family](config)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


class TransformersLMLoss(nn.Module):
    """A transformers causal language model with its head, returning the loss transformers
    computes from labels (logits in fp32, labels shifted by one, cross-entropy ignoring -100)."""

    def __init__(self, family: str, config):
        super().__init__()
        import transformers
        self.model = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM}[family](config)

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels).loss


def _tokens_and_labels(d) -> list[torch.Tensor]:
    """Token ids, and as labels the same ids with the last eighth of each sequence -100 (padding)."""
    ids = torch.randint(0, d.vocab, (d.batch, d.seq))
    labels = ids.clone()
    labels[:, d.seq - d.seq // 8:] = -100
    return [ids, labels]


def _problem(name: str, family: str, model: type, get_inputs, train: bool) -> Problem:
    return Problem(name, 3, model, get_inputs,
                   {"batch": 8, "seq": 512, "hidden": 768, "layers": 4, "heads": 12, "vocab": VOCABS[family]},
                   {"batch": 2, "seq": 8, "hidden": 24, "layers": 1, "heads": 2, "vocab": 64},
                   get_init_inputs=lambda d: [family, _config(family, d)], dtypes=("bf16",), group="transformers",
                   train=train, needs=("transformers",), tolerance=5.0)


def _token_ids(d) -> list[torch.Tensor]:
    return [torch.randint(0, d.vocab, (d.batch, d.seq))]


VOCABS = {"gpt2": 50257, "llama": 32000, "bert": 30522}
PROBLEMS = ([_problem(f"{family}_train" if train else family, family, TransformersModel, _token_ids, train)
             for family in VOCABS for train in (False, True)]
            + [_problem(f"{family}_lm_train", family, TransformersLMLoss, _tokens_and_labels, True)
               for family in ("gpt2", "llama")])
