"""Writes a tiny local model directory for Dynamo's mocker and frontend, with no hub download.

Run with the Dynamo virtualenv's Python (it has `tokenizers`): `python e2e/fleet/model.py <dir>`. The
tokenizer is a byte-level BPE trained here on pseudo-words generated from a fixed seed, with >= 2,000
vocabulary entries (the mocker emits token ids 1000-1999, which must decode), plus a chat template.
Standard library and `tokenizers` only: this file is not imported by the tokenfab virtualenv.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 4096
MAX_CONTEXT = 8192
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(seed: int = 7, words: int = 6000, lines: int = 4000) -> list[str]:
    rnd = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou")
    lexicon = ["".join(rnd.choice(syllables) for _ in range(rnd.randint(1, 4))) for _ in range(words)]
    return [" ".join(rnd.choice(lexicon) for _ in range(rnd.randint(8, 30))) for _ in range(lines)]


def write(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() < 2000:
        raise SystemExit(f"tokenizer too small: {tok.get_vocab_size()} entries")
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": vocab,
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "max_position_embeddings": MAX_CONTEXT,
                "bos_token_id": 0,
                "eos_token_id": 1,
                "pad_token_id": 2,
                "torch_dtype": "bfloat16",
            },
            indent=1,
        )
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": MAX_CONTEXT,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    )
    (out / ".complete").write_text(str(vocab))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
