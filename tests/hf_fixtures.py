"""Tiny Hugging Face checkpoints made offline: a byte-level BPE tokenizer trained on a few GSM8K
questions, with a ChatML chat template, and a random transformers model saved beside it."""

import json
import os

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def gsm8k_lines(limit=300):
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gsm8k",
                      "train.jsonl")  # the committed excerpt: its first 300 lines
  with open(path) as f:
    records = [json.loads(next(f)) for _ in range(limit)]
  return [r["question"] + "\n" + r["answer"] for r in records]


def save_tiny_tokenizer(directory, vocab_size=400):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(gsm8k_lines() + ['Let\'s think step by step "####".'], trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>")
  fast.chat_template = CHATML
  fast.save_pretrained(directory)
  return fast


def save_tiny_qwen2(directory, tie=True, seed=0):
  """A random 2-layer Qwen2 (GQA, q/k/v biases) with the tiny tokenizer, in `directory`."""
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM
  tokenizer = save_tiny_tokenizer(directory)
  torch.manual_seed(seed)
  config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, tie_word_embeddings=tie,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=None)
  model = Qwen2ForCausalLM(config).float()
  model.save_pretrained(directory)
  return directory
