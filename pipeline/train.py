"""train@{model}: fit length rankers with Lightning, one per method -> models/<model>/<method>/.

Reads data/pairs/<model>/ (labels, train/val pairs, the δ used) and data/prompts/ (texts), and
the `train` params section. The methods train one after the other in one process: what they have
in common (labels, token ids, the lexical prior, the frozen lower layers' output) is computed once,
and each method starts from the seed, so it trains exactly as it would alone (tested). For each
method it writes the best epoch by val Kendall tau_b as a serving checkpoint
(pipeline.ranking.checkpoint.save_checkpoint), metrics/train/<model>-<method>.json (DVC metrics)
and plots/train/<model>-<method>.csv (per-epoch curve). Runs are tracked in W&B through
Lightning's WandbLogger, one run per method: offline by default (./wandb, `wandb sync` later),
online when WANDB_MODE=online or WANDB_API_KEY is set; WANDB_MODE=disabled turns it off.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.contracts import ensure_parent, write_json, write_text
from pipeline.encoders import check_encoder_files, encoder_config, resolve_encoder
from pipeline.errors import PARSError
from pipeline.hardware import auto_precision, cpu_has_native_bf16
from pipeline.params import PARAMS_HELP, Section, load_params
from pipeline.ranking.losses import METHODS
from pipeline.ranking.predictors import names
from pipeline.tracking import provenance, run_dir, run_group, start_run, wandb_mode

POOLINGS = ("cls", "mean", "last")  # pipeline.ranking.model (not imported here: it imports torch)
PAIRWISE_MODES = ("in_batch", "per_pair")  # pipeline.ranking.data
# every key of params.yaml's train section (the one home of defaults)
TRAIN_KEYS = (
    "models", "cross_models", "encoder", "max_length", "head_fraction", "pooling", "frozen_layers",
    "length_buckets", "micro_batches", "pad_to_multiple_of", "epochs", "patience", "batch_size", "eval_batch_size", "lr",
    "weight_decay", "warmup_fraction", "grad_clip", "margin", "margin_per_log_length", "lexical_prior",
    "pairwise_mode", "max_train_prompts", "seed", "dropout", "num_workers", "torch_threads", "lightning", "wandb",
)  # fmt: skip
LEXICAL_PRIOR_KEYS = ("ngram_max", "min_df", "alpha", "folds")  # train.lexical_prior
# Lightning's precision flags that need no optional package, and `auto` (resolve_precision)
PRECISIONS = ("auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true", "32", "16", "bf16", "64")


def make_logger(model: str, method: str, cfg: dict[str, Any], datasets: list[str], extra: dict[str, Any]):
    mode = wandb_mode()
    if mode == "disabled":
        return None
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.utilities import rank_zero_only

    wb = cfg["wandb"]
    save_dir = run_dir(os.environ.get("WANDB_DIR") or wb["dir"])  # as evaluate's run
    init = {
        "project": wb["project"],
        "entity": wb["entity"],
        "name": f"{model}-{method}",
        "group": run_group(),
        "tags": [f"model:{model}", f"method:{method}", *[f"dataset:{d}" for d in datasets]],
        "job_type": "train",
        "dir": str(save_dir),
        "config": {"model": model, "method": method, "datasets": datasets, **cfg, **extra, **provenance()},
    }
    experiment = None
    if rank_zero_only.rank == 0:  # the run is started here, not by the logger, so that it can fall back offline
        experiment = start_run(mode, **init)
        experiment.define_metric("trainer/global_step")  # as WandbLogger does for a run it starts
        experiment.define_metric("*", step_metric="trainer/global_step", step_sync=True)
    return WandbLogger(experiment=experiment, save_dir=str(save_dir), **{k: v for k, v in init.items() if k != "dir"})


def lexical_prior_settings(raw: Any, where: str = "params train") -> dict[str, Any] | None:
    """train.lexical_prior as numbers, or None when it is off (null); ValueError naming the key
    (`where` is the section's name, e.g. `params.yaml: train`) for anything else, before the slow work."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}.lexical_prior: expected null or {{ngram_max, min_df, alpha, folds}}, got {raw!r}")
    Section(raw, f"{where}.lexical_prior").only(LEXICAL_PRIOR_KEYS)
    missing = sorted(set(LEXICAL_PRIOR_KEYS) - set(raw))
    if missing:
        raise ValueError(f"{where}.lexical_prior: missing {', '.join(missing)}")
    out: dict[str, Any] = {}
    for key, least in (("ngram_max", 1), ("min_df", 1), ("folds", 2)):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{where}.lexical_prior.{key}: expected an integer >= {least}, got {value!r}")
        out[key] = value
    alpha = raw["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < float("inf"):
        raise ValueError(f"{where}.lexical_prior.alpha: expected a number > 0, got {alpha!r}")
    out["alpha"] = float(alpha)
    return out


def check_params(params: Mapping[str, Any], methods: list[str], machine: bool = True) -> Section:
    """The train section checked before any slow work: a bad value fails in one line naming its
    key, instead of a Lightning or numpy error (or a silently different run) minutes later.
    `machine=False` (`pars profile`) leaves out what asks this machine: whether the hub or the
    accelerator and devices named are here (a profile is often switched to on another machine)."""
    cfg = params if isinstance(params, Section) else Section(params, "train")
    cfg.only(TRAIN_KEYS)
    for key in ("epochs", "batch_size", "eval_batch_size", "torch_threads", "micro_batches", "pad_to_multiple_of"):
        cfg.integer(key, minimum=1)
    for key in ("length_buckets", "num_workers"):  # 0: off / load in this process
        cfg.integer(key, minimum=0)
    cfg.integer("patience", minimum=0, optional=True)  # null or 0: no early stopping
    cfg.integer("max_train_prompts", minimum=0, optional=True)  # null or 0: every train prompt
    cfg.integer("seed", minimum=0, maximum=2**32 - 1)  # Lightning's and numpy's seed range
    cfg.number("lr", positive=True)
    cfg.number("warmup_fraction", minimum=0, maximum=1)
    cfg.number("head_fraction", minimum=0, maximum=1)
    cfg.number("dropout", minimum=0, below=1)
    for key in ("weight_decay", "grad_clip", "margin", "margin_per_log_length"):
        cfg.number(key, minimum=0)
    cfg.choice("pooling", POOLINGS)
    if cfg["pairwise_mode"] not in PAIRWISE_MODES:  # a ValueError, as RankingDataModule raised it
        raise ValueError(
            f"{cfg.where}.pairwise_mode {cfg['pairwise_mode']!r}: must be one of {', '.join(PAIRWISE_MODES)}"
        )
    # a batch of one prompt has no pair to rank and ListMLE of one item is 0: nothing would train
    one_list = [m for m in methods if m == "listwise" or (m == "pairwise" and cfg["pairwise_mode"] == "in_batch")]
    if one_list and cfg["batch_size"] < 2:
        raise PARSError(
            f"{cfg.where}.batch_size {cfg['batch_size']}: must be at least 2 for {', '.join(one_list)} "
            "(a batch of one prompt has nothing to rank against)"
        )
    check_cross_models(cfg)
    lexical_prior_settings(cfg["lexical_prior"], cfg.where)
    check_wandb(cfg)

    # the encoder: a mistyped name fails now; its config.json (when on this machine) bounds the layers
    config = encoder_config(resolve_encoder(cfg["encoder"], key=f"{cfg.where}.encoder", lookup=machine)) or {}
    n_layers, positions = config.get("num_hidden_layers"), config.get("max_position_embeddings")
    if cfg["pooling"] == "cls" and any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or []):
        # a causal LM's first position sees nothing of the prompt after it
        raise PARSError(
            f"{cfg.where}.pooling cls: {cfg['encoder']} is a causal LM, whose first position reads no "
            "prompt; use last (where the answer would start) or mean"
        )
    frozen = cfg.integer("frozen_layers", minimum=0, maximum=n_layers if isinstance(n_layers, int) else None)
    # room for [CLS], one prompt token and [SEP]; no more positions than the encoder has
    cfg.integer("max_length", minimum=3, maximum=positions if isinstance(positions, int) else None)
    if frozen and "pairwise" in methods and cfg["pairwise_mode"] == "per_pair":
        raise PARSError(
            f"{cfg.where}.frozen_layers {frozen}: needs pairwise_mode in_batch (per-pair batches cannot use the cache)"
        )

    lt = cfg.mapping("lightning").only(("accelerator", "devices", "num_nodes", "precision", "strategy"))
    lt.integer("num_nodes", minimum=1)
    if str(lt["precision"]) not in PRECISIONS:  # str: YAML's 32 is Lightning's "32"
        raise PARSError(f"{lt.where}.precision {lt['precision']!r}: must be one of {', '.join(PRECISIONS)}")
    if machine:
        check_devices(lt, check_accelerator(lt))  # imports Lightning (seconds): last
    else:
        lt.choice("accelerator", accelerator_names())
    on_cpu = _runs_on_cpu(lt["accelerator"]) if machine else lt["accelerator"] == "cpu"
    if str(lt["precision"]) in ("16-mixed", "16") and on_cpu:
        # Lightning would switch to bf16-mixed with a log line, and the metrics would record 16-mixed
        raise PARSError(
            f"{lt.where}.precision {lt['precision']!r}: mixed float16 needs a GPU; on a CPU use auto, "
            "bf16-mixed or 32-true"
        )
    from lightning.pytorch.strategies import StrategyRegistry

    if lt["strategy"] != "auto" and lt["strategy"] not in StrategyRegistry.available_strategies():
        raise PARSError(f"{lt.where}.strategy {lt['strategy']!r}: not a Lightning strategy (auto, ddp, fsdp, ...)")
    if str(lt["strategy"]).startswith(("ddp_spawn", "ddp_fork", "ddp_notebook")):
        # these train in child processes: the best weights never reach this one to be exported
        raise PARSError(
            f"{lt.where}.strategy {lt['strategy']!r} is not supported: use ddp (it runs this command once per device)"
        )
    return cfg


def check_wandb(cfg: Section) -> None:
    """train.wandb as make_logger reads it: {project, entity, dir}. It is read only after the data,
    tokens and caches are ready, so a blank or partial section must fail here."""
    wb = cfg["wandb"]
    if not isinstance(wb, Mapping):
        raise PARSError(f"{cfg.where}.wandb {wb!r}: must be a mapping {{project, entity, dir}} (entity may be null)")
    wb = Section(wb, f"{cfg.where}.wandb").only(("project", "entity", "dir"))
    for key in ("project", "entity", "dir"):
        if key not in wb:
            raise PARSError(f"{wb.where}.{key} is missing (the section is {{project, entity, dir}})")
        value = wb[key]
        if not (isinstance(value, str) and value.strip()) and not (key == "entity" and value is None):
            raise PARSError(f"{wb.where}.{key} {value!r}: must be a non-empty name" + " or null" * (key == "entity"))


def check_cross_models(cfg: Section) -> None:
    """train.cross_models: name -> a list of distinct train model names; a name of its own (a
    cross-model set named like a per-model predictor would silently train that one on the union)."""
    cross = cfg.mapping("cross_models")
    models = names(cfg, "models")  # a string would make `in` below a substring test
    for name, members in cross.items():
        where = f"{cross.where}.{name}"
        if name in models:
            raise PARSError(f"{where}: {name!r} is also in {cfg.where}.models; give the cross-model set its own name")
        if (
            not isinstance(members, list)
            or not members
            or not all(isinstance(m, str) and m for m in members)
            or len(set(members)) != len(members)
        ):
            raise PARSError(f"{where} {members!r}: must be a non-empty list of distinct model names")


def accelerator_names() -> tuple[str, ...]:
    """The names train.lightning.accelerator may take: Lightning's, and auto and gpu."""
    from lightning.pytorch.accelerators import AcceleratorRegistry

    return ("auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators()))


def check_accelerator(lt: Section) -> str:
    """train.lightning.accelerator: a name Lightning knows whose device this machine has (Lightning
    itself would refuse it only after the data, the tokenizer and the frozen cache)."""
    from lightning.pytorch.accelerators import AcceleratorRegistry

    value = lt.choice("accelerator", accelerator_names())
    wanted = {"auto": (), "gpu": ("cuda", "mps")}.get(value, (value,))
    if wanted and not any(AcceleratorRegistry[name]["accelerator"].is_available() for name in wanted):
        why = "torch_xla is not installed" if value == "tpu" and not _importable("torch_xla") else "no such device here"
        raise PARSError(f"{lt.where}.accelerator {value!r}: not available on this machine ({why})")
    return value


def check_devices(lt: Section, accelerator: str) -> None:
    """train.lightning.devices as Lightning's accelerator would parse it, before the data loads."""
    import torch
    from lightning.pytorch.accelerators import AcceleratorRegistry

    devices = lt["devices"]
    if devices == "auto":
        return
    if isinstance(devices, bool) or not isinstance(devices, (int, str, list)):
        raise PARSError(f"{lt.where}.devices {devices!r}: must be auto, a count, or a list of device indices")
    gpu = "cuda" if torch.cuda.is_available() else "mps"
    has_gpu = torch.cuda.is_available() or torch.backends.mps.is_available()
    name = {"gpu": gpu, "auto": gpu if has_gpu else "cpu"}.get(accelerator, accelerator)
    try:
        AcceleratorRegistry[name]["accelerator"].parse_devices(devices)
    except Exception as exc:  # Lightning's TypeError / MisconfigurationException / ValueError
        raise PARSError(f"{lt.where}.devices {devices!r}: {' '.join(str(exc).split())}") from None


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def check_outputs(model: str, methods: list[str], models_root, metrics_dir, plots_dir) -> None:
    """Where the stage writes, checked before any work: a --models/--metrics/--plots path that is a
    file (or under one) would otherwise fail only after training."""
    if model in ("", ".", "..") or "/" in model or "\\" in model:
        # models/<model>/<method> is deleted and rewritten: it must stay under --models
        raise PARSError(f"--model {model!r}: must be a plain name (no '/', not '.' or '..')")
    for method in methods:
        for flag, path in (
            ("--models", Path(models_root) / model / method / "config.json"),
            ("--metrics", Path(metrics_dir) / f"{model}-{method}.json"),
            ("--plots", Path(plots_dir) / f"{model}-{method}.csv"),
        ):
            try:
                ensure_parent(path, create=False)
            except PARSError as exc:
                raise PARSError(f"{flag}: {exc}") from None


def _runs_on_gpu(accelerator: str) -> bool:
    import torch

    return str(accelerator) in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def _runs_on_cpu(accelerator: str) -> bool:
    import torch

    if str(accelerator) == "cpu":
        return True
    return str(accelerator) == "auto" and not torch.cuda.is_available() and not torch.backends.mps.is_available()


def resolve_precision(precision: str, accelerator: str) -> str:
    """Lightning's precision for `train.lightning.precision`. `auto`: bf16-mixed where bfloat16 is
    native (a GPU that supports it, a CPU with AVX512-BF16 / AMX), else 32-true. On a CPU without
    it bf16 is emulated: ~20x slower per step than 32-true on an AVX2-only EPYC
    (benchmarks/precision_probe.py), while a native one trains 2x faster than 32-true at the same
    val tau_b (metrics/choices/bf16.json)."""
    if str(precision) != "auto":
        return str(precision)
    return auto_precision("cuda" if _runs_on_gpu(accelerator) else "cpu")


def train_one(
    model_name: str,
    method: str,
    params: dict[str, Any],
    *,
    data_root: str | Path = "data",
    models_root: str | Path = "models",
    metrics_dir: str | Path = "metrics/train",
    plots_dir: str | Path = "plots/train",
) -> dict[str, Any]:
    """Train one (generation model, method) predictor; returns the metrics written."""
    results = train_methods(
        model_name,
        [method],
        params,
        data_root=data_root,
        models_root=models_root,
        metrics_dir=metrics_dir,
        plots_dir=plots_dir,
    )
    return results[0] if results else {}


def train_methods(
    model_name: str,
    methods: list[str],
    params: dict[str, Any],
    *,
    data_root: str | Path = "data",
    models_root: str | Path = "models",
    metrics_dir: str | Path = "metrics/train",
    plots_dir: str | Path = "plots/train",
) -> list[dict[str, Any]]:
    """Train each method on one model's (or cross-model set's) data; returns the metrics written,
    one dict per method (none on a DDP rank other than 0). Labels, token ids, the lexical prior and
    the frozen layers' cache are computed once for all of them (on ChatGPT's 24k prompts about a
    minute and a half per method saved)."""
    t_start = time.perf_counter()
    if not methods or any(m not in METHODS for m in methods) or len(set(methods)) != len(methods):
        raise ValueError(f"methods must be distinct names from {METHODS}, got {methods!r}")
    # params.yaml's train section: every key comes from there, none from code; checked before the slow work
    cfg = check_params(params, methods)
    lt = cfg["lightning"]
    precision = resolve_precision(lt["precision"], lt["accelerator"])
    prior_cfg = lexical_prior_settings(cfg["lexical_prior"], cfg.where)
    trainer_args = {
        "max_epochs": int(cfg["epochs"]),
        "accelerator": lt["accelerator"],
        "devices": lt["devices"],
        "num_nodes": int(lt["num_nodes"]),
        "precision": precision,
        "strategy": lt["strategy"],
        "gradient_clip_val": float(cfg["grad_clip"]),
    }
    import lightning as L
    import torch

    from pipeline.dirs import replace_dir
    from pipeline.ranking.data import RankingData, RankingDataModule
    from pipeline.ranking.dropout import fast_dropout
    from pipeline.ranking.lightning import BestWeights, RankerModule, prepare_for_training
    from pipeline.ranking.model import LengthRanker, NoRoomForPrompt, encode_prompts, load_encoder, load_tokenizer

    torch.set_num_threads(int(cfg["torch_threads"]))
    # the encoder's files before the data and the slow work (tokenizing, the lexical prior): a damaged
    # tokenizer or weights file fails now, naming it. The encoder loaded here only shows its weights
    # are whole; each method loads its own after the seed, as before
    check_encoder_files(resolve_encoder(cfg["encoder"], lookup=False))  # check_params looked the name up
    tokenizer = load_tokenizer(cfg["encoder"])
    try:  # a causal LM's chat template counts in max_length: one too short for it fails now, named
        encode_prompts(tokenizer, ["a"], int(cfg["max_length"]))
    except NoRoomForPrompt as exc:
        raise PARSError(f"{cfg.where}.{exc}") from None
    except ValueError as exc:  # a tokenizer this framing cannot use (e.g. a chat template that splits a prompt)
        raise PARSError(f"{cfg.where}.encoder {cfg['encoder']}: {exc}") from None
    load_encoder(cfg["encoder"])
    on_gpu = _runs_on_gpu(lt["accelerator"])
    if precision.startswith("bf16") and not on_gpu and not cpu_has_native_bf16():
        print(
            f"train {model_name}: warning: train.lightning.precision {precision} on a CPU "
            f"without native bfloat16 (AVX512-BF16 / AMX) is emulated and slow; 32-true (or auto) is faster here",
            flush=True,
        )
    L.seed_everything(int(cfg["seed"]), workers=True, verbose=False)

    cross = cfg["cross_models"] or {}
    if model_name in cross:  # a cross-model set: the union of several models' labels and pairs
        data = RankingData.load_union(model_name, list(cross[model_name]), data_root)
    else:
        data = RankingData.load(model_name, data_root)
    head_fraction, frozen = float(cfg["head_fraction"]), int(cfg["frozen_layers"])
    shared = RankingDataModule(  # every method's loaders read these tables (token ids, prior, cache)
        data,
        tokenizer,
        methods[0],
        max_length=int(cfg["max_length"]),
        batch_size=int(cfg["batch_size"]),
        eval_batch_size=int(cfg["eval_batch_size"]),
        pairwise_mode=cfg["pairwise_mode"],
        max_train_prompts=cfg.integer("max_train_prompts", minimum=0, optional=True),
        seed=int(cfg["seed"]),
        num_workers=int(cfg["num_workers"]),
        head_fraction=head_fraction,
        length_buckets=int(cfg["length_buckets"]),
        micro_batches=int(cfg["micro_batches"]),
        pad_to_multiple_of=int(cfg["pad_to_multiple_of"]),
    )
    # every method's loaders now: a method the data cannot train is refused before the slow work
    loaders = {method: shared.with_method(method) for method in methods}
    # loaders over the same tables share one lexical-prior fit and one pass of the frozen layers
    # (per-pair batches bring tables of their own)
    lexical_of: dict[int, Any] = {}
    cache_seconds_of: dict[int, float] = {}
    results: list[dict[str, Any]] = []
    for method in methods:
        t_method = time.perf_counter()
        dm = loaders[method]
        tables = id(dm.train_table)
        if prior_cfg and tables not in lexical_of:
            t_prior = time.perf_counter()
            lexical_of[tables] = dm.fit_lexical_prior(**prior_cfg, min_df_key=f"{cfg.where}.lexical_prior.min_df")
            print(
                f"train {model_name}: lexical prior (TF-IDF + ridge, {prior_cfg['folds']}-fold on "
                f"{len(dm.train_table)} train prompts) in {time.perf_counter() - t_prior:.0f} s",
                flush=True,
            )
        lexical = lexical_of.get(tables)
        # each method from the seed: it trains exactly as it would alone (tested)
        L.seed_everything(int(cfg["seed"]), workers=True, verbose=False)
        model = LengthRanker.from_pretrained_encoder(
            cfg["encoder"], dropout=float(cfg["dropout"]), pooling=cfg["pooling"]
        )
        prepare_for_training(model, method, dm.train_table.lengths, dm.train_table.prior)
        if frozen:
            model.freeze_lower(frozen)
            if tables not in cache_seconds_of:
                # on a GPU run the frozen layers run there too, on this process's GPU under ddp (the
                # cache itself stays in host memory)
                device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if on_gpu else "cpu"
                cache_seconds_of[tables] = dm.cache_hidden(
                    model, frozen, batch_size=int(cfg["eval_batch_size"]), device=device, precision=precision
                )
                print(
                    f"train {model_name}: frozen embeddings + {frozen} layers run once over "
                    f"{len(dm.train_table) + len(dm.val_table)} prompts in {cache_seconds_of[tables]:.0f} s",
                    flush=True,
                )
        model.train()  # from_pretrained returns eval mode (dropout off) and Lightning keeps the mode it finds
        module = RankerModule(
            model,
            method,
            lr=float(cfg["lr"]),
            weight_decay=float(cfg["weight_decay"]),
            warmup_fraction=float(cfg["warmup_fraction"]),
            margin=float(cfg["margin"]),
            margin_per_log_length=float(cfg["margin_per_log_length"]),
            val_pairs=dm.val_pair_idx,
            frozen_layers=frozen,
            val_groups=dm.val_table.groups if len(data.members) > 1 else None,
        )

        logger = make_logger(
            model_name, method, cfg, data.datasets, dm.describe() | {"delta": data.delta, "precision_used": precision}
        )
        best = BestWeights()
        callbacks = [best]
        if cfg["patience"]:
            from lightning.pytorch.callbacks import EarlyStopping

            # an undefined tau_b (NaN: constant scores, e.g. a fresh head) counts as no improvement;
            # Lightning's default (check_finite) would end the run at the first one
            callbacks.append(
                EarlyStopping(monitor="val/tau_b", mode="max", patience=int(cfg["patience"]), check_finite=False)
            )
        trainer = L.Trainer(
            **trainer_args,
            logger=logger if logger is not None else False,
            callbacks=callbacks,
            enable_checkpointing=False,  # BestWeights keeps the best epoch; export below
            num_sanity_val_steps=0,
            log_every_n_steps=5,
            enable_model_summary=False,
        )
        with fast_dropout(model):  # torch's CPU dropout masks were a third of a step's time
            trainer.fit(module, datamodule=dm)
        # BestWeights keeps an epoch even when none could rank: that model must not replace the last
        # good one (every rank holds the same gathered val figures, so every rank stops here)
        if not math.isfinite(best.best_val.get("val_tau_b", math.nan)):
            raise PARSError(
                f"train {model_name}/{method}: val tau_b was undefined at every epoch (constant or NaN scores; "
                f"try a lower {cfg.where}.lr than {cfg['lr']}); nothing exported"
            )

        result: dict[str, Any] = {}
        if trainer.is_global_zero:
            best.restore(model)
            out = Path(models_root) / model_name / method
            train_wall = module.train_seconds
            trained_on = {
                "model": model_name,
                "datasets": data.datasets,
                "n_train_prompts": dm.n_train_prompts,
                "val_tau_b": best.best_val["val_tau_b"],
                "val_pair_acc": best.best_val["val_pair_acc"],
                "best_epoch": best.best_epoch,
                "epochs": int(cfg["epochs"]),
                "delta": data.delta,
                "pairwise_mode": cfg["pairwise_mode"] if method == "pairwise" else None,
                "n_val_prompts": len(dm.val_table),
                "members": list(data.members),
            }
            # the stage rewrites its output whole: every file into a temp dir, then one rename (a crash
            # midway must not leave a checkpoint that validates but lacks its lexical prior)
            replace_dir(
                out,
                partial(
                    write_checkpoint,
                    model=model,
                    tokenizer=tokenizer,
                    method=method,
                    cfg=cfg,
                    trained_on=trained_on,
                    lexical=lexical,
                ),
            )
            result = {
                "model": model_name,
                "method": method,
                "val_tau_b": best.best_val["val_tau_b"],
                "val_pair_acc": best.best_val["val_pair_acc"],
                "best_epoch": best.best_epoch,
                "epochs_run": len(best.history),
                **dm.describe(),
                "pairs_seen": module.pairs_seen,
                "prompts_encoded": module.prompts_encoded,
                "train_seconds": round(train_wall, 2),
                # the frozen layers' pass: once per stage, shared by the methods that report it
                "frozen_cache_seconds": round(cache_seconds_of.get(tables, 0.0), 2),
                "frozen_layers": frozen,
                "head_fraction": head_fraction,
                "members": list(data.members),
                "prompts_per_s": round(module.prompts_encoded / train_wall, 3) if train_wall else None,
                "pairs_per_s": round(module.pairs_seen / train_wall, 3)
                if train_wall and method == "pairwise"
                else None,
                # this method's fit and export, and the stage so far (setup shared by every method included)
                "method_wall_s": round(time.perf_counter() - t_method, 2),
                "stage_wall_s": round(time.perf_counter() - t_start, 2),
                "encoder": str(cfg["encoder"]),
                "max_length": int(cfg["max_length"]),
                "batch_size": int(cfg["batch_size"]),
                "length_buckets": int(cfg["length_buckets"]),
                "micro_batches": int(cfg["micro_batches"]),
                "pad_to_multiple_of": int(cfg["pad_to_multiple_of"]),
                "pairwise_mode": cfg["pairwise_mode"] if method == "pairwise" else None,
                "precision": precision,
            }
            write_json(result, Path(metrics_dir) / f"{model_name}-{method}.json")
            write_text(pd.DataFrame(best.history).to_csv(index=False), Path(plots_dir) / f"{model_name}-{method}.csv")
            if logger is not None:
                run = logger.experiment
                run.summary.update(
                    {
                        "best/val_tau_b": result["val_tau_b"],
                        "best/epoch": best.best_epoch,
                        "train/prompts_per_s": result["prompts_per_s"],
                        "train/pairs_per_s": result["pairs_per_s"],
                    }
                )
            results.append(result)
        if logger is not None:
            logger.experiment.finish()  # flush the (offline) run directory before the next run or exit
    return results


def write_checkpoint(out: Path, *, model, tokenizer, method: str, cfg: Section, trained_on: dict, lexical) -> None:
    """One method's serving checkpoint into `out`: weights, config, tokenizer, pars.json, and the
    lexical prior (when train.lexical_prior is on) recorded in pars.json."""
    from pipeline.ranking.checkpoint import attach_lexical, save_checkpoint

    save_checkpoint(
        model,
        tokenizer,
        out,
        method=method,
        max_length=int(cfg["max_length"]),
        encoder=str(cfg["encoder"]),
        trained_on=trained_on,
        head_fraction=float(cfg["head_fraction"]),
        extra={
            "training": {
                k: cfg[k]
                for k in (
                    "lr",
                    "weight_decay",
                    "warmup_fraction",
                    "batch_size",
                    "grad_clip",
                    "margin",
                    "margin_per_log_length",
                    "seed",
                    "dropout",
                    "frozen_layers",
                    "length_buckets",
                    "micro_batches",
                    "pad_to_multiple_of",
                )
            }
        },
    )
    if lexical is not None:
        # serving adds the same prior (the Scorer reads pars.json `lexical`)
        attach_lexical(
            out,
            lexical,
            encoder_weight=1.0,
            lexical_weight=1.0,
            alpha=lexical_prior_settings(cfg["lexical_prior"], cfg.where)["alpha"],
            trained_with="train.lexical_prior: the encoder learned the residual of this regression",
        )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pars train", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", required=True, help="whose pairs: a model (train.models) or a cross-model set (train.cross_models)"
    )
    ap.add_argument(
        "--method",
        action="append",
        choices=METHODS,
        help="a method to train (repeat for several; default: every method, as the train@<model> stage does)",
    )
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    ap.add_argument("--data", default="data", help="data root (reads <root>/pairs/<model>/, <root>/prompts/)")
    ap.add_argument("--models", default="models", help="models root (writes <root>/<model>/<method>/)")
    ap.add_argument("--metrics", default="metrics/train", help="writes <dir>/<model>-<method>.json")
    ap.add_argument("--plots", default="plots/train", help="writes <dir>/<model>-<method>.csv (val tau_b per epoch)")
    args = ap.parse_args(argv)
    params = load_params("train", args.params)
    check_outputs(args.model, args.method or list(METHODS), args.models, args.metrics, args.plots)
    results = train_methods(
        args.model,
        args.method or list(METHODS),
        params,
        data_root=args.data,
        models_root=args.models,
        metrics_dir=args.metrics,
        plots_dir=args.plots,
    )
    for res in results:
        print(
            f"train {args.model}/{res['method']}: val tau_b {res['val_tau_b']:.3f} (epoch {res['best_epoch']}), "
            f"pair acc {res['val_pair_acc']:.3f}, {res['prompts_per_s']} prompts/s, "
            f"{res['method_wall_s']:.0f} s (stage so far {res['stage_wall_s']:.0f} s) -> "
            f"{Path(args.models) / args.model / res['method']}"
        )
    return 0
