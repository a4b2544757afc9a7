"""A random BERT encoder saved to a folder, for the dense-retrieval tests and benchmarks: a word-level
vocabulary of the given words (no download), seeded weights. Small enough to build in a second."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

#: The tokens every vocabulary starts with: BERT's specials and the punctuation of the prefixes.
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":", '"')


def words_of(texts: Iterable[str]) -> set[str]:
    """The lower-cased words of ``texts``, quotes and sentence punctuation stripped."""
    return {w.strip('.,"').lower() for text in texts for w in text.split()} - {""}


def save_random_bert(
    folder: Path,
    words: Iterable[str],
    *,
    extra: Iterable[str] = (),
    hidden_size: int = 32,
    layers: int = 1,
    seed: int = 0,
) -> Path:
    """A BERT of ``layers`` layers and ``hidden_size`` (the intermediate size twice that) with random
    weights from ``seed``, and a tokenizer whose vocabulary is :data:`SPECIALS`, ``extra`` and the sorted
    ``words``, saved to ``folder``; returns ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    tokens = dict.fromkeys([*SPECIALS, *extra, *sorted(words)])
    vocab = {w: i for i, w in enumerate(tokens)}
    BertTokenizer(vocab=vocab).save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(folder)
    return folder
