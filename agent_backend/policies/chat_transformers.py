"""The `transformers` engine: a Hugging Face causal LM from a local directory, in this process.

The model and tokenizer are loaded once per process (per directory) and kept, on the current GPU
where there is one. A round is one `generate` call: every conversation goes through the
tokenizer's chat template, the batch is padded on the left, and each is sampled n times
(`num_return_sequences=n`). Sampling draws from a generator state of its own, so it neither
depends on nor moves the random state of the program being compiled.
"""
from __future__ import annotations

import copy
import functools
import os

import torch

from . import PolicyError
from .chat import TEMPERATURE


@functools.cache
def _load(path: str, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.chat_template is None:
        raise ValueError("its tokenizer has no chat_template")
    tokenizer.padding_side = "left"  # generation continues the prompts, so they must end together
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The dtype the weights were saved in (transformers 4.x would load float32 otherwise);
    # `torch_dtype` is the name both 4.x and 5.x take.
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype="auto").to(device).eval()
    return tokenizer, model


def _device() -> str:
    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


class TransformersChat:
    def __init__(self, path: str, max_new_tokens: int = 8192):
        self.model, self.max_new_tokens = path, max_new_tokens

    def _sampling(self, model, tokenizer, n: int):
        """The model's own generation settings (its top_p, say), sampling n answers each, with
        generate's automatic torch.compile off (`disable_compile`, for models with a static
        cache): it would compile the model inside the user's compile, under Inductor's config of
        the moment, our pass included. `update` leaves out a setting a version does not know."""
        config = copy.deepcopy(model.generation_config)
        config.update(do_sample=True, temperature=TEMPERATURE, max_new_tokens=self.max_new_tokens,
                      num_return_sequences=n, pad_token_id=tokenizer.pad_token_id, disable_compile=True)
        return config

    def complete(self, conversations: list[list[dict]], n: int) -> list[list[str]]:
        device = _device()
        try:
            tokenizer, model = _load(self.model, device)
        except Exception as e:  # a missing or broken directory, an unknown architecture, no memory
            raise PolicyError(f"cuda_agent: transformers could not load the model in {self.model}: "
                              f"{type(e).__name__}: {e}") from None
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        try:
            prompts = [tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                       for messages in conversations]
            batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.random.fork_rng(devices=[device] if device != "cpu" else []):
                torch.random.default_generator.manual_seed(seed)
                if device != "cpu":
                    torch.cuda.manual_seed(seed)  # the current device's only: fork_rng restores that one
                output = model.generate(**batch, generation_config=self._sampling(model, tokenizer, n))
        except Exception as e:  # a template error, a prompt longer than the model takes, out of memory
            raise PolicyError(f"cuda_agent: the model in {self.model} failed to answer: {type(e).__name__}: {e}") from None
        # Rows are the conversations in order, each repeated n times; the prompt is cut off.
        answers = tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:], skip_special_tokens=True,
                                         clean_up_tokenization_spaces=False)  # code, not prose: no respacing
        return [answers[i * n:(i + 1) * n] for i in range(len(conversations))]
