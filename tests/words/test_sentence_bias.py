from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsemm.text import STOP_WORDS, is_token, tokenize
from sparsemm.words.bias import sentence_bias
from sparsemm.words.spine import SparseWordVectors


def test_tokenize_rule() -> None:
    assert tokenize("A man's DOG, on 2 skis-and a frisbee!") == ["man", "dog", "skis", "frisbee"]
    assert tokenize("Don't stop") == ["stop"]  # "don" and "t" are stop words
    assert tokenize("café au lait") == ["café", "au", "lait"]
    assert tokenize("snake_case 3d") == ["snake", "case"]
    assert tokenize("") == []
    assert {"a", "the", "of", "with", "s", "t"} <= STOP_WORDS
    assert is_token("dog") and not is_token("the") and not is_token("u.s.")
    assert not is_token("Dog") and not is_token("1990")


def _toy_sparse() -> SparseWordVectors:
    matrix = sp.csr_matrix(
        np.array(
            [
                [1.0, 0.0, 0.5, 0.0],  # dog
                [0.0, 1.0, 0.0, 0.0],  # cat
                [0.0, 0.0, 1.0, 1.0],  # ball
            ],
            dtype=np.float32,
        )
    )
    return SparseWordVectors(["dog", "cat", "ball"], matrix)


def test_sentence_bias_hand_example() -> None:
    captions = [
        "A dog and a dog chasing the ball!",  # dog x2 + ball; "chasing" unknown
        "The cat.",
        "Nothing known here 123",  # no known word -> zero row
        "",
        "DOG",
    ]
    bias = sentence_bias(captions, _toy_sparse())
    assert isinstance(bias, sp.csr_matrix) and bias.dtype == np.float32
    expected = np.array(
        [
            [2 / 3, 0, 2 / 3, 1 / 3],  # (2*dog + ball) / 3 = [2, 0, 2, 1] / 3, norm 3
            [0, 1, 0, 0],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
            [1 / np.sqrt(1.25), 0, 0.5 / np.sqrt(1.25), 0],
        ]
    )
    np.testing.assert_allclose(bias.toarray(), expected, rtol=1e-6, atol=1e-7)
    assert bias[2].nnz == 0 and bias[3].nnz == 0


def test_sentence_bias_equals_naive_loop() -> None:
    rng = np.random.default_rng(0)
    words = [f"w{chr(97 + i)}{chr(97 + j)}" for i in range(5) for j in range(6)]
    dense = rng.random((len(words), 12)) * (rng.random((len(words), 12)) < 0.3)
    sv = SparseWordVectors(words, sp.csr_matrix(dense.astype(np.float32)))
    captions = [" ".join(rng.choice([*words, "the", "unknown"], size=5)) for _ in range(40)]
    fast = sentence_bias(captions, sv).toarray()
    for c, caption in enumerate(captions):
        rows = [sv.index[t] for t in tokenize(caption) if t in sv]
        ref = dense[rows].mean(axis=0) if rows else np.zeros(12)
        norm = np.linalg.norm(ref)
        ref = ref / norm if norm > 0 else ref
        np.testing.assert_allclose(fast[c], ref, rtol=1e-5, atol=1e-6)
