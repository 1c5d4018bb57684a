"""Corpus reading and chunking (no encoder needed)."""
import pytest

from medclaw.errors import ConfigError
from medclaw.kb.passages import ChunkConfig, chunk_text, read_corpus


def _words(n, start=0):
    return " ".join(f"w{i}" for i in range(start, start + n))


def test_short_paragraphs_pack_into_one_chunk():
    text = f"{_words(10)}\n\n{_words(10, 10)}"
    assert chunk_text(text, ChunkConfig(max_words=30, overlap_words=5)) == [
        f"{_words(10)}\n\n{_words(10, 10)}"]


def test_chunks_respect_limit_and_overlap():
    config = ChunkConfig(max_words=20, overlap_words=5)
    text = "\n\n".join(_words(12, 12 * i) for i in range(4))          # 48 words, 4 paragraphs
    chunks = chunk_text(text, config)
    assert len(chunks) > 1
    for previous, chunk in zip(chunks, chunks[1:]):
        assert len(chunk.split()) <= config.max_words
        # each chunk starts with the last overlap_words words of the one before
        assert chunk.split()[:5] == previous.split()[-5:]
    seen = {w for c in chunks for w in c.split()}
    assert seen == {f"w{i}" for i in range(48)}                       # nothing lost


def test_long_paragraph_is_cut_into_windows():
    config = ChunkConfig(max_words=16, overlap_words=4)
    chunks = chunk_text(_words(50), config)
    assert all(len(c.split()) <= 16 for c in chunks)
    assert {w for c in chunks for w in c.split()} == {f"w{i}" for i in range(50)}


def test_list_lines_keep_their_line_breaks():
    chunk, = chunk_text("Steps:\n- clip\n- cut", ChunkConfig())
    assert chunk == "Steps:\n- clip\n- cut"


@pytest.mark.parametrize("max_words, overlap", [(8, 0), (40, 30), (40, -1)])
def test_bad_chunk_config(max_words, overlap):
    with pytest.raises(ConfigError):
        ChunkConfig(max_words=max_words, overlap_words=overlap)


def test_markdown_sections_titles_and_frontmatter(tmp_path):
    (tmp_path / "a.md").write_text(
        "---\ntype: Anatomy\nsource: atlas p.3\n---\n# Gallbladder\n\nIntro text.\n\n"
        "## Ducts\n\nThe cystic duct.\n\n### Variants\n\nA long cystic duct.\n\n"
        "```\n# not a heading\n```\n")
    passages, files = read_corpus(tmp_path)
    assert files == [tmp_path / "a.md"]
    assert [p.title for p in passages] == ["Gallbladder", "Gallbladder › Ducts",
                                           "Gallbladder › Ducts › Variants"]
    assert {p.type for p in passages} == {"anatomy"} and {p.source for p in passages} == {"atlas p.3"}
    assert "# not a heading" in passages[-1].text
    assert [p.chunk_id for p in passages] == ["a.md#0", "a.md#1", "a.md#2"]


def test_hidden_and_unsupported_files_are_skipped(tmp_path):
    (tmp_path / ".hidden.md").write_text("secret")
    (tmp_path / "data.csv").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("Nested passage.")
    passages, files = read_corpus(tmp_path)
    assert [p.chunk_id for p in passages] == ["sub/b.txt#0"]
