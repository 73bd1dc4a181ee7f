"""Tokenizer shrinking on real tokenizers built here with the libraries (BPE, SentencePiece,
WordPiece), from local model directories like a hub clone."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")

TEXTS = ["Tiny models load in 0.5 s: run(x=[1, 2]) -> {'ok': True}; 100% done!",
         "The parser, given --help, prints usage and exits with status 0.",
         "Zebra quokka jynx: vexed wizards fight; QUICK BROWN FOX ~ ^_^ @home #1 $5 & |pipe|"]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, "1")


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    """Real English + code text that ships with Python (the argparse and json sources)."""
    text = Path(argparse.__file__).read_text() + Path(json.__file__).read_text()
    return [ln for ln in text.splitlines() if ln.strip()]


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    """A local 'clone': llama config + a byte-level BPE tokenizer.json, end-of-text at the top id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<|pad|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(["<|endoftext|>"])
    eot = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eot)])
    d = tmp_path_factory.mktemp("bpe-model")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.save_pretrained(d)
    cfg = AutoConfig.for_model("llama", vocab_size=eot + 1, bos_token_id=eot, eos_token_id=eot,
                               pad_token_id=0, num_hidden_layers=4, hidden_size=256,
                               num_attention_heads=8, num_key_value_heads=8,
                               intermediate_size=512, architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(d)
    assert eot > 2900
    return d


@pytest.fixture(scope="session")
def spm_dir(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    """A local 'clone' of a T5-style model: spiece.model (unigram, byte fallback) and no
    tokenizer.json."""
    import sentencepiece as spm
    from transformers import AutoConfig

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=buf, vocab_size=1500, model_type="unigram",
        byte_fallback=True, character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        minloglevel=2)
    d = tmp_path_factory.mktemp("spm-model")
    (d / "spiece.model").write_bytes(buf.getvalue())
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "eos_token": "</s>", "unk_token": "<unk>",
         "pad_token": "<pad>"}))
    AutoConfig.for_model("t5", vocab_size=1500, pad_token_id=0, eos_token_id=1,
                         decoder_start_token_id=0, num_layers=3, d_model=64, num_heads=4,
                         d_kv=16, d_ff=128).save_pretrained(d)
    return d


def test_bpe_tokenizer_shrinks_and_round_trips(bpe_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from mldebug.tiny.make import make_tiny
    from mldebug.tiny.shrink import ShrinkSpec

    out = tmp_path / "tiny"
    r = make_tiny(str(bpe_dir), out, ShrinkSpec(vocab=512, explicit=frozenset({"vocab"})))
    assert r.tokenizer == {"kind": "shrunk-json", "vocab_before": 3001, "vocab_after": 512}
    tok = AutoTokenizer.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    assert len(tok) <= 512 and cfg.vocab_size == 512
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert max(ids) < 512
        assert tok.decode(ids) == text  # byte-level: exact
    # the special token moved from the top id into the vocab, in tokenizer and config alike
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id < 512
    assert cfg.eos_token_id == cfg.bos_token_id == tok.eos_token_id
    assert tok("hi")["input_ids"][-1] == tok.eos_token_id  # post-processor re-pointed
    src = json.loads((bpe_dir / "tokenizer.json").read_text())
    new = json.loads((out / "tokenizer.json").read_text())
    assert 0 < len(new["model"]["merges"]) < len(src["model"]["merges"])
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.architectures == ["LlamaForCausalLM"]


def test_sentencepiece_model_is_trimmed_and_gets_a_fast_equivalent(spm_dir: Path,
                                                                    tmp_path: Path) -> None:
    import sentencepiece as spm
    from transformers import AutoConfig, AutoTokenizer

    from mldebug.tiny.make import make_tiny
    from mldebug.tiny.shrink import ShrinkSpec

    out = tmp_path / "tiny-t5"
    r = make_tiny(str(spm_dir), out, ShrinkSpec(vocab=512, explicit=frozenset({"vocab"})))
    assert r.tokenizer is not None and r.tokenizer["kind"] == "shrunk-spm"
    assert r.tokenizer["vocab_before"] == 1500
    proc = spm.SentencePieceProcessor(model_file=str(out / "spiece.model"))
    assert proc.get_piece_size() <= 512
    fast = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = proc.encode(text)
        assert max(ids) < 512 and proc.decode(ids) == text
        fids = fast.encode(text, add_special_tokens=False)
        assert max(fids) < 512
        assert fast.decode(fids, skip_special_tokens=True) == text
    assert fast.encode("the parser prints usage", add_special_tokens=False) == \
        proc.encode("the parser prints usage")
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.pad_token_id, cfg.eos_token_id) == (0, 1)
    assert proc.id_to_piece(1) == "</s>" and proc.id_to_piece(0) == "<pad>"


def test_wordpiece_keeps_the_alphabet(corpus: list[str]) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from mldebug.errors import UsageError
    from mldebug.tiny.tokenizer import shrink_tokenizer_json

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"], show_progress=False))
    src = json.loads(tok.to_str())
    new, old_to_new = shrink_tokenizer_json(src, 300)
    small = Tokenizer.from_str(json.dumps(new))
    assert small.get_vocab_size() <= 300
    for text in TEXTS:
        enc = small.encode(text)
        # no character the source could encode becomes unknown
        assert max(enc.ids) < 300
        assert enc.tokens.count("[UNK]") == tok.encode(text).tokens.count("[UNK]")
    assert old_to_new[src["model"]["vocab"]["[SEP]"]] == small.token_to_id("[SEP]")
    with pytest.raises(UsageError, match="Pass --vocab"):
        shrink_tokenizer_json(src, 50)


def test_spm_wire_trim_keeps_other_fields(spm_dir: Path) -> None:
    from mldebug.tiny import spm

    data = (spm_dir / "spiece.model").read_bytes()
    trimmed, kept = spm.trim(data, 400)
    assert len(spm.read_pieces(trimmed)) == len(kept) <= 400
    assert spm.model_type(trimmed) == spm.model_type(data) == "unigram"
    # everything but the dropped pieces is byte-identical
    dropped = sum(len(p.raw) for i, p in enumerate(spm.read_pieces(data)) if i not in set(kept))
    assert len(data) - len(trimmed) == dropped


def test_no_tokenizer_in_source_trains_one(tmp_path: Path) -> None:
    from mldebug.tiny.tokenizer import make_tokenizer

    r = make_tokenizer(None, 300, tmp_path)
    assert r.kind == "trained" and r.vocab_size <= 300
    assert set(r.role_ids) == {"bos", "eos", "pad", "unk"}


def test_unigram_tokenizer_json_shrinks(spm_dir: Path) -> None:
    from tokenizers import Tokenizer

    from mldebug.tiny.tokenizer import shrink_tokenizer_json, spm_to_tokenizer_json

    src = spm_to_tokenizer_json((spm_dir / "spiece.model").read_bytes())
    assert src["model"]["type"] == "Unigram"
    new, old_to_new = shrink_tokenizer_json(src, 400)
    small = Tokenizer.from_str(json.dumps(new))
    assert small.get_vocab_size() <= 400
    assert new["model"]["vocab"][new["model"]["unk_id"]][0] == "<unk>"
    for text in TEXTS:
        ids = small.encode(text).ids
        assert max(ids) < 400 and small.decode(ids) == text
    for t in new["added_tokens"]:  # added tokens point at their own piece after renumbering
        assert new["model"]["vocab"][t["id"]][0] == t["content"]
    assert all(t["id"] in old_to_new for t in src["added_tokens"])
    assert {t["content"] for t in new["added_tokens"]} == {t["content"] for t in src["added_tokens"]}
