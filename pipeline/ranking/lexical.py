"""TF-IDF + ridge: a bag-of-words regression of log answer length.

The cheap lexical model a fine-tuned ranker is compared against (evaluate's `tfidf_ridge`
reference), and the lexical half of a blended serving checkpoint (the `blend` stage). Saved as
plain files, no pickle: the vocabulary in index order (JSON) and the idf, ridge coefficients and
intercept (safetensors); loading rebuilds the same scikit-learn vectorizer from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

VOCAB_FILE = "lexical_vocab.json"
WEIGHTS_FILE = "lexical.safetensors"


class TfidfRidge:
    """Lowercased word 1..ngram_max-grams (sublinear tf, l2-normalised, terms in >= min_df texts)
    + ridge on log1p(answer length). `predict(texts)` -> higher = longer answer."""

    def __init__(self, vectorizer, coef: np.ndarray, intercept: float):
        self.vectorizer = vectorizer
        self.coef = np.asarray(coef, dtype=np.float64)
        self.intercept = float(intercept)

    @staticmethod
    def vectorize(texts: Sequence[str], *, ngram_max: int, min_df: int, key: str = "min_df"):
        """(fitted vectorizer, its train matrix): fitted once, shared by every alpha of a grid.
        A min_df that no term reaches is a ValueError naming `key` (the caller's params key)."""
        from sklearn.feature_extraction.text import TfidfVectorizer

        texts = list(texts)
        vectorizer = TfidfVectorizer(
            ngram_range=(1, int(ngram_max)), min_df=int(min_df), sublinear_tf=True, lowercase=True
        )
        try:
            return vectorizer, vectorizer.fit_transform(texts)
        except ValueError as exc:
            # scikit-learn's words for it name neither the key nor the number of texts
            if "no terms remain" not in str(exc) and "documents than min_df" not in str(exc):
                raise
            raise ValueError(
                f"{key} {int(min_df)}: no term is in {int(min_df)} or more of the {len(texts)} texts; lower it"
            ) from None

    @classmethod
    def fit_grid(
        cls,
        texts: Sequence[str],
        lengths: Sequence[float],
        *,
        alphas,
        ngram_max: int,
        min_df: int,
        min_df_key: str = "min_df",
    ) -> list["TfidfRidge"]:
        """One fit per alpha of the grid on the same vocabulary (the vocabulary and idf see only `texts`)."""
        from sklearn.linear_model import Ridge

        vectorizer, x = cls.vectorize(texts, ngram_max=ngram_max, min_df=min_df, key=min_df_key)
        y = np.log1p(np.asarray(lengths, dtype=float))
        fits = []
        for alpha in alphas:
            ridge = Ridge(alpha=float(alpha)).fit(x, y)
            fits.append(cls(vectorizer, ridge.coef_, ridge.intercept_))
        return fits

    @classmethod
    def cross_fitted(
        cls,
        texts: Sequence[str],
        lengths: Sequence[float],
        *,
        alpha: float,
        ngram_max: int,
        min_df: int,
        folds: int,
        seed: int,
        min_df_key: str = "min_df",
    ) -> tuple["TfidfRidge", np.ndarray]:
        """(the fit on every text, out-of-fold predictions for the same texts).

        Each text's out-of-fold prediction comes from a ridge fitted without its fold, so on
        training texts it is as good as the full fit is on unseen ones: a model trained on top of
        it (train's `lexical_prior`) learns how far to trust it from honest values. The vocabulary
        is fitted once on every text: a term seen only in the held-out fold has no training row,
        so its coefficient stays 0 and nothing of that fold's labels leaks. Identical texts share
        a fold (a cross-model set holds one prompt once per model that answered it): otherwise a
        text's twin in the fitted folds would hand its out-of-fold prediction the answer."""
        from sklearn.linear_model import Ridge

        texts = list(texts)
        distinct, text_group = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
        if int(folds) < 2 or len(distinct) < int(folds):
            raise ValueError(
                f"lexical prior: folds must be 2 to {len(distinct)} (the distinct texts), got {int(folds)}"
            )
        vectorizer, x = cls.vectorize(texts, ngram_max=ngram_max, min_df=min_df, key=min_df_key)
        y = np.log1p(np.asarray(lengths, dtype=float))
        oof = np.empty(len(texts), dtype=np.float64)
        fold = (np.random.default_rng(int(seed)).permutation(len(distinct)) % int(folds))[text_group]
        for k in range(int(folds)):
            held_out = fold == k
            ridge = Ridge(alpha=float(alpha)).fit(x[~held_out], y[~held_out])
            oof[held_out] = x[held_out] @ ridge.coef_ + ridge.intercept_
        ridge = Ridge(alpha=float(alpha)).fit(x, y)
        return cls(vectorizer, ridge.coef_, ridge.intercept_), oof

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.empty(0, dtype=np.float64)
        return np.asarray(self.vectorizer.transform(texts) @ self.coef + self.intercept, dtype=np.float64)

    def same_as(self, other: "TfidfRidge") -> bool:
        """Whether `other` predicts exactly as this one (the lexical priors of one train model's
        methods: one fit on the same prompts), so one prediction serves both."""
        a, b = self.vectorizer, other.vectorizer

        def settings(v) -> dict:
            return {k: x for k, x in v.get_params().items() if k != "vocabulary"}

        def vocabulary(v) -> dict:  # a loaded model holds it as a parameter until its first transform
            return getattr(v, "vocabulary_", None) or v.vocabulary

        return (
            self.intercept == other.intercept
            and np.array_equal(self.coef, other.coef)
            and settings(a) == settings(b)
            and np.array_equal(a.idf_, b.idf_)
            and vocabulary(a) == vocabulary(b)
        )

    def save(self, out_dir: str | Path) -> dict:
        """Write the two files into `out_dir`; returns the settings that `load` needs."""
        from safetensors.numpy import save_file

        out = Path(out_dir)
        vocab = self.vectorizer.vocabulary_
        terms = [None] * len(vocab)
        for term, index in vocab.items():
            terms[index] = term
        (out / VOCAB_FILE).write_text(json.dumps(terms, ensure_ascii=False) + "\n", encoding="utf-8")
        save_file(
            {
                "idf": np.ascontiguousarray(self.vectorizer.idf_, dtype=np.float64),
                "coef": np.ascontiguousarray(self.coef, dtype=np.float64),
                "intercept": np.array([self.intercept], dtype=np.float64),
            },
            str(out / WEIGHTS_FILE),
        )
        return {"ngram_max": int(self.vectorizer.ngram_range[1]), "terms": len(terms)}

    @classmethod
    def load(cls, path: str | Path, *, ngram_max: int) -> "TfidfRidge":
        """The model `save` wrote; ValueError naming the file when it is damaged or inconsistent."""
        from safetensors.numpy import load_file
        from sklearn.feature_extraction.text import TfidfVectorizer

        try:  # what a damaged .safetensors file raises (a truncated header); absent in old releases
            from safetensors import SafetensorError
        except ImportError:
            SafetensorError = ValueError

        path = Path(path)
        try:
            terms = json.loads((path / VOCAB_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path / VOCAB_FILE}: lexical vocabulary could not be read ({exc})") from exc
        try:
            arrays = load_file(str(path / WEIGHTS_FILE))
        except (OSError, ValueError, SafetensorError) as exc:
            raise ValueError(f"{path / WEIGHTS_FILE}: lexical weights could not be read ({exc})") from exc
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms) or len(set(terms)) != len(terms):
            raise ValueError(f"{path / VOCAB_FILE}: not a list of distinct terms")
        if sorted(arrays) != ["coef", "idf", "intercept"]:
            raise ValueError(f"{path / WEIGHTS_FILE}: expected tensors coef, idf, intercept, got {sorted(arrays)}")
        if not len(arrays["idf"]) == len(arrays["coef"]) == len(terms) or len(arrays["intercept"]) != 1:
            raise ValueError(f"{path / WEIGHTS_FILE}: idf/coef sizes do not match the {len(terms)} terms")
        vectorizer = TfidfVectorizer(
            ngram_range=(1, int(ngram_max)),
            sublinear_tf=True,
            lowercase=True,
            vocabulary={t: i for i, t in enumerate(terms)},
        )
        vectorizer.idf_ = arrays["idf"]
        return cls(vectorizer, arrays["coef"], float(arrays["intercept"][0]))
