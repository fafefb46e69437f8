import numpy as np
import pytest

from speculative import inputs


def test_decoder_batch_right_pads():
    batch = inputs.decoder_batch([[5, 6, 7], [8], [9, 10]])
    np.testing.assert_array_equal(batch["prompt"], [[5, 6, 7], [8, 0, 0], [9, 10, 0]])
    np.testing.assert_array_equal(batch["prompt_lengths"], [3, 1, 2])


def test_decoder_batch_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        inputs.decoder_batch([[1], []])
    with pytest.raises(ValueError, match="no prompts"):
        inputs.decoder_batch([])


def test_encoder_batch_pads_with_zero():
    batch = inputs.encoder_batch([[4, 5], [6, 7, 8]])
    np.testing.assert_array_equal(batch["encoder_input_tokens"], [[4, 5, 0], [6, 7, 8]])
