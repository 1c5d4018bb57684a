"""The trained orchestrator's expert, its training text and the trained model in vLLM.

The expert plays the real episode loop (real registry, skill index, frame source and
crop_video_frame; scripted verifier), so its recorded requests are what an episode sends; the
training text is those requests rendered by the engine's own chat rendering. The engine test
trains a small model on two episodes of one held-out video (one per kind) until it reproduces them, then lets
vLLM (the in-process backend, schema-constrained) drive the same episodes: every action must
parse and equal the expert's. That is a check of the pipeline (tokenizer, template, weights,
constrained decoding), not of generalisation, which `train_orchestrator` measures on held-out
seeds (its report).
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace

import numpy as np
import psutil
import pytest

from medclaw.engine.backends.base import render_prompt
from medclaw.engine.backends.shared_memory import shared_memory_of
from medclaw.engine.orchestrator_prompt import build_question_turn, build_system_prompt
from medclaw.models import orchestrator_data as D
from medclaw.models import train_orchestrator as T
from medclaw.requests.conversation import message_text
from medclaw.tools.registry import default_registry

SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("orch")


@pytest.fixture(scope="module")
def cases(root):
    """The zoom questions of one held-out video (ideal verifier)."""
    return D.question_cases(D.render_videos(root, (5000,), 0.5))


def _play(cases, root, **kw):
    return asyncio.run(D.play_all(cases, root, **kw))


def _args(reply: str) -> dict:
    return json.loads(reply)


def test_expert_crops_the_box_then_answers_what_it_read(cases, root):
    small = next(c for c in cases if c.kind == "small_object")
    other = next(n for n in D.NAMES["small_object"] if n != small.gt.zoom["qa"][0]["answer"])
    plays = [small, replace(small, replies=[other]), replace(small, replies=[D.EMPTY, D.IDEAL]),
             replace(small, replies=[D.NOTHING, D.NOTHING])]
    ideal, told, retried, failed = _play(plays, root)
    truth = next(q["answer"] for q in small.gt.zoom["qa"]
                 if q["question"] == small.question)

    first = _args(ideal.replies[0])
    assert first["tool"] == "crop_video_frame"
    assert first["args"]["time_s"] == pytest.approx(small.time_s)
    assert [first["args"][k] for k in ("x1", "y1", "x2", "y2")] == list(small.box)
    assert "small object: " + truth in message_text(ideal.requests[1].messages[-1])
    assert ideal.answer == truth and len(ideal.replies) == 2
    # the name comes from the observation, not from the question or the truth
    assert told.answer == other != truth
    # an error observation (empty verifier reply): one wider crop, then the answer it shows
    assert "Error at step 1" in message_text(retried.requests[1].messages[-1])
    wide = _args(retried.replies[1])["args"]
    assert [wide[k] for k in ("x1", "y1", "x2", "y2")] == list(D.widen(small.box))
    assert wide["x1"] == pytest.approx(small.box[0] - D.WIDEN)
    assert retried.answer == truth and len(retried.replies) == 3
    assert failed.answer == D.NOT_SEEN and len(failed.replies) == 3
    for ep in (ideal, told, retried, failed):          # the expert agrees with its recording
        assert ep.replies == ep.expected and ep.status == "answered"


def test_a_case_at_a_whole_second_and_the_misses_a_score_leaves(cases, root):
    """`at_whole_second` asks the same question at the second its time falls in, and the expert
    follows it; `misses` names each episode `score` does not count with its first wrong action."""
    case = next(c for c in cases if c.kind == "look_alike" and c.time_s != int(c.time_s))
    whole = T.at_whole_second(case)
    second = max(1, int(case.time_s))
    assert whole.time_s == second and f"At {second} s," in whole.question
    assert whole.question.replace(f"{second} s", f"{case.time_s:g} s") == case.question
    [ep] = _play([whole], root)
    assert _args(ep.replies[0])["args"]["time_s"] == second
    assert _args(ep.replies[-1])["args"]["evidence_times"] == [second]
    assert '"evidence_times":[%d]' % second in ep.replies[-1]    # written without a decimal

    specs = default_registry().specs()
    assert T.misses([ep], specs) == []
    wrong_time = ep.replies[0].replace(f'"time_s":{second}', f'"time_s":{second + 1}')
    assert wrong_time != ep.replies[0]
    missed = replace(ep, replies=[wrong_time] + ep.replies[1:])
    assert T.score([ep, missed], specs)["action_accuracy"] == 0.5
    assert T.misses([ep, missed], specs) == [{"kind": "look_alike", "question": whole.question,
                                              "status": "answered", "got": wrong_time,
                                              "want": ep.expected[0]}]


def test_training_text_is_what_the_episode_sends(cases, root, tmp_path):
    [ep] = _play(cases[:1], root)
    case = ep.case
    # the recorded prompt is the engine's: real system prompt (tool specs, skill index), question turn
    from medclaw.engine.runtime import load_skill_library

    skills = load_skill_library()
    system = build_system_prompt(default_registry(skill_names=sorted(skills.names())).specs(),
                                 skills.index_text())
    first = ep.requests[0].messages
    assert message_text(first[0]) == system
    assert message_text(first[1]) == build_question_turn(case.info, case.question)

    texts = [message_text(m) for m in ep.requests[-1].messages] + ep.replies
    T.write_base(tmp_path, T.build_tokenizer(texts * 4), seed=0, sizes=SMALL)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids, labels = T.encode_episode(tokenizer, ep)
    assert len(ep.requests) == 2
    # byte equality of every turn's prompt part with what the engine renders for that call
    # (engine.backends.base.render_prompt, which the vLLM and transformers backends use)
    for request, reply in zip(ep.requests, ep.replies):
        prompt = render_prompt(tokenizer, request)
        n = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert tokenizer.decode(ids[:n]) == prompt
        m = len(tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"])
        assert tokenizer.decode(ids[n:n + m]) == reply + "<|im_end|>"
        assert all(l == -100 for l in labels[:n]) or request is not ep.requests[0]
    # labels are exactly the replies (each closed by <|im_end|>), nothing of the prompts
    said = tokenizer.decode([t for t in labels if t != -100])
    assert said == "".join(r + "<|im_end|>" for r in ep.replies)
    # the loaded tokenizer splits times digit by digit, as it was trained
    assert [t for t in tokenizer.tokenize(ep.replies[0]) if t.isdigit()][:3] == \
        list(str(D.number(case.time_s)).replace(".", ""))[:3]


def test_same_action_tolerances():
    specs = default_registry().specs()
    crop = D.action("x", "crop_video_frame", {"time_s": 12.3, "x1": 0.61, "y1": 0.39, "x2": 0.71,
                                              "y2": 0.57, "query": "q"})

    def with_(**args):
        return D.action("y", "crop_video_frame", {**_args(crop)["args"], **args})

    assert T.same_action(with_(time_s=12.34), crop, specs)
    assert not T.same_action(with_(time_s=12.4), crop, specs)
    assert not T.same_action(with_(x2=0.73), crop, specs)
    final = D.action("x", "final_answer", {"text": "needle", "evidence_times": [12.3]})
    assert T.same_action(D.action("z", "final_answer", {"text": "Needle ", "evidence_times": [12.3]}),
                         final, specs)
    assert not T.same_action(D.action("z", "final_answer", {"text": "gauze tag", "evidence_times": [12.3]}),
                             final, specs)
    assert not T.same_action("not json", final, specs)


def test_the_fast_losses_equal_transformers_own_loss(monkeypatch):
    """`prefix_loss` (system turn computed once, shared) and `rows_loss` (rows in chunks of
    similar length), both with the LM head on labelled tokens only, are the plain padded-batch
    loss of transformers on the whole sequences; so are their gradients."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    monkeypatch.setattr(T, "FOCAL_GAMMA", 0.0)             # the plain loss, as transformers' own

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, max_position_embeddings=256, **SMALL))
    rng = np.random.default_rng(0)
    prefix = tuple(int(x) for x in rng.integers(1, 64, size=40))
    rows = []
    for length in (7, 19, 12, 30, 5):                  # suffixes of unequal length
        ids = [int(x) for x in rng.integers(1, 64, size=length)]
        labels = [-100] * 2 + ids[2:]                     # a reply after a short user turn
        rows.append((ids, labels))
    whole = [(list(prefix) + ids, [-100] * len(prefix) + labels) for ids, labels in rows]

    def plain():
        ids, mask, labels = T._batch(whole, 0)
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    reference = plain()
    want = grads(reference)
    for fast in (lambda: T.prefix_loss(model, prefix, rows, 0, chunks=1),
                 lambda: T.prefix_loss(model, prefix, rows, 0, chunks=2),
                 lambda: T.rows_loss(model, whole, 0),
                 lambda: T.rows_loss(model, whole, 0, chunks=2),
                 lambda: T.rows_loss(model, whole, 0, chunks=5)):
        loss = fast()
        assert torch.allclose(loss, reference, rtol=1e-5, atol=1e-6)
        assert all(torch.allclose(g, w, rtol=1e-3, atol=1e-6) for g, w in zip(grads(loss), want))


def test_the_weighted_loss_is_the_weighted_mean_over_reply_tokens(monkeypatch):
    """With `token_weights`, both fast losses are the mean of every reply token's cross-entropy
    weighted by its target's weight (computed here from the model's full logits); weights of 1
    give the plain loss."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    monkeypatch.setattr(T, "FOCAL_GAMMA", 0.0)             # the weights alone

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, max_position_embeddings=256, **SMALL))
    rng = np.random.default_rng(1)
    prefix = tuple(int(x) for x in rng.integers(1, 64, size=30))
    suffixes = [[int(x) for x in rng.integers(1, 64, size=n)] for n in (9, 16, 4)]
    rows = [(ids, [-100] * 2 + ids[2:]) for ids in suffixes]            # a reply after a user turn
    whole = [(list(prefix) + ids, [-100] * len(prefix) + labels) for ids, labels in rows]
    weights = torch.ones(64)
    weights[[rows[0][0][2], rows[1][0][5]]] = 5.0                  # two reply tokens weigh more

    with torch.no_grad():
        num = den = 0.0
        for ids, labels in whole:
            logits = model(input_ids=torch.tensor([ids])).logits[0]           # (S, V)
            for k in range(1, len(ids)):
                if labels[k] != -100:
                    w = float(weights[labels[k]])
                    num += w * float(torch.nn.functional.cross_entropy(logits[k - 1], torch.tensor(labels[k])))
                    den += w
        want = num / den
        for loss in (T.rows_loss(model, whole, 0, chunks=2, weights=weights),
                     T.prefix_loss(model, prefix, rows, 0, weights=weights)):
            assert abs(float(loss) - want) < 1e-5
        plain = T.rows_loss(model, whole, 0)
        assert abs(float(T.rows_loss(model, whole, 0, weights=torch.ones(64))) - float(plain)) < 1e-6
        assert abs(float(plain) - want) > 1e-3                  # the weights do change the loss


def test_the_focal_loss_weighs_each_reply_token_by_how_wrong_it_still_is(monkeypatch):
    """FOCAL_GAMMA > 0: both fast losses are the mean over reply tokens of ce * (1 - p)^gamma
    (p the right token's probability; computed here from the model's full logits), weighted
    by `token_weights` when given."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, max_position_embeddings=256, **SMALL))
    rng = np.random.default_rng(2)
    prefix = tuple(int(x) for x in rng.integers(1, 64, size=30))
    suffixes = [[int(x) for x in rng.integers(1, 64, size=n)] for n in (9, 16, 4)]
    rows = [(ids, [-100] * 2 + ids[2:]) for ids in suffixes]
    whole = [(list(prefix) + ids, [-100] * len(prefix) + labels) for ids, labels in rows]
    weights = torch.ones(64)
    weights[rows[1][0][5]] = 4.0

    def want(weights):
        num = den = 0.0
        for ids, labels in whole:
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
            for k in range(1, len(ids)):
                if labels[k] != -100:
                    ce = float(torch.nn.functional.cross_entropy(logits[k - 1], torch.tensor(labels[k])))
                    w = float(weights[labels[k]])
                    num += w * ce * (1 - np.exp(-ce)) ** 2
                    den += w
        return num / den

    monkeypatch.setattr(T, "FOCAL_GAMMA", 0.0)
    with torch.no_grad():
        plain = float(T.rows_loss(model, whole, 0))
        monkeypatch.setattr(T, "FOCAL_GAMMA", 2.0)
        for use in (None, weights):
            expected = want(torch.ones(64) if use is None else use)
            for loss in (T.rows_loss(model, whole, 0, chunks=2, weights=use),
                         T.prefix_loss(model, prefix, rows, 0, weights=use)):
                assert abs(float(loss) - expected) < 1e-5
        assert float(T.rows_loss(model, whole, 0)) < plain          # each factor is below 1


def test_token_weights_weigh_the_ten_digits(cases, root, tmp_path):
    """The weights: the digit weight on each digit token of the trained tokenizer, 1 on the
    rest; a reply's time is written with those tokens."""
    played = _play(cases[:1], root)
    _, tokenizer, _, _ = T.build_rows(tmp_path / "llm", played, seed=0)
    weights = T.token_weights(tokenizer, 3.0)
    heavy = {tokenizer.convert_ids_to_tokens(i) for i in range(len(weights)) if weights[i] != 1}
    assert heavy == set("0123456789") and float(weights.max()) == 3.0
    time_ids = tokenizer(f'"time_s":{D.number(cases[0].time_s)}', add_special_tokens=False)["input_ids"]
    assert sum(float(weights[i]) > 1 for i in time_ids) == len(str(D.number(cases[0].time_s)).replace(".", ""))


def test_quoting_thoughts_quote_the_asked_time_and_the_line_read(cases, root, monkeypatch):
    """With QUOTE_IN_THOUGHTS the expert's first thought quotes the asked time in the question's
    own words (a whole second too), its answer's the observation's line; the actions are the
    same as without."""
    plain = _play(cases, root)
    monkeypatch.setattr(D, "QUOTE_IN_THOUGHTS", True)
    whole = [T.at_whole_second(c) for c in cases if c.time_s != int(c.time_s)][:2]
    quoted = _play(cases + whole, root)
    for ep in quoted:
        first, last = _args(ep.replies[0]), _args(ep.replies[-1])
        asked = D.ASKED_TIME_RE.search(ep.case.question).group()
        lead = f"At {asked}," if ep.case.kind == "look_alike" else f"at {asked}"
        assert lead in ep.case.question and lead in first["thought"], (ep.case.question, first)
        line = f"{D.FIELD[ep.case.kind]}: {last['args']['text']}"
        assert line in message_text(ep.requests[-1].messages[-1]) and line in last["thought"]
        assert ep.replies == ep.expected and ep.status == "answered"
    assert whole and all("." not in D.ASKED_TIME_RE.search(w.question).group() for w in whole)
    for before, after in zip(plain, quoted):
        assert [{**_args(r), "thought": ""} for r in before.replies] == \
            [{**_args(r), "thought": ""} for r in after.replies]
        assert before.replies != after.replies


def test_name_tokens_make_an_answer_copy_the_token_it_read(cases, root, tmp_path, monkeypatch):
    """With NAME_TOKENS each word of an object's name is one whole-word token, in the saved and
    reloaded tokenizer: the observation's name and the answer's are the same tokens (off, the
    BPE spells them apart), and every turn is still a token prefix."""
    from transformers import AutoTokenizer

    case = next(c for c in cases if c.kind == "look_alike")
    played = _play([replace(case, replies=["bipolar"]), replace(case, replies=["dissector"])], root)
    observation, answer = message_text(played[0].requests[-1].messages[-1]), played[0].replies[-1]
    assert "left instrument: bipolar" in observation and '"text":"bipolar"' in answer

    def tokens(name_tokens: bool, folder):
        monkeypatch.setattr(T, "NAME_TOKENS", name_tokens)
        T.build_rows(folder, played, seed=0)       # encodes every episode: prefixes checked
        tokenizer = AutoTokenizer.from_pretrained(folder)
        return tokenizer, tokenizer.tokenize(observation), tokenizer.tokenize(answer)

    tokenizer, seen, said = tokens(True, tmp_path / "on")
    assert T.name_words() == ["bipolar", "bulldog", "clamp", "dissector", "gauze", "needle", "tag"]
    assert "bipolar" in seen and "bipolar" in said and "Ġbipolar" not in seen
    for name in ("bipolar", "bulldog clamp", "gauze tag"):
        observed = tokenizer.tokenize(f"small object: {name} (56x56)")
        answered = tokenizer.tokenize(f'{{"text":"{name}"}}')
        words = [t for t in observed if t.strip("Ġ") in T.name_words()]
        assert words == name.split() and all(w in answered for w in words)
    _, seen, said = tokens(False, tmp_path / "off")
    assert "Ġbipolar" in seen and "Ġbipolar" not in said


def _alive(process) -> bool:
    """Running and not a zombie (a killed process its parent has not reaped yet)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_trained_model_drives_the_episode_in_vllm(cases, root, tiny_llm_spec):
    """Two episodes (one per kind) learnt by heart, replayed by vLLM with constrained decoding."""
    from medclaw.engine.backends.vllm_local import VLLMBackend

    chosen = [next(c for c in cases if c.kind == kind) for kind in D.FIELD]
    played = _play(chosen, root)
    folder = root / "llm"
    report = T.fit(folder, played, steps=120, batch=len(played) * 2, lr=5e-3, sizes=SMALL,
                   progress=False, rng=np.random.default_rng(0))
    assert report["loss_last"] < 0.02 < report["loss_first"]

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    backend = VLLMBackend(replace(tiny_llm_spec, name="trained-orchestrator", path=str(folder)))
    engine_processes = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
                        and "resource_tracker" not in " ".join(p.cmdline())]   # multiprocessing's, kept
    segments = shared_memory_of(backend._engine_core_pid)     # vLLM's message queues
    try:
        replayed = _play(chosen, root, student=backend)
    finally:
        backend.shutdown()
    # the engine was killed (below), so its queues were released by shutdown, not left to the
    # resource tracker's "leaked shared_memory objects" warning at exit
    assert segments and not [path for path in segments if os.path.exists(path)]
    # the engine core, this process's own child, was reaped by shutdown: not even a zombie left
    # below us (checked before wait_procs, which would reap it itself)
    assert not [p for p in psutil.Process().children() if p.pid in {e.pid for e in engine_processes}]
    # shut down after vllm_local.CPU_SHUTDOWN_GRACE_S: its engine core and model worker are killed,
    # none left running on its own (a kill takes effect a moment later)
    _, left = psutil.wait_procs(engine_processes, timeout=10)
    assert len(engine_processes) == 2 and not [p for p in left if _alive(p)]
    specs = default_registry().specs()
    for ep in replayed:
        assert ep.status == "answered", ep.replies
        assert [_args(r)["tool"] for r in ep.replies] == ["crop_video_frame", "final_answer"]
        wrong = [(got, want) for got, want in zip(ep.replies, ep.expected)
                 if not T.same_action(got, want, specs)]
        assert not wrong, wrong
    assert T.score(replayed, specs)["action_accuracy"] == 1.0
    assert [ep.answer for ep in replayed] == [ep.answer for ep in played]
