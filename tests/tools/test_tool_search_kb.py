"""search_surgical_kb over a REAL index (FAISS + the local MiniLM encoder) on a tiny corpus."""
import pytest

from medclaw.tools.registry import default_registry

CORPUS = {
    "cvs.md": "---\ntype: guideline\n---\n# Critical view of safety\n\nThe hepatocystic triangle "
              "is cleared of fat and fibrous tissue; two and only two structures enter the "
              "gallbladder; the lower third of the gallbladder is separated from the liver bed.\n",
    "clips.md": "---\ntype: instrument\n---\n# Clip applier\n\nThe clip applier places titanium "
                "clips on the cystic duct and cystic artery before they are divided with scissors.\n",
    "bleed.md": "---\ntype: guideline\n---\n# Bleeding control\n\nMinor oozing from the liver bed "
                "is controlled with irrigation, suction and gentle pressure; brisk arterial "
                "bleeding needs a clip or conversion.\n",
}


@pytest.fixture(scope="module")
def knowledge_base(tmp_path_factory):
    from medclaw.kb.build import build_index
    from medclaw.kb.search import KnowledgeBase

    root = tmp_path_factory.mktemp("kb")
    corpus = root / "corpus"
    corpus.mkdir()
    for name, text in CORPUS.items():
        (corpus / name).write_text(text)
    build_index(corpus, root / "index", progress=False)
    return KnowledgeBase.load(root / "index")


async def test_search_returns_ranked_passages(knowledge_base, make_bare_ctx):
    ctx = make_bare_ctx(knowledge_base=knowledge_base)
    registry = default_registry(kb_types=knowledge_base.types)
    obs = await registry.run(ctx, "search_surgical_kb",
                             {"query": "which instrument places clips on the cystic duct",
                              "type": "any", "k": 2})
    assert obs.error is None
    hits = obs.data["hits"]
    assert len(hits) == 2 and hits[0]["title"] == "Clip applier"
    assert hits[0]["score"] >= hits[1]["score"]
    assert obs.text.startswith("[1] Clip applier (instrument;")
    assert "[2] " in obs.text


async def test_search_type_filter(knowledge_base, make_bare_ctx):
    ctx = make_bare_ctx(knowledge_base=knowledge_base)
    registry = default_registry(kb_types=knowledge_base.types)
    obs = await registry.run(ctx, "search_surgical_kb",
                             {"query": "clips", "type": "guideline", "k": 10})
    assert {h["type"] for h in obs.data["hits"]} == {"guideline"}
    assert len(obs.data["hits"]) == 2          # only two guideline passages exist
    bad = await registry.run(ctx, "search_surgical_kb", {"query": "clips", "type": "recipe", "k": 1})
    assert bad.error is not None and "recipe" in bad.error      # not in the enum


async def test_unknown_type_without_enum_is_an_error_observation(knowledge_base, make_bare_ctx):
    ctx = make_bare_ctx(knowledge_base=knowledge_base)
    obs = await default_registry().run(ctx, "search_surgical_kb",
                                       {"query": "clips", "type": "recipe", "k": 1})
    assert obs.error is not None and "unknown passage type" in obs.error


@pytest.mark.parametrize("k", [0, 11])
async def test_k_is_bounded(bare_ctx, k):
    obs = await default_registry().run(bare_ctx, "search_surgical_kb",
                                       {"query": "x", "type": "any", "k": k})
    assert obs.error is not None and "k:" in obs.error


async def test_no_knowledge_base_configured(bare_ctx):
    obs = await default_registry().run(bare_ctx, "search_surgical_kb",
                                       {"query": "x", "type": "any", "k": 3})
    assert obs.error is not None and "no knowledge base" in obs.error


async def test_search_runs_off_the_event_loop(knowledge_base, make_bare_ctx):
    """The encoder pass (and its first-use load) must not stall the other episodes' loop."""
    import threading

    threads = []

    class Watched:
        types = knowledge_base.types

        def search(self, *args, **kwargs):
            threads.append(threading.current_thread())
            return knowledge_base.search(*args, **kwargs)

    ctx = make_bare_ctx(knowledge_base=Watched())
    obs = await default_registry().run(ctx, "search_surgical_kb",
                                       {"query": "clip applier", "type": "any", "k": 1})
    assert obs.error is None and obs.data["hits"][0]["title"] == "Clip applier"
    assert threads and threads[0] is not threading.current_thread()
