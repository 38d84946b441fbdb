"""Sequence models without Spark: the text corpus's windows and file-level split, labels per position through
the data pipeline and the checks, the loss metric against hand-computed values, the transformer's contract."""
import math
import os

import numpy as np
import pyarrow as pa
import pytest
import torch

from mpca.config import settings_from
from mpca.data.arrow import batch_arrays
from mpca.data.checks import check_batch, tokens_outside
from mpca.data.holdout import decode_rows
from mpca.data.text import TextCorpus, file_fraction, windows
from mpca.errors import UserError
from mpca.evaluation import evaluate
from mpca.models import ByteTransformer, cross_entropy
from mpca.progress import Progress
from mpca.stopping import StopRules


def test_windows_hold_the_next_byte_of_every_position_and_drop_the_short_tail():
    x, y = windows(b"abcdefghij", 3)  # 10 bytes: (10 - 1) // 3 = 3 windows; the tail "j" is only a label
    assert x.tolist() == [[97, 98, 99], [100, 101, 102], [103, 104, 105]]
    assert y.tolist() == [[98, 99, 100], [101, 102, 103], [104, 105, 106]]
    assert windows(b"abc", 3)[0].shape == (0, 3)  # no window without its next byte
    assert windows(bytes([200, 255, 0]), 2)[0].tolist() == [[200, 255]]  # bytes, not signed: 0..255


def _corpus(tmp_path, files: int = 40):
    for i in range(files):
        sub = tmp_path / f"pkg{i % 4}"
        sub.mkdir(exist_ok=True)
        (sub / f"m{i}.py").write_text(f"# file {i}\n" + "x = 1\n" * (5 + i))
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "other.py").write_text("not ours\n" * 10)
    (tmp_path / "notes.txt").write_text("not python\n" * 10)
    return TextCorpus(root=str(tmp_path), window=8, holdout=0.25, seed=3)


def test_the_split_is_by_file_deterministic_and_no_file_is_on_both_sides(tmp_path):
    corpus = _corpus(tmp_path)
    files = corpus.files()
    assert not set(files["train"]) & set(files["holdout"])
    assert len(files["train"]) + len(files["holdout"]) == 40  # site-packages and .txt left out
    assert all(not f.startswith("site-packages") for f in files["train"] + files["holdout"])
    expected = sorted(f for f in files["train"] + files["holdout"] if file_fraction(f, 3) < 0.25)
    assert files["holdout"] == expected and 0 < len(expected) < 40
    again = TextCorpus(root=str(tmp_path), window=8, holdout=0.25, seed=3).files()
    assert again == files  # the same split every time
    # every holdout window is a window of a holdout file: none of them appears in training
    hx, _ = corpus.arrays("holdout")
    own = np.concatenate([windows((tmp_path / f).read_bytes(), 8)[0] for f in files["holdout"]])
    assert np.array_equal(hx, own)


def test_file_fraction_is_sha256_of_seed_and_path():
    import hashlib

    digest = hashlib.sha256(b"0:json/decoder.py").digest()
    assert file_fraction("json/decoder.py", 0) == int.from_bytes(digest[:8], "big") / 2.0 ** 64


def test_max_mb_keeps_whole_files_within_the_budget(tmp_path):
    corpus = _corpus(tmp_path)
    total = sum(os.path.getsize(tmp_path / f) for side in corpus.files().values() for f in side)
    small = TextCorpus(root=str(tmp_path), window=8, holdout=0.25, seed=3, max_mb=total / 2e6)
    kept = [f for side in small.files().values() for f in side]
    assert 0 < len(kept) < 40 and sum(os.path.getsize(tmp_path / f) for f in kept) <= total / 2


def test_a_corpus_directory_without_text_is_one_line(tmp_path):
    with pytest.raises(UserError, match="holds no .py files"):
        TextCorpus(root=str(tmp_path)).files()
    with pytest.raises(UserError, match="does not exist"):
        TextCorpus(root=str(tmp_path / "missing")).files()


def test_the_corpus_table_feeds_the_pipeline_with_labels_per_position(tmp_path):
    table = _corpus(tmp_path).table("train")
    assert table.schema.field("label").type == pa.list_(pa.int16())
    x, y = batch_arrays(table.to_batches()[0], "features", "label", (8,))
    assert x.dtype == np.float32 and x.shape[1:] == (8,) and y.shape == x.shape
    assert np.array_equal(x[:, 1:], y[:, :-1])  # the label of position t is the feature of position t + 1


def test_ragged_sequences_are_refused():
    b = pa.record_batch({"f": pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0, 8.0]]), "l": pa.array([0, 1])})
    with pytest.raises(ValueError, match="ragged"):
        batch_arrays(b, "f", "l", ())  # 8 values over 2 rows: a width of 4 on average, but rows of 3 and 5


def test_holdout_rows_keep_their_labels_per_position():
    from mpca.data.holdout import HoldoutKeeper, HASH_COLUMN

    keeper = HoldoutKeeper(cut=10**6, max_rows=5, features="f", label="l", input_shape=(2,))
    b = pa.record_batch({"f": pa.array([[1.0, 2.0], [3.0, 4.0]]), "l": pa.array([[2, 3], [4, 5]]),
                         HASH_COLUMN: pa.array([7, -3], pa.int64())})
    assert list(keeper.training_batches([b]))[0].num_rows == 0  # every row held out (cut above every bucket)
    header, payload = keeper.rows_up_to(100)
    x, y, h = decode_rows([(header, payload)], 5, (2,))
    assert h.tolist() == [-3, 7] and y.tolist() == [[4, 5], [2, 3]] and x.tolist() == [[3.0, 4.0], [1.0, 2.0]]


def test_cross_entropy_per_position_against_hand_computed_values():
    # two rows of two positions, three classes; logits chosen so each softmax is easy to write down
    out = torch.tensor([[[0.0, 0.0, 0.0], [math.log(2.0), 0.0, 0.0]],
                        [[0.0, math.log(3.0), 0.0], [0.0, 0.0, 0.0]]])
    y = torch.tensor([[0, 0], [1, 2]])
    # -log p: 1/3, 2/4, 3/5, 1/3
    expected = (math.log(3) + math.log(2) + math.log(5 / 3) + math.log(3)) / 4
    assert float(cross_entropy(out, y)) == pytest.approx(expected, rel=1e-6)


def test_evaluate_counts_errors_per_token_and_reports_nats():
    class Fixed(torch.nn.Module):
        def forward(self, x):  # predicts class 0 at every position, with p = 1/2 (logits log 2, 0)
            return torch.tensor([math.log(2.0), 0.0]).expand(x.shape[0], x.shape[1], 2)

    x = torch.zeros(3, 4)
    y = torch.tensor([[0, 0, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0]])
    r = evaluate(Fixed(), x, y, cross_entropy, batch_size=2)
    assert r.error == pytest.approx(4 / 12)  # 4 of 12 tokens wrong, not 2 of 3 rows
    # -log(2/3) for class 0, -log(1/3) for class 1: 8 and 4 of 12 tokens
    assert r.loss == pytest.approx((8 * math.log(1.5) + 4 * math.log(3.0)) / 12)


def test_check_batch_finds_the_vocabulary_of_a_sequence_model_and_refuses_labels_outside_it():
    model_fn = lambda: ByteTransformer(vocab_size=16, context=8, width=16, layers=1, heads=2)  # noqa: E731
    opt = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    x, y = torch.randint(0, 16, (2, 8)).float(), torch.randint(0, 16, (2, 8))
    assert check_batch(model_fn, cross_entropy, opt, x, y, (0, 15)) == 16
    with pytest.raises(UserError, match="labels reach 16 but the model outputs 16 classes"):
        check_batch(model_fn, cross_entropy, opt, x, y, (0, 16))
    with pytest.raises(UserError, match="token ids must lie in 0..15"):
        check_batch(model_fn, cross_entropy, opt, x + 16, y, (0, 15))
    assert tokens_outside(0, 255, "features", 256) is None
    assert "vocabulary is 0..255" in tokens_outside(0, 300, "features", 256)


def test_the_transformer_is_causal_and_sized_as_documented():
    torch.manual_seed(0)
    m = ByteTransformer().eval()
    assert 1.0e6 < sum(p.numel() for p in m.parameters()) < 1.1e6
    x = torch.randint(0, 256, (2, 16)).float()
    later = x.clone()
    later[:, 10:] = (later[:, 10:] + 7) % 256
    with torch.no_grad():
        a, b = m(x), m(later)
    assert a.shape == (2, 16, 256)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-5)  # a position sees only its prefix
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_the_metric_and_its_target_go_together():
    s = settings_from(metric="loss", target_loss=1.5)
    assert s.stop.target == 1.5
    rules = StopRules(s.stop, 0.0, metric="loss")
    assert rules.target_met(1.5) and not rules.target_met(1.51) and not rules.target_met(float("nan"))
    assert rules.reason(1, 0.0, True) == "target_loss"
    with pytest.raises(UserError, match="stop.target_loss needs eval.metric: loss"):
        settings_from(target_loss=1.5)
    with pytest.raises(UserError, match="stop.target_error needs eval.metric: error"):
        settings_from(metric="loss", target_error=0.1)


def test_the_progress_line_follows_the_loss_in_nats_and_bits():
    p = Progress("off", target=2.0, metric="loss")
    p.update(3, 2.5)
    assert "holdout loss 2.500 nats (3.607 bits)" in p.line() and "to 2.000" in p.line()


def test_a_spilled_partition_keeps_its_labels_per_position(tmp_path):
    from mpca.data.spill import load_partition

    b = pa.record_batch({"f": pa.array([[1.0, 2.0], [3.0, 4.0]]), "l": pa.array([[1, 2], [3, 4]])})
    part = load_partition([b, b], "f", "l", (2,), budget_mb=0, directory=str(tmp_path))  # on disk at once
    assert part.directory is not None and part.labels.tolist() == [[1, 2], [3, 4], [1, 2], [3, 4]]
