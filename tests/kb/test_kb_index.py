"""Knowledge base end to end with the REAL local MiniLM encoder and REAL FAISS.

The temp corpus mixes the three input formats (.md with frontmatter and headings, .txt, .jsonl)
and four passage types, so ranking, filtering and round-tripping are checked on real embeddings.
"""
import json

import pytest

from medclaw.errors import MedClawError
from medclaw.kb.build import INDEX_FILE, MANIFEST_FILE, PASSAGES_FILE, build_index, current_index
from medclaw.kb.errors import (CorpusFormatError, CorpusNotFoundError, EmptyCorpusError,
                               EncoderNotFoundError, IndexCorruptError, IndexNotFoundError,
                               KnowledgeBaseError, UnknownPassageTypeError)
from medclaw.kb.search import Hit, KnowledgeBase

CORPUS = {
    "clip.md": "---\ntype: instrument\n---\n# Clip applier\n\nThe clip applier closes a titanium "
               "clip across the cystic duct or cystic artery to seal it before it is cut.\n",
    "hook.md": "---\ntype: instrument\n---\n# Electrocautery hook\n\nAn L-shaped metal hook that "
               "burns through thin tissue with monopolar current, producing white smoke.\n",
    "anatomy.txt": "The common bile duct is formed where the cystic duct joins the common hepatic "
                   "duct. It drains bile from the liver to the duodenum.\n",
    "more.jsonl": "\n".join(json.dumps(r) for r in [
        {"text": "Brisk arterial bleeding from the cystic artery is controlled with pressure, "
                 "suction and a clip once the vessel is seen.", "title": "Bleeding",
         "type": "Complication", "source": "notes"},
        {"text": "Suturing: the needle driver holds a curved needle that is rotated through the "
                 "tissue, then an intracorporeal knot is tied.", "title": "Suturing",
         "type": "technique"},
    ]) + "\n",
}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for name, text in CORPUS.items():
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def built(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("kb") / "index"
    result = build_index(corpus_dir, out, progress=False)
    return result, KnowledgeBase.load(out)


def test_build_writes_a_complete_index(built, corpus_dir):
    result, kb = built
    assert result.count == len(kb) == 5 and result.num_files == 4 and result.dim == 384
    manifest = json.loads((kb.index_dir / MANIFEST_FILE).read_text())
    assert manifest["count"] == 5 and manifest["encoder"]["name"] == "all-MiniLM-L6-v2"
    assert manifest["encoder"]["dim"] == 384 and len(manifest["corpus"]["sha256"]) == 64
    assert manifest["types"] == kb.types
    assert kb.types == ["complication", "general", "instrument", "technique"]
    rows = [json.loads(l) for l in (kb.index_dir / PASSAGES_FILE).read_text().splitlines()]
    assert {r["chunk_id"] for r in rows} == {"clip.md#0", "hook.md#0", "anatomy.txt#0",
                                              "more.jsonl:1#0", "more.jsonl:2#0"}
    by_id = {r["chunk_id"]: r for r in rows}
    assert by_id["clip.md#0"]["title"] == "Clip applier"
    assert by_id["anatomy.txt#0"]["title"] == "anatomy" and by_id["anatomy.txt#0"]["type"] == "general"
    assert by_id["more.jsonl:1#0"]["source"] == "notes"
    assert by_id["more.jsonl:2#0"]["source"] == "more.jsonl:2"     # default source: file:line


@pytest.mark.parametrize("query, expected", [
    ("which instrument seals the duct with a clip", "clip.md#0"),
    ("device that cuts tissue with electric current and makes smoke", "hook.md#0"),
    ("how is bleeding from an artery stopped", "more.jsonl:1#0"),
    ("tying a knot with a needle", "more.jsonl:2#0"),
    ("where does bile drain into the intestine", "anatomy.txt#0"),
])
def test_relevant_passage_ranks_first(built, query, expected):
    hits = built[1].search(query, k=3)
    assert len(hits) == 3 and all(isinstance(h, Hit) for h in hits)
    assert hits[0].chunk_id == expected
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0001


def test_type_filter(built):
    kb = built[1]
    hits = kb.search("how is bleeding from an artery stopped", k=5, type="instrument")
    assert [h.type for h in hits] == ["instrument", "instrument"]       # only two exist
    assert hits[0].chunk_id == "clip.md#0"                               # mentions the artery
    assert kb.search("bleeding", k=5, type="COMPLICATION")[0].type == "complication"
    assert len(kb.search("anything", k=10)) == 5                         # k past the corpus size


def test_unknown_type_lists_known_types(built):
    with pytest.raises(UnknownPassageTypeError) as err:
        built[1].search("clip", type="recipe")
    message = str(err.value)
    assert "recipe" in message and "instrument" in message and "technique" in message
    assert "\n" not in message


@pytest.mark.parametrize("query, k", [("   ", 3), ("clip", 0), ("clip", 101)])
def test_bad_query_arguments(built, query, k):
    with pytest.raises(KnowledgeBaseError):
        built[1].search(query, k=k)


def test_round_trip_from_disk_gives_identical_results(built):
    _, kb = built
    again = KnowledgeBase.load(kb.index_dir)
    query = "sealing a vessel before cutting it"
    assert [h.to_dict() for h in again.search(query, k=4)] == [h.to_dict() for h in kb.search(query, k=4)]


def test_rebuild_of_same_corpus_has_same_hash(built, corpus_dir, tmp_path):
    result = build_index(corpus_dir, tmp_path / "again", progress=False)
    assert result.manifest["corpus"]["sha256"] == built[0].manifest["corpus"]["sha256"]
    (corpus_dir / "extra.txt").write_text("A trocar is the pointed obturator inside a port.\n")
    try:
        changed = build_index(corpus_dir, tmp_path / "changed", progress=False)
    finally:
        (corpus_dir / "extra.txt").unlink()
    assert changed.count == 6
    assert changed.manifest["corpus"]["sha256"] != result.manifest["corpus"]["sha256"]


def _assert_one_line(err):
    assert isinstance(err.value, MedClawError)
    assert str(err.value) and "\n" not in str(err.value)


def test_build_errors_are_typed_and_one_line(tmp_path):
    with pytest.raises(CorpusNotFoundError) as err:
        build_index(tmp_path / "nope", tmp_path / "out")
    _assert_one_line(err)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.md").write_text("\n\n")
    (empty / "ignored.csv").write_text("text\nnot a corpus format\n")
    with pytest.raises(EmptyCorpusError) as err:
        build_index(empty, tmp_path / "out")
    _assert_one_line(err)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.jsonl").write_text('{"text": "fine"}\n{"title": "no text"}\n')
    with pytest.raises(CorpusFormatError) as err:
        build_index(bad, tmp_path / "out")
    _assert_one_line(err)
    assert "x.jsonl:2" in str(err.value)
    with pytest.raises(EncoderNotFoundError) as err:
        build_index(_one_file(tmp_path), tmp_path / "out",
                    encoder=tmp_path / "no-encoder")
    _assert_one_line(err)
    not_model = tmp_path / "not-a-model"
    not_model.mkdir()
    with pytest.raises(EncoderNotFoundError) as err:
        build_index(_one_file(tmp_path), tmp_path / "out", encoder=not_model)
    _assert_one_line(err)
    assert not (tmp_path / "out" / MANIFEST_FILE).exists()


def _one_file(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("A single passage about graspers.\n")
    return path


def test_load_errors_are_typed_and_one_line(built, tmp_path):
    with pytest.raises(IndexNotFoundError) as err:
        KnowledgeBase.load(tmp_path / "missing")
    _assert_one_line(err)
    with pytest.raises(IndexNotFoundError) as err:
        KnowledgeBase.load(tmp_path)                                   # a folder, not an index
    _assert_one_line(err)

    import shutil

    src = built[1].index_dir
    for name, damage in [(INDEX_FILE, b"not a faiss index"),
                         (MANIFEST_FILE, b"{not json"),
                         (PASSAGES_FILE, b'{"text": "only one row", "title": "", "type": "x", '
                                         b'"source": "", "chunk_id": "a"}\n')]:
        copy = tmp_path / f"damaged-{name}"
        shutil.copytree(src, copy)
        (copy / name).write_bytes(damage)
        with pytest.raises(IndexCorruptError) as err:
            KnowledgeBase.load(copy)
        _assert_one_line(err)


def test_a_query_encoder_other_than_the_index_s_is_refused_at_load(built, tmp_path):
    """The `encoder` role names the model that embeds queries; vectors of another model are not
    comparable with the index's, so load refuses it in one line, before anything is loaded."""
    import shutil

    from medclaw.kb.encoder import default_encoder_path

    _, kb = built
    assert KnowledgeBase.load(kb.index_dir, encoder=default_encoder_path()).manifest == kb.manifest
    other = tmp_path / "other-encoder"
    shutil.copytree(default_encoder_path(), other)
    with pytest.raises(EncoderNotFoundError, match="not the one the index") as info:
        KnowledgeBase.load(kb.index_dir, encoder=other)
    _assert_one_line(info)


def test_current_index_is_kept_only_when_a_rebuild_would_write_the_same(built, corpus_dir, tmp_path):
    """`current_index` (what `medclaw demo` uses to skip a rebuild): the manifest when the folder
    holds what `build_index` would write again; None for every input a rebuild would change, and
    for a folder that is missing or damaged (so the caller rebuilds instead of failing)."""
    import shutil

    from medclaw.kb.encoder import default_encoder_path
    from medclaw.kb.passages import ChunkConfig

    result, kb = built
    assert current_index(corpus_dir, kb.index_dir) == result.manifest
    assert current_index(corpus_dir, kb.index_dir, encoder=default_encoder_path()) == result.manifest
    assert current_index(corpus_dir, kb.index_dir, chunking=ChunkConfig(max_words=64)) is None
    other_encoder = tmp_path / "other-encoder"
    shutil.copytree(default_encoder_path(), other_encoder)
    assert current_index(corpus_dir, kb.index_dir, encoder=other_encoder) is None
    changed = tmp_path / "changed-corpus"
    shutil.copytree(corpus_dir, changed)
    assert current_index(changed, kb.index_dir) == result.manifest          # same bytes, same hash
    (changed / "hook.md").write_text(CORPUS["hook.md"].replace("white smoke", "grey smoke"))
    assert current_index(changed, kb.index_dir) is None
    assert current_index(tmp_path / "no-corpus", kb.index_dir) is None
    assert current_index(corpus_dir, tmp_path / "no-index") is None
    damaged = tmp_path / "damaged"
    shutil.copytree(kb.index_dir, damaged)
    (damaged / INDEX_FILE).write_bytes(b"not a faiss index")
    assert current_index(corpus_dir, damaged) is None
