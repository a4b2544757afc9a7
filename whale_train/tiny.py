"""The tiny Qwen3-architecture model the project builds for the CPU default.

``train_tokenizer`` trains a byte-level BPE tokenizer (digits split one by one) with a ChatML chat
template, ``build_model`` a ``Qwen3ForCausalLM`` of a named size. Both save and load with the
standard ``save_pretrained`` / ``AutoTokenizer`` / ``AutoModelForCausalLM`` path, so every command
treats the tiny model exactly like a real Qwen checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

#: ChatML, as in Qwen: "<|im_start|>role\ncontent<|im_end|>\n", then the assistant header.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Model sizes: hidden size, layers, attention heads, key/value heads, MLP width.
SIZES = {
    "tiny": {
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 384,
    },
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 768,
    },
}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on ``texts``; digits are always single tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=2048,
    )


def build_model(tokenizer, size: str = "tiny", seed: int = 0, max_positions: int = 2048):
    """A freshly initialized ``Qwen3ForCausalLM`` of ``size`` for ``tokenizer``."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    dims = SIZES[size]
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        head_dim=dims["hidden_size"] // dims["num_attention_heads"],
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
        **dims,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    end = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model.generation_config = GenerationConfig(eos_token_id=end, pad_token_id=tokenizer.pad_token_id)
    return model


def save(model, tokenizer, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


#: A tiny random Qwen3.5 (the architecture of Qwen/Qwen3.5-2B/4B at toy size): three Gated DeltaNet
#: linear-attention layers and one full-attention layer, as in the real model's 3:1 pattern.
QWEN3_5_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}


def save_qwen3_5_processor(out: str | Path, model) -> Path:
    """Write the image processor config a hub Qwen3.5 checkpoint ships beside its weights
    (``preprocessor_config.json``, matching the model's vision tower): vLLM and ``AutoProcessor`` read it
    when they load a ``Qwen3_5ForConditionalGeneration``. Written by transformers' own class (its PIL
    variant: the default one needs torchvision), under the names the hub files use."""
    import json

    from transformers import Qwen2VLImageProcessorPil

    vision = model.config.vision_config
    processor = Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size,
    )
    processor.save_pretrained(out)
    path = Path(out) / "preprocessor_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(image_processor_type="Qwen2VLImageProcessor", processor_class="Qwen3VLProcessor")
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def build_qwen3_5(tokenizer, seed: int = 0, *, hub_layout: bool = False, max_positions: int = 2048):
    """A freshly initialized tiny Qwen3.5 for ``tokenizer``: real transformers classes at toy size, for
    CPU tests of the architecture the GPU configs train.

    ``hub_layout=False``: a ``Qwen3_5ForCausalLM`` (text only, weights ``model.layers.*``).
    ``hub_layout=True``: a ``Qwen3_5ForConditionalGeneration`` with a one-block vision tower, saved as the
    hub checkpoints are (``architectures: [Qwen3_5ForConditionalGeneration]``, weights
    ``model.language_model.*``, ``model.visual.*``); ``AutoModelForCausalLM`` loads its text part.
    """
    from transformers import GenerationConfig, Qwen3_5TextConfig

    text = dict(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **QWEN3_5_TINY,
    )
    torch.manual_seed(seed)
    if hub_layout:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        vision = dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=text["hidden_size"],
            num_position_embeddings=16,
            patch_size=4,
        )
        config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
        model = Qwen3_5ForConditionalGeneration(config)
    else:
        from transformers import Qwen3_5ForCausalLM

        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text))
    end = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model.generation_config = GenerationConfig(eos_token_id=end, pad_token_id=tokenizer.pad_token_id)
    return model
