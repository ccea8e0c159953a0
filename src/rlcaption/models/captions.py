"""Caption tensors every model reads alike: which tokens of a generated caption count, and word vectors embedded."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["caption_token_mask", "soft_word_embeddings"]


def caption_token_mask(sequences: torch.LongTensor, eos_token_id: int) -> torch.Tensor:
    """
    Marks the predicted tokens of generated sequences: every token after the start token up to and including the
    first end token (so that padding, even when it shares the end token's id, is excluded).

    Args:
        sequences (`torch.LongTensor` of shape `(N, T)`): generated ids, the start token first.

    Returns:
        `torch.FloatTensor` of shape `(N, T - 1)`, aligned with [`token_log_probs`].
    """
    targets = sequences[:, 1:]  # (N, T-1)
    is_eos = (targets == eos_token_id).long()
    ends_before = is_eos.cumsum(dim=1) - is_eos  # number of end tokens strictly before each position
    return (ends_before == 0).float()


def soft_word_embeddings(words: torch.Tensor, embedding_matrix: torch.Tensor | nn.Embedding) -> torch.FloatTensor:
    """
    Embeds word vectors over the vocabulary, one-hot or soft: `words @ embedding_matrix`. For a one-hot this is the
    token's embedding; for a distribution, the expected embedding. Pass the result as `inputs_embeds`-style input.

    Args:
        words (`torch.FloatTensor` of shape `(..., vocab_size)`): e.g. [`PassedWords.words`] `(B, T, V)`.
        embedding_matrix (`torch.FloatTensor` of shape `(vocab_size, embedding_size)` or `nn.Embedding`): any
            network's word embeddings over the same vocabulary.

    Returns:
        `torch.FloatTensor` of shape `(..., embedding_size)`, in the dtype of the embedding matrix.

    An `nn.Embedding` sharded by FSDP2 embeds through its method `soft_words` where it has one (see
    `rlcaption.generation.captioners.gather_parameters_in_methods`), which gathers the matrix for the product.
    """
    if isinstance(embedding_matrix, nn.Embedding):
        if "soft_words" in embedding_matrix.__dict__:
            return embedding_matrix.soft_words(words)
        embedding_matrix = embedding_matrix.weight
    if embedding_matrix.dim() != 2 or words.shape[-1] != embedding_matrix.shape[0]:
        raise ValueError(
            f"words over a vocabulary of {words.shape[-1]} need an embedding matrix of shape ({words.shape[-1]}, "
            f"embedding_size); got {tuple(embedding_matrix.shape)}."
        )
    return words.to(embedding_matrix.dtype) @ embedding_matrix
