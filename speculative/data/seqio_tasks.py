"""seqio Task definitions for the jobs: the paper's Table 2 datasets and local TSV files.

Imported only when seqio is installed (`pip install .[seqio]`); the jobs reach it through
`speculative.jobs.config.seqio_tasks_module`, which explains how to install seqio when it is missing.
Reading a registered Task's examples is `speculative.data.seqio_inputs.read_task`.

Table 2 tasks (TFDS sources; need TFDS data access, e.g. a Cloud TPU VM with gs://tfds-data or a
prepared TFDS_DATA_DIR), with T5's preprocessing written out here (the `t5` package is not needed):
  speculative_wmt_t2t_ende    wmt_t2t_translate/de-en:1.0.0,
                              inputs "translate English to German: {en}", targets "{de}"
  speculative_cnn_dailymail   cnn_dailymail:3.4.0, inputs "summarize: {article}", targets "{highlights}"
Both tokenize with T5's SentencePiece vocabulary (32000 pieces + 100 extra ids) and append EOS
after trimming to the feature lengths, as T5's wmt_t2t_ende_v003 and cnn_dailymail_v002 do.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import seqio
import tensorflow as tf

T5_VOCABULARY = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
WMT_ENDE = "speculative_wmt_t2t_ende"
CNN_DM = "speculative_cnn_dailymail"


def vocabulary(spec: str) -> seqio.Vocabulary:
    """'byte' -> seqio.ByteVocabulary; otherwise a SentencePiece model path (T5's 100 extra ids)."""
    if spec == "byte":
        return seqio.ByteVocabulary()
    return seqio.SentencePieceVocabulary(spec, extra_ids=100)


def _features(vocab: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    return {
        "inputs": seqio.Feature(vocabulary=vocab, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary=vocab, add_eos=True),
    }


def _add(name: str, **kwargs) -> str:
    """Registers a task, replacing an earlier registration of the same name (idempotent)."""
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, **kwargs)
    return name


@seqio.map_over_dataset
def _prefix_pair(x: Mapping[str, tf.Tensor], inputs_key: str, targets_key: str, prefix: str):
    """T5 text-to-text preprocessing: {"inputs": prefix + x[inputs_key], "targets": x[targets_key]}."""
    return {
        "inputs": tf.strings.join([prefix, x[inputs_key]]),
        "targets": x[targets_key],
    }


def _parse_tsv(line: tf.Tensor) -> dict[str, tf.Tensor]:
    inputs, targets = tf.io.decode_csv(
        line, record_defaults=["", ""], field_delim="\t", use_quote_delim=False
    )
    return {"inputs": inputs, "targets": targets}


def _tsv_pairs(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return dataset.map(_parse_tsv, num_parallel_calls=tf.data.AUTOTUNE)


def _text_to_text(inputs_key: str, targets_key: str, prefix: str) -> list:
    return [
        functools.partial(
            _prefix_pair, inputs_key=inputs_key, targets_key=targets_key, prefix=prefix
        ),
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ]


def add_tsv_task(name: str, path: str, prefix: str, vocab: str, split: str) -> str:
    """A Task over a local TSV of `input<TAB>target` lines (e.g. tests/data/en_de_pairs.tsv)."""
    return _add(
        name,
        source=seqio.TextLineDataSource({split: path}, cycle_length=1),
        preprocessors=[_tsv_pairs] + _text_to_text("inputs", "targets", prefix),
        output_features=_features(vocabulary(vocab)),
    )


def add_ende_task(data_dir: str, vocab: str, name: str = "speculative_ende_mini") -> str:
    """The EnDe reproduction's Task over `speculative.ende_data`'s splits (train / validation /
    test .tsv in data_dir, and "heldout" = validation then test, for measurements that want more
    tokens than one split holds), T5's prefix "translate English to German: ", EOS appended.
    vocab: the SentencePiece model `ende_data` trained (or "byte")."""
    files = {split: f"{data_dir}/{split}.tsv" for split in ("train", "validation", "test")}
    files["heldout"] = [files["validation"], files["test"]]
    return _add(
        name,
        source=seqio.TextLineDataSource(files, cycle_length=1),
        preprocessors=[_tsv_pairs]
        + _text_to_text("inputs", "targets", "translate English to German: "),
        output_features=_features(vocabulary(vocab)),
    )


def add_paper_tasks(vocab: str = T5_VOCABULARY) -> tuple[str, str]:
    """Registers the two Table 2 tasks (TFDS sources are opened lazily, at get_dataset)."""
    features = _features(vocabulary(vocab))
    wmt = _add(
        WMT_ENDE,
        source=seqio.TfdsDataSource(tfds_name="wmt_t2t_translate/de-en:1.0.0"),
        preprocessors=_text_to_text("en", "de", "translate English to German: "),
        output_features=features,
    )
    cnn = _add(
        CNN_DM,
        source=seqio.TfdsDataSource(tfds_name="cnn_dailymail:3.4.0"),
        preprocessors=_text_to_text("article", "highlights", "summarize: "),
        output_features=features,
    )
    return wmt, cnn
