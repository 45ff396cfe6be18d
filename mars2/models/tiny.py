"""Tiny causal LMs and a byte-level BPE tokenizer, built offline from configs.

Nothing here touches a model hub: the tokenizer is trained on text the caller provides (the toy
benchmark's statements and reference programs), the models are random-initialised from configs.
"""

from __future__ import annotations

from collections.abc import Iterable

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
# Qwen2's pre-tokenizer split (contractions, letter runs, one token per digit, punctuation runs, newlines, spaces):
# transformers builds Qwen2Tokenizer for every model_type=qwen2 folder, whatever tokenizer class the folder declares,
# and that class applies this split, so a BPE trained with any other split would give other ids once saved.
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512):
    """Byte-level BPE trained on ``texts``, wrapped as a ``PreTrainedTokenizerFast`` with a chat template.

    ``<|end|>`` closes every chat turn and is the EOS token, so generation stops after one answer. Normaliser (NFC)
    and pre-tokenizer (:data:`PRETOKENIZE_REGEX`, then byte-level) are Qwen2Tokenizer's, so a saved folder gives the
    same ids whichever class ``AutoTokenizer`` builds for it (the folder's own, ``Qwen2Tokenizer``, Llama's).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    arch: str,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    pad_token_id: int,
    eos_token_id: int,
    seed: int,
):
    """A random-initialised Qwen2- or Llama-style causal LM (architectures differ on purpose: heterogeneous agents)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common))
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    raise ValueError(f"unknown tiny architecture {arch!r}; allowed: qwen2, llama")
