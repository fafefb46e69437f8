"""Examples from a registered seqio Task or Mixture (the seqio extra), for the infer job.

Kept apart from `inputs` so that reading files never needs seqio (nor TensorFlow, which it pulls
in); a missing extra is a one-line JobError saying how to install it.
"""

from __future__ import annotations

from speculative.data.inputs import Example
from speculative.errors import JobError

SEQIO_INSTALL = "pip install 'speculative[seqio]'  (or: pip install .[seqio] in the repository)"


def require_seqio():
    """The seqio package, or a JobError saying how to install the seqio extra."""
    try:
        import seqio
    except ImportError as e:
        raise JobError(
            f"a seqio Task/Mixture needs the seqio extra, which is missing ({e}): {SEQIO_INSTALL}"
        ) from e
    return seqio


def read_task(name: str, split: str, limit: int | None) -> list[Example]:
    """The first `limit` examples of a registered seqio Task/Mixture split, in dataset order (no
    shuffle). ids are seqio's token ids of "inputs", untrimmed (EOS appended where the Task adds
    it): `encode` trims them as it trims text, so a long input is reported (`truncated_from`) or
    refused (STRICT_INPUTS) as a file's would be. Raises JobError when the split is empty or seqio
    is missing."""
    seqio = require_seqio()
    dataset = seqio.get_mixture_or_task(name).get_dataset(
        sequence_length=None, split=split, shuffle=False, num_epochs=1, trim_output_features=False
    )
    if limit is not None:
        dataset = dataset.take(limit)
    examples = []
    for i, ex in enumerate(dataset.as_numpy_iterator()):
        text = ex.get("inputs_pretokenized", b"")
        targets = ex.get("targets_pretokenized")
        examples.append(
            Example(
                index=i,
                inputs=text.decode("utf-8") if isinstance(text, bytes) else str(text),
                targets=targets.decode("utf-8") if isinstance(targets, bytes) else None,
                ids=tuple(int(t) for t in ex["inputs"]),
            )
        )
    if not examples:
        raise JobError(f"seqio task {name!r} split {split!r} is empty")
    return examples
