"""train stage: real Lightning fits of tiny random BERTs on toy prompts whose wording tells the
answer length; the written checkpoint must load in the serving Scorer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_tables, params_section, write_dataset, write_params

from pipeline.pairs import main as pairs_main
from pipeline.ranking.losses import METHODS


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    write_dataset(root / "data", n_train=40, n_val=16, truncated={"train000"})
    params = write_params(root / "params.yaml", partners=4)
    assert (
        pairs_main(
            [
                "--model",
                "toy",
                "--params",
                str(params),
                "--data",
                str(root / "data"),
                "--metrics",
                str(root / "metrics" / "pairs"),
            ]
        )
        == 0
    )
    return root


def params_for(encoder_dir, **over):
    """The tiny encoder's train settings (some keys of the train section)."""
    p = {
        "encoder": str(encoder_dir),
        "max_length": 16,
        "epochs": 4,
        "batch_size": 8,
        "eval_batch_size": 32,
        "lr": 2e-3,
        "warmup_fraction": 0.1,
        "seed": 42,
        "dropout": 0.0,
        "lightning": {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "precision": "32-true", "strategy": "auto"},
    }
    p.update(over)
    return p


def train_params(encoder_dir, **over):
    """params.yaml's train section with the tiny settings, on the plain path: full fine-tuning of
    right-cut prompts, plain shuffle, no early stopping (whatever profile params.yaml is in)."""
    plain = {
        "frozen_layers": 0,
        "head_fraction": 1.0,
        "length_buckets": 0,
        "micro_batches": 1,
        "patience": None,
        "cross_models": {},
        "max_train_prompts": None,
        "pairwise_mode": "in_batch",
        "lexical_prior": None,
    }
    return params_section("train", **{**plain, **params_for(encoder_dir, **over)})


def run(root, encoder_dir, method, tag, **over):
    from pipeline.train import train_one

    return train_one(
        "toy",
        method,
        train_params(encoder_dir, **over),
        data_root=root / "data",
        models_root=root / tag / "models",
        metrics_dir=root / tag / "metrics",
        plots_dir=root / tag / "plots",
    )


@pytest.mark.parametrize("method", METHODS)
def test_each_method_learns_and_exports(toy_root, tiny_encoder_dir, monkeypatch, method):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from pipeline.ranking.checkpoint import read_meta
    from pipeline.serving.scorer import Scorer

    res = run(toy_root, tiny_encoder_dir, method, method)
    # The toy task is learnable ('essay' prompts are long): a broken loss or sign would not reach this.
    assert res["val_tau_b"] > 0.4, res
    assert res["best_epoch"] is not None and res["epochs_run"] == 4
    ckpt = toy_root / method / "models" / "toy" / method
    meta = read_meta(ckpt)
    assert meta["method"] == method and meta["max_length"] == 16
    assert meta["trained_on"]["model"] == "toy" and meta["trained_on"]["datasets"] == ["toy", "toy2"]
    assert meta["trained_on"]["val_tau_b"] == pytest.approx(res["val_tau_b"])
    scores = Scorer.from_pretrained(ckpt).score(
        ["please write an essay about topic 3", "please write an brief about topic 3"]
    )
    assert scores[0] > scores[1]  # higher = longer
    saved = json.loads((toy_root / method / "metrics" / f"toy-{method}.json").read_text())
    assert saved["val_tau_b"] == pytest.approx(res["val_tau_b"]) and saved["prompts_per_s"] > 0
    curve = (toy_root / method / "plots" / f"toy-{method}.csv").read_text().splitlines()
    assert curve[0].startswith("epoch,train_loss,val_tau_b") and len(curve) == 5


def test_an_undefined_val_tau_does_not_stop_training(toy_root, tiny_encoder_dir, monkeypatch):
    """Early stopping counts an epoch whose val tau_b is undefined (NaN) as no improvement: the run
    goes on, and the best defined epoch is kept."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import pipeline.ranking.lightning as lightning_module

    real = lightning_module.kendall_tau_b
    calls = []

    def nan_first(x, y):
        calls.append(1)
        return float("nan") if len(calls) == 1 else real(x, y)

    monkeypatch.setattr(lightning_module, "kendall_tau_b", nan_first)
    res = run(toy_root, tiny_encoder_dir, "pairwise", "nan", epochs=3, patience=2)
    assert res["epochs_run"] == 3 and res["best_epoch"] >= 1 and np.isfinite(res["val_tau_b"])


def test_best_epoch_is_exported_and_scores_match(toy_root, tiny_encoder_dir, monkeypatch):
    """The exported weights are the best epoch's: re-scoring val prompts gives the recorded tau_b."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import pandas as pd

    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer

    res = run(toy_root, tiny_encoder_dir, "pairwise", "best", lr=5e-3)
    labels = pd.read_parquet(toy_root / "data" / "pairs" / "toy" / "labels.parquet")
    prompts = pd.read_parquet(toy_root / "data" / "prompts" / "prompts.parquet").set_index("prompt_id")
    val = labels[labels["split"] == "val"].sort_values("prompt_id")
    scores = Scorer.from_pretrained(toy_root / "best" / "models" / "toy" / "pairwise").score(
        prompts.loc[val["prompt_id"], "prompt"].tolist()
    )
    assert kendall_tau_b(scores, val["length"]) == pytest.approx(res["val_tau_b"], abs=1e-6)
    history = pd.read_csv(toy_root / "best" / "plots" / "toy-pairwise.csv")
    assert res["val_tau_b"] == pytest.approx(history["val_tau_b"].max())


def test_a_causal_lm_trains_from_its_cache_and_serves_what_it_learned(toy_root, tokenizer, tmp_path, monkeypatch):
    """A Llama-style decoder (a tiny SmolLM2) as the encoder: its prompts framed by its chat template,
    the last position read, lower layers cached; the served checkpoint re-scores val as training did.
    [CLS] pooling, which would read no prompt, is refused before anything loads."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import copy

    import pandas as pd
    from conftest import tiny_llama_config
    from transformers import LlamaForCausalLM

    from pipeline.errors import PARSError
    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer

    torch.manual_seed(0)
    decoder = tmp_path / "tiny-llama"
    config = tiny_llama_config(tokenizer.vocab_size, tokenizer.pad_token_id, num_hidden_layers=2)
    LlamaForCausalLM(config).save_pretrained(decoder)  # as SmolLM2's directory holds it
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for m in messages %}user : {{ m['content'] }} ;{% endfor %}assistant :"
    chat.save_pretrained(decoder)

    from pipeline.train import check_params

    with pytest.raises(PARSError, match="pooling cls: .* is a causal LM"):
        check_params(train_params(decoder, pooling="cls", frozen_layers=1), ["pairwise"])
    check_params(train_params(decoder, pooling="last", frozen_layers=1), ["pairwise"])
    # the template's frame ("user :" and "; assistant :") counts in max_length, which names the key
    with pytest.raises(
        PARSError, match="^train.max_length 5 leaves no room for prompt tokens: 5 go to the tokenizer's chat template$"
    ):
        run(toy_root, decoder, "pairwise", "llama-short", pooling="last", max_length=5)
    # a template that glues the prompt to its own text ("qa" is one token): refused, naming the encoder
    glued = tmp_path / "tiny-llama-glued"
    LlamaForCausalLM(config).save_pretrained(glued)
    chat.chat_template = "{% for m in messages %}q{{ m['content'] }}{% endfor %}"
    chat.save_pretrained(glued)
    with pytest.raises(PARSError, match=f"^train.encoder {glued}: the tokenizer's chat template splits"):
        run(toy_root, glued, "pairwise", "llama-glued", pooling="last")
    res = run(toy_root, decoder, "pairwise", "llama", pooling="last", frozen_layers=1, lr=5e-3)
    labels = pd.read_parquet(toy_root / "data" / "pairs" / "toy" / "labels.parquet")
    prompts = pd.read_parquet(toy_root / "data" / "prompts" / "prompts.parquet").set_index("prompt_id")
    val = labels[labels["split"] == "val"].sort_values("prompt_id")
    scorer = Scorer.from_pretrained(toy_root / "llama" / "models" / "toy" / "pairwise")
    assert scorer.meta["pooling"] == "last"
    ids = scorer.encode(prompts.loc[val["prompt_id"], "prompt"].tolist()[:1])[0]
    assert ids[-3:] == chat("; assistant :", add_special_tokens=False)["input_ids"][-3:]
    scores = scorer.score(prompts.loc[val["prompt_id"], "prompt"].tolist())
    assert kendall_tau_b(scores, val["length"]) == pytest.approx(res["val_tau_b"], abs=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_lexical_prior_is_trained_under_and_served_with_the_encoder(toy_root, tiny_encoder_dir, monkeypatch, method):
    """train.lexical_prior: the checkpoint carries the TF-IDF ridge fitted on the train prompts; the
    Scorer adds it to the encoder's score, which reproduces the recorded val tau_b (validation saw
    the same sum), and the encoder alone scores differently."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import pandas as pd

    from pipeline.ranking.checkpoint import LEXICAL, read_meta
    from pipeline.ranking.lexical import TfidfRidge
    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer

    prior = {"ngram_max": 1, "min_df": 1, "alpha": 1.0, "folds": 4}
    res = run(toy_root, tiny_encoder_dir, method, f"prior-{method}", epochs=2, lexical_prior=prior)
    ckpt = toy_root / f"prior-{method}" / "models" / "toy" / method
    meta = read_meta(ckpt)
    assert meta[LEXICAL]["encoder_weight"] == meta[LEXICAL]["lexical_weight"] == 1.0 and meta[LEXICAL]["alpha"] == 1.0
    from pipeline.evaluate import lexical_prior_predictors  # what the report names

    assert lexical_prior_predictors([("toy", method)], toy_root / f"prior-{method}" / "models") == [f"toy/{method}"]
    labels = pd.read_parquet(toy_root / "data" / "pairs" / "toy" / "labels.parquet")
    prompts = pd.read_parquet(toy_root / "data" / "prompts" / "prompts.parquet").set_index("prompt_id")
    val = labels[labels["split"] == "val"].sort_values("prompt_id")
    texts = prompts.loc[val["prompt_id"], "prompt"].tolist()
    scorer = Scorer.from_pretrained(ckpt)
    scores = scorer.score(texts)
    assert kendall_tau_b(scores, val["length"]) == pytest.approx(res["val_tau_b"], abs=1e-6)
    lexical = TfidfRidge.load(ckpt, ngram_max=1)
    train = labels[labels["split"] == "train"].sort_values("prompt_id")
    refit = TfidfRidge.cross_fitted(
        prompts.loc[train["prompt_id"], "prompt"].tolist(),
        train["length"].to_numpy(float),
        alpha=1.0,
        ngram_max=1,
        min_df=1,
        folds=4,
        seed=42,
    )[0]
    np.testing.assert_allclose(lexical.predict(texts), refit.predict(texts), atol=1e-9)  # fitted on train only
    assert np.std(scores - lexical.predict(texts)) > 1e-4  # the encoder adds its own part


def test_in_batch_sees_more_pairs_than_per_pair(toy_root, tiny_encoder_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    inb = run(toy_root, tiny_encoder_dir, "pairwise", "inb", epochs=1)
    per = run(toy_root, tiny_encoder_dir, "pairwise", "per", epochs=1, pairwise_mode="per_pair")
    # per-pair: each file pair once per epoch, two encodings each
    assert per["pairs_seen"] == per["n_train_pairs_file"] and per["prompts_encoded"] == 2 * per["pairs_seen"]
    # in-batch: each train prompt encoded once, many more pairs per encoding
    assert inb["prompts_encoded"] == inb["n_train_prompts"] == 40
    assert inb["pairs_seen"] / inb["prompts_encoded"] > 2 * per["pairs_seen"] / per["prompts_encoded"]


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_wandb_run_is_written_offline_when_not_online(toy_root, tiny_encoder_dir, monkeypatch, tmp_path, capfd, mode):
    """offline: the run is written under the configured dir. online with no API key (or no network):
    training is not lost to its logging; one line says so and the run is written offline."""
    from pipeline import tracking

    monkeypatch.setattr(tracking, "_online_failed", False)
    monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-test")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for var in ("HOME", "WANDB_CONFIG_DIR"):  # no stored login
        monkeypatch.setenv(var, str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    run(
        toy_root,
        tiny_encoder_dir,
        "pairwise",
        "wb",
        epochs=1,
        wandb={"project": "p", "entity": None, "dir": str(tmp_path)},
    )
    said = "W&B: no API key (WANDB_API_KEY or `wandb login`); logging offline in" in capfd.readouterr().err
    assert said == (mode == "online")
    assert (toy_root / "wb" / "models" / "toy" / "pairwise" / "pars.json").is_file()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_a_stored_wandb_login_means_online(monkeypatch, tmp_path):
    """`wandb login` keeps the key in ~/.netrc, not the environment: it counts as a key."""
    from pipeline.tracking import wandb_mode

    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / ".netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert wandb_mode() == "offline"  # no .netrc
    netrc.write_text("machine other.example.org\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    assert wandb_mode() == "offline"  # another host's login
    netrc.write_text("machine wandb.example.org\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_mode() == "online" and wandb_mode("offline") == "offline"


def test_wandb_mode_and_group(monkeypatch):
    from pipeline.tracking import run_group, wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    assert wandb_mode("offline") == "offline"  # a stage's configured mode wins over the key
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled" and wandb_mode("online") == "disabled"  # the environment wins over both
    monkeypatch.setenv("WANDB_MODE", "run")
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("DVC_EXP_NAME", "brave-newt")
    assert run_group() == "brave-newt"
    monkeypatch.delenv("DVC_EXP_NAME")
    assert run_group() != ""


def test_offline_runs_outlive_a_dvc_temp_experiment(monkeypatch, tmp_path):
    """`dvc exp run --temp` works in a copy DVC deletes: a relative W&B dir is taken from $DVC_ROOT."""
    from pipeline.tracking import provenance, run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert run_dir("wandb") == Path("wandb") and (tmp_path / "wandb").is_dir()
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))
    assert run_dir("wandb") == tmp_path / "repo" / "wandb" and (tmp_path / "repo" / "wandb").is_dir()
    assert run_dir(tmp_path / "abs") == tmp_path / "abs"
    monkeypatch.setenv("DVC_EXP_NAME", "brave-newt")
    info = provenance()
    assert info["dvc_exp_name"] == "brave-newt" and set(info) >= {"git_commit", "code_dirty"}


def test_missing_pairs_and_bad_settings_are_clear(toy_root, tiny_encoder_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from pipeline.train import train_one

    with pytest.raises(FileNotFoundError, match=r"no pairs for model 'nomodel'.*pairs exist for: toy;"):
        train_one(
            "nomodel",
            "pairwise",
            train_params(tiny_encoder_dir),
            data_root=toy_root / "data",
            models_root=tmp_path,
            metrics_dir=tmp_path,
            plots_dir=tmp_path,
        )
    with pytest.raises(ValueError, match="pairwise_mode"):
        run(toy_root, tiny_encoder_dir, "pairwise", "bad", pairwise_mode="sometimes")
    prior = {"ngram_max": 2, "min_df": 1, "alpha": 1.0, "folds": 4}
    for bad, where in (
        (True, r"train\.lexical_prior: expected null"),
        ({**prior, "folds": 1}, r"train\.lexical_prior\.folds"),
        ({**prior, "alpha": "abc"}, r"train\.lexical_prior\.alpha"),
        ({**prior, "ngram_max": 1.5}, r"train\.lexical_prior\.ngram_max"),
        ({"alpha": 1.0}, r"train\.lexical_prior: missing folds, min_df, ngram_max"),
    ):
        with pytest.raises(ValueError, match=where):
            run(toy_root, tiny_encoder_dir, "pairwise", "bad", lexical_prior=bad)


def test_max_train_prompts_caps_the_training_set(toy_root, tiny_encoder_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    res = run(toy_root, tiny_encoder_dir, "pointwise", "cap", epochs=1, max_train_prompts=10)
    assert res["n_train_prompts"] == 10 and res["prompts_encoded"] == 10
    assert np.isfinite(res["val_tau_b"])


@pytest.mark.packaged
def test_packaged_minilm_trains_one_short_epoch(toy_root, monkeypatch):
    """The real default encoder through the whole stage (about a minute on 2 cores)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from pipeline.serving.scorer import Scorer

    res = run(
        toy_root,
        "minilm-l6",
        "pairwise",
        "minilm",
        encoder="minilm-l6",
        epochs=1,
        lr=5e-5,
        max_length=16,
        max_train_prompts=16,
    )
    ckpt = toy_root / "minilm" / "models" / "toy" / "pairwise"
    assert Scorer.from_pretrained(ckpt).meta["encoder"] == "minilm-l6"
    assert -1.0 <= res["val_tau_b"] <= 1.0


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_split_forward_equals_full_forward(tiny_ranker, pooling):
    """Training with cached frozen layers computes exactly what serving's full forward computes."""
    tiny_ranker.eval()
    tiny_ranker.pooling = pooling
    torch.manual_seed(1)
    ids = torch.randint(1000, 2000, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding must be masked the same way in both paths
    mask[2, 3:] = 0
    with torch.no_grad():
        full = tiny_ranker.full_forward(input_ids=ids, attention_mask=mask)  # the encoder's own forward
        assert torch.allclose(tiny_ranker(input_ids=ids, attention_mask=mask), full, atol=1e-5)
        for k in range(tiny_ranker.num_layers + 1):
            split = tiny_ranker.score_from(tiny_ranker.hidden_after(ids, mask, k), mask, k)
            assert torch.allclose(split, full, atol=1e-5), k
        if pooling == "mean":  # padding never reaches the pooled vector: a row alone scores the same
            alone = tiny_ranker(input_ids=ids[2:, :3], attention_mask=mask[2:, :3])
            assert torch.allclose(alone, full[2:], atol=1e-5)
    with pytest.raises(ValueError, match="frozen_layers must be in 0..2"):
        tiny_ranker.freeze_lower(3)


def test_split_forward_equals_full_forward_for_mpnet():
    """MPNet's layers take a relative-position bias its encoder computes once: the split forward
    passes it to every layer (without it the cached path would score other numbers), and freezing
    the lower layers freezes the bias table they used."""
    from transformers import AutoModel, MPNetConfig

    from pipeline.ranking.model import LengthRanker

    torch.manual_seed(0)
    config = MPNetConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64
    )
    ranker = LengthRanker(AutoModel.from_config(config)).eval()
    ids = torch.randint(3, 100, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:], ids[1, 7:] = 0, config.pad_token_id
    with torch.no_grad():
        full = ranker.full_forward(input_ids=ids, attention_mask=mask)
        for k in range(ranker.num_layers + 1):
            split = ranker.score_from(ranker.hidden_after(ids, mask, k), mask, k)
            assert torch.allclose(split, full, atol=1e-5), k
    ranker.freeze_lower(1)
    assert not ranker.encoder.encoder.relative_attention_bias.weight.requires_grad
    assert ranker.encoder.encoder.layer[1].attention.attn.q.weight.requires_grad


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_split_forward_equals_full_forward_for_a_causal_lm(pooling):
    """A Llama-style decoder read as an encoder (SmolLM2's architecture): the split forward applies
    rotary positions, the causal and padding mask and the final norm as the model's own forward
    does, at every split point; a right-padded row scores as it does alone; freezing the lower
    layers freezes the token embeddings."""
    from conftest import tiny_llama_config
    from transformers import AutoModel

    from pipeline.ranking.model import LengthRanker

    torch.manual_seed(0)
    config = tiny_llama_config(100, 0)
    ranker = LengthRanker(AutoModel.from_config(config), pooling=pooling).eval()
    ids = torch.randint(3, 100, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:], ids[1, 7:] = 0, 0
    mask[2, 4:], ids[2, 4:] = 0, 0
    with torch.no_grad():
        full = ranker.full_forward(input_ids=ids, attention_mask=mask)
        assert torch.allclose(ranker(input_ids=ids, attention_mask=mask), full, atol=1e-5)
        for k in range(ranker.num_layers + 1):
            split = ranker.score_from(ranker.hidden_after(ids, mask, k), mask, k)
            assert torch.allclose(split, full, atol=1e-5), k
        alone = ranker.score_from(ranker.hidden_after(ids[2:, :4], mask[2:, :4], 1), mask[2:, :4], 1)
        assert torch.allclose(alone, full[2:], atol=1e-5)
        if pooling == "last":  # the last real token is read, not the padding after it
            ids2 = ids.clone()
            ids2[2, 3] = (ids[2, 3] + 1) % 97 + 3
            changed = ranker.full_forward(input_ids=ids2, attention_mask=mask)
            assert not torch.allclose(changed[2], full[2]) and torch.allclose(changed[:2], full[:2])
        # training runs inside fast_dropout (its own attention function): grouped key/value heads too
        from pipeline.ranking.dropout import fast_dropout

        with fast_dropout(ranker):
            assert torch.allclose(ranker.score_from(ranker.hidden_after(ids, mask, 1), mask, 1), full, atol=1e-5)
        # bf16-mixed training scores a bfloat16 cache under autocast; serving runs the whole model
        # under autocast: the two agree to bfloat16 rounding (the residual stream stays float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            served = ranker.full_forward(input_ids=ids, attention_mask=mask).float()
            trained = ranker.score_from(ranker.hidden_after(ids, mask, 2).to(torch.bfloat16), mask, 2).float()
        assert torch.allclose(trained, served, atol=0.05), (trained, served)
    import copy

    from pipeline.serving.scorer import shared_lower_layers

    twin = copy.deepcopy(ranker)
    with torch.no_grad():
        twin.encoder.layers[2].mlp.up_proj.weight.add_(1.0)
    assert shared_lower_layers(ranker, twin) == 2  # serving shares the twins' cached lower layers
    ranker.freeze_lower(2)
    assert not ranker.encoder.embed_tokens.weight.requires_grad
    assert not ranker.encoder.layers[1].mlp.up_proj.weight.requires_grad
    assert ranker.encoder.layers[2].mlp.up_proj.weight.requires_grad and ranker.encoder.norm.weight.requires_grad


def test_encode_prompts_frames_a_chat_lm_prompt_in_its_template(tokenizer):
    """A tokenizer with a chat template (a causal LM's) wraps every prompt, cut to fit, in its user
    turn and generation prompt: the last token is where the answer would start."""
    import copy

    from pipeline.ranking.model import encode_prompts

    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for m in messages %}user : {{ m['content'] }} ;{% endfor %}assistant :"
    frame_pre = chat("user :", add_special_tokens=False)["input_ids"]
    frame_post = chat("; assistant :", add_special_tokens=False)["input_ids"]
    body = chat("two words", add_special_tokens=False)["input_ids"]
    assert encode_prompts(chat, ["two words"], 64, 0.5)[0] == frame_pre + body + frame_post
    text = " ".join(f"w{i}" for i in range(50))
    cut = encode_prompts(chat, [text], 20, 0.5)[0]
    whole = chat(text, add_special_tokens=False)["input_ids"]
    inner = 20 - len(frame_pre) - len(frame_post)
    head = round(inner * 0.5)
    assert cut == frame_pre + whole[:head] + whole[len(whole) - (inner - head) :] + frame_post
    assert encode_prompts(tokenizer, ["two words"], 64, 0.5)[0] == tokenizer("two words")["input_ids"]


def test_first_position_shortcut_trains_like_the_full_layer(tiny_ranker):
    """[CLS] pooling computes the last layer at the first position alone: the gradients reaching
    every trained weight are those of the encoder's own forward (dropout off, so both are exact)."""
    for module in tiny_ranker.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    tiny_ranker.train()
    torch.manual_seed(2)
    ids = torch.randint(1000, 2000, (4, 11))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    grads = []
    for forward in (tiny_ranker.full_forward, tiny_ranker.forward):
        tiny_ranker.zero_grad()
        (forward(input_ids=ids, attention_mask=mask) * torch.arange(1.0, 5.0)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in tiny_ranker.named_parameters() if p.grad is not None})
    full, short = grads
    # the pooler and the last layer's query/feed-forward at other positions get no gradient either way
    assert set(short) <= set(full) and any("layer.1.output" in n for n in short)
    for name, grad in short.items():
        assert torch.allclose(grad, full[name], atol=1e-5), name
    assert all(not full[n].abs().sum() for n in set(full) - set(short))
    # a last layer not laid out as BERT's is run whole, as the encoder's own forward does
    from pipeline.ranking.model import _bert_layer

    assert _bert_layer(tiny_ranker._layers()[-1]) and not _bert_layer(torch.nn.Linear(2, 2))


def test_pooling_is_checked_and_travels_with_the_checkpoint(tiny_bert_config, tokenizer, tmp_path):
    from pipeline.ranking.model import LengthRanker
    from pipeline.serving import Scorer, save_checkpoint

    with pytest.raises(ValueError, match="pooling must be one of"):
        LengthRanker.from_config(tiny_bert_config, pooling="max")
    model = LengthRanker.from_config(tiny_bert_config, pooling="mean").eval()
    save_checkpoint(model, tokenizer, tmp_path / "ckpt", method="pairwise", max_length=16, encoder="tiny")
    scorer = Scorer.from_pretrained(tmp_path / "ckpt")
    assert scorer.meta["pooling"] == "mean" and scorer.model.pooling == "mean"
    with torch.no_grad():
        ids = torch.tensor([tokenizer("a short prompt")["input_ids"]])
        expected = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert scorer.score(["a short prompt"])[0] == pytest.approx(float(expected[0]), abs=1e-5)


def test_encode_prompts_keeps_head_and_tail(tokenizer):
    from pipeline.ranking.model import encode_prompts

    text = " ".join(str(i) for i in range(300))
    both = tokenizer.convert_ids_to_tokens(encode_prompts(tokenizer, [text], 12, 0.5)[0])
    assert both == ["[CLS]", "0", "1", "2", "3", "4", "295", "296", "297", "298", "299", "[SEP]"]
    # head_fraction 1.0 is the tokenizer's own right truncation; short prompts are untouched
    assert encode_prompts(tokenizer, [text], 12, 1.0)[0] == tokenizer(text, truncation=True, max_length=12)["input_ids"]
    assert encode_prompts(tokenizer, ["two words"], 12, 0.5)[0] == tokenizer("two words")["input_ids"]
    tail = tokenizer.convert_ids_to_tokens(encode_prompts(tokenizer, [text], 6, 0.0)[0])
    assert tail == ["[CLS]", "296", "297", "298", "299", "[SEP]"]
    with pytest.raises(ValueError, match="head_fraction"):
        encode_prompts(tokenizer, [text], 12, 1.5)


def test_length_bucket_batches_cover_every_prompt_once_and_pad_less():
    from pipeline.ranking.data import LengthBucketBatches

    sizes = np.random.default_rng(0).integers(5, 128, 1000)
    sampler = LengthBucketBatches(sizes, batch_size=32, bucket=10, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 32
    assert sorted(i for b in batches for i in b) == list(range(1000))
    padded = sum(len(b) * sizes[b].max() for b in batches)
    rand = np.random.default_rng(1).permutation(1000)
    padded_random = sum(32 * sizes[rand[i : i + 32]].max() for i in range(0, 1000, 32))
    assert padded < 0.75 * padded_random
    sampler.set_epoch(1)
    assert list(sampler) != batches  # a new order each epoch


def _random_prompt_table(n: int):
    """(token counts, a PromptTable of n random prompts of 3 to 11 tokens with random lengths)."""
    from pipeline.ranking.data import PromptTable

    rng = np.random.default_rng(0)
    sizes = rng.integers(3, 12, n)
    table = PromptTable(
        ids=np.array([f"p{i}" for i in range(n)]),
        input_ids=[[101, *rng.integers(1000, 2000, k - 2).tolist(), 102] for k in sizes],
        lengths=rng.uniform(1, 1000, n),
        truncated=np.zeros(n, bool),
    )
    return sizes, table


def test_a_trainer_gives_length_bucket_batches_a_new_order_each_epoch(tiny_bert_config):
    """Lightning calls set_epoch on a loader's sampler, not on a batch sampler: RankerModule does,
    or every epoch would replay the first one's batches (the same in-batch pairs twice)."""
    import lightning as L
    import torch

    from pipeline.ranking.data import LengthBucketBatches, PromptCollate, _Rows
    from pipeline.ranking.lightning import RankerModule

    sizes, table = _random_prompt_table(48)
    collate, seen = PromptCollate(table, 0, delta=0.2), []

    def recording(rows):
        seen.append(list(rows))
        return collate(rows)

    sampler = LengthBucketBatches(sizes, batch_size=8, bucket=1, seed=0)
    loader = torch.utils.data.DataLoader(_Rows(len(sizes)), batch_sampler=sampler, collate_fn=recording)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    from conftest import make_tiny_ranker

    trainer.fit(RankerModule(make_tiny_ranker(tiny_bert_config), "pairwise"), train_dataloaders=loader)
    first, second = seen[: len(sampler)], seen[len(sampler) :]
    assert len(second) == len(sampler) == 6 and sampler.epoch == 1
    for epoch in (first, second):
        assert sorted(i for b in epoch for i in b) == list(range(len(sizes)))
    assert {tuple(b) for b in first} != {tuple(b) for b in second}


def test_validation_under_bf16_scores_with_the_head_in_float32_as_a_scorer_does(tiny_bert_config):
    """bf16-mixed training keeps the head in bfloat16 (~3 digits: close prompts tie); the val tau_b
    that picks the best epoch is computed on float32-head scores, as the exported scorer gives."""
    import lightning as L
    import torch

    from pipeline.ranking.data import PromptCollate, _Rows
    from pipeline.ranking.lightning import RankerModule

    sizes, table = _random_prompt_table(32)
    loader = torch.utils.data.DataLoader(_Rows(len(sizes)), batch_size=16, collate_fn=PromptCollate(table, 0))
    from conftest import make_tiny_ranker

    module, scores = RankerModule(make_tiny_ranker(tiny_bert_config), "pairwise"), []
    step = module.validation_step

    def recording(batch, batch_idx):
        step(batch, batch_idx)
        scores.append(module._val_parts[-1][1])

    module.validation_step = recording
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False, enable_progress_bar=False)
    trainer.validate(module, dataloaders=loader, verbose=False)
    got = torch.cat(scores)
    assert got.dtype == torch.float32 and len(got) == len(sizes)
    assert (got.to(torch.bfloat16).float() != got).any()  # more digits than bfloat16 holds
    assert module.model.head_in_float32 is False  # training goes on in bf16-mixed's dtype


def test_least_padding_parts_match_a_brute_force_search():
    from itertools import combinations

    from pipeline.ranking.data import least_padding_parts

    rng = np.random.default_rng(1)
    for _ in range(30):
        sizes = np.sort(rng.integers(1, 129, int(rng.integers(1, 11))))
        parts = int(rng.integers(1, 5))
        got = least_padding_parts(sizes, parts)
        assert got[0].start == 0 and got[-1].stop == len(sizes) and len(got) <= parts
        assert all(a.stop == b.start for a, b in zip(got, got[1:]))
        padded = sum((p.stop - p.start) * sizes[p.stop - 1] for p in got)
        best = min(
            sum((b - a) * sizes[b - 1] for a, b in zip((0, *cuts), (*cuts, len(sizes))))
            for k in range(min(parts, len(sizes)))
            for cuts in combinations(range(1, len(sizes)), k)
        )
        assert padded == best and all(p.start < p.stop for p in got)
    assert least_padding_parts(np.array([7, 7, 7]), 4) == [slice(0, 3)]  # no cut that saves nothing
    assert least_padding_parts(np.array([3, 90]), 5) == [slice(0, 1), slice(1, 2)]  # parts > prompts


def test_padded_width_rounds_up_to_the_multiple_within_the_cap():
    from pipeline.ranking.model import pad_batch, padded_width

    assert [padded_width(n, 16) for n in (1, 16, 17, 120)] == [16, 16, 32, 128]
    assert padded_width(117, 16, cap=128) == 128 and padded_width(121, 16, cap=124) == 124
    assert padded_width(130, 16, cap=128) == 130  # a cap never cuts a prompt
    assert padded_width(37, 1) == 37
    ids, mask = pad_batch([[5, 6, 7], [8]], 0, multiple=4)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]] and mask.sum(1).tolist() == [3, 1]


@pytest.mark.parametrize("frozen", [0, 1])
@pytest.mark.parametrize("pad_multiple, max_width, widths", [(1, None, [7, 16, 40]), (8, 38, [8, 16, 40])])
def test_micro_batches_pad_apart_but_score_and_pair_the_whole_batch(
    tiny_bert_config, frozen, pad_multiple, max_width, widths
):
    """micro_batches: the batch is sorted by prompt size and padded in parts, each to its own
    longest prompt (rounded up to `pad_multiple`, cut on the rounded widths), yet scores, in-batch
    pairs and so the loss and its gradient are those of the whole batch padded at once (pairs cross
    the parts)."""
    from pipeline.ranking.data import PromptCollate, PromptTable
    from pipeline.ranking.lightning import RankerModule
    from pipeline.ranking.model import LengthRanker

    rng = np.random.default_rng(0)
    sizes = [3, 40, 7, 5, 33, 12, 9, 28, 4, 16]
    table = PromptTable(
        ids=np.array([f"p{i}" for i in range(len(sizes))]),
        input_ids=[[101, *rng.integers(1000, 2000, n - 2).tolist(), 102] for n in sizes],
        lengths=rng.uniform(1, 1000, len(sizes)),
        truncated=np.arange(len(sizes)) % 4 == 1,
        groups=np.arange(len(sizes)) % 2,
        prior=rng.normal(size=len(sizes)),
    )
    torch.manual_seed(0)
    model = LengthRanker.from_config(tiny_bert_config, dropout=0.0).eval()
    if frozen:
        table.hidden = [
            model.hidden_after(torch.tensor([x]), torch.ones(1, len(x), dtype=torch.long), 1)[0].detach()
            for x in table.input_ids
        ]
    module = RankerModule(model, "pairwise", margin=0.0, margin_per_log_length=1.0, frozen_layers=frozen)
    rows = list(range(len(sizes)))
    whole = PromptCollate(table, 0, delta=0.2)(rows)
    split = PromptCollate(table, 0, delta=0.2, micro_batches=3, pad_multiple=pad_multiple, max_width=max_width)(rows)
    assert [p["attention_mask"].shape[1] for p in split["parts"]] == widths
    assert split["index"].tolist() == sorted(rows, key=lambda r: sizes[r])
    # the cut flags the pointwise and listwise losses read follow the rows' new order
    for batch in (whole, split):
        assert batch["truncated"].tolist() == table.truncated[batch["index"].numpy()].tolist()

    def pairs_of(batch):
        index = batch["index"].tolist()
        return sorted(tuple(sorted((index[a], index[b]))) for a, b in batch["pairs"].tolist())

    assert pairs_of(split) == pairs_of(whole) and len(pairs_of(whole)) > 4
    losses, grads = [], []
    for batch in (whole, split):
        model.zero_grad()
        scores = module.batch_scores(batch)
        loss = module.loss_fn(scores, batch["lengths"].to(scores.dtype), batch["pairs"])
        loss.backward()
        losses.append(loss.detach())
        top = model.encoder.encoder.layer[-1].attention.self.query.weight
        grads.append(torch.cat([model.head.weight.grad.flatten(), top.grad.flatten()]))
        by_row = dict(zip(batch["index"].tolist(), scores.detach().tolist()))
        if batch is whole:
            reference = by_row
        else:
            assert by_row == pytest.approx(reference, abs=1e-5)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_frozen_layers_cache_trains_the_top_and_serves_the_same(toy_root, tiny_encoder_dir, monkeypatch):
    """frozen_layers=1: the lower layer is run once and cached; only the top layer and head move;
    the exported checkpoint scores val prompts exactly as validation did on the cached path."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import pandas as pd
    from safetensors.torch import load_file
    from transformers import AutoModel

    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer

    res = run(
        toy_root,
        tiny_encoder_dir,
        "pairwise",
        "frozen",
        frozen_layers=1,
        length_buckets=2,
        micro_batches=3,
        head_fraction=0.5,
        lr=5e-3,
    )
    assert res["val_tau_b"] > 0.4 and res["frozen_layers"] == 1 and res["frozen_cache_seconds"] >= 0
    ckpt = toy_root / "frozen" / "models" / "toy" / "pairwise"
    weights = load_file(str(ckpt / "model.safetensors"))
    original = AutoModel.from_pretrained(tiny_encoder_dir).state_dict()
    for name in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"):
        assert torch.equal(weights[f"encoder.{name}"], original[name]), name
    assert not torch.equal(
        weights["encoder.encoder.layer.1.attention.self.query.weight"],
        original["encoder.layer.1.attention.self.query.weight"],
    )
    scorer = Scorer.from_pretrained(ckpt)
    assert scorer.head_fraction == 0.5
    labels = pd.read_parquet(toy_root / "data" / "pairs" / "toy" / "labels.parquet")
    prompts = pd.read_parquet(toy_root / "data" / "prompts" / "prompts.parquet").set_index("prompt_id")
    val = labels[labels["split"] == "val"].sort_values("prompt_id")
    scores = scorer.score(prompts.loc[val["prompt_id"], "prompt"].tolist())
    assert kendall_tau_b(scores, val["length"]) == pytest.approx(res["val_tau_b"], abs=1e-6)


def test_bf16_mixed_trains_on_a_bf16_cache_and_exports_float32(toy_root, tiny_encoder_dir, monkeypatch):
    """train.lightning.precision bf16-mixed on the CPU: the frozen layers' cache is computed under
    bfloat16 autocast, the top layers train under it, and the checkpoint stays float32 and still
    ranks val prompts with serving's full float32 forward. (On the real ChatGPT predictors the two
    agree to 0.004; a tiny random encoder at lr 5e-3 is further off, so the bound here is loose.)"""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import pandas as pd
    from safetensors.torch import load_file

    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer

    lightning = {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "precision": "bf16-mixed", "strategy": "auto"}
    res = run(toy_root, tiny_encoder_dir, "pairwise", "bf16", frozen_layers=1, lr=5e-3, lightning=lightning)
    assert res["val_tau_b"] > 0.4 and res["precision"] == "bf16-mixed", res
    ckpt = toy_root / "bf16" / "models" / "toy" / "pairwise"
    assert {w.dtype for w in load_file(str(ckpt / "model.safetensors")).values()} == {torch.float32}
    labels = pd.read_parquet(toy_root / "data" / "pairs" / "toy" / "labels.parquet")
    prompts = pd.read_parquet(toy_root / "data" / "prompts" / "prompts.parquet").set_index("prompt_id")
    val = labels[labels["split"] == "val"].sort_values("prompt_id")
    scores = Scorer.from_pretrained(ckpt).score(prompts.loc[val["prompt_id"], "prompt"].tolist())
    assert kendall_tau_b(scores, val["length"]) > 0.4


def test_auto_precision_takes_bf16_only_where_it_is_native(monkeypatch):
    """`precision: auto` is bf16-mixed on a CPU with native bfloat16 and 32-true on one without
    (where bf16 is emulated and many times slower); a Lightning precision is used as given."""
    import pipeline.hardware as hardware
    import pipeline.train as train_mod

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for native, expected in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda native=native: native)
        assert train_mod.resolve_precision("auto", "cpu") == expected
        assert train_mod.resolve_precision("auto", "auto") == expected
        assert train_mod.resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
        assert train_mod.resolve_precision("32-true", "cpu") == "32-true"
    # a GPU: native bf16 (compute capability >= 8.0) picks bf16-mixed; bf16 that torch only
    # emulates (a pre-Ampere GPU, which is_bf16_supported counts by default) picks 32-true
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for native, expected in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True, native=native: native or including_emulation,
        )
        assert train_mod.resolve_precision("auto", "gpu") == expected


def test_a_bf16_cache_scores_like_float32(tiny_ranker):
    """The cache kept in bfloat16 (under bf16-mixed) gives the float32 scores to bf16 precision,
    inside autocast and outside it (cast back to the weights' dtype)."""
    tiny_ranker.eval()
    torch.manual_seed(1)
    ids = torch.randint(1000, 2000, (4, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        full = tiny_ranker(input_ids=ids, attention_mask=mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cache = tiny_ranker.hidden_after(ids, mask, 1).to(torch.bfloat16)
            inside = tiny_ranker.score_from(cache, mask, 1).float()
        outside = tiny_ranker.score_from(cache, mask, 1)
    assert cache.dtype == torch.bfloat16 and outside.dtype == torch.float32
    scale = full.abs().max().item() + 1e-3
    assert (inside - full).abs().max().item() < 0.05 * scale
    assert (outside - full).abs().max().item() < 0.05 * scale


def test_cross_model_set_trains_on_the_union_without_mixing_models(tmp_path, tiny_encoder_dir, monkeypatch):
    """Two models answer the same prompts on length scales 10x apart: the cross-model predictor
    sees both models' prompts, compares prompts only within a model, and ranks both."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from pipeline.contracts import GENERATIONS, generations_path, write_table
    from pipeline.ranking.labels import in_batch_pairs
    from pipeline.train import train_one

    data = tmp_path / "data"
    write_dataset(data, model="small", n_train=40, n_val=16)
    _, gens = make_tables(n_train=40, n_val=16, seed=1)
    write_table(gens.assign(output_tokens=gens["output_tokens"] * 10), generations_path("big", data), GENERATIONS)
    params = write_params(tmp_path / "params.yaml", partners=4)
    for model in ("small", "big"):
        assert (
            pairs_main(
                [
                    "--model",
                    model,
                    "--params",
                    str(params),
                    "--data",
                    str(data),
                    "--metrics",
                    str(tmp_path / "metrics" / "pairs"),
                ]
            )
            == 0
        )
    # one short prompt of the long-answer model outlasts every answer of the other: never compared
    assert in_batch_pairs(np.array([40.0, 400.0, 50.0]), np.zeros(3, bool), 0.2, groups=[0, 1, 0]).tolist() == [[0, 2]]
    res = train_one(
        "both",
        "pairwise",
        train_params(tiny_encoder_dir, cross_models={"both": ["small", "big"]}, lr=5e-3),
        data_root=data,
        models_root=tmp_path / "models",
        metrics_dir=tmp_path / "m",
        plots_dir=tmp_path / "p",
    )
    assert res["members"] == ["small", "big"] and res["n_train_prompts"] == 80
    assert res["val_tau_b"] > 0.4
    with pytest.raises(ValueError, match="listwise"):
        train_one(
            "both",
            "listwise",
            train_params(tiny_encoder_dir, cross_models={"both": ["small", "big"]}),
            data_root=data,
            models_root=tmp_path / "models",
            metrics_dir=tmp_path / "m",
            plots_dir=tmp_path / "p",
        )


def test_length_bucket_batches_keep_groups_apart():
    from pipeline.ranking.data import LengthBucketBatches

    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1, 2], [500, 40, 30])
    sampler = LengthBucketBatches(rng.integers(5, 128, len(groups)), batch_size=32, bucket=4, seed=0, groups=groups)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 16 + 2 + 1
    assert sorted(i for b in batches for i in b) == list(range(len(groups)))
    assert all(len(set(groups[b])) == 1 for b in batches)  # every in-batch pair is comparable


def test_ddp_two_cpu_processes_gather_validation_and_export_once(toy_root, tiny_encoder_dir, tmp_path):
    """The production profile's multi-process path on CPU: `pars train` (as dvc runs it) with the
    production train settings (full fine-tuning, plain shuffle, early stopping) and Lightning
    strategy ddp over 2 processes (gloo). Lightning re-launches the command line for rank 1, so it
    runs in a subprocess, not in pytest. Each rank trains and validates a shard; the val scores are
    all-gathered, so the recorded tau_b and pair accuracy are those of all val prompts, which the
    exported checkpoint (written by rank 0 only) reproduces."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd
    import yaml

    from pipeline.profile import deep_merge
    from pipeline.ranking.metrics import kendall_tau_b, pair_accuracy
    from pipeline.serving.scorer import Scorer

    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "profiles" / "production.yaml").read_text())
    production = deep_merge(
        yaml.safe_load((repo / "params.yaml").read_text()), profile, set(profile.pop("_replace", []))
    )["train"]
    assert production["frozen_layers"] == 0 and production["length_buckets"] == 0  # the path tested here
    lightning = {"accelerator": "cpu", "devices": 2, "num_nodes": 1, "precision": "32-true", "strategy": "ddp"}
    train = production | params_for(tiny_encoder_dir, epochs=2, lr=5e-3, torch_threads=1, lightning=lightning)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train": train}))
    pars = Path(sys.executable).with_name("pars")  # the console script dvc.yaml calls
    cmd = [str(pars)] if pars.is_file() else [sys.executable, "-m", "pipeline.cli"]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    proc = subprocess.run(
        [
            *cmd,
            "train",
            "--model",
            "toy",
            "--method",
            "pairwise",
            "--params",
            str(params),
            "--data",
            str(toy_root / "data"),
            "--models",
            str(tmp_path / "models"),
            "--metrics",
            str(tmp_path / "metrics"),
            "--plots",
            str(tmp_path / "plots"),
        ],
        cwd=tmp_path,
        env=env | {"WANDB_MODE": "disabled", "PARS_DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # one result line and one progress line per epoch: rank 0 reports, rank 1 only trains
    assert proc.stdout.count("train toy/pairwise: val tau_b") == 1, proc.stdout
    assert "MEMBER: 2/2" in proc.stdout + proc.stderr  # Lightning started a second process
    epoch_lines = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 2, proc.stdout
    # rank 0's own counter: half of the 40 train prompts per epoch (DistributedSampler shards)
    assert "(20 prompts trained" in epoch_lines[0], epoch_lines

    res = json.loads((tmp_path / "metrics" / "toy-pairwise.json").read_text())
    assert res["n_train_prompts"] == 40 and res["n_val_prompts"] == 16 and res["epochs_run"] == 2
    assert res["prompts_encoded"] == 2 * 40  # both ranks' work: 2 epochs x 40 prompts
    assert res["pairs_seen"] > 0 and res["prompts_per_s"] > 0
    history = pd.read_csv(tmp_path / "plots" / "toy-pairwise.csv")
    assert history["n_val_prompts"].tolist() == [16, 16]  # every val prompt, not one rank's 8

    labels = pd.read_parquet(toy_root / "data" / "pairs" / "toy" / "labels.parquet")
    prompts = pd.read_parquet(toy_root / "data" / "prompts" / "prompts.parquet").set_index("prompt_id")
    val = labels[labels["split"] == "val"].sort_values("prompt_id").reset_index(drop=True)
    ckpt = tmp_path / "models" / "toy" / "pairwise"
    scores = Scorer.from_pretrained(ckpt).score(prompts.loc[val["prompt_id"], "prompt"].tolist())
    assert kendall_tau_b(scores, val["length"]) == pytest.approx(res["val_tau_b"], abs=1e-5)
    pos = {p: i for i, p in enumerate(val["prompt_id"])}
    val_pairs = pd.read_parquet(toy_root / "data" / "pairs" / "toy" / "val.parquet")
    idx = np.array([[pos[a], pos[b]] for a, b in zip(val_pairs["a"], val_pairs["b"])])
    assert pair_accuracy(scores, val["length"].to_numpy(), idx) == pytest.approx(res["val_pair_acc"], abs=1e-6)
    assert sorted(p.name for p in (tmp_path / "models").rglob("*") if p.is_dir()) == ["pairwise", "toy"]


def _benchmark_module(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_sweep_runs_each_setting_once_and_rejects_typos(toy_root, tiny_encoder_dir, monkeypatch, tmp_path):
    """benchmarks/train_sweep.py: each grid run is a real fit with its overrides; a rerun keeps the
    finished runs; an override that is no train param fails before anything trains."""
    import yaml

    monkeypatch.setenv("WANDB_MODE", "disabled")
    sweep = _benchmark_module("train_sweep")
    params = tmp_path / "params.yaml"
    pairs = yaml.safe_load((toy_root / "params.yaml").read_text())["pairs"]  # delta 0.2
    params.write_text(yaml.safe_dump({"train": dict(train_params(tiny_encoder_dir, epochs=2)), "pairs": pairs}))
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        yaml.safe_dump(
            {
                "question": "toy",
                "base": {"model": "toy", "method": "pairwise"},
                "runs": {
                    "default": {},
                    "one epoch, pointwise": {"method": "pointwise", "overrides": {"epochs": 1}},
                    "delta 0.6": {"delta": 0.6},
                },
            }
        )
    )
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    argv = [str(grid), "--out", str(out), "--params", str(params), "--data", str(toy_root / "data"), "--plot", str(png)]
    assert sweep.main(argv) == 0
    runs = json.loads(out.read_text())["runs"]
    assert runs["default"]["epochs_run"] == 2 and runs["one epoch, pointwise"]["epochs_run"] == 1
    assert runs["one epoch, pointwise"]["settings"]["method"] == "pointwise"
    # the delta run trained on pairs rebuilt with delta 0.6: fewer in-batch pairs than at 0.2
    assert runs["delta 0.6"]["settings"]["delta"] == 0.6 and "delta" not in runs["default"]["settings"]
    assert 0 < runs["delta 0.6"]["pairs_seen"] < runs["default"]["pairs_seen"], runs
    assert all(r["val_tau_b"] > 0.2 for r in runs.values()), runs  # the toy task is learnable
    assert png.stat().st_size > 0

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr("pipeline.train.train_one", no_training)
    assert sweep.main(argv) == 0

    grid.write_text(yaml.safe_dump({"runs": {"typo": {"overrides": {"learning_rate": 1e-3}}}}))
    with pytest.raises(SystemExit, match="'learning_rate' is not a train param"):
        sweep.main(argv)
    grid.write_text(yaml.safe_dump({"runs": {"all pairs": {"delta": 0}}}))
    with pytest.raises(SystemExit, match=r"runs.all pairs: delta 0 must be a number in \(0, 1\)"):
        sweep.main(argv)
    grid.write_text(yaml.safe_dump({"runs": {"typo": {"detla": 0.35}}}))  # else trained at the root's δ
    with pytest.raises(SystemExit, match="runs.typo: unknown key 'detla'"):
        sweep.main(argv)
    grid.write_text(yaml.safe_dump({"runs": {"delta 0.6": {"delta": 0.6}}}))
    params.write_text(yaml.safe_dump({"train": dict(train_params(tiny_encoder_dir, epochs=2))}))
    with pytest.raises(SystemExit, match=r"has no section 'pairs' \(a run with delta rebuilds its pairs with it\)"):
        sweep.main(
            [
                str(grid),
                "--out",
                str(tmp_path / "other.json"),
                "--params",
                str(params),
                "--data",
                str(toy_root / "data"),
            ]
        )
    from pipeline.errors import PARSError

    grid.write_text("runs:\n  a: {}\n  a: {overrides: {epochs: 1}}\n")  # PyYAML alone would keep the last
    with pytest.raises(
        PARSError, match=re.escape(f"{grid}:3:3: not valid YAML (key 'a' written twice, first on line 2)")
    ):
        sweep.main(argv)


def test_seed_spread_trains_each_seed_and_scores_val_and_test(toy_root, tiny_encoder_dir, monkeypatch, tmp_path):
    """benchmarks/seed_spread.py: one real fit per seed, each checkpoint scored on the eval model's
    val and test splits; different seeds give different weights; a rerun scores without training."""
    import yaml

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(toy_root / "data")
    train = dict(train_params(tiny_encoder_dir, epochs=1))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": train, "evaluate": {"eval_models": ["toy"]}}))
    spread = _benchmark_module("seed_spread")
    argv = ["--model", "toy", "--seeds", "42", "7", "--work", str(tmp_path / "work"), "--out", "spread.json"]
    assert spread.main(argv) == 0
    toy = json.loads((tmp_path / "spread.json").read_text())["kendall_tau_b"]["toy"]
    assert toy["val"]["n_prompts"] == 16 and toy["test"]["n_prompts"] == 6
    assert set(toy["test"]["by_seed"]) == {"42", "7"} and toy["val"]["sd"] is not None
    w42 = (tmp_path / "work" / "seed42" / "toy" / "pairwise" / "model.safetensors").read_bytes()
    w7 = (tmp_path / "work" / "seed7" / "toy" / "pairwise" / "model.safetensors").read_bytes()
    assert w42 != w7

    def no_training(*args, **kwargs):
        raise AssertionError("a finished seed was trained again")

    monkeypatch.setattr("pipeline.train.train_one", no_training)
    assert spread.main(argv) == 0
    # other train settings than the checkpoints were trained with: they are retrained, not reused
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"train": {**train, "lr": train["lr"] / 2}, "evaluate": {"eval_models": ["toy"]}})
    )
    with pytest.raises(AssertionError, match="trained again"):
        spread.main(argv)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fused_adamw_steps_and_clips_like_the_per_parameter_loop(tiny_bert_config, precision, monkeypatch):
    """Without a GradScaler the optimizer is torch's fused AdamW; Lightning refuses to clip for it,
    so the module clips itself: a tight clip must bind, and the weights after a few steps are those
    of the per-parameter AdamW with Lightning's own clipping."""
    import lightning as L
    from conftest import make_tiny_ranker

    from pipeline.ranking.lightning import RankerModule

    torch.manual_seed(3)
    ids = torch.randint(1000, 2000, (8, 10))
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "lengths": torch.arange(10.0, 90.0, 10.0),
        "pairs": torch.tensor([[i, j] for i in range(8) for j in range(i + 1, 8)]),
    }
    loader = torch.utils.data.DataLoader([batch] * 3, batch_size=None)
    clip = RankerModule.configure_gradient_clipping

    def fit(fused: bool):
        monkeypatch.setattr(RankerModule, "_fused_adamw", lambda self, params: fused)
        torch.manual_seed(0)
        model = make_tiny_ranker(tiny_bert_config)
        for module in model.modules():  # no dropout: both runs compute the same gradients
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        ranker = RankerModule(model, "pairwise", lr=1e-2)
        norms = []

        def clip_and_record(self, optimizer, *args, **kwargs):
            clip(self, optimizer, *args, **kwargs)
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        monkeypatch.setattr(RankerModule, "configure_gradient_clipping", clip_and_record)
        trainer = L.Trainer(
            max_steps=3,
            accelerator="cpu",
            precision=precision,
            gradient_clip_val=1e-3,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        trainer.fit(ranker, train_dataloaders=loader)
        assert bool(trainer.optimizers[0].defaults.get("fused")) == fused
        return model.state_dict(), norms

    fused_state, fused_norms = fit(True)
    loop_state, loop_norms = fit(False)
    assert len(fused_norms) == 3 and max(fused_norms) <= 1e-3 * (1 + 1e-4)
    assert fused_norms == pytest.approx(loop_norms, rel=1e-3)
    # rounding only: the two kernels sum in different orders (below 1e-6 in 32-true), against updates
    # of ~1e-2 a step at this lr. In bf16-mixed a weight that differs by 1e-8 can round to another
    # bfloat16 (an ulp is ~1e-4 here) in the next step's forward: on a CPU with native bfloat16 a few
    # elements then differ by up to 3e-5 (1.4e-6 where bf16 is emulated, AVX2)
    atol = 1e-4 if precision == "bf16-mixed" else 1e-5
    for name, value in fused_state.items():
        assert torch.allclose(value, loop_state[name], atol=atol), name
    assert not torch.allclose(fused_state["head.weight"], make_tiny_ranker(tiny_bert_config).head.weight)


def test_methods_trained_together_train_as_they_would_alone(toy_root, tiny_encoder_dir, monkeypatch):
    """train@<model> trains every method in one process from one setup (token ids, lexical prior,
    frozen layers' cache): each method's checkpoint and val figures are those of its own run."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from safetensors.torch import load_file

    from pipeline.ranking.data import RankingDataModule
    from pipeline.train import train_methods

    prior = {"ngram_max": 1, "min_df": 1, "alpha": 1.0, "folds": 4}
    over = {"frozen_layers": 1, "length_buckets": 2, "epochs": 2, "lexical_prior": prior}
    cache_passes = []
    cache_hidden = RankingDataModule.cache_hidden

    def counted_cache_hidden(self, *args, **kwargs):
        cache_passes.append(self)
        return cache_hidden(self, *args, **kwargs)

    monkeypatch.setattr(RankingDataModule, "cache_hidden", counted_cache_hidden)

    def fit(tag, methods):
        return train_methods(
            "toy",
            methods,
            train_params(tiny_encoder_dir, **over),
            data_root=toy_root / "data",
            models_root=toy_root / tag / "models",
            metrics_dir=toy_root / tag / "metrics",
            plots_dir=toy_root / tag / "plots",
        )

    together = fit("together", ["pairwise", "pointwise"])
    assert len(cache_passes) == 1  # one pass of the frozen layers for both methods
    alone = fit("alone", ["pointwise"])
    assert len(cache_passes) == 2
    assert [r["method"] for r in together] == ["pairwise", "pointwise"]
    assert together[1]["val_tau_b"] == alone[0]["val_tau_b"]
    # each method reports the shared pass's time (it can round to 0.0 s on a fast machine)
    assert together[1]["frozen_cache_seconds"] == together[0]["frozen_cache_seconds"] >= 0
    weights = [
        load_file(str(toy_root / tag / "models" / "toy" / "pointwise" / "model.safetensors"))
        for tag in ("together", "alone")
    ]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name
    pairwise = load_file(str(toy_root / "together" / "models" / "toy" / "pairwise" / "model.safetensors"))
    assert not torch.equal(pairwise["head.weight"], weights[0]["head.weight"])
    from pipeline.ranking.checkpoint import LEXICAL, read_meta

    records = [read_meta(toy_root / tag / "models" / "toy" / "pointwise")[LEXICAL] for tag in ("together", "alone")]
    assert records[0]["files_sha256"] == records[1]["files_sha256"]  # one prior fit, the same as alone
    with pytest.raises(ValueError, match="distinct names"):
        fit("bad", ["pairwise", "pairwise"])


def test_a_failed_export_leaves_the_previous_checkpoint(toy_root, tiny_encoder_dir, monkeypatch):
    """Each checkpoint is written whole into a temp dir, then renamed over the old one: a failure while
    attaching the lexical prior (after the weights and pars.json) leaves the last checkpoint as it was."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import pipeline.ranking.checkpoint as checkpoint

    parent = toy_root / "atomic" / "models" / "toy"
    (parent / "pairwise").mkdir(parents=True)
    (parent / "pairwise" / "pars.json").write_text("the previous checkpoint")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "attach_lexical", fail)
    prior = {"ngram_max": 1, "min_df": 1, "alpha": 1.0, "folds": 4}
    with pytest.raises(OSError, match="disk full"):
        run(toy_root, tiny_encoder_dir, "pairwise", "atomic", epochs=1, lexical_prior=prior)
    assert sorted(p.name for p in parent.iterdir()) == ["pairwise"]  # no temp dir left behind
    assert [p.name for p in (parent / "pairwise").iterdir()] == ["pars.json"]
    assert (parent / "pairwise" / "pars.json").read_text() == "the previous checkpoint"


def test_a_run_whose_val_tau_is_never_defined_is_not_exported(toy_root, tiny_encoder_dir, monkeypatch):
    """Constant or NaN scores at every epoch: one line saying so, and the previous checkpoint stays."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import pipeline.ranking.lightning as lightning_module
    from pipeline.errors import PARSError

    monkeypatch.setattr(lightning_module, "kendall_tau_b", lambda x, y: float("nan"))
    out = toy_root / "undefined" / "models" / "toy" / "pointwise"
    out.mkdir(parents=True)
    (out / "pars.json").write_text("the previous checkpoint")
    with pytest.raises(PARSError, match=r"val tau_b was undefined at every epoch .*train\.lr") as exc:
        run(toy_root, tiny_encoder_dir, "pointwise", "undefined", epochs=2)
    assert "\n" not in str(exc.value)
    assert (out / "pars.json").read_text() == "the previous checkpoint"
    assert sorted(p.name for p in out.parent.iterdir()) == ["pointwise"]


def test_params_check_refuses_a_batch_of_one_and_a_blank_wandb_section(tiny_encoder_dir):
    from pipeline.errors import PARSError
    from pipeline.train import check_params

    one = train_params(tiny_encoder_dir, batch_size=1)
    for methods in (["listwise"], ["pointwise", "pairwise"]):  # in-batch pairs: none in a batch of one
        with pytest.raises(PARSError, match=r"train\.batch_size 1: must be at least 2"):
            check_params(one, methods)
    check_params(one, ["pointwise"])  # a batch of one still has a target
    check_params({**one, "pairwise_mode": "per_pair"}, ["pairwise"])  # a batch of one pair
    good = {"project": "p", "entity": None, "dir": "."}
    for bad, where in (
        (None, r"train\.wandb None: must be a mapping"),
        ({}, r"train\.wandb\.project is missing"),
        ({"project": "p", "entity": None}, r"train\.wandb\.dir is missing"),
        ({**good, "project": ""}, r"train\.wandb\.project '': must be a non-empty name"),
        ({**good, "entity": 3}, r"train\.wandb\.entity 3: must be a non-empty name or null"),
        ({**good, "projct": "p"}, r"train\.wandb\.projct: not a setting here"),
    ):
        with pytest.raises(PARSError, match=where):
            check_params(train_params(tiny_encoder_dir, wandb=bad), ["pointwise"])
    check_params(train_params(tiny_encoder_dir, wandb=good), ["pointwise"])


def test_a_lexical_min_df_that_prunes_every_term_names_the_key(toy_root, tiny_encoder_dir, monkeypatch):
    from pipeline.ranking.lexical import TfidfRidge

    texts = ["alpha beta", "gamma delta", "epsilon zeta", "eta theta"]
    with pytest.raises(ValueError, match=r"^train\.lexical_prior\.min_df 2: no term is in 2 or more of the 4 texts"):
        TfidfRidge.cross_fitted(
            texts,
            [1, 2, 3, 4],
            alpha=1.0,
            ngram_max=1,
            min_df=2,
            folds=2,
            seed=0,
            min_df_key="train.lexical_prior.min_df",
        )
    monkeypatch.setenv("WANDB_MODE", "disabled")
    prior = {"ngram_max": 1, "min_df": 1000, "alpha": 1.0, "folds": 4}  # more than the train prompts
    with pytest.raises(ValueError, match=r"train\.lexical_prior\.min_df 1000: no term is in 1000 or more"):
        run(toy_root, tiny_encoder_dir, "pairwise", "min-df", lexical_prior=prior)


def test_replace_dir_swaps_by_renames_and_cleans_up(tmp_path):
    from pipeline.dirs import replace_dir

    dst = tmp_path / "ckpt"
    dst.mkdir()
    (dst / "a").write_text("old")
    (tmp_path / ".ckpt.old").mkdir()  # left by a run killed between its renames

    def fill(tmp):
        tmp.mkdir()
        (tmp / "b").write_text("new")

    assert replace_dir(dst, fill) == dst
    assert [p.name for p in dst.iterdir()] == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]

    def broken(tmp):
        fill(tmp)
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        replace_dir(dst, broken)
    assert [p.name for p in dst.iterdir()] == ["b"] and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
